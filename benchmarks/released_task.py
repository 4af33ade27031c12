"""GRPO's own steps on a released checkpoint: a task the model half does, run with `minirope-posttrain`'s defaults on
several seeds, each scored on problems that no run trains or measures on.

    python benchmarks/released_task.py --model runs/smol --output_dir runs/released --seeds 1 2 3
    python benchmarks/released_task.py --model runs/smol --output_dir runs/released --seeds 1 2 3 \\
        --flags --reward_funcs largest_rewards.final_number largest_rewards.overlong
    python benchmarks/released_task.py --model runs/smol --output_dir runs/distilled --seeds 1 2 3 \\
        --teacher_model_name_or_path runs/released/seed-1   # distillation from a teacher GRPO trained
    python benchmarks/released_task.py --model runs/smol --output_dir runs/distilled-trl --seeds 1 2 3 \\
        --teacher_model_name_or_path runs/released/seed-1 --trl_defaults

The task is docs/pretrained.md's: "Which is the largest of 51, 29 and 60? Answer with just the number." as a
conversation (2,000 rows with their `solution`, of which the run holds out 5 %; 200 other problems kept aside), the
reward the reply's last number (`final_number`: SmolLM2-135M-Instruct answers in a sentence); the rewards file also
holds `overlong`, TRL's overlong punishment (DAPO), for a run that passes it (a reply cut at the 32-token limit
otherwise keeps the last number it reached, which GRPO learned to game). Each seed runs, in a process of its own,

    minirope-posttrain --method grpo --model_name_or_path <model> --dataset_name largest \\
        --reward_funcs largest_rewards.final_number --use_peft True --seed <seed> --output_dir <output_dir>/seed-<seed>

(and `--flags`, the last of a flag given twice winning; with `--teacher_model_name_or_path`, `--method distill` and
that teacher), then scores the model given and the folder written on the 200 other problems (greedy, 16 new tokens,
batches of 50). With `--trl_defaults` each seed runs what a user of TRL would run instead: TRL's `GRPOTrainer` with
TRL's own defaults (GRPOConfig's learning rate, precision and checkpointing; LoRA from `ModelConfig(use_peft=True)`)
at the batch, steps and completion length minirope sizes for the model, with both rewards; with a teacher, TRL's
`DistillationTrainer` with DistillationConfig's defaults (its learning rate, KL weight `beta`, precision and
checkpointing) at minirope's batch, steps and completion length, the teacher's Llama export as the teacher; its adapter
merged and scored alike. One row per seed goes to
`--results` (JSON lines): the command, the machine and versions, both scores on the 200 problems, the run's own
held-out measure before and after, the kept step, the time split (TRL's `train_runtime`) and the peak resident set of
the run's process.
"""

import argparse
import importlib
import json
import random
import re
import subprocess
import sys
import time
from dataclasses import fields
from pathlib import Path

import torch
import transformers
import trl
from bench_speed import append_jsonl, command_line, cpu_description  # this folder's helpers
from datasets import Dataset, DatasetDict
from transformers import AutoModelForCausalLM, AutoTokenizer

import minirope  # noqa: F401 - the Auto classes, for the folders a run writes
from minirope.convert import to_llama
from minirope.posttraining.arguments import method_recipe
from minirope.posttraining.sizing import count_parameters, sized_defaults

# what TRL's side takes from minirope's defaults for the model, by method; the rest are TRL's own
TRL_SIZED = {
    "grpo": ("max_steps", "per_device_train_batch_size", "num_generations", "max_completion_length"),
    "distill": ("max_steps", "per_device_train_batch_size", "max_completion_length"),
}

ASK = "Which is the largest of {}, {} and {}? Answer with just the number."
REWARDS = '''import re

from trl.rewards import get_soft_overlong_punishment

# DAPO's overlong punishment (Eq. 13; TRL's): 0 up to 24 tokens, down to -1 for a reply cut at GRPO's 32
overlong = get_soft_overlong_punishment(max_completion_len=32, soft_punish_cache=8)


def final_number(completions, solution, **kwargs):
    """1.0 where the reply's last number is the row's solution."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [float((re.findall(r"-?\\d+", text) or [None])[-1] == answer) for text, answer in zip(texts, solution)]
'''
# the run in a process of its own, so that its peak resident set is its own (ru_maxrss)
CHILD = """import json, resource, sys
from minirope.commands import posttrain
out, run_dir, seed = sys.argv[1:4]
summary = posttrain.run(sys.argv[4:] + ["--seed", seed, "--output_dir", run_dir])
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
json.dump({"time_split": summary["time_split"], "peak_rss_gb": round(peak, 2)}, open(out, "w"))
"""
# --trl_defaults: TRL's `GRPOTrainer` (or with a teacher `DistillationTrainer`) with TRL's own defaults (the config's
# learning rate, precision and checkpointing; LoRA from `ModelConfig(use_peft=True)`) at the batch, steps and
# completion length minirope sizes for the model
TRL_CHILD = """import json, resource, sys
import largest_rewards
import torch
from datasets import load_from_disk
from trl import DistillationConfig, DistillationTrainer, GRPOConfig, GRPOTrainer, ModelConfig, get_peft_config
out, run_dir, seed, model, sized, teacher = sys.argv[1:7]
settings = dict(output_dir=run_dir, seed=int(seed), report_to="none", save_strategy="no", logging_steps=5,
                use_cpu=not torch.cuda.is_available(), **json.loads(sized))
if teacher:
    config, trainer_class, method = DistillationConfig(**settings), DistillationTrainer, dict(teacher_model=teacher)
else:
    config, trainer_class = GRPOConfig(**settings), GRPOTrainer
    method = dict(reward_funcs=[largest_rewards.final_number, largest_rewards.overlong])
trainer = trainer_class(
    model=model, args=config, train_dataset=load_from_disk("largest")["train"],
    peft_config=get_peft_config(ModelConfig(use_peft=True)), **method)
metrics = trainer.train().metrics
targets = sorted(trainer.model.peft_config["default"].target_modules)
trainer.model.merge_and_unload().save_pretrained(run_dir)
trainer.processing_class.save_pretrained(run_dir)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
json.dump({"train_seconds": round(metrics["train_runtime"], 1), "learning_rate": config.learning_rate,
           "beta": config.beta, "bf16": config.bf16, "lora_target_modules": targets, "peak_rss_gb": round(peak, 2)},
          open(out, "w"))
"""


def write_task(folder: Path) -> list[dict]:
    """The dataset folder `largest` and `largest_rewards.py` in `folder` (as docs/pretrained.md writes them); the 200
    other problems, returned."""
    rng = random.Random(2027)
    triples = set()
    while len(triples) < 2400:
        triples.add(tuple(rng.sample(range(10, 100), 3)))
    triples = sorted(triples)
    rng.shuffle(triples)
    rows = [{"prompt": [{"role": "user", "content": ASK.format(*triple)}], "solution": str(max(triple))}
            for triple in triples[:2200]]  # fmt: skip
    if not (folder / "largest").is_dir():
        DatasetDict({"train": Dataset.from_list(rows[:2000])}).save_to_disk(str(folder / "largest"))
    (folder / "largest_rewards.py").write_text(REWARDS)
    return rows[2000:]


@torch.no_grad()
def score(model_path: str, problems: list[dict]) -> float:
    """The share of `problems` whose greedy reply's last number is the solution."""
    model = AutoModelForCausalLM.from_pretrained(model_path, trust_remote_code=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    tokenizer.padding_side = "left"
    right = 0
    for first in range(0, len(problems), 50):
        batch = problems[first : first + 50]
        texts = [tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
                 for row in batch]  # fmt: skip
        inputs = tokenizer(texts, return_tensors="pt", padding=True)
        out = model.generate(**inputs, do_sample=False, max_new_tokens=16, pad_token_id=tokenizer.pad_token_id)
        replies = tokenizer.batch_decode(out[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
        for reply, row in zip(replies, batch, strict=True):
            right += (re.findall(r"-?\d+", reply) or [None])[-1] == row["solution"]
    return right / len(problems)


def llama_export(model: str, llama: Path) -> Path:
    """`llama`: `model` as a plain `LlamaForCausalLM` folder (`minirope.convert.to_llama`: the same weights and
    logits), what a TRL user runs; written once."""
    if not (llama / "config.json").is_file():
        to_llama(AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32), save_directory=llama)
        AutoTokenizer.from_pretrained(model).save_pretrained(llama)
    return llama


def minirope_side(run_dir: Path) -> dict:
    """What a minirope-posttrain run says of itself (`run_summary.json`): its own held-out measure before and after,
    the steps measured and kept."""
    summary = json.loads((run_dir / "run_summary.json").read_text())
    return {
        "held_out": {
            "before": summary["before"]["rewards_greedy"]["final_number"],
            "after": summary["after"]["rewards_greedy"]["final_number"],
        },
        "kept_step": summary["kept"]["kept_step"],
        "measured": summary["kept"]["measured"],
        "steps": summary["steps"],
        "warm_start_steps": (summary["warm_start"] or {}).get("steps", 0),
    }


def trl_sized(args: argparse.Namespace, model: str) -> dict:
    """TRL's side's batch, steps and completion length: what minirope uses for `model` (its sized defaults, and its
    method recipe's own batch where sizing keeps it). Exits where `model` is below the size minirope sizes for."""
    if args.flags:
        raise SystemExit("--trl_defaults runs TRL's own defaults; --flags are minirope-posttrain's: give one of them.")
    method = "distill" if args.teacher_model_name_or_path else "grpo"
    sized = sized_defaults(method, count_parameters(model))
    if not sized:
        raise SystemExit(f"--trl_defaults: {args.model} is below the size minirope sizes {method} for; give a released "
                         f"checkpoint (SmolLM2-135M-Instruct: minirope-import's folder).")  # fmt: skip
    config = importlib.import_module(f"minirope.posttraining.{method}").ARGUMENTS[1]
    ours = {**{item.name: item.default for item in fields(config)}, **method_recipe(method), **sized}
    return {name: ours[name] for name in TRL_SIZED[method]}


def trl_child(args: argparse.Namespace, model: str, folder: Path, sized: dict) -> list[str]:
    """`TRL_CHILD`'s arguments after the run's own three (results file, folder, seed): the Llama exports of the model
    and of the teacher (empty for GRPO), and the sized settings."""
    teacher = args.teacher_model_name_or_path
    teacher = str(llama_export(teacher, folder / "teacher-llama")) if teacher else ""
    return [str(llama_export(model, folder / "llama")), json.dumps(sized), teacher]


def posttrain_child(args: argparse.Namespace, model: str) -> list[str]:
    """`CHILD`'s arguments after the run's own three (results file, folder, seed): minirope-posttrain's flags."""
    method = ["--method", "grpo"]
    if args.teacher_model_name_or_path:
        teacher = str(Path(args.teacher_model_name_or_path).resolve())
        method = ["--method", "distill", "--teacher_model_name_or_path", teacher]
    return [*method, "--model_name_or_path", model, "--dataset_name", "largest", "--reward_funcs",
            "largest_rewards.final_number", "--use_peft", "True", "--overwrite_output_dir", "True",
            *args.flags]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="The released checkpoint's folder (minirope-import's).")
    parser.add_argument("--output_dir", type=Path, required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--results", type=Path, default=Path(__file__).parent / "results" / "released_task.jsonl")
    parser.add_argument(
        "--teacher_model_name_or_path",
        help="Distillation from this teacher instead of GRPO: a folder minirope wrote (e.g. a GRPO seed's).",
    )
    parser.add_argument(
        "--trl_defaults",
        action="store_true",
        help="TRL's GRPOTrainer (with a teacher: DistillationTrainer) with TRL's own defaults, at "
        "minirope's sized batch, steps and length (GRPO: both rewards), instead of minirope-posttrain.",
    )
    parser.add_argument("--flags", nargs=argparse.REMAINDER, default=[], help="minirope-posttrain's extra flags.")
    args = parser.parse_args()
    folder = args.output_dir.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    problems = write_task(folder)
    model = str(Path(args.model).resolve())
    sized = trl_sized(args, model) if args.trl_defaults else {}
    base = score(model, problems)
    print(f"{args.model}: {base:.1%} of the 200 other problems")
    for seed in args.seeds:
        run_dir, measured = folder / f"seed-{seed}", folder / f"seed-{seed}.json"
        started = time.perf_counter()
        if args.trl_defaults:
            code, rest = TRL_CHILD, trl_child(args, model, folder, sized)
        else:
            code, rest = CHILD, posttrain_child(args, model)
        run = [str(measured), str(run_dir), str(seed)]  # each child's own first three arguments
        subprocess.run([sys.executable, "-c", code, *run, *rest], cwd=folder, check=True)
        seconds = round(time.perf_counter() - started, 1)
        side = {"trl_defaults": True, "steps": sized["max_steps"]} if args.trl_defaults else minirope_side(run_dir)
        row = {
            "command": command_line(),
            "date": time.strftime("%Y-%m-%d"),
            "machine": {
                "cpu": cpu_description(),
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "trl": trl.__version__,
            },  # fmt: skip
            "model": args.model,
            "seed": seed,
            "teacher": args.teacher_model_name_or_path,
            "flags": args.flags,
            "other_problems": {"before": base, "after": score(str(run_dir), problems), "count": len(problems)},
            **side,
            "wall_seconds": seconds,
            **json.loads(measured.read_text()),
        }
        print(json.dumps(row))
        append_jsonl(args.results, row)


if __name__ == "__main__":
    main()
