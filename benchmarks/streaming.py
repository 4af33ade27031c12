"""Streaming benchmark: memory and start-up of `minirope-pretrain --streaming` grow with neither the corpus nor its
documents, and reading the stream does not slow the training step.

Generates corpora from the bundled training plays (shuffled, repeated, cut to size) in three shapes:

    1KB-jsonl   documents of ~1 kB, one per JSON line, in shards of 100 MB
    1MB-txt     documents of ~1 MB, one per .txt file
    500MB-txt   one .txt document of 500 MB

at several total sizes, then runs each corpus in its own process under `/usr/bin/time` with the default model,
`--streaming`, `--max_steps 60`: peak resident memory, the time from the start of the run to the end of the first
optimizer step, and the median step time. All runs use the same tokenizer, trained once on the training plays and
passed with `--tokenizer_name_or_path`, so that start-up does not include training one; two more runs train the
tokenizer on a sample (`--tokenizer_sample_bytes`) of the largest corpora, and three alternating pairs compare the
default recipe's data (the bundled plays) in memory and streamed over 200 steps (median step time and step-end
interval; the host's noise between runs of the same work is larger than the difference, hence the pairs).

    python benchmarks/streaming.py                  # ~35 min on 2 CPU cores, ~5 GB of disk in --dir
    python benchmarks/streaming.py --sections compare
"""

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_speed import cpu_description  # the benchmarks' CPU description (this folder is on sys.path when run)

from minirope.data.bundled import VALIDATION_PLAYS, shakespeare_plays
from minirope.data.tokenizer import train_tokenizer

MB = 1_000_000


def text_stream(plays: list[str], seed: int):
    """Endless text: the training plays, in random order, again and again."""
    rng = random.Random(seed)
    while True:
        yield rng.choice(plays)


def write_corpus(folder: Path, shape: str, total: int, plays: list[str], unit: int = MB) -> str:
    """Write `total` bytes of text in `shape` under `folder` (once); returns the --train_file glob. The shapes'
    sizes (100 MB shards, 1 MB and 500 MB documents) are in `unit`s of bytes (`--scale`)."""
    pattern = {"1KB-jsonl": "*.jsonl", "1MB-txt": "*.txt", "500MB-txt": "*.txt"}[shape]
    if folder.is_dir() and (folder / "done").is_file():
        return str(folder / pattern)
    folder.mkdir(parents=True, exist_ok=True)
    texts, written = text_stream(plays, seed=total), 0
    if shape == "1KB-jsonl":
        shard = 0
        while written < total:
            with open(folder / f"shard-{shard:04d}.jsonl", "w", encoding="utf-8") as out:
                while out.tell() < min(100 * unit, total - written):
                    play = next(texts)
                    for start in range(0, len(play), 1000):  # 1 kB documents, cut between speeches or not
                        out.write(json.dumps({"text": play[start : start + 1000]}) + "\n")
                written += out.tell()
            shard += 1
    else:
        size = 1 * unit if shape == "1MB-txt" else 500 * unit
        number = 0
        while written < total:
            with open(folder / f"doc-{number:05d}.txt", "w", encoding="utf-8") as out:
                while out.tell() < size:
                    out.write(next(texts))
                written += out.tell()
            number += 1
    (folder / "done").write_text("")
    return str(folder / pattern)


def run(name: str, flags: list[str], extra: str = "") -> dict:
    with tempfile.TemporaryDirectory(prefix=f"stream-{name}-") as output_dir:
        command = ["/usr/bin/time", "-f", "MAXRSS_KB=%M", sys.executable, "-m", "minirope.commands.pretrain",
                   *flags, "--output_dir", output_dir, "--eval_strategy", "no", "--save_strategy", "no",
                   "--logging_steps", "50", "--disable_tqdm", "True", "--report_to", "none",
                   "--sample_max_new_tokens", "1", "--max_eval_samples", "8", *extra.split()]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"{name} failed:\n{result.stderr[-3000:]}")
        summary = json.loads((Path(output_dir) / "run_summary.json").read_text())
    rss = [line for line in result.stderr.splitlines() if line.startswith("MAXRSS_KB=")][-1]
    row = {
        "run": name,
        "peak_rss_mb": round(int(rss.split("=")[1]) / 1024),
        **{
            key: summary.get(key)
            for key in ("first_step_seconds", "step_seconds", "step_interval_seconds", "wall_seconds")
        },
    }
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default="/tmp/minirope-streaming", help="Where the corpora and tokenizer go.")
    parser.add_argument("--out", default="docs/streaming.json")
    parser.add_argument("--sections", nargs="+", default=["corpora", "tokenizer", "compare"],
                        choices=["corpora", "tokenizer", "compare"])  # fmt: skip
    parser.add_argument("--pairs", type=int, default=3, help="In-memory / stream pairs to compare.")
    parser.add_argument("--scale", type=float, default=1.0, help="Corpus sizes x this (0.001: kB instead of MB).")
    parser.add_argument("--steps", type=int, default=60, help="Training steps of each corpus run (pairs: 200).")
    parser.add_argument("--pretrain_flags", default="", help="Flags added to every run, e.g. a smaller model.")
    args = parser.parse_args()
    unit, steps, extra = int(args.scale * MB), str(args.steps), args.pretrain_flags
    root = Path(args.dir)
    plays = [text for name, text in shakespeare_plays().items() if name not in VALIDATION_PLAYS]
    tokenizer_dir = root / "tokenizer"
    if not (tokenizer_dir / "tokenizer.json").is_file():
        train_tokenizer(plays, vocab_size=4096).save_pretrained(tokenizer_dir)
    given = ["--tokenizer_name_or_path", str(tokenizer_dir)]
    corpora = [("1KB-jsonl", 10), ("1MB-txt", 10), ("1KB-jsonl", 2000), ("1MB-txt", 2000), ("500MB-txt", 500)]
    rows = []
    for shape, total in corpora if "corpora" in args.sections else []:
        files = write_corpus(root / f"{shape}-{total * unit}B", shape, total * unit, plays, unit)
        flags = [*given, "--streaming", "True", "--train_file", files, "--max_steps", steps]
        name = f"stream {shape} {total * unit / MB:g} MB"
        rows.append({**run(name, flags, extra), "shape": shape, "corpus_mb": total * unit / MB})
    for shape, total, sample in (
        [("500MB-txt", 500, 50), ("1MB-txt", 2000, 1000)] if "tokenizer" in args.sections else []
    ):
        files = write_corpus(root / f"{shape}-{total * unit}B", shape, total * unit, plays, unit)
        flags = ["--streaming", "True", "--train_file", files, "--max_steps", steps,
                 "--tokenizer_sample_bytes", str(sample * unit)]  # fmt: skip
        rows.append(run(f"stream {shape} {total * unit / MB:g} MB, tokenizer trained on {sample * unit / MB:g} MB",
                        flags, extra))  # fmt: skip
    for pair in range(args.pairs if "compare" in args.sections else 0):
        pair_steps = str(args.steps * 10 // 3)
        rows.append(run(f"in memory, bundled plays ({pair + 1})", [*given, "--max_steps", pair_steps], extra))
        stream = [*given, "--streaming", "True", "--max_steps", pair_steps]
        rows.append(run(f"stream, bundled plays ({pair + 1})", stream, extra))
    out = Path(args.out)
    previous = json.loads(out.read_text())["rows"] if out.is_file() else []
    names = {row["run"] for row in rows}
    rows = [row for row in previous if row["run"] not in names] + rows  # a section re-run replaces its rows
    out.write_text(json.dumps({"cpu": cpu_description(), "rows": rows}, indent=1) + "\n")
    print(f"\n{cpu_description()}\n")
    print("| run | peak RSS (MB) | run start -> first step end (s) | median step (s) | median step-end interval (s) |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['run']} | {row['peak_rss_mb']:,} | {row['first_step_seconds']} | {row['step_seconds']} | "
              f"{row['step_interval_seconds']} |")  # fmt: skip


if __name__ == "__main__":
    main()
