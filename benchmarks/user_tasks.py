"""GRPO's defaults on tasks that are not the verse demo: each task a text of one problem per line that
`minirope-pretrain --train_file` learns from, then `minirope-posttrain --method grpo --dataset_name <folder>
--reward_funcs user_task_rewards.exact` with no other flag (or the flags given with --flags), held-out exact match
before and after, measured greedy by the run itself.

    python benchmarks/user_tasks.py --output_dir runs/user-tasks                       # every task, the default size
    python benchmarks/user_tasks.py --output_dir runs/user-tasks --tasks subtract --size large
    python benchmarks/user_tasks.py --output_dir runs/user-tasks --tasks max --flags --learning_rate 2e-4

Tasks (none shipped with minirope, none the arithmetic example's worksheets):
- `subtract`: `47 - 19 = 28` (two two-digit numbers, the first the larger);
- `max`: `max 47 19 63 = 63` (the largest of three two-digit numbers);
- `reverse`: `reverse k q f m = m f q k` (three to five letters, answered in reverse order).
The pretraining text holds 70 % of each task's problems, the post-training `datasets` folder the other 30 % as
`{"prompt": "47 - 19 =", "solution": "28"}` rows (`train`) and 300 problems in neither (`test`). Each result is
appended to `<output_dir>/user_tasks.jsonl` with the machine and versions.
"""

import argparse
import json
import platform
import random
import subprocess
import sys
import time
from pathlib import Path

from bench_speed import command_line  # this folder's helpers
from datasets import Dataset, DatasetDict

REWARDS = '''def exact(completions, solution, **kwargs):
    """1.0 where the completion's first line is the row's solution (spaces aside), else 0.0: the answer is the rest
    of the problem's line, as in the text the model learned from."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [float(text.strip().split("\\n")[0].strip() == str(answer)) for text, answer in zip(texts, solution)]
'''
SIZES = {
    "tiny": [
        "--hidden_size",
        "32",
        "--intermediate_size",
        "64",
        "--num_hidden_layers",
        "1",
        "--num_attention_heads",
        "2",
        "--num_key_value_heads",
        "1",
        "--block_size",
        "64",
        "--max_steps",
        "4",
    ],  # the test's size
    "default": [],  # minirope-pretrain's default architecture
    "large": [
        "--hidden_size",
        "256",
        "--intermediate_size",
        "704",
        "--num_hidden_layers",
        "6",
        "--num_attention_heads",
        "8",
        "--num_key_value_heads",
        "4",
    ],  # fmt: skip
}


def subtract(rng: random.Random) -> tuple[str, str]:
    a, b = sorted(rng.sample(range(10, 100), 2), reverse=True)
    return f"{a} - {b} =", str(a - b)


def largest(rng: random.Random) -> tuple[str, str]:
    numbers = rng.sample(range(10, 100), 3)
    return f"max {' '.join(map(str, numbers))} =", str(max(numbers))


def reverse(rng: random.Random) -> tuple[str, str]:
    letters = rng.sample("abcdefghijklmnopqrstuvwxyz", rng.randint(3, 5))
    return f"reverse {' '.join(letters)} =", " ".join(reversed(letters))


TASKS = {"subtract": subtract, "max": largest, "reverse": reverse}


def write_task(folder: Path, task: str, seed: int, count: int = 4000, test_size: int = 300) -> None:
    """`pretrain.txt` (one problem per line) and the `problems` datasets folder (train/test), from disjoint problems."""
    rng, seen, rows = random.Random(seed), set(), []
    while len(rows) < count:
        prompt, solution = TASKS[task](rng)
        if prompt not in seen:
            seen.add(prompt)
            rows.append({"prompt": prompt, "solution": solution})
    test, rest = rows[:test_size], rows[test_size:]
    cut = round(len(rest) * 0.7)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pretrain.txt").write_text("".join(f"{row['prompt']} {row['solution']}\n" for row in rest[:cut]))
    DatasetDict({"train": Dataset.from_list(rest[cut:]), "test": Dataset.from_list(test)}).save_to_disk(
        str(folder / "problems")
    )


def command(name: str, *flags: str) -> list[str]:
    return [str(Path(sys.executable).parent / name), *flags]


def timed(argv: list[str], cwd: Path) -> float:
    started = time.perf_counter()
    subprocess.run(argv, cwd=cwd, check=True)
    return round(time.perf_counter() - started, 1)


def machine() -> dict:
    import torch
    import transformers
    import trl

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())  # fmt: skip
    flags = Path("/proc/cpuinfo").read_text()
    isa = "AMX" if "amx_tile" in flags else "AVX512_BF16" if "avx512_bf16" in flags else "AVX2"
    return {"cpu": cpu, "isa": isa, "torch": torch.__version__, "transformers": transformers.__version__,
            "trl": trl.__version__}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", type=Path, required=True)
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--size", default="default", choices=list(SIZES))
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--label", default="defaults", help="The row's name in the results.")
    parser.add_argument("--flags", nargs=argparse.REMAINDER, default=[], help="minirope-posttrain's extra flags.")
    args = parser.parse_args()
    out = args.output_dir.resolve()
    for task in args.tasks:
        folder = out / task
        if not (folder / "problems").is_dir():
            write_task(folder, task, args.seed)
        (folder / "user_task_rewards.py").write_text(REWARDS)
        base = folder / f"base-{args.size}"
        seconds = {}
        if not (base / "config.json").is_file():
            pretrain = ["--train_file", "pretrain.txt", "--output_dir", str(base), "--sample_max_new_tokens", "0",
                        *SIZES[args.size]]  # fmt: skip
            seconds["pretrain"] = timed(command("minirope-pretrain", *pretrain), folder)
        run_dir = folder / f"grpo-{args.size}-{args.label}"
        posttrain = ["--method", "grpo", "--model_name_or_path", str(base), "--dataset_name", "problems",
                     "--reward_funcs", "user_task_rewards.exact", "--output_dir", str(run_dir),
                     "--overwrite_output_dir", "True", *args.flags]  # fmt: skip
        seconds["posttrain"] = timed(command("minirope-posttrain", *posttrain), folder)
        summary = json.loads((run_dir / "run_summary.json").read_text())
        row = {
            "command": command_line(  # this task alone; --flags takes the rest of the line, so it stays last
                "--tasks", task, *(arg for arg in sys.argv[1:] if arg not in (*args.tasks, "--tasks"))
            ),
            "task": task,
            "size": args.size,
            "label": args.label,
            "flags": args.flags,
            "seed": args.seed,
            "before": summary["before"]["rewards_greedy"]["exact"],
            "after": summary["after"]["rewards_greedy"]["exact"],
            "kept": summary["kept"]["kept_step"],
            "gained": summary["gained"],
            "alike_share": summary["before"]["prompts_with_alike_samples_share"],
            "warm_start_steps": (summary["warm_start"] or {}).get("steps", 0),
            "steps": summary["steps"],
            "seconds": seconds,
            "date": time.strftime("%Y-%m-%d"),
            **machine(),
        }
        print(json.dumps(row))
        with (out / "user_tasks.jsonl").open("a") as file:
            file.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
