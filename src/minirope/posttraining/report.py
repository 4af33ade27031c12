"""What a post-training run leaves behind: the folder (model or LoRA adapter, tokenizer, card, metrics, the run
summary with the measures before and after and the kept step, the run's effective settings: `settings`), the
before -> after line (`write_run`), and how the run's time was spent (`TimeSplit`: loading, the held-out measures,
the warm start, the method's own steps, writing the folder; one line, and `time_split` in `run_summary.json`)."""

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import MISSING, fields
from enum import Enum

from minirope.output.card import card_name, licence_of, model_card
from minirope.output.folder import finish_run
from minirope.posttraining.arguments import USER_SOURCES
from minirope.posttraining.keep_best import score_name
from minirope.posttraining.measures import METRIC
from minirope.posttraining.parsing import MERGED
from minirope.posttraining.reward_calls import reward_name
from minirope.posttraining.sampling import prompt_text
from minirope.training.precision import precision_name
from minirope.training.throughput import training_flops_per_token

PARTS = ("loading", "measures", "warm start", "method", "writing")


class TimeSplit:
    """Wall-clock seconds by part (`PARTS`), from `time.perf_counter`; `total` runs from construction."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.seconds = dict.fromkeys(PARTS, 0.0)

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        """Count the time of the `with` block to `name`; inside the method's steps, a measure's time moves from
        "method" to "measures" (`timed`)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start

    def timed(self, measure: Callable) -> Callable:
        """`measure`, its calls counted to "measures" and taken out of the "method" block that runs them."""

        def call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return measure(*args, **kwargs)
            finally:
                spent = time.perf_counter() - start
                self.seconds["measures"] += spent
                self.seconds["method"] -= spent

        return call

    def as_dict(self) -> dict[str, float]:
        """`{part: seconds}` (one decimal) and `total`."""
        return {**{name: round(value, 1) for name, value in self.seconds.items()},
                "total": round(time.perf_counter() - self.started, 1)}  # fmt: skip

    def line(self) -> str:
        """`time: 412 s; loading 9 s (2%), measures 96 s (23%), ...` (parts that took no time left out)."""
        split = self.as_dict()
        total = max(split.pop("total"), 1e-9)
        parts = ", ".join(f"{name} {value:.0f} s ({value / total:.0%})" for name, value in split.items() if value)
        return f"time: {total:.0f} s; {parts}"


def teacher_flops(trainer) -> float:
    """The teacher's compute in model FLOPs: a forward pass (a third of `training_flops_per_token`, PaLM counting) over
    every prompt and completion token the student trained on (TRL's `num_input_tokens_seen`), at the context of the
    sequences it scored: the mean prompt length of the training rows plus `--max_completion_length`, at most the
    teacher's `max_position_embeddings`."""
    teacher = trainer.teacher_model.config
    prompts = trainer.train_dataset["prompt"]
    tokens = [len(trainer.processing_class(prompt_text(p, trainer.processing_class))["input_ids"]) for p in prompts]
    length = min(round(sum(tokens) / len(tokens)) + trainer.args.max_completion_length, teacher.max_position_embeddings)
    return trainer.state.num_input_tokens_seen * training_flops_per_token(teacher, length) / 3


def write_run(trainer, setup, args, before, after, train_metrics: dict, selection, split) -> dict:
    """Write the folder (model, tokenizer, card, metrics, summary, samples) and print the before -> after line and
    how the run's time was spent (`split`, a `TimeSplit`; its "writing" part is this function's)."""
    config = trainer.args
    gained = selection.line(score_name([reward_name(reward) for reward in setup.rewards],
                                       config.reward_weights), args.advice)  # fmt: skip
    summary = run_summary(trainer, setup, args, before, after, train_metrics, selection, gained)
    eval_metrics = {f"before_{METRIC}": before.bits_per_byte, METRIC: after.bits_per_byte}
    eval_metrics = {key: value for key, value in eval_metrics.items() if value is not None}
    methods = (
        args.card_tag,
        "trl",
        *(["sft"] if setup.warm else []),
        *(["lora"] if setup.model_args.use_peft else []),
    )
    base = setup.model_args.model_name_or_path
    card = model_card(card_name(config), trainer.model.config, eval_metrics, setup.data.source,
                      how_trained(summary, setup, args, config, before, after), base_model=base, methods=methods,
                      adapter=setup.model_args.saves_adapter,
                      licence=licence_of(base, setup.model_args.model_revision))  # fmt: skip
    line = (f"{before.line()} -> {after.line()} in {summary['steps']} steps, {summary['train_seconds']:.0f} s; "
            f"written to {config.output_dir}/")  # fmt: skip
    summary["time_split"] = split.as_dict()  # up to the writing of the folder, which the returned summary adds
    print(f"[minirope] {split.line()}")
    with split.part("writing"):
        finish_run(trainer, train_metrics=train_metrics, eval_metrics=eval_metrics, card=card, summary=summary,
                   lines=[line, gained], command="minirope-posttrain", push_data=args.push_data)  # fmt: skip
    summary["time_split"] = split.as_dict()
    return summary


def run_summary(trainer, setup, args, before, after, train_metrics: dict, selection, gained: str) -> dict:
    """`run_summary.json`: what the run started from and did (method, data, rewards, flags, warm start, corpus term),
    the measures before and after, the kept step and the line saying what was gained."""
    config, warm = trainer.args, setup.warm
    return {
        "base_model": setup.model_args.model_name_or_path,
        "method": args.method,
        "data": setup.data.source,
        "task": setup.data.name,
        "recipe": {"path": args.recipe_path, "values": args.recipe} if args.recipe_path else None,
        "sized_defaults": args.sized,
        "settings": settings(args, config, setup.model_args),
        "stages": setup.stages,
        "training_data": setup.corpus.trained_on,
        "teacher": getattr(config, "teacher_model_name_or_path", None),
        "reward_funcs": [reward_name(reward) for reward in setup.rewards],
        "reward_weights": config.reward_weights,
        "rejected_by": args.rejected_by_used(setup.data),
        "training": setup.model_args.training(),
        "precision": precision_name(config),
        "steps": trainer.state.global_step,
        "learning_rate": config.learning_rate,
        "batch_size": config.per_device_train_batch_size,
        "gradient_accumulation_steps": config.gradient_accumulation_steps,
        "beta": getattr(config, "beta", None),
        "corpus_term": {"source": setup.corpus.source, "lm_coef": setup.corpus.coef if setup.corpus.shards else 0.0},
        "weight_interpolation": args.weight_interpolation,
        "warm_start": {
            "steps": warm.steps,
            "data": warm.source,
            "learning_rate": args.sft_learning_rate,
            "lora": setup.model_args.use_peft,
            "batch_size": args.sft_batch_size,
            "sft_config": args.sft_config,
            "lm_coef": setup.corpus.warm_coef if setup.corpus.shards else 0.0,
            "after": warm.measured.as_dict(),
        }
        if warm
        else None,  # fmt: skip
        "train_seconds": round(train_metrics.get("train_runtime", 0.0), 1),
        "tokens_seen": trainer.state.num_input_tokens_seen,
        "teacher_model_flops": teacher_flops(trainer) if setup.teacher is not None else 0,
        "before": before.as_dict(),
        "after": after.as_dict(),
        "kept": selection.as_dict(),
        "gained": gained,
        "samples": [{"before": b, "after": a} for b, a in zip(before.samples, after.samples, strict=True)],
    }


def how_trained(summary: dict, setup, args, config, before, after) -> str:
    """The model card's account of the run, from its `summary` (`run_summary`)."""
    warm = setup.warm
    what = args.trainer_line(summary)
    warmed = (
        f" after a warm start ({warm.steps} steps of TRL's SFTTrainer on {warm.source}, lr "
        f"{summary['warm_start']['learning_rate']}, corpus term weight {summary['warm_start']['lm_coef']}; then: "
        f"{warm.measured.line()})"
        if warm
        else ""
    )
    return (
        f"Post-trained from `{summary['base_model']}` with `minirope-posttrain` ({what}, {summary['training']})"
        f"{warmed} on {summary['data']}: {summary['steps']} steps, lr {config.learning_rate}, corpus term: "
        f"{setup.corpus.source} (weight {summary['corpus_term']['lm_coef']}), weight interpolation "
        f"{args.weight_interpolation}. Measured on {after.prompts} held-out prompts, before: {before.line()}; after: "
        f"{after.line()}. Held-out score measured every --eval_steps ({config.eval_steps}): {summary['gained']}."
    )


def trl_base(kind: type) -> type | None:
    """The TRL class `kind` extends (`ScriptArguments`, `GRPOConfig`, `ModelConfig`, ...), None for none."""
    return next((base for base in kind.__mro__ if base.__module__.startswith("trl.")), None)


def trl_default(base: type | None, name: str):
    """TRL's default for the flag `name` of `base`; `MISSING` where TRL has no such flag."""
    item = base.__dataclass_fields__.get(name) if base is not None else None
    if item is None:
        return MISSING
    return item.default_factory() if item.default_factory is not MISSING else item.default


def settings(args, config, model_args) -> dict[str, dict]:
    """Every flag of the run whose value differs from TRL's default for it, or that TRL's scripts lack and the run sets,
    with its value and where it came from: `command line`, `--config`, `recipe` (the task's), `sized` (for a
    released-size model), `method recipe` (`arguments.method_recipe`), `minirope` (a default of minirope's configs:
    `arguments`) or `TRL, from the others` (a value TRL's own config derives). Secrets (`--hub_token`, any flag whose
    name ends in `token`) are left out; counts of tokens (`--eval_max_new_tokens`) are not."""
    found = {}
    for parsed in (args, config, model_args):
        kind, base = type(parsed), trl_base(type(parsed))
        own = {
            name for cls in kind.__mro__[: kind.__mro__.index(base)] for name in vars(cls).get("__annotations__", {})
        }
        aliases = {alias.lstrip("-").replace("-", "_"): item.name
                   for item in fields(parsed) for alias in item.metadata.get("aliases", [])}  # fmt: skip
        named = {aliases.get(name, name) for name in args.command_line}
        given = {aliases.get(name, name) for name in args.given}
        for item in fields(parsed):
            value, default = getattr(parsed, item.name), trl_default(base, item.name)
            secret = item.name == "token" or item.name.endswith("_token")  # as TrainingArguments.to_dict masks them
            skip = secret or item.name in MERGED  # mappings: by key below
            if skip or value == default or (default is MISSING and value is None):
                continue
            command_line, config_file = USER_SOURCES
            source = (command_line if item.name in named else config_file if item.name in given
                      else "sized" if item.name in args.sized else "recipe" if item.name in args.recipe
                      else "method recipe" if item.name in args.method_recipe
                      else "minirope" if item.name in own else "TRL, from the others")  # fmt: skip
            found[item.name] = {"value": json_value(value), "source": source}
    if args.sft_config:  # a mapping whose keys come from several layers: each key's source
        sources = {key: args.sft_sources.get(key, "minirope") for key in args.sft_config}
        found["sft_config"] = {"value": json_value(args.sft_config), "source": "by key", "sources": sources}
    return found


def json_value(value):
    """`value` as JSON holds it: enums by their value, paths and other objects as text."""
    if isinstance(value, Enum):
        return value.value
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [json_value(item) for item in value]
    if isinstance(value, dict):
        return {str(key): json_value(item) for key, item in value.items()}
    return str(value)
