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


def digit_match(completions: list, solution: list[str], **kwargs) -> list[float]:
    """Partial credit: the share of the solution's digits that the answer has in the same place, counted from the
    right (`85` for `86`: 0.5), 0 for an answer of another length. Denser than `exact_match`, so GRPO's completions
    of one prompt differ in reward more often; its maximum, 1.0, is the exact answer."""
    rewards = []
    for completion, expected in zip(completions, solution, strict=True):
        got, expected = answer(completion), str(expected)
        same = got is not None and len(got) == len(expected)
        rewards.append(sum(a == b for a, b in zip(got, expected, strict=True)) / len(expected) if same else 0.0)
    return rewards
