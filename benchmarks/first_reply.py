"""The first chat reply: `minirope-generate --chat` on a fresh product-timing cache against a plain transformers
process (`AutoModelForCausalLM` + the chat template + greedy `generate()`) on the folder's Llama export, each a new
process, alternating, the median of `--reps` of each. Prints both, their ratio and the machine; appends a row to
--output.

    python benchmarks/first_reply.py --model smol                    # a minirope folder (minirope-import's output)
    python benchmarks/first_reply.py --model smol --reps 7 --prompt "What is 17 + 25?"
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_speed import append_jsonl, command_line, cpu_description  # this folder's helpers

PLAIN = """import sys
from transformers import AutoModelForCausalLM, AutoTokenizer
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
inputs = tokenizer.apply_chat_template([{"role": "user", "content": sys.argv[2]}], add_generation_prompt=True,
                                       return_tensors="pt", return_dict=True)
out = model.generate(**inputs, max_new_tokens=int(sys.argv[3]), do_sample=False)
print(tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))
"""


def timed(command: list[str], env: dict) -> tuple[float, str]:
    """Seconds of one process from start to exit, and what it printed."""
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"{command[:3]} failed:\n{done.stderr[-3000:]}")
    return seconds, done.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a minirope folder with a chat template")
    parser.add_argument("--prompt", default="What is 17 + 25? Answer with the number only.")
    parser.add_argument("--max_new_tokens", type=int, default=16)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--output", default="benchmarks/results/first_reply.jsonl")
    args = parser.parse_args()

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from minirope.convert import to_llama

    with tempfile.TemporaryDirectory(prefix="first-reply-") as scratch:
        llama = Path(scratch) / "llama"
        to_llama(AutoModelForCausalLM.from_pretrained(args.model), save_directory=llama)
        AutoTokenizer.from_pretrained(args.model).save_pretrained(llama)
        (Path(scratch) / "plain.py").write_text(PLAIN)
        plain_command = [sys.executable, str(Path(scratch) / "plain.py"), str(llama), args.prompt,
                         str(args.max_new_tokens)]  # fmt: skip
        ours_command = [sys.executable, "-m", "minirope.commands.generate", "--model", args.model, "--chat", "--prompt",
                        args.prompt, "--do_sample", "False", "--max_new_tokens", str(args.max_new_tokens)]  # fmt: skip
        plain, ours, replies = [], [], set()
        for rep in range(args.reps):
            seconds, reply = timed(plain_command, dict(os.environ))
            plain.append(seconds)
            replies.add(reply)
            cache = Path(scratch) / f"cache-{rep}"  # a fresh cache: the first run on this machine
            seconds, reply = timed(ours_command, {**os.environ, "MINIROPE_CACHE": str(cache)})
            ours.append(seconds)
            replies.add(reply)
    row = {
        "command": command_line(),
        "date": time.strftime("%Y-%m-%d"),
        "cpu": cpu_description(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "model": args.model,
        "plain_seconds": [round(s, 2) for s in plain],
        "minirope_seconds": [round(s, 2) for s in ours],
        "plain_median": round(statistics.median(plain), 2),
        "minirope_median": round(statistics.median(ours), 2),
        "same_reply": len(replies) == 1,
    }
    row["ratio"] = round(row["minirope_median"] / row["plain_median"], 3)
    print(f"{row['cpu']}, {row['cores']} cores, torch {row['torch']}, transformers {row['transformers']}")
    print(f"plain transformers: median {row['plain_median']} s {row['plain_seconds']}")
    print(f"minirope-generate (fresh cache): median {row['minirope_median']} s {row['minirope_seconds']}")
    print(f"minirope / plain: {row['ratio']}x; the same reply: {row['same_reply']} ({replies.pop()!r})")
    append_jsonl(Path(args.output), row)


if __name__ == "__main__":
    main()
