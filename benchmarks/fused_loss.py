"""The Trainer's loss step, minirope's fused loss against LlamaForCausalLM's logits and `ForCausalLMLoss`.

    python benchmarks/fused_loss.py                                   # CPU, float32, V = 4,096 / 32,000 / 128,256
    python benchmarks/fused_loss.py --device cuda --dtype bfloat16 --shape 125M 1B
    python benchmarks/fused_loss.py --vocab 128256 --chunk_rows 64 256 1024   # sweep minirope's rows per chunk

One step = forward with labels + backward (no optimizer), the way each model trains under the Trainer: minirope
with `skip_logits=True` (the `(N, V)` logits never exist in full, `LinearCrossEntropy`), Llama with its logits
and transformers' `ForCausalLMLoss`; same config and weights. Each (model, vocabulary) runs in a fresh process,
which reports the median step time of `--reps` steps after one warm-up, and the rise of its peak memory over the
memory held before the first step: the resident set (Linux VmHWM - VmRSS) on CPU, `max_memory_allocated` on
CUDA. minirope's and Llama's processes alternate for `--rounds` rounds, and each figure is the median over rounds
(the same work varied by 30 % from one process to the next on a 2-core host).
A fresh process per measurement matters: the allocator keeps freed pages, so a second run in one process looks free.

Shapes: `small` (the default) is 2 layers of width 256 at batch 4 x 256, where the head and loss dominate; `125M`
and `1B` are the GPU shapes of issue 24 (12 x 768, batch 16 x 1024; 16 x 2048 with GQA 32/8, batch 4 x 2048).

Prints a markdown table and writes `--output` (default benchmarks/results/fused_loss.json) with the machine (CPU
model and flags, or the GPU) and the torch and transformers versions.
"""

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import torch
import transformers
from bench_speed import command_line, cpu_description, timed  # this folder's helpers

RESULTS = Path(__file__).parent / "results"
SHAPES = {
    "small": (dict(hidden_size=256, intermediate_size=688, num_hidden_layers=2, num_attention_heads=4), (4, 256)),
    "125M": (dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12), (16, 1024)),
    "1B": (
        dict(
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=16,
            num_attention_heads=32,
            num_key_value_heads=8,
        ),
        (4, 2048),
    ),
}
VOCABS = {"small": [4096, 32000, 128256], "125M": [32000], "1B": [128256]}


def memory_kib() -> dict[str, int]:
    """The resident set now and its peak so far (Linux /proc/self/status), in KiB."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return {key: int(fields[key].split()[0]) for key in ("VmRSS", "VmHWM")}


def worker(model_name: str, shape: str, vocab_size: int, device: str, dtype: str, reps: int, rows: int) -> dict:
    """One (model, vocabulary) in this process: median step seconds and peak memory rise in MiB."""
    from minirope import MiniRopeConfig, MiniRopeForCausalLM
    from minirope import kernels_minirope as kernels
    from minirope.convert import to_llama
    from minirope.training.arguments import reuse_freed_memory

    reuse_freed_memory()
    torch.manual_seed(0)
    fields, (batch, length) = SHAPES[shape]
    config = MiniRopeConfig(**fields, vocab_size=vocab_size, max_position_embeddings=length, tie_word_embeddings=False)
    model = MiniRopeForCausalLM(config)
    if model_name == "llama":
        model = to_llama(model)
    model.to(device).train()
    input_ids = torch.randint(0, vocab_size, (batch, length), device=device)
    extra = {"skip_logits": True} if model_name == "minirope" else {}
    if rows:
        kernels.loss_chunk_rows = lambda *args: rows
    autocast = torch.autocast(device, dtype=getattr(torch, dtype), enabled=dtype != "float32")

    def step() -> None:
        with autocast:
            loss = model(input_ids=input_ids, labels=input_ids, **extra).loss
        loss.backward()
        model.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()

    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        before = memory_kib()["VmRSS"] * 1024
    seconds = timed(step, reps)  # one warm-up step, then the median of `reps`
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else memory_kib()["VmHWM"] * 1024
    return {"seconds": seconds, "peak_rise_mib": (peak - before) / 2**20}


def median_result(results: list[dict]) -> dict:
    """The median over rounds (fresh processes) of each figure."""
    return {key: statistics.median(result[key] for result in results) for key in results[0]}


def machine(device: str) -> str:
    if device == "cuda":
        return f"{torch.cuda.get_device_name()}, CUDA {torch.version.cuda}"
    return f"{cpu_description()}, {torch.get_num_threads()} threads"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", nargs="+", default=["small"], choices=SHAPES)
    parser.add_argument("--vocab", nargs="+", type=int, help="vocabulary sizes (default: per shape)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--reps", type=int, default=5, help="timed steps per process")
    parser.add_argument("--rounds", type=int, default=3, help="alternating process pairs per row (medians)")
    parser.add_argument("--chunk_rows", nargs="+", type=int, default=[0], help="minirope rows per chunk (0: its own)")
    parser.add_argument("--output", type=Path, default=RESULTS / "fused_loss.json")
    parser.add_argument("--worker", nargs=3, metavar=("MODEL", "VOCAB", "ROWS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        name, vocab, rows = args.worker
        result = worker(name, args.shape[0], int(vocab), args.device, args.dtype, args.reps, int(rows))
        print(json.dumps(result))
        return

    def run(shape: str, name: str, vocab: int, rows: int) -> dict:
        command = [sys.executable, __file__, "--worker", name, str(vocab), str(rows), "--shape", shape]
        command += ["--device", args.device, "--dtype", args.dtype, "--reps", str(args.reps)]
        output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        return json.loads(output.strip().splitlines()[-1])

    rows_out = []
    print(f"{machine(args.device)}; torch {torch.__version__}, transformers {transformers.__version__}; {args.dtype}")
    print("| shape | vocab | minirope rows/chunk | minirope s | Llama s | speed ratio | minirope MiB | Llama MiB |")
    print("|---|---|---|---|---|---|---|---|")
    for shape in args.shape:
        for vocab in args.vocab or VOCABS[shape]:
            for rows in args.chunk_rows:
                rounds = [(run(shape, "minirope", vocab, rows), run(shape, "llama", vocab, 0))
                          for _ in range(args.rounds)]  # fmt: skip
                mini, llama = (median_result([pair[i] for pair in rounds]) for i in (0, 1))
                ratio = llama["seconds"] / mini["seconds"]
                row = dict(shape=shape, vocab=vocab, chunk_rows=rows, minirope=mini, llama=llama, ratio=ratio)
                rows_out.append(row)
                print(
                    f"| {shape} | {vocab:,} | {rows or 'own'} | {mini['seconds']:.3f} | {llama['seconds']:.3f} | "
                    f"{ratio:.2f}x | {mini['peak_rise_mib']:.0f} | {llama['peak_rise_mib']:.0f} |",
                    flush=True,
                )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    record = dict(
        command=command_line(),
        machine=machine(args.device),
        torch=torch.__version__,
        transformers=transformers.__version__,
        dtype=args.dtype,
        rows=rows_out,
    )
    args.output.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
