"""Supervised rows: `{"prompt", "completion"}` records tokenized with the loss on the completion only, and the
filter that keeps the rows with a label to learn (also used for conversations, `minirope.data.chat`)."""

from datasets import Dataset, DatasetDict
from transformers import PreTrainedTokenizerBase

from minirope.data.blocks import IGNORE_INDEX
from minirope.data.formats import records
from minirope.data.pipeline import TextDataArguments, first_rows


def load_prompt_completion(train_files: list[str], validation_files: list[str]) -> DatasetDict:
    """Records files (`.jsonl`, `.json`, `.parquet`) of `{"prompt": ..., "completion": ...}` rows, as a `DatasetDict`.

    Raises:
        FileNotFoundError, ValueError: a file is missing, empty, not UTF-8, not JSON lines, or a row lacks
            a string `prompt` or `completion`.
    """
    splits = {}
    for split, paths in (("train", train_files), ("validation", validation_files)):
        rows = []
        for path in paths:
            for where, row in records(path):
                if not (
                    isinstance(row, dict)
                    and isinstance(row.get("prompt"), str)
                    and isinstance(row.get("completion"), str)
                ):
                    raise ValueError(f"{where} needs string fields 'prompt' and 'completion': fix or remove that row.")
                rows.append({"prompt": row["prompt"], "completion": row["completion"]})
        splits[split] = Dataset.from_list(rows)
    return DatasetDict(splits)


def prompt_completion_examples(
    raw: DatasetDict, tokenizer: PreTrainedTokenizerBase, data_args: TextDataArguments
) -> tuple[Dataset, Dataset]:
    """Prompt/completion rows (`train` and `validation` of `load_prompt_completion`) tokenized as
    `prompt + completion + eos`, cut to
    `block_size`, labels -100 on the prompt (the loss covers the completion and the eos only); rows left with no
    completion token are dropped. Columns `input_ids`, `attention_mask`, `labels` (of varying lengths).

    Raises:
        ValueError: a bad file or row, or no row of a split keeps a completion token.
    """

    def tokenize(row):
        prompt = tokenizer(row["prompt"], add_special_tokens=False)["input_ids"]
        completion = tokenizer(row["completion"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        input_ids = (prompt + completion)[: data_args.block_size]
        labels = ([IGNORE_INDEX] * len(prompt) + completion)[: data_args.block_size]
        return {"input_ids": input_ids, "attention_mask": [1] * len(input_ids), "labels": labels}

    tokenized = raw.map(tokenize, remove_columns=["prompt", "completion"], desc="Tokenizing")
    limits = {"train": data_args.max_train_samples, "validation": data_args.max_eval_samples}
    return keep_labelled(tokenized, "prompt/completion row", data_args.block_size, limits)


def keep_labelled(tokenized: DatasetDict, rows: str, block_size: int, limits: dict) -> tuple[Dataset, Dataset]:
    """The `train` and `validation` rows of `tokenized` with a label to learn (not -100) after the first token,
    each split cut to `limits[split]` rows (None: all).

    Raises:
        ValueError: a split keeps no row ("no train {rows} keeps a label within --block_size ...").
    """
    tokenized = tokenized.filter(lambda row: any(label != IGNORE_INDEX for label in row["labels"][1:]))
    for split in ("train", "validation"):
        if len(tokenized[split]) == 0:
            raise ValueError(
                f"no {split} {rows} keeps a token to learn within --block_size {block_size}: shorten them or raise "
                f"--block_size."
            )
    return tuple(first_rows(tokenized[split], limits.get(split)) for split in ("train", "validation"))
