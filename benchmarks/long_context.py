"""Long-context study: extend the default model from 256 tokens to 4x and 8x with each RoPE scaling type,
with and without a short fine-tune, and measure what the longer context buys (docs/long_context.md).

For each factor (4, 8), type (default, linear, dynamic, yarn, llama3) and seed, one `minirope-extend` run
with the same budget: `--max_steps` steps of 4096 tokens (batch 4 x 1024 at 4x, 2 x 2048 at 8x). Each run
evaluates the scaled model before fine-tuning (= inference-time scaling alone; the `default` type before
fine-tuning is the base model itself) and after, at 256, 512, 1024 and 2048 tokens (sliding windows that
score their last quarter), and runs the repeat test at every distance of `minirope.training.repeat_test.DISTANCES`.

    python benchmarks/long_context.py --base runs/minirope-shakespeare     # ~50 min on 2 CPU cores
    python benchmarks/long_context.py --base DIR --factors 4 --types yarn --seeds 1 --max_steps 20  # smoke

Results go to `--out`.json after every run (a rerun skips the runs already there) and the plots to
`--out`.png / `--out`_repeat.png; the tables are printed in markdown.
"""

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from minirope.commands import extend  # noqa: E402
from minirope.rope_scaling import EXTENSIONS
from minirope.training.repeat_test import DISTANCES  # noqa: E402

EVAL_SIZES = (256, 512, 1024, 2048)
TOKENS_PER_STEP = 4096


def run_one(args, rope_type: str, factor: int, seed: int) -> dict:
    block = 256 * factor
    with tempfile.TemporaryDirectory(prefix=f"long-{rope_type}-{factor}-") as output_dir:
        # fmt: off
        argv = [
            "--model_name_or_path", args.base, "--rope_type", rope_type, "--factor", str(factor),
            "--seed", str(seed), "--max_steps", str(args.max_steps),
            "--per_device_train_batch_size", str(TOKENS_PER_STEP // block),
            "--eval_block_sizes", *map(str, EVAL_SIZES), "--eval_document_tokens", str(args.eval_document_tokens),
            "--repeat_distances", *map(str, DISTANCES), "--output_dir", output_dir, "--report_to", "none",
            "--learning_rate", str(args.learning_rate), "--repeat_fraction", str(args.repeat_fraction),
            "--bf16", "False", "--disable_tqdm", "True",
        ]
        # fmt: on
        return extend.run(argv)


def mean(values: list[float]) -> float:
    return statistics.fmean(values)


def tables(results: dict, factors, types) -> str:
    lines = [
        "| factor | type | fine-tuned | "
        + " | ".join(f"{n}" for n in EVAL_SIZES)
        + " | repeat ratio at D = "
        + ", ".join(map(str, DISTANCES))
        + " |",
        "|" + "---|" * (4 + len(EVAL_SIZES)),
    ]
    for factor in factors:
        for rope_type in types:
            runs = [run for key, run in results.items() if key.startswith(f"{rope_type}-{factor}-")]
            if not runs:
                continue
            for when, label in (("before", "no"), ("after", f"{runs[0]['steps']} steps x {len(runs)} seeds")):
                bpb = [mean([run[f"{when}_{n}_bits_per_byte"] for run in runs]) for n in EVAL_SIZES]
                ratios = [mean([run[f"repeat_{when}"][i]["ratio"] for run in runs]) for i in range(len(DISTANCES))]
                spread = ""
                if when == "after" and len(runs) > 1:
                    spread = (
                        " (seeds: " + " / ".join(f"{run['after_1024_bits_per_byte']:.3f}" for run in runs) + " at 1024)"
                    )
                lines.append(
                    f"| {factor}x | {rope_type} | {label}{spread} | "
                    + " | ".join(f"{v:.3f}" for v in bpb)
                    + " | "
                    + " ".join(f"{r:.2f}" for r in ratios)
                    + " |"
                )
    return "\n".join(lines)


def plot(results: dict, factors, types, out: Path) -> None:
    colors = dict(zip(EXTENSIONS, ("black", "tab:blue", "tab:orange", "tab:green", "tab:red"), strict=True))
    for kind in ("bpb", "repeat"):
        fig, axes = plt.subplots(1, len(factors), figsize=(6.2 * len(factors), 4.4), dpi=120, squeeze=False)
        for ax, factor in zip(axes[0], factors, strict=True):
            for rope_type in types:
                runs = [run for key, run in results.items() if key.startswith(f"{rope_type}-{factor}-")]
                if not runs:
                    continue
                for when, style in (("before", "--"), ("after", "o-")):
                    if kind == "bpb":
                        x = EVAL_SIZES
                        y = [mean([run[f"{when}_{n}_bits_per_byte"] for run in runs]) for n in x]
                    else:
                        x = DISTANCES
                        y = [mean([run[f"repeat_{when}"][i]["ratio"] for run in runs]) for i in range(len(x))]
                    label = f"{rope_type}, " + ("fine-tuned" if when == "after" else "no fine-tuning")
                    if rope_type == "default" and when == "before":
                        label = "base model (256-token training)"
                    ax.plot(
                        x,
                        y,
                        style,
                        color=colors[rope_type],
                        label=label,
                        linewidth=1.3,
                        markersize=4,
                        alpha=1.0 if when == "after" else 0.6,
                    )
            ax.axvline(256 if kind == "bpb" else 256 - 129, color="grey", linewidth=0.8, linestyle=":")
            ax.axvline(256 * factor if kind == "bpb" else 256 * factor - 129, color="grey", linewidth=0.8)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("evaluation context (tokens)" if kind == "bpb" else "distance D (filler tokens)")
            ax.set_ylabel(
                "validation bits per byte" if kind == "bpb" else "repeat bits/byte / first-occurrence bits/byte"
            )
            if kind == "bpb":
                ax.set_ylim(top=min(ax.get_ylim()[1], 2.6))
            ax.set_title(f"extended {factor}x (256 -> {256 * factor} tokens)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        fig.savefig(out.with_name(out.name + ("" if kind == "bpb" else "_repeat") + ".png"))
        plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="runs/minirope-shakespeare", help="The default pretrained model folder.")
    parser.add_argument("--factors", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--types", nargs="+", default=list(EXTENSIONS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--max_steps", type=int, default=extend.ExtendingArguments.max_steps)
    parser.add_argument("--learning_rate", type=float, default=extend.ExtendingArguments.learning_rate)
    parser.add_argument("--repeat_fraction", type=float, default=extend.ExtendDataArguments.repeat_fraction)
    parser.add_argument("--eval_document_tokens", type=int, default=8192, help="Scored tokens per validation play.")
    parser.add_argument("--out", default="docs/long_context")
    args = parser.parse_args()
    out = Path(args.out)
    path = out.with_suffix(".json")
    results = json.loads(path.read_text()) if path.exists() else {}
    for factor in args.factors:
        for rope_type in args.types:
            for seed in args.seeds:
                key = f"{rope_type}-{factor}-{seed}"
                if key in results:
                    continue
                results[key] = run_one(args, rope_type, factor, seed)
                path.write_text(json.dumps(results, indent=1))
                plot(results, args.factors, args.types, out)
    print(tables(results, args.factors, args.types))
    plot(results, args.factors, args.types, out)


if __name__ == "__main__":
    main()
