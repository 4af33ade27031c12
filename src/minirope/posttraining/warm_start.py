"""The warm start: supervised fine-tuning on demonstrations of the task before the method, as InstructGPT fine-tunes
on demonstrations before its RL (Ouyang et al. 2022, step 1) and DeepSeek-R1 starts RL from a "cold start" SFT.

`--sft_steps N` runs TRL's `SFTTrainer` for N steps (its other SFTConfig flags: `--sft_config`) on
`--sft_train_file`'s rows (TRL's SFT formats: `text`, `prompt`/`completion` or `messages`; a `.txt` file is one
`text` row), or on the task's own demonstrations (`Task.demonstrations`: text its rewards pay for, so that the method
starts from a model that already writes more of it, without the narrowing a reward alone brings). Text rows are packed
into blocks of the model's context ("wrapped"), as `minirope-finetune` packs plain text. The run's corpus term
(`trainers.CorpusTerm`, on `--lm_coef`'s text) takes part in every warm-start update too, weighted `--sft_config`'s
`lm_coef` (the method's recipe's), so that demonstrations narrower than the pretraining text cost less of it.

Where the rows of the user's task carry their answers (TRL's `solution` column, or a `completion`) and GRPO (or DPO
ranking its own samples into pairs) would have little to learn from (`answer_warm_start`: the sampled completions of at
least the recipe's share of the held-out prompts all score alike, measured before training), the run warm-starts on
those answers without being asked: each row's prompt and its answer as TRL's prompt-completion rows (conversational
where the prompt is), the loss on the answer only, for one epoch of the rows or the recipe's steps, whichever is fewer:
the stage `answer_warm_start` of the method recipe (`sizing.answer_stage`). `--sft_steps 0` turns it off. With
`--use_peft` the warm start trains a LoRA adapter (the run's `--lora_*` flags) at its own learning rate (the method
recipe's `with_use_peft`), merged into the weights before the method.

The warm-started model is saved to `<output_dir>/_warm_start/` and loaded back from it (with the run's `--dtype` and
`--attn_implementation`): TRL's GRPO (with a KL term) and DPO load their reference model from the path the model's
config names, so the reference is the warm-started model, the one the method starts from. Its measures follow it
there (`warm_start.json`, written last), so that a run resumed from a checkpoint (`--resume_from_checkpoint`) starts
its method from the same warm-started model and scores, without training it again (`saved_warm_start`). The folder
is never pushed (the Hub push skips `_*`) and is removed when the run ends, unless checkpoints remain that a resume
would need it for.
"""

import atexit
import json
import math
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from accelerate import PartialState
from datasets import Dataset
from trl import SFTConfig, get_peft_config
from trl.data_utils import is_conversational

from minirope import owned
from minirope.data.blocks import default_block_size
from minirope.data.documents import expand_files, read_utf8
from minirope.folders import ModelArguments, load_causal_lm
from minirope.output.folder import checkpoint_folders
from minirope.posttraining.corpus import add_corpus
from minirope.posttraining.data import read_files
from minirope.posttraining.measures import RUN_STATE, SIGNAL_SAMPLES, TaskMeasure
from minirope.posttraining.sizing import answer_stage
from minirope.posttraining.trainers import MiniRopeSFTTrainer

SFT_FORMATS = ({"text"}, {"prompt", "completion"}, {"messages"})  # TRL's SFT formats, by their columns
ANSWER_COLUMNS = ("completion", "solution")  # a row's answer, by preference
WARM_START_FOLDER, WARM_START_FILE = "_warm_start", "warm_start.json"  # in --output_dir: the model, then its measures


@dataclass
class WarmStart:
    """A run's warm start: the demonstration rows, where they come from in words, its steps, and the measure of the
    model after it (`measures.TaskMeasure`; None until it has run)."""

    rows: Dataset
    source: str
    steps: int
    measured: object = None


def demonstrations(args, task) -> WarmStart:
    """The warm start's rows for `--sft_steps`: `--sft_train_file` (paths or globs), the task's own
    (`Task.demonstrations`), else the answers in the task's training rows (`answer_rows` of `Task.rows`).

    Raises:
        ValueError: no demonstrations (a run on the user's data without --sft_train_file or answers in its rows),
            `.txt` files mixed with rows, rows without a `text`, `prompt`/`completion` or `messages` column, or a
            `.txt` file that is not UTF-8.
        FileNotFoundError, IsADirectoryError: a path that is missing or a folder, a glob that matches nothing.
    """
    steps = args.warm_start_steps
    if not args.sft_train_file:
        if task.demonstrations is not None:
            return WarmStart(*task.demonstrations(), steps)
        rows = task.rows
        answers = answer_rows(rows) if rows is not None else None
        if answers is None:
            raise ValueError("--sft_steps needs demonstrations of your task: give --sft_train_file (text, "
                             "prompt/completion or messages rows), or rows with a `solution` or `completion` "
                             "column.")  # fmt: skip
        return WarmStart(answers, answer_source(rows), steps)
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
    return WarmStart(rows, ", ".join(Path(path).name for path in files), steps)


def answer_rows(train: Dataset) -> Dataset | None:
    """TRL's prompt-completion rows from prompt rows that carry their answer (`ANSWER_COLUMNS`; None: they do not):
    a conversational prompt gets the answer as the assistant's message, a plain-text one as text, after a space where
    neither the prompt ends nor the answer starts with one (`"47 - 19 ="` and `28` make `"47 - 19 = 28"`)."""
    column = next((name for name in ANSWER_COLUMNS if name in train.column_names), None)
    if column is None or "prompt" not in train.column_names:
        return None

    def completion(row: dict) -> dict:
        answer = row[column]
        if is_conversational(row) or not isinstance(answer, str | int | float):
            answer = answer if isinstance(answer, list) else [{"role": "assistant", "content": str(answer)}]
        else:
            answer = str(answer)
            answer = answer if row["prompt"][-1:].isspace() or answer[:1].isspace() else " " + answer
        return {"prompt": row["prompt"], "completion": answer}

    return train.map(completion, remove_columns=train.column_names)


def answer_source(train: Dataset) -> str:
    column = next(name for name in ANSWER_COLUMNS if name in train.column_names)
    return f"the training rows' prompts and their `{column}` column"


def answer_warm_start(setup, args, measured) -> WarmStart | None:
    """The warm start a GRPO run, or DPO on its own samples, takes by itself on the user's data (see the module doc):
    None unless `--sft_steps` is left to its default, the rows carry answers, the run saves merged weights (not
    `--merge_lora False`) and at least the stage's `failing_share` of the held-out prompts' samples (`SIGNAL_SAMPLES`
    or more each) all scored alike below full credit in `measured` (`TaskMeasure.failing_share`): GRPO's groups, and
    DPO's own pairs, need samples that score apart. The stage's values (`sizing.answer_stage`) go to `setup.stages`."""
    share, prompts = measured.failing_share, setup.data.rows
    if not args.answer_warm_start or prompts is None or args.sft_steps is not None:
        return None
    stage, recipes = answer_stage(args.method, setup.model.num_parameters())
    if share is None or share < stage["failing_share"] or (measured.samples_per_prompt or 0) < SIGNAL_SAMPLES:
        return None
    if setup.model_args.saves_adapter:  # the adapter saved alone is for the model as it was given
        return None
    answers = answer_rows(prompts)
    if answers is None:
        return None
    steps = min(math.ceil(len(answers) / args.sft_batch_size), stage["sft_steps"])
    setup.stages["answer_warm_start"] = {**stage, "sft_steps": steps}
    print(f"[minirope] {share:.0%} of the held-out prompts' samples all score alike below full credit, which gives "
          f"{args.method} little "
          f"to learn from: first {steps} steps of supervised fine-tuning on {answer_source(prompts)} (one epoch, at "
          f"most {stage['sft_steps']}: the stage answer_warm_start of {recipes}; --sft_steps 0 skips it)")  # fmt: skip
    return WarmStart(answers, answer_source(prompts), steps)


def warm_start(setup, args, config):
    """`setup.warm.steps` steps of `SFTTrainer` on `setup.warm.rows` with `--sft_config`'s SFTConfig flags (the method
    recipe's learning rate and schedule, the method's precision and seed), with the corpus term at
    `setup.corpus.warm_coef`; with `--use_peft` a LoRA adapter, merged. The tuned model, saved to
    `warm_start_folder` (on the main process; another process's to a temporary folder of its own) and loaded back from
    there (`load_warm_started`)."""
    model, tokenizer, warm, model_args = setup.model, setup.tokenizer, setup.warm, setup.model_args
    with tempfile.TemporaryDirectory(prefix="minirope-warm-start-") as scratch:
        given = {name: value for name, value in args.sft_config.items() if name != "lm_coef"}
        sft = SFTConfig(
            output_dir=scratch,
            max_steps=warm.steps,
            seed=config.seed,
            save_strategy="no",
            report_to="none",
            **{name: getattr(config, name) for name in RUN_STATE},  # the run's precision and device
            **{
                "max_length": default_block_size(model.config),
                "packing": "text" in warm.rows.column_names,
                "packing_strategy": "wrapped",
                "logging_steps": config.logging_steps,
                **given,  # --sft_config's other SFTConfig flags win
            },
        )
        trainer = MiniRopeSFTTrainer(model=model, args=sft, train_dataset=warm.rows, processing_class=tokenizer,
                                     peft_config=get_peft_config(model_args))  # fmt: skip
        add_corpus(trainer, setup.corpus, setup.corpus.warm_coef, args, config.seed)
        trainer.train()
    tuned = trainer.model.merge_and_unload() if model_args.use_peft else trainer.model
    folder = warm_start_folder(config.output_dir)
    shutil.rmtree(folder, ignore_errors=True)
    tuned.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return load_warm_started(folder, config, model_args)


def kept_folder(output_dir: str) -> Path:
    """`<output_dir>/_warm_start`: the run's warm-started model and its measures, kept while checkpoints need them
    (never pushed: the Hub push skips `_*`)."""
    return Path(output_dir) / WARM_START_FOLDER


def warm_start_folder(output_dir: str) -> Path:
    """Where the warm-started model is kept for the run: `<output_dir>/_warm_start` on the main process, a temporary
    folder of its own on any other (several processes never write one folder)."""
    if PartialState().is_main_process:
        owned.record(output_dir, "minirope-posttrain", [WARM_START_FOLDER])  # the run's own, before it is written
        return kept_folder(output_dir)
    folder = tempfile.mkdtemp(prefix="minirope-warm-start-")
    atexit.register(shutil.rmtree, folder, True)  # TRL's reference model is read from it during training
    return Path(folder)


def load_warm_started(folder: Path, config, model_args):
    """The warm-started model in `folder`, with the run's `--dtype` and `--attn_implementation`."""
    tuned, _ = load_causal_lm(ModelArguments(str(folder), config.trust_remote_code), **model_args.init_kwargs())
    return tuned


def save_warm_measures(output_dir: str, warm: WarmStart) -> None:
    """Write the warm start's measures beside its model (`WARM_START_FILE`, last: its presence says the warm start is
    complete), on the main process."""
    if not PartialState().is_main_process:
        return
    folder = kept_folder(output_dir)
    saved = {"steps": warm.steps, "source": warm.source, "measured": asdict(warm.measured)}
    (folder / f"{WARM_START_FILE}.partial").write_text(json.dumps(saved))
    (folder / f"{WARM_START_FILE}.partial").replace(folder / WARM_START_FILE)


def saved_warm_start(output_dir: str, resume: str | None) -> WarmStart | None:
    """The warm start of the run a resumed run (`resume`: its checkpoint) continues, as `save_warm_measures` left it
    in `<output_dir>/_warm_start`; None for a run that is not resumed or did no (complete) warm start there."""
    file = kept_folder(output_dir) / WARM_START_FILE
    if resume is None or not file.is_file():
        return None
    saved = json.loads(file.read_text())
    measured = {name: value for name, value in saved["measured"].items() if name in TaskMeasure.__dataclass_fields__}
    return WarmStart(None, saved["source"], saved["steps"], TaskMeasure(**measured))


def finish_warm_start(output_dir: str) -> None:
    """At the run's end: remove `<output_dir>/_warm_start` unless checkpoints remain that a resume would need it for."""
    folder = kept_folder(output_dir)
    if PartialState().is_main_process and folder.is_dir() and not checkpoint_folders(output_dir):
        shutil.rmtree(folder)
