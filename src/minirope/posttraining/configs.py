"""The TRL configs of `minirope-posttrain`: each method's (`GRPOConfig`, `DPOConfig`, `DistillationConfig`) with the
defaults a run on a CPU needs (`CpuDefaults`: precision, device, checkpoints, logging), and `PosttrainModelConfig`
(TRL's `ModelConfig`: the model, its dtype and attention, LoRA). The measured defaults are the method recipes'
(`arguments.method_recipe`); each method's script names its three dataclasses (`ARGUMENTS`).
"""

import json
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from trl import DistillationConfig, DPOConfig, GRPOConfig, ModelConfig, SFTConfig

from minirope.output.hub import TokenNotSaved
from minirope.training.arguments import LORA_TARGETS, retuned
from minirope.training.precision import decide_bf16
from minirope.training.sizing import CHECKPOINTING


@dataclass
class PosttrainModelConfig(ModelConfig):
    """The model to post-train, as TRL's `ModelConfig` names it (`--model_name_or_path`, `--model_revision`, `--dtype`,
    `--attn_implementation`, `--use_peft` and the `--lora_*` flags, with TRL's help), LoRA on every projection by
    default, and `--merge_lora`, as `minirope-finetune` saves an adapter."""

    model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "The model to post-train: a folder written by minirope, or a Hub id.",
            "aliases": ["--model"],
        },
    )
    model_revision: str = field(
        default="main",
        metadata={"help": "With a Hub id: the branch, tag or commit to load.", "aliases": ["--revision"]},
    )
    lora_target_modules: list[str] | None = retuned(ModelConfig, "lora_target_modules", list(LORA_TARGETS))
    merge_lora: bool = field(
        default=True,
        metadata={
            "help": "With --use_peft: merge the trained adapter into the saved weights (a plain model folder); "
            "--merge_lora False saves the adapter alone (peft's adapter folder, loading the base model from "
            "--model_name_or_path)."
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.model_name_or_path:
            raise ValueError("--model_name_or_path is required: the folder (or Hub id) of the model to post-train.")
        if self.load_in_4bit or self.load_in_8bit:
            raise ValueError("--load_in_4bit/--load_in_8bit (bitsandbytes QLoRA) are not supported by "
                             "minirope-posttrain: drop the flag (--use_peft trains a LoRA adapter on the "
                             "full-precision model; minirope-export quantizes the result).")  # fmt: skip
        if self.lora_task_type != "CAUSAL_LM":
            raise ValueError(f"--lora_task_type {self.lora_task_type}: post-training trains a causal LM's adapter; "
                             f"drop the flag (CAUSAL_LM).")  # fmt: skip
        if self.use_peft and (self.lora_r < 1 or not self.lora_alpha > 0 or not 0 <= self.lora_dropout < 1):
            raise ValueError(f"LoRA needs --lora_r >= 1, --lora_alpha > 0 and --lora_dropout in [0, 1), got "
                             f"{self.lora_r}, {self.lora_alpha} and {self.lora_dropout}.")  # fmt: skip

    def training(self) -> str:
        """How the weights were trained, for the summary and the card: `full`, `LoRA r=8 (merged)` or `LoRA r=8
        adapter`."""
        if not self.use_peft:
            return "full"
        return f"LoRA r={self.lora_r}, alpha {self.lora_alpha}" + (" (merged)" if self.merge_lora else " adapter")

    @property
    def saves_adapter(self) -> bool:
        """`--use_peft --merge_lora False`: the folder holds the LoRA adapter alone."""
        return self.use_peft and not self.merge_lora

    def init_kwargs(self) -> dict:
        """`from_pretrained`'s keyword arguments for the model and the teacher besides the revision: the dtype and
        the attention implementation, as `trl/scripts/grpo.py` builds them (TRL gives its reference model the
        model's own)."""
        dtype = self.dtype if self.dtype in (None, "auto") else getattr(torch, self.dtype)
        kwargs = {"dtype": dtype, "attn_implementation": self.attn_implementation}
        return {key: value for key, value in kwargs.items() if value is not None}


# Why post-training stays in float32 on a CPU whose bf16 matmuls are faster (2-core Zen 5 with AVX512_BF16, 2026-11-30;
# docs/studies/user_tasks.md, "bf16 or float32 on a CPU"): SmolLM2-135M with LoRA on docs/pretrained.md's
# largest-of-three task gained +18.5/+22.0/+7.0 points in bf16 on seeds 1-3 against float32's +38.0/+25.5/+39.5
# (float32 logits or float32 LoRA sums did not close it); 0.42M models' `reverse` and `max` tasks gained as much or
# less in bf16 (69.0 and 90.3 % against 71.0 and 90.3 %), in more time.
POSTTRAINING_FLOAT32 = "GRPO learned less in bf16, or no more in more time (docs/studies/user_tasks.md)"


@dataclass
class CpuDefaults(TokenNotSaved):
    """Defaults every method's TRL config takes here: float32 on a CPU (`POSTTRAINING_FLOAT32`: bf16 learned less,
    even where its matmuls run faster; the line `precision_line` holds gives their measured speed), bf16 on a GPU
    that supports it (`decide_bf16`; TRL's own default is bf16 everywhere, emulated and slow on CPUs without
    AVX512_BF16; on an H200 it needs cuDNN's attention off: `minirope.training.precision.avoid_cudnn_attention`), no
    checkpoints (runs of minutes), a log line every 10 steps, no activation checkpointing (a model this small has
    nothing to save), and with `--push_to_hub` one push of the finished folder (`--hub_strategy end`); on a machine
    without an accelerator, `use_cpu` (so that several CPU processes are one distributed run, as
    `minirope-pretrain`'s)."""

    bf16: bool | None = field(
        default=None,
        metadata={
            "help": "bf16 mixed precision for the method, the warm start and the measures. Default: on a GPU that "
            "supports it; float32 on a CPU, where GRPO learned less in bf16 (or no more, slower) even where its "
            "matmuls run faster, so nothing is timed there (docs/studies/user_tasks.md)."
        },
    )
    use_cpu: bool | None = field(
        default=None,
        metadata={
            "help": "Train on the CPU. Default: only where there is no GPU or accelerator (as minirope-pretrain; "
            "accelerate then spreads a torchrun or `accelerate launch` run over CPU processes, gloo)."
        },
    )
    save_strategy: str = retuned(GRPOConfig, "save_strategy", "no")
    logging_steps: float = retuned(GRPOConfig, "logging_steps", 10)
    # transformers 5.24 renamed it (`CHECKPOINTING`), and warns when the old name is set (TRL sets True)
    if CHECKPOINTING == "activation_checkpointing":
        activation_checkpointing: bool | None = retuned(GRPOConfig, "activation_checkpointing", False)
        gradient_checkpointing: bool | None = retuned(GRPOConfig, "gradient_checkpointing", None)
    else:
        gradient_checkpointing: bool = retuned(GRPOConfig, "gradient_checkpointing", False)
    hub_strategy: str = retuned(GRPOConfig, "hub_strategy", "end")
    eval_steps: float | None = field(
        default=None,
        metadata={
            "help": "How often the held-out score (the rewards' weighted sum, greedy, on the held-out prompts) is "
            "measured during training: every this many steps, or below 1 this share of the run (0.2: five times, "
            "and at the start); the best-scoring weights are kept (see --keep_last). Default: "
            "recipes/every_method.yaml's."
        },
    )

    num_generations_eval: int | None = field(
        default=None,
        metadata={
            "help": "Samples of each sampled held-out prompt in the measures before and after the run (TRL's name "
            "for GRPO's samples of an evaluation prompt; see --eval_sampled_prompts; --eval_samples_per_prompt is "
            "taken as this flag). Default: recipes/every_method.yaml's."
        },
    )

    precision_line: ClassVar[str | None] = None

    def __post_init__(self) -> None:
        if self.num_generations_eval is None or self.num_generations_eval < 1:
            raise ValueError(f"--num_generations_eval must be >= 1, got {self.num_generations_eval}: e.g. 16.")
        if self.use_cpu is None:  # without it, accelerate runs each CPU process of torchrun as a run of its own
            self.use_cpu = not torch.accelerator.is_available()
        self.precision_line = decide_bf16(self, POSTTRAINING_FLOAT32)  # None where --bf16 or --fp16 decided
        super().__post_init__()


# The methods' configs; their measured defaults are the methods' recipes' (`method_recipe`).
@dataclass
class PosttrainGRPOConfig(CpuDefaults, GRPOConfig):
    output_dir: str = retuned(GRPOConfig, "output_dir", "runs/minirope-grpo")

    def __post_init__(self) -> None:
        if self.num_generations is not None and self.num_generations < 2:
            raise ValueError(
                f"--num_generations must be >= 2, got {self.num_generations}: GRPO scores each completion against the "
                f"other completions of its prompt (e.g. 8)."
            )
        super().__post_init__()


@dataclass
class PosttrainDPOConfig(CpuDefaults, DPOConfig):
    output_dir: str = retuned(DPOConfig, "output_dir", "runs/minirope-dpo")
    reward_weights: list[float] | None = field(
        default=None,
        metadata={
            "help": "Without preference data: the weights of the rewards' sum that ranks the model's own samples into "
            "pairs, one per --reward_funcs (as GRPO's --reward_weights; default 1 each, or the --task recipe's)."
        },
    )

    def __post_init__(self) -> None:
        # DPO does not count its tokens: the Trainer counts the chosen and rejected sequences' non-padding ones
        if self.include_num_input_tokens_seen in ("no", False):
            self.include_num_input_tokens_seen = "non_padding"
        super().__post_init__()


@dataclass
class PosttrainDistillationConfig(CpuDefaults, DistillationConfig):
    output_dir: str = retuned(DistillationConfig, "output_dir", "runs/minirope-distill")
    reward_weights: list[float] | None = field(
        default=None,
        metadata={
            "help": "The weights of the held-out score's sum, one per --reward_funcs (measured only: distillation "
            "trains on the teacher; default 1 each)."
        },
    )

    def __post_init__(self) -> None:
        if not self.teacher_model_name_or_path:
            raise ValueError("--method distill needs --teacher_model_name_or_path: the folder of the teacher.")
        super().__post_init__()


SFT_RUN = ("output_dir", "max_steps", "seed", "save_strategy", "report_to", "bf16", "fp16", "use_cpu")  # the run's
BOUNDS = {"lm_coef": (">=", 0), "per_device_train_batch_size": (">=", 1), "learning_rate": (">", 0)}  # its numbers


EXAMPLE = """'{"learning_rate": 1e-3}'"""


def sft_mapping(value: dict | str | None, flag: str = "--sft_config") -> dict:
    """`--sft_config` as a mapping: a JSON text read, a mapping checked; {} for None.

    Raises:
        ValueError: text that is not a JSON mapping; a key that is neither a flag of TRL's `SFTConfig` nor `lm_coef`;
            a key the run sets itself (`SFT_RUN`: the steps are --sft_steps, the precision and seed the method's);
            a number out of `BOUNDS` (`lm_coef` below 0, a learning rate not above 0, a batch below 1).
    """
    try:
        value = json.loads(value) if isinstance(value, str) else {} if value is None else value
    except json.JSONDecodeError as error:
        raise ValueError(f"{flag} {value}: not JSON ({error.msg}); give a mapping such as {EXAMPLE}.") from None
    if not isinstance(value, dict):
        raise ValueError(f"{flag} must be a mapping of SFTConfig flags, such as {EXAMPLE}.")
    for key, number in value.items():
        if key in SFT_RUN:
            fix = "--sft_steps N" if key == "max_steps" else "the method's own flag"
            raise ValueError(f"{flag} {key}: the warm start takes it from the run; give {fix} instead.")
        if key != "lm_coef" and key not in SFTConfig.__dataclass_fields__:
            raise ValueError(f"{flag} {key}: not a flag of TRL's SFTConfig (nor lm_coef); `trl sft --help` lists them.")
        sign, bound = BOUNDS.get(key, (None, None))
        if sign and not (isinstance(number, int | float) and (number > bound if sign == ">" else number >= bound)):
            raise ValueError(f"{flag} {key} must be {sign} {bound}, got {number}.")
    return dict(value)
