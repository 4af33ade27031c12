"""Speed and memory: minirope vs transformers' LlamaForCausalLM with the same config and weights.

Both models run in one process; each case alternates minirope and Llama repetitions and reports the
median, and the minirope/Llama ratio (> 1 is faster for throughputs, < 1 is leaner for memory).

    python benchmarks/bench_speed.py                 # all cases (~15 min on 2 cores)
    python benchmarks/bench_speed.py --sizes 1M 12M --reps 3 --skip_compile

Cases: training step (forward + backward + AdamW) in fp32 and in bf16 autocast at ~1M, 12M and 100M
parameters; prefill tokens/s; greedy decode tokens/s at batch 1 and 8 with the dynamic cache; minirope
with `cache_implementation="static"` and a compiled forward against Llama's dynamic-cache decode; a
RoPE microbenchmark (cos/sin cache gather vs recomputing cos/sin from positions) at 128..8192 tokens.
Peak memory is the rise of the process's peak resident set (Linux VmHWM, reset before each case).
Prints a markdown table and writes benchmarks/results/speed.json.
"""

import argparse
import gc
import json
import platform
import statistics
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from minirope import MiniRopeConfig, MiniRopeForCausalLM, MiniRopeRotaryEmbedding
from minirope.convert import to_llama

SIZES = {
    "1M": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4, vocab_size=2048),
    "12M": dict(hidden_size=384, intermediate_size=1024, num_hidden_layers=6, num_attention_heads=6, vocab_size=4096),
    "100M": dict(
        hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12, vocab_size=8192
    ),
}
TRAIN_BATCH = {"1M": (16, 256), "12M": (16, 256), "100M": (4, 256)}


def rss_peak_reset() -> int:
    """Reset the peak resident set (Linux) and return the current resident set, in bytes."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status_kb("VmRSS") * 1024


def rss_peak() -> int:
    return _status_kb("VmHWM") * 1024


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def build_pair(size: str) -> tuple[MiniRopeForCausalLM, LlamaForCausalLM]:
    torch.manual_seed(0)
    config = MiniRopeConfig(**SIZES[size], max_position_embeddings=4096)
    config._attn_implementation = "sdpa"
    model = MiniRopeForCausalLM(config)
    return model, to_llama(model)


def train_case(model, batch: int, length: int, dtype: torch.dtype, **loss_settings) -> Callable[[], int]:
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    input_ids = torch.randint(0, model.config.vocab_size, (batch, length))

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


def decode_case(model, batch: int, new_tokens: int, **settings) -> Callable[[], int]:
    model.eval()
    prompt = torch.randint(3, model.config.vocab_size, (batch, 16))

    def run() -> int:
        with torch.no_grad():
            model.generate(prompt, do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                           pad_token_id=0, **settings)  # fmt: skip
        return batch * new_tokens

    return run


def compare(name: str, ours: Callable[[], int], theirs: Callable[[], int], reps: int, unit: str) -> dict:
    """Alternate the two, `reps` rounds of one repetition each, after a warm-up of each."""
    ours(), theirs()
    rates = {"minirope": [], "llama": []}
    memory = {}
    for label, run in (("minirope", ours), ("llama", theirs)):
        gc.collect()
        base = rss_peak_reset()
        run()
        memory[label] = max(0, rss_peak() - base)
    for _ in range(reps):
        for label, run in (("minirope", ours), ("llama", theirs)):
            start = time.perf_counter()
            units = run()
            rates[label].append(units / (time.perf_counter() - start))
    row = {
        "case": name,
        "unit": unit,
        "minirope": statistics.median(rates["minirope"]),
        "llama": statistics.median(rates["llama"]),
        "minirope_peak_mib": memory["minirope"] / 2**20,
        "llama_peak_mib": memory["llama"] / 2**20,
    }
    row["ratio"] = row["minirope"] / row["llama"]
    row["memory_ratio"] = row["minirope_peak_mib"] / row["llama_peak_mib"] if row["llama_peak_mib"] else float("nan")
    print(f"{name:<40} minirope {row['minirope']:>10.1f}  llama {row['llama']:>10.1f} {unit:<9} "
          f"ratio {row['ratio']:.3f}  peak MiB {row['minirope_peak_mib']:.0f} / {row['llama_peak_mib']:.0f}",
          flush=True)  # fmt: skip
    return row


def rope_microbenchmark(reps: int) -> list[dict]:
    """cos/sin for a (1, T) position tensor: minirope's cache gather vs recomputing from positions (Llama's way)."""
    rows = []
    config = MiniRopeConfig(hidden_size=768, num_attention_heads=12, max_position_embeddings=8192)
    llama_config = LlamaConfig(hidden_size=768, num_attention_heads=12, max_position_embeddings=8192,
                               rope_parameters=dict(config.rope_parameters))  # fmt: skip
    llama_rope = LlamaRotaryEmbedding(llama_config)
    ours = MiniRopeRotaryEmbedding(config)
    x = torch.zeros(1, dtype=torch.float32)
    for length in (128, 512, 2048, 8192):
        positions = torch.arange(length)[None]
        timings = {}
        for label, module in (("cache gather", ours), ("recompute", llama_rope)):
            module(x, positions)
            samples = []
            for _ in range(max(reps, 20)):
                start = time.perf_counter()
                module(x, positions)
                samples.append(time.perf_counter() - start)
            timings[label] = statistics.median(samples) * 1e6
        rows.append({"length": length, "gather_us": timings["cache gather"], "recompute_us": timings["recompute"],
                     "speedup": timings["recompute"] / timings["cache gather"]})  # fmt: skip
        print(
            f"rope cos/sin, T={length:<5} gather {timings['cache gather']:8.1f} us  recompute "
            f"{timings['recompute']:8.1f} us  speed-up {rows[-1]['speedup']:.2f}x",
            flush=True,
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--skip_compile", action="store_true", help="skip the static cache + compile case")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/speed.json"))
    args = parser.parse_args()
    rows = []
    for size in args.sizes:
        ours, theirs = build_pair(size)
        batch, length = TRAIN_BATCH[size]
        params = f"{ours.num_parameters() / 1e6:.1f}M"
        for dtype, label in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
            name = f"train {size} ({params}) {label} {batch}x{length}"
            rows.append(compare(name, train_case(ours, batch, length, dtype),
                                train_case(theirs, batch, length, dtype), args.reps, "tokens/s"))  # fmt: skip
        if size == "12M":
            rows.append(compare("prefill 12M fp32 8x512", prefill_case(ours, 8, 512), prefill_case(theirs, 8, 512),
                                args.reps, "tokens/s"))  # fmt: skip
            for batch_size in (1, 8):
                rows.append(compare(f"greedy decode 12M fp32 batch {batch_size}, dynamic cache",
                                    decode_case(ours, batch_size, 64), decode_case(theirs, batch_size, 64),
                                    args.reps, "tokens/s"))  # fmt: skip
            if not args.skip_compile:
                compiled, _ = build_pair(size)
                compiled.forward = torch.compile(compiled.forward, fullgraph=True, dynamic=False)
                rows.append(compare("greedy decode 12M batch 1: static+compile vs Llama dynamic",
                                    decode_case(compiled, 1, 64, cache_implementation="static"),
                                    decode_case(theirs, 1, 64), args.reps, "tokens/s"))  # fmt: skip
        del ours, theirs
        gc.collect()
    rope = rope_microbenchmark(args.reps)
    report = {
        "date": date.today().isoformat(),
        "machine": f"{platform.machine()}, {torch.get_num_threads()} threads, {platform.processor() or 'cpu'}",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "cases": rows,
        "rope": rope,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print("\n| case | minirope | Llama | ratio | peak MiB minirope / Llama |\n|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['case']} | {row['minirope']:.0f} | {row['llama']:.0f} {row['unit']} | {row['ratio']:.2f} | "
              f"{row['minirope_peak_mib']:.0f} / {row['llama_peak_mib']:.0f} |")  # fmt: skip
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
