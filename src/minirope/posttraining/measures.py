"""What a post-training run bought and what it cost, measured the same way before and after.

On the held-out prompts (never trained on; `minirope.posttraining.data`):

- each reward's mean over one **greedy** completion per prompt (for a task with one right answer, the exact-match
  accuracy) and over `--eval_samples_per_prompt` **sampled** ones of the first `--eval_sampled_prompts` prompts
  (temperature 0.8, top_k 50, the run's seed, whatever the folder's generation config says; each prompt read once for
  all its samples: `shared_prefill`), the rewards called as TRL calls them (`call_reward`), `None` values left out;
- the share of distinct sampled completions (a policy that collapses onto one answer shows here);
- bits per byte of the validation text, when there is one (`--lm_validation_file`, or the bundled validation plays
  for a model trained on them), each document tokenized whole, as `minirope-pretrain` reports it;
- the task's own measures of the sampled completions (`Task.measure`), saved under their own names.
"""

import functools
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TypeVar

import torch
from accelerate import PartialState
from accelerate.utils import broadcast_object_list
from datasets import Dataset
from transformers import PreTrainedTokenizerBase, TrainingArguments
from transformers.cache_utils import DynamicCache
from trl.data_utils import is_conversational

from minirope.compat_minirope import cache_keyword
from minirope.data.documents import Shard
from minirope.data.pipeline import validation_windows
from minirope.posttraining.reward_calls import call_reward, completion_text, reward_name, weighted_reward
from minirope.posttraining.rollouts import merged_adapter
from minirope.training.precision import precision_name, run_autocast
from minirope.training.trainer import MiniRopeTrainer

SAMPLING = {"do_sample": True, "temperature": 0.8, "top_k": 50, "top_p": 1.0}
GREEDY = {"do_sample": False, "temperature": None, "top_k": None, "top_p": None}
METRIC = "eval_bits_per_byte"
RUN_STATE = ("bf16", "fp16", "use_cpu")  # what accelerate holds once per process
T = TypeVar("T")
SIGNAL_SAMPLES = 8  # fewer samples of a prompt score alike by chance on a task the model sometimes gets right


@dataclass
class Samples:
    """Completions of prompts: `per_prompt` of each of `prompt_rows`, in order (`completions[i * per_prompt + k]`
    answers `prompt_rows[i]`); `rows` repeats each row once per completion, as TRL hands rows to its rewards."""

    prompt_rows: list[dict]
    per_prompt: int
    completions: list
    completion_ids: list[list[int]]
    ended: list[bool] = field(default_factory=list)  # each completion's: ended by its own end-of-sequence token

    @property
    def cut_share(self) -> float | None:
        """The share of completions cut at the token limit before they ended: replies a reward reads unfinished."""
        return 1 - sum(self.ended) / len(self.ended) if self.ended else None

    @property
    def rows(self) -> Dataset:
        return Dataset.from_list([row for row in self.prompt_rows for _ in range(self.per_prompt)])

    def group(self, index: int) -> tuple[Dataset, list, list[list[int]]]:
        """Prompt `index`'s share, as `rows`, `completions` and `completion_ids` give all prompts': its row once per
        completion, its completions and their token ids."""
        span = slice(index * self.per_prompt, (index + 1) * self.per_prompt)
        rows = Dataset.from_list([self.prompt_rows[index]] * self.per_prompt)
        return rows, self.completions[span], self.completion_ids[span]


def prompt_text(prompt, tokenizer: PreTrainedTokenizerBase) -> str:
    """A prompt as the model reads it: plain text as it is, a conversation through the chat template with the
    assistant's turn opened (as TRL renders conversational prompts)."""
    if isinstance(prompt, str):
        return prompt
    return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)


def on_main_process(work: Callable[..., T]) -> Callable[..., T]:
    """`work` run on the main process, its result sent to every process (`accelerate.utils.broadcast_object_list`);
    run in place with one process. `work` must not wait on the other processes (no collective inside it)."""

    @functools.wraps(work)
    def shared(*args, **kwargs) -> T:
        state = PartialState()
        if state.num_processes == 1:
            return work(*args, **kwargs)
        result = [work(*args, **kwargs) if state.is_main_process else None]
        broadcast_object_list(result, from_process=0)
        return result[0]

    return shared


def shared_prefill(model, inputs: dict, per_prompt: int) -> dict:
    """`generate()`'s inputs for `per_prompt` completions of each of a batch of left-padded prompts, each prompt read
    once: its tokens but the last go through the model into a `DynamicCache` (positions from the attention mask, as
    `generate()` counts them), the cache is repeated `per_prompt` times (`Cache.batch_repeat_interleave`) and
    `generate()` continues from it: the prompts' prefill costs `1 / per_prompt` of `num_return_sequences`'s, and the
    tokens are the same (transformers' prompt reuse, "Re-use cache to continue generation"; SmolLM2-135M-Instruct,
    32 prompts sampled 8 times: 53.7 -> 36.8 s on a 2-core Zen 3, every token equal).

    `inputs`: the tokenizer's `input_ids` and `attention_mask`, `(B, T)`; returns them `(B * per_prompt, T)`, row `i`
    of the batch repeated at rows `i * per_prompt ... (i + 1) * per_prompt - 1` (as `num_return_sequences` orders
    them), with the cache under transformers' keyword for it (`cache_keyword`). With one completion a prompt, or
    one-token prompts, the inputs with `num_return_sequences` as they are."""
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    if per_prompt == 1 or ids.shape[1] < 2:
        return {**inputs, "num_return_sequences": per_prompt}
    cache = DynamicCache(config=model.config)
    positions = (mask[:, :-1].cumsum(-1) - 1).clamp(min=0)
    model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], position_ids=positions, use_cache=True, logits_to_keep=1,
          **cache_keyword(cache))  # fmt: skip
    cache.batch_repeat_interleave(per_prompt)
    repeated = {"input_ids": ids, "attention_mask": mask}
    return {**{name: tensor.repeat_interleave(per_prompt, dim=0) for name, tensor in repeated.items()},
            **cache_keyword(cache)}  # fmt: skip


def end_of_sequence_ids(model, tokenizer) -> set[int]:
    """The tokens that end a completion: the generation config's `eos_token_id` (one or a list, as TRL reads them)
    and the tokenizer's."""
    configured = model.generation_config.eos_token_id
    configured = configured if isinstance(configured, list) else [configured]
    return {token for token in [*configured, tokenizer.eos_token_id] if token is not None}


@on_main_process
@torch.no_grad()
def sample(
    model,
    tokenizer,
    rows: Dataset,
    per_prompt: int,
    max_new_tokens: int,
    seed: int,
    settings: dict,
    run=None,
    batch: int = 256,
) -> Samples:
    """`per_prompt` completions of each row's `prompt` with `generate()` and `settings` (`SAMPLING` or `GREEDY`),
    seeded, in the precision the run trains in (`run`: the method's TRL config, whose bf16 or fp16 applies under
    autocast as in its trainer's forward; None: float32; `run_autocast`); prompts go left-padded, as many at a time
    as make at most `batch` sequences, each read once for all its completions (`shared_prefill`). A completion ends
    at its first end-of-sequence token, which its token ids keep and its text (decoded without special tokens) does
    not; conversational prompts get conversational completions (`[{"role": "assistant", "content": text}]`): all as
    TRL's `GRPOTrainer` gives them to rewards. On a CPU with native bf16 products (2-core Zen 5), a bf16 run's
    measures take 0.5-0.75x float32's time on SmolLM2 (docs/posttrain_speed.md).

    A LoRA model samples on its merged adapter (`merged_adapter`). On several processes (DDP: `accelerate launch`,
    torchrun) the main process samples and every process gets its samples (`on_main_process`): every process scores
    the same completions and takes the same decisions from them, and the sampling is not repeated on each."""
    model.eval()
    torch.manual_seed(seed)
    prompt_rows = rows.to_list()
    with merged_adapter(model), run_autocast(run, model.device.type):
        ids, ended = completion_ids(model, tokenizer, prompt_rows, per_prompt, max_new_tokens, settings, batch)
    texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
    conversational = bool(prompt_rows) and is_conversational(prompt_rows[0])
    completions = [[{"role": "assistant", "content": text}] for text in texts] if conversational else texts
    return Samples(prompt_rows, per_prompt, completions, ids, ended)


def completion_ids(
    model, tokenizer, prompt_rows: list[dict], per_prompt: int, max_new_tokens: int, settings: dict, batch: int
) -> tuple[list[list[int]], list[bool]]:
    """`sample`'s token ids, each completion's up to and including its first end-of-sequence token, and
    whether it has one (False: cut at `max_new_tokens`)."""
    eos = end_of_sequence_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    ids, ended = [], []
    try:
        step = max(1, batch // per_prompt)
        for first in range(0, len(prompt_rows), step):
            prompts = [prompt_text(row["prompt"], tokenizer) for row in prompt_rows[first : first + step]]
            inputs = tokenizer(prompts, return_tensors="pt", padding=True).to(model.device)
            out = model.generate(**shared_prefill(model, inputs, per_prompt), **settings, max_new_tokens=max_new_tokens,
                                 pad_token_id=pad)  # fmt: skip
            for row in out[:, inputs["input_ids"].shape[1] :].tolist():
                end = next((place for place, token in enumerate(row) if token in eos), None)
                ids.append(row if end is None else row[: end + 1])
                ended.append(end is not None)
    finally:
        tokenizer.padding_side = side
    return ids, ended


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
    sampled_prompts: int  # the first of them, sampled `--eval_samples_per_prompt` times
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
    `eval_samples_per_prompt` and `eval_max_new_tokens`, the method's TRL `config` the seed and the precision and
    device of the bits per byte, `text` the validation text (None: not measured), `task_measure` the task's own
    measure of the sampled texts (`Task.measure`; None: none)."""
    tokens, seed = args.eval_max_new_tokens, config.seed
    greedy = sample(model, tokenizer, held_out, 1, tokens, seed, GREEDY, config)
    sampled_rows = held_out.select(range(min(len(held_out), args.eval_sampled_prompts or len(held_out))))
    sampled = sample(model, tokenizer, sampled_rows, args.eval_samples_per_prompt, tokens, seed, SAMPLING, config)
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
    )
