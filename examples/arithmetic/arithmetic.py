"""A task that is not verse, end to end: pretrain a small model on arithmetic text, then post-train it with GRPO (and
DPO from its own ranked samples) for exact answers, measured on held-out problems.

    python examples/arithmetic/arithmetic.py --output_dir runs/arithmetic          # the measured run (minutes)
    python examples/arithmetic/arithmetic.py --output_dir /tmp/a --small           # seconds: the test's size

Steps, each a real command in its own process:
1. `data/`: problems `What is A + B?` / `What is A * B?` (A, B two-digit; products of a two-digit and a one-digit
   number), split by problem: the pretraining text (`pretrain.jsonl`, worksheets of 1 to 4 `What is 37 + 48? 85`
   lines), and a `datasets` folder of `{"prompt": "What is 37 + 48?", "solution": "85"}` rows whose `train` split
   GRPO trains on and whose `test` split (400 problems in neither) is measured.
2. `minirope-pretrain --train_file data/pretrain.jsonl` (5 % of the blocks held out).
3. `minirope-posttrain --method grpo --dataset_name data/problems --reward_funcs arithmetic_rewards.exact_match
   arithmetic_rewards.first_number --reward_weights 1 0` (GRPO trains on the first, the second is measured only),
   run from this folder so the rewards import from the working directory, as `trl grpo` imports them.
4. The same with `--method dpo`: pairs of the model's own samples ranked by `exact_match` (the same
   `--reward_weights 1 0`).
Prints a table of exact-match accuracy (greedy; `exact_match`: the answer alone, `first_number`: the first number
whatever follows) before and after, and writes it to `<output_dir>/arithmetic.json`.
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
# GRPO trains on exact_match; first_number (weight 0) is measured only: the arithmetic alone, whatever follows.
REWARDS = ["arithmetic_rewards.exact_match", "arithmetic_rewards.first_number"]
REWARD_WEIGHTS = ["1", "0"]


def problems(seed: int) -> list[dict]:
    """Every sum of two two-digit numbers and every product of a two-digit and a one-digit number, shuffled."""
    rows = [{"prompt": f"What is {a} + {b}?", "solution": str(a + b)} for a in range(10, 100) for b in range(10, 100)]
    rows += [{"prompt": f"What is {a} * {b}?", "solution": str(a * b)} for a in range(10, 100) for b in range(2, 10)]
    random.Random(seed).shuffle(rows)
    return rows


def worksheets(rows: list[dict], seed: int, most: int = 4) -> list[str]:
    """`rows` as worksheets: documents of 1 to `most` problems, one `What is 37 + 48? 85` line each, the way such
    text is found. A model pretrained on them answers a question and then, more often than not, goes on to the next
    line: answering one question and stopping is what post-training has to teach."""
    rng, documents, start = random.Random(seed), [], 0
    while start < len(rows):
        size = rng.randint(1, most)
        documents.append("\n".join(f"{row['prompt']} {row['solution']}" for row in rows[start : start + size]))
        start += size
    return documents


def write_data(folder: Path, seed: int, pretrain_share: float, test_size: int) -> None:
    """The pretraining documents (worksheets), and the post-training `datasets` folder (train/test), from disjoint
    problems."""
    rows = problems(seed)
    test, rest = rows[:test_size], rows[test_size:]
    cut = round(len(rest) * pretrain_share)
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "pretrain.jsonl").open("w") as file:
        file.writelines(json.dumps({"text": sheet}) + "\n" for sheet in worksheets(rest[:cut], seed))
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
    parser.add_argument("--grpo_steps", type=int, default=600)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--methods", nargs="+", default=["grpo", "dpo"], choices=["grpo", "dpo"])
    args = parser.parse_args()
    out = args.output_dir.resolve()
    data = out / "data"
    write_data(data, args.seed, pretrain_share=0.7, test_size=400)
    if args.small:
        size = ["--hidden_size", "32", "--intermediate_size", "64", "--num_hidden_layers", "1",
                "--num_attention_heads", "2", "--num_key_value_heads", "1", "--block_size", "64",
                "--tokenizer_vocab_size", "300", "--max_steps", "4", "--sample_max_new_tokens", "0"]  # fmt: skip
        post = ["--max_steps", "2", "--per_device_train_batch_size", "4", "--num_generations", "2", "--eval_prompts",
                "4", "--num_generations_eval", "2"]  # fmt: skip
        dpo = ["--max_steps", "2", "--per_device_train_batch_size", "2", "--num_prompts", "8", "--eval_prompts", "4",
               "--num_generations_eval", "2", "--samples_per_prompt", "3", "--min_reward_margin", "0"]  # fmt: skip
    else:
        size = ["--max_steps", str(args.pretrain_steps), "--block_size", "128", "--sample_prompt", "What is 12 + 34?"]
        post = ["--max_steps", str(args.grpo_steps), "--learning_rate", "1e-4", "--per_device_train_batch_size", "64",
                "--num_generations", "16", "--beta", "0", "--temperature", "1.0",
                "--scale_rewards", "group"]  # fmt: skip
        dpo = ["--num_prompts", "512", "--loss_type", "sigmoid", "sft"]  # RPO: here 22.0 % exact, sigmoid's 17.5 %
    common = ["--eval_max_new_tokens", "8", "--overwrite_output_dir", "True", "--reward_funcs", *REWARDS]
    post += ["--max_completion_length", "8"]
    dpo += ["--max_length", "48"]
    common += ["--reward_weights", *REWARD_WEIGHTS]
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
    print("\n| method | exact match before (greedy) | after | sampled before | after | first number before | after "
          "| command seconds |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for method, sides in results.items():
        b, a = sides["before"], sides["after"]
        greedy, sampled, exact, first = "rewards_greedy", "rewards_sampled", "exact_match", "first_number"
        print(
            f"| {method} | {b[greedy][exact]:.1%} | {a[greedy][exact]:.1%} | {b[sampled][exact]:.1%} | "
            f"{a[sampled][exact]:.1%} | {b[greedy][first]:.1%} | {a[greedy][first]:.1%} | {seconds[method]:.0f} |"
        )
    print(f"pretraining: {seconds['pretrain']:.0f} s")


if __name__ == "__main__":
    main()
