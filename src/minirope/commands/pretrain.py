"""`minirope-pretrain`: train a minirope model from scratch with the Hugging Face Trainer.

With no arguments it trains the default model (`MiniRopeConfig()`) on the bundled Shakespeare corpus
on CPU in a few minutes and writes a Hugging Face model folder to `runs/minirope-shakespeare`. Every
`TrainingArguments` flag works (`--max_steps`, `--learning_rate`, `--bf16`, `--output_dir`, ...); the
recipe's own defaults are those of `PretrainingArguments` below. The same script runs unchanged under
`torchrun` and `accelerate launch`.

    minirope-pretrain                                  # the default recipe (docs/studies/recipe.md)
    minirope-pretrain --optim_hidden adamw --num_hidden_layers 6 --hidden_size 64 --intermediate_size 192 \
        --max_steps 2400 --learning_rate 3e-3 --adam_beta2 0.95 --warmup_steps 40 --lr_decay_type cosine \
        --lr_decay_ratio 0.25 --max_grad_norm 1.0      # the previous recipe (its tokenizer: docs/studies/recipe.md)
    minirope-pretrain --max_steps 100 --output_dir /tmp/run
    minirope-pretrain --train_file a.txt --validation_file b.txt --block_size 512
    minirope-pretrain --dataset_name NAME --dataset_config_name CONFIG
    minirope-pretrain args.json                        # all arguments from a JSON file
    minirope-pretrain --streaming True --train_file "corpus/*.jsonl" --max_steps 20000   # larger than memory
"""

from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoTokenizer, GenerationConfig, SchedulerType, TrainingArguments, set_seed

from minirope import MiniRopeConfig, MiniRopeForCausalLM, machine
from minirope.commands import run_cli
from minirope.data.pipeline import (
    HeldOutArguments,
    TextDataArguments,
    block_stream,
    data_description,
    held_out_blocks,
    tokenize_and_block,
    validation_windows,
)
from minirope.data.sources import file_shards, text_sources
from minirope.data.tokenizer import load_or_train_tokenizer
from minirope.output.card import card_name, model_card, optimizer_description, own_licence
from minirope.output.folder import begin_writing, check_previous_run, finish_run
from minirope.tokenizer_format import RESERVED_TOKENS
from minirope.training.arguments import (
    OPTIM_HIDDEN_HELP,
    MiniRopeTrainingArguments,
    parse_cli_args,
    retuned,
    start_run,
)
from minirope.training.checkpoints import check_resume
from minirope.training.throughput import ThroughputCallback, training_flops_per_token
from minirope.training.trainer import MiniRopeTrainer, check_stream_workers, final_evaluation, parallelism

SAMPLE_PROMPT = "ROMEO:\nBut soft, what light"
METRICS = {
    "nats_per_token": "validation_nats_per_token",
    "perplexity": "validation_perplexity",
    "bits_per_byte": "validation_bits_per_byte",
}


@dataclass
class ArchitectureArguments:
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

    def config_kwargs(self) -> dict:
        kwargs = {name: value for name, value in vars(self).items() if value is not None and name != "rope_theta"}
        if self.rope_theta is not None:
            kwargs["rope_parameters"] = {"rope_type": "default", "rope_theta": self.rope_theta}
        return kwargs


@dataclass
class DataArguments(HeldOutArguments, TextDataArguments):
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
    sample_max_new_tokens: int = field(default=120, metadata={"help": "Length of that sample; 0 for no sample."})

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.tokenizer_vocab_size is not None and self.tokenizer_vocab_size <= RESERVED_TOKENS:
            raise ValueError(
                f"--tokenizer_vocab_size must be > {RESERVED_TOKENS} (special tokens and 256 bytes), got "
                f"{self.tokenizer_vocab_size}."
            )
        for name in ("shuffle_buffer_size", "sample_max_new_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name} must be >= 0, got {getattr(self, name)}.")
        if self.tokenizer_sample_bytes < 1:
            raise ValueError(
                f"--tokenizer_sample_bytes must be >= 1, got {self.tokenizer_sample_bytes}: e.g. 50000000."
            )
        if self.sample_max_new_tokens and not self.sample_prompt:
            raise ValueError("--sample_prompt is empty: give a prompt, or --sample_max_new_tokens 0 for no sample.")


@dataclass
class PretrainingArguments(MiniRopeTrainingArguments):
    """`TrainingArguments` with the defaults of the recipe measured in docs/studies/recipe.md (Muon, 1200 steps: a
    compute budget of about 26,500 GFLOP-s, about 2.4 minutes of training on a 2-core CPU with a 180 GFLOP/s float32
    peak)."""

    output_dir: str = field(default="runs/minirope-shakespeare", metadata={"help": "Where the model is written."})
    per_device_train_batch_size: int = retuned(TrainingArguments, "per_device_train_batch_size", 8)
    learning_rate: float = retuned(TrainingArguments, "learning_rate", 4e-3)
    lr_scheduler_type: str = retuned(TrainingArguments, "lr_scheduler_type", "warmup_stable_decay")
    lr_decay_ratio: float = field(
        default=0.3,
        metadata={
            "help": "With --lr_scheduler_type warmup_stable_decay: the share of --max_steps spent decaying the "
            "learning rate to 0, unless --lr_scheduler_kwargs sets num_decay_steps."
        },
    )
    lr_decay_type: str = field(
        default="1-sqrt",
        metadata={
            "help": "With --lr_scheduler_type warmup_stable_decay: the shape of the decay, 1-sqrt (Hägele et al. "
            "2024; measured best in docs/studies/recipe.md), linear or cosine, unless --lr_scheduler_kwargs sets "
            "decay_type.",
            "choices": ["1-sqrt", "linear", "cosine"],
        },
    )
    weight_decay: float = retuned(TrainingArguments, "weight_decay", 0.1)
    adam_beta2: float = retuned(TrainingArguments, "adam_beta2", 0.99)
    max_grad_norm: float = field(
        default=0.0,
        metadata={"help": "Clip the gradient norm to this; 0 (the default: docs/studies/recipe.md) for no clipping."},
    )
    optim_hidden: str = field(default="muon", metadata={"help": OPTIM_HIDDEN_HELP})
    muon_momentum: float = field(
        default=0.9,
        metadata={"help": "With --optim_hidden muon: Muon's Nesterov momentum (docs/studies/recipe.md: 0.9)."},
    )
    max_steps: int = retuned(TrainingArguments, "max_steps", 1200)
    warmup_steps: float = retuned(TrainingArguments, "warmup_steps", 0)
    torch_compile: bool | None = field(
        default=None,
        metadata={
            "help": "torch.compile the model. Default: with bf16 (1.5x faster steps measured with AVX-512 BF16), "
            "not in float32 on CPU (4 %% faster steps measured on AVX2 for about 60 s of compiling)."
        },
    )
    eval_strategy: str = retuned(TrainingArguments, "eval_strategy", "steps")
    eval_steps: float = retuned(TrainingArguments, "eval_steps", 1200)
    logging_steps: float = retuned(TrainingArguments, "logging_steps", 25)
    save_strategy: str = retuned(TrainingArguments, "save_strategy", "steps")
    save_steps: float = retuned(TrainingArguments, "save_steps", 1200)
    save_total_limit: int | None = retuned(TrainingArguments, "save_total_limit", 1)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.lr_decay_ratio <= 1:
            raise ValueError(f"--lr_decay_ratio must be in [0, 1], got {self.lr_decay_ratio}: e.g. 0.3.")
        if self.lr_scheduler_type == SchedulerType.WARMUP_STABLE_DECAY:
            schedule = {"decay_type": self.lr_decay_type}
            if self.max_steps > 0:  # else the Trainer counts the decay from the epochs' steps (create_scheduler)
                schedule["num_decay_steps"] = round(self.lr_decay_ratio * self.max_steps)
            self.lr_scheduler_kwargs = {**schedule, **(self.lr_scheduler_kwargs or {})}


def parse_args(argv: list[str] | None = None) -> tuple:
    return parse_cli_args((ArchitectureArguments, DataArguments, PretrainingArguments), argv)


def build_config(model_args: ArchitectureArguments, data_args: DataArguments, tokenizer) -> MiniRopeConfig:
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


def pretraining_tokenizer(data_args: DataArguments, train_shards, output_dir: Path, resume: str | None):
    """The tokenizer: a given one, the checkpoint's when resuming, the output folder's, or a new BPE trained on the
    first `--tokenizer_sample_bytes` of the training text (`load_or_train_tokenizer`: the output folder's is reused
    only if it was trained on that same text). Returns `(tokenizer, how)`, `how` a phrase for the log."""
    source = data_args.tokenizer_name_or_path or (
        resume if resume and (Path(resume) / "tokenizer.json").is_file() else None
    )
    if source:
        return AutoTokenizer.from_pretrained(source), f"given ({source})"
    vocab_size = data_args.tokenizer_vocab_size or MiniRopeConfig().vocab_size
    return load_or_train_tokenizer(output_dir, train_shards, data_args.tokenizer_sample_bytes, vocab_size)


def datasets(train_shards, validation, tokenizer, data_args: DataArguments, training_args: PretrainingArguments):
    """The training blocks (in memory, or a `BlockStream` with `--streaming`) and the validation windows."""
    if validation is None:  # one --train_file: its first blocks held out, as minirope-finetune and run_clm.py do
        return held_out_blocks(train_shards, tokenizer, data_args, training_args.seed)
    if not data_args.streaming:
        return tokenize_and_block(train_shards, validation, tokenizer, data_args, training_args.seed)
    shuffle = data_args.shuffle_buffer_size
    stream = block_stream(
        train_shards, tokenizer, data_args, training_args.seed, shuffle_shards=shuffle > 1, shuffle_buffer=shuffle
    )
    windows = validation_windows(validation, tokenizer, data_args.block_size, max_samples=data_args.max_eval_samples)
    return stream, windows


def new_model(config: MiniRopeConfig, training_args: PretrainingArguments) -> MiniRopeForCausalLM:
    """A freshly initialised model, with the generation config its sample and its users start from."""
    model = MiniRopeForCausalLM._from_config(config, attn_implementation=training_args.attention())
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        do_sample=True,
        temperature=0.8,
        top_k=50,
        use_cache=True,
    )
    return model


def check_flags(data_args: DataArguments, training_args: PretrainingArguments, start) -> None:
    """The combinations of flags that cannot work, refused before any work; and where the output may go.

    Raises:
        ValueError: naming the flags and the fix.
    """
    if data_args.streaming and training_args.max_steps <= 0:
        raise ValueError("--streaming needs --max_steps > 0: a stream has no length to count epochs in.")
    if data_args.streaming:
        check_stream_workers(training_args.dataloader_num_workers)


def sample(model, tokenizer, prompt: str, max_new_tokens: int, seed: int) -> str:
    """A sample from the trained model with the stock `generate()` and its generation config ("" for none)."""
    if not max_new_tokens:
        return ""
    set_seed(seed)
    inputs = tokenizer(prompt, return_tensors="pt").to(model.device)
    model.eval()
    with torch.no_grad():
        output = model.generate(**inputs, max_new_tokens=max_new_tokens)
    return tokenizer.decode(output[0], skip_special_tokens=True)


def run(argv: list[str] | None = None) -> dict:
    """Parse `argv` (default: the command line), pretrain, save, and return the final validation metrics.

    Raises:
        ValueError, OSError: bad data, flags or output folder (see `minirope-pretrain --help`).
        NonFiniteLossError: the loss became NaN/inf; the last good checkpoint is kept.
    """
    dataclasses = (ArchitectureArguments, DataArguments, PretrainingArguments)
    inputs = lambda model_args, data_args: {"--tokenizer_name_or_path": data_args.tokenizer_name_or_path}  # noqa: E731
    model_args, data_args, training_args, start = start_run(dataclasses, argv, inputs)
    check_flags(data_args, training_args, start)
    if data_args.train_file and not (data_args.validation_file or data_args.streaming or data_args.dataset_name):
        train_shards, validation_shards = file_shards(data_args.train_file, data_args.text_column), None
    else:
        train_shards, validation_shards = text_sources(data_args, streaming=data_args.streaming)
    tokenizer, how = pretraining_tokenizer(data_args, train_shards, start.output_dir, start.resume)
    print(f"[minirope] tokenizer: {len(tokenizer)} tokens, {how}")
    config = build_config(model_args, data_args, tokenizer)
    check_previous_run(
        start.output_dir, config, overwrite=training_args.overwrite_output_dir, resuming=start.resume is not None
    )
    check_resume(start.resume, config, training_args.max_steps, streaming=data_args.streaming)
    train, validation = datasets(train_shards, validation_shards, tokenizer, data_args, training_args)
    model = new_model(config, training_args)
    blocks = "streamed" if data_args.streaming else len(train)
    print(
        f"[minirope] model: {model.num_parameters() / 1e6:.2f}M parameters, {blocks} training blocks and "
        f"{len(validation)} validation blocks of {data_args.block_size} tokens"
    )
    block_tokens = data_args.block_size * training_args.per_device_train_batch_size
    throughput = ThroughputCallback(
        block_tokens * training_args.gradient_accumulation_steps,
        training_flops_per_token(config, data_args.block_size),
        run_started=start.started,
    )
    trainer = MiniRopeTrainer(
        model=model,
        callbacks=[throughput],
        args=training_args,
        train_dataset=train,
        eval_dataset=validation,
        processing_class=tokenizer,
    )

    begin_writing(start.output_dir, "minirope-pretrain", resuming=start.resume is not None)
    train_result = trainer.train(resume_from_checkpoint=start.resume)
    eval_metrics = final_evaluation(trainer)

    text = sample(model, tokenizer, data_args.sample_prompt, data_args.sample_max_new_tokens, training_args.seed)
    report(trainer, data_args, start, Measures(throughput, train_result.metrics, eval_metrics, text))
    return eval_metrics


@dataclass
class Measures:
    """What a pretraining run measured: its speed and compute (`ThroughputCallback`), the Trainer's training
    metrics, the final validation metrics, and the sample ("" for none)."""

    throughput: ThroughputCallback
    train_metrics: dict
    eval_metrics: dict
    sample: str


def speed_lines(summary: dict, speed: dict, flops_per_token: float, tokens: int) -> list[str]:
    """The printed lines on the run's speed (median step, tokens/s, MFU against the machine's measured matmul peak)
    and its compute (model FLOPs: the figure that travels between machines; GFLOP-s: this machine's)."""
    lines = []
    if speed:
        lines.append(
            f"training speed (per process, median step after warm-up): {speed['step_seconds']:.3f} s/step, "
            f"{speed['tokens_per_second']:,.0f} tokens/s, {speed['model_tflops'] * 1e3:.0f} model GFLOP/s = MFU "
            f"{speed['mfu']:.1%} of the {speed['matmul_peak_tflops'] * 1e3:.0f} GFLOP/s {speed['matmul_peak_dtype']} "
            f"matmul peak of this machine ({speed['matmul_peak_size']}-square matmuls, the size where the rate "
            f"stopped rising; the best timing of its runs, kept in {machine.cache_path()})"
        )
    lines.append(
        f"training compute: {summary['train_model_flops'] / 1e12:.3g} model TFLOPs ({tokens:,} tokens x "
        f"{flops_per_token / 1e6:.1f} MFLOPs each: the same on every machine) in "
        f"{summary['train_seconds']:.0f} s of training (evaluation and checkpoints left out); x the "
        f"{summary['matmul_peak_tflops'] * 1e3:.0f} GFLOP/s matmul peak = {summary['budget_gflop_seconds']:,} GFLOP-s "
        f"(this machine's figure: a small model fills a fast CPU's matmuls less well)"
    )
    return lines


def report(trainer, data_args, start, measures: Measures) -> None:
    """Write the folder (model, tokenizer, card, metrics, run summary) and print the results, the speed, the sample."""
    throughput, train_metrics, eval_metrics, text = (
        measures.throughput, measures.train_metrics, measures.eval_metrics, measures.sample
    )  # fmt: skip
    args, config = trainer.args, trainer.model.config
    steps, n_params, speed = trainer.state.global_step, trainer.model.num_parameters(), throughput.metrics()
    tokens = steps * args.world_size * throughput.tokens_per_step
    train_metrics = {
        **train_metrics,
        "train_tokens": tokens,
        "num_parameters": n_params,
        **{f"train_{key}": value for key, value in speed.items()},
    }
    summary = {
        "output_dir": str(start.output_dir),
        "training_data": data_description(data_args),
        "num_parameters": n_params,
        "steps": steps,
        "train_tokens": tokens,
        "wall_seconds": start.seconds(),
        **parallelism(trainer),
        **{name: eval_metrics[f"eval_{key}"] for key, name in METRICS.items()},
        **speed,
        "sample": text,
    }
    how_trained = (
        f"Pretrained from scratch with `minirope-pretrain` (Hugging Face Trainer): {steps} steps of "
        f"{tokens // max(steps, 1)} tokens ({tokens:,} tokens), block size {data_args.block_size}, "
        f"{optimizer_description(args)}, bf16 {args.bf16}, {n_params / 1e6:.2f}M parameters, "
        f"{summary['wall_seconds']:.0f} s wall time."
    )
    card = model_card(card_name(trainer.args), config, eval_metrics, data_description(data_args), how_trained,
                      licence=own_licence())  # fmt: skip
    lines = [
        f"{steps} steps in {summary['wall_seconds']:.0f} s; validation: {summary['validation_nats_per_token']:.4f} "
        f"nats/token, perplexity {summary['validation_perplexity']:.2f}, "
        f"{summary['validation_bits_per_byte']:.4f} bits/byte"
    ]
    summary["train_model_flops"] = throughput.flops_per_token * tokens  # the compute that travels between machines
    summary["train_seconds"] = round(throughput.training_seconds, 3)  # evaluations and checkpoints left out
    summary["matmul_peak_tflops"] = round(throughput.peak_flops / 1e12, 4)
    summary["budget_gflop_seconds"] = round(summary["train_seconds"] * summary["matmul_peak_tflops"] * 1e3)
    lines += speed_lines(summary, speed, throughput.flops_per_token, tokens)
    lines += [
        f"model written to {start.output_dir}/ (load it with AutoModelForCausalLM.from_pretrained)",
        *([f"sample:\n{text}"] if text else []),
    ]
    finish_run(trainer, train_metrics=train_metrics, eval_metrics=eval_metrics, card=card, summary=summary, lines=lines,
               command="minirope-pretrain")  # fmt: skip


def main() -> None:
    run_cli("minirope-pretrain", run)


if __name__ == "__main__":
    main()
