"""What a training command sizes from the model: a released checkpoint (above `RELEASED_SIZE` parameters) is 30-1000
times the models minirope pretrains in minutes, and what those need nothing of, it does.

Activation checkpointing (`sized_checkpointing`): without it a training step holds every layer's activations
until the backward pass. `minirope-finetune --lora` on SmolLM2-135M-Instruct at its default blocks (16 x 256 tokens)
peaked at 9.4 GB on a 2-core Zen 3; on a Zen 5 in bf16, 7.55 GB without it and 3.26 GB with it in the same time and
to the same validation loss (docs/training.md). A model of 1B parameters, 3-4x wider and 22-28 layers, would hold
several times that without it (not measured); GRPO with LoRA on SmolLM2 went from 6.24 to 3.87 GB
(docs/studies/posttrain_speed.md). TRL's configs have it on by default; transformers' `TrainingArguments` off. A flag
given (`--activation_checkpointing`, or the floor's `--gradient_checkpointing`, on the command line or in an arguments
file) always wins.
"""

from dataclasses import fields

from transformers import TrainingArguments

# transformers 5.24 renamed `gradient_checkpointing` (the floor's name) to `activation_checkpointing`
CHECKPOINTING = next(name for name in ("activation_checkpointing", "gradient_checkpointing")
                     if name in {item.name for item in fields(TrainingArguments)})  # fmt: skip
RELEASED_SIZE = 20_000_000  # parameters: above, a released checkpoint (SmolLM2-135M: 134.5M), not a demo-sized model


def larger(parameters: int | None) -> bool:
    """A model above `RELEASED_SIZE` parameters (None: unknown, the measured small-model defaults)."""
    return parameters is not None and parameters > RELEASED_SIZE


def sized_checkpointing(args: TrainingArguments, parameters: int) -> str | None:
    """Turn `args`' activation checkpointing on for a model of more than `RELEASED_SIZE` `parameters` where the user
    set neither name of the flag (`args.given`: `minirope.training.arguments.parse_cli_args`). Returns the line that
    says so, or None where nothing changed."""
    given = getattr(args, "given", frozenset())
    if not larger(parameters) or given & {"activation_checkpointing", "gradient_checkpointing"}:
        return None
    for name in {"activation_checkpointing", "gradient_checkpointing"} & {item.name for item in fields(args)}:
        setattr(args, name, True)  # 5.24 reads the new name and mirrors it in the old one
    return (f"activation checkpointing: on, sized for a model of {parameters / 1e6:.1f}M parameters (above "
            f"{RELEASED_SIZE / 1e6:.0f}M: each layer's activations recomputed in the backward pass instead of held; "
            f"--{CHECKPOINTING} False decides instead)")  # fmt: skip
