"""The Hub as the commands meet it, through `huggingface_hub`: a push checked before any work, and a run resumed from
the checkpoint another machine pushed.

- `check_push`: with `--push_to_hub`, the token, the Hub and the right to write the repository are checked when the
  flags are parsed, so that a push that cannot happen is one line before training, not a traceback after it.
- `hub_checkpoint`: `--resume_from_checkpoint last` on a machine without a local checkpoint takes the repository's
  `last-checkpoint/` (pushed by `--hub_strategy checkpoint`, the Trainer's name for it) when the run pushes there.
"""

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from accelerate import PartialState
from huggingface_hub import HfApi, constants, get_token, snapshot_download
from huggingface_hub.errors import HfHubHTTPError, HFValidationError
from huggingface_hub.utils import validate_repo_id
from transformers import TrainingArguments

from minirope import owned
from minirope.folders import first_line
from minirope.output.folder import checkpoint_folders

HUB_CHECKPOINT = "last-checkpoint"  # where the Trainer pushes each checkpoint with --hub_strategy checkpoint


def hub_repo(args: TrainingArguments) -> str:
    """The repository a run pushes to, as `Trainer.init_hf_repo` names it: `--hub_model_id`, else the output
    folder's name (in the token's namespace). After `check_push`, the full `namespace/name` id."""
    return args.hub_model_id or Path(args.output_dir).absolute().name


def check_push(args: TrainingArguments) -> None:
    """With `--push_to_hub`, `check_write_access` for the run's repository (nothing is created or uploaded here), and
    `--hub_model_id` set to its full id (`namespace/name`): the one name the card, the resume and the push use.

    Raises:
        ValueError: see `check_write_access`.
    """
    if args.push_to_hub:
        args.hub_model_id = check_write_access(hub_repo(args), args.hub_token, "--push_to_hub")


def hub_address() -> str:
    """The Hub's address for messages: `HF_ENDPOINT` without any `user:password@` it embeds."""
    parts = urlsplit(constants.ENDPOINT)
    if not parts.hostname or "@" not in parts.netloc:
        return constants.ENDPOINT
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


class TokenNotSaved:
    """`TrainingArguments` mixin: `--hub_token` is never written to disk. The Trainer pickles its arguments as
    `training_args.bin` into every checkpoint and the final folder, and pushes it; transformers masks the token in
    logs and `to_dict`, not there. The pickled copy holds `hub_token` None; the running process keeps the token."""

    def __getstate__(self) -> dict:
        return {**self.__dict__, "hub_token": None}


def check_repo_id(repo: str, flag: str) -> None:
    """A repository id the Hub accepts (`huggingface_hub.utils.validate_repo_id`), checked when the flags are parsed.

    Raises:
        ValueError: naming the flag, the id and the rule.
    """
    try:
        validate_repo_id(repo)
    except HFValidationError as error:
        raise ValueError(f"{flag}: {repo!r} is not a Hub repository id ({first_line(error)}): give name or "
                         f"namespace/name, letters, digits, '-', '_' and '.'.") from None  # fmt: skip


def role(who: dict) -> str | None:
    """The token's role in `whoami`'s answer: `read`, `write` or `fineGrained`."""
    return who.get("auth", {}).get("accessToken", {}).get("role")


def writable(who: dict) -> tuple[set[str], set[str]]:
    """The namespaces (users, organizations) and the single repositories a token may write to, from `whoami`'s answer:
    a write token, the user and the organizations where the user's role is not read; a fine-grained token, the
    entities its scoped permissions give `repo.write`; a read token, none."""
    token = who.get("auth", {}).get("accessToken", {})
    if role(who) == "read":
        return set(), set()
    if role(who) != "fineGrained":
        return {who["name"]} | {org["name"] for org in who.get("orgs", []) if org.get("roleInOrg") != "read"}, set()
    namespaces, repos = set(), set()
    for scope in token.get("fineGrained", {}).get("scoped", []):
        if "repo.write" in scope.get("permissions", []):
            entity = scope.get("entity", {})
            (namespaces if entity.get("type") in ("user", "org") else repos).add(entity.get("name"))
    return namespaces, repos


def check_write_access(repo: str, token: str | None, flag: str) -> str:
    """A token (`token`, else `huggingface_hub`'s: HF_TOKEN or `hf auth login`), a Hub that answers and accepts it,
    a token that may write, and a namespace (user or organization) or repository it may write to, for pushing to
    `repo`. Returns the repository's full id (`namespace/name`; a bare name is in the token's user's namespace).

    Raises:
        ValueError: naming what is missing or refused, the Hub's address and the fix (`flag` names the option).
    """
    check_repo_id(repo, f"{flag} ({repo})" if flag != "--push_to_hub" else flag)
    token = token or get_token()
    if not token:
        raise ValueError(
            f"{flag} needs a Hugging Face token with write access to push {repo}: run `hf auth login` or set "
            f"HF_TOKEN, or run without {flag}."
        )
    try:
        who = HfApi().whoami(token=token)
    except HfHubHTTPError as error:
        status = error.response.status_code if error.response is not None else "no"
        raise ValueError(
            f"{flag}: the Hub at {hub_address()} refused the token (HTTP {status}): log in again with "
            f"`hf auth login` or set HF_TOKEN to a valid token."
        ) from None
    except Exception as error:  # the transport's own errors (connection refused, DNS, timeout, offline mode)
        raise ValueError(
            f"{flag}: the Hub at {hub_address()} cannot be reached ({type(error).__name__}: {error}): check "
            f"the network (or HF_ENDPOINT), or run without {flag} and upload later with `hf upload {repo} <folder>`."
        ) from None
    namespaces, repos = writable(who)
    if not namespaces and not repos:
        kind = "is read-only" if role(who) == "read" else "(fine-grained) may write to no repository"
        raise ValueError(
            f"{flag}: the token of {who['name']} {kind}: create one with write access "
            f"(huggingface.co/settings/tokens) and log in with it."
        )
    repo_id = repo if "/" in repo else f"{who['name']}/{repo}"
    if repo_id.split("/")[0] not in namespaces and repo_id not in repos:
        where = [f"{name}/" for name in sorted(namespaces)] + sorted(repos)
        raise ValueError(
            f"{flag}: the token of {who['name']} cannot write to {repo_id}: push to {' or '.join(where)}, or use a "
            f"token with write access to {repo_id.split('/')[0]}/."
        )
    return repo_id


def hub_checkpoint(args: TrainingArguments, complete: Callable[[Path], bool]) -> str | None:
    """The Hub's `last-checkpoint/` of the repository this run pushes to, downloaded into `<output_dir>/checkpoint-N`
    (N: its step), for `--resume_from_checkpoint last` on a machine that has no checkpoint of the run. None when the
    run does not push checkpoints (`--push_to_hub` with `--hub_strategy checkpoint`) or the repository has none.
    With several processes the main one downloads, the others wait and take the newest folder that is `complete`:
    the one it wrote (this runs only where no local checkpoint was complete).

    Raises:
        ValueError: the Hub cannot be reached or refuses (naming the repository).
    """
    strategy = getattr(args.hub_strategy, "value", args.hub_strategy)
    if not args.push_to_hub or strategy != "checkpoint":
        return None
    state = PartialState()
    target = download_checkpoint(args) if state.is_main_process else None
    state.wait_for_everyone()
    if not state.is_main_process:
        folders = [folder for folder in checkpoint_folders(args.output_dir) if complete(folder)]
        target = str(folders[-1]) if folders else None
    return target


def download_checkpoint(args: TrainingArguments) -> str | None:
    """`hub_checkpoint`'s download, on one process.

    Raises:
        ValueError: the Hub cannot be reached or refuses (naming the repository).
    """
    repo, token = hub_repo(args), args.hub_token or get_token()  # the full id: check_push ran first
    api = HfApi()
    try:
        if not api.file_exists(repo, f"{HUB_CHECKPOINT}/trainer_state.json", revision=args.hub_revision, token=token):
            return None
        download = Path(args.output_dir) / owned.MARKER_DIR / "hub-checkpoint"
        shutil.rmtree(download, ignore_errors=True)
        snapshot_download(repo, revision=args.hub_revision, allow_patterns=f"{HUB_CHECKPOINT}/*", local_dir=download,
                          token=token)  # fmt: skip
    except Exception as error:  # HTTP and transport errors alike: one line naming the repository
        raise ValueError(
            f"--resume_from_checkpoint last: cannot read {HUB_CHECKPOINT}/ of {repo} from the Hub at "
            f"{hub_address()} ({type(error).__name__}: {error}): check the network, or resume from a local "
            f"checkpoint folder."
        ) from None
    state = json.loads((download / HUB_CHECKPOINT / "trainer_state.json").read_text())
    step = state.get("global_step") if isinstance(state, dict) else None
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        shutil.rmtree(download, ignore_errors=True)
        raise ValueError(f"--resume_from_checkpoint last: {HUB_CHECKPOINT}/trainer_state.json of {repo} gives no step "
                         f"(global_step {step!r}): resume from a local checkpoint folder.")  # fmt: skip
    target = Path(args.output_dir) / f"checkpoint-{step}"
    if target.exists():  # a torn local checkpoint of that step: this run's own (`claim` took the folder)
        shutil.rmtree(target)
    (download / HUB_CHECKPOINT).rename(target)
    shutil.rmtree(download)
    owned.fsync_dir(args.output_dir)
    print(f"[minirope] no checkpoint in {args.output_dir}: resuming from {repo}'s {HUB_CHECKPOINT} (step {step}) on "
          f"the Hub, downloaded to {target}")  # fmt: skip
    return str(target)
