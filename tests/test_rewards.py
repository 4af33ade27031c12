"""The verse task's rewards (minirope.posttraining.tasks.verse.rewards) against lines whose syllables were counted by
hand (CMUdict's first pronunciation of each word)."""

import pytest

from minirope.posttraining.tasks.verse.rewards import (
    is_iambic,
    is_verse_line,
    line_stresses,
    line_syllables,
    meter_reward,
    monosyllable_penalty,
    polysyllables,
    scans,
    scansion_reward,
    syllable_closeness_reward,
    verse_lines,
    word_syllables,
    word_variety_reward,
)

SCANS = "But soft, what light through yonder window breaks?"  # 1+1+1+1+1+2+2+1
ELEVEN = "To be, or not to be: that is the question:"  # 1+1+1+1+1+1+1+1+1+2
SUMMER = "Shall I compare thee to a summer's day?"  # 1+1+2+1+1+1+2+1: an apostrophe inside a word
HYPHEN = "My heart-sick lord, I pray thee, go to bed."  # heart + sick: split at the hyphen
UNKNOWN = "O'er hills and dales the weary shepherd goes"  # o'er is not in CMUdict: a miss, never a guess


@pytest.mark.parametrize(
    "line, syllables, scanning",
    [
        (SCANS, 10, True),
        (ELEVEN, 11, False),
        (SUMMER, 10, True),
        (HYPHEN, 10, True),
        ("'Tis nobler in the mind to suffer long", 10, True),  # a leading apostrophe: 'tis is in CMUdict
        ("Now is the winter of our discontent", 11, False),  # "our" is two syllables by CMUdict's first reading
        (UNKNOWN, None, False),
        ("The quality of mercy is not strain'd,", None, False),  # strain'd: an elision CMUdict does not list
        ("...!", None, False),  # no words
    ],
)
def test_line_syllables_and_scans_match_hand_counts(line, syllables, scanning):
    assert line_syllables(line) == syllables
    assert scans(line) is scanning


def test_word_syllables_reads_the_first_pronunciation_and_strips_outer_apostrophes():
    assert word_syllables("question") == 2
    assert word_syllables("QUESTION") == 2
    assert word_syllables("lovers'") == 2  # found as "lovers"
    assert word_syllables("frabjous") is None


@pytest.mark.parametrize(
    "line", ["ROMEO:", "KING RICHARD II:", "FIRST CITIZEN:", "[Exit]", "Exeunt", "Enter ROMEO", "", "  "]
)
def test_headers_directions_and_empty_lines_are_not_lines(line):
    assert not is_verse_line(line)
    assert not scans(line)


def test_a_header_of_ten_syllables_never_scans():
    header = "THE DUKE OF NORFOLK AND THE EARL OF KENT:"
    assert line_syllables(header.rstrip(":")) == 10 and not scans(header)


def test_verse_lines_skip_headers_and_drop_a_last_line_cut_mid_way():
    text = f"ROMEO:\n{SCANS}\n\nJULIET:\n{ELEVEN}\n{SUMMER}\n{HYPHEN}\nAnd then the"
    assert verse_lines(text) == [SCANS, ELEVEN, SUMMER]
    assert verse_lines(text, None) == [SCANS, ELEVEN, SUMMER, HYPHEN]
    assert verse_lines(SCANS) == [SCANS]  # a single line is kept whole


def test_scansion_reward_is_the_share_of_the_first_three_lines_that_scan():
    completions = [
        f"{SCANS}\n{SUMMER}\n{HYPHEN}\n",  # 3 of 3
        f"{SCANS}\n{ELEVEN}\n{UNKNOWN}\n{SUMMER}\n",  # 1 of the first 3; the fourth is not read
        f"ROMEO:\n{SCANS}\n",  # one line written: the two not written are misses
        "",  # empty completion
        "\n\n",
    ]
    assert scansion_reward(completions) == pytest.approx([1.0, 1 / 3, 1 / 3, 0.0, 0.0])


def test_rewards_accept_conversational_completions_and_ignore_trl_kwargs():
    conversational = [[{"role": "assistant", "content": f"{SCANS}\n{SUMMER}\n{HYPHEN}\n"}], []]
    rewards = scansion_reward(conversational, prompts=["x", "y"], completion_ids=[[1], [2]], trainer_state=None)
    assert rewards == [1.0, 0.0]


def test_syllable_closeness_gives_partial_credit_and_nothing_for_unknown_words():
    completions = [f"{ELEVEN}\n", f"{SCANS}\n{UNKNOWN}\n{ELEVEN}\n", ""]
    assert syllable_closeness_reward(completions) == pytest.approx([0.9 / 3, (1 + 0 + 0.9) / 3, 0.0])


# Lines scanned by hand against CMUdict's first pronunciations (stress digits per word; position = syllable 1..10).
SONNET_12 = "When I do count the clock that tells the time,"  # ten monosyllables: iambic, and nothing but monosyllables


@pytest.mark.parametrize(
    "line, iambic, words_of_two_or_more",
    [
        (SCANS, True, 2),  # yonder 1-0 on 6-7, window 1-0 on 8-9: primary on even, unstressed on odd
        (SUMMER, True, 2),  # compare 0-1 on 3-4, summer's 1-0 on 8-9
        ("Shall I compare thee to a summer's day", True, 2),  # the same without its question mark
        (SONNET_12, True, 0),
        ("If music be the food of love, play on;", True, 1),  # music 1-0 on 2-3
        ("Beautiful is the morning of the day", False, 2),  # beautiful 1-0-0 on 1-2-3: primary on an odd position
        ("The morning comes upon the quiet sea", True, 3),  # morning 2-3, upon 0-1 on 5-6, quiet 1-0 on 8-9
        ("Gentle the morning comes upon the sea", False, 3),  # gentle 1-0 on 1-2: primary on an odd position
        (ELEVEN, False, 1),  # eleven syllables
        ("My heart-sick lord, I pray thee, go to bed.", True, 0),  # heart + sick: monosyllables after the split
        ("Now is the winter of our discontent", False, 3),  # eleven by CMUdict ("our": 2)
        (UNKNOWN, False, 0),  # an unknown word: no stresses
        ("ROMEO:", False, 1),  # a header is not a line (its word still counts)
    ],
)
def test_iambic_by_stress_matches_hand_scansion(line, iambic, words_of_two_or_more):
    assert is_iambic(line) is iambic, line_stresses(line)
    assert polysyllables(line) == words_of_two_or_more


def test_secondary_stress_falls_anywhere():
    # understand: 2-0-1 (CMUdict); on 1-2-3 its secondary stress is on an odd position, its primary on 3 (odd): a miss;
    # on 2-3-4 the unstressed syllable lands on 3 (odd) and the primary on 4: iambic, the secondary on 2 is free.
    assert line_stresses("I understand the reason for the art")[1] == "201"
    assert not is_iambic("Understand the reason of the heart and hand")
    assert is_iambic("I understand the reason for the art")


def test_meter_reward_pays_less_for_lines_of_monosyllables_only():
    whole = f"{SCANS}\n{SUMMER}\n{SCANS}\n"
    filler = f"{SONNET_12}\n{SONNET_12}\n{SONNET_12}\n"
    mixed = f"{SCANS}\n{SONNET_12}\n{ELEVEN}\n"
    assert meter_reward([whole, filler, mixed, ""]) == [1.0, 0.25, (1 + 0.25) / 3, 0.0]
    assert scansion_reward([filler]) == [1.0]  # the count alone cannot tell filler from verse


def test_monosyllable_penalty_counts_scanning_lines_of_monosyllables_only():
    whole = f"{SCANS}\n{SUMMER}\n{SCANS}\n"
    filler = f"{SONNET_12}\n{SONNET_12}\n{SONNET_12}\n"
    mixed = f"{SCANS}\n{SONNET_12}\n{ELEVEN}\n"
    short = "I am\n"  # monosyllables that do not scan: nothing to penalize
    assert monosyllable_penalty([whole, filler, mixed, short, ""]) == [0.0, -1.0, -1 / 3, 0.0, 0.0]
    # with meter_reward at weight 1 a filler line is worth less than a line that does not scan (0)
    meter, penalty = meter_reward([filler, mixed]), monosyllable_penalty([filler, mixed])
    summed = [m + p for m, p in zip(meter, penalty, strict=True)]
    assert summed == pytest.approx([0.25 - 1, (1 + 0.25 - 1) / 3]) and summed[0] < 0


def test_word_variety_reward_pays_words_other_completions_do_not_use_on_three_lines():
    # "the" is in all three completions (1/3 each), "king" in two (1/2), every other word in one (1); each
    # completion writes three lines.
    completions = [
        "The king is dead\nlong\nago\n",
        "The king will live\nand\nreign\n",
        "The crows above\nthe\nfield\n",
        "ROMEO:\n",
    ]
    the, king = 1 / 3, 1 / 2
    assert word_variety_reward(completions) == pytest.approx(
        [(the + king + 1 + 1 + 1 + 1) / 6, (the + king + 1 + 1 + 1 + 1) / 6, (the + 1 + 1 + the + 1) / 5, 0.0]
    )
    # One line of words no one else uses earns a third of what three such lines earn: writing less is no way up.
    assert word_variety_reward(["Zounds, varlet, hie!\n", "Come\nsit\nhere\n"]) == pytest.approx([1 / 3, 1.0])


def test_verse_measure_counts_lines_and_saves_them_under_the_run_summarys_names():
    from minirope.posttraining.measures import TaskMeasure, task_measures
    from minirope.posttraining.tasks.verse import verse_measure

    texts = [f"{SCANS}\n{SONNET_12}\n", f"{ELEVEN}\n{SCANS}\n"]
    measure, task = verse_measure(texts), task_measures(verse_measure, texts)
    saved = TaskMeasure(4, 2, {}, {}, 1.0, None, **task).as_dict()
    assert "monosyllables only" in TaskMeasure(4, 2, {}, {}, 1.0, None, **task).line()
    # 4 lines, 3 scan (not ELEVEN), of which SONNET_12 alone is monosyllables only; SCANS twice: 3 distinct lines
    assert {name: saved[name] for name in ("lines", "scan_share", "monosyllabic_scan_share", "distinct_share")} == {
        "lines": 4, "scan_share": 0.75, "monosyllabic_scan_share": pytest.approx(1 / 3), "distinct_share": 0.75
    }  # fmt: skip
    assert {"iambic_share", "distinct_words_per_word"} <= saved.keys()
    assert "monosyllables only" in measure.line()
