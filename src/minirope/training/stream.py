"""Streaming documents: corpora larger than memory, read shard by shard and packed into blocks on the fly.

`minirope-pretrain --streaming` reads its training documents from local shards (`--train_file` paths or
globs; `.txt` is one document per file, `.jsonl` and `.parquet` one per row, from `--text_column`) or a
Hub dataset streamed with `datasets` (`--dataset_name`). Each shard is read only when the stream reaches
it, as a `datasets.IterableDataset` (`IterableDataset.from_generator`, one shard per file). The documents go
through the same functions as the in-memory path (`tokenize_documents`, `pack_documents` with the same
batch of `DOCUMENTS_PER_BATCH` documents, `insert_repeats`), so both paths give the same blocks on the same data.

Bad shards stop the run with an error that names the shard (a run that silently skipped data would train
on a corpus nobody chose): a glob that matches nothing, a missing, empty or non-UTF-8 file, a JSON line
that does not parse, a row or file without the text column.
"""

import glob
from collections.abc import Iterator
from itertools import islice
from pathlib import Path

import torch
from datasets import Dataset, IterableDataset, load_dataset
from transformers import PreTrainedTokenizerBase, TrainingArguments

from minirope.training.data import (
    DOCUMENTS_PER_BATCH,
    TextDataArguments,
    check_text_file,
    documents,
    json_lines,
    pack_and_repeat,
    shakespeare_dataset,
    tokenize_documents,
)

SHARD_SUFFIXES = (".txt", ".jsonl", ".parquet")


def expand_files(patterns: list[str]) -> list[str]:
    """Paths and globs (`data/shard-*.jsonl`) -> the files, each pattern's matches sorted, in pattern order.

    Raises:
        FileNotFoundError: a pattern matches no file.
        ValueError: a file is not `.txt`, `.jsonl` or `.parquet`.
    """
    files = []
    for pattern in patterns:
        matches = sorted(glob.glob(pattern, recursive=True)) if glob.has_magic(pattern) else [pattern]
        matches = [path for path in matches if Path(path).is_file()]
        if not matches:
            raise FileNotFoundError(f"--train_file {pattern} matches no file: check the path or the glob.")
        for path in matches:
            if Path(path).suffix not in SHARD_SUFFIXES:
                raise ValueError(f"shard {path} is not {', '.join(SHARD_SUFFIXES)}: convert it, or leave it out.")
        files.extend(matches)
    return files


def read_shard(path: str, text_column: str) -> Iterator[dict[str, str]]:
    """The documents of one shard as `{"text", "source"}` rows (`source` names the shard and row).

    Raises:
        FileNotFoundError, ValueError: the shard is missing, empty, not UTF-8, holds a line that is not JSON,
            has no `text_column`, or a row whose text is not a string.
    """
    suffix = Path(path).suffix
    if suffix == ".txt":
        yield {"text": check_text_file(path), "source": path}
    elif suffix == ".jsonl":
        for number, row in json_lines(path):
            yield {"text": _text(row, text_column, f"{path} line {number}"), "source": f"{path} line {number}"}
    else:
        import pyarrow.parquet as pq

        try:
            table = pq.ParquetFile(path)
        except Exception as error:  # pyarrow raises several types for unreadable files
            raise ValueError(f"shard {path} is not a readable parquet file ({error}): check the file.") from None
        if text_column not in table.schema_arrow.names:
            raise ValueError(
                f"shard {path} has no column {text_column!r} (columns: {table.schema_arrow.names}): "
                f"pass the column that holds the text with --text_column."
            )
        row_number = 0
        for batch in table.iter_batches(columns=[text_column], batch_size=1024):
            for text in batch.column(0).to_pylist():
                yield {
                    "text": _text({text_column: text}, text_column, f"{path} row {row_number}"),
                    "source": f"{path} row {row_number}",
                }
                row_number += 1


def _text(row: dict, text_column: str, where: str) -> str:
    if not isinstance(row, dict) or text_column not in row:
        raise ValueError(
            f"{where} has no {text_column!r} field: pass the field that holds the text with --text_column."
        )
    if not isinstance(row[text_column], str):
        raise ValueError(
            f"{where}: {text_column!r} is {type(row[text_column]).__name__}, not text: fix or drop that row."
        )
    return row[text_column]


def _documents_of(shards: list[str], text_column: str) -> Iterator[dict[str, str]]:
    for path in shards:  # `from_generator` hands each process/worker its own list of shards
        yield from read_shard(path, text_column)


def stream_documents(args: TextDataArguments) -> IterableDataset:
    """Training documents as a stream with columns `text` and `source`: local shards or a Hub dataset.

    Raises:
        ValueError, FileNotFoundError: no source, both sources, or bad shards (see `expand_files`).
    """
    if args.train_file and args.dataset_name:
        raise ValueError("Give either --dataset_name or --train_file shards, not both.")
    if args.train_file:
        shards = expand_files(args.train_file)
        return IterableDataset.from_generator(
            _documents_of, gen_kwargs={"shards": shards, "text_column": args.text_column}
        )
    if args.dataset_name:
        stream = load_dataset(args.dataset_name, args.dataset_config_name, split="train", streaming=True)
        if stream.column_names is not None and args.text_column not in stream.column_names:
            raise ValueError(
                f"Dataset {args.dataset_name} has no column {args.text_column!r} (columns: {stream.column_names}): "
                f"pass --text_column."
            )
        return stream.map(
            lambda row: {
                "text": _text(row, args.text_column, f"{args.dataset_name} train"),
                "source": args.dataset_name,
            },
            remove_columns=stream.column_names,
        )
    plays = shakespeare_dataset()["train"]  # no source given: the bundled plays, streamed
    return plays.to_iterable_dataset()


def validation_documents(args: TextDataArguments) -> Dataset:
    """The held-out documents, in memory (a fixed set, scored as in the in-memory path): `--validation_file`,
    the Hub dataset's `validation` split, or the bundled validation plays."""
    if args.validation_file:
        return documents((check_text_file(path) for path in args.validation_file), args.validation_file)
    if args.dataset_name:
        split = load_dataset(args.dataset_name, args.dataset_config_name, split="validation")
        return documents(
            split[args.text_column], (f"{args.dataset_name} validation row {i}" for i in range(len(split)))
        )
    return shakespeare_dataset()["validation"]


def tokenizer_sample(stream: IterableDataset, max_bytes: int) -> list[str]:
    """The first documents of the stream, up to `max_bytes` of UTF-8 text (a tokenizer is trained on these)."""
    texts, total = [], 0
    for row in stream:
        texts.append(row["text"])
        total += len(row["text"].encode("utf-8"))
        if total >= max_bytes:
            break
    return texts


def stream_blocks(
    stream: IterableDataset,
    tokenizer: PreTrainedTokenizerBase,
    data_args: TextDataArguments,
    training_args: TrainingArguments,
) -> IterableDataset:
    """Documents -> blocks on the fly, with the in-memory path's functions and batches (`pack_and_repeat`)."""
    tokenized = stream.map(
        tokenize_documents,
        batched=True,
        batch_size=DOCUMENTS_PER_BATCH,
        remove_columns=["text", "source"],
        fn_kwargs={"tokenizer": tokenizer},
    )
    blocks = pack_and_repeat(tokenized, tokenizer, data_args, training_args.seed)
    if data_args.max_train_samples is not None:
        blocks = blocks.take(data_args.max_train_samples)
    return blocks


class WholeStream(torch.utils.data.IterableDataset):
    """The training stream as every process reads it: all of it, each process keeping its part of every global
    batch (accelerate's `IterableDatasetShard`), so the global batches are exactly one process's.

    Given a `datasets.IterableDataset` of at least as many shards as processes, accelerate would instead give
    each process its own shards (`IterableDataset.shard`): different batches than one process, and a stream
    position that differs per process. This plain torch wrapper keeps the first behaviour; it passes the
    stream's position through (`state_dict`/`load_state_dict`) for checkpoints.
    """

    def __init__(self, dataset: IterableDataset) -> None:
        self.dataset = dataset

    def __iter__(self):
        return iter(self.dataset)

    def state_dict(self) -> dict:
        return self.dataset.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self.dataset.load_state_dict(state_dict)


def first_blocks(blocks: IterableDataset, count: int) -> list[list[int]]:
    """The first `count` blocks' `input_ids` (for tests and checks)."""
    return [row["input_ids"] for row in islice(blocks, count)]
