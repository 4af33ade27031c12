"""`minirope-finetune`: fine-tune a minirope (or any causal LM) model with the Hugging Face Trainer.

Data, one of:
  --play NAME                          one play of the bundled corpus: its first 90 % of speeches is the
                                       training document, the rest the validation document
  --train_file a.txt [b.txt ...] --validation_file c.txt   plain text, each file one document: continued
                                                           pretraining on every token
  --train_file a.jsonl --validation_file b.jsonl   {"prompt", "completion"} rows: loss on completion only
  --train_file a.jsonl --validation_file b.jsonl   {"messages": [{"role", "content"}, ...]} rows: rendered
                                                   with the chat template, loss on the assistant turns only
  --dataset_name NAME [--dataset_config_name C]    a `datasets` dataset: text (--text_column), or a
                                                   `messages` column of conversations

Without --validation_file, the first --validation_split_percentage (5) % of the training rows (prompt/completion
rows, conversations, or blocks of text) are held out for validation and never trained on, as in transformers'
run_clm.py.

Full fine-tuning by default; `--use_peft` trains a peft LoRA adapter instead (TRL's flags, as `minirope-posttrain`
takes them: `--lora_r`, `--lora_alpha`, `--lora_target_modules q_proj v_proj`), merged into the weights on save
unless `--merge_lora False`, which saves the adapter alone. The validation loss is measured before and
after training; the output folder is Hub-ready (model or adapter, tokenizer, model card, metrics), and
`--push_to_hub --hub_model_id user/name` uploads it.

    minirope-finetune --model_name_or_path runs/minirope-shakespeare --play the-tempest
    minirope-finetune --model_name_or_path runs/minirope-shakespeare --play the-tempest --use_peft
"""

import sys
from dataclasses import dataclass, field

from datasets import DatasetDict
from transformers import DataCollatorForSeq2Seq, TrainingArguments, default_data_collator

from minirope.commands import run_cli
from minirope.data.blocks import default_block_size
from minirope.data.bundled import play_shards
from minirope.data.chat import conversation_examples, dataset_conversations, load_conversations
from minirope.data.pipeline import (
    HeldOutArguments,
    TextDataArguments,
    data_description,
    held_out_blocks,
    hold_out,
    tokenize_and_block,
)
from minirope.data.sources import data_kind, file_shards, open_dataset, text_sources
from minirope.data.supervised import load_prompt_completion, prompt_completion_examples
from minirope.data.tokenizer import add_chat_template
from minirope.folders import ModelArguments, load_causal_lm
from minirope.output.card import card_name, licence_of, model_card, optimizer_description
from minirope.output.folder import begin_writing, check_previous_run, finish_run
from minirope.training.arguments import (
    LORA_TARGETS,
    MiniRopeTrainingArguments,
    parse_cli_args,
    retuned,
    start_run,
)
from minirope.training.checkpoints import check_resume
from minirope.training.heap import moved_trim_flag, trimmed_training
from minirope.training.metrics import IGNORE_INDEX
from minirope.training.precision import avoid_cudnn_attention
from minirope.training.sizing import sized_checkpointing
from minirope.training.trainer import MiniRopeTrainer, final_evaluation

METRICS = ("eval_nats_per_token", "eval_perplexity", "eval_bits_per_byte")


@dataclass
class LoraArguments:
    """LoRA, in TRL's `ModelConfig` names (`--use_peft`, `--lora_r`, `--lora_alpha`, `--lora_dropout`,
    `--lora_target_modules` as a list), the names `minirope-posttrain` takes; the older `--lora` and a comma-separated
    `--lora_target_modules q_proj,v_proj` are still read (`note_old_names` says so in one line)."""

    use_peft: bool = field(
        default=False,
        metadata={
            "help": "Train a LoRA adapter (peft) instead of all weights (TRL's name; --lora is the old one).",
            "aliases": ["--lora"],
        },  # fmt: skip
    )
    lora_r: int = field(
        default=16,
        metadata={
            "help": "LoRA rank: TRL's default and minirope-posttrain's, better than 8 at every model size "
            "measured, in the same time (docs/studies/lora_rank.md)."
        },
    )
    lora_alpha: int = field(default=32, metadata={"help": "LoRA scaling numerator (scale = alpha / r)."})
    lora_dropout: float = field(default=0.05, metadata={"help": "Dropout on the LoRA path."})
    lora_target_modules: list[str] = field(
        default_factory=lambda: list(LORA_TARGETS),
        metadata={"help": "The modules that get an adapter, as a list: q_proj v_proj."},
    )
    merge_lora: bool = field(default=True, metadata={"help": "Merge the adapter into the saved weights."})

    def __post_init__(self) -> None:
        self.lora_target_modules = [
            name.strip() for item in self.lora_target_modules for name in item.split(",") if name.strip()
        ]
        if self.lora_r < 1 or not self.lora_alpha > 0 or not 0 <= self.lora_dropout < 1:
            raise ValueError(
                f"LoRA needs --lora_r >= 1, --lora_alpha > 0 and --lora_dropout in [0, 1), got {self.lora_r}, "
                f"{self.lora_alpha} and {self.lora_dropout}."
            )
        if not self.lora_target_modules:
            raise ValueError("--lora_target_modules is empty: name the modules, e.g. q_proj v_proj.")

    def method(self) -> str:
        return ("LoRA (merged)" if self.merge_lora else "LoRA adapter") if self.use_peft else "full"

    def wrap(self, model, new_token_ids: list[int] = ()):
        """`model` with a peft LoRA adapter on `lora_target_modules`, or unchanged without `--use_peft`; the input
        embeddings of `new_token_ids` (tokens just added) are trained too (peft's `trainable_token_indices`)."""
        if not self.use_peft:
            return model
        from peft import LoraConfig, get_peft_model

        targets = self.lora_target_modules
        config = LoraConfig(
            r=self.lora_r,
            lora_alpha=self.lora_alpha,
            lora_dropout=self.lora_dropout,
            target_modules=targets,
            task_type="CAUSAL_LM",
            trainable_token_indices={"embed_tokens": list(new_token_ids)} if new_token_ids else None,
        )
        return get_peft_model(model, config)


@dataclass
class FinetuneDataArguments(HeldOutArguments, TextDataArguments):
    """Data flags, plus one play of the bundled corpus; a .jsonl --train_file holds prompt/completion rows."""

    play: str | None = field(default=None, metadata={"help": "A play of the bundled corpus, e.g. the-tempest."})


def held_out(raw: DatasetDict, data_args: FinetuneDataArguments, what: str) -> DatasetDict:
    """`raw`'s `train` and `validation` rows, or, with no --validation_file, its `train` rows split by
    --validation_split_percentage (`hold_out`)."""
    if data_args.validation_file:
        return raw
    return hold_out(raw["train"], data_args.validation_split_percentage / 100, what)


def data_kind_and_dataset(data_args: FinetuneDataArguments) -> tuple[str, object]:
    """What the data holds, "text", "prompt_completion" or "messages" (`data_kind` for files; a `--dataset_name`
    dataset with a `messages` column and no `--text_column` is "messages"), and the `--dataset_name` dataset loaded
    with `open_dataset` (None without one).

    Raises:
        ValueError: a --validation_file without a --train_file, files of mixed kinds or records of none
            (`data_kind`).
    """
    if data_args.validation_file and not data_args.train_file:
        raise ValueError("--validation_file needs a --train_file (alone, the model would have nothing to learn).")
    files = [*(data_args.train_file or []), *(data_args.validation_file or [])]
    if files:
        return data_kind(files, data_args.text_column), None
    if not data_args.dataset_name or data_args.play:
        return "text", None
    dataset = open_dataset(data_args.dataset_name, data_args.dataset_config_name, "--train_file/--validation_file")
    columns = dataset.column_names["train"]
    return ("messages" if "messages" in columns and data_args.text_column not in columns else "text"), dataset


def chat_tokens(kind: str, model, tokenizer) -> list[int]:
    """For conversations: the chat template on `tokenizer` (`add_chat_template`), and the ids of the role markers
    it had to add, for which the model's embeddings grow (`resize_token_embeddings`: new rows start at the mean of
    the others). [] for other data, or when the tokenizer already had them."""
    if kind != "messages":
        return []
    before = len(tokenizer)
    if not add_chat_template(tokenizer):
        return []
    model.resize_token_embeddings(len(tokenizer))
    print(f"[minirope] added the chat template's role tokens to the tokenizer ({before} -> {len(tokenizer)} tokens)")
    return list(range(before, len(tokenizer)))


@dataclass
class FinetuningArguments(MiniRopeTrainingArguments):
    """`TrainingArguments` with defaults for a short fine-tune on CPU."""

    output_dir: str = field(default="runs/minirope-finetuned", metadata={"help": "Where the model is written."})
    num_train_epochs: float = retuned(TrainingArguments, "num_train_epochs", 3.0)
    per_device_train_batch_size: int = retuned(TrainingArguments, "per_device_train_batch_size", 16)
    learning_rate: float = field(
        default=3e-4, metadata={"help": "Peak learning rate (full fine-tuning; LoRA takes a higher one, e.g. 2e-3)."}
    )
    weight_decay: float = retuned(TrainingArguments, "weight_decay", 0.0)
    warmup_steps: float = retuned(TrainingArguments, "warmup_steps", 5)
    eval_strategy: str = retuned(TrainingArguments, "eval_strategy", "epoch")
    save_strategy: str = retuned(TrainingArguments, "save_strategy", "epoch")
    save_total_limit: int | None = retuned(TrainingArguments, "save_total_limit", 1)
    logging_steps: float = retuned(TrainingArguments, "logging_steps", 5)


def parse_args(argv: list[str] | None = None) -> tuple:
    return parse_cli_args((ModelArguments, LoraArguments, FinetuneDataArguments, FinetuningArguments), argv)


def datasets_and_collator(data_args: FinetuneDataArguments, kind: str, dataset, tokenizer, seed: int):
    """The training and validation examples of the data flags, and the collator that batches them.

    Raises:
        ValueError, OSError: no data or two sources, files of mixed kinds, or a bad file (naming it).
    """
    files = (data_args.train_file, data_args.validation_file or [])
    if kind == "prompt_completion":
        raw = held_out(load_prompt_completion(*files), data_args, "prompt/completion rows")
        train, validation = prompt_completion_examples(raw, tokenizer, data_args)
        return train, validation, DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=IGNORE_INDEX)
    if kind == "messages":
        if data_args.train_file:
            conversations = held_out(load_conversations(*files), data_args, "conversations")
        else:
            conversations = dataset_conversations(dataset, data_args.dataset_name)
        limits = {"train": data_args.max_train_samples, "validation": data_args.max_eval_samples}
        train, validation = conversation_examples(conversations, tokenizer, data_args.block_size, limits)
        return train, validation, DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=IGNORE_INDEX)
    if data_args.play and (data_args.train_file or data_args.dataset_name):
        raise ValueError("Give one data source: --play, --train_file/--validation_file, or --dataset_name.")
    if data_args.play:
        shards = play_shards(data_args.play)
        train_shards, validation = shards["train"], shards["validation"]
    elif data_args.train_file and not data_args.validation_file:
        shards = file_shards(data_args.train_file, data_args.text_column)
        return (*held_out_blocks(shards, tokenizer, data_args, seed), default_data_collator)
    elif data_args.train_file or data_args.dataset_name:
        train_shards, validation = text_sources(data_args)
    else:
        raise ValueError("No data: give --play NAME, --train_file/--validation_file, or --dataset_name.")
    return (*tokenize_and_block(train_shards, validation, tokenizer, data_args, seed), default_data_collator)


def note_old_names(argv: list[str]) -> None:
    """One line when `argv` uses the LoRA flags' older forms: `--lora` (now `--use_peft`) or a comma-separated
    `--lora_target_modules` (now a list)."""
    notes = ["--lora is --use_peft"] if any(item == "--lora" or item.startswith("--lora=") for item in argv) else []
    at = argv.index("--lora_target_modules") + 1 if "--lora_target_modules" in argv else None
    if at is not None and at < len(argv) and "," in argv[at]:
        notes.append(f"--lora_target_modules {argv[at]} is --lora_target_modules {argv[at].replace(',', ' ')}")
    if notes:
        print(f"[minirope] {'; '.join(notes)} in TRL's names, which minirope-posttrain takes too (the old form still "
              f"works)")  # fmt: skip


def run(argv: list[str] | None = None) -> dict:
    """Parse `argv`, fine-tune, save, and return `{"before": eval metrics, "after": eval metrics}`.

    Raises:
        ValueError, OSError: bad flags, model folder or data (see `minirope-finetune --help`); nothing is written.
    """
    argv = moved_trim_flag(sys.argv[1:] if argv is None else list(argv))
    dataclasses = (ModelArguments, LoraArguments, FinetuneDataArguments, FinetuningArguments)
    inputs = lambda model_args, *_: {"--model_name_or_path": model_args.model_name_or_path}  # noqa: E731
    model_args, lora_args, data_args, training_args, start = start_run(dataclasses, argv, inputs)
    note_old_names(argv)
    if lora_args.use_peft:  # the `peft` extra: a missing one is one line (run_cli), before the model is read
        import peft  # noqa: F401
    with trimmed_training(training_args.device.type == "cpu"):
        return fine_tune(model_args, lora_args, data_args, training_args, start)


def fine_tune(model_args, lora_args, data_args, training_args, start) -> dict:
    """`run`'s work once the flags are parsed: load, measure, train, measure, write."""
    avoid_cudnn_attention(training_args)  # padded batches
    model, tokenizer = load_causal_lm(model_args, attn_implementation=training_args.attention())
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    check_previous_run(
        start.output_dir, model.config, overwrite=training_args.overwrite_output_dir, resuming=start.resume is not None
    )
    check_resume(start.resume, model.config, training_args.max_steps)
    checkpointing = sized_checkpointing(training_args, model.num_parameters())
    if checkpointing:
        print(f"[minirope] {checkpointing}")
    data_args.block_size = data_args.block_size or default_block_size(model.config)
    if data_args.block_size > model.config.max_position_embeddings:
        raise ValueError(
            f"--block_size {data_args.block_size} is longer than the model's context "
            f"{model.config.max_position_embeddings}: lower --block_size (or fine-tune with a scaled rope_parameters)."
        )
    kind, dataset = data_kind_and_dataset(data_args)
    new_token_ids = chat_tokens(kind, model, tokenizer)
    model = lora_args.wrap(model, new_token_ids)
    train, validation, collator = datasets_and_collator(data_args, kind, dataset, tokenizer, training_args.seed)
    trainable = sum(param.numel() for param in model.parameters() if param.requires_grad)
    print(f"[minirope] fine-tuning {trainable / 1e6:.3f}M parameters on {len(train)} sequences")
    data = {"train_dataset": train, "eval_dataset": validation, "data_collator": collator}
    trainer = MiniRopeTrainer(model=model, args=training_args, processing_class=tokenizer, **data)

    before = trainer.evaluate(metric_key_prefix="eval")
    begin_writing(start.output_dir, "minirope-finetune", resuming=start.resume is not None)
    train_result = trainer.train(resume_from_checkpoint=start.resume)
    after = final_evaluation(trainer)
    if lora_args.use_peft and lora_args.merge_lora:
        trainer.model = trainer.model.merge_and_unload()

    report(trainer, model_args, lora_args, data_args, start, Measures(trainable, before, after, train_result.metrics))
    return {"before": before, "after": after}


@dataclass
class Measures:
    """What a fine-tune measured: its trainable parameters, the validation metrics before and after, and the
    Trainer's training metrics."""

    trainable: int
    before: dict
    after: dict
    train_metrics: dict


def report(trainer, model_args, lora_args, data_args, start, measures: Measures) -> None:
    """Write the folder (model or adapter, card, metrics, summary) and print the before -> after line."""
    trainable, before, after, train_metrics = (
        measures.trainable, measures.before, measures.after, measures.train_metrics
    )  # fmt: skip
    steps, base = trainer.state.global_step, model_args.model_name_or_path
    summary = {
        "base_model": base,
        "training_data": data_description(data_args),
        "method": lora_args.method(),
        "trainable_parameters": trainable,
        "steps": steps,
        "wall_seconds": start.seconds(),
        "before": {key: before[key] for key in METRICS},
        "after": {key: after[key] for key in METRICS},
    }
    how_trained = (
        f"Fine-tuned from `{base}` with `minirope-finetune` ({lora_args.method()}, {trainable / 1e6:.3f}M trainable "
        f"parameters): {steps} steps, {optimizer_description(trainer.args)}, {trainer.args.num_train_epochs} epochs. "
        f"Validation bits per byte {before['eval_bits_per_byte']:.4f} before, {after['eval_bits_per_byte']:.4f} after."
    )
    dataset, adapter = data_args.play or data_description(data_args), lora_args.use_peft and not lora_args.merge_lora
    card = model_card(
        card_name(trainer.args),
        trainer.model.config,
        after,
        dataset,
        how_trained,
        base_model=base,
        adapter=adapter,
        methods=("lora",) if lora_args.use_peft else (),
        licence=licence_of(base, model_args.model_revision),
    )
    line = (
        f"validation bits/byte {before['eval_bits_per_byte']:.4f} -> {after['eval_bits_per_byte']:.4f} "
        f"(nats/token {before['eval_nats_per_token']:.4f} -> {after['eval_nats_per_token']:.4f}) in {steps} steps, "
        f"{summary['wall_seconds']:.0f} s; written to {start.output_dir}/"
    )
    before_metrics = {f"before_{key}": value for key, value in before.items()}
    finish_run(
        trainer,
        train_metrics=train_metrics,
        eval_metrics={**before_metrics, **after},
        card=card,
        summary=summary,
        lines=[line],
        command="minirope-finetune",
    )


def main() -> None:
    run_cli("minirope-finetune", run)


if __name__ == "__main__":
    main()
