"""Post-training study: lines that scan against validation bits per byte, for GRPO, DPO and distillation runs.

Every run is a real `minirope-posttrain` process from one base folder (the `make demo` model by default); a run is
`NAME:FLAGS`, the flags given to the command. Its `run_summary.json` (the share of sampled lines that scan and that
are distinct, validation bits per byte, before and after, steps, seconds) is recorded under NAME, with the CPU
and the versions. `--interpolate NAME` then measures the weights `start + a * (tuned - start)` of that run's folder
for each `--alphas` value without training again (what `--weight_interpolation a` saves), so the frontier of a run
is read from one training.

    python benchmarks/post_training.py "grpo:--method grpo" "dpo:--method dpo"          # minutes each
    python benchmarks/post_training.py --interpolate grpo --alphas 0.25 0.5 0.75
    python benchmarks/post_training.py --plot

Results accumulate in benchmarks/results/post_training.json (a rerun of a name replaces it); the plot of lines that
scan against bits per byte is docs/post_training_frontier.png. Run one at a time for the wall times to mean
something: two runs on 2 cores slow each other down.
"""

import argparse
import json
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from bench_speed import command_line  # noqa: E402 - this folder's helpers

ROOT = Path(__file__).parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "post_training.json"
PLOT = ROOT / "docs" / "post_training_frontier.png"


def machine() -> dict:
    import trl

    from minirope.machine import cpu_model_name

    return {
        "cpu": cpu_model_name(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
    }


def load(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def save(path: Path, results: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")


def run_one(name: str, flags: str, base: str, runs: Path) -> dict:
    """One `minirope-posttrain` process into `runs/NAME`; its summary with the wall time of the whole process."""
    output = runs / name
    command = [sys.executable, "-m", "minirope.commands.posttrain", "--model_name_or_path", base,
               "--output_dir", str(output), *shlex.split(flags)]  # fmt: skip
    started = time.perf_counter()
    subprocess.run(command, check=True)
    summary = json.loads((output / "run_summary.json").read_text())
    summary.pop("samples")
    return {
        **summary,
        "flags": flags,
        "process_seconds": round(time.perf_counter() - started, 1),
        "folder": str(output),
    }


def validation_bits_per_byte(model, tokenizer) -> float:
    """Whole-text bits per byte of the bundled validation plays, as `minirope-posttrain` measures it."""
    from minirope.data.bundled import bundled_shards
    from minirope.posttraining.measures import bits_per_byte

    return bits_per_byte(model, tokenizer, bundled_shards("validation"))


def lm_baseline(name: str, record: dict, runs: Path) -> dict:
    """A distillation run's baseline without the teacher: the same student, steps, batch, learning rate and schedule,
    trained on the training plays' text (`minirope-finetune`, language-modelling loss, blocks of the model's context),
    scored with the same whole-text validation bits per byte."""
    from minirope.data.bundled import shakespeare_dataset
    from minirope.folders import ModelArguments, load_causal_lm

    plays = runs / "plays"
    for split, dataset in shakespeare_dataset().items():
        (plays / split).mkdir(parents=True, exist_ok=True)
        for text, source in zip(dataset["text"], dataset["source"], strict=True):
            (plays / split / f"{source}.txt").write_text(text)
    output = runs / name
    command = [
        sys.executable, "-m", "minirope.commands.finetune", "--model_name_or_path", record["base_model"],
        "--output_dir", str(output), "--train_file", *map(str, sorted((plays / "train").glob("*.txt"))),
        "--validation_file", *map(str, sorted((plays / "validation").glob("*.txt"))),
        "--max_steps", str(record["steps"]), "--per_device_train_batch_size", str(record["batch_size"]),
        "--learning_rate", str(record["learning_rate"]), "--lr_scheduler_type", "linear", "--warmup_steps", "0",
        "--weight_decay", "0", "--bf16", "False", "--torch_compile", "False", "--eval_strategy", "no",
        "--save_strategy", "no", "--overwrite_output_dir", "True",
    ]  # fmt: skip
    started = time.perf_counter()
    subprocess.run(command, check=True)
    model, tokenizer = load_causal_lm(ModelArguments(str(output)))
    return {
        "method": "lm (no teacher)",
        "base_model": record["base_model"],
        "steps": record["steps"],
        "process_seconds": round(time.perf_counter() - started, 1),
        "before": {"validation_bits_per_byte": record["before"]["validation_bits_per_byte"]},
        "after": {"validation_bits_per_byte": validation_bits_per_byte(model, tokenizer)},
        "folder": str(output),
    }


def interpolate(record: dict, alphas: list[float], args) -> dict:
    """The verse measure and bits per byte of `start + a * (tuned - start)` for each `a`, from the run's folder."""
    from datasets import Dataset

    from minirope.folders import ModelArguments, load_causal_lm
    from minirope.posttraining.corpus import interpolate_weights
    from minirope.posttraining.sampling import SAMPLING, sample
    from minirope.posttraining.tasks.verse import validation_headers, verse_measure

    base, tokenizer = load_causal_lm(ModelArguments(record["base_model"]))
    start = {name: param.detach().clone() for name, param in base.named_parameters()}
    points = {}
    for alpha in alphas:
        model, _ = load_causal_lm(ModelArguments(record["folder"]))
        interpolate_weights(model, start, alpha)
        headers = Dataset.from_dict({"prompt": validation_headers(args.eval_prompts)})
        samples = sample(model, tokenizer, headers, args.num_generations_eval, args.eval_max_new_tokens, 0, SAMPLING)
        verse = verse_measure(samples.completions)
        bits = validation_bits_per_byte(model, tokenizer)
        points[str(alpha)] = {**verse.as_dict(), "validation_bits_per_byte": bits}
        print(f"{alpha}: {verse.scan_share:.1%} scan, {verse.distinct_share:.1%} distinct, {bits:.4f} bits/byte")
    return points


def plot(results: dict, path: Path) -> None:
    """Left: lines that scan against validation bits per byte, each GRPO/DPO run (the defaults large, other runs small)
    and the weight interpolations measured from it (dashed, from the run to the base model). Right, for the runs that
    measured it: lines iambic by stress against distinct words per word (the vocabulary a model games a count with
    shrinks), with issue 52's aims (50 % iambic, 0.9x the base's words per word)."""
    fig, (ax, meter) = plt.subplots(1, 2, figsize=(13, 4.8))
    runs = {name: record for name, record in results.items() if record.get("method") in ("grpo", "dpo")}
    base = next((record["before"] for record in runs.values()), None)
    if base:
        ax.scatter([base["validation_bits_per_byte"]], [100 * base["scan_share"]], c="black", marker="*", s=150,
                   label="base model (make demo)", zorder=3)  # fmt: skip
        ax.axvline(base["validation_bits_per_byte"] + 0.05, color="grey", linestyle=":", label="base + 0.05 bits/byte")
    colors = {"grpo": "tab:blue", "dpo": "tab:orange"}
    for name, record in sorted(runs.items()):
        after, color, default = record["after"], colors[record["method"]], not name.startswith("sweep-")
        x, y = after["validation_bits_per_byte"], 100 * after["scan_share"]
        ax.scatter([x], [y], color=color, s=110 if default else 25, edgecolors="black" if default else "none",
                   label=f"{record['method']} (defaults)" if default else None, zorder=2)  # fmt: skip
        if not default:
            ax.annotate(name.removeprefix("sweep-"), (x, y), fontsize=6, xytext=(3, 2), textcoords="offset points")
        curve = sorted(record.get("interpolation", {}).items(), key=lambda item: float(item[0]))
        if curve and base:
            xs = [base["validation_bits_per_byte"], *(p["validation_bits_per_byte"] for _, p in curve), x]
            ys = [100 * base["scan_share"], *(100 * p["scan_share"] for _, p in curve), y]
            ax.plot(xs, ys, "--", color=color, alpha=0.5, marker=".")
        if "iambic_share" in after:
            words, iambic = after["distinct_words_per_word"], 100 * after["iambic_share"]
            meter.scatter([words], [iambic], color=color, s=110 if default else 25,
                          edgecolors="black" if default else "none", zorder=2)  # fmt: skip
            meter.annotate(name.removeprefix("sweep-"), (words, iambic), fontsize=6, xytext=(3, 2),
                           textcoords="offset points")  # fmt: skip
    measured = [record["before"] for record in runs.values() if "iambic_share" in record["before"]]
    meter.set_title("Meter against vocabulary")
    if measured:
        start = measured[0]
        meter.scatter([start["distinct_words_per_word"]], [100 * start["iambic_share"]], c="black", marker="*", s=150,
                      label="base model (make demo)", zorder=3)  # fmt: skip
        meter.axvline(0.9 * start["distinct_words_per_word"], color="grey", linestyle=":", label="0.9x the base's")
        meter.axhline(50, color="grey", linestyle="--", label="50 % iambic")
        meter.legend(fontsize=7, loc="lower left")
        wide = 2 * start["distinct_words_per_word"]  # past it only runs that gamed word_variety_reward (odd words)
        off = sum(r["after"].get("distinct_words_per_word", 0) > wide for r in runs.values())
        meter.set_xlim(0, wide)
        if off:
            meter.set_title(f"Meter against vocabulary ({off} runs past 2x the base's not shown)")
    meter.set_xlabel("distinct words per word over the 768 sampled lines (higher: a wider vocabulary)")
    meter.set_ylabel("sampled lines iambic by stress (%)")
    ax.set_xlabel("validation bits per byte (the 4 validation plays, whole text; lower is better)")
    ax.set_ylabel("sampled lines that scan (%)")
    ax.set_title("Post-training the make demo model: lines that scan against forgetting")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"plot written to {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="*", help="NAME:FLAGS for minirope-posttrain")
    parser.add_argument("--base", default="runs/minirope-shakespeare", help="the folder every run starts from")
    parser.add_argument("--runs_dir", type=Path, default=Path("runs/post_training"))
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--plot_path", type=Path, default=PLOT)
    parser.add_argument("--interpolate", help="NAME of a recorded run to interpolate with its base")
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.25, 0.5, 0.75])
    parser.add_argument("--eval_prompts", type=int, default=16)
    parser.add_argument("--num_generations_eval", type=int, default=16)
    parser.add_argument("--eval_max_new_tokens", type=int, default=64)
    parser.add_argument("--lm_baseline", help="NAME of a recorded distill run: train its student without the teacher")
    parser.add_argument("--plot", action="store_true", help="only redraw the plot")
    args = parser.parse_args()

    results = load(args.results)
    for run in args.runs:
        name, _, flags = run.partition(":")
        command = command_line(*(arg for arg in sys.argv[1:] if arg == run or arg not in args.runs))
        results[name] = {**run_one(name, flags, args.base, args.runs_dir), "machine": machine(), "command": command}
        save(args.results, results)
        after = results[name]["after"]
        print(f"{name}: {after['scan_share']:.1%} scan, {after['distinct_share']:.1%} distinct, "
              f"{after['validation_bits_per_byte']:.4f} bits/byte, {results[name]['train_seconds']} s")  # fmt: skip
    if args.lm_baseline:
        name = f"{args.lm_baseline}-without-teacher"
        command = command_line(*(arg for arg in sys.argv[1:] if arg not in args.runs))
        results[name] = {**lm_baseline(name, results[args.lm_baseline], args.runs_dir), "machine": machine(),
                         "command": command}  # fmt: skip
        save(args.results, results)
        print(f"{name}: {results[name]['after']['validation_bits_per_byte']:.4f} bits/byte")
    if args.interpolate:
        record = results[args.interpolate]
        record["interpolation"] = {**record.get("interpolation", {}), **interpolate(record, args.alphas, args)}
        save(args.results, results)
    if results:
        plot(results, args.plot_path)


if __name__ == "__main__":
    main()
