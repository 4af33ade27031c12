"""Speed and memory: minirope vs transformers' LlamaForCausalLM with the same config and weights.

    python benchmarks/bench_speed.py                       # everything (~10 min on 2 cores)
    python benchmarks/bench_speed.py --sizes 1M 12M --reps 3 --skip_scaling

Speed: both models run in one process; each case alternates minirope and Llama repetitions (after a
warm-up of each) and reports the medians and the minirope/Llama ratio (> 1: minirope is faster).
Peak memory: each (case, model) runs again in a fresh process, which reports the rise of its peak
resident set (Linux VmHWM) over the resident set before the case; ratio < 1: minirope is leaner. A fresh
process per measurement matters: the allocator keeps freed pages, so a second case in one process looks free.

Cases: a training step (forward + backward + AdamW; minirope with `skip_logits=True`, as `MiniRopeTrainer`
calls it) in fp32 and in bf16 autocast at ~1M, 12M and 100M parameters, and in fp32 again with minirope's training
matmuls on oneDNN where this machine measures it faster (`use_measured_matmuls(model, training=True)`, as a float32
eager minirope command does); prefill; greedy decode at batch 1 and 8 with the default dynamic cache (both models
run `nn.Linear`'s matmuls), at batch 1 with bf16 weights, and again with minirope's decoding matmuls on oneDNN
where this machine measures it faster (`use_measured_matmuls`, as `minirope-generate` does); minirope with a static
cache and a compiled forward
(`torch.compile` with Inductor's `freezing`, its CPU inference mode) against Llama's dynamic-cache decode;
a RoPE microbenchmark (cos/sin cache gather vs recomputing cos/sin from positions) at 128..8192 tokens;
one float32 product on torch.mm and on oneDNN at decode and training shapes, its weight in the cache and from
memory (what `use_measured_matmuls` weighs, here for more shapes).
Scaling curves (PNG): training step time vs sequence length at a fixed 4096 tokens per step, and greedy
decode time per token vs context length.

Like the training scripts, the benchmark keeps freed memory for reuse (`reuse_freed_memory`, glibc) for
both models: with glibc's default, each process's allocation history decides which steps page-fault their
buffers back in, and bf16 ratios moved between 0.97 and 1.29 from one process to the next.
`--default_allocator` measures without it.

Writes benchmarks/results/speed.json and benchmarks/results/scaling.png, adds one line for this machine to
benchmarks/results/speed_by_cpu.jsonl (the CPU, torch, and every ratio: rows from other machines accumulate there),
and prints a markdown table.
"""

import argparse
import gc
import itertools
import json
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import date
from functools import partial
from pathlib import Path

import torch
import transformers
from transformers import LlamaConfig, StoppingCriteria, StoppingCriteriaList
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from minirope import MiniRopeConfig, MiniRopeForCausalLM, MiniRopeRotaryEmbedding
from minirope.commands.generate import measured_matmuls
from minirope.convert import to_llama
from minirope.cpu_matmuls import use_measured_matmuls
from minirope.machine import cpu_model_name, onednn_available, onednn_linear, time_matmul_peak
from minirope.training.arguments import reuse_freed_memory
from minirope.training.precision import choose_bf16

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
SIZES = {
    "default": {},  # MiniRopeConfig()'s defaults: the model `minirope-pretrain` trains
    "1M": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4, vocab_size=2048),
    "12M": dict(hidden_size=384, intermediate_size=1024, num_hidden_layers=6, num_attention_heads=6, vocab_size=4096),
    "100M": dict(
        hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12, vocab_size=8192
    ),
    # SmolLM2-135M(-Instruct)'s shape, as `minirope-import` of its checkpoint gives it (random weights: the speed is
    # the shape's); not in the default run: --sizes SmolLM2-135M
    "SmolLM2-135M": dict(
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        vocab_size=49152,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
    ),
}
DEFAULT_SIZES = ["default", "1M", "12M", "100M"]
TRAIN_BATCH = {"default": (8, 256), "1M": (16, 256), "12M": (16, 256), "100M": (4, 256), "SmolLM2-135M": (4, 256)}
DECODE_TOKENS = 64


def build_pair(size: str) -> tuple[MiniRopeForCausalLM, transformers.LlamaForCausalLM]:
    torch.manual_seed(0)
    config = MiniRopeConfig(**SIZES[size], max_position_embeddings=4096)
    config._attn_implementation = "sdpa"
    model = MiniRopeForCausalLM(config)
    return model, to_llama(model)


def train_case(model, batch: int, length: int, dtype: torch.dtype = torch.float32) -> Callable[[], int]:
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    input_ids = torch.randint(0, model.config.vocab_size, (batch, length))
    # minirope's training step asks for the loss alone, as MiniRopeTrainer does; Llama has no such option.
    loss_settings = {"skip_logits": True} if isinstance(model, MiniRopeForCausalLM) else {}

    def step() -> int:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            loss = model(input_ids, labels=input_ids, **loss_settings).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return batch * length

    return step


def prefill_case(model, batch: int, length: int) -> Callable[[], int]:
    model.eval()
    input_ids = torch.randint(0, model.config.vocab_size, (batch, length))

    def run() -> int:
        with torch.no_grad():
            model(input_ids, logits_to_keep=1)
        return batch * length

    return run


def generate(model, prompt: torch.Tensor, new_tokens: int, **settings) -> None:
    with torch.no_grad():
        model.generate(prompt, do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                       pad_token_id=0, **settings)  # fmt: skip


def decode_case(
    model, batch: int, new_tokens: int = DECODE_TOKENS, dtype: torch.dtype = torch.float32, **settings
) -> Callable[[], int]:
    model.to(dtype).eval()  # bf16: the weights themselves, as `from_pretrained(..., dtype=torch.bfloat16)` loads them
    prompt = torch.randint(3, model.config.vocab_size, (batch, 16))

    def run() -> int:
        generate(model, prompt, new_tokens, **settings)
        return batch * new_tokens

    return run


def compiled_static(model: MiniRopeForCausalLM) -> MiniRopeForCausalLM:
    """`model` with its forward compiled for decoding with a static cache (fixed shapes, weights frozen)."""
    import torch._inductor.config

    torch._inductor.config.freezing = True  # CPU inference: weights become constants, linears prepacked
    model.eval()
    model.forward = torch.compile(model.forward, fullgraph=True, dynamic=False)
    return model


def measured_or_plain(model, batch: int) -> Callable[[], int]:
    """minirope: decoding and prompt matmuls on oneDNN where this machine measured it faster
    (`minirope-generate`'s own `measured_matmuls`); Llama: its own matmuls."""
    if isinstance(model, MiniRopeForCausalLM):
        measured_matmuls(model)  # prints its choice on stderr
    return decode_case(model, batch)


def measured_prefill(model, batch: int, length: int) -> Callable[[], int]:
    """minirope: matmuls of more than 8 rows on oneDNN where this machine measured it faster (what
    `minirope-generate` does for the prompt); Llama: its own matmuls."""
    if isinstance(model, MiniRopeForCausalLM):
        use_measured_matmuls(model, training=True)
    return prefill_case(model, batch, length)


def measured_training_or_plain(model, batch: int, length: int) -> Callable[[], int]:
    """minirope: training matmuls on oneDNN where this machine measured it faster (`use_measured_matmuls(model,
    training=True)`, what a float32 eager minirope command does); Llama: its own matmuls."""
    if isinstance(model, MiniRopeForCausalLM):
        linears = sum(type(module) is torch.nn.Linear for module in model.modules())
        chosen = use_measured_matmuls(model, training=True)
        print(f"  measured training matmuls on oneDNN: {len(chosen)} of {linears} linears", flush=True)
    return train_case(model, batch, length)


def static_compiled_or_dynamic(model) -> Callable[[], int]:
    """minirope: static cache + compiled forward; Llama: its default dynamic cache (the target's baseline)."""
    if isinstance(model, MiniRopeForCausalLM):
        return decode_case(compiled_static(model), 1, cache_implementation="static")
    return decode_case(model, 1)


# name -> (unit, function building the runnable for one model)
CASES: dict[str, tuple[str, Callable]] = {
    f"train {size} {label} {batch}x{length}": ("tokens/s", partial(train_case, batch=batch, length=length, dtype=dtype))
    for size, (batch, length) in TRAIN_BATCH.items()
    for dtype, label in ((torch.float32, "fp32"), (torch.bfloat16, "bf16"))
}
CASES |= {
    f"train {size} fp32 {batch}x{length}, measured matmuls": (
        "tokens/s",
        partial(measured_training_or_plain, batch=batch, length=length),
    )
    for size, (batch, length) in TRAIN_BATCH.items()
}
CASES |= {
    "greedy decode default fp32 batch 1, dynamic cache": ("tokens/s", partial(decode_case, batch=1)),
    "prefill 12M fp32 8x512": ("tokens/s", partial(prefill_case, batch=8, length=512)),
    "prefill 12M fp32 8x512, measured matmuls": ("tokens/s", partial(measured_prefill, batch=8, length=512)),
    "greedy decode 12M fp32 batch 1, dynamic cache": ("tokens/s", partial(decode_case, batch=1)),
    "greedy decode 12M fp32 batch 8, dynamic cache": ("tokens/s", partial(decode_case, batch=8)),
    "greedy decode 100M fp32 batch 1, dynamic cache": ("tokens/s", partial(decode_case, batch=1)),
    "greedy decode 100M fp32 batch 8, dynamic cache": ("tokens/s", partial(decode_case, batch=8)),
    "greedy decode SmolLM2-135M fp32 batch 1, dynamic cache": ("tokens/s", partial(decode_case, batch=1)),
    "greedy decode SmolLM2-135M fp32 batch 8, dynamic cache": ("tokens/s", partial(decode_case, batch=8)),
}
CASES |= {
    f"greedy decode {size} bf16 batch 1, dynamic cache": (
        "tokens/s",
        partial(decode_case, batch=1, dtype=torch.bfloat16),
    )
    for size in ("default", "12M", "100M")
}
CASES |= {
    f"greedy decode {size} fp32 batch {batch}, measured matmuls": ("tokens/s", partial(measured_or_plain, batch=batch))
    for size, batch in (("default", 1), ("12M", 1), ("12M", 8), ("100M", 1), ("100M", 8), ("SmolLM2-135M", 1))
}
CASES |= {
    "greedy decode 12M fp32 batch 1: minirope static cache + compile vs Llama dynamic": (
        "tokens/s",
        static_compiled_or_dynamic,
    ),
}


def cpu_description() -> str:
    """The CPU's model name and its vector extensions that decide which kernels run (from /proc/cpuinfo)."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    vector = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return f"{cpu_model_name()}, {', '.join(vector) or 'no AVX2'}"


def case_size(name: str) -> str:
    return next(size for size in SIZES if f" {size} " in f" {name} ")


def rss_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def peak_memory_child(name: str, which: str) -> None:
    """In a fresh process: the peak resident set during a repetition of the case after a warm-up one, minus
    the resident set before the warm-up (so it counts optimizer state and caches, not one-time compilation)."""
    ours, theirs = build_pair(case_size(name))
    run = CASES[name][1](ours if which == "minirope" else theirs)
    gc.collect()
    before = rss_bytes("VmRSS")
    run()  # warm-up: optimizer state, caches, compilation
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current resident set
    run()
    print(json.dumps({"peak_rise_bytes": rss_bytes("VmHWM") - before}))


def peak_memory(name: str, which: str) -> float:
    """Peak resident-set rise in MiB of `which` model running case `name`, measured in a fresh process."""
    result = subprocess.run(
        [sys.executable, __file__, "--_peak_memory", name, which, *sys.argv[1:]],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])["peak_rise_bytes"] / 2**20


def compare(name: str, reps: int, measure_memory: bool) -> dict:
    """Alternate the two models, `reps` rounds of one repetition each, after a warm-up of each; which model goes
    first alternates too, so neither always runs right after the other (a cold cache, the other's garbage)."""
    unit, make = CASES[name]
    ours_model, theirs_model = build_pair(case_size(name))
    ours, theirs = make(ours_model), make(theirs_model)
    ours(), theirs()
    rates = {"minirope": [], "llama": []}
    pair = (("minirope", ours), ("llama", theirs))
    for round_ in range(reps):
        for label, run in pair if round_ % 2 == 0 else pair[::-1]:
            start = time.perf_counter()
            units = run()
            rates[label].append(units / (time.perf_counter() - start))
    row = {"case": name, "unit": unit, "params_millions": round(ours_model.num_parameters() / 1e6, 1)}
    row |= {label: statistics.median(values) for label, values in rates.items()}
    row["ratio"] = row["minirope"] / row["llama"]
    if measure_memory:
        row["minirope_peak_mib"], row["llama_peak_mib"] = peak_memory(name, "minirope"), peak_memory(name, "llama")
        row["memory_ratio"] = row["minirope_peak_mib"] / row["llama_peak_mib"]
    memory = f"  peak MiB {row['minirope_peak_mib']:.0f} / {row['llama_peak_mib']:.0f}" if measure_memory else ""
    print(f"{name:<60} minirope {row['minirope']:>9.1f}  llama {row['llama']:>9.1f} {unit}  "
          f"ratio {row['ratio']:.3f}{memory}", flush=True)  # fmt: skip
    return row


def rope_microbenchmark(reps: int) -> list[dict]:
    """cos/sin for a (1, T) position tensor: minirope's cache gather vs recomputing from positions (Llama's way)."""
    rows = []
    config = MiniRopeConfig(hidden_size=768, num_attention_heads=12, max_position_embeddings=8192)
    llama_config = LlamaConfig(hidden_size=768, num_attention_heads=12, max_position_embeddings=8192,
                               rope_parameters=dict(config.rope_parameters))  # fmt: skip
    modules = {"gather": MiniRopeRotaryEmbedding(config), "recompute": LlamaRotaryEmbedding(llama_config)}
    x = torch.zeros(1, dtype=torch.float32)
    for length in (128, 512, 2048, 8192):
        positions = torch.arange(length)[None]
        timings = {}
        for label, module in modules.items():
            module(x, positions)
            samples = []
            for _ in range(max(reps, 20)):
                start = time.perf_counter()
                module(x, positions)
                samples.append(time.perf_counter() - start)
            timings[label] = statistics.median(samples) * 1e6
        rows.append({"length": length, "gather_us": timings["gather"], "recompute_us": timings["recompute"],
                     "speedup": timings["recompute"] / timings["gather"]})  # fmt: skip
        print(f"rope cos/sin, T={length:<5} gather {timings['gather']:8.1f} us  recompute "
              f"{timings['recompute']:8.1f} us  speed-up {rows[-1]['speedup']:.2f}x", flush=True)  # fmt: skip
    return rows


# (rows, in, out): decode matmuls of the default, 12M and 100M models and of a 1B Llama (its MLP), then training
# matmuls of the default and 12M models
LINEAR_SHAPES = [(1, 96, 288), (1, 96, 4096), (1, 384, 384), (1, 384, 1024), (1, 384, 4096), (1, 768, 2048),
                 (8, 768, 2048), (1, 2048, 8192), (2048, 96, 288), (4096, 384, 1024), (4096, 1024, 384)]  # fmt: skip
FROM_MEMORY_BYTES = 128 * 2**20  # weights cycled through this much memory: several times any CPU's last-level cache


def linear_microbenchmark() -> list[dict]:
    """One float32 product `x @ W.T` on `torch.mm`'s BLAS and on oneDNN (the op `use_measured_matmuls` moves
    decoding matmuls to where it measures it faster): median microseconds, at the shapes of `LINEAR_SHAPES`, with
    the weight in the cache (the same weight again and again) and from memory (copies of it cycled through
    `FROM_MEMORY_BYTES`, as when decoding a model larger than the cache). [] without oneDNN."""
    if not onednn_available():
        return []
    rows = []
    for m, k, n in LINEAR_SHAPES:
        x, weights = torch.randn(m, k), [torch.randn(n, k) for _ in range(max(2, FROM_MEMORY_BYTES // (4 * n * k)))]
        row = {"shape": [m, k, n]}
        for product, label in ((torch.nn.functional.linear, "mm"), (onednn_linear, "onednn")):
            row[f"{label}_us"] = timed(partial(product, x, weights[0]), 30) * 1e6
            row[f"{label}_memory_us"] = timed(partial(each_weight, product, x, weights), 5) / len(weights) * 1e6
        rows.append(row)
        print(f"linear {m}x{k}x{n}: torch.mm / oneDNN {row['mm_us']:8.1f} / {row['onednn_us']:8.1f} us in cache, "
              f"{row['mm_memory_us']:8.1f} / {row['onednn_memory_us']:8.1f} us from memory", flush=True)  # fmt: skip
    return rows


def each_weight(product: Callable, x: torch.Tensor, weights: list[torch.Tensor]) -> None:
    for weight in weights:
        product(x, weight)


def timed(run: Callable[[], object], reps: int) -> float:
    run()
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        run()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


class StepClock(StoppingCriteria):
    """A stopping criterion that never stops and notes the time of each decoding step of `generate()`."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids, scores, **kwargs) -> torch.BoolTensor:
        self.times.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def decode_ms_per_token(model, prompt: torch.Tensor, new_tokens: int = 17) -> float:
    """Median time between consecutive tokens of one greedy `generate()` (the prefill step left out), in ms."""
    clock = StepClock()
    generate(model, prompt, new_tokens, stopping_criteria=StoppingCriteriaList([clock]))
    return statistics.median(later - earlier for earlier, later in itertools.pairwise(clock.times)) * 1e3


def scaling_curves(reps: int) -> dict:
    """12M model, fp32. Training step seconds vs sequence length T at 4096 tokens per step (so the linear
    layers cost the same at every T and only attention grows, linearly in T per token), and greedy decode
    milliseconds per token vs context length C (attention reads C cached keys: linear in C)."""
    ours, theirs = build_pair("12M")
    models = {"minirope": ours, "llama": theirs}
    train = {"seq_len": [128, 256, 512, 1024, 2048]} | {label: [] for label in models}
    for length in train["seq_len"]:
        for label, model in models.items():
            train[label].append(timed(train_case(model, 4096 // length, length), reps))
        print(f"train step T={length:<5} " + "  ".join(f"{k} {train[k][-1]:.3f} s" for k in models), flush=True)
    decode = {"context": [128, 512, 1024, 2048, 4000]} | {label: [] for label in models}
    for context in decode["context"]:
        prompt = torch.randint(3, ours.config.vocab_size, (1, context))
        for label, model in models.items():
            model.eval()
            decode[label].append(statistics.median(decode_ms_per_token(model, prompt) for _ in range(reps)))
        print(f"decode C={context:<5} " + "  ".join(f"{k} {decode[k][-1]:.2f} ms/token" for k in models), flush=True)
    plot_scaling(train, decode, RESULTS / "scaling.png")
    return {"train_step_seconds": train, "decode_ms_per_token": decode}


def plot_scaling(train: dict, decode: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for label, style in (("minirope", "o-"), ("llama", "s--")):
        left.plot(train["seq_len"], train[label], style, label=label)
        right.plot(decode["context"], decode[label], style, label=label)
    left.set(xlabel="sequence length T (tokens; 4096 tokens per step)", ylabel="seconds per step",
             title="Training step (12M, fp32, fwd+bwd+AdamW)")  # fmt: skip
    right.set(xlabel="context length (tokens)", ylabel="ms per generated token",
              title="Greedy decode, dynamic cache (12M, fp32, batch 1)")  # fmt: skip
    for axis in (left, right):
        axis.grid(alpha=0.3)
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=DEFAULT_SIZES, choices=list(SIZES))
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--skip_compile", action="store_true", help="skip the static cache + compile case")
    parser.add_argument("--skip_memory", action="store_true", help="skip the peak-memory subprocesses")
    parser.add_argument("--skip_scaling", action="store_true", help="skip the scaling curves")
    parser.add_argument(
        "--default_allocator",
        action="store_true",
        help="leave glibc's default of returning freed memory to the OS (the training scripts keep it)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "speed.json")
    parser.add_argument("--only", help="run only the cases whose name contains this, e.g. 'greedy decode'")
    parser.add_argument("--rows", type=Path, default=RESULTS / "speed_by_cpu.jsonl", help="one line per run is added")
    parser.add_argument("--_peak_memory", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    allocator = "glibc default" if args.default_allocator else f"freed memory kept: {reuse_freed_memory()}"
    if args._peak_memory:
        return peak_memory_child(*args._peak_memory)
    names = [name for name in CASES if case_size(name) in args.sizes]
    if args.skip_compile:
        names = [name for name in names if "compile" not in name]
    if args.only:
        names = [name for name in names if args.only in name]
    bf16, precision = choose_bf16(torch.device("cpu"))
    print(precision)
    if not bf16:
        print("bf16 rows skipped: bf16 matmuls are not clearly faster than float32 on this CPU (emulated bf16)")
        names = [name for name in names if "bf16" not in name]
    RESULTS.mkdir(parents=True, exist_ok=True)
    rows = [compare(name, args.reps, not args.skip_memory) for name in names]
    report = {
        "command": command_line(),
        "date": date.today().isoformat(),
        "machine": f"{platform.machine()}, {torch.get_num_threads()} threads",
        "cpu": cpu_description(),
        "float32_peak_gflops": round(time_matmul_peak("cpu", torch.float32)[0] / 1e9, 1),
        "allocator": allocator,
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },  # fmt: skip
        "cases": rows,
        "rope": rope_microbenchmark(args.reps),
        "linear": linear_microbenchmark(),
    }
    if not args.skip_scaling:
        report["scaling"] = scaling_curves(max(3, args.reps // 2))
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    append_cpu_row(report, args.rows)
    print(f"\n{report['cpu']}, float32 peak {report['float32_peak_gflops']} GFLOP/s, torch {torch.__version__}")
    print("\n| case | params | minirope | Llama | ratio | peak MiB minirope / Llama | memory ratio |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        memory = (f"{row['minirope_peak_mib']:.0f} / {row['llama_peak_mib']:.0f} | {row['memory_ratio']:.2f}"
                  if "memory_ratio" in row else "- | -")  # fmt: skip
        print(f"| {row['case']} | {row['params_millions']}M | {row['minirope']:,.0f} | {row['llama']:,.0f} "
              f"{row['unit']} | {row['ratio']:.2f} | {memory} |")  # fmt: skip
    print(f"\nwrote {args.out}" + ("" if args.skip_scaling else f" and {RESULTS / 'scaling.png'}"))


def command_line(*argv: str) -> str:
    """The command that writes a results row, as a shell line from the repository root: this script's path and its
    arguments (`argv`, this process's own by default). Every row in benchmarks/results/ carries one (`command`)."""
    import shlex

    script = Path(sys.argv[0]).resolve()
    name = script.relative_to(ROOT) if script.is_relative_to(ROOT) else Path("benchmarks") / script.name
    return shlex.join([str(name), *(argv or sys.argv[1:])])


def append_jsonl(path: Path, row: dict) -> None:
    """Append `row` to the JSON-lines file `path` (its folder made where missing): each run adds its own line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as rows:
        rows.write(json.dumps(row) + "\n")


def append_cpu_row(report: dict, path: Path) -> None:
    """One line per run in `path` (JSON lines), so that the rows of every machine the benchmark ran on accumulate:
    the CPU, its threads, torch and transformers, and each case's minirope/Llama ratio."""
    row = {key: report[key] for key in ("command", "date", "cpu", "machine", "float32_peak_gflops")}
    row |= {"torch": torch.__version__, "transformers": transformers.__version__}
    row["ratios"] = {case["case"]: round(case["ratio"], 3) for case in report["cases"]}
    append_jsonl(path, row)
    print(f"appended this machine's row to {path}")


if __name__ == "__main__":
    main()
