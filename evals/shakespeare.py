"""The documents of the `minirope_shakespeare` lm-evaluation-harness task, from the installed corpus."""

from datasets import DatasetDict

from minirope.data.bundled import shakespeare_dataset


def validation_plays(**_) -> DatasetDict:
    """The four validation plays (`text`, one play per row) as the task's `test` split: the very strings
    `minirope-pretrain` evaluates on. lm-eval passes the task's metadata as keyword arguments; none is used."""
    return DatasetDict({"test": shakespeare_dataset()["validation"]})
