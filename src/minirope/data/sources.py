"""Where a run's documents come from: `--train_file`/`--validation_file` files of one kind (text, prompt/completion
records or conversations), a `--dataset_name` split, or the bundled plays, as shards (`minirope.data.documents`)."""

from pathlib import Path

from datasets import DatasetDict, IterableDatasetDict, load_dataset, load_from_disk

from minirope.data.bundled import bundled_shards
from minirope.data.documents import DatasetStream, Shard, Texts, expand_files
from minirope.data.formats import file_shard, record_fields
from minirope.data.pipeline import TextDataArguments
from minirope.folders import first_line

KIND_NAMES = {"text": "text", "prompt_completion": "prompt/completion records", "messages": "conversations"}


def data_kind(files: list[str], text_column: str) -> str:
    """What a list of data files holds, all alike: `"text"` (`.txt` files, or records with `text_column`),
    `"prompt_completion"` (records with `prompt` and `completion`) or `"messages"` (conversations).

    Raises:
        ValueError: records with none of these, or files of two kinds (naming one of each).
    """
    kinds = {}
    for path in expand_files(files, flag="--train_file/--validation_file"):
        fields = record_fields(path)
        if not fields and Path(path).suffix == ".txt" or text_column in fields:
            kinds.setdefault("text", path)
        elif {"prompt", "completion"} <= fields:
            kinds.setdefault("prompt_completion", path)
        elif "messages" in fields:
            kinds.setdefault("messages", path)
        else:
            raise ValueError(
                f"data file {path} has records with fields {sorted(fields)}: give a {text_column!r} field (text, or "
                f"pass --text_column), 'prompt' and 'completion', or 'messages' (conversations)."
            )
    if len(kinds) > 1:
        (kind, path), (other, other_path) = [(KIND_NAMES[kind], path) for kind, path in list(kinds.items())[:2]]
        raise ValueError(f"the data files mix {kind} ({path}) and {other} ({other_path}): give files of one kind.")
    return next(iter(kinds), "text")


def dataset_not_found(name: str, error: FileNotFoundError, instead: str) -> FileNotFoundError:
    """The one-line error for a `--dataset_name` that `datasets` finds neither as a folder nor on the Hub: its first
    line of reason, and the flags to give `instead`."""
    reason = first_line(error)
    return FileNotFoundError(
        f"--dataset_name {name}: no such dataset folder, and none on the Hub ({reason}): check the name, or give "
        f"{instead}."
    )


def open_dataset(name: str, config: str | None, instead: str, streaming: bool = False):
    """The one opener of every `--dataset_name` (and `--lm_dataset_name`): a folder written by `save_to_disk`, or
    whatever `datasets.load_dataset` loads (a folder of data files, a Hub id), as a `DatasetDict` of its splits (an
    `IterableDatasetDict` with `streaming=True`; a saved folder's splits are read as iterable datasets).

    Raises:
        FileNotFoundError: neither (the first line of `datasets`' reason, and the flags to give `instead`).
    """
    folder = Path(name)
    if (folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file():
        dataset = load_from_disk(str(folder))
        dataset = dataset if isinstance(dataset, DatasetDict) else DatasetDict({"train": dataset})
        if streaming:
            return IterableDatasetDict({split: rows.to_iterable_dataset() for split, rows in dataset.items()})
        return dataset
    try:
        return load_dataset(name, config, streaming=streaming)
    except FileNotFoundError as error:
        raise dataset_not_found(name, error, instead) from None


def dataset_shards(args: TextDataArguments, split: str, streaming: bool = False) -> list[Shard]:
    """The `split` of `--dataset_name` as one shard (`open_dataset`): streamed (`streaming=True`), or loaded.

    Raises:
        ValueError: the dataset has no such split or no `--text_column`.
    """
    name = args.dataset_name
    splits = open_dataset(name, args.dataset_config_name, "--train_file/--validation_file", streaming)
    if split not in splits:
        raise ValueError(
            f"Dataset {name} has no {split!r} split (splits: {', '.join(splits)}): pass one with "
            f"--{'train' if split == 'train' else 'validation'}_file."
        )
    dataset = splits[split]
    columns = dataset.column_names
    if columns is not None and args.text_column not in columns:
        raise ValueError(f"Dataset {name} has no column {args.text_column!r} (columns: {columns}): pass --text_column.")
    if streaming:
        return [DatasetStream(dataset, args.text_column, f"{name} {split}")]
    rows = range(len(dataset))
    return [Texts(dataset[args.text_column], [f"{name} {split} row {row}" for row in rows], f"{name} {split}")]


def text_sources(args: TextDataArguments, streaming: bool = False) -> tuple[list[Shard], list[Shard]]:
    """`(training shards, validation shards)`: where a command's documents come from (`training_shards`,
    `validation_shards`), every file checked before any is read.

    Raises:
        ValueError, FileNotFoundError: both sources given, or a missing, empty or unsupported file.
    """
    return training_shards(args, streaming), validation_shards(args)


def training_shards(args: TextDataArguments, streaming: bool = False) -> list[Shard]:
    """Where the training documents come from: `--train_file` files and globs, `--dataset_name`'s `train`
    split, or (neither) the bundled training plays. Every file is checked before any is read.

    Raises:
        ValueError, FileNotFoundError: both sources given, or a missing, empty or unsupported file.
    """
    if args.dataset_name and (args.train_file or args.validation_file):
        raise ValueError("Give either --dataset_name or --train_file/--validation_file, not both.")
    if not streaming and bool(args.train_file) != bool(args.validation_file):
        raise ValueError("Give both --train_file and --validation_file, or neither.")
    if args.train_file:
        return file_shards(args.train_file, args.text_column)
    if args.dataset_name:
        return dataset_shards(args, "train", streaming)
    return bundled_shards("train")


def validation_shards(args: TextDataArguments) -> list[Shard]:
    """The held-out documents: `--validation_file` files, `--dataset_name`'s `validation` split, or the bundled
    validation plays."""
    if args.validation_file:
        return file_shards(args.validation_file, args.text_column, flag="--validation_file")
    if args.dataset_name:
        return dataset_shards(args, "validation")
    return bundled_shards("validation")


def file_shards(patterns: list[str], text_column: str, flag: str = "--train_file") -> list[Shard]:
    """One shard per file of `patterns` (paths and globs, `expand_files`), each file checked before any is read.

    Raises:
        ValueError, FileNotFoundError: a missing, empty or unsupported file (naming `flag`).
    """
    return [file_shard(path, text_column) for path in expand_files(patterns, flag=flag)]


def document_texts(shards: list[Shard]) -> list[str]:
    """The whole text of every document of `shards` (for held-out documents, which are held in memory)."""
    return ["".join(document.read(0)) for shard in shards for document in shard.documents()]
