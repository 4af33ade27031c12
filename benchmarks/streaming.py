"""Streaming benchmark: memory and start-up of `minirope-pretrain --streaming` do not grow with the corpus,
and reading the stream does not slow the training step.

Generates two corpora of JSON-lines shards from the bundled training plays, shuffled and repeated (one
play per row): about 10 MB (1 shard) and about 1 GB (100 shards of 10 MB). Then runs, each in its own
process under `/usr/bin/time`:

  stream-10MB, stream-1GB   --streaming over the shards, `--max_steps` 60: peak resident memory and the
                            time from the start of the run to the end of the first optimizer step
  in-memory, stream-plays   the default recipe's data (the bundled plays) in memory and streamed, 200 steps:
                            median step time and median wall time between step ends (batch fetching in)

All runs use the same tokenizer (trained once on the training plays and passed with
`--tokenizer_name_or_path`, so start-up does not include training one).

    python benchmarks/streaming.py                   # ~4 min on 2 CPU cores, 1.1 GB of disk in --dir
"""

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from minirope.training.data import VALIDATION_PLAYS, shakespeare_plays
from minirope.training.tokenizer import train_tokenizer

SHARD_BYTES = 10_000_000


def write_corpus(folder: Path, total_bytes: int, plays: list[str], seed: int = 0) -> None:
    """JSON-lines shards of ~10 MB, plays drawn at random (with repetition) until `total_bytes` of text."""
    if folder.is_dir() and any(folder.glob("*.jsonl")):
        return
    folder.mkdir(parents=True, exist_ok=True)
    rng, written, shard = random.Random(seed), 0, 0
    while written < total_bytes:
        with open(folder / f"shard-{shard:04d}.jsonl", "w", encoding="utf-8") as out:
            in_shard = 0
            while in_shard < SHARD_BYTES and written < total_bytes:
                text = rng.choice(plays)
                out.write(json.dumps({"text": text}) + "\n")
                in_shard += len(text.encode("utf-8"))
                written += len(text.encode("utf-8"))
        shard += 1


def run(name: str, flags: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"stream-{name}-") as output_dir:
        command = ["/usr/bin/time", "-f", "MAXRSS_KB=%M", sys.executable, "-m", "minirope.training.pretrain",
                   *flags, "--output_dir", output_dir, "--eval_strategy", "no", "--save_strategy", "no",
                   "--logging_steps", "50", "--disable_tqdm", "True", "--report_to", "none",
                   "--sample_max_new_tokens", "1"]  # fmt: skip
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
    args = parser.parse_args()
    root = Path(args.dir)
    plays = [text for name, text in shakespeare_plays().items() if name not in VALIDATION_PLAYS]
    write_corpus(root / "10MB", 10_000_000, plays)
    write_corpus(root / "1GB", 1_000_000_000, plays)
    tokenizer_dir = root / "tokenizer"
    if not (tokenizer_dir / "tokenizer.json").is_file():
        train_tokenizer(plays, vocab_size=4096).save_pretrained(tokenizer_dir)
    common = ["--tokenizer_name_or_path", str(tokenizer_dir)]
    rows = [
        run(
            "stream-10MB",
            [*common, "--streaming", "True", "--train_file", str(root / "10MB" / "*.jsonl"), "--max_steps", "60"],
        ),
        run(
            "stream-1GB",
            [*common, "--streaming", "True", "--train_file", str(root / "1GB" / "*.jsonl"), "--max_steps", "60"],
        ),
        run("in-memory", [*common, "--max_steps", "200"]),
        run("stream-plays", [*common, "--streaming", "True", "--max_steps", "200"]),
    ]
    Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
    print("| run | peak RSS (MB) | run start -> first step end (s) | median step (s) | median step-end interval (s) |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['run']} | {row['peak_rss_mb']} | {row['first_step_seconds']} | {row['step_seconds']} | "
              f"{row['step_interval_seconds']} |")  # fmt: skip


if __name__ == "__main__":
    main()
