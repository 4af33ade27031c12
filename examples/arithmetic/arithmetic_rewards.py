"""The arithmetic task's reward and measure, in TRL's signature: read from the working directory by
`minirope-posttrain --reward_funcs arithmetic_rewards.exact_match arithmetic_rewards.first_number` (and by
`trl grpo` the same way).

TRL passes every dataset column to a reward as a keyword argument, one value per completion: here `solution`.
"""

import re

from minirope.posttraining.reward_calls import completion_text

_NUMBER = re.compile(r"-?\d+")


def answer(completion) -> str | None:
    """The integer a completion (plain text, or the last message of a conversational one) answers with: the whole
    completion, spaces around it aside; None for anything else. A number followed by more text is no answer, so
    a policy cannot be paid for a right first number and then run on: it must answer and stop."""
    text = completion_text(completion).strip()
    return text if _NUMBER.fullmatch(text) else None


def exact_match(completions: list, solution: list[str], **kwargs) -> list[float]:
    """1.0 where the completion is the row's `solution` alone, else 0.0."""
    return [
        float(answer(completion) == str(expected)) for completion, expected in zip(completions, solution, strict=True)
    ]


def first_number(completions: list, solution: list[str], **kwargs) -> list[float]:
    """1.0 where the completion's first integer is the row's `solution`, whatever follows it: the arithmetic alone.
    A measure rather than a reward (the example gives it weight 0): a policy paid by it can answer and run on."""
    found = [_NUMBER.search(completion_text(completion)) for completion in completions]
    return [
        float(match is not None and match.group() == str(expected))
        for match, expected in zip(found, solution, strict=True)
    ]
