"""The Hub round trip against a Hub on 127.0.0.1 (`hub_server.LoopbackHub`), driven only by the real clients:
the Trainer's `push_to_hub` inside `minirope-pretrain`, `huggingface_hub`'s `ModelCard`, and transformers'
`from_pretrained` by repo id in a process that cannot import minirope.

Each command runs in its own process: `huggingface_hub` reads `HF_ENDPOINT` when it is imported.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import TINY_RUN
from hub_server import LoopbackHub, Repo
from huggingface_hub import HfApi, ModelCard, constants
from llama_cpp_child import llama_cpp
from safetensors.torch import load_file
from test_bad_input import cli_error
from test_bad_input_table import TINY_EXTEND
from test_export import LOGITS_TOLERANCE
from test_resume import RUN as RESUME_RUN
from transformers import AutoTokenizer

from minirope import MiniRopeForCausalLM, owned
from minirope.commands import export, extend, finetune, import_model, posttrain, pretrain
from minirope.convert import to_llama
from minirope.output.folder import json_text, public, push_folder

REPO = "me/tiny"
# Loads a repository by id and the local folder where `import minirope` fails, and prints each one's greedy tokens.
LOAD_BY_ID = """
import json, sys
sys.modules["minirope"] = None  # as on a machine without minirope: the model code comes with the weights
from transformers import AutoModelForCausalLM, AutoTokenizer
loaded = {}
for source in sys.argv[1:]:
    model = AutoModelForCausalLM.from_pretrained(source, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=True)
    inputs = tokenizer("ROMEO:", return_tensors="pt")
    ids = model.generate(**inputs, max_new_tokens=12, do_sample=False)[0].tolist()
    loaded[source] = {"module": type(model).__module__, "ids": ids}
print(json.dumps(loaded))
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """The running Hub and the environment that points the clients at it (a token, Xet off, a fresh cache)."""
    home = tmp_path_factory.mktemp("hf-home")
    with LoopbackHub() as server, pytest.MonkeyPatch.context() as patch:
        patch.setattr(constants, "HF_HUB_OFFLINE", False)  # this process's clients too, where the shell set 1
        env = {**os.environ, "HF_ENDPOINT": server.endpoint, "HF_HUB_DISABLE_XET": "1", "HF_TOKEN": "hf_test",
               "HF_HOME": str(home), "HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "0"}  # fmt: skip
        yield server, env


def run(command: list[str], env: dict, cwd: Path) -> str:
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=cwd)
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout


def minirope(command: str, *argv: str) -> list[str]:
    return [sys.executable, "-m", f"minirope.commands.{command}", *argv]


def final_files(folder: Path) -> set[str]:
    """The files of a finished run that a push carries: all but the checkpoints, the scratch folders and minirope's
    marker (`.minirope/`: the push carries what the run published, nothing else)."""
    files = {str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file()}
    return {path for path in files if not path.startswith(("checkpoint-", "_", "."))}


def card_of(server: LoopbackHub, repo: str):
    return ModelCard(server.files(repo)["README.md"].decode()).data


def assert_pushed_once(server: LoopbackHub, repo: str, out: Path, measured: bool = True) -> None:
    """`repo` holds exactly the finished folder's files, byte for byte, from one commit, and a card the Hub indexes
    (with the validation bits per byte as `model-index` where the run `measured` it)."""
    pushed = server.files(repo)
    assert set(pushed) == final_files(out)
    local = {path: (out / path).read_bytes() for path in pushed}
    summary = public(json.loads(local["run_summary.json"]))  # the held-out prompts stay local
    local["run_summary.json"] = json_text(summary).encode()
    assert all(pushed[path] == local[path] for path in pushed)
    assert server.commits(repo) == ["minirope: end of training"]
    card = card_of(server, repo)
    assert (card.library_name, card.pipeline_tag) == ("transformers", "text-generation")
    assert "minirope" in card.tags
    assert not measured or card.eval_results[0].metric_type == "bits_per_byte"


def load_by_id(sources: list[str], env: dict, cwd: Path) -> dict:
    """Each source's model module and greedy tokens, loaded where `import minirope` fails."""
    (cwd / "load.py").write_text(LOAD_BY_ID)
    return json.loads(run([sys.executable, str(cwd / "load.py"), *sources], env, cwd).splitlines()[-1])


@pytest.fixture(scope="module")
def pushed(hub, tmp_path_factory) -> Path:
    """`minirope-pretrain --push_to_hub` (checkpoints every 3 steps, as a user's run saves them) into `me/tiny`."""
    server, env = hub
    out = tmp_path_factory.mktemp("pretrain") / "run"
    run(minirope("pretrain", *TINY_RUN, "--output_dir", str(out), "--push_to_hub", "True", "--hub_model_id", REPO),
        env, out.parent)  # fmt: skip
    return out


def test_pretrain_pushes_the_finished_folder_once_and_it_loads_by_repo_id_without_minirope(hub, pushed, tmp_path):
    """The repository holds exactly the folder's final files, in one commit (no `.staging/` copies, no checkpoint
    pushes); its card parses with `huggingface_hub` and carries what the Hub indexes; a process that cannot import
    minirope loads it by repo id and greedy-decodes the local folder's tokens."""
    server, env = hub
    assert_pushed_once(server, REPO, pushed)
    assert not any(path.startswith(".staging") for path in server.files(REPO))
    assert f'from_pretrained("{REPO}"' in server.files(REPO)["README.md"].decode()  # the repo, not the folder "run"
    assert card_of(server, REPO).base_model is None  # trained from scratch
    loaded = load_by_id([REPO, str(pushed)], env, tmp_path)
    remote, local = loaded[REPO], loaded[str(pushed)]
    assert remote["module"].startswith("transformers_modules.") and "modeling_minirope" in remote["module"]
    assert remote["ids"] == local["ids"] and len(remote["ids"]) > 12


def test_every_command_starts_from_a_hub_id_at_a_revision_and_pushes_its_folder_with_its_lineage(hub, pushed, tmp_path):
    """finetune (LoRA, merged), extend and posttrain (DPO) each load `me/tiny` by id at the revision of the pretrain
    push (main now holds corrupt weights, so `--revision` is what makes them load), push their finished folder
    once, and say in the card what they started from (`base_model`, its relation) and how (the method's tag); each
    repository loads by id without minirope and decodes the local folder's tokens."""
    server, env = hub
    revision = server.repos[REPO].sha
    HfApi(endpoint=server.endpoint, token="hf_test").upload_file(
        path_or_fileobj=b"not weights", path_in_repo="model.safetensors", repo_id=REPO, commit_message="break main"
    )
    base = ["--model_name_or_path", REPO, "--revision", revision]
    pairs = tmp_path / "pairs.jsonl"
    row = {"prompt": "ROMEO:\n", "chosen": "But soft, what light through yonder window breaks?\n", "rejected": "No.\n"}
    pairs.write_text("".join(json.dumps(row) + "\n" for _ in range(4)))
    commands = {
        "finetune": [*base, "--play", "the-tempest", "--lora", "True", "--merge_lora", "True", "--num_train_epochs",
                     "1", "--max_train_samples", "8", "--max_eval_samples", "4", "--torch_compile", "False"],
        "extend": [*base, "--rope_type", "yarn", *TINY_EXTEND],
        "posttrain": ["--method", "dpo", *base, "--train_file", str(pairs), "--max_steps", "2", "--eval_prompts", "2",
                      "--num_generations_eval", "2", "--eval_max_new_tokens", "8", "--max_length", "32",
                      "--per_device_train_batch_size", "2"],
    }  # fmt: skip
    lineage = {"finetune": "lora", "extend": "yarn", "posttrain": "dpo"}
    outs = {}
    for command, argv in commands.items():
        out, repo = tmp_path / command, f"{REPO}-{command}"
        run(minirope(command, *argv, "--output_dir", str(out), "--push_to_hub", "True", "--hub_model_id", repo),
            env, tmp_path)  # fmt: skip
        assert_pushed_once(server, repo, out, measured=command != "posttrain")  # DPO on pairs: no validation text
        card = card_of(server, repo)
        assert f'from_pretrained("{repo}"' in server.files(repo)["README.md"].decode()
        assert (card.base_model, card.base_model_relation) == (REPO, "finetune")
        assert lineage[command] in card.tags
        outs[repo] = out
    loaded = load_by_id([*outs, *map(str, outs.values())], env, tmp_path)
    for repo, out in outs.items():
        assert loaded[repo]["ids"] == loaded[str(out)]["ids"], repo


@pytest.fixture
def hub_here(hub, monkeypatch, tmp_path):
    """The Hub for commands run in this process: `huggingface_hub`'s endpoint pointed at it, no stored token."""
    server, _ = hub
    monkeypatch.setattr(constants, "ENDPOINT", server.endpoint)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    return server


def test_a_posttraining_push_keeps_the_users_rows_and_replies_local_unless_push_data(hub_here, tmp_path):
    """A post-training folder holds the user's rows (DPO's own pairs) and the held-out prompts with the model's replies
    (the run summary's `samples`); its push carries neither, and `--push_data True` carries both."""
    out = tmp_path / "run"
    out.mkdir()
    secret = "a prompt of the user's"
    summary = {"steps": 3, "samples": [{"before": {"prompt": secret}}], "output_dir": str(out), "after": {"prompts": 2}}
    (out / "model.safetensors").write_bytes(b"weights")
    (out / "run_summary.json").write_text(json.dumps(summary))
    (out / "preference_pairs.jsonl").write_text(json.dumps({"prompt": secret, "chosen": "a", "rejected": "b"}) + "\n")
    owned.record(out, "minirope-posttrain", ["model.safetensors", "run_summary.json", "preference_pairs.jsonl"],
                 published=["model.safetensors", "run_summary.json"])  # fmt: skip
    hub = {"hub_token": None, "hub_private_repo": None, "hub_revision": None}
    push_folder(SimpleNamespace(hub_model_id="me/kept-local", **hub), out)
    pushed = hub_here.files("me/kept-local")
    assert set(pushed) == {"model.safetensors", "run_summary.json"}
    assert json.loads(pushed["run_summary.json"]) == {"steps": 3, "after": {"prompts": 2}}  # no samples, no local path
    assert json.loads((out / "run_summary.json").read_text()) == summary  # the local summary keeps them
    push_folder(SimpleNamespace(hub_model_id="me/with-data", **hub), out, push_data=True)
    pushed = hub_here.files("me/with-data")
    assert set(pushed) == {"model.safetensors", "run_summary.json", "preference_pairs.jsonl"}
    assert secret.encode() in pushed["preference_pairs.jsonl"] and secret.encode() in pushed["run_summary.json"]


def closed_port() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


@pytest.mark.parametrize(
    ("cause", "expected"),
    [
        ("no token", "needs a Hugging Face token with write access"),
        ("unknown token", "refused the token (HTTP 401)"),
        ("read-only token", "is read-only"),
        ("fine-grained read token", "(fine-grained) may write to no repository"),
        ("fine-grained token of another namespace", "me cannot write to team/tiny: push to me/"),
        ("another namespace", "me cannot write to someone/"),
        ("no Hub", "cannot be reached"),
    ],
)
def test_a_push_that_cannot_happen_is_one_line_before_any_work(hub_here, tmp_path, monkeypatch, capsys, cause,
                                                               expected):  # fmt: skip
    """Each reason a push would fail is found when the flags are parsed: exit 1, one line naming the cause and the
    fix, no output folder."""
    repos = {"another namespace": "someone/tiny", "fine-grained token of another namespace": "team/tiny"}
    repo = repos.get(cause, REPO)
    tokens = {"unknown token": "hf_wrong", "read-only token": "hf_read", "fine-grained read token": "hf_fine_read",
              "fine-grained token of another namespace": "hf_fine_write"}  # fmt: skip
    if cause == "no token":
        monkeypatch.delenv("HF_TOKEN")
    elif cause in tokens:
        monkeypatch.setenv("HF_TOKEN", tokens[cause])
    elif cause == "no Hub":
        monkeypatch.setattr(constants, "ENDPOINT", closed_port())
    out = tmp_path / "run"
    err = cli_error(pretrain.main, [*TINY_RUN, "--output_dir", str(out), "--push_to_hub", "True", "--hub_model_id",
                                    repo], monkeypatch, capsys)  # fmt: skip
    assert err.startswith("minirope-pretrain: error: --push_to_hub") and expected in err, err
    assert not out.exists()


def test_a_push_that_fails_after_training_keeps_the_folder_and_says_how_to_upload_it(hub_here, tmp_path, monkeypatch,
                                                                                      capsys):  # fmt: skip
    """The Hub refusing the final commit (after every check passed): exit 1, one line naming the saved folder and the
    upload command; the folder is complete and loads."""

    def refuse(*args, **kwargs):
        raise ConnectionError("the Hub went away")

    monkeypatch.setattr(HfApi, "create_commit", refuse)
    out = tmp_path / "run"
    err = cli_error(pretrain.main, [*TINY_RUN, "--output_dir", str(out), "--push_to_hub", "True", "--hub_model_id",
                                    REPO], monkeypatch, capsys)  # fmt: skip
    assert err.startswith(f"minirope-pretrain: error: the push to {REPO} failed (ConnectionError"), err
    assert f"saved in {out}/" in err and f"hf upload {REPO} {out}" in err, err
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()


@pytest.mark.parametrize("command", ["finetune", "extend", "posttrain", "export", "import"])
def test_every_command_checks_its_push_before_it_loads_the_model(hub_here, tmp_path, monkeypatch, capsys, command):
    """The other commands check a push as pretrain does, before they read the model (here: no such folder)."""
    monkeypatch.setenv("HF_TOKEN", "hf_read")
    model = str(tmp_path / "no-model")
    argv = {
        "export": ["--model", model, "--format", "llama", "--output", str(tmp_path / "out"), "--push_to_hub", REPO],
        "posttrain": ["--model", model, "--output_dir", str(tmp_path / "out"), "--push_to_hub", "True"],
        "import": [model, "--output_dir", str(tmp_path / "out"), "--push_to_hub", REPO],
    }.get(command, ["--model_name_or_path", model, "--output_dir", str(tmp_path / "out"), "--push_to_hub", "True"])
    main = {"finetune": finetune.main, "extend": extend.main, "posttrain": posttrain.main, "export": export.main,
            "import": import_model.main}  # fmt: skip
    err = cli_error(main[command], argv, monkeypatch, capsys)
    assert "--push_to_hub: the token of me is read-only" in err, err
    assert not (tmp_path / "out").exists()


def test_import_pushes_the_imported_folder_once_and_it_loads_by_repo_id_without_minirope(hub, pushed, tmp_path):
    """`minirope-import --push_to_hub` with a bare name: the token's namespace, the folder as written in one commit,
    a card whose code loads the repository; a process that cannot import minirope loads it by id and decodes the
    local folder's greedy tokens."""
    server, env = hub
    llama, out = tmp_path / "llama", tmp_path / "imported"
    to_llama(MiniRopeForCausalLM.from_pretrained(pushed), save_directory=llama)
    AutoTokenizer.from_pretrained(pushed).save_pretrained(llama)
    run(minirope("import_model", str(llama), "--output_dir", str(out), "--push_to_hub", "imported"), env, tmp_path)
    repo = "me/imported"
    files = server.files(repo)
    assert set(files) == final_files(out)
    assert all(files[path] == (out / path).read_bytes() for path in files)
    assert server.commits(repo) == ["minirope-import llama"]
    assert f'from_pretrained("{repo}"' in files["README.md"].decode()  # the repo, not the folder "imported"
    loaded = load_by_id([repo, str(out)], env, tmp_path)
    assert loaded[repo]["module"].startswith("transformers_modules.") and "modeling_minirope" in loaded[repo]["module"]
    assert loaded[repo]["ids"] == loaded[str(out)]["ids"]


DOWNLOAD = """
import sys
from huggingface_hub import hf_hub_download
print(hf_hub_download(sys.argv[1], sys.argv[2]))
"""


@pytest.mark.client
def test_export_pushes_a_gguf_and_a_llama_folder_that_load_back_from_the_hub(hub, pushed, tmp_path):
    """`minirope-export --push_to_hub`, from the Hub id of the pretrain push (at its commit), uploads the GGUF with a
    card naming its source (`base_model`, `quantized`), as the Hub's GGUF repositories do, and the Llama folder;
    llama.cpp runs the GGUF downloaded back with `hf_hub_download` (logits = the source model's), and transformers
    loads the Llama repository by id without remote code."""
    server, env = hub
    source = ["--model", REPO, "--revision", server.repos[REPO].commits[0][0]]
    gguf, llama = tmp_path / "tiny.gguf", tmp_path / "llama"
    run(minirope("export", *source, "--format", "gguf", "--output", str(gguf), "--push_to_hub", f"{REPO}-gguf"),
        env, tmp_path)  # fmt: skip
    run(minirope("export", *source, "--format", "llama", "--output", str(llama), "--push_to_hub", f"{REPO}-llama"),
        env, tmp_path)  # fmt: skip

    assert set(server.files(f"{REPO}-gguf")) == {"tiny.gguf", "README.md"}
    card = card_of(server, f"{REPO}-gguf")
    assert (card.base_model, card.base_model_relation, card.pipeline_tag) == (REPO, "quantized", "text-generation")
    assert {"gguf", "minirope"} <= set(card.tags)
    (tmp_path / "download.py").write_text(DOWNLOAD)
    downloaded = Path(run([sys.executable, str(tmp_path / "download.py"), f"{REPO}-gguf", "tiny.gguf"], env,
                          tmp_path).splitlines()[-1])  # fmt: skip
    assert downloaded.read_bytes() == gguf.read_bytes()
    model, tokenizer = MiniRopeForCausalLM.from_pretrained(pushed).eval(), AutoTokenizer.from_pretrained(pushed)
    ids = [
        tokenizer.bos_token_id,
        *tokenizer("ROMEO:\nBut soft, what light through yonder window breaks?")["input_ids"],
    ]
    (theirs,) = llama_cpp(downloaded, [("scores", ids)])
    with torch.no_grad():
        ours = model(torch.tensor([ids])).logits[0].numpy()
    assert np.abs(np.array(theirs) - ours).max() < LOGITS_TOLERANCE

    pushed_llama = server.files(f"{REPO}-llama")
    assert set(pushed_llama) == {path.name for path in llama.iterdir() if not path.name.startswith(".")}
    card = card_of(server, f"{REPO}-llama")
    assert (card.base_model, card.library_name) == (REPO, "transformers")
    loaded = load_by_id([f"{REPO}-llama", str(pushed)], env, tmp_path)
    assert loaded[f"{REPO}-llama"]["module"] == "transformers.models.llama.modeling_llama"
    assert loaded[f"{REPO}-llama"]["ids"] == loaded[str(pushed)]["ids"]


@pytest.mark.slow  # ~60 s: two runs and a resume through the Hub; the pushes themselves are checked by default
def test_a_run_killed_after_a_checkpoint_push_resumes_from_the_hub_on_a_clean_machine(hub, tmp_path):
    """`--hub_strategy checkpoint` pushes each checkpoint as `last-checkpoint/`; the run is killed once the Hub holds
    one; on a clean machine (new output folder, new cache) the same command with `--resume_from_checkpoint last`
    downloads it and ends with the weights of an uninterrupted run, tensor for tensor."""
    server, env = hub
    want = tmp_path / "uninterrupted"
    pretrain.run([*RESUME_RUN, "--output_dir", str(want)])

    push = ["--push_to_hub", "True", "--hub_model_id", f"{REPO}-resume", "--hub_strategy", "checkpoint"]
    killed = subprocess.Popen(minirope("pretrain", *RESUME_RUN, *push, "--output_dir", str(tmp_path / "killed")),
                              env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 300
    while "last-checkpoint/trainer_state.json" not in server.repos.get(f"{REPO}-resume", Repo()).files:
        assert killed.poll() is None and time.monotonic() < deadline, "no checkpoint reached the Hub before the end"
        time.sleep(0.01)
    killed.send_signal(signal.SIGKILL)
    assert killed.wait() == -signal.SIGKILL
    at = json.loads(server.files(f"{REPO}-resume")["last-checkpoint/trainer_state.json"])["global_step"]
    assert at < 120

    clean = tmp_path / "clean"
    out = run(minirope("pretrain", *RESUME_RUN, *push, "--output_dir", str(clean), "--resume_from_checkpoint", "last"),
              {**env, "HF_HOME": str(tmp_path / "clean-home")}, tmp_path)  # fmt: skip
    assert f"resuming from {REPO}-resume's last-checkpoint" in out
    got, expected = load_file(clean / "model.safetensors"), load_file(want / "model.safetensors")
    assert got.keys() == expected.keys() and all(torch.equal(got[name], expected[name]) for name in got)
