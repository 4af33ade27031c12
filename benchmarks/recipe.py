"""Recipe study: each lever of the default pretraining recipe, measured as validation bits per byte.

Every run is a real `minirope-pretrain` process (the same command `make demo` runs), on whole-document
tokenization, scored on the four validation plays exactly as the run reports it (`eval_bits_per_byte`).
A run is `NAME:FLAGS`, the flags added to the default recipe (`--max_steps` sets its length); the wall
time it took (training alone, and the whole process) is recorded next to its score, so levers are
compared at equal wall time on the machine that ran them, and its compute budget as the run prints it
(`budget_gflop_seconds`: training seconds, evaluation and checkpoints left out, x the measured float32 peak).
Rows recorded before that figure existed in this form (those without `train_runtime`) hold steps x median
step x peak instead, which leaves out slow steps as well.

    python benchmarks/recipe.py "bs8:--per_device_train_batch_size 8 --max_steps 390"   # minutes each
    python benchmarks/recipe.py --plot                      # redraw the plot from the results file

Results accumulate in benchmarks/results/recipe.json (one entry per run name; a rerun replaces it); the
plot of bits per byte against training time is docs/recipe_wall_time.png. Run one at a time: two
trainings on 2 cores slow each other down far more than 2x (OpenMP threads contend).
"""

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from bench_speed import command_line  # noqa: E402 - this folder's helpers

RESULTS = Path(__file__).parent / "results" / "recipe.json"
PLOTS = Path(__file__).parent.parent / "docs"  # recipe_wall_time.png, recipe_curves.png, recipe_budget.png
# Runs named "curve-SERIES@MINUTES" are drawn as one line per series in recipe_curves.png (against training time),
# runs named "budget-SERIES@STEPS" in recipe_budget.png (against the training compute in model FLOPs, the same on
# every machine; rows run before `minirope-pretrain` reported it carry the figure computed from their config).
CURVE_LABELS = {
    "wsd": "new recipe: warmup-stable-decay (last 25 %)",
    "cosine": "the previous schedule: cosine (same model, batch, lr)",
    "old": "previous recipe: AdamW, 6 layers x 64 (0.84M)",
    "new": "Muon + AdamW, 3 layers x 96 (1.15M): the first Muon recipe (2026-11-23)",
    "final": "+ Llama 3's pre-tokenizer, lr 4e-3, no clipping, 30 % decay (2026-11-24)",
}


def run(name: str, flags: list[str], keep: Path | None) -> dict:
    """One `minirope-pretrain` process with `flags`; its run summary plus the process's wall time."""
    output_dir = keep / name if keep else Path(tempfile.mkdtemp(prefix=f"recipe-{name}-"))
    command = [sys.executable, "-m", "minirope.commands.pretrain", "--output_dir", str(output_dir), *flags]
    command += ["--overwrite_output_dir", "True", "--eval_strategy", "no", "--save_strategy", "no"]
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    summary = json.loads((output_dir / "run_summary.json").read_text())
    train = json.loads((output_dir / "train_results.json").read_text())
    return {
        "flags": flags,
        "bits_per_byte": summary["validation_bits_per_byte"],
        "steps": summary["steps"],
        "train_tokens": summary["train_tokens"],
        "num_parameters": summary["num_parameters"],
        "train_seconds": summary["train_seconds"],
        "train_runtime": round(train["train_runtime"], 1),
        "process_seconds": round(time.perf_counter() - started, 1),
        "step_seconds": summary.get("step_seconds"),
        "matmul_peak_gflops": round(summary["matmul_peak_tflops"] * 1e3, 1),
        "budget_gflop_seconds": summary["budget_gflop_seconds"],
        "model_flops": summary["train_model_flops"],
    }


def training_minutes(result: dict) -> float:
    """Steps x the run's median step time: the training time without pauses caused by other work on the host (a
    run too short for a median after warm-up: its training seconds)."""
    if result["step_seconds"] is None:
        return result["train_seconds"] / 60
    return result["steps"] * result["step_seconds"] / 60


def plot(results: dict, path: Path) -> None:
    """Bits per byte against training time, one point per run, labelled with its name."""
    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=120)
    for name, result in sorted(results.items()):
        if name.startswith(("curve-", "budget-")):
            continue
        x, y = training_minutes(result), result["bits_per_byte"]
        ax.plot(x, y, "o", color="tab:red" if name.startswith("old") else "tab:blue")
        ax.annotate(name, (x, y), textcoords="offset points", xytext=(5, 3), fontsize=8)
    ax.set_xlabel("training time (minutes: steps x median step time, 2-core CPU, float32)")
    ax.set_ylabel("validation bits per byte (whole plays)")
    ax.set_title("minirope-pretrain levers: quality against training time")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_curves(results: dict, prefix: str, x_of, xlabel: str, title: str, path: Path) -> None:
    """Bits per byte against `x_of(result)` for each "PREFIX-SERIES@BUDGET" series (one run per point)."""
    series: dict[str, list[tuple[float, float]]] = {}
    for name, result in results.items():
        if name.startswith(prefix):
            label = name.removeprefix(prefix).partition("@")[0]
            series.setdefault(label, []).append((x_of(result), result["bits_per_byte"]))
    if not series:
        return
    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=120)
    for label, points in sorted(series.items()):
        xs, ys = zip(*sorted(points), strict=True)
        ax.plot(xs, ys, "o-", label=CURVE_LABELS.get(label, label))
        for x, y in zip(xs, ys, strict=True):
            ax.annotate(f"{y:.3f}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("validation bits per byte (whole plays)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="*", help="runs as 'NAME:--flag value --flag value'")
    parser.add_argument("--keep", type=Path, help="keep each run's folder under this directory")
    parser.add_argument("--plot", action="store_true", help="only redraw the plot")
    parser.add_argument("--results", type=Path, default=RESULTS, help="the results file runs are added to")
    parser.add_argument("--plots", type=Path, default=PLOTS, help="the folder the three plots are drawn in")
    args = parser.parse_args()
    results = json.loads(args.results.read_text()) if args.results.is_file() else {}
    for spec in args.runs:
        name, _, flags = spec.partition(":")
        result = run(name, flags.split(), args.keep)
        result.update(
            machine=platform.processor() or platform.machine(),
            torch=torch.__version__,
            command=command_line(*(arg for arg in sys.argv[1:] if arg == spec or arg not in args.runs)),
        )
        results[name] = result
        args.results.parent.mkdir(parents=True, exist_ok=True)
        args.results.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
        print(
            f"{name:24s} {result['bits_per_byte']:.4f} bits/byte  {result['steps']} steps  "
            f"{result['train_seconds']:.0f} s training  {result['process_seconds']:.0f} s in all  "
            f"{result['model_flops'] / 1e12:.3g} model TFLOPs  "
            f"budget {result['budget_gflop_seconds']:,} GFLOP-s (this CPU's)",
            flush=True,
        )
    for name, result in sorted(results.items(), key=lambda item: item[1]["bits_per_byte"]):
        print(f"{name:24s} {result['bits_per_byte']:.4f} bits/byte in {training_minutes(result):.1f} min of training")
    args.plots.mkdir(parents=True, exist_ok=True)
    plot(results, args.plots / "recipe_wall_time.png")
    minutes = "training time (minutes: steps x median step time, 2-core CPU, float32)"
    title = "default model (hidden 64, batch 8, AdamW lr 3e-3): a separate run per budget"
    plot_curves(results, "curve-", training_minutes, minutes, title, args.plots / "recipe_curves.png")
    budget = "training compute (model TFLOPs: FLOPs per token x tokens trained, the same on every machine)"
    title = "three recipes: a separate run per budget"
    plot_curves(
        results,
        "budget-",
        lambda result: result["model_flops"] / 1e12,
        budget,
        title,
        args.plots / "recipe_budget.png",
    )


if __name__ == "__main__":
    main()
