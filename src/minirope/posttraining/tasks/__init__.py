"""Tasks: what a post-training run trains on, is measured on and rewards, as one value the run receives.

A `Task` holds the training rows, the held-out prompts, the rewards it offers by name, the demonstrations a warm
start may take and any measures of its own. The user's data is one kind of task (`minirope.posttraining.data`:
`--dataset_name` or `--train_file`); a bundled task is a package of this folder, named by `--task NAME` (or given by
import path, `--task my_tasks.word_problems`): a module with a `load(args, seed) -> Task` function and, beside it,
one recipe per method (`grpo.yaml`, `dpo.yaml`, `distill.yaml`) whose flags are the task's defaults. With no data and
no `--task`, the run takes the bundled task whose module sets `DEFAULT = True` (`default_task`) and says so. Nothing
outside a task's package knows what is in it.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from importlib import import_module
from pathlib import Path

from datasets import Dataset

from minirope.posttraining.reward_calls import import_from_working_directory


@dataclass
class Task:
    """What a run trains on and is measured on.

    Attributes:
        name: the task's name for the card and the summary (`user data` for the user's rows).
        source: where its rows come from, in words.
        held_out: the measured prompts, `prompt` and the data's other columns (never trained on).
        train: the training rows (prompts, or preference pairs); None where dpo builds its pairs from the model's
            own samples of `pair_prompts`.
        pair_prompts: dpo without pairs: the prompts to sample and rank (with their columns).
        rows: the user's training rows, every one (not only the --num_prompts trained or sampled): where they carry
            answers, a warm start's (`warm_start.answer_rows`); None for preference pairs and bundled tasks.
        rewards: the rewards the task offers by name (`--reward_funcs NAME`), beside TRL's and import paths.
        demonstrations: the warm start's rows (TRL's SFT formats) and their source in words, where the task has its
            own (None: `--sft_train_file` or the rows' answers).
        measure: measures of the task's own over the sampled completions' texts: a dataclass with a `line()`, saved
            in the run summary under its field names (None: none).
        cut_by_design: completions are cut at the token limit by design (the check for replies that never end
            stays silent).
    """

    name: str
    source: str
    held_out: Dataset
    train: Dataset | None = None
    pair_prompts: Dataset | None = None
    rows: Dataset | None = None
    rewards: dict[str, Callable] = field(default_factory=dict)
    demonstrations: Callable[[], tuple[Dataset, str]] | None = None
    measure: Callable[[list[str]], object] | None = None
    cut_by_design: bool = False


def task_module(name: str):
    """The module of the task `name`: a package of this folder, or an import path (from the working directory, as
    `--reward_funcs` takes one).

    Raises:
        ValueError: no such task, one without a `load` function, or one that fails to import (naming why).
    """
    path = name if "." in name else f"{__name__}.{name}"
    module = import_from_working_directory(path, f"--task {name}")
    if module is None:
        raise ValueError(f"--task {name}: no such task; give one of {', '.join(bundled())} or an import path of a "
                         f"module with a load(args, seed) -> Task function.") from None  # fmt: skip
    if not callable(getattr(module, "load", None)):
        raise ValueError(f"--task {name}: {path} has no load(args, seed) -> Task function.")
    return module


def bundled() -> list[str]:
    """The bundled tasks' names: the packages of this folder."""
    return sorted(item.name for item in Path(__file__).parent.iterdir() if (item / "__init__.py").is_file())


@cache
def default_task() -> str:
    """The task a run without data or `--task` takes: the one bundled task whose module sets `DEFAULT = True`.

    Raises:
        RuntimeError: none or several declare it (a broken install).
    """
    found = [name for name in bundled() if getattr(import_module(f"{__name__}.{name}"), "DEFAULT", False)]
    if len(found) != 1:
        raise RuntimeError(f"{__name__}: {len(found)} bundled tasks set DEFAULT = True ({found}); exactly one must.")
    return found[0]


def recipe_path(name: str, method: str) -> Path | None:
    """The recipe of task `name` for `method`: `<method>.yaml` beside the task's module; None where there is none."""
    path = Path(task_module(name).__file__).parent / f"{method}.yaml"
    return path if path.is_file() else None


def load_task(name: str, args, seed: int) -> Task:
    """The task `name`'s `Task`, for the run's flags `args` and `seed`."""
    return task_module(name).load(args, seed)
