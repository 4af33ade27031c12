"""A task that is not verse, end to end: pretrain a small model on arithmetic text, then post-train it with GRPO (and
DPO from its own ranked samples) for exact answers, measured on held-out problems.

    python examples/arithmetic/arithmetic.py --output_dir runs/arithmetic          # the measured run (minutes)
    python examples/arithmetic/arithmetic.py --output_dir /tmp/a --small           # seconds: the test's size

Steps, each a real command in its own process:
1. `data/`: problems `What is A + B?` / `What is A * B?` (A, B two-digit; products of a two-digit and a one-digit
   number), split by problem: the pretraining text (`pretrain.jsonl`, one `{"text": "What is 37 + 48? 85"}` document
   each), and a `datasets` folder of `{"prompt": "What is 37 + 48?", "solution": "85"}` rows whose `train` split GRPO
   trains on and whose `test` split (problems in neither) is measured.
2. `minirope-pretrain --train_file data/pretrain.jsonl` (5 % of the blocks held out).
3. `minirope-posttrain --method grpo --dataset_name data/problems --reward_funcs arithmetic_rewards.exact_match
   arithmetic_rewards.digit_match`, run from this folder so the rewards import from the working directory, as
   `trl grpo` imports them.
4. The same with `--method dpo`: pairs of the model's own samples ranked by the reward.
Prints a table of exact-match accuracy (greedy) before and after, and writes it to `<output_dir>/arithmetic.json`.
"""

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path

from datasets import Dataset, DatasetDict

HERE = Path(__file__).resolve().parent
REWARDS = ["arithmetic_rewards.exact_match", "arithmetic_rewards.digit_match"]


def problems(seed: int) -> list[dict]:
    """Every sum of two two-digit numbers and every product of a two-digit and a one-digit number, shuffled."""
    rows = [{"prompt": f"What is {a} + {b}?", "solution": str(a + b)} for a in range(10, 100) for b in range(10, 100)]
    rows += [{"prompt": f"What is {a} * {b}?", "solution": str(a * b)} for a in range(10, 100) for b in range(2, 10)]
    random.Random(seed).shuffle(rows)
    return rows


def write_data(folder: Path, seed: int, pretrain_share: float, test_size: int) -> None:
    """The pretraining documents, and the post-training `datasets` folder (train/test), from disjoint problems."""
    rows = problems(seed)
    test, rest = rows[:test_size], rows[test_size:]
    cut = round(len(rest) * pretrain_share)
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "pretrain.jsonl").open("w") as file:
        file.writelines(json.dumps({"text": f"{row['prompt']} {row['solution']}"}) + "\n" for row in rest[:cut])
    DatasetDict({"train": Dataset.from_list(rest[cut:]), "test": Dataset.from_list(test)}).save_to_disk(
        str(folder / "problems")
    )


def command(name: str, *flags: str) -> list[str]:
    return [str(Path(sys.executable).parent / name), *flags]


def run(argv: list[str], cwd: Path) -> float:
    """Run a command, its output passed through; its wall time in seconds.

    Raises:
        subprocess.CalledProcessError: the command failed.
    """
    print("$", " ".join(argv), flush=True)
    started = time.perf_counter()
    subprocess.run(argv, check=True, cwd=cwd)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output_dir", type=Path, default=Path("runs/arithmetic"))
    parser.add_argument("--small", action="store_true", help="a tiny model and a few steps (the test's size)")
    parser.add_argument("--pretrain_steps", type=int, default=600)
    parser.add_argument("--grpo_steps", type=int, default=150)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--methods", nargs="+", default=["grpo", "dpo"], choices=["grpo", "dpo"])
    args = parser.parse_args()
    out = args.output_dir.resolve()
    data = out / "data"
    write_data(data, args.seed, pretrain_share=0.7, test_size=200)
    if args.small:
        size = ["--hidden_size", "32", "--intermediate_size", "64", "--num_hidden_layers", "1",
                "--num_attention_heads", "2", "--num_key_value_heads", "1", "--block_size", "64",
                "--tokenizer_vocab_size", "300", "--max_steps", "4", "--sample_max_new_tokens", "0"]  # fmt: skip
        post = ["--max_steps", "2", "--per_device_train_batch_size", "4", "--num_generations", "2", "--eval_prompts",
                "4", "--eval_samples_per_prompt", "2"]  # fmt: skip
        dpo = ["--max_steps", "2", "--per_device_train_batch_size", "2", "--num_prompts", "8", "--eval_prompts", "4",
               "--eval_samples_per_prompt", "2", "--samples_per_prompt", "3", "--min_reward_margin", "0"]  # fmt: skip
    else:
        size = ["--max_steps", str(args.pretrain_steps), "--block_size", "128", "--sample_prompt", "What is 12 + 34?"]
        post = ["--max_steps", str(args.grpo_steps)]
        dpo = ["--num_prompts", "512"]
    common = ["--eval_max_new_tokens", "8", "--overwrite_output_dir", "True", "--reward_funcs", *REWARDS]
    post += ["--max_completion_length", "8"]
    dpo += ["--max_length", "48"]
    model = out / "base"
    pretrain = ["--train_file", str(data / "pretrain.jsonl"), "--output_dir", str(model), "--overwrite_output_dir",
                "True", *size]  # fmt: skip
    seconds = {"pretrain": run(command("minirope-pretrain", *pretrain), HERE)}
    results = {}
    for method, flags in [(method, {"grpo": post, "dpo": dpo}[method]) for method in args.methods]:
        folder = out / method
        argv = ["--method", method, "--model_name_or_path", str(model), "--dataset_name", str(data / "problems"),
                "--output_dir", str(folder), *common, *flags]  # fmt: skip
        seconds[method] = run(command("minirope-posttrain", *argv), HERE)
        summary = json.loads((folder / "run_summary.json").read_text())
        results[method] = {side: summary[side] for side in ("before", "after")}
    report = {"seconds": seconds, "results": results}
    (out / "arithmetic.json").write_text(json.dumps(report, indent=2) + "\n")
    name = "exact_match"
    print("\n| method | exact match before (greedy) | after | sampled before | after | command seconds |")
    print("|---|---|---|---|---|---|")
    for method, sides in results.items():
        b, a = sides["before"], sides["after"]
        greedy, sampled = "rewards_greedy", "rewards_sampled"
        print(f"| {method} | {b[greedy][name]:.1%} | {a[greedy][name]:.1%} | {b[sampled][name]:.1%} | "
              f"{a[sampled][name]:.1%} | {seconds[method]:.0f} |")  # fmt: skip
    print(f"pretraining: {seconds['pretrain']:.0f} s")


if __name__ == "__main__":
    main()
