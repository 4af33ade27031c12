"""Writing a run's output folder: refusing to clobber another model, atomic publication (its card is
`minirope.output.card`'s).

The final files are first written to `<output_dir>/.staging`, then moved into `output_dir` one by one
with `os.replace` (atomic on one filesystem): the old `config.json` is removed first and the new one
moved last, so a crash at any point leaves a folder that does not load as a model (or the previous
complete model), never a mix that looks complete. Checkpoints (`checkpoint-N/`) are the Trainer's own.
"""

import json
import os
import shutil
import time
from pathlib import Path

from accelerate import PartialState
from huggingface_hub import ModelCard
from transformers import PreTrainedConfig, TrainingArguments

from minirope.configuration_minirope import ARCHITECTURE_FIELDS
from minirope.folders import first_line

MARKERS = ("adapter_config.json", "config.json")  # moved last: their presence means "complete"
# What a minirope run leaves in its folder however early it stopped (the posttrain pairs are written before
# training, the Trainer's TensorBoard logs under `runs/` from its first step; `checkpoint-N` folders too): a folder
# holding one of them is a run, to be replaced or resumed.
RUN_ENTRIES = (*MARKERS, "trainer_state.json", "run_summary.json", ".staging", "preference_pairs.jsonl", "runs")


def check_not_foreign(output_dir: str | Path, overwrite: bool) -> None:
    """Refuse an `output_dir` that holds files but no minirope run (a user's own folder), as transformers'
    `run_clm.py` refuses a non-empty output folder: the run would write its files among them. An earlier run in
    the folder is `check_previous_run`'s case; `overwrite` (`--overwrite_output_dir`) writes among them anyway.

    Raises:
        ValueError: naming the folder, a few of its entries and the two ways on.
    """
    output_dir = Path(output_dir)
    if overwrite or not output_dir.is_dir():
        return
    entries = sorted(path.name for path in output_dir.iterdir())
    if not entries or any(name in RUN_ENTRIES or name.startswith("checkpoint-") for name in entries):
        return
    shown = ", ".join(entries[:3]) + (f" and {len(entries) - 3} more" if len(entries) > 3 else "")
    raise ValueError(
        f"--output_dir {output_dir} holds files that are not a minirope run ({shown}): choose a new or empty "
        f"--output_dir, or pass --overwrite_output_dir to write the run among them."
    )


def check_previous_run(output_dir: str | Path, config: PreTrainedConfig, overwrite: bool, resuming: bool) -> None:
    """What a run does to an `output_dir` that holds another run, decided and said before any work.

    - A finished model of another architecture is refused (unless `overwrite`); one of the same architecture (or
      with `overwrite`) is replaced when the run ends, and a line says so now: re-running a command into its folder
      stays possible (`make demo` twice), never silent.
    - A new run (not `resuming`) will remove the earlier run's `checkpoint-N` folders when it starts training
      (`remove_old_checkpoints`), and a line names them now: the Trainer would mix them with its own (its rotation
      keeps the highest numbers, deleting the new run's, and `--resume_from_checkpoint last` would pick the old run's).

    Raises:
        ValueError: naming the first differing field, unless `overwrite` (or `resuming`) is set; or a folder of
            other files (`check_not_foreign`).
    """
    check_not_foreign(output_dir, overwrite)
    output_dir = Path(output_dir)
    existing_file = output_dir / "config.json"
    if existing_file.is_file():
        existing = json.loads(existing_file.read_text())
        new = config.to_dict()
        for field in ("model_type", *ARCHITECTURE_FIELDS):
            if not (overwrite or resuming) and field in existing and existing[field] != new.get(field):
                raise ValueError(
                    f"--output_dir {output_dir} already holds a different model ({field} {existing[field]!r}, "
                    f"this run {new.get(field)!r}): pass --overwrite_output_dir to replace it, or choose another "
                    f"--output_dir."
                )
        print(f"[minirope] {describe_finished(output_dir)}")
    old = checkpoint_folders(output_dir) if not resuming else []
    if old:
        print(
            f"[minirope] {output_dir} holds checkpoints of an earlier run ({', '.join(path.name for path in old)}): "
            f"they are removed when training starts, as the Trainer would mix them with this run's (pass "
            f"--resume_from_checkpoint last to continue that run instead)."
        )


def checkpoint_folders(output_dir: str | Path) -> list[Path]:
    """The Trainer's `checkpoint-N` folders in `output_dir`, by step N, oldest first: the one reading of the names
    that the resume, the Hub resume and the clean-up share."""
    steps = {path: path.name.removeprefix("checkpoint-") for path in Path(output_dir).glob("checkpoint-*")}
    folders = [path for path, step in steps.items() if path.is_dir() and step.isdigit()]
    return sorted(folders, key=lambda path: int(steps[path]))


def remove_old_checkpoints(output_dir: str | Path) -> None:
    """Remove an earlier run's `checkpoint-N` folders from `output_dir` (announced by `check_previous_run`), on the main
    process, when a new run starts training: after every check of its data and flags has passed."""
    if PartialState().is_main_process:
        for path in checkpoint_folders(output_dir):
            shutil.rmtree(path)


def describe_finished(output_dir: Path) -> str:
    """One line naming the finished model in `output_dir` that this run will replace."""
    written = time.strftime("%Y-%m-%d %H:%M", time.localtime((output_dir / "config.json").stat().st_mtime))
    summary_file = output_dir / "run_summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.is_file() else {}
    score = summary.get("validation_bits_per_byte")
    what = f"written {written}" + (f", {score:.4f} bits/byte" if isinstance(score, float) else "")
    return (
        f"--output_dir {output_dir} holds a finished model ({what}): this run replaces it when it ends; "
        f"choose another --output_dir to keep it."
    )


def staging_dir(output_dir: str | Path) -> Path:
    """An empty `<output_dir>/.staging` for the final files."""
    staging = Path(output_dir) / ".staging"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    return staging


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def publish(staging: Path, output_dir: str | Path) -> None:
    """Move every file of `staging` into `output_dir`, the completeness markers last (see module doc)."""
    output_dir = Path(output_dir)
    for marker in MARKERS:
        (output_dir / marker).unlink(missing_ok=True)
    for path in sorted(staging.iterdir(), key=lambda path: path.name in MARKERS):
        target = output_dir / path.name
        if target.is_dir():
            shutil.rmtree(target)
        os.replace(path, target)
    staging.rmdir()


def finish_run(
    trainer, *, train_metrics: dict, eval_metrics: dict, card: ModelCard, summary: dict, lines: list[str]
) -> None:
    """Write the final folder atomically (model or adapter, tokenizer, metrics JSON, trainer state, loss
    curve, model card, run summary), push it to the Hub when `--push_to_hub` is set, and print `lines`.

    Call on every process (the model is gathered for FSDP); only the main process writes and prints.
    """
    from minirope.output.plots import plot_loss_curve

    output_dir = Path(trainer.args.output_dir)
    staging = output_dir / ".staging"
    if trainer.is_world_process_zero():
        staging_dir(output_dir)
    # The Trainer sets `use_cache` to `--use_cache` (False) for training; the published model decodes with a cache,
    # and says so in its generation config too (transformers' ExecuTorch integration refuses a model without it).
    trainer.model.config.use_cache = True
    if trainer.model.generation_config is not None:
        trainer.model.generation_config.use_cache = True
    # `_internal_call`: with --push_to_hub, the Trainer's own save_model would push the whole output folder, the
    # staged copies included, before the folder is complete; the one push is below, once the files are in place.
    trainer.save_model(str(staging), _internal_call=True)
    if trainer.is_world_process_zero():
        write_json(staging / "train_results.json", train_metrics)
        write_json(staging / "eval_results.json", eval_metrics)
        write_json(staging / "all_results.json", {**train_metrics, **eval_metrics})
        trainer.state.save_to_json(str(staging / "trainer_state.json"))
        plot_loss_curve(trainer.state.log_history, staging / "loss_curve.png", card.data.model_name)
        card.save(staging / "README.md")
        write_json(staging / "run_summary.json", summary)
        publish(staging, output_dir)
    if trainer.args.push_to_hub and trainer.is_world_process_zero():
        push_folder(trainer.args, output_dir)
    if trainer.is_world_process_zero():
        print("\n" + "\n".join(f"[minirope] {line}" for line in lines))


PUSH_MESSAGE = "minirope: end of training"
NOT_PUSHED = ["_*", "checkpoint-*", ".staging", ".hub-checkpoint"]  # as the Trainer's push skips, and the scratch


def upload(folder: Path, repo: str, message: str, *, token: str | None = None, private: bool | None = None,
           revision: str | None = None, ignore: list[str] | None = None) -> str:  # fmt: skip
    """Upload `folder` to the Hub repository `repo` (created if missing; `private` as `create_repo` takes it) in one
    commit with `message`, skipping the `ignore` glob patterns; returns the commit's URL. Nothing is saved again:
    what is on disk is what is uploaded.

    Raises:
        OSError: the upload failed (HTTP or transport); the message says the files are saved in `folder` and gives
            the `hf upload` command that uploads them.
    """
    from huggingface_hub import HfApi

    try:
        api = HfApi(token=token)
        api.create_repo(repo, private=private, exist_ok=True)
        commit = api.upload_folder(repo_id=repo, folder_path=folder, commit_message=message, revision=revision,
                                   ignore_patterns=ignore)  # fmt: skip
    except Exception as error:  # HTTP and transport errors alike: the folder is safe, say how to upload it
        present = [pattern for pattern in ignore or [] if "/" not in pattern and any(Path(folder).glob(pattern))]
        exclude = "".join(f" --exclude '{pattern}/*'" for pattern in present)
        raise OSError(
            f"the push to {repo} failed ({type(error).__name__}: {first_line(error)}); the model is saved in "
            f"{folder}/: upload it with `hf upload {repo} {folder}{exclude}`."
        ) from None
    return commit.commit_url


def push_folder(args: TrainingArguments, output_dir: Path) -> None:
    """Upload the published `output_dir` to `--hub_model_id` (the full id `check_push` set) in one commit, as it is
    on disk (`upload`): nothing is saved again (the Trainer's own `push_to_hub` would first
    re-save the model over the published folder); the checkpoints and scratch folders stay local.

    Raises:
        OSError: the push failed; the message says the files are saved and gives the command to upload them.
    """
    ignore = [*NOT_PUSHED, *(f"{pattern}/**" for pattern in NOT_PUSHED)]
    upload(output_dir, args.hub_model_id, PUSH_MESSAGE, token=args.hub_token, private=args.hub_private_repo,
           revision=args.hub_revision, ignore=ignore)  # fmt: skip
