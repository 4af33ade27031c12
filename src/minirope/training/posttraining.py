"""Post-training wiring around TRL's trainers: the methods' configs with defaults measured on the bundled corpus, the
rewards by name, the prompts and preference pairs, the teacher's checks, the corpus loss mixed into the updates and
the interpolation of the tuned weights with the starting ones.

The training loops are TRL's (`GRPOTrainer`, `DPOTrainer`, `DistillationTrainer`); minirope adds two measures
against forgetting that post-training practice uses, both measured in docs/post_training.md:

- `--lm_coef c`: each update also takes `c` times the language-modelling loss of a batch of corpus blocks (the
  training plays), as InstructGPT's PPO-ptx mixes pretraining gradients into PPO (Ouyang et al. 2022, eq. 2).
- `--weight_interpolation a`: the saved weights are `start + a * (tuned - start)` (WiSE-FT, Wortsman et al. 2022):
  `a = 1` keeps the tuned model, smaller values trade part of the gain for less drift from the starting model.
"""

import importlib
import json
from dataclasses import dataclass, field
from itertools import cycle
from pathlib import Path

import torch
from datasets import Dataset
from transformers import PreTrainedTokenizerBase
from trl import DistillationConfig, DistillationTrainer, DPOConfig, DPOTrainer, GRPOConfig, GRPOTrainer

from minirope.rewards import REWARDS
from minirope.training.records import records
from minirope.training.verse import sample_completions, training_prompts

METHODS = ("grpo", "dpo", "distill")
PAIR_FIELDS = ("prompt", "chosen", "rejected")
PAIRS_FILE = "preference_pairs.jsonl"
LM_COEF = {"grpo": 0.2, "dpo": 0.3, "distill": 0.0}  # measured in docs/post_training.md
TRL_REWARDS = ("accuracy_reward", "reasoning_accuracy_reward", "think_format_reward")  # `trl grpo`'s registry


@dataclass
class PosttrainArguments:
    """What to post-train for, and on which prompts. The method's training flags are its TRL config's: its
    `--trust_remote_code` applies to the model and the teacher, and `DistillationConfig`'s
    `--teacher_model_name_or_path` names the teacher."""

    model_name_or_path: str = field(
        metadata={"help": "The model to post-train: a folder written by minirope, or a Hub id.", "aliases": ["--model"]}
    )
    method: str = field(metadata={"help": "grpo (reward), dpo (preference pairs) or distill (a teacher)."})
    reward_funcs: list[str] = field(
        default_factory=lambda: ["scansion_reward"],
        metadata={
            "help": "grpo, and dpo's own pairs: rewards by name (minirope's: scansion_reward, "
            "syllable_closeness_reward; TRL's: accuracy_reward, think_format_reward, ...) or import path "
            "(my_module.my_reward); the first ranks dpo's samples."
        },
    )
    train_file: str | None = field(
        default=None,
        metadata={
            "help": "dpo: a .jsonl/.json/.parquet file of {prompt, chosen, rejected} pairs (default: pairs built "
            "from the model's own samples). grpo/distill: a file of {prompt} rows (default: the training plays)."
        },
    )
    num_prompts: int = field(default=4096, metadata={"help": "Prompts drawn from the training plays."})
    samples_per_prompt: int = field(default=8, metadata={"help": "dpo: samples of each prompt ranked for a pair."})
    min_reward_margin: float = field(
        default=0.5,
        metadata={
            "help": "dpo's own pairs: keep a prompt's best and worst samples as a pair only when their rewards differ "
            "by at least this (with scansion_reward, 0.5 keeps a chosen with two of three lines that scan against a "
            "rejected with none)."
        },
    )
    lm_coef: float | None = field(
        default=None,
        metadata={
            "help": "Weight of the training plays' language-modelling loss added to each update (ptx); default "
            f"{', '.join(f'{method} {coef}' for method, coef in LM_COEF.items())} (docs/post_training.md)."
        },
    )
    lm_batch_size: int = field(default=4, metadata={"help": "Corpus blocks per update for --lm_coef."})
    weight_interpolation: float = field(
        default=1.0, metadata={"help": "Saved weights = start + a * (tuned - start), a in (0, 1] (WiSE-FT)."}
    )
    overwrite_output_dir: bool = field(
        default=False, metadata={"help": "Replace a model of another architecture in --output_dir."}
    )
    eval_prompts: int = field(default=16, metadata={"help": "Validation speaker headers sampled before and after."})
    eval_samples_per_prompt: int = field(default=16, metadata={"help": "Samples of each validation header."})
    eval_max_new_tokens: int = field(default=64, metadata={"help": "Tokens sampled for each measured completion."})

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"--method {self.method!r} is not one of {', '.join(METHODS)}.")
        for name in ("num_prompts", "samples_per_prompt", "lm_batch_size", "eval_prompts", "eval_samples_per_prompt",
                     "eval_max_new_tokens"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be >= 1, got {getattr(self, name)}.")
        if self.method == "dpo" and self.samples_per_prompt < 2 and not self.train_file:
            raise ValueError("--samples_per_prompt must be >= 2 to rank a pair: e.g. 8.")
        if self.lm_coef is None:
            self.lm_coef = LM_COEF[self.method]
        if self.lm_coef < 0:
            raise ValueError(f"--lm_coef must be >= 0, got {self.lm_coef}.")
        if not 0 < self.weight_interpolation <= 1:
            raise ValueError(f"--weight_interpolation must be in (0, 1], got {self.weight_interpolation}.")


@dataclass
class CpuDefaults:
    """Defaults every method's TRL config takes here: float32 (TRL defaults to bf16, emulated and slow on CPUs without
    AVX512_BF16; `--bf16 True` where it is fast), no checkpoints (runs of minutes), a log line every 10 steps, and no
    activation checkpointing (TRL's default; a model this small has nothing to save)."""

    bf16: bool | None = False
    save_strategy: str = "no"
    logging_steps: float = 10
    gradient_checkpointing: bool = False


# The methods' configs: learning rates, KL weights, steps and losses as measured in docs/post_training.md.
@dataclass
class PosttrainGRPOConfig(CpuDefaults, GRPOConfig):
    output_dir: str = "runs/minirope-grpo"
    learning_rate: float = 2e-4
    beta: float = 0.04
    num_generations: int | None = 8
    per_device_train_batch_size: int = 16
    max_completion_length: int | None = 48
    temperature: float = 0.8
    top_k: int = 50
    max_steps: int = 1000

    def __post_init__(self) -> None:
        if self.num_generations is not None and self.num_generations < 2:
            raise ValueError(
                f"--num_generations must be >= 2, got {self.num_generations}: GRPO scores each completion against the "
                f"other completions of its prompt (e.g. 8)."
            )
        super().__post_init__()


@dataclass
class PosttrainDPOConfig(CpuDefaults, DPOConfig):
    output_dir: str = "runs/minirope-dpo"
    learning_rate: float = 1e-4
    beta: float = 0.1
    # DPO's loss plus the chosen completions' negative log-likelihood (RPO, Pang et al. 2024), summed.
    loss_type: list[str] = field(default_factory=lambda: ["sigmoid", "sft"])
    per_device_train_batch_size: int = 8
    num_train_epochs: float = 2.0
    max_length: int | None = 128


@dataclass
class PosttrainDistillationConfig(CpuDefaults, DistillationConfig):
    output_dir: str = "runs/minirope-distill"
    learning_rate: float = 5e-4
    beta: float = 0.0  # forward KL: the teacher's whole distribution at every sampled position
    per_device_train_batch_size: int = 16
    max_completion_length: int | None = 64
    temperature: float = 1.0
    max_steps: int = 200


CONFIGS = {"grpo": PosttrainGRPOConfig, "dpo": PosttrainDPOConfig, "distill": PosttrainDistillationConfig}


def resolve_reward(name: str):
    """A reward function by name: minirope's (`minirope.rewards.REWARDS`), TRL's registry (`trl.rewards`), or a
    dotted import path, as TRL's own `trl grpo --reward_funcs` resolves them.

    Raises:
        ValueError: no reward has that name, or the path does not import (naming the known names).
    """
    if name in REWARDS:
        return REWARDS[name]
    if name in TRL_REWARDS:
        import trl.rewards

        return getattr(trl.rewards, name)
    module_name, _, attribute = name.rpartition(".")
    try:
        reward = getattr(importlib.import_module(module_name), attribute, None) if module_name else None
    except ImportError:
        reward = None
    if not callable(reward):
        known = [*REWARDS, *TRL_REWARDS]
        raise ValueError(
            f"--reward_funcs {name!r} is not a reward: give one of {', '.join(known)} or an import path "
            f"(my_module.my_reward) of a function (completions, **kwargs) -> list[float]."
        )
    return reward


def check_rewards(rewards: list, completions: list[str]) -> None:
    """Call each reward on real completions before training, as TRL will.

    Raises:
        ValueError: a reward that fails, or returns other than one number (or None, TRL's "not applicable") per
            completion, naming it.
    """
    for reward in rewards:
        name = getattr(reward, "__name__", repr(reward))
        try:
            values = reward(completions=completions, completion_ids=[[] for _ in completions])
        except Exception as error:  # a user's function: any failure is reported as its own
            raise ValueError(f"reward {name} failed on the model's samples: {type(error).__name__}: {error}") from None
        numbers = isinstance(values, list | tuple) and len(values) == len(completions)
        if not numbers or not all(value is None or isinstance(value, int | float) for value in values):
            raise ValueError(
                f"reward {name} returned {str(values)[:80]} for {len(completions)} completions: a reward must "
                f"return a list of one number (float) per completion."
            )


def text_rows(path: str, fields: tuple[str, ...], form: str) -> list[dict]:
    """The `fields` of every record of a `.jsonl`/`.json`/`.parquet` file, each a text; `form` names the format in
    the errors.

    Raises:
        ValueError, OSError: an unreadable file, no rows, or a row without one of the texts (naming its place).
    """
    rows = []
    for where, row in records(path):
        missing = [name for name in fields if not isinstance(row, dict) or not isinstance(row.get(name), str)]
        if missing:
            raise ValueError(f"{where} has no {missing[0]!r} text: give {{{', '.join(fields)}}} rows ({form}).")
        rows.append({name: row[name] for name in fields})
    if not rows:
        raise ValueError(f"--train_file {path} holds no rows: write {{{', '.join(fields)}}} rows ({form}).")
    return rows


def read_pairs(path: str) -> Dataset:
    """A preference file's `{prompt, chosen, rejected}` rows (TRL's standard preference format; see `text_rows`)."""
    return Dataset.from_list(text_rows(path, PAIR_FIELDS, "TRL's preference format"))


def read_prompts(path: str) -> list[str]:
    """A file's `prompt` texts (TRL's prompt-only format; see `text_rows`)."""
    return [row["prompt"] for row in text_rows(path, ("prompt",), "TRL's prompt-only format")]


def own_pairs(
    model, tokenizer, prompts: list[str], per_prompt: int, reward, seed: int, max_new_tokens: int, margin: float = 0.0
) -> list[dict]:
    """Preference pairs from the model's own samples: for each prompt, `per_prompt` completions of `max_new_tokens`
    sampled (`minirope.training.verse.SAMPLING`) and ranked by `reward`; the best is chosen and the worst rejected,
    where the best scores higher, by at least `margin`."""
    pairs = []
    samples = sample_completions(model, tokenizer, prompts, per_prompt, max_new_tokens, seed)
    for prompt, completions in zip(prompts, samples, strict=True):
        scores = reward(completions=completions, prompts=[prompt] * len(completions))
        best, worst = max(range(len(scores)), key=scores.__getitem__), min(range(len(scores)), key=scores.__getitem__)
        if scores[best] > scores[worst] and scores[best] - scores[worst] >= margin:
            pairs.append({"prompt": prompt, "chosen": completions[best], "rejected": completions[worst]})
    return pairs


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as file:
        file.writelines(json.dumps(row) + "\n" for row in rows)


def check_teacher(student_tokenizer: PreTrainedTokenizerBase, teacher_tokenizer: PreTrainedTokenizerBase) -> None:
    """TRL's distillation compares the two models' next-token distributions token by token.

    Raises:
        ValueError: the teacher's vocabulary differs from the student's.
    """
    if student_tokenizer.get_vocab() != teacher_tokenizer.get_vocab():
        raise ValueError(
            f"the teacher's tokenizer ({len(teacher_tokenizer)} tokens) is not the student's ({len(student_tokenizer)}"
            f" tokens): distillation needs one vocabulary; give a teacher trained with the student's tokenizer."
        )


class CorpusLoss:
    """A trainer mixin: each training loss gains `lm_coef` times the language-modelling loss of `lm_batch_size`
    corpus blocks, drawn in turn from `blocks` (`(N, T)` int64)."""

    def set_corpus(self, blocks: torch.Tensor, lm_coef: float, lm_batch_size: int) -> None:
        self.lm_coef = lm_coef
        self.corpus_batches = cycle(blocks.split(lm_batch_size))

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if getattr(self, "lm_coef", 0.0) and model.training:
            batch = next(self.corpus_batches).to(self.accelerator.device)
            lm_loss = model(input_ids=batch, labels=batch).loss
            if return_outputs:
                return loss[0] + self.lm_coef * lm_loss, loss[1]
            loss = loss + self.lm_coef * lm_loss
        return loss


class MiniRopeGRPOTrainer(CorpusLoss, GRPOTrainer):
    """TRL's `GRPOTrainer`, with the corpus loss of `CorpusLoss`."""


class MiniRopeDPOTrainer(CorpusLoss, DPOTrainer):
    """TRL's `DPOTrainer`, with the corpus loss of `CorpusLoss`."""


class MiniRopeDistillationTrainer(CorpusLoss, DistillationTrainer):
    """TRL's `DistillationTrainer`, with the corpus loss of `CorpusLoss`."""


TRAINERS = {"grpo": MiniRopeGRPOTrainer, "dpo": MiniRopeDPOTrainer, "distill": MiniRopeDistillationTrainer}


@torch.no_grad()
def interpolate_weights(model, start: dict[str, torch.Tensor], weight: float) -> None:
    """Set each parameter to `start + weight * (tuned - start)` in place (WiSE-FT); `weight == 1` leaves it."""
    if weight == 1:
        return
    for name, param in model.named_parameters():
        param.copy_(start[name] + weight * (param - start[name]))


def prompt_dataset(args: PosttrainArguments, seed: int) -> Dataset:
    """GRPO's and distillation's `{prompt}` rows: `--train_file`'s, or `--num_prompts` from the training plays."""
    prompts = read_prompts(args.train_file) if args.train_file else training_prompts(args.num_prompts, seed)
    return Dataset.from_dict({"prompt": prompts})
