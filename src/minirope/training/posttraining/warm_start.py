"""The warm start: supervised fine-tuning on demonstrations of the task before the method, as InstructGPT fine-tunes
on demonstrations before its RL (Ouyang et al. 2022, step 1) and DeepSeek-R1 starts RL from a "cold start" SFT.

`--sft_steps N` runs TRL's `SFTTrainer` for N steps on `--sft_train_file`'s rows (TRL's SFT formats: `text`,
`prompt`/`completion` or `messages`; a `.txt` file is one `text` row), or, for the verse task, on the training plays
cut to their iambic lines with a word of two or more syllables (`verse.iambic_plays`): text the reward pays for, in
the plays' own words, so the method starts from a model that already writes more of it without the narrowing a
reward alone brings (docs/post_training.md measures both). Text rows are packed into blocks of the model's context
("wrapped"), as `minirope-finetune` packs plain text.

The warm-started model is saved to a temporary folder and loaded back from it: TRL's GRPO (with a KL term) and DPO load
their reference model from the path the model's config names, so the reference is the warm-started model, the one
the method starts from.
"""

import tempfile
from pathlib import Path

from datasets import Dataset
from trl import SFTConfig, SFTTrainer

from minirope.folders import ModelArguments, load_causal_lm
from minirope.training.posttraining.data import read_files
from minirope.training.posttraining.verse import iambic_plays

SFT_FORMATS = ({"text"}, {"prompt", "completion"}, {"messages"})  # TRL's SFT formats, by their columns


def demonstrations(args, verse: bool) -> tuple[Dataset, str]:
    """The warm start's rows and their name: `--sft_train_file`, or for the verse task the plays cut to their iambic
    lines (`iambic_plays`).

    Raises:
        ValueError: no demonstrations (a run on the user's data without --sft_train_file), a file of another kind, or
            rows without a `text`, `prompt`/`completion` or `messages` column.
    """
    if not args.sft_train_file:
        if not verse:
            raise ValueError("--sft_steps needs demonstrations of your task: give --sft_train_file (text, "
                             "prompt/completion or messages rows).")  # fmt: skip
        return Dataset.from_dict({"text": iambic_plays()}), "the training plays cut to their iambic lines"
    texts = [path for path in args.sft_train_file if Path(path).suffix == ".txt"]
    if texts:
        if len(texts) < len(args.sft_train_file):
            raise ValueError(f"--sft_train_file: give .txt files or .jsonl/.json/.parquet rows, not both: "
                             f"{', '.join(args.sft_train_file)}.")  # fmt: skip
        missing = [path for path in texts if not Path(path).is_file()]
        if missing:
            raise FileNotFoundError(f"--sft_train_file {missing[0]} does not exist.")
        rows = Dataset.from_dict({"text": [Path(path).read_text(encoding="utf-8") for path in texts]})
    else:
        rows = read_files(args.sft_train_file)
    if not any(columns <= set(rows.column_names) for columns in SFT_FORMATS):
        raise ValueError(f"--sft_train_file has no text, prompt/completion or messages column (columns: "
                         f"{rows.column_names}): the warm start takes TRL's SFT formats.")  # fmt: skip
    return rows, ", ".join(Path(path).name for path in args.sft_train_file)


def warm_start(model, tokenizer, rows: Dataset, args, config) -> tuple[object, tempfile.TemporaryDirectory]:
    """`args.warm_start_steps` steps of `SFTTrainer` on `rows` at `args.sft_learning_rate` (cosine, 5 warm-up steps,
    batch `config.per_device_train_batch_size`, the method's precision and seed); the tuned model, loaded back from the
    temporary folder returned with it (keep it until the method's trainer is built: TRL reads its reference model
    from there)."""
    folder = tempfile.TemporaryDirectory(prefix="minirope-warm-start-")
    sft = SFTConfig(
        output_dir=folder.name,
        max_steps=args.warm_start_steps,
        learning_rate=args.sft_learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=5,
        weight_decay=0.0,
        per_device_train_batch_size=config.per_device_train_batch_size,
        max_length=model.config.max_position_embeddings,
        packing="text" in rows.column_names,
        packing_strategy="wrapped",
        bf16=config.bf16,
        seed=config.seed,
        save_strategy="no",
        logging_steps=config.logging_steps,
        report_to="none",
        use_cpu=config.use_cpu,
    )
    trainer = SFTTrainer(model=model, args=sft, train_dataset=rows, processing_class=tokenizer)
    trainer.train()
    trainer.save_model(folder.name)
    tokenizer.save_pretrained(folder.name)
    tuned, _ = load_causal_lm(ModelArguments(folder.name, config.trust_remote_code))
    return tuned, folder
