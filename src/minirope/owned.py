"""What a command may touch in a folder: only what it wrote itself, one run at a time, each write durable.

- **The marker.** Every folder a command writes carries `.minirope/run.json`: the command, when it last ran, and the
  top-level entries it wrote (`files`). A folder is minirope's only by that marker (or, for folders written before the
  marker existed, by the whole set of files a finished run leaves: `LEGACY_RUN`), never by one common name such as
  `runs/`, `config.json` or `README.md`; a command replaces or removes only the entries its marker lists.
- **The lock.** A training run holds `.minirope/lock` with `fcntl.flock` for its life: the kernel releases it when the
  process ends, however it ends, so a second run on a folder in use is refused (naming the process that holds it) and
  a killed run's folder is never locked for ever.
- **Durable writes.** `write_atomic` writes a scratch file beside the target, fsyncs it, renames it over the target
  and fsyncs the folder, so a kill or a power loss leaves the old file or the new one, whole.
"""

import errno
import fcntl
import fnmatch
import json
import os
import re
import socket
import time
from pathlib import Path

MARKER_DIR = ".minirope"
MARKER = f"{MARKER_DIR}/run.json"
LOCK = f"{MARKER_DIR}/lock"
CHECKPOINT = re.compile(r"checkpoint-\d+")  # the Trainer's own checkpoint folders; `checkpoint-600-keep` is not one
# The top-level names a minirope command writes into an output folder (a model's files, a run's metrics and
# checkpoints): an entry by one of these names that minirope did not write is the user's, and is never replaced.
WRITTEN_NAMES = (
    "config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json", "adapter_config.json",
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "vocab.json",
    "merges.txt", "README.md", "*_results.json", "run_summary.json", "trainer_state.json", "loss_curve.png",
    "training_args.bin", "*_minirope.py", "preference_pairs.jsonl", "held_out_prompts.json", "_warm_start", ".staging",
    "model.onnx", "model.onnx.data", "model.pte",
)  # fmt: skip
# What every finished run wrote before the marker existed (`finish_run`): a folder holding all of these is an earlier
# run's, and the entries of it that `WRITTEN_NAMES` covers are taken as its own.
LEGACY_RUN = ("README.md", "run_summary.json", "trainer_state.json", "all_results.json")
_HELD: dict[Path, int] = {}  # folder -> the open lock file: held until the process ends


def fsync_dir(folder: str | Path) -> None:
    """Flush a folder's entries (a rename or a new file in it) to disk."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: str | Path) -> None:
    """Flush every file under `path` (a file or a folder) and every folder's entries to disk."""
    path = Path(path)
    if path.is_file():
        with open(path, "rb+") as file:
            os.fsync(file.fileno())
        return
    for folder, _, files in os.walk(path):
        for name in files:
            with open(Path(folder) / name, "rb+") as file:
                os.fsync(file.fileno())
        fsync_dir(folder)


def write_atomic(path: str | Path, data: bytes | str) -> None:
    """Write `data` to `path` whole or not at all: a scratch file beside it, fsynced, renamed over it, the folder
    fsynced. A symlink at `path` is replaced by the file, never written through."""
    path = Path(path)
    scratch = path.with_name(f".{path.name}.{os.getpid()}.partial")
    with open(scratch, "wb") as file:
        file.write(data.encode() if isinstance(data, str) else data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(scratch, path)
    fsync_dir(path.parent)


def read_marker(folder: str | Path) -> dict | None:
    """The folder's marker (`{"command", "updated", "files"}`), or None where minirope has not marked it."""
    marker = Path(folder) / MARKER
    if not marker.is_file():
        return None
    try:
        data = json.loads(marker.read_text())
    except (ValueError, UnicodeDecodeError):
        return None
    ok = isinstance(data, dict) and isinstance(data.get("files"), list)
    return {**data, "files": [str(name) for name in data["files"]]} if ok else None


def written_name(name: str) -> bool:
    """Whether `name` is one a minirope command writes at an output folder's top level (`WRITTEN_NAMES`)."""
    return CHECKPOINT.fullmatch(name) is not None or any(
        fnmatch.fnmatchcase(name, pattern) for pattern in WRITTEN_NAMES
    )


def owned(folder: str | Path) -> set[str]:
    """The top-level entries of `folder` that minirope wrote: those its marker lists, the run's `checkpoint-N`
    folders in a marked folder (the Trainer makes them during the run), or, in a folder an earlier minirope left
    without a marker (`LEGACY_RUN`), every entry by a name minirope writes."""
    folder = Path(folder)
    if not folder.is_dir():
        return set()
    present = {path.name for path in folder.iterdir()}
    marker = read_marker(folder)
    if marker is not None:
        scratch = {".staging"}  # the publication's staging folder, in marked folders only
        return (
            (set(marker["files"]) & present)
            | {name for name in present if CHECKPOINT.fullmatch(name)}
            | (scratch & present)
        )
    if all(name in present for name in LEGACY_RUN):
        return {name for name in present if written_name(name)}
    return set()


def is_run(folder: str | Path) -> bool:
    """Whether minirope wrote `folder` (its marker, or an earlier minirope's finished run)."""
    folder = Path(folder)
    return (folder / MARKER).is_file() or (folder.is_dir() and all((folder / name).exists() for name in LEGACY_RUN))


def foreign(folder: str | Path) -> list[str]:
    """The entries of `folder` that are not minirope's (the marker folder aside), sorted."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    mine = owned(folder) | {MARKER_DIR}
    return sorted(path.name for path in folder.iterdir() if path.name not in mine)


def shown(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def protected_places(inputs: dict[str, str | None] | None = None) -> dict[Path, str]:
    """The folders no command removes or replaces whole: the filesystem root, the home folder, the working directory
    and each of its parents, and each input (flag -> path) with its parents."""
    places = {Path("/").resolve(): "the filesystem root", Path.home().resolve(): "the home folder"}
    cwd = Path.cwd().resolve()
    places[cwd] = "the working directory"
    places.update({parent: "a parent of the working directory" for parent in cwd.parents if parent not in places})
    for flag, path in (inputs or {}).items():
        if path:
            source = Path(path).expanduser().resolve()
            places.update({place: f"holds {flag} {path}" for place in (source, *source.parents) if place not in places})
    return places


def check_replaceable(output: str | Path, flag: str, inputs: dict[str, str | None] | None = None) -> None:
    """Refuse to replace `output` whole unless minirope wrote every entry in it: never a protected place
    (`protected_places`), a folder of the user's, a folder minirope wrote that the user has added files to, or a
    file that is not the same kind of export (`.gguf` files are replaced only by a GGUF file).

    Raises:
        ValueError: one line naming `flag`, the path, what it holds and the fix.
    """
    output = Path(output).expanduser()
    target = output.absolute().resolve()
    what = protected_places(inputs).get(target)
    if what:
        raise ValueError(f"{flag} {output} is {what}: it is never replaced; choose a new folder for {flag}.")
    if not output.exists() or (output.is_dir() and not any(output.iterdir())):
        return  # a new path, or an empty folder: nothing of anybody's is replaced
    if output.is_file():
        with open(output, "rb") as file:
            kind = file.read(4)
        if output.suffix == ".gguf" and kind == b"GGUF":
            return
        raise ValueError(f"{flag} {output} is a file minirope did not write: choose another {flag}.")
    if not is_run(output):
        raise ValueError(
            f"{flag} {output} holds files minirope did not write ({shown(sorted(p.name for p in output.iterdir()))}): "
            f"--overwrite replaces only a folder minirope wrote; choose a new or empty {flag}."
        )
    others = foreign(output)
    if others:
        raise ValueError(
            f"{flag} {output} holds files minirope did not write beside its own ({shown(others)}): move them out, or "
            f"choose another {flag}; --overwrite replaces only what minirope wrote."
        )


def record(folder: str | Path, command: str, files: list[str] | set[str] = (), **fields) -> None:
    """Mark `folder` as written by `command`, adding `files` (top-level names) to what its marker lists, and setting
    `fields` (`published`: the entries of the last publication)."""
    folder = Path(folder)
    (folder / MARKER_DIR).mkdir(parents=True, exist_ok=True)
    marker = read_marker(folder) or {"files": sorted(owned(folder))}
    listed = sorted(set(marker["files"]) | set(files))
    data = {**marker, **fields, "command": command, "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "files": listed}
    write_atomic(folder / MARKER, json.dumps(data, indent=2) + "\n")


def forget(folder: str | Path, files: list[str] | set[str]) -> None:
    """Remove `files` from what the marker of `folder` lists (they were removed)."""
    marker = read_marker(folder)
    if marker is not None:
        marker["files"] = sorted(set(marker["files"]) - set(files))
        write_atomic(Path(folder) / MARKER, json.dumps(marker, indent=2) + "\n")


def take(fd: int, folder: Path) -> None:
    """`fcntl.flock` the open lock file `fd` of `folder` without waiting.

    Raises:
        ValueError: another process holds it (naming the process, as its lock file says); `fd` is closed then.
    """
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another process"
        os.close(fd)
        if error.errno not in (errno.EAGAIN, errno.EACCES):
            raise
        raise ValueError(
            f"--output_dir {folder} is in use by {holder}: wait for it to finish, or choose another --output_dir."
        ) from None


def lock(folder: str | Path, command: str) -> None:
    """Hold `folder` for this process's life (`fcntl.flock` on `.minirope/lock`, released by the kernel when the
    process ends); the lock file names the holder. Taking it twice in one process is a no-op.

    Raises:
        ValueError: another process holds it (naming that process and its command).
    """
    folder = Path(folder).absolute()
    if folder in _HELD:
        return
    (folder / MARKER_DIR).mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    take(fd, folder)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"process {os.getpid()} on {socket.gethostname()} ({command})\n".encode(), 0)
    _HELD[folder] = fd


def check_free(folder: str | Path) -> None:
    """Refuse a folder another process holds (`lock`), taking nothing: a held lock file is only tried.

    Raises:
        ValueError: naming the process that holds it.
    """
    path = Path(folder) / LOCK
    if Path(folder).absolute() in _HELD or not path.is_file():
        return
    fd = os.open(path, os.O_RDWR)
    take(fd, Path(folder))
    os.close(fd)  # closing releases the lock taken to try it


def unlock(folder: str | Path) -> None:
    """Release the lock `lock` took on `folder` (the end of a process does it too)."""
    fd = _HELD.pop(Path(folder).absolute(), None)
    if fd is not None:
        os.close(fd)
