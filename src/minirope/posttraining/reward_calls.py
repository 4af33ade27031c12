"""Rewards wired as TRL wires them: found by name or import path, called with TRL's keyword arguments, checked on the
model's own samples before any training, and used to rank dpo's pairs.

TRL's `GRPOTrainer` calls each reward as `reward(prompts=..., completions=..., completion_ids=..., **columns)`, where
`columns` holds every other column of the batch's rows, one value per completion (a `solution`, say), and accepts a
list of one float (or `None`, "does not apply") per completion. `call_reward` makes the same call, so a reward that
passes the check here works in TRL's loop, and the measures score completions exactly as training does.
"""

import importlib
import inspect
import os
import sys

from datasets import Dataset

# TRL's reward registry (`trl grpo --reward_funcs NAME`); they read conversational completions, and accuracy_reward
# a `solution` column and the math_verify package.
TRL_REWARDS = ("accuracy_reward", "reasoning_accuracy_reward", "think_format_reward")


def completion_text(completion) -> str:
    """A completion's text: a string (TRL's standard format), or the last message's content (conversational)."""
    if isinstance(completion, str):
        return completion
    return completion[-1]["content"] if completion else ""


def weighted_reward(values, weights: list[float] | None) -> float:
    """The rewards' weighted sum, as GRPO sums a completion's rewards (`--reward_weights`): `values` one per reward,
    in order (a completion's values, or each reward's mean), `weights` one per reward (None: 1 each); None ("does not
    apply") counts 0."""
    weights = weights if weights is not None else [1.0] * len(values)
    return sum(weight * (value or 0.0) for weight, value in zip(weights, values, strict=True))


def import_from_working_directory(module_name: str, flag: str):
    """The user's module `module_name`, imported with the working directory on `sys.path` (as TRL's own `trl grpo
    --reward_funcs` imports one); None where no such module exists.

    Raises:
        ValueError: a module it imports is missing, or an error inside it (reported as itself), after `flag`.
    """
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if not module_name.startswith(str(error.name)):  # a module the user's module imports is missing
            raise ValueError(f"{flag}: importing {module_name} failed: {error}") from None
        return None
    except Exception as error:  # an error inside the user's module, reported as itself
        raise ValueError(f"{flag}: importing {module_name} failed: {type(error).__name__}: {error}") from None


def resolve_reward(name: str, offered: dict | None = None):
    """A reward function by name: one the task offers (`offered`, `Task.rewards`), TRL's registry (`trl.rewards`), or a
    dotted import path, imported with the working directory on `sys.path`, as TRL's own `trl grpo --reward_funcs` does.

    Raises:
        ValueError: no reward has that name or path (naming the known names), or the module fails to import (the
            error raised inside it, as itself).
    """
    offered = offered or {}
    if name in offered:
        return offered[name]
    if name in TRL_REWARDS:
        import trl.rewards

        return getattr(trl.rewards, name)
    module_name, _, attribute = name.rpartition(".")
    module = import_from_working_directory(module_name, f"--reward_funcs {name}") if module_name else None
    reward = getattr(module, attribute, None)
    if not callable(reward):
        known = [*offered, *TRL_REWARDS]
        raise ValueError(
            f"--reward_funcs {name!r} is not a reward: give one of {', '.join(known)} or an import path "
            f"(my_module.my_reward, from the working directory) of a function (prompts, completions, **kwargs) -> "
            f"list[float]."
        )
    check_reward_arguments(name, reward)
    return reward


def check_reward_arguments(name: str, reward) -> None:
    """A reward takes TRL's keyword arguments (`completions`, or `**kwargs` for those it reads); a function that takes
    neither builds rewards (TRL's `get_soft_overlong_punishment(max_completion_len, soft_punish_cache)`, say).

    Raises:
        ValueError: `reward` takes neither, naming its parameters and how to build the reward instead.
    """
    try:
        parameters = inspect.signature(reward).parameters
    except (TypeError, ValueError):  # a builtin without a signature: called as it is
        return
    if "completions" in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        return
    attribute = name.rpartition(".")[2]
    raise ValueError(
        f"--reward_funcs {name} takes ({', '.join(parameters)}), not a reward's keyword arguments (prompts, "
        f"completions, completion_ids, the rows' columns): if it builds a reward, build it in a rewards file of "
        f"yours (`my_reward = {attribute}(...)` in my_rewards.py) and give --reward_funcs my_rewards.my_reward."
    )


def reward_name(reward) -> str:
    return getattr(reward, "__name__", type(reward).__name__)


def call_reward(reward, rows: Dataset, completions: list, completion_ids: list[list[int]]) -> list:
    """`reward`'s values for `completions`, where completion `i` answers `rows[i]`, called as TRL calls it: the rows'
    `prompt`s as `prompts`, the completions, their token ids, and every other column as a keyword argument."""
    columns = {column: rows[column] for column in rows.column_names if column != "prompt"}
    return reward(prompts=rows["prompt"], completions=completions, completion_ids=completion_ids, **columns)


def check_rewards(rewards: list, rows: Dataset, completions: list, completion_ids: list[list[int]]) -> None:
    """Call each reward on the model's own samples before training, as TRL will (`call_reward`).

    Raises:
        ValueError: a reward that fails, or returns other than one number (or None, TRL's "does not apply") per
            completion, or None for every one, naming it.
    """
    for reward in rewards:
        name = reward_name(reward)
        try:
            values = call_reward(reward, rows, completions, completion_ids)
        except Exception as error:  # a user's function: any failure is reported as its own
            raise ValueError(f"reward {name} failed on the model's samples: {type(error).__name__}: {error}") from None
        numbers = isinstance(values, list | tuple) and len(values) == len(completions)
        if not numbers or not all(value is None or isinstance(value, int | float) for value in values):
            raise ValueError(
                f"reward {name} returned {str(values)[:80]} for {len(completions)} completions: a reward must "
                f"return a list of one number (float) per completion, or None where it does not apply."
            )
        if all(value is None for value in values):
            raise ValueError(
                f"reward {name} returned None for all {len(completions)} completions: it applies to none of these "
                f"rows (does the data have the columns it reads?)."
            )


REJECTED_BY = ("sum", "first_reward")  # own_pairs' rules for the sample a pair rejects


def own_pairs(
    samples, rewards: list, margin: float = 0.0, weights: list[float] | None = None, rejected_by: str = "sum"
) -> list[dict]:
    """Preference pairs from the model's own samples (`minirope.posttraining.sampling.Samples`, several
    completions of each prompt): each prompt's completions ranked by the sum of `rewards` times `weights` (default 1
    each, as GRPO sums its rewards), each reward called (`call_reward`) on that prompt's completions together, as
    GRPO scores a prompt's group (a reward that reads the batch, like `word_variety_reward`, compares them with each
    other; None, "does not apply", adds nothing, and a completion no reward applies to is left out). The best by the
    sum is chosen; the rejected is the worst by the sum (`rejected_by="sum"`) or by the first reward
    (`"first_reward"`, ties to the lower sum; a completion the first reward does not apply to is not rejected); a
    pair is kept where the chosen's sum is higher by at least `margin`. Each pair keeps its row's other columns.

    Raises:
        ValueError: `rejected_by` is neither "sum" nor "first_reward".
    """
    if rejected_by not in REJECTED_BY:
        raise ValueError(f"rejected_by must be one of {', '.join(REJECTED_BY)}, got {rejected_by!r}.")
    pairs, weights = [], weights or [1.0] * len(rewards)
    for index, row in enumerate(samples.prompt_rows):
        rows, texts, ids = samples.group(index)
        values = [call_reward(reward, rows, texts, ids) for reward in rewards]
        columns = enumerate(zip(*values, strict=True))  # each completion's values, one per reward
        scored = [(weighted_reward(column, weights), k) for k, column in columns
                  if any(v is not None for v in column)]  # fmt: skip
        if len(scored) < 2:
            continue
        best_score, best = max(scored)
        if rejected_by == "sum":
            worst_score, worst = min(scored)
        else:
            first = values[0]
            ranked = [(first[k], score, k) for score, k in scored if first[k] is not None]
            if not ranked:  # the first reward applies to none of them: nothing to reject
                continue
            _, worst_score, worst = min(ranked)
        if best_score > worst_score and best_score - worst_score >= margin:
            pairs.append({**row, "chosen": texts[best], "rejected": texts[worst]})
    return pairs
