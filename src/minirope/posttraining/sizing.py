"""Defaults sized from the model: what a run does with no flag but the model, the data and the rewards.

The methods' defaults (`arguments`) were measured on models minirope pretrains in minutes, 0.4M-5M parameters, where
300 GRPO steps of 64 completions take 3-6 minutes on 2 CPU cores. A released checkpoint is 30-1000 times larger, and
the same defaults would run for hours: SmolLM2-135M-Instruct takes 13-14 s for a GRPO step of 16 completions and
about 3 minutes to sample 100 prompts 9 times on a 2-core Zen 3 (docs/pretrained.md). Above `RELEASED_SIZE`
parameters, the defaults in `LARGER_MODEL` take their place (fewer, smaller steps; fewer, shorter measures; LoRA's
warm start at its own learning rate; GRPO's LoRA adapter at `LARGER_LORA`'s), measured so that `minirope-posttrain
--method grpo --use_peft True` with no other flag finishes within 20 minutes on 2 cores on SmolLM2-135M-Instruct
(16 min 7 s, held-out exact match 0 -> 81.5 %; `--method dpo` 17 min 17 s; `--method distill` from a GRPO-trained
teacher 6 min, 27.0 -> 63.5-69.0 %). A flag given on the command line or in the `--config` file always wins, and
the run prints the sized values it used.
"""

import torch
from transformers import AutoModelForCausalLM

from minirope.folders import ModelArguments, load_config
from minirope.training.sizing import CHECKPOINTING, larger

# measured on SmolLM2-135M-Instruct, 2-core AMD Zen 3 (docs/pretrained.md, "Post-training it")
LARGER_MODEL = {
    # activation checkpointing: GRPO with LoRA on SmolLM2, 2 steps of 16 completions, peak RSS 6.24 -> 3.87 GB for
    # 42 -> 47 s of steps (TRL's default is on: 2.92 GB with LoRA on q_proj and v_proj; benchmarks/posttrain_speed.py)
    "all": {
        "eval_prompts": 64,
        "eval_samples_per_prompt": 8,
        "eval_sampled_prompts": 16,
        "eval_max_new_tokens": 32,
        "sft_batch_size": 16,
        CHECKPOINTING: True,
    },  # fmt: skip
    "grpo": {"max_steps": 20, "num_generations": 8, "per_device_train_batch_size": 16, "max_completion_length": 32},
    "dpo": {"num_prompts": 128},  # its own pairs: 128 prompts sampled --samples_per_prompt (8) times
    # GRPO's step on SmolLM2 (16 sampled completions of 32 tokens a step; 16 is the method's own batch): with LoRA,
    # the base as the student and a GRPO-trained copy as the teacher (65.0 % of docs/pretrained.md's 200 other
    # problems), 27.0 -> 63.5/69.0/69.0 % on seeds 1-3 in 20 steps, about 6 min a run on a 2-core Zen 5
    # (docs/user_tasks.md, "Distillation from GRPO")
    "distill": {"max_steps": 20, "max_completion_length": 32},
}
# under --use_peft on such a model: GRPO's 20 steps moved a task SmolLM2 half does (the largest of three, scored by
# the reply's last number) by nothing at the data default 1e-4 and from 26.0 % to 34.5 % of 200 other problems at
# 5e-4 (docs/pretrained.md); LoRA wants a learning rate tens of times full fine-tuning's (TRL's "LoRA without regret")
LARGER_LORA = {"grpo": {"learning_rate": 5e-4}}
# ... but after the warm start on the data's answers, 5e-4 undid it (held-out 0.875 -> 0.547 in 4 steps, 0.047 in 20)
# where 1e-4 kept and refined it (0.875 -> 0.922 at step 4): GRPO then polishes a model that already answers
AFTER_WARM_START = {"grpo": {"learning_rate": 1e-4}}
ANSWER_STEPS = {False: 300, True: 32}  # the warm start on the data's answers: at most one epoch, and this many steps
SFT_LEARNING_RATE = {False: 3e-4, True: 1e-3}  # the warm start's, full weights (docs/verse_history.md) and LoRA


def count_parameters(model_name_or_path: str, revision: str = "main", trust_remote_code: bool = False) -> int:
    """The model's parameters (tied weights once), from its config alone: the model is built on the meta device, no
    weight is read.

    Raises:
        ValueError: see `minirope.folders.load_config` (a missing folder, not a causal LM, an invalid config).
    """
    config = load_config(ModelArguments(model_name_or_path, trust_remote_code, revision))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    return sum(parameter.numel() for parameter in model.parameters())


def sized_defaults(method: str, parameters: int | None, use_peft: bool = False) -> dict:
    """The flags' defaults for a model of `parameters` running `method` (with a LoRA adapter: `use_peft`): {} up to
    `RELEASED_SIZE` (the methods' own defaults), else `LARGER_MODEL`'s, and `LARGER_LORA`'s with `use_peft`."""
    if not larger(parameters):
        return {}
    lora = LARGER_LORA.get(method, {}) if use_peft else {}
    return {**LARGER_MODEL["all"], **LARGER_MODEL.get(method, {}), **lora}


def after_warm_start(args, config) -> dict:
    """Set on `config` the values `AFTER_WARM_START` gives the method `args.method` for a run that just warm-started,
    where the run's value is a sized default (`args.sized`: no flag and no `--config` file set it); returns them."""
    changes = {name: value for name, value in AFTER_WARM_START.get(args.method, {}).items() if name in args.sized}
    for name, value in changes.items():
        setattr(config, name, value)
    return changes


def sft_learning_rate(args, use_peft: bool) -> float:
    """The warm start's peak learning rate: `--sft_learning_rate`, or `SFT_LEARNING_RATE` for full weights or LoRA
    (with LoRA on SmolLM2-135M-Instruct, 1e-3 took two-digit sums answered alone from 0 % to 67 % in 20 steps of 16
    rows, and to 94 % in one epoch of 1,900; docs/pretrained.md)."""
    return args.sft_learning_rate if args.sft_learning_rate is not None else SFT_LEARNING_RATE[use_peft]
