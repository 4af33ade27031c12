"""What a post-training run bought and what it cost, measured the same way before and after.

On the held-out prompts (never trained on; `minirope.posttraining.data`):

- each reward's mean over one **greedy** completion per prompt (for a task with one right answer, the exact-match
  accuracy) and over `--num_generations_eval` **sampled** ones of the first `--eval_sampled_prompts` prompts
  (temperature 0.8, top_k 50, the run's seed, whatever the folder's generation config says; each prompt read once for
  all its samples: `shared_prefill`), the rewards called as TRL calls them (`call_reward`), `None` values left out;
- the share of distinct sampled completions (a policy that collapses onto one answer shows here);
- bits per byte of the validation text, when there is one (`--lm_validation_file`, or the bundled validation plays
  for a model trained on them), each document tokenized whole, as `minirope-pretrain` reports it;
- the task's own measures of the sampled completions (`Task.measure`), saved under their own names.
"""

import tempfile
from dataclasses import asdict, dataclass, field

from datasets import Dataset
from transformers import TrainingArguments

from minirope.data.documents import Shard
from minirope.data.pipeline import validation_windows
from minirope.posttraining.reward_calls import call_reward, completion_text, reward_name, weighted_reward
from minirope.posttraining.sampling import GREEDY, SAMPLING, Samples, sample
from minirope.training.precision import precision_name
from minirope.training.trainer import MiniRopeTrainer

METRIC = "eval_bits_per_byte"
RUN_STATE = ("bf16", "fp16", "use_cpu")  # what accelerate holds once per process
SIGNAL_SAMPLES = 8  # fewer samples of a prompt score alike by chance on a task the model sometimes gets right


def group_values(rewards: list, samples: Samples) -> dict[str, list[list[float | None]]]:
    """Each reward's values, one list per prompt (its completions'), each reward called on one prompt's completions
    at a time (`Samples.group`), as GRPO calls it on a group and the pairs rank one: a reward that scores a completion
    against the others it is called with (word variety) reads the same scale here as in training, whatever the number
    of prompts measured."""
    groups = [samples.group(index) for index in range(len(samples.prompt_rows))]
    return {reward_name(reward): [call_reward(reward, *group) for group in groups] for reward in rewards}


def reward_means(rewards: list, samples: Samples) -> dict[str, float | None]:
    """Each reward's mean over `samples` (`group_values`), `None` values (TRL's "does not apply") left out; None if
    all are."""
    return {name: means(groups) for name, groups in group_values(rewards, samples).items()}


def means(groups: list[list[float | None]]) -> float | None:
    values = [value for group in groups for value in group if value is not None]
    return sum(values) / len(values) if values else None


def alike_values(values: dict[str, list[list[float | None]]], weights: list[float] | None) -> list[float | None]:
    """For each prompt, the weighted sum of the rewards (None counts 0) that all its completions score, as GRPO sums
    them, or None where they differ."""
    alike = []
    for groups in zip(*values.values(), strict=True):
        sums = {round(weighted_reward([group[k] for group in groups], weights), 9) for k in range(len(groups[0]))}
        alike.append(sums.pop() if len(sums) == 1 else None)
    return alike


def alike_share(values: dict[str, list[list[float | None]]], weights: list[float] | None) -> float | None:
    """The share of prompts whose completions all score alike by the weighted sum of the rewards (`alike_values`):
    groups that give GRPO's advantage nothing to learn from (TRL logs it as `frac_reward_zero_std`). None without
    rewards or prompts."""
    alike = alike_values(values, weights) if values else []
    return sum(value is not None for value in alike) / len(alike) if alike else None


def solved_share(values: dict[str, list[list[float | None]]], weights: list[float] | None) -> float | None:
    """The share of prompts whose completions all score full credit: every reward 1 (a right answer, as TRL's
    accuracy rewards score it), weighted (the sum of the positive `weights`). These are alike too, but solved, not
    failing: no warm start is for them. None without rewards or prompts."""
    if not values:
        return None
    weights = weights if weights is not None else [1.0] * len(values)
    full = sum(weight for weight in weights if weight > 0)
    alike = alike_values(values, weights)
    return sum(value is not None and value >= full - 1e-9 for value in alike) / len(alike) if alike else None


def bits_per_byte(model, tokenizer, shards: list[Shard], run: TrainingArguments | None = None) -> float:
    """Whole-text bits per byte of `shards`, each document in windows of the model's context
    (`minirope.training.metrics`), as `minirope-pretrain` reports it. Writes nothing.

    The evaluation takes the precision and device (`bf16`, `fp16`, `use_cpu`) of `run`, the method's TRL config
    (None: float32 on the default device): accelerate keeps one of each per process and every `TrainingArguments`
    resets them, so a float32 evaluation between a run's config and its bf16 trainer leaves that trainer unable to
    start (accelerate's "AcceleratorState has already been initialized")."""
    windows = validation_windows(shards, tokenizer, model.config.max_position_embeddings)
    same = {name: getattr(run, name) for name in RUN_STATE} if run is not None else {}
    with tempfile.TemporaryDirectory() as scratch:
        args = TrainingArguments(output_dir=scratch, per_device_eval_batch_size=32, report_to="none", **same)
        trainer = MiniRopeTrainer(model=model, args=args, processing_class=tokenizer, eval_dataset=windows)
        return trainer.evaluate()[METRIC]


@dataclass
class TaskMeasure:
    """One side (before or after) of a run's measures; see the module doc."""

    prompts: int  # measured greedy
    sampled_prompts: int  # the first of them, sampled `samples_per_prompt` times
    greedy: dict[str, float | None]
    sampled: dict[str, float | None]
    distinct_share: float
    bits_per_byte: float | None
    task_measures: dict = field(default_factory=dict)  # the task's own (`Task.measure`), by name
    task_line: str = ""  # ... in a few words
    samples: list[dict] = field(default_factory=list)
    alike_share: float | None = None  # prompts whose sampled completions all score alike (`alike_share`)
    solved_share: float | None = None  # ... all at full credit (`solved_share`): a part of `alike_share`
    cut_share: float | None = None  # sampled completions cut at the token limit before they ended (`Samples`)
    max_new_tokens: int | None = None  # the limit
    precision: str = "float32"  # the completions', the run's (`sample`)
    samples_per_prompt: int | None = None  # of each sampled prompt (`--num_generations_eval`)

    @property
    def failing_share(self) -> float | None:
        """Prompts whose samples all score alike below full credit: where GRPO has nothing to learn and the model
        does not yet answer."""
        return None if self.alike_share is None else self.alike_share - (self.solved_share or 0.0)

    def as_dict(self) -> dict:
        return {
            "prompts": self.prompts,
            "sampled_prompts": self.sampled_prompts,
            "rewards_greedy": self.greedy,
            "rewards_sampled": self.sampled,
            "distinct_completions_share": self.distinct_share,
            "validation_bits_per_byte": self.bits_per_byte,
            "prompts_with_alike_samples_share": self.alike_share,
            "prompts_solved_by_every_sample_share": self.solved_share,
            "sampled_cut_at_token_limit_share": self.cut_share,
            "precision": self.precision,
            **self.task_measures,
        }

    def line(self) -> str:
        """The measures in a few words, for the run's printed lines."""
        number = lambda value: "n/a" if value is None else f"{value:.3f}"  # noqa: E731
        parts = [f"{name} {number(value)} greedy, {number(self.sampled[name])} sampled"
                 for name, value in self.greedy.items()]  # fmt: skip
        parts.append(f"{self.distinct_share:.1%} distinct")
        if self.cut_share:
            parts.append(f"{self.cut_share:.0%} cut at {self.max_new_tokens} tokens")
        if self.task_line:
            parts.append(self.task_line)
        if self.bits_per_byte is not None:
            parts.append(f"validation {self.bits_per_byte:.4f} bits/byte")
        return ", ".join(parts)


def task_measures(task_measure, texts: list[str]) -> dict:
    """`TaskMeasure`'s `task_measures` and `task_line` from a task's measure (a dataclass with a `line()`)."""
    if task_measure is None:
        return {}
    measured = task_measure(texts)
    return {"task_measures": asdict(measured), "task_line": measured.line()}


def measure_task(model, tokenizer, held_out: Dataset, rewards: list, args, config, text: list[Shard] | None,
                 task_measure=None) -> TaskMeasure:  # fmt: skip
    """The measures of `model` on the `held_out` prompts (see the module doc); `args` gives
    `eval_sampled_prompts` and `eval_max_new_tokens`, the method's TRL `config` `num_generations_eval`, the seed and the
    precision and
    device of the bits per byte, `text` the validation text (None: not measured), `task_measure` the task's own
    measure of the sampled texts (`Task.measure`; None: none)."""
    tokens, seed = args.eval_max_new_tokens, config.seed
    greedy = sample(model, tokenizer, held_out, 1, tokens, seed, GREEDY, config)
    sampled_rows = held_out.select(range(min(len(held_out), args.eval_sampled_prompts or len(held_out))))
    sampled = sample(model, tokenizer, sampled_rows, config.num_generations_eval, tokens, seed, SAMPLING, config)
    texts = [completion_text(completion) for completion in sampled.completions]
    per_prompt = sampled.per_prompt
    examples = [
        {
            "prompt": row["prompt"],
            "greedy": completion_text(greedy.completions[index]),
            "sampled": texts[index * per_prompt] if index < len(sampled_rows) else None,
        }
        for index, row in enumerate(held_out.to_list()[:16])
    ]
    values = group_values(rewards, sampled)
    return TaskMeasure(
        prompts=len(held_out),
        sampled_prompts=len(sampled_rows),
        greedy=reward_means(rewards, greedy),
        sampled={name: means(groups) for name, groups in values.items()},
        distinct_share=len(set(texts)) / max(1, len(texts)),
        bits_per_byte=bits_per_byte(model, tokenizer, text, config) if text else None,
        **task_measures(task_measure, texts),
        samples=examples,
        alike_share=alike_share(values, getattr(config, "reward_weights", None)) if per_prompt > 1 else None,
        solved_share=solved_share(values, getattr(config, "reward_weights", None)) if per_prompt > 1 else None,
        cut_share=sampled.cut_share,
        max_new_tokens=tokens,
        precision=precision_name(config),
        samples_per_prompt=per_prompt,
    )
