"""`minirope-extend`: stretch a trained model's context with RoPE scaling and a short fine-tune at the new length.

    minirope-extend --model_name_or_path runs/minirope-shakespeare --rope_type yarn --factor 4

sets `rope_parameters` (and `max_position_embeddings`) for `factor` x the model's trained context,
fine-tunes on blocks of the new length from the bundled corpus (or `--train_file`/`--dataset_name`),
a `--repeat_fraction` of which repeat a passage further on (so that looking far back pays), and evaluates
the model before and after, at the old and the new length, with two measures:

  - validation bits per byte in sliding windows of each `--eval_block_sizes` length: a window scores only
    its last quarter, so every scored token sees at least 3/4 of the window before it;
  - the repeat test (`minirope.evaluation.repeat_test`): bits per byte on a repeated validation passage over
    those on its first occurrence, at each distance D of `--repeat_distances`.

The folder written is Hub-ready: its config reproduces the scaling in any client that reads
`rope_parameters` (transformers' Llama, llama.cpp through `minirope-export --format gguf` for linear, yarn
and llama3). The types, as transformers' `ROPE_INIT_FUNCTIONS` define them (original length L, factor s):

  default   no scaling: RoPE as trained, fine-tuned at the longer length (the papers' baseline)
  linear    position interpolation (Chen et al. 2023): every position divided by s
  dynamic   NTK-aware: the base grows with the current length past L (`max_position_embeddings` stays L,
            the length transformers' dynamic type rescales from)
  yarn      YaRN (Peng et al. 2023): high frequencies kept, low ones interpolated, attention temperature
  llama3    Llama 3.1's band-wise interpolation (low_freq_factor 1, high_freq_factor 4)

`--do_train False` writes the scaled model without fine-tuning (inference-time scaling alone).
"""

import math
from dataclasses import dataclass, field

from transformers import TrainingArguments

from minirope.commands import run_cli
from minirope.data.pipeline import TextDataArguments, data_description, training_blocks, validation_windows
from minirope.data.sources import document_texts, text_sources
from minirope.folders import ModelArguments, load_causal_lm, load_config
from minirope.output.card import card_name, licence_of, model_card, optimizer_description
from minirope.output.folder import begin_writing, check_previous_run, finish_run
from minirope.rope_scaling import EXTENSIONS, extended_rope
from minirope.training.arguments import MiniRopeTrainingArguments, retuned, start_run
from minirope.training.checkpoints import check_resume
from minirope.training.repeat_test import DISTANCES, repeat_test
from minirope.training.trainer import MiniRopeTrainer, parallelism


@dataclass
class ExtendArguments:
    rope_type: str = field(default="yarn", metadata={"help": f"One of {', '.join(EXTENSIONS)}."})
    factor: float = field(default=4.0, metadata={"help": "New context = factor x the trained context (> 1)."})
    eval_block_sizes: list[int] | None = field(
        default=None, metadata={"help": "Window lengths to evaluate at; default the old and the new context."}
    )
    eval_document_tokens: int | None = field(
        default=None, metadata={"help": "Score only the first N tokens of each validation document (faster)."}
    )
    repeat_distances: list[int] | None = field(
        default=None, metadata={"help": f"Distances of the repeat test; default {' '.join(map(str, DISTANCES))}."}
    )
    repeat_samples: int = field(default=32, metadata={"help": "Windows per distance in the repeat test."})

    def __post_init__(self) -> None:
        if not math.isfinite(self.factor):
            raise ValueError(f"--factor must be a finite number > 1, got {self.factor}: e.g. 4.")
        lowest = {
            "--eval_block_sizes": (self.eval_block_sizes, 4),
            "--eval_document_tokens": (self.eval_document_tokens, 1),
            "--repeat_distances": (self.repeat_distances, 1),
            "--repeat_samples": (self.repeat_samples, 1),
        }
        for flag, (values, low) in lowest.items():
            for value in values if isinstance(values, list) else [values]:
                if value is not None and value < low:
                    raise ValueError(f"{flag} must be >= {low}, got {value}.")


@dataclass
class ExtendDataArguments(TextDataArguments):
    """Data flags; `--block_size` defaults to factor x the trained context."""

    block_size: int | None = field(
        default=None,
        metadata={"help": "Tokens per training sequence; default --factor times the model's trained context."},
    )

    repeat_fraction: float = field(
        default=0.0,
        metadata={
            "help": "Share of training blocks with a passage repeated further on. Off by default: at the default "
            "model's scale it taught no copying (docs/long_context.md)."
        },
    )


@dataclass
class ExtendingArguments(MiniRopeTrainingArguments):
    """`TrainingArguments` with the defaults of the extension measured in docs/long_context.md."""

    output_dir: str = field(default="runs/minirope-extended", metadata={"help": "Where the model is written."})
    do_train: bool = field(default=True, metadata={"help": "Fine-tune; False writes the scaled model as it is."})
    max_steps: int = retuned(TrainingArguments, "max_steps", 150)
    per_device_train_batch_size: int = retuned(TrainingArguments, "per_device_train_batch_size", 4)
    learning_rate: float = field(
        default=1e-3,
        metadata={"help": "Peak learning rate (3e-4 was 0.05-0.1 bits/byte worse for linear and default scaling)."},
    )
    weight_decay: float = retuned(TrainingArguments, "weight_decay", 0.0)
    warmup_steps: float = retuned(TrainingArguments, "warmup_steps", 10)
    lr_scheduler_type: str = retuned(TrainingArguments, "lr_scheduler_type", "cosine")
    logging_steps: float = retuned(TrainingArguments, "logging_steps", 10)
    eval_strategy: str = retuned(TrainingArguments, "eval_strategy", "no")
    save_strategy: str = retuned(TrainingArguments, "save_strategy", "no")


def evaluate_at(trainer, windows: dict, prefix: str) -> dict[str, float]:
    """Bits per byte (and nats per token) at each window length: `{f"{prefix}_{n}_bits_per_byte": ...}`."""
    metrics = {}
    for block_size, dataset in windows.items():
        result = trainer.evaluate(eval_dataset=dataset, metric_key_prefix=f"{prefix}_{block_size}")
        metrics.update({key: value for key, value in result.items() if key.endswith(("bits_per_byte", "per_token"))})
    return metrics


def scaled_config(model_args: ModelArguments, args: ExtendArguments, data_args: ExtendDataArguments):
    """The folder's config with `extended_rope`'s fields, and the context it was trained at; sets the block size.

    Raises:
        ValueError: not a causal LM folder, a model without RoPE, or bad scaling flags (see `extended_rope`).
    """
    config = load_config(model_args)
    if not hasattr(config, "rope_parameters") or not hasattr(config, "max_position_embeddings"):
        raise ValueError(f"{model_args.model_name_or_path!r} ({config.model_type}) has no rope_parameters to scale.")
    original = config.max_position_embeddings
    data_args.block_size = data_args.block_size or round(args.factor * original)
    config.update(extended_rope(config, args.rope_type, args.factor, data_args.block_size))
    return config, original


def repeats(model, tokenizer, documents: list[str], args: ExtendArguments) -> list[dict]:
    """The repeat test at `--repeat_distances` (`minirope.training.repeat_test.repeat_test`).

    Raises:
        ValueError: a distance longer than the validation documents allow.
    """
    distances = tuple(args.repeat_distances or DISTANCES)
    return repeat_test(model, tokenizer, documents, distances, samples=args.repeat_samples)


def run(argv: list[str] | None = None) -> dict:
    """Parse `argv`, extend, fine-tune, save, and return the summary (metrics before and after).

    Raises:
        ValueError, OSError: bad flags, model folder or data; nothing is written.
    """
    dataclasses = (ModelArguments, ExtendArguments, ExtendDataArguments, ExtendingArguments)
    inputs = lambda model_args, *_: {"--model_name_or_path": model_args.model_name_or_path}  # noqa: E731
    model_args, args, data_args, training_args, start = start_run(dataclasses, argv, inputs)
    config, original = scaled_config(model_args, args, data_args)
    check_previous_run(
        start.output_dir, config, overwrite=training_args.overwrite_output_dir, resuming=start.resume is not None
    )
    check_resume(start.resume, config, training_args.max_steps)
    model, tokenizer = load_causal_lm(model_args, config=config, attn_implementation=training_args.attention())
    train_shards, validation = text_sources(data_args)
    train = training_blocks(train_shards, tokenizer, data_args, training_args.seed) if training_args.do_train else None
    eval_sizes = args.eval_block_sizes or sorted({original, data_args.block_size})
    windows = {
        size: validation_windows(
            validation, tokenizer, size, stride=size // 4, max_document_tokens=args.eval_document_tokens
        )
        for size in eval_sizes
    }
    documents = document_texts(validation)
    repeats_before = repeats(model, tokenizer, documents, args)  # before the Trainer: a bad distance writes nothing
    trainer = MiniRopeTrainer(
        model=model,
        args=training_args,
        train_dataset=train,
        processing_class=tokenizer,
    )

    before = (evaluate_at(trainer, windows, "before"), repeats_before)
    train_metrics, after = {}, ({key.replace("before", "after", 1): v for key, v in before[0].items()}, before[1])
    if training_args.do_train:
        begin_writing(start.output_dir, "minirope-extend", resuming=start.resume is not None)
        train_metrics = trainer.train(resume_from_checkpoint=start.resume).metrics
        after = (evaluate_at(trainer, windows, "after"), repeats(trainer.model, tokenizer, documents, args))

    (before, repeats_before), (after, repeats_after) = before, after
    measures = Measures(original, eval_sizes, before, after, repeats_before, repeats_after, train_metrics)
    return report(trainer, model_args, args, data_args, start, measures)


@dataclass
class Measures:
    """What an extension measured: the validation metrics at each evaluated length and the repeat test, before and
    after fine-tuning, and the Trainer's training metrics."""

    original: int  # the context before the extension, in tokens
    eval_sizes: list[int]
    before: dict
    after: dict
    repeats_before: list[dict]
    repeats_after: list[dict]
    train_metrics: dict


def report(trainer, model_args, args, data_args, start, measures: Measures) -> dict:
    """Write the folder (model, card, metrics, summary), print the measures before -> after, return the summary."""
    original, eval_sizes, train_metrics = measures.original, measures.eval_sizes, measures.train_metrics
    before, after, repeats_before, repeats_after = (
        measures.before, measures.after, measures.repeats_before, measures.repeats_after
    )  # fmt: skip
    config, steps, base = trainer.model.config, trainer.state.global_step, model_args.model_name_or_path
    tokens = steps * trainer.args.world_size * data_args.block_size * trainer.args.per_device_train_batch_size
    tokens *= trainer.args.gradient_accumulation_steps
    summary = {
        "base_model": base,
        "rope_type": args.rope_type,
        "factor": args.factor,
        "original_context": original,
        "block_size": data_args.block_size,
        "rope_parameters": config.rope_parameters,
        "max_position_embeddings": config.max_position_embeddings,
        "repeat_fraction": data_args.repeat_fraction,
        "steps": steps,
        "train_tokens": tokens,
        "wall_seconds": start.seconds(),
        **parallelism(trainer),
        **before,
        **after,
        "repeat_before": repeats_before,
        "repeat_after": repeats_after,
    }
    scaling = f"`{args.rope_type}` RoPE scaling, factor {args.factor:g}"
    changes = [
        f"{size} tokens {before[f'before_{size}_bits_per_byte']:.4f} -> {after[f'after_{size}_bits_per_byte']:.4f}"
        for size in eval_sizes
    ]
    training = (
        f"{steps} steps ({tokens:,} tokens), {optimizer_description(trainer.args)}, {data_args.repeat_fraction:.0%} "
        f"of the blocks with a repeated passage"
        if trainer.args.do_train
        else "no fine-tuning (inference-time scaling)"
    )
    how_trained = (
        f"Context extended from {original} to {data_args.block_size} tokens from `{base}` with `minirope-extend` "
        f"({scaling}): {training}. Validation bits per byte (sliding windows), before -> after: {', '.join(changes)}."
    )
    largest = max(eval_sizes)
    card_metrics = {f"eval_{key}": after[f"after_{largest}_{key}"] for key in ("bits_per_byte", "nats_per_token")}
    dataset = data_description(data_args)
    card = model_card(card_name(trainer.args), config, card_metrics, dataset, how_trained, base_model=base,
                      methods=("context-extension", args.rope_type),
                      licence=licence_of(base, model_args.model_revision))  # fmt: skip
    lines = [f"{scaling}, {original} -> {data_args.block_size} tokens, {steps} steps"]
    lines += [f"validation bits/byte at {change}" for change in changes]
    lines.append("repeat test (bits/byte on a repeated passage / on its first occurrence):")
    lines += [
        f"  D = {old['distance']:5d}: {old['ratio']:.3f} -> {new['ratio']:.3f}"
        for old, new in zip(repeats_before, repeats_after, strict=True)
    ]
    lines.append(f"written to {start.output_dir}/ in {summary['wall_seconds']:.0f} s")
    finish_run(
        trainer,
        train_metrics=train_metrics,
        eval_metrics={**before, **after},
        card=card,
        summary=summary,
        lines=lines,
        command="minirope-extend",
    )
    return summary


def main() -> None:
    run_cli("minirope-extend", run)


if __name__ == "__main__":
    main()
