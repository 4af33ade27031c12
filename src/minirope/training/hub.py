"""The Hub as the commands meet it, through `huggingface_hub`: a push checked before any work, and a run resumed from
the checkpoint another machine pushed.

- `check_push`: with `--push_to_hub`, the token, the Hub and the right to write the repository are checked when the
  flags are parsed, so that a push that cannot happen is one line before training, not a traceback after it.
- `hub_checkpoint`: `--resume_from_checkpoint last` on a machine without a local checkpoint takes the repository's
  `last-checkpoint/` (pushed by `--hub_strategy checkpoint`, the Trainer's name for it) when the run pushes there.
"""

import json
import shutil
from pathlib import Path

from huggingface_hub import HfApi, constants, get_token, snapshot_download
from huggingface_hub.errors import HfHubHTTPError
from transformers import TrainingArguments

HUB_CHECKPOINT = "last-checkpoint"  # where the Trainer pushes each checkpoint with --hub_strategy checkpoint


def hub_repo(args: TrainingArguments) -> str:
    """The repository a run pushes to, as `Trainer.init_hf_repo` names it: `--hub_model_id`, else the output
    folder's name (in the token's namespace)."""
    return args.hub_model_id or Path(args.output_dir).absolute().name


def check_push(args: TrainingArguments) -> None:
    """With `--push_to_hub`, `check_write_access` for the run's repository (nothing is created or uploaded here).

    Raises:
        ValueError: see `check_write_access`.
    """
    if args.push_to_hub:
        check_write_access(hub_repo(args), args.hub_token, "--push_to_hub")


def check_write_access(repo: str, token: str | None, flag: str) -> None:
    """A token (`token`, else `huggingface_hub`'s: HF_TOKEN or `hf auth login`), a Hub that answers and accepts it,
    a token that may write, and a namespace (user or organization) it may write to, for pushing to `repo`.

    Raises:
        ValueError: naming what is missing or refused, the Hub's address and the fix (`flag` names the option).
    """
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
            f"{flag}: the Hub at {constants.ENDPOINT} refused the token (HTTP {status}): log in again with "
            f"`hf auth login` or set HF_TOKEN to a valid token."
        ) from None
    except Exception as error:  # the transport's own errors (connection refused, DNS, timeout, offline mode)
        raise ValueError(
            f"{flag}: the Hub at {constants.ENDPOINT} cannot be reached ({type(error).__name__}: {error}): check "
            f"the network (or HF_ENDPOINT), or run without {flag} and upload later with `hf upload {repo} <folder>`."
        ) from None
    if who.get("auth", {}).get("accessToken", {}).get("role") == "read":
        raise ValueError(
            f"{flag}: the token of {who['name']} is read-only: create one with write access "
            f"(huggingface.co/settings/tokens) and log in with it."
        )
    namespace = repo.split("/")[0] if "/" in repo else who["name"]
    writable = {who["name"]} | {org["name"] for org in who.get("orgs", []) if org.get("roleInOrg") != "read"}
    if namespace not in writable:
        raise ValueError(
            f"{flag}: {who['name']} cannot write to {namespace}/ ({repo}): push under "
            f"{' or '.join(sorted(writable))}/, e.g. {who['name']}/{repo.split('/')[-1]}."
        )


def hub_checkpoint(args: TrainingArguments) -> str | None:
    """The Hub's `last-checkpoint/` of the repository this run pushes to, downloaded into `<output_dir>/checkpoint-N`
    (N: its step), for `--resume_from_checkpoint last` on a machine that has no checkpoint of the run. None when the
    run does not push checkpoints (`--push_to_hub` with `--hub_strategy checkpoint`) or the repository has none.

    Raises:
        ValueError: the Hub cannot be reached or refuses (naming the repository).
    """
    strategy = getattr(args.hub_strategy, "value", args.hub_strategy)
    if not args.push_to_hub or strategy != "checkpoint":
        return None
    repo, token = hub_repo(args), args.hub_token or get_token()
    api = HfApi()
    try:
        repo = api.whoami(token=token)["name"] + "/" + repo if "/" not in repo else repo
        if not api.file_exists(repo, f"{HUB_CHECKPOINT}/trainer_state.json", revision=args.hub_revision, token=token):
            return None
        download = Path(args.output_dir) / ".hub-checkpoint"
        shutil.rmtree(download, ignore_errors=True)
        snapshot_download(repo, revision=args.hub_revision, allow_patterns=f"{HUB_CHECKPOINT}/*", local_dir=download,
                          token=token)  # fmt: skip
    except Exception as error:  # HTTP and transport errors alike: one line naming the repository
        raise ValueError(
            f"--resume_from_checkpoint last: cannot read {HUB_CHECKPOINT}/ of {repo} from the Hub at "
            f"{constants.ENDPOINT} ({type(error).__name__}: {error}): check the network, or resume from a local "
            f"checkpoint folder."
        ) from None
    step = json.loads((download / HUB_CHECKPOINT / "trainer_state.json").read_text())["global_step"]
    target = Path(args.output_dir) / f"checkpoint-{step}"
    shutil.rmtree(target, ignore_errors=True)
    (download / HUB_CHECKPOINT).rename(target)
    shutil.rmtree(download)
    print(f"[minirope] no checkpoint in {args.output_dir}: resuming from {repo}'s {HUB_CHECKPOINT} (step {step}) on "
          f"the Hub, downloaded to {target}")  # fmt: skip
    return str(target)
