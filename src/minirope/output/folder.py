"""Writing a run's output folder: claiming it (only a folder minirope wrote, or a new or empty one, or the user's with
`--overwrite_output_dir`; one run at a time), and publishing the finished model whole (its card is
`minirope.output.card`'s).

What minirope may touch is `minirope.owned`'s rule: the entries the folder's marker lists. The final files are
first written to `<output_dir>/.staging` and fsynced; then a journal (`.minirope/publish.json`) naming them is written,
and each is moved into `output_dir` with `os.replace` (atomic on one filesystem), the weights next to last and
`config.json` last; then the journal goes. A kill before the journal leaves the previous model as it was; a kill
after it leaves the staged files whole, and the next command on the folder completes the publication first
(`complete_publish`). Checkpoints (`checkpoint-N/`) are the Trainer's own, rotated by `OwnFolder`.
"""

import io
import json
import os
import shutil
import time
from pathlib import Path

import torch
from accelerate import PartialState
from huggingface_hub import HfApi, ModelCard
from transformers import PreTrainedConfig, TrainingArguments
from transformers.trainer import TRAINING_ARGS_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, HubStrategy
from transformers.utils import PushInProgress

from minirope import owned
from minirope.configuration_minirope import ARCHITECTURE_FIELDS
from minirope.folders import first_line
from minirope.output.card import OwnModelCard

MARKERS = ("adapter_config.json", "config.json")  # moved last: their presence means "complete"
JOURNAL = f"{owned.MARKER_DIR}/publish.json"
STAGING = ".staging"


def claim(output_dir: str | Path, overwrite: bool, resuming: bool) -> None:
    """Whether this run may write `output_dir`, decided before any work and with nothing written (`begin_writing`
    takes it when the run starts writing): a folder minirope wrote (its marker), a new or empty one, or (`overwrite`,
    `--overwrite_output_dir`) the user's own folder, whose files the run then leaves as they are; never one holding an
    entry this run would replace that minirope did not write (a `config.json`, a `README.md`, another tool's
    `checkpoint-N`: `--resume_from_checkpoint` adopts those), nor one another run holds.

    Raises:
        ValueError: naming the folder, the entries and the fix; or the process that holds the folder.
    """
    folder = Path(output_dir)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"--output_dir {folder} is a file: choose a new or empty folder.")
    others = owned.foreign(folder)
    kept = [name for name in others if not (resuming and owned.CHECKPOINT.fullmatch(name))]
    clashing = [name for name in kept if owned.written_name(name)]
    if clashing:
        resume = any(owned.CHECKPOINT.fullmatch(name) for name in clashing)
        raise ValueError(
            f"--output_dir {folder} holds {owned.shown(clashing)}, which minirope did not write and this run would "
            f"replace: move them out, or choose another --output_dir (--overwrite_output_dir never replaces them)"
            + ("; or pass --resume_from_checkpoint last to continue the run those checkpoints hold." if resume else ".")
        )
    if kept and not owned.is_run(folder) and not overwrite:
        raise ValueError(
            f"--output_dir {folder} holds files that are not a minirope run ({owned.shown(kept)}): choose a new or "
            f"empty --output_dir, or pass --overwrite_output_dir to write the run among them (they are left as they "
            f"are)."
        )
    owned.check_free(folder)


def begin_writing(output_dir: str | Path, command: str, resuming: bool) -> None:
    """Take `output_dir` (checked by `claim`) when the run starts writing, on the main process of each machine: the
    lock (`owned.lock`: a second run is refused here at the latest), the marker (adopting the checkpoints a resume
    continues), a publication a killed run left unfinished completed first; then, for a new run (not `resuming`), the
    earlier run's `checkpoint-N` folders removed (`remove_old_checkpoints`, announced by `check_previous_run`).

    Raises:
        ValueError: another process holds the folder.
    """
    folder = Path(output_dir)
    if PartialState().is_local_main_process:
        adopted = [name for name in owned.foreign(folder) if owned.CHECKPOINT.fullmatch(name)] if resuming else []
        folder.mkdir(parents=True, exist_ok=True)
        owned.lock(folder, command)
        owned.record(folder, command, adopted)
        if complete_publish(folder):
            print(f"[minirope] {folder}: completed the publication of the model that an interrupted run had staged")
    if not resuming:
        remove_old_checkpoints(folder)


def check_previous_run(output_dir: str | Path, config: PreTrainedConfig, overwrite: bool, resuming: bool) -> None:
    """What a run does to the earlier run in its `output_dir` (`claim` has taken the folder), decided and said before
    any work.

    - A finished model of another architecture is refused (unless `overwrite`); one of the same architecture (or
      with `overwrite`) is replaced when the run ends, and a line says so now: re-running a command into its folder
      stays possible (`make demo` twice), never silent.
    - A new run (not `resuming`) will remove the earlier run's `checkpoint-N` folders when it starts training
      (`remove_old_checkpoints`), and a line names them now: the Trainer would mix them with its own.

    Raises:
        ValueError: naming the first differing field, unless `overwrite` (or `resuming`) is set.
    """
    output_dir = Path(output_dir)
    existing_file = output_dir / "config.json"
    if "config.json" in owned.owned(output_dir) and existing_file.is_file():
        existing = read_json(existing_file)
        new = config.to_dict()
        for field in ("model_type", *ARCHITECTURE_FIELDS):
            if not (overwrite or resuming) and field in existing and existing[field] != new.get(field):
                raise ValueError(
                    f"--output_dir {output_dir} already holds a different model ({field} {existing[field]!r}, "
                    f"this run {new.get(field)!r}): pass --overwrite_output_dir to replace it, or choose another "
                    f"--output_dir."
                )
        print(f"[minirope] {describe_finished(output_dir)}")
    old = own_checkpoints(output_dir) if not resuming else []
    if old:
        print(
            f"[minirope] {output_dir} holds checkpoints of an earlier run ({', '.join(path.name for path in old)}): "
            f"they are removed when training starts, as the Trainer would mix them with this run's (pass "
            f"--resume_from_checkpoint last to continue that run instead)."
        )


def read_json(path: Path) -> dict:
    """A JSON object minirope wrote, or {} where it is torn or not an object (a kill, a hand edit)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def checkpoint_folders(output_dir: str | Path) -> list[Path]:
    """The Trainer's `checkpoint-N` folders in `output_dir` (N digits only), by step N, oldest first: the one reading
    of the names that the resume, the Hub resume, the rotation and the clean-up share."""
    folders = [path for path in Path(output_dir).glob("checkpoint-*") if owned.CHECKPOINT.fullmatch(path.name)]
    return sorted((path for path in folders if path.is_dir() and not path.is_symlink()),
                  key=lambda path: int(path.name.removeprefix("checkpoint-")))  # fmt: skip


def own_checkpoints(output_dir: str | Path) -> list[Path]:
    """The `checkpoint-N` folders of `output_dir` that minirope wrote (`owned.owned`), oldest first."""
    mine = owned.owned(output_dir)
    return [path for path in checkpoint_folders(output_dir) if path.name in mine]


def remove_old_checkpoints(output_dir: str | Path) -> None:
    """Remove an earlier run's `checkpoint-N` folders from `output_dir` (announced by `check_previous_run`), on the main
    process, when a new run starts training: after every check of its data and flags has passed."""
    if PartialState().is_main_process:
        removed = own_checkpoints(output_dir)
        for path in removed:
            shutil.rmtree(path)
        owned.forget(output_dir, {path.name for path in removed})


def describe_finished(output_dir: Path) -> str:
    """One line naming the finished model in `output_dir` that this run will replace."""
    written = time.strftime("%Y-%m-%d %H:%M", time.localtime((output_dir / "config.json").stat().st_mtime))
    score = read_json(output_dir / "run_summary.json").get("validation_bits_per_byte")
    what = f"written {written}" + (f", {score:.4f} bits/byte" if isinstance(score, float) else "")
    return (
        f"--output_dir {output_dir} holds a finished model ({what}): this run replaces it when it ends; "
        f"choose another --output_dir to keep it."
    )


def staging_dir(output_dir: str | Path) -> Path:
    """An empty `<output_dir>/.staging` for the final files (`claim` has completed any publication pending)."""
    staging = Path(output_dir) / STAGING
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    return staging


def json_text(data: dict) -> str:
    """The text of a JSON file a run writes (and pushes): indented, keys sorted, one final newline."""
    return json.dumps(data, indent=2, sort_keys=True, default=str) + "\n"


def write_json(path: Path, data: dict) -> None:
    path.write_text(json_text(data))


def publish(staging: Path, output_dir: str | Path, command: str) -> None:
    """Publish every entry of `staging` into `output_dir` (see the module doc): fsync the staged files, write the
    journal, move them in, remove what the previous publication wrote that this one does not (its adapter beside
    new full weights, say), and drop the journal."""
    output_dir = Path(output_dir)
    owned.fsync_tree(staging)
    names = sorted(path.name for path in staging.iterdir())
    previous = owned.read_marker(output_dir) or {}
    stale = sorted(set(previous.get("published", [])) - set(names))
    owned.record(output_dir, command, names, published=names)  # listed before they land: a kill leaves them owned
    owned.write_atomic(output_dir / JOURNAL, json.dumps({"names": names, "stale": stale}) + "\n")
    complete_publish(output_dir)


def complete_publish(output_dir: Path) -> bool:
    """Finish the publication whose journal is in `output_dir` (a run killed while publishing); whether there was one.
    Each move is atomic and the journal names only staged files that were fsynced, so it can be repeated from any
    point: an entry no longer staged has landed already."""
    journal = read_json(output_dir / JOURNAL)
    if not journal:
        (output_dir / JOURNAL).unlink(missing_ok=True)
        return False
    staging, mine = output_dir / STAGING, set((owned.read_marker(output_dir) or {}).get("files", []))
    weights = lambda name: name.endswith(".safetensors") or name.endswith(".index.json")  # noqa: E731
    for name in sorted(journal.get("names", []), key=lambda name: (name in MARKERS, weights(name))):
        source, target = staging / name, output_dir / name
        if not source.exists() or name not in mine:
            continue
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        os.replace(source, target)
    for name in journal.get("stale", []):
        target = output_dir / name
        if name in mine and target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif name in mine:
            target.unlink(missing_ok=True)
    owned.forget(output_dir, journal.get("stale", []))
    owned.fsync_dir(output_dir)
    shutil.rmtree(staging, ignore_errors=True)
    (output_dir / JOURNAL).unlink()
    owned.fsync_dir(output_dir / owned.MARKER_DIR)
    return True


def finish_run(trainer, *, train_metrics: dict, eval_metrics: dict, card: ModelCard, summary: dict, lines: list[str],
               command: str, push_data: bool = False) -> None:  # fmt: skip
    """Write the final folder whole (model or adapter, tokenizer, metrics JSON, trainer state, loss curve, model card,
    run summary: `publish`), push what it wrote for the model to the Hub when `--push_to_hub` is set (`push_folder`;
    the user's rows only with `push_data`), and print `lines`.

    Call on every process (the model is gathered for FSDP); only the main process writes and prints.
    """
    from minirope.output.plots import plot_loss_curve

    output_dir = Path(trainer.args.output_dir)
    staging = output_dir / STAGING
    begin_writing(output_dir, command, resuming=True)  # taken already where the run trained
    if trainer.is_world_process_zero():
        staging_dir(output_dir)
    trainer.accelerator.wait_for_everyone()  # the staging folder exists, empty, before any process saves into it
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
        publish(staging, output_dir, command)
    if trainer.args.push_to_hub and trainer.is_world_process_zero():
        push_folder(trainer.args, output_dir, push_data)
    if trainer.is_world_process_zero():
        print("\n" + "\n".join(f"[minirope] {line}" for line in lines))
    owned.unlock(output_dir)  # the run is over: a later command of this process, or another, may take the folder


PUSH_MESSAGE = "minirope: end of training"
DATA_FILES = ("preference_pairs.jsonl",)  # the user's rows, pushed only when asked (`--push_data True`)
DATA_KEYS = ("samples",)  # in `run_summary.json`: the held-out prompts with the model's replies, likewise
LOCAL_KEYS = ("output_dir",)  # a path on this machine: meaningless on the Hub, and it names the user's folders


def public(data):
    """`data` without the `DATA_KEYS` and `LOCAL_KEYS` at any depth: a run summary as pushed without `--push_data`."""
    if isinstance(data, dict):
        return {key: public(value) for key, value in data.items() if key not in (*DATA_KEYS, *LOCAL_KEYS)}
    return [public(value) for value in data] if isinstance(data, list) else data


def upload(folder: Path, repo: str, message: str, files: list[str], *, token: str | None = None,
           private: bool | None = None, revision: str | None = None, replace: dict[str, bytes] | None = None,
           path_in_repo: str = "") -> str:  # fmt: skip
    """Upload the `files` of `folder` (top-level names; a folder's files below it) to the Hub repository `repo`
    (created if missing, `private` as `create_repo` takes it) in one commit with `message`, under `path_in_repo`;
    `replace` gives other bytes for some of them. Returns the commit's URL. Nothing is saved again and nothing else
    is uploaded: no dotfile, no file of the user's beside the model.

    Raises:
        OSError: the upload failed (HTTP or transport); the message says the files are saved in `folder` and gives
            the `hf upload` command that uploads them.
    """
    from huggingface_hub import CommitOperationAdd, HfApi

    paths = []
    for name in files:
        path = Path(folder) / name
        if path.is_file() and not path.is_symlink():
            paths.append(path)
        elif path.is_dir() and not path.is_symlink():
            paths += sorted(p for p in path.rglob("*") if p.is_file() and not p.is_symlink())
    operations = [
        CommitOperationAdd(
            path_in_repo="/".join(filter(None, [path_in_repo, path.relative_to(folder).as_posix()])),
            path_or_fileobj=(replace or {}).get(path.relative_to(folder).as_posix(), path),
        )
        for path in paths
    ]
    try:
        api = HfApi(token=token)
        api.create_repo(repo, private=private, exist_ok=True)
        commit = api.create_commit(repo, operations, commit_message=message, revision=revision)
    except Exception as error:  # HTTP and transport errors alike: the folder is safe, say how to upload it
        include = "".join(f" --include '{name}'" for name in files)
        raise OSError(
            f"the push to {repo} failed ({type(error).__name__}: {first_line(error)}); the model is saved in "
            f"{folder}/: upload it with `hf upload {repo} {folder}{include}`."
        ) from None
    return commit.commit_url


def visibility(private: bool | None) -> str:
    """How a push's line names the repository's visibility."""
    return {True: "private", False: "public"}.get(private, "at the account's default visibility")


def push_folder(args: TrainingArguments, output_dir: Path, push_data: bool = False) -> None:
    """Upload what the run published in `output_dir` (its marker's `published` entries) to `--hub_model_id` (the full
    id `check_push` set) in one commit, as it is on disk: nothing is saved again, and the checkpoints, scratch
    folders, dotfiles and files of the user's stay local. Without `push_data`, the user's rows stay local too
    (`DATA_FILES`, `DATA_KEYS` in the run summary).

    Raises:
        OSError: the push failed; the message says the files are saved and gives the command to upload them.
    """
    files = list((owned.read_marker(output_dir) or {}).get("published", []))
    replace = {}
    if push_data:
        files += [name for name in DATA_FILES if (output_dir / name).is_file()]
    elif "run_summary.json" in files:
        summary = read_json(output_dir / "run_summary.json")
        replace["run_summary.json"] = json_text(public(summary)).encode()
    url = upload(output_dir, args.hub_model_id, PUSH_MESSAGE, files, token=args.hub_token,
                 private=args.hub_private_repo, revision=args.hub_revision, replace=replace)  # fmt: skip
    print(f"[minirope] pushed to {args.hub_model_id} ({visibility(args.hub_private_repo)}): {url}")


# What a checkpoint holds besides the model: pushed with the checkpoint (`last-checkpoint/`), never as the model.
CHECKPOINT_STATE = ("optimizer.pt", "scheduler.pt", "scaler.pt", "rng_state*.pth", "trainer_state.json", "keep_best.*",
                    "stream_state.json")  # fmt: skip


class OwnFolder(OwnModelCard):
    """Trainer mixin: the Trainer's checkpoints as minirope's folder rules want them (transformers' own, in
    `Trainer._save_checkpoint` and `_push_from_checkpoint`, differ on four points).

    - A callback's extras of a checkpoint (the stream's position, keep-the-best state: a `save_to_checkpoint(folder,
      args, state)` method) are written before the Trainer's `trainer_state.json`, which marks it complete.
    - The checkpoint is fsynced before an older one is removed, so a power loss leaves one complete checkpoint.
    - The rotation (`--save_total_limit`) removes this run's `checkpoint-<digits>` folders only: the Trainer's removes
      any `checkpoint-*` folder, a user's own `checkpoint-600-keep` included.
    - A push during training (`--hub_strategy every_save`, `checkpoint`, `all_checkpoints`) uploads from the checkpoint
      folder: the Trainer's first copies the checkpoint's config and weights over the published folder in
      `output_dir` (new weights beside the previous run's card), through any symlink there.
    """

    def _save_checkpoint(self, model, trial) -> None:
        run_dir = Path(self._get_output_dir(trial=trial))
        folder = run_dir / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        if self.args.should_save:
            folder.mkdir(parents=True, exist_ok=True)
            for callback in self.callback_handler.callbacks:
                if hasattr(callback, "save_to_checkpoint"):
                    callback.save_to_checkpoint(folder, self.args, self.state)
        limit, self.args.save_total_limit = self.args.save_total_limit, None  # the rotation is the one below
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self.args.save_total_limit = limit
        if self.args.should_save:
            saved = io.BytesIO()
            torch.save(self.args, saved)  # as the Trainer saved it, with the limit restored
            owned.write_atomic(folder / TRAINING_ARGS_NAME, saved.getvalue())
            owned.fsync_tree(folder)
            rotate_checkpoints(run_dir, limit, self.state.best_model_checkpoint)

    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        args = self.args
        if not self.is_world_process_zero() or args.hub_strategy == HubStrategy.END:
            return
        if not args.hub_always_push and self.push_in_progress is not None and not self.push_in_progress.is_done():
            return
        self.callback_handler.on_push_begin(args, self.state, self.control)
        message = f"Training in progress, step {self.state.global_step}"
        common = {"repo_id": self.hub_model_id, "folder_path": checkpoint_folder, "token": args.hub_token,
                  "run_as_future": True, "revision": args.hub_revision}  # fmt: skip
        jobs = [HfApi().upload_folder(**common, commit_message=message, ignore_patterns=[*CHECKPOINT_STATE, ".*"])]
        if args.hub_strategy in (HubStrategy.CHECKPOINT, HubStrategy.ALL_CHECKPOINTS):
            name = "last-checkpoint" if args.hub_strategy == HubStrategy.CHECKPOINT else Path(checkpoint_folder).name
            jobs.append(HfApi().upload_folder(**common, path_in_repo=name, commit_message=f"{message}, checkpoint",
                                              ignore_patterns=[".*"]))  # fmt: skip
        if self.push_in_progress is None or self.push_in_progress.is_done():
            self.push_in_progress = PushInProgress(jobs)
        else:
            self.push_in_progress.jobs.extend(jobs)


def rotate_checkpoints(run_dir: Path, limit: int | None, best: str | None) -> None:
    """Keep the newest `limit` of this run's `checkpoint-<digits>` folders in `run_dir` (and the best one, as the
    Trainer does), removing the older ones; no limit keeps all."""
    if not limit or limit <= 0:
        return
    folders = own_checkpoints(run_dir)
    keep = {*folders[-limit:], *([Path(best)] if best else [])}
    removed = [path for path in folders if path not in keep]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    if removed:
        owned.forget(run_dir, {path.name for path in removed})
