"""The training commands' data flags, and the in-memory and streamed datasets built from the documents.

A **document** is a whole text: one play of the bundled corpus, one `.txt` file, one record of a
`.jsonl`/`.json`/`.parquet` file or one row of a `--dataset_name` dataset (`minirope.data.documents`).
Each document is tokenized whole, exactly as `tokenizer(document)` tokenizes it (what `pipeline`,
lm-evaluation-harness and llama.cpp do with a user's text), never line by line or speech by speech:
byte-level BPE merges runs of newlines, so cutting the text first would change the tokens at every cut and
teach the model sequences no user ever sends. Large documents are tokenized in exact pieces, and training
blocks and validation windows come from `minirope.data.blocks`:

    training    <s> doc_1 </s> <s> doc_2 </s> ...   concatenated, cut into blocks of `block_size` tokens
    validation  <s> doc_i, alone, in windows of `block_size` tokens that overlap by one token, so that
                every token of the document is predicted once, from the `<s>` or the tokens before it
                in its window (the last window padded); only the document's own tokens are scored

In memory (`training_blocks`), the blocks of one pass over the documents are kept in a `datasets.Dataset` and
the Trainer samples them in a random order; streamed (`--streaming`), the same blocks are read as training
needs them (`BlockStream`), shuffled in a bounded window.

The data flags (`TextDataArguments`) and the training blocks and validation windows built from the documents
(`minirope.data.sources` finds them; `minirope.data.bundled` is the bundled corpus).
"""

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from datasets import Dataset, DatasetDict
from transformers import PreTrainedTokenizerBase

from minirope.data.blocks import document_frame, document_windows, token_pieces
from minirope.data.bundled import BUNDLED_CORPUS
from minirope.data.documents import Shard
from minirope.data.stream import BlockStream
from minirope.data.tokenizer import TextPieces


@dataclass
class TextDataArguments:
    """Where the text comes from, and how it is cut into sequences (flags shared by the training CLIs)."""

    train_file: list[str] | None = field(
        default=None,
        metadata={
            "help": "Training files or globs: .txt (one document per file), .jsonl/.json/.parquet (one per record, "
            "--text_column)."
        },
    )
    validation_file: list[str] | None = field(
        default=None, metadata={"help": "Validation files or globs, as --train_file."}
    )
    dataset_name: str | None = field(
        default=None, metadata={"help": "A `datasets` dataset with text; each row is one document."}
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "Its configuration name."})
    text_column: str = field(default="text", metadata={"help": "The text field of records and dataset rows."})
    block_size: int | None = field(
        default=None,
        metadata={
            "help": "Tokens per sequence; default the model's max_position_embeddings (fine-tuning: at most 256)."
        },
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep only this many training sequences."})
    max_eval_samples: int | None = field(
        default=None, metadata={"help": "Keep only this many validation sequences (default: the whole split)."}
    )
    repeat_fraction: float = field(
        default=0.0,
        metadata={
            "help": "Share of training blocks in which a passage is repeated later in the block, to teach "
            "copying from far back (see minirope.data.blocks.insert_repeats). Validation text is never changed."
        },
    )
    repeat_length: int = field(default=64, metadata={"help": "Longest repeated passage, in tokens."})

    def __post_init__(self) -> None:
        for name, low in (("block_size", 2), ("max_train_samples", 1), ("max_eval_samples", 1), ("repeat_length", 1)):
            value = getattr(self, name)
            if value is not None and value < low:
                raise ValueError(f"--{name} must be >= {low}, got {value}.")
        if not 0.0 <= self.repeat_fraction <= 1.0:
            raise ValueError(f"--repeat_fraction must be in [0, 1], got {self.repeat_fraction}: e.g. 0.25.")


@dataclass
class HeldOutArguments:
    """The share of a lone `--train_file` held out for validation, as transformers' `run_clm.py` takes it; a mixin
    listed before `TextDataArguments`, whose checks its `__post_init__` runs first."""

    validation_split_percentage: int = field(
        default=5,
        metadata={
            "help": "With --train_file and no --validation_file: the share of training rows held out for validation, "
            "in percent (the first rows: prompt/completion rows, conversations, or blocks of text), as run_clm.py."
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        check_percentage(self.validation_split_percentage)


def check_percentage(percentage: int) -> None:
    """Refuse a `--validation_split_percentage` outside 1..50 (every command's held-out share).

    Raises:
        ValueError: naming the value.
    """
    if not 1 <= percentage <= 50:
        raise ValueError(f"--validation_split_percentage must be in 1..50, got {percentage}.")


def data_description(args: TextDataArguments) -> str:
    """What a model card names as the training data: the dataset, the files, or the bundled corpus."""
    if args.dataset_name:
        return args.dataset_name
    if args.train_file:
        return ", ".join(Path(path).name for path in args.train_file)
    return BUNDLED_CORPUS


def block_stream(
    shards: list[Shard], tokenizer: PreTrainedTokenizerBase, data_args: TextDataArguments, seed: int, **options
) -> BlockStream:
    """A `BlockStream` over `shards` with the data flags' block size, sample limit and repeats."""
    return BlockStream(
        shards,
        tokenizer,
        data_args.block_size,
        seed=seed,
        max_blocks=data_args.max_train_samples,
        repeat_fraction=data_args.repeat_fraction,
        repeat_length=data_args.repeat_length,
        **options,
    )


def training_blocks(
    shards: list[Shard], tokenizer: PreTrainedTokenizerBase, data_args: TextDataArguments, seed: int
) -> Dataset:
    """The training blocks of one pass over `shards` (`BlockStream.one_epoch`), in memory: columns
    `input_ids` and `labels` (equal: the model shifts labels), `(block_size,)` int64 each.

    Raises:
        ValueError: a bad document, or the training text is shorter than one block.
    """
    blocks = np.stack(list(block_stream(shards, tokenizer, data_args, seed).one_epoch()))
    return Dataset.from_dict({"input_ids": blocks, "labels": blocks})


def first_rows(rows: Dataset, limit: int | None) -> Dataset:
    """The first `limit` rows of `rows` (all of them for None): `--max_train_samples`, `--max_eval_samples`."""
    return rows if limit is None else rows.select(range(min(len(rows), limit)))


def hold_out(rows: Dataset, size: float, what: str, source: str = "--train_file") -> DatasetDict:
    """`{"train", "validation"}` of `rows`: the first rows held out for validation, the rest for training, as
    transformers' `run_clm.py` splits `train[:N%]` / `train[N%:]` for its `--validation_split_percentage`. `size`, as
    `Dataset.train_test_split`'s `test_size` and TRL's `--test_split_size` take it: a share below 1 (at least one row
    held out), or a whole number of rows. No row is in both.

    Raises:
        ValueError: too few rows of `what` in `source` (the flag that gave them) to leave any to train on.
    """
    held = max(1, round(len(rows) * size)) if size < 1 else int(size)
    if len(rows) - held < 1:
        asked = f"{100 * size:g} %" if size < 1 else f"{held}"
        raise ValueError(
            f"{source} has too few {what} ({len(rows)}) to hold out {asked} for validation: give more "
            f"data or held-out rows of their own."
        )
    return DatasetDict({"train": rows.select(range(held, len(rows))), "validation": rows.select(range(held))})


def held_out_blocks(
    shards: list[Shard], tokenizer: PreTrainedTokenizerBase, data_args: TextDataArguments, seed: int
) -> tuple[Dataset, Dataset]:
    """The training blocks of `shards` (`training_blocks`) split by `--validation_split_percentage` (`hold_out`): the
    training blocks and the first `--max_eval_samples` held-out ones. `data_args` is a `HeldOutArguments` too.

    Raises:
        ValueError: a bad document, or too few blocks to hold any out.
    """
    blocks = training_blocks(shards, tokenizer, data_args, seed)
    split = hold_out(blocks, data_args.validation_split_percentage / 100, f"blocks of {data_args.block_size} tokens")
    return split["train"], first_rows(split["validation"], data_args.max_eval_samples)


def document_ids(shards: list[Shard], tokenizer: PreTrainedTokenizerBase, prefix: list[int]) -> list[np.ndarray]:
    """Each document's ids, `prefix + tokenizer(document)["input_ids"]` (tokenized in exact pieces), int64.

    Raises:
        ValueError: a document tokenizes to no tokens, or a reader's error.
    """
    documents: list[list[np.ndarray]] = []
    order = list(range(len(shards)))
    for ids, where in token_pieces(shards, order, {"shard": 0, "document": None, "offset": 0}, TextPieces(tokenizer),
                                   (prefix, [])):  # fmt: skip
        if where["offset"] == 0:
            documents.append([])
        documents[-1].append(np.asarray(ids, dtype=np.int64))
    return [np.concatenate(pieces) for pieces in documents]


def validation_windows(
    shards: list[Shard],
    tokenizer: PreTrainedTokenizerBase,
    block_size: int,
    stride: int | None = None,
    max_samples: int | None = None,
    max_document_tokens: int | None = None,
) -> Dataset:
    """Every validation document alone, `[<s>] + tokenizer(document)` (`</s>` for a tokenizer without bos),
    cut into scoring windows (`document_windows`), optionally its first `max_document_tokens` tokens only;
    the first `max_samples` windows are kept. Columns `input_ids` and `labels`.
    """
    bos, eos = document_frame(tokenizer)
    pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    rows: dict[str, list] = {"input_ids": [], "labels": []}
    for ids in document_ids(shards, tokenizer, bos or eos):
        if max_document_tokens is not None:
            ids = ids[: 1 + max_document_tokens]
        for window, labels in document_windows(iter([ids.tolist()]), block_size, pad_token_id, stride):
            if max_samples is not None and len(rows["input_ids"]) >= max_samples:
                break
            rows["input_ids"].append(window)
            rows["labels"].append(labels)
    return Dataset.from_dict(rows)


def tokenize_and_block(
    train: list[Shard],
    validation: list[Shard],
    tokenizer: PreTrainedTokenizerBase,
    data_args: TextDataArguments,
    seed: int,
) -> tuple[Dataset, Dataset]:
    """The in-memory training blocks (`training_blocks`) and validation windows (`validation_windows`).

    Raises:
        ValueError: a bad document (naming it), or the training text is shorter than one block.
    """
    blocks = training_blocks(train, tokenizer, data_args, seed)
    windows = validation_windows(validation, tokenizer, data_args.block_size, max_samples=data_args.max_eval_samples)
    return blocks, windows
