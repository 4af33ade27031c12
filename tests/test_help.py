"""`--help` tells the truth: every flag a minirope command re-defaults keeps its help and shows the default the run
uses (a bare `name: type = value` in a subclass of `TrainingArguments` drops both), and usage lines show the
positional forms."""

import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
from transformers import HfArgumentParser

from minirope.commands.extend import ExtendingArguments
from minirope.commands.finetune import FinetuningArguments
from minirope.commands.pretrain import PretrainingArguments
from minirope.training.arguments import MiniRopeTrainingArguments

ROOT = Path(__file__).parent.parent


def own_fields(kind: type) -> list[str]:
    """The flags `kind` (re)defines itself, beside those of `TrainingArguments`."""
    return list(vars(kind).get("__annotations__", {}))


@pytest.mark.parametrize("kind", [MiniRopeTrainingArguments, PretrainingArguments, FinetuningArguments,
                                  ExtendingArguments])  # fmt: skip
def test_every_re_defaulted_flag_keeps_its_help_and_shows_its_default(kind):
    parser = HfArgumentParser(kind)
    actions = {action.dest: action for action in parser._actions}
    defaults = {item.name: item for item in fields(kind)}
    for name in own_fields(kind):
        action = actions[name]
        assert action.help, f"{kind.__name__}.{name} has no help: --help shows neither what it does nor its default"
        text = parser.format_help()
        assert f"--{name}" in text
        assert defaults[name].default == action.default or defaults[name].default_factory is not None


def test_pretrain_help_shows_the_recipes_steps_and_learning_rate():
    options = " ".join(HfArgumentParser(PretrainingArguments).format_help().split()).split("options:")[1]
    for flag, default in (("--max_steps MAX_STEPS", "1200"), ("--learning_rate LEARNING_RATE", "0.004"),
                          ("--per_device_train_batch_size PER_DEVICE_TRAIN_BATCH_SIZE", "8")):  # fmt: skip
        entry = options.split(f"{flag}, ")[1].split(" --")[0]  # the flag's help, up to the next flag
        assert f"(default: {default})" in entry, (flag, entry)


def test_import_usage_shows_the_positional_source():
    done = subprocess.run([sys.executable, "-m", "minirope.commands.import_model", "--help"], capture_output=True,
                          text=True, check=True)  # fmt: skip
    assert done.stdout.startswith("usage: minirope-import SOURCE --output_dir DIR")


# The pages that state a flag's default as "`--flag` (N)" or "`--flag` (default N)", and the commands they describe.
PAGE_COMMANDS = {
    "README.md": [("pretrain", ()), ("finetune", ()), ("generate", ())],
    "docs/training.md": [("pretrain", ()), ("finetune", ())],
    "docs/chat.md": [("finetune", ())],
    "docs/scaling.md": [("pretrain", ())],
    "docs/long_context.md": [("extend", ())],
    "docs/post_training.md": [("posttrain", ("--method", "grpo")), ("posttrain", ("--method", "dpo"))],
    "docs/pretrained.md": [("import_model", ()), ("posttrain", ("--method", "grpo"))],
}
DOCUMENTED_DEFAULT = re.compile(r"`(--[a-z_]+)` \((?:default:? )?(\d[\d,]*(?:\.\d+)?)\)")


def help_entries(command: str, argv: tuple, capsys) -> dict[str, str]:
    """Each flag of the command's `--help` and its entry (help text and `(default: ...)`), in one line."""
    import importlib

    with pytest.raises(SystemExit):
        importlib.import_module(f"minirope.commands.{command}").run([*argv, "--help"])
    text = capsys.readouterr().out
    entries = re.split(r"\n  (?=--)", text.split("options:", 1)[1])
    flags = [(re.match(r"(--[a-z0-9_]+)", entry), entry) for entry in entries]
    return {match.group(1): " ".join(entry.split()) for match, entry in flags if match}


def shows(entry: str, number: str) -> bool:
    """Whether a flag's `--help` entry shows `number`: as its default, or in its help (a default the run sizes)."""
    shown = re.search(r"\(default: ([^)]*)\)$", entry)
    if shown and re.fullmatch(r"[\d.e+-]+", shown.group(1)) and float(shown.group(1)) == float(number):
        return True
    return re.search(rf"\b{re.escape(number)}\b", entry) is not None


@pytest.mark.parametrize("page", sorted(PAGE_COMMANDS))
def test_the_defaults_a_page_states_are_those_help_shows(page, capsys):
    if any(command == "posttrain" for command, _ in PAGE_COMMANDS[page]):
        pytest.importorskip("trl")
    helps = [help_entries(command, argv, capsys) for command, argv in PAGE_COMMANDS[page]]
    stated = DOCUMENTED_DEFAULT.findall((ROOT / page).read_text())
    for flag, value in stated:
        entries = [entries[flag] for entries in helps if flag in entries]
        assert entries, f"{page} states {flag} ({value}), which none of {PAGE_COMMANDS[page]} takes"
        number = value.replace(",", "")
        assert any(shows(entry, number) for entry in entries), f"{page}: {flag} ({value}); --help: {entries}"


# The flags `minirope-posttrain --method grpo` takes beyond `trl grpo`'s (TRL's script, config and model flags): a
# ceiling that only comes down (the aim: 15), so that a new flag of minirope's own replaces one or takes TRL's name.
GRPO_OWN_FLAGS = 23


def test_grpo_takes_few_flags_that_trl_grpo_lacks(capsys):
    pytest.importorskip("trl")
    from trl.scripts.grpo import make_parser

    ours = help_entries("posttrain", ("--method", "grpo"), capsys)
    trl = {option.lstrip("-") for action in make_parser()._actions for option in action.option_strings}
    own = sorted(flag for flag in ours if flag.lstrip("-") not in trl and not flag.startswith("--no_"))
    assert "--num_generations_eval" not in own and "--max_completion_length" not in own  # TRL's names, kept
    assert len(own) <= GRPO_OWN_FLAGS, f"{len(own)} flags trl grpo lacks (at most {GRPO_OWN_FLAGS}): {own}"
