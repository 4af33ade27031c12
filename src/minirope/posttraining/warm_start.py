"""The warm start: supervised fine-tuning on demonstrations of the task before the method, as InstructGPT fine-tunes
on demonstrations before its RL (Ouyang et al. 2022, step 1) and DeepSeek-R1 starts RL from a "cold start" SFT.

`--sft_steps N` runs TRL's `SFTTrainer` for N steps of `--sft_batch_size` rows on `--sft_train_file`'s rows (TRL's
SFT formats: `text`, `prompt`/`completion` or `messages`; a `.txt` file is one `text` row), or, for the verse task,
on the training plays cut to their iambic lines with a word of two or more syllables (`verse.iambic_plays`): text
the reward pays for, in the plays' own words, so the method starts from a model that already writes more of it
without the narrowing a reward alone brings (docs/verse_history.md measures both). Text rows are packed into blocks
of the model's context ("wrapped"), as `minirope-finetune` packs plain text. The run's corpus term
(`corpus.CorpusTerm`, on `--lm_coef`'s text) takes part in every warm-start update too, weighted `--sft_lm_coef`
(0.5 by default), so that demonstrations narrower than the pretraining text cost less of it (measured in
docs/verse_history.md: on the verse task, less than half the drift in bits per byte: +0.016 against +0.037).

The warm-started model is saved to a temporary folder and loaded back from it: TRL's GRPO (with a KL term) and DPO load
their reference model from the path the model's config names, so the reference is the warm-started model, the one
the method starts from.
"""

import tempfile
from dataclasses import dataclass
from pathlib import Path

from datasets import Dataset
from trl import SFTConfig, SFTTrainer

from minirope.data.documents import expand_files, read_utf8
from minirope.folders import ModelArguments, load_causal_lm
from minirope.posttraining.corpus import Corpus, CorpusTerm, add_corpus
from minirope.posttraining.data import read_files
from minirope.posttraining.measures import RUN_STATE
from minirope.posttraining.verse import iambic_plays

SFT_FORMATS = ({"text"}, {"prompt", "completion"}, {"messages"})  # TRL's SFT formats, by their columns


@dataclass
class WarmStart:
    """A run's warm start: the demonstration rows, where they come from in words, and the measure of the model after
    it (`measures.TaskMeasure`; None until it has run)."""

    rows: Dataset
    source: str
    measured: object = None


class MiniRopeSFTTrainer(CorpusTerm, SFTTrainer):
    """TRL's `SFTTrainer`, with the corpus term of `CorpusTerm`."""


def demonstrations(args, verse: bool) -> WarmStart:
    """The warm start's rows: `--sft_train_file` (paths or globs), or for the verse task the training plays cut to
    their iambic lines (`iambic_plays`).

    Raises:
        ValueError: no demonstrations (a run on the user's data without --sft_train_file), `.txt` files mixed with
            rows, rows without a `text`, `prompt`/`completion` or `messages` column, or a `.txt` file that is not
            UTF-8.
        FileNotFoundError, IsADirectoryError: a path that is missing or a folder, a glob that matches nothing.
    """
    if not args.sft_train_file:
        if not verse:
            raise ValueError("--sft_steps needs demonstrations of your task: give --sft_train_file (text, "
                             "prompt/completion or messages rows).")  # fmt: skip
        return WarmStart(Dataset.from_dict({"text": iambic_plays()}), "the training plays cut to their iambic lines")
    files = expand_files(args.sft_train_file, flag="--sft_train_file")
    texts = [path for path in files if Path(path).suffix == ".txt"]
    if texts and len(texts) < len(files):
        raise ValueError(f"--sft_train_file: give .txt files or .jsonl/.json/.parquet rows, not both: "
                         f"{', '.join(files)}.")  # fmt: skip
    if texts:
        rows = Dataset.from_dict({"text": [read_utf8(path) for path in texts]})
    else:
        rows = read_files(files)
    if not any(columns <= set(rows.column_names) for columns in SFT_FORMATS):
        raise ValueError(f"--sft_train_file has no text, prompt/completion or messages column (columns: "
                         f"{rows.column_names}): the warm start takes TRL's SFT formats.")  # fmt: skip
    return WarmStart(rows, ", ".join(Path(path).name for path in files))


def warm_start(
    model, tokenizer, warm: WarmStart, corpus: Corpus, args, config
) -> tuple[object, tempfile.TemporaryDirectory]:
    """`args.warm_start_steps` steps of `SFTTrainer` on `warm.rows`, `args.sft_batch_size` rows a step at
    `args.sft_learning_rate` (cosine, 5 warm-up steps, the method's precision and seed), with the corpus term at
    `corpus.warm_coef`; the tuned model, loaded back from the temporary folder returned with it (keep it until the
    method's trainer is built: TRL reads its reference model from there)."""
    folder = tempfile.TemporaryDirectory(prefix="minirope-warm-start-")
    sft = SFTConfig(
        output_dir=folder.name,
        max_steps=args.warm_start_steps,
        learning_rate=args.sft_learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=5,
        weight_decay=0.0,
        per_device_train_batch_size=args.sft_batch_size,
        max_length=model.config.max_position_embeddings,
        packing="text" in warm.rows.column_names,
        packing_strategy="wrapped",
        seed=config.seed,
        save_strategy="no",
        logging_steps=config.logging_steps,
        report_to="none",
        **{name: getattr(config, name) for name in RUN_STATE},  # the run's precision and device
    )
    trainer = MiniRopeSFTTrainer(model=model, args=sft, train_dataset=warm.rows, processing_class=tokenizer)
    add_corpus(trainer, corpus, corpus.warm_coef, args, config.seed)
    trainer.train()
    trainer.save_model(folder.name)
    tokenizer.save_pretrained(folder.name)
    tuned, _ = load_causal_lm(ModelArguments(folder.name, config.trust_remote_code))
    return tuned, folder
