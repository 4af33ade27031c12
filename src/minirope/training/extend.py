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

import time
from dataclasses import dataclass, field
from pathlib import Path

from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, default_data_collator, set_seed

import minirope  # noqa: F401  (registers the minirope classes with the Auto factories)
from minirope.evaluation import DISTANCES, repeat_test
from minirope.training.cli import run_cli
from minirope.training.data import (
    BUNDLED_CORPUS,
    TextDataArguments,
    data_description,
    document_texts,
    training_blocks,
    training_shards,
    validation_shards,
    validation_windows,
)
from minirope.training.metrics import language_model_metrics
from minirope.training.output import check_output_dir, finish_run, model_card
from minirope.training.trainer import (
    MiniRopeTrainer,
    MiniRopeTrainingArguments,
    default_attention,
    parallelism,
    parse_cli_args,
    resolve_resume,
    reuse_freed_memory,
    scheduler_name,
)

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3")
EXTRA_PARAMETERS = {
    "llama3": {"low_freq_factor": 1.0, "high_freq_factor": 4.0},
    "yarn": {"beta_fast": 32.0, "beta_slow": 1.0},
}


@dataclass
class ExtendArguments:
    model_name_or_path: str = field(metadata={"help": "A causal LM folder written by save_pretrained, or a Hub id."})
    rope_type: str = field(default="yarn", metadata={"help": f"One of {', '.join(ROPE_TYPES)}."})
    factor: float = field(default=4.0, metadata={"help": "New context = factor x the trained context (> 1)."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow the folder's own model code."})
    attn_implementation: str | None = field(
        default=None, metadata={"help": "eager, sdpa, ... Default: eager when training on CPU, else sdpa."}
    )
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


@dataclass
class ExtendDataArguments(TextDataArguments):
    """Data flags; `--block_size` defaults to factor x the trained context."""

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
    max_steps: int = 150
    per_device_train_batch_size: int = 4
    learning_rate: float = 1e-3
    weight_decay: float = 0.0
    warmup_steps: float = 10
    lr_scheduler_type: str = "cosine"
    logging_steps: float = 10
    eval_strategy: str = "no"
    save_strategy: str = "no"


def parse_args(argv: list[str] | None = None):
    return parse_cli_args((ExtendArguments, ExtendDataArguments, ExtendingArguments), argv)


def extended_rope(config, rope_type: str, factor: float, block_size: int) -> dict:
    """The config fields that extend `config` (trained at `config.max_position_embeddings` tokens) by `factor`.

    Returns `{"rope_parameters": ..., "max_position_embeddings": ...}`: the type's parameters as
    transformers' `ROPE_INIT_FUNCTIONS` read them, with `factor` and `original_max_position_embeddings`;
    `max_position_embeddings` is `block_size`, except for `dynamic`, which rescales past it and so keeps
    the original length.

    Raises:
        ValueError: an unknown `rope_type`, `factor <= 1`, a `block_size` beyond factor x the original
            context, or a model whose RoPE is already scaled.
    """
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"--rope_type {rope_type!r} is not one of {', '.join(ROPE_TYPES)}: pick one of them.")
    if not factor > 1:
        raise ValueError(f"--factor must be > 1 (new context = factor x the trained one), got {factor}: e.g. 4.")
    current = dict(config.rope_parameters or {"rope_type": "default", "rope_theta": 10000.0})
    if current.get("rope_type", "default") != "default":
        raise ValueError(
            f"the model's RoPE is already scaled ({current}): extend the model it was extended from, with the "
            f"total factor."
        )
    original = config.max_position_embeddings
    if block_size > factor * original:
        raise ValueError(
            f"--block_size {block_size} is beyond factor x the trained context ({factor:g} x {original} = "
            f"{factor * original:g}): lower --block_size or raise --factor."
        )
    if rope_type == "default":
        return {"rope_parameters": current, "max_position_embeddings": block_size}
    rope = {
        "rope_type": rope_type,
        "rope_theta": current["rope_theta"],
        "factor": float(factor),
        "original_max_position_embeddings": original,
        **EXTRA_PARAMETERS.get(rope_type, {}),
    }
    return {"rope_parameters": rope, "max_position_embeddings": original if rope_type == "dynamic" else block_size}


def load_causal_lm_config(model_args: ExtendArguments):
    """The folder's config, after checking that it holds a causal LM with RoPE.

    Raises:
        ValueError: no config, a config no Auto class knows, or architectures that are not a causal LM.
    """
    path = model_args.model_name_or_path
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=model_args.trust_remote_code)
    except (OSError, ValueError) as error:
        reason = str(error).strip().splitlines()[0]
        raise ValueError(
            f"--model_name_or_path {path} is not a model folder ({reason}): give a folder written by "
            f"minirope-pretrain or save_pretrained."
        ) from None
    architectures = config.architectures or []
    if architectures and not any(name.endswith("ForCausalLM") for name in architectures):
        raise ValueError(
            f"--model_name_or_path {path} holds {', '.join(architectures)}, not a causal LM: extend the "
            f"pretrained model (a *ForCausalLM folder) before adding a task head."
        )
    if not hasattr(config, "rope_parameters") or not hasattr(config, "max_position_embeddings"):
        raise ValueError(f"--model_name_or_path {path} ({config.model_type}) has no rope_parameters to scale.")
    return config


def evaluate_at(trainer, windows: dict, prefix: str) -> dict[str, float]:
    """Bits per byte (and nats per token) at each window length: `{f"{prefix}_{n}_bits_per_byte": ...}`."""
    metrics = {}
    for block_size, dataset in windows.items():
        result = trainer.evaluate(eval_dataset=dataset, metric_key_prefix=f"{prefix}_{block_size}")
        metrics.update({key: value for key, value in result.items() if key.endswith(("bits_per_byte", "per_token"))})
    return metrics


def run(argv: list[str] | None = None) -> dict:
    """Parse `argv`, extend, fine-tune, save, and return the summary (metrics before and after).

    Raises:
        ValueError, FileNotFoundError: bad flags, model folder or data; nothing is written.
    """
    model_args, data_args, training_args = parse_args(argv)
    set_seed(training_args.seed)
    if training_args.device.type == "cpu":
        reuse_freed_memory()
    started = time.perf_counter()
    output_dir = Path(training_args.output_dir)
    resume = resolve_resume(training_args)
    config = load_causal_lm_config(model_args)
    original = config.max_position_embeddings
    data_args.block_size = data_args.block_size or round(model_args.factor * original)
    scaled = extended_rope(config, model_args.rope_type, model_args.factor, data_args.block_size)
    config.update(scaled)
    check_output_dir(output_dir, config, overwrite=training_args.overwrite_output_dir or resume is not None)

    tokenizer = AutoTokenizer.from_pretrained(
        model_args.model_name_or_path, trust_remote_code=model_args.trust_remote_code
    )
    model = AutoModelForCausalLM.from_pretrained(
        model_args.model_name_or_path,
        config=config,
        trust_remote_code=model_args.trust_remote_code,
        attn_implementation=model_args.attn_implementation or default_attention(training_args),
    )
    train_shards, validation = training_shards(data_args), validation_shards(data_args)
    train_dataset = (
        training_blocks(train_shards, tokenizer, data_args, training_args.seed) if training_args.do_train else None
    )
    eval_sizes = model_args.eval_block_sizes or sorted({original, data_args.block_size})
    windows = {
        size: validation_windows(
            validation, tokenizer, size, stride=size // 4, max_document_tokens=model_args.eval_document_tokens
        )
        for size in eval_sizes
    }
    distances = tuple(model_args.repeat_distances or DISTANCES)
    documents = document_texts(validation)

    trainer = MiniRopeTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        data_collator=default_data_collator,
        processing_class=tokenizer,
        **language_model_metrics(tokenizer),
    )
    before = evaluate_at(trainer, windows, "before")
    repeats_before = repeat_test(model, tokenizer, documents, distances, samples=model_args.repeat_samples)
    train_metrics, after, repeats_after = (
        {},
        {key.replace("before", "after", 1): v for key, v in before.items()},
        repeats_before,
    )
    if training_args.do_train:
        train_metrics = trainer.train(resume_from_checkpoint=resume).metrics
        after = evaluate_at(trainer, windows, "after")
        repeats_after = repeat_test(trainer.model, tokenizer, documents, distances, samples=model_args.repeat_samples)

    steps = trainer.state.global_step
    tokens_per_step = (
        training_args.world_size
        * data_args.block_size
        * (training_args.per_device_train_batch_size * training_args.gradient_accumulation_steps)
    )
    summary = {
        "base_model": model_args.model_name_or_path,
        "rope_type": model_args.rope_type,
        "factor": model_args.factor,
        "original_context": original,
        "block_size": data_args.block_size,
        "rope_parameters": config.rope_parameters,
        "max_position_embeddings": config.max_position_embeddings,
        "repeat_fraction": data_args.repeat_fraction,
        "steps": steps,
        "train_tokens": steps * tokens_per_step,
        "wall_seconds": round(time.perf_counter() - started, 1),
        **parallelism(trainer),
        **before,
        **after,
        "repeat_before": repeats_before,
        "repeat_after": repeats_after,
    }
    scaling = f"`{model_args.rope_type}` RoPE scaling, factor {model_args.factor:g}"
    how_trained = (
        f"Context extended from {original} to {data_args.block_size} tokens from `{model_args.model_name_or_path}` "
        f"with `minirope-extend` ({scaling}): "
        + (
            f"{steps} steps of {tokens_per_step} tokens ({steps * tokens_per_step:,} tokens), AdamW lr "
            f"{training_args.learning_rate} ({scheduler_name(training_args)}), {data_args.repeat_fraction:.0%} of "
            f"the blocks with a repeated passage."
            if training_args.do_train
            else "no fine-tuning (inference-time scaling)."
        )
        + " Validation bits per byte (sliding windows), before -> after: "
        + ", ".join(
            f"{size} tokens {before[f'before_{size}_bits_per_byte']:.4f} -> {after[f'after_{size}_bits_per_byte']:.4f}"
            for size in eval_sizes
        )
        + "."
    )
    largest = max(eval_sizes)
    card_metrics = {f"eval_{key}": after[f"after_{largest}_{key}"] for key in ("bits_per_byte", "nats_per_token")}
    card = model_card(
        name=output_dir.name,
        config=config,
        metrics=card_metrics,
        dataset=data_description(data_args) or BUNDLED_CORPUS,
        how_trained=how_trained,
        base_model=model_args.model_name_or_path,
    )
    finish_run(trainer, train_metrics=train_metrics, eval_metrics={**before, **after}, card=card, summary=summary)
    if trainer.is_world_process_zero():
        print(f"\n[minirope] {scaling}, {original} -> {data_args.block_size} tokens, {steps} steps")
        for size in eval_sizes:
            print(
                f"[minirope] validation bits/byte at {size} tokens: {before[f'before_{size}_bits_per_byte']:.4f} -> "
                f"{after[f'after_{size}_bits_per_byte']:.4f}"
            )
        print("[minirope] repeat test (bits/byte on a repeated passage / on its first occurrence):")
        for old, new in zip(repeats_before, repeats_after, strict=True):
            print(f"[minirope]   D = {old['distance']:5d}: {old['ratio']:.3f} -> {new['ratio']:.3f}")
        print(f"[minirope] written to {output_dir}/ in {summary['wall_seconds']:.0f} s")
    return summary


def main() -> None:
    run_cli("minirope-extend", run)


if __name__ == "__main__":
    main()
