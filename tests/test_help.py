"""`--help` tells the truth: every flag a minirope command re-defaults keeps its help and shows the default the run
uses (a bare `name: type = value` in a subclass of `TrainingArguments` drops both), and usage lines show the
positional forms."""

import subprocess
import sys
from dataclasses import fields

import pytest
from transformers import HfArgumentParser

from minirope.commands.extend import ExtendingArguments
from minirope.commands.finetune import FinetuningArguments
from minirope.commands.pretrain import PretrainingArguments
from minirope.training.arguments import MiniRopeTrainingArguments


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
