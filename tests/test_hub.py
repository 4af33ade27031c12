"""The Hub round trip against a Hub on 127.0.0.1 (`hub_server.LoopbackHub`), driven only by the real clients:
the Trainer's `push_to_hub` inside `minirope-pretrain`, `huggingface_hub`'s `ModelCard`, and transformers'
`from_pretrained` by repo id in a process that cannot import minirope.

Each command runs in its own process: `huggingface_hub` reads `HF_ENDPOINT` when it is imported.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY_RUN
from hub_server import LoopbackHub
from huggingface_hub import HfApi, ModelCard
from test_bad_input_table import TINY_EXTEND

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
    with LoopbackHub() as server:
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
    """The files of a finished run that a push carries: all but the checkpoints (the Trainer's upload skips
    `checkpoint-*` and `_*`)."""
    files = {str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file()}
    return {path for path in files if not path.startswith(("checkpoint-", "_"))}


def card_of(server: LoopbackHub, repo: str):
    return ModelCard(server.files(repo)["README.md"].decode()).data


def assert_pushed_once(server: LoopbackHub, repo: str, out: Path, measured: bool = True) -> None:
    """`repo` holds exactly the finished folder's files, byte for byte, from one commit, and a card the Hub indexes
    (with the validation bits per byte as `model-index` where the run `measured` it)."""
    pushed = server.files(repo)
    assert set(pushed) == final_files(out)
    assert all(pushed[path] == (out / path).read_bytes() for path in pushed)
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
                      "--eval_samples_per_prompt", "2", "--eval_max_new_tokens", "8", "--max_length", "32",
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
        assert (card.base_model, card.base_model_relation) == (REPO, "finetune")
        assert lineage[command] in card.tags
        outs[repo] = out
    loaded = load_by_id([*outs, *map(str, outs.values())], env, tmp_path)
    for repo, out in outs.items():
        assert loaded[repo]["ids"] == loaded[str(out)]["ids"], repo
