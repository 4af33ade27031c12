"""`minirope-finetune`: fine-tune a minirope (or any causal LM) model with the Hugging Face Trainer.

Data, one of:
  --play NAME                          one play of the bundled corpus: its first 90 % of speeches is the
                                       training document, the rest the validation document
  --train_file a.txt [b.txt ...] --validation_file c.txt   plain text, each file one document: continued
                                                           pretraining on every token
  --train_file a.jsonl --validation_file b.jsonl   {"prompt", "completion"} rows: loss on completion only
  --dataset_name NAME [--dataset_config_name C]    a `datasets` text dataset

Full fine-tuning by default; `--lora` trains a peft LoRA adapter instead (merged into the weights on save
unless `--merge_lora False`, which saves the adapter alone). The validation loss is measured before and
after training; the output folder is Hub-ready (model or adapter, tokenizer, model card, metrics), and
`--push_to_hub --hub_model_id user/name` uploads it.

    minirope-finetune --model_name_or_path runs/minirope-shakespeare --play the-tempest
    minirope-finetune --model_name_or_path runs/minirope-shakespeare --play the-tempest --lora
"""

import time
from dataclasses import dataclass, field
from pathlib import Path

from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    TrainingArguments,
    default_data_collator,
    set_seed,
)

import minirope  # noqa: F401  (registers the minirope classes with the Auto factories)
from minirope.training.cli import run_cli
from minirope.training.data import (
    TextDataArguments,
    data_description,
    load_prompt_completion,
    play_shards,
    tokenize_and_block,
    training_shards,
    validation_shards,
)
from minirope.training.metrics import IGNORE_INDEX, language_model_metrics
from minirope.training.output import check_output_dir, finish_run, model_card
from minirope.training.trainer import (
    MiniRopeTrainer,
    MiniRopeTrainingArguments,
    default_attention,
    final_evaluation,
    parse_cli_args,
    resolve_resume,
    reuse_freed_memory,
    scheduler_name,
)

LORA_TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


@dataclass
class FinetuneModelArguments:
    model_name_or_path: str = field(metadata={"help": "A folder written by save_pretrained, or a Hub id."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow the folder's own model code."})
    attn_implementation: str | None = field(
        default=None,
        metadata={
            "help": "eager, sdpa, flash_attention_2, ... Default: eager when training on CPU (PyTorch's CPU "
            "flash-attention kernel is slower for blocks this short), else sdpa."
        },
    )
    lora: bool = field(default=False, metadata={"help": "Train a LoRA adapter (peft) instead of all weights."})
    lora_r: int = field(default=8, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=16, metadata={"help": "LoRA scaling numerator (scale = alpha / r)."})
    lora_dropout: float = field(default=0.05, metadata={"help": "Dropout on the LoRA path."})
    lora_target_modules: str = field(default=LORA_TARGETS, metadata={"help": "Comma-separated module names."})
    merge_lora: bool = field(default=True, metadata={"help": "Merge the adapter into the saved weights."})


@dataclass
class FinetuneDataArguments(TextDataArguments):
    """Data flags, plus one play of the bundled corpus; a .jsonl --train_file holds prompt/completion rows."""

    play: str | None = field(default=None, metadata={"help": "A play of the bundled corpus, e.g. the-tempest."})


@dataclass
class FinetuningArguments(MiniRopeTrainingArguments):
    """`TrainingArguments` with defaults for a short fine-tune on CPU."""

    output_dir: str = field(default="runs/minirope-finetuned", metadata={"help": "Where the model is written."})
    num_train_epochs: float = 3.0
    per_device_train_batch_size: int = 16
    learning_rate: float = 3e-4
    weight_decay: float = 0.0
    warmup_steps: float = 5
    eval_strategy: str = "epoch"
    save_strategy: str = "epoch"
    save_total_limit: int | None = 1
    logging_steps: float = 5


def parse_args(argv: list[str] | None = None):
    return parse_cli_args((FinetuneModelArguments, FinetuneDataArguments, FinetuningArguments), argv)


def is_prompt_completion(data_args: FinetuneDataArguments) -> bool:
    return bool(data_args.train_file) and all(Path(path).suffix in (".jsonl", ".json") for path in data_args.train_file)


def prompt_completion_datasets(data_args: FinetuneDataArguments, tokenizer, training_args: TrainingArguments):
    """Tokenize `prompt + completion + eos`, labels -100 on the prompt (loss on the completion only)."""
    raw = load_prompt_completion(data_args.train_file, data_args.validation_file)

    def tokenize(row):
        prompt = tokenizer(row["prompt"], add_special_tokens=False)["input_ids"]
        completion = tokenizer(row["completion"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        input_ids = (prompt + completion)[: data_args.block_size]
        labels = ([IGNORE_INDEX] * len(prompt) + completion)[: data_args.block_size]
        return {"input_ids": input_ids, "attention_mask": [1] * len(input_ids), "labels": labels}

    with training_args.main_process_first(desc="tokenizing"):
        tokenized = raw.map(tokenize, remove_columns=["prompt", "completion"], desc="Tokenizing")
    tokenized = tokenized.filter(lambda row: any(label != IGNORE_INDEX for label in row["labels"][1:]))
    for split in ("train", "validation"):
        if len(tokenized[split]) == 0:
            raise ValueError(
                f"no {split} row keeps a completion token within --block_size {data_args.block_size}: "
                f"shorten the prompts or raise --block_size."
            )
    train, validation = tokenized["train"], tokenized["validation"]
    if data_args.max_train_samples is not None:
        train = train.select(range(min(len(train), data_args.max_train_samples)))
    if data_args.max_eval_samples is not None:
        validation = validation.select(range(min(len(validation), data_args.max_eval_samples)))
    return train, validation


def text_datasets(data_args: FinetuneDataArguments, tokenizer, training_args: TrainingArguments):
    if data_args.play and (data_args.train_file or data_args.dataset_name):
        raise ValueError("Give one data source: --play, --train_file/--validation_file, or --dataset_name.")
    if data_args.play:
        shards = play_shards(data_args.play)
        train, validation = shards["train"], shards["validation"]
    elif data_args.train_file or data_args.dataset_name:
        train, validation = training_shards(data_args), validation_shards(data_args)
    else:
        raise ValueError("No data: give --play NAME, --train_file/--validation_file, or --dataset_name.")
    return tokenize_and_block(train, validation, tokenizer, data_args, training_args.seed)


def load_model_and_tokenizer(model_args: FinetuneModelArguments, training_args: TrainingArguments):
    """Raises ValueError when the tokenizer has more tokens than the model's embedding rows."""
    tokenizer = AutoTokenizer.from_pretrained(
        model_args.model_name_or_path, trust_remote_code=model_args.trust_remote_code
    )
    model = AutoModelForCausalLM.from_pretrained(
        model_args.model_name_or_path,
        trust_remote_code=model_args.trust_remote_code,
        attn_implementation=model_args.attn_implementation or default_attention(training_args),
    )
    rows = model.get_input_embeddings().num_embeddings
    if len(tokenizer) > rows:
        raise ValueError(
            f"the tokenizer has {len(tokenizer)} tokens but the model's vocab_size is {rows}: use the tokenizer "
            f"saved with the model, or call model.resize_token_embeddings(len(tokenizer)) and save it first."
        )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def with_lora(model, model_args: FinetuneModelArguments):
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=model_args.lora_r,
        lora_alpha=model_args.lora_alpha,
        lora_dropout=model_args.lora_dropout,
        target_modules=[name.strip() for name in model_args.lora_target_modules.split(",") if name.strip()],
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def run(argv: list[str] | None = None) -> dict:
    """Parse `argv`, fine-tune, save, and return `{"before": eval metrics, "after": eval metrics}`."""
    model_args, data_args, training_args = parse_args(argv)
    set_seed(training_args.seed)
    if training_args.device.type == "cpu":
        reuse_freed_memory()
    started = time.perf_counter()
    output_dir = Path(training_args.output_dir)
    resume = resolve_resume(training_args)
    model, tokenizer = load_model_and_tokenizer(model_args, training_args)
    config = model.config
    check_output_dir(output_dir, config, overwrite=training_args.overwrite_output_dir or resume is not None)
    data_args.block_size = data_args.block_size or config.max_position_embeddings
    if data_args.block_size > config.max_position_embeddings:
        raise ValueError(
            f"--block_size {data_args.block_size} is longer than the model's context "
            f"{config.max_position_embeddings}: lower --block_size (or fine-tune with a scaled rope_parameters)."
        )
    if is_prompt_completion(data_args):
        train_dataset, eval_dataset = prompt_completion_datasets(data_args, tokenizer, training_args)
        collator = DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=IGNORE_INDEX)
    else:
        train_dataset, eval_dataset = text_datasets(data_args, tokenizer, training_args)
        collator = default_data_collator
    if model_args.lora:
        model = with_lora(model, model_args)
    trainable = sum(param.numel() for param in model.parameters() if param.requires_grad)
    print(f"[minirope] fine-tuning {trainable / 1e6:.3f}M parameters on {len(train_dataset)} sequences")

    trainer = MiniRopeTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        data_collator=collator,
        processing_class=tokenizer,
        **language_model_metrics(tokenizer),
    )
    before = trainer.evaluate(metric_key_prefix="eval")
    train_result = trainer.train(resume_from_checkpoint=resume)
    after = final_evaluation(trainer)
    adapter_only = model_args.lora and not model_args.merge_lora
    if model_args.lora and model_args.merge_lora:
        trainer.model = trainer.model.merge_and_unload()

    summary = {
        "base_model": model_args.model_name_or_path,
        "method": ("LoRA (merged)" if model_args.merge_lora else "LoRA adapter") if model_args.lora else "full",
        "trainable_parameters": trainable,
        "steps": trainer.state.global_step,
        "wall_seconds": round(time.perf_counter() - started, 1),
        "before": {key: before[key] for key in ("eval_nats_per_token", "eval_perplexity", "eval_bits_per_byte")},
        "after": {key: after[key] for key in ("eval_nats_per_token", "eval_perplexity", "eval_bits_per_byte")},
    }
    dataset = data_args.play or data_description(data_args)
    how_trained = (
        f"Fine-tuned from `{model_args.model_name_or_path}` with `minirope-finetune` ({summary['method']}, "
        f"{trainable / 1e6:.3f}M trainable parameters): {summary['steps']} steps, AdamW lr "
        f"{training_args.learning_rate} ({scheduler_name(training_args)}), {training_args.num_train_epochs} epochs. "
        f"Validation bits per byte {before['eval_bits_per_byte']:.4f} before, {after['eval_bits_per_byte']:.4f} after."
    )
    card = model_card(
        name=output_dir.name,
        config=config,
        metrics=after,
        dataset=dataset,
        how_trained=how_trained,
        base_model=model_args.model_name_or_path,
        adapter=adapter_only,
    )
    before_metrics = {f"before_{key}": value for key, value in before.items()}
    finish_run(
        trainer,
        train_metrics=train_result.metrics,
        eval_metrics={**before_metrics, **after},
        card=card,
        summary=summary,
    )
    if trainer.is_world_process_zero():
        print(
            f"\n[minirope] validation bits/byte {before['eval_bits_per_byte']:.4f} -> "
            f"{after['eval_bits_per_byte']:.4f} "
            f"(nats/token {before['eval_nats_per_token']:.4f} -> {after['eval_nats_per_token']:.4f}) "
            f"in {summary['steps']} steps, {summary['wall_seconds']:.0f} s; written to {output_dir}/"
        )
    return {"before": before, "after": after}


def main() -> None:
    run_cli("minirope-finetune", run)


if __name__ == "__main__":
    main()
