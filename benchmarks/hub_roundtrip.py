"""A released checkpoint imported and pushed to a Hub, then loaded by id on a machine without minirope: the Hub
served on 127.0.0.1 by the tests' `LoopbackHub` (the routes `huggingface_hub` calls), driven by the real clients.

    python benchmarks/hub_roundtrip.py --source SmolLM2-135M-Instruct.Q4_1.gguf --output /tmp/hub-roundtrip

Runs `minirope-import SOURCE --output_dir OUTPUT/imported --push_to_hub me/imported` against the loopback Hub, then,
in a process where `import minirope` fails, `AutoModelForCausalLM.from_pretrained("me/imported",
trust_remote_code=True)` and its tokenizer, and greedy-decodes `--prompt` (as a chat message where the tokenizer has
a chat template) there and from the local folder with minirope. Prints and writes OUTPUT/hub_roundtrip.json: the
seconds of each step, the bytes pushed, the commits, the card's loading line, and whether the two replies are equal.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch
import transformers
from bench_speed import command_line, cpu_description  # this folder's helpers

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from hub_server import LoopbackHub  # noqa: E402

# A source's greedy reply: `reply.py SOURCE PROMPT remote` where `import minirope` fails, `... local` with minirope.
REPLY = """
import json, sys
if sys.argv[3] == "remote":
    sys.modules["minirope"] = None  # as on a machine without minirope: the model code comes with the weights
else:
    import minirope  # noqa: F401
from transformers import AutoModelForCausalLM, AutoTokenizer
source, prompt = sys.argv[1], sys.argv[2]
model = AutoModelForCausalLM.from_pretrained(source, trust_remote_code=True)
tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=True)
if tokenizer.chat_template:
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                           add_generation_prompt=True)
inputs = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
ids = model.generate(**inputs, max_new_tokens=24, do_sample=False)[0, inputs["input_ids"].shape[1]:]
print(json.dumps({"module": type(model).__module__, "reply": tokenizer.decode(ids, skip_special_tokens=True)}))
"""


def timed(command: list[str], env: dict) -> tuple[str, float]:
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        sys.exit(f"{' '.join(command[:4])} failed:\n{result.stderr[-3000:]}")
    return result.stdout, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", required=True, help="minirope-import's SOURCE: a Llama folder or a .gguf file.")
    parser.add_argument("--output", type=Path, default=Path("/tmp/hub-roundtrip"))
    parser.add_argument("--prompt", default="What is 17 + 25? Answer with the number only.")
    args = parser.parse_args()
    args.output.mkdir(parents=True, exist_ok=True)
    folder, repo = args.output / "imported", "me/imported"
    (args.output / "reply.py").write_text(REPLY)
    with LoopbackHub() as hub:
        env = {**os.environ, "HF_ENDPOINT": hub.endpoint, "HF_HUB_DISABLE_XET": "1", "HF_TOKEN": "hf_test",
               "HF_HOME": str(args.output / "hf-home"), "HF_HUB_OFFLINE": "0"}  # fmt: skip
        command = [sys.executable, "-m", "minirope.commands.import_model", args.source, "--output_dir", str(folder),
                   "--overwrite", "True", "--push_to_hub", repo]  # fmt: skip
        _, import_seconds = timed(command, env)
        files = hub.files(repo)
        reply = [sys.executable, str(args.output / "reply.py")]
        remote, remote_seconds = timed([*reply, repo, args.prompt, "remote"], env)
        local, _ = timed([*reply, str(folder), args.prompt, "local"], env)
        commits = hub.commits(repo)
    remote, local = json.loads(remote.splitlines()[-1]), json.loads(local.splitlines()[-1])
    card = files["README.md"].decode()
    on_disk = {str(path.relative_to(folder)): path for path in folder.rglob("*") if path.is_file()}
    result = {
        "command": command_line(),
        "source": args.source,
        "import_and_push_seconds": round(import_seconds, 1),
        "megabytes_pushed": round(sum(len(data) for data in files.values()) / 1e6, 1),
        "files_equal_to_folder": set(files) == set(on_disk)
        and all(data == on_disk[path].read_bytes() for path, data in files.items()),
        "commits": commits,
        "card_loads_repo": f'from_pretrained("{repo}"' in card,
        "load_by_id_and_reply_seconds": round(remote_seconds, 1),
        "remote_module": remote["module"],
        "remote_reply": remote["reply"],
        "local_reply": local["reply"],
        "replies_equal": remote["reply"] == local["reply"],
        "machine": {"cpu": cpu_description(), "threads": torch.get_num_threads(), "torch": torch.__version__,
                    "transformers": transformers.__version__, "python": platform.python_version(),
                    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())},
    }  # fmt: skip
    (args.output / "hub_roundtrip.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
