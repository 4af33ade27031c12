"""The arithmetic task's reward, in TRL's signature: read from the working directory by
`minirope-posttrain --reward_funcs arithmetic_rewards.exact_match` (and by `trl grpo` the same way).

TRL passes every dataset column to a reward as a keyword argument, one value per completion: here `solution`.
"""

import re

_NUMBER = re.compile(r"-?\d+")


def answer(completion) -> str | None:
    """The first integer of a completion (plain text, or the last message of a conversational one), or None."""
    text = completion if isinstance(completion, str) else completion[-1]["content"]
    match = _NUMBER.search(text)
    return match.group() if match else None


def exact_match(completions: list, solution: list[str], **kwargs) -> list[float]:
    """1.0 where the completion's first integer is the row's `solution`, else 0.0."""
    return [
        float(answer(completion) == str(expected)) for completion, expected in zip(completions, solution, strict=True)
    ]
