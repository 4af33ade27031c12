"""Never silently worse: the held-out reward measured during training, and the best weights kept.

Every `--eval_steps` (a number of steps, or below 1 a share of the run, as `TrainingArguments` reads it) and at the
last step, `KeepBest` (a `TrainerCallback`, so the loop stays TRL's) scores the model on the held-out prompts: one
greedy completion per prompt, each reward called as TRL calls it, their means weighted by `--reward_weights` and
summed (for a task with one right answer and one reward: the held-out exact-match accuracy). The starting model is
scored first (step 0); after a warm start that scores higher, the warm-started model takes step 0's place
(`warm_started`: the run never keeps less than the best model it had). After training, `restore_best` puts the
best-scoring weights back (the trainable ones: the adapter's for a later step of a LoRA run; for its start, the whole
model's, once the adapter is merged), so the folder written is never below the model the run started from on that
score, unless `--keep_last` is given; and `Selection.line` says in one line which step was kept, and when no step beat
the start, that nothing was gained and what to change. The same selection for GRPO, DPO and distillation, as the
Trainer's `load_best_model_at_end` would make it, without writing a checkpoint per measure.
"""

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from datasets import Dataset
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm
from transformers import TrainerCallback

from minirope.owned import write_atomic
from minirope.posttraining.measures import reward_means
from minirope.posttraining.reward_calls import weighted_reward
from minirope.posttraining.sampling import GREEDY, sample


def held_out_score(model, tokenizer, held_out: Dataset, rewards: list, weights: list[float] | None, tokens: int,
                   seed: int, run=None) -> float:  # fmt: skip
    """The weighted sum of each reward's mean over one greedy completion (at most `tokens` new tokens) of each
    held-out prompt, generated in the precision of `run` (the method's TRL config; `sampling.sample`); a reward
    that applies to none counts 0. `weights`: one per reward, None for 1 each."""
    training = model.training
    devices = [model.device.index or 0] if model.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):  # the measure leaves training's random state as it was
        means = reward_means(rewards, sample(model, tokenizer, held_out, 1, tokens, seed, GREEDY, run))
    model.train(training)
    return weighted_sum(means, weights)


def weighted_sum(means: dict[str, float | None], weights: list[float] | None) -> float:
    """`means` (one per reward, in order) weighted by `weights` (None: 1 each) and summed; None counts 0."""
    return weighted_reward(list(means.values()), weights)


def score_name(names: list[str], weights: list[float] | None) -> str:
    """How the score is made, for its lines: `exact`, or `meter_reward + 1.5 x word_variety_reward`; weight-0
    rewards (measured only) left out."""
    weights = weights if weights is not None else [1.0] * len(names)
    terms = [name if weight == 1 else f"{weight:g} x {name}" for name, weight in zip(names, weights, strict=True)
             if weight != 0]  # fmt: skip
    return " + ".join(terms) + " (greedy)"


@dataclass
class Selection:
    """The measured scores (`history`: `{"step", "score"}` in step order, step 0 the starting model, or the
    warm-started one where it scored higher: then `before` is the score of the model the run started from) and the
    step whose weights the folder holds."""

    history: list[dict] = field(default_factory=list)
    kept_step: int = 0
    keep_last: bool = False
    before: float | None = None

    @property
    def start(self) -> float:
        """Step 0's score: the method's starting model."""
        return self.history[0]["score"]

    @property
    def origin(self) -> float:
        """The score of the model the run started from (before any warm start)."""
        return self.start if self.before is None else self.before

    @property
    def best(self) -> dict:
        """The first measure with the highest score (ties go to the earlier step: no change for nothing)."""
        return max(self.history, key=lambda entry: (entry["score"], -entry["step"]))

    @property
    def gained(self) -> bool | None:
        """Whether the kept weights score above the model the run started from; None where nothing was scored (no
        reward)."""
        return self.score(self.kept_step) > self.origin if self.history else None

    def score(self, step: int) -> float:
        return next(entry["score"] for entry in self.history if entry["step"] == step)

    def line(self, measure: str, advice: tuple[str, ...] = ("--learning_rate", "--max_steps")) -> str:
        """What the run gained on the held-out score, in one line (`measure` names it; `advice`: the method's flags
        it suggests when nothing was gained, its script arguments' `advice`)."""
        if not self.history:
            return "the held-out prompts are not scored during training (no --reward_funcs): the last weights are kept"
        last = self.history[-1]
        kept = self.score(self.kept_step)
        if self.keep_last and kept <= self.origin:
            change = f"fell from {self.origin:.3f} to" if kept < self.origin else f"stayed at {self.origin:.3f}:"
            return f"held-out {measure} {change} {kept:.3f} at step {self.kept_step}: kept anyway (--keep_last)"
        if not self.gained:
            rate, *more = advice
            return (
                f"nothing gained: no step beat the starting model's held-out {measure} ({self.start:.3f}; the last "
                f"step {last['score']:.3f}), so the folder holds the starting weights; try a lower {rate}, or more "
                f"{' or more '.join(more)} (with --keep_last the last weights are kept)"
            )
        if self.kept_step == 0:  # a warm start that no later step beat
            return (
                f"held-out {measure} {self.origin:.3f} -> {kept:.3f} by the warm start; no step of the method beat it "
                f"(the last step {last['score']:.3f}), so the folder holds the warm-started weights"
            )
        where = "the last step" if self.kept_step == last["step"] else f"step {self.kept_step} of {last['step']}"
        warmed = f" (warm start {self.start:.3f})" if self.before is not None else ""
        return f"held-out {measure} {self.origin:.3f} -> {kept:.3f}{warmed}: kept {where}"

    def as_dict(self) -> dict:
        return {"measured": self.history, "kept_step": self.kept_step, "gained": self.gained,
                "keep_last": self.keep_last, "before_warm_start": self.before}  # fmt: skip


BEST_WEIGHTS, HISTORY = "keep_best.safetensors", "keep_best.json"  # in each checkpoint


class KeepBest(TrainerCallback):
    """Scores the model every `every` steps and at the last one (`held_out_score`), keeping a CPU copy of the
    trainable weights of the best score so far (none with `keep_last`: they are never put back). `measure(model) ->
    float` is the score; call `start` with the starting model's score before training (step 0), `restore_best`
    after."""

    def __init__(self, measure, every: float, keep_last: bool = False):
        self.measure, self.every = measure, every
        self.selection = Selection(keep_last=keep_last)
        self.best_weights: dict[str, torch.Tensor] = {}

    def record(self, model, step: int, score: float | None = None) -> None:
        """Score `model` at `step` (or take `score`, measured already), keeping its weights if it is the best (and
        `model` is given: the start's are taken when training begins, from the model as the trainer wraps it)."""
        score = self.measure(model) if score is None else score
        self.selection.history.append({"step": step, "score": round(score, 6)})
        if self.selection.best["step"] == step and model is not None:
            self.keep(model)
        best = self.selection.best
        tqdm.write(
            f"[minirope] step {step}: held-out score {score:.3f} (best {best['score']:.3f}, step {best['step']})"
        )

    def keep(self, model) -> None:
        """A CPU copy of `model`'s trainable weights (a LoRA adapter's, under TRL's peft wrapping), as the best so
        far; none with `keep_last` (they are never put back)."""
        if not self.selection.keep_last:
            self.best_weights = {name: param.detach().to("cpu", copy=True) for name, param in
                                 model.named_parameters() if param.requires_grad}  # fmt: skip

    def start(self, score: float, model=None) -> None:
        """Step 0: the score of the model the run starts from, and its weights (`model`); without `model` they are
        taken when training begins, from the model the trainer holds (wrapped: a LoRA adapter's initial weights,
        which leave the model as it started)."""
        self.record(model, 0, score)

    def warm_started(self, score: float, model) -> None:
        """A warm start ran after `start`: where the warm-started `model` scores higher (`score`), it takes step 0's
        place, and the first score stays as `Selection.before`; its weights are kept only where step 0 is then the
        best (a run resumed from a checkpoint whose later step scored higher keeps that step's weights)."""
        if score <= self.selection.start:
            return
        self.selection.before = self.selection.start
        self.selection.history[0] = {"step": 0, "score": round(score, 6)}
        if self.selection.best["step"] == 0 and model is not None:  # None: a LoRA run (the adapter's start is kept)
            self.keep(model)
        tqdm.write(f"[minirope] warm start: held-out score {self.selection.before:.3f} -> {score:.3f}")

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.selection.best["step"] == 0 and not self.best_weights:  # a resumed run brings its own (`resume`)
            self.keep(model)

    def interval(self, max_steps: int) -> int:
        return max(1, round(self.every * max_steps)) if self.every < 1 else int(self.every)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        step = state.global_step
        if step % self.interval(state.max_steps) == 0 or step >= state.max_steps:
            self.record(model, step)

    def on_train_end(self, args, state, control, model=None, **kwargs):
        if not self.selection.history or self.selection.history[-1]["step"] != state.global_step:
            self.record(model, state.global_step)  # stopped early (a callback, an epoch's end)

    def save_to_checkpoint(self, folder: Path, args, state) -> None:
        """Each checkpoint carries the measures so far and the best weights, so that a resumed run keeps the same
        model as an uninterrupted one; `OwnFolder` calls this before the Trainer writes `trainer_state.json`, which
        marks the checkpoint complete."""
        save_file(self.best_weights, folder / BEST_WEIGHTS)
        history = {"history": self.selection.history, "before_warm_start": self.selection.before}
        write_atomic(folder / HISTORY, json.dumps(history))

    def resume(self, checkpoint: str | None) -> None:
        """Take the measures (step 0's included, and the score before a warm start) and the best weights a checkpoint
        carries (a run resumed from it). A checkpoint of an earlier minirope (its measures a list) leaves step 0 this
        run's own."""
        folder = Path(checkpoint) if checkpoint else None
        if folder is None or not (folder / HISTORY).is_file():
            return
        state = json.loads((folder / HISTORY).read_text())
        if isinstance(state, list):
            self.selection.history = [*self.selection.history[:1], *[entry for entry in state if entry["step"] > 0]]
        else:
            self.selection.history, self.selection.before = state["history"], state["before_warm_start"]
        self.best_weights = load_file(folder / BEST_WEIGHTS)

    def fits(self, model) -> bool:
        """Whether the kept weights are `model`'s, by name: a LoRA run's later steps keep the adapter's weights (the
        wrapped model's names), its start the whole model's (the names of the model the adapter is merged back into)."""
        return set(self.best_weights) <= {name for name, _ in model.named_parameters()}

    @torch.no_grad()
    def restore_best(self, model) -> Selection:
        """Put the best weights back into `model` (unless `keep_last`); the selection made."""
        last = self.selection.history[-1]["step"]
        if self.selection.keep_last:
            self.selection.kept_step = last
            return self.selection
        self.selection.kept_step = self.selection.best["step"]
        if self.selection.kept_step != last:
            parameters = dict(model.named_parameters())
            for name, value in self.best_weights.items():
                parameters[name].copy_(value.to(parameters[name].device))
        return self.selection
