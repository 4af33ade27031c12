"""Which checkpoint a run resumes from, checked before it is used.

The Trainer writes a checkpoint file by file (weights, optimizer, scheduler, RNG states, `trainer_state.json`), so a
crash can leave one cut short, and a copy can truncate a file. Every file a resume reads is checked here first
(safetensors headers against the file size, the zip archives `torch.save` writes, JSON), so that a bad checkpoint is
one line naming the file and the fix, not a traceback after the model and data are ready; and
`--resume_from_checkpoint last` passes over a bad checkpoint, with a warning, to the newest good one.
"""

import json
import logging
import struct
import zipfile
from pathlib import Path

from transformers import PreTrainedConfig, TrainingArguments

from minirope.configuration_minirope import ARCHITECTURE_FIELDS
from minirope.output.folder import checkpoint_folders
from minirope.output.hub import hub_checkpoint

logger = logging.getLogger(__name__)
STATE = "trainer_state.json"
STREAM_STATE = "stream_state.json"  # in each checkpoint of a streaming run: the stream's position
EXTRAS = (STREAM_STATE, "keep_best.json")  # written before STATE by `OwnFolder`; each read by a resume


def safetensors_problem(path: Path) -> str | None:
    """Why a safetensors file is unreadable (a header length past the file's end, a header that does not parse or
    is not the format's mapping, or data shorter than it says), or None. Nothing larger than the file is read."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as file:
            (length,) = struct.unpack("<Q", file.read(8))
            if 8 + length > size:
                return f"its header length ({length} bytes) runs past the file's {size} bytes"
            header = json.loads(file.read(length))
        ends = [entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"]
        end = max((int(value) for value in ends), default=0)
    except (struct.error, ValueError, UnicodeDecodeError, AttributeError, TypeError, KeyError, IndexError):
        return "its header does not parse"
    return f"it holds {size} bytes of the {8 + length + end} its header describes" if size < 8 + length + end else None


def checkpoint_problem(folder: Path) -> str | None:
    """The first file of a checkpoint that a resume could not read, with the reason; None if all are readable."""
    state = folder / STATE
    if not state.is_file():
        return f"{state} is missing (the checkpoint was cut short)"
    for path in [state, *(folder / name for name in EXTRAS)]:
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError):
            return f"{path} is not JSON"
        if path == state and not (isinstance(data, dict) and type(data.get("global_step")) is int):
            return f"{state} gives no step (global_step)"
    # What the Trainer wrote before trainer_state.json; which files there are depends on the run (sharded weights,
    # FSDP's sharded state, --save_only_model), so each one present is checked, none is required.
    for path in sorted(folder.glob("*.safetensors")):
        if problem := safetensors_problem(path):
            return f"{path} is truncated or corrupt: {problem}"
    for path in [folder / "optimizer.pt", folder / "scheduler.pt", *sorted(folder.glob("rng_state*.pth"))]:
        if not path.is_file():
            continue
        try:
            with zipfile.ZipFile(path) as archive:
                bad = archive.testzip()
        except (zipfile.BadZipFile, OSError):
            bad = "its archive"
        if bad:
            return f"{path} is truncated or corrupt ({bad} does not read back)"
    return None


def last_complete_checkpoint(output_dir: str | Path) -> str | None:
    """The newest `checkpoint-N` in `output_dir` that a resume can read (`checkpoint_problem`); each newer one is
    passed over with a warning naming its problem."""
    for folder in reversed(checkpoint_folders(output_dir)):
        problem = checkpoint_problem(folder)
        if problem is None:
            return str(folder)
        logger.warning("passing over %s: %s", folder, problem)
    return None


def resume_requested(training_args: TrainingArguments) -> bool:
    """Whether `--resume_from_checkpoint` asks for a resume (a folder, `last` or `True`; not empty or `False`)."""
    return training_args.resume_from_checkpoint not in (None, "", "False", "false")


def resolve_resume(training_args: TrainingArguments) -> str | None:
    """`--resume_from_checkpoint last` (or `True`) means the newest readable `checkpoint-N` in `--output_dir`, else
    (with `--push_to_hub --hub_strategy checkpoint`) the Hub's `last-checkpoint` of the run (`hub_checkpoint`).

    Raises:
        FileNotFoundError: no such checkpoint folder, or (`last`) none that can be read.
        ValueError: a given checkpoint with a missing, truncated or corrupt file (naming it).
    """
    resume = training_args.resume_from_checkpoint
    if not resume_requested(training_args):
        return None
    if resume in ("last", "True", "true"):
        last = last_complete_checkpoint(training_args.output_dir)  # each one checked by checkpoint_problem
        if last is None:
            last = hub_checkpoint(training_args, lambda folder: checkpoint_problem(folder) is None)
            if last is None:
                raise FileNotFoundError(
                    f"no complete checkpoint-N folder in {training_args.output_dir} to resume from (nor on the Hub: "
                    f"a run with --push_to_hub --hub_strategy checkpoint pushes its last checkpoint there)."
                )
            if problem := checkpoint_problem(Path(last)):  # the download, checked as a local one is
                raise ValueError(f"--resume_from_checkpoint last: {last} cannot be resumed: {problem}.")
        return last
    if not Path(resume).is_dir():
        raise FileNotFoundError(f"--resume_from_checkpoint {resume} is not a checkpoint folder: check the path.")
    if problem := checkpoint_problem(Path(resume)):
        raise ValueError(
            f"--resume_from_checkpoint {resume} cannot be resumed: {problem}; resume from an earlier checkpoint, or "
            f"--resume_from_checkpoint last to take the newest good one."
        )
    return resume


def check_resume(resume: str | None, config: PreTrainedConfig, max_steps: int, streaming: bool = False) -> None:
    """Refuse to resume a checkpoint of another model, one past `--max_steps`, or (`streaming`) one without the
    stream's position. One at `--max_steps` (a run stopped after its last checkpoint) is measured and written.

    Raises:
        ValueError: naming the first architecture field that differs (both values), the steps, or the file.
    """
    if resume is None:
        return
    if streaming:
        read_stream_state(resume)
    config_file = Path(resume) / "config.json"
    saved = json.loads(config_file.read_text()) if config_file.is_file() else {}
    new = config.to_dict()
    for field in ARCHITECTURE_FIELDS:
        if field in saved and saved[field] != new.get(field):
            raise ValueError(
                f"--resume_from_checkpoint {resume} holds another model ({field} {saved[field]!r}, this run "
                f"{new.get(field)!r}): resume with the flags it was trained with, or train without resuming."
            )
    step = json.loads((Path(resume) / STATE).read_text()).get("global_step", 0)
    if 0 < max_steps < step:
        raise ValueError(
            f"--resume_from_checkpoint {resume} is at step {step}, and --max_steps is {max_steps}: nothing is left to "
            f"train; raise --max_steps to train further."
        )
    if step == max_steps:  # a run stopped after its last checkpoint (killed while it measured or wrote the folder)
        print(f"[minirope] {resume} is at --max_steps ({step}): nothing is left to train; it is measured and written "
              f"as the finished model")  # fmt: skip


def read_stream_state(checkpoint: str | Path) -> dict:
    """The stream's position saved in `checkpoint` (`minirope.training.trainer.StreamPosition`).

    Raises:
        ValueError: the checkpoint holds none (not a streaming run's).
    """
    state_file = Path(checkpoint) / STREAM_STATE
    if not state_file.is_file():
        raise ValueError(
            f"--resume_from_checkpoint {checkpoint} holds no {STREAM_STATE}, the stream's position: resume a streaming "
            f"run from a checkpoint of a streaming run."
        )
    return json.loads(state_file.read_text())
