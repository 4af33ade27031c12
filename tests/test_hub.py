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
from huggingface_hub import ModelCard

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


@pytest.fixture
def hub(tmp_path):
    """The running Hub and the environment that points the clients at it (a token, Xet off, a fresh cache)."""
    with LoopbackHub() as server:
        env = {**os.environ, "HF_ENDPOINT": server.endpoint, "HF_HUB_DISABLE_XET": "1", "HF_TOKEN": "hf_test",
               "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "0"}  # fmt: skip
        yield server, env


def run(command: list[str], env: dict, cwd: Path) -> str:
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=cwd)
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout


def final_files(folder: Path) -> set[str]:
    """The files of a finished run that a push carries: all but the checkpoints (the Trainer's upload skips
    `checkpoint-*` and `_*`)."""
    files = {str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file()}
    return {path for path in files if not path.startswith(("checkpoint-", "_"))}


def test_pretrain_pushes_the_finished_folder_once_and_it_loads_by_repo_id_without_minirope(hub, tmp_path):
    """`minirope-pretrain --push_to_hub` (checkpoints saved every 3 steps, as a user's run saves them) leaves a
    repository with exactly the folder's final files, in one commit (no `.staging/` copies, no checkpoint pushes);
    its card parses with `huggingface_hub` and carries what the Hub indexes; a process that cannot import minirope
    loads it by repo id and greedy-decodes the local folder's tokens."""
    server, env = hub
    out = tmp_path / "run"
    run([sys.executable, "-m", "minirope.commands.pretrain", *TINY_RUN, "--output_dir", str(out),
         "--push_to_hub", "True", "--hub_model_id", REPO], env, tmp_path)  # fmt: skip
    pushed = server.files(REPO)
    assert set(pushed) == final_files(out)
    assert not any(path.startswith(".staging") for path in pushed)
    assert server.commits(REPO) == ["minirope: end of training"]
    assert pushed["model.safetensors"] == (out / "model.safetensors").read_bytes()
    card = ModelCard(pushed["README.md"].decode()).data
    assert (card.library_name, card.pipeline_tag) == ("transformers", "text-generation")
    assert "minirope" in card.tags and card.eval_results and card.eval_results[0].metric_type == "bits_per_byte"

    (tmp_path / "load.py").write_text(LOAD_BY_ID)
    loaded = json.loads(
        run([sys.executable, str(tmp_path / "load.py"), REPO, str(out)], env, tmp_path).splitlines()[-1]
    )
    remote, local = loaded[REPO], loaded[str(out)]
    assert remote["module"].startswith("transformers_modules.") and "modeling_minirope" in remote["module"]
    assert remote["ids"] == local["ids"] and len(remote["ids"]) > 12
