"""`minirope-pretrain`: train a minirope model from scratch with the Hugging Face Trainer.

With no arguments it trains the default model (`MiniRopeConfig()`) on the bundled Shakespeare corpus
on CPU in a few minutes and writes a Hugging Face model folder to `runs/minirope-shakespeare`. Every
`TrainingArguments` flag works (`--max_steps`, `--learning_rate`, `--bf16`, `--output_dir`, ...); the
recipe's own defaults are those of `PretrainingArguments` below. The same script runs unchanged under
`torchrun` and `accelerate launch`.

    minirope-pretrain                                  # the default recipe
    minirope-pretrain --max_steps 100 --output_dir /tmp/run
    minirope-pretrain --train_file a.txt --validation_file b.txt --block_size 512
    minirope-pretrain --dataset_name NAME --dataset_config_name CONFIG
    minirope-pretrain args.json                        # all arguments from a JSON file
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoTokenizer, GenerationConfig, SchedulerType, default_data_collator, set_seed

from minirope import MiniRopeConfig, MiniRopeForCausalLM
from minirope.training.cli import run_cli
from minirope.training.data import (
    BUNDLED_CORPUS,
    TextDataArguments,
    block_stream,
    data_description,
    tokenize_and_block,
    tokenizer_texts,
    training_shards,
    validation_shards,
    validation_windows,
)
from minirope.training.metrics import language_model_metrics
from minirope.training.output import check_output_dir, finish_run, model_card
from minirope.training.throughput import ThroughputCallback, training_flops_per_token
from minirope.training.tokenizer import load_or_train_tokenizer
from minirope.training.trainer import (
    MiniRopeTrainer,
    MiniRopeTrainingArguments,
    default_attention,
    final_evaluation,
    parallelism,
    parse_cli_args,
    resolve_resume,
    reuse_freed_memory,
    scheduler_name,
)

SAMPLE_PROMPT = "ROMEO:\nBut soft, what light"


@dataclass
class ModelArguments:
    """Architecture flags. Each one left unset takes `MiniRopeConfig`'s default."""

    hidden_size: int | None = field(default=None, metadata={"help": "Width of the residual stream."})
    intermediate_size: int | None = field(default=None, metadata={"help": "Width of the SwiGLU MLP."})
    num_hidden_layers: int | None = field(default=None, metadata={"help": "Number of decoder layers."})
    num_attention_heads: int | None = field(default=None, metadata={"help": "Query heads per layer."})
    num_key_value_heads: int | None = field(default=None, metadata={"help": "Key/value heads (GQA)."})
    head_dim: int | None = field(default=None, metadata={"help": "Size of one head (even)."})
    max_position_embeddings: int | None = field(
        default=None, metadata={"help": "Trained context length; defaults to --block_size when that is given."}
    )
    rope_theta: float | None = field(default=None, metadata={"help": "RoPE base (10000 by default)."})
    tie_word_embeddings: bool | None = field(default=None, metadata={"help": "Share lm_head and embeddings."})
    attn_implementation: str | None = field(
        default=None,
        metadata={
            "help": "eager, sdpa, flash_attention_2, ... Default: eager when training on CPU (PyTorch's CPU "
            "flash-attention kernel is slower for blocks this short), else sdpa."
        },
    )

    def config_kwargs(self) -> dict:
        kwargs = {
            name: value
            for name, value in vars(self).items()
            if value is not None and name not in ("rope_theta", "attn_implementation")
        }
        if self.rope_theta is not None:
            kwargs["rope_parameters"] = {"rope_type": "default", "rope_theta": self.rope_theta}
        return kwargs


@dataclass
class DataArguments(TextDataArguments):
    """Data flags, the tokenizer to train or reuse, and the sample printed at the end."""

    tokenizer_name_or_path: str | None = field(
        default=None, metadata={"help": "Use this tokenizer instead of training one."}
    )
    tokenizer_vocab_size: int | None = field(
        default=None, metadata={"help": "Vocabulary of the BPE to train; default MiniRopeConfig().vocab_size."}
    )
    streaming: bool = field(
        default=False,
        metadata={
            "help": "Read the training documents as a stream (--train_file files/globs, or --dataset_name) as "
            "training needs them: memory and start-up do not grow with the corpus or its documents. Needs --max_steps."
        },
    )
    shuffle_buffer_size: int = field(
        default=1024,
        metadata={
            "help": "With --streaming: shuffle the blocks in windows of this many (and the files' order each pass "
            "over them); 0 reads them in order. A resumed run continues exactly either way."
        },
    )
    tokenizer_sample_bytes: int = field(
        default=50_000_000,
        metadata={"help": "Train the tokenizer on the first this many bytes of training text."},
    )
    sample_prompt: str = field(default=SAMPLE_PROMPT, metadata={"help": "Prompt of the sample printed at the end."})
    sample_max_new_tokens: int = field(default=120, metadata={"help": "Length of that sample."})


@dataclass
class PretrainingArguments(MiniRopeTrainingArguments):
    """`TrainingArguments` with the defaults of the recipe measured in docs/recipe.md (2-core CPU, ~8 min)."""

    output_dir: str = field(default="runs/minirope-shakespeare", metadata={"help": "Where the model is written."})
    per_device_train_batch_size: int = 8
    learning_rate: float = 3e-3
    lr_scheduler_type: str = "warmup_stable_decay"
    lr_decay_ratio: float = field(
        default=0.25,
        metadata={
            "help": "With --lr_scheduler_type warmup_stable_decay: the share of --max_steps spent decaying the "
            "learning rate to 0 (cosine), unless --lr_scheduler_kwargs sets num_decay_steps."
        },
    )
    weight_decay: float = 0.1
    adam_beta2: float = 0.95
    max_grad_norm: float = 1.0
    max_steps: int = 2400
    warmup_steps: float = 40
    torch_compile: bool | None = field(
        default=None,
        metadata={
            "help": "torch.compile the model. Default: with bf16 (1.5x faster steps measured with AVX-512 BF16), "
            "not in float32 on CPU (4 %% faster steps measured on AVX2 for about 60 s of compiling)."
        },
    )
    eval_strategy: str = "steps"
    eval_steps: float = 1200
    logging_steps: float = 25
    save_strategy: str = "steps"
    save_steps: float = 1200
    save_total_limit: int | None = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.lr_scheduler_type == SchedulerType.WARMUP_STABLE_DECAY and self.max_steps > 0:
            decay_steps = round(self.lr_decay_ratio * self.max_steps)
            self.lr_scheduler_kwargs = {"num_decay_steps": decay_steps, **(self.lr_scheduler_kwargs or {})}


def parse_args(argv: list[str] | None = None) -> tuple[ModelArguments, DataArguments, PretrainingArguments]:
    return parse_cli_args((ModelArguments, DataArguments, PretrainingArguments), argv)


def build_config(model_args: ModelArguments, data_args: DataArguments, tokenizer) -> MiniRopeConfig:
    """The model config: flags over `MiniRopeConfig` defaults, vocabulary and special ids from the tokenizer.

    Raises:
        ValueError: `--block_size` exceeds `--max_position_embeddings` (the trained context).
    """
    kwargs = model_args.config_kwargs()
    if data_args.block_size is not None:
        kwargs.setdefault("max_position_embeddings", data_args.block_size)
    config = MiniRopeConfig(
        **kwargs,
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    block_size = data_args.block_size or config.max_position_embeddings
    if block_size > config.max_position_embeddings:
        raise ValueError(
            f"--block_size {block_size} is longer than --max_position_embeddings "
            f"{config.max_position_embeddings}: the model would train on positions it is not configured "
            f"for. Lower --block_size or raise --max_position_embeddings."
        )
    data_args.block_size = block_size
    return config


def sample(model, tokenizer, prompt: str, max_new_tokens: int, seed: int) -> str:
    """A sample from the trained model with the stock `generate()` and its generation config."""
    set_seed(seed)
    inputs = tokenizer(prompt, return_tensors="pt").to(model.device)
    model.eval()
    with torch.no_grad():
        output = model.generate(**inputs, max_new_tokens=max_new_tokens)
    return tokenizer.decode(output[0], skip_special_tokens=True)


def load_tokenizer(data_args: DataArguments, texts: Callable[[], list[str]], output_dir: Path, resume: str | None):
    """The tokenizer: a given one, the checkpoint's when resuming, the output folder's, or a new BPE trained on
    `texts()` (called only then)."""
    source = data_args.tokenizer_name_or_path or (
        resume if resume and (Path(resume) / "tokenizer.json").is_file() else None
    )
    if source:
        return AutoTokenizer.from_pretrained(source), True
    vocab_size = data_args.tokenizer_vocab_size or MiniRopeConfig().vocab_size
    return load_or_train_tokenizer(output_dir, texts, vocab_size)


def run(argv: list[str] | None = None) -> dict:
    """Parse `argv` (default: the command line), pretrain, save, and return the final validation metrics.

    Raises:
        ValueError, FileNotFoundError: bad data, flags or output folder (see `minirope-pretrain --help`).
        NonFiniteLossError: the loss became NaN/inf; the last good checkpoint is kept.
    """
    model_args, data_args, training_args = parse_args(argv)
    set_seed(training_args.seed)
    if training_args.device.type == "cpu":
        reuse_freed_memory()
    started = time.perf_counter()
    output_dir = Path(training_args.output_dir)
    resume = resolve_resume(training_args)

    if data_args.streaming and training_args.max_steps <= 0:
        raise ValueError("--streaming needs --max_steps > 0: a stream has no length to count epochs in.")
    train_shards = training_shards(data_args, streaming=data_args.streaming)
    validation = validation_shards(data_args)
    tokenizer, reused = load_tokenizer(
        data_args, lambda: tokenizer_texts(train_shards, data_args.tokenizer_sample_bytes), output_dir, resume
    )
    print(f"[minirope] tokenizer: {'reused' if reused else 'trained'}, {len(tokenizer)} tokens")

    config = build_config(model_args, data_args, tokenizer)
    check_output_dir(output_dir, config, overwrite=training_args.overwrite_output_dir or resume is not None)
    if data_args.streaming:
        eval_dataset = validation_windows(
            validation, tokenizer, data_args.block_size, max_samples=data_args.max_eval_samples
        )
        train_dataset = block_stream(
            train_shards,
            tokenizer,
            data_args,
            training_args.seed,
            shuffle_shards=data_args.shuffle_buffer_size > 1,
            shuffle_buffer=data_args.shuffle_buffer_size,
        )
    else:
        train_dataset, eval_dataset = tokenize_and_block(
            train_shards, validation, tokenizer, data_args, training_args.seed
        )
    model = MiniRopeForCausalLM._from_config(
        config, attn_implementation=model_args.attn_implementation or default_attention(training_args)
    )
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        do_sample=True,
        temperature=0.8,
        top_k=50,
    )
    n_params = model.num_parameters()
    print(
        f"[minirope] model: {n_params / 1e6:.2f}M parameters, "
        f"{'streamed' if data_args.streaming else len(train_dataset)} training blocks and "
        f"{len(eval_dataset)} validation blocks of {data_args.block_size} tokens"
    )

    process_tokens_per_step = data_args.block_size * (
        training_args.per_device_train_batch_size * training_args.gradient_accumulation_steps
    )
    throughput = ThroughputCallback(
        process_tokens_per_step, training_flops_per_token(config, data_args.block_size), run_started=started
    )
    trainer = MiniRopeTrainer(
        model=model,
        callbacks=[throughput],
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        data_collator=default_data_collator,  # equal-length blocks: no padding, no attention mask
        processing_class=tokenizer,
        **language_model_metrics(tokenizer),
    )
    train_result = trainer.train(resume_from_checkpoint=resume)
    eval_metrics = final_evaluation(trainer)
    steps, tokens_per_step = trainer.state.global_step, training_args.world_size * process_tokens_per_step
    speed = throughput.metrics()
    train_metrics = {
        **train_result.metrics,
        "train_tokens": steps * tokens_per_step,
        "num_parameters": n_params,
        **{f"train_{key}": value for key, value in speed.items()},
    }
    text = sample(model, tokenizer, data_args.sample_prompt, data_args.sample_max_new_tokens, training_args.seed)
    summary = {
        "output_dir": str(output_dir),
        "num_parameters": n_params,
        "steps": steps,
        "train_tokens": train_metrics["train_tokens"],
        "wall_seconds": round(time.perf_counter() - started, 1),
        **parallelism(trainer),
        "validation_nats_per_token": eval_metrics["eval_nats_per_token"],
        "validation_perplexity": eval_metrics["eval_perplexity"],
        "validation_bits_per_byte": eval_metrics["eval_bits_per_byte"],
        **speed,
        "sample": text,
    }
    dataset = data_description(data_args) or BUNDLED_CORPUS
    how_trained = (
        f"Pretrained from scratch with `minirope-pretrain` (Hugging Face Trainer): {steps} steps of "
        f"{tokens_per_step} tokens ({train_metrics['train_tokens']:,} tokens), block size {data_args.block_size}, "
        f"AdamW lr {training_args.learning_rate} ({scheduler_name(training_args)} "
        f"{training_args.lr_scheduler_kwargs or ''}, {training_args.warmup_steps} warm-up steps), weight decay "
        f"{training_args.weight_decay}, bf16 {training_args.bf16}, "
        f"{n_params / 1e6:.2f}M parameters, {summary['wall_seconds']:.0f} s wall time."
    )
    card = model_card(
        name=output_dir.name, config=config, metrics=eval_metrics, dataset=dataset, how_trained=how_trained
    )
    finish_run(trainer, train_metrics=train_metrics, eval_metrics=eval_metrics, card=card, summary=summary)
    if trainer.is_world_process_zero():
        print(
            f"\n[minirope] {steps} steps in {summary['wall_seconds']:.0f} s; validation: "
            f"{summary['validation_nats_per_token']:.4f} nats/token, perplexity "
            f"{summary['validation_perplexity']:.2f}, {summary['validation_bits_per_byte']:.4f} bits/byte"
        )
        if speed:
            print(
                f"[minirope] training speed (per process, median step after warm-up): {speed['step_seconds']:.3f} "
                f"s/step, {speed['tokens_per_second']:,.0f} tokens/s, {speed['model_tflops'] * 1e3:.0f} model "
                f"GFLOP/s = MFU {speed['mfu']:.1%} of the {speed['matmul_peak_tflops'] * 1e3:.0f} GFLOP/s "
                f"{speed['matmul_peak_dtype']} matmul peak measured in this run (best of before and after training)"
            )
        print(f"[minirope] model written to {output_dir}/ (load it with AutoModelForCausalLM.from_pretrained)")
        print(f"[minirope] sample:\n{text}")
    return eval_metrics


def main() -> None:
    run_cli("minirope-pretrain", run)


if __name__ == "__main__":
    main()
