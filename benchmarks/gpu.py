"""minirope vs LlamaForCausalLM with the same weights on an accelerator: training through the Trainer, and generation.

    python benchmarks/gpu.py                                   # on the GPU: three sizes, every setting (~10 min)
    python benchmarks/gpu.py --sizes 125M --attention sdpa     # one row
    python benchmarks/gpu.py --sizes tiny --steps 3 --no_compile   # on CPU, as the test runs it

Training: each model trains `--warmup` + `--steps` optimizer steps on random tokens through the Trainer it trains
with (minirope: `MiniRopeTrainer`, whose training steps ask for the loss alone, `skip_logits=True`; Llama:
transformers' `Trainer`), with the same `TrainingArguments`: bf16 where the device supports it, fused AdamW on
CUDA, `torch_compile` on or off. Time per step = the wall time of the steps after the warm-up (the device
synchronised at both ends) / `--steps`; the models alternate (minirope, Llama, minirope, Llama, ...) for `--rounds`
rounds and each keeps its best round. MFU uses PaLM's FLOP count (`training_flops_per_token`) against the
bf16 matmul peak measured once in this run (`time_matmul_peak`: grown until the rate stops rising).
Peak memory: `max_memory_allocated` during the run (CUDA only). `--use_liger_kernel` rows run where
`liger-kernel` is installed (transformers patches Llama with it; minirope's fused loss is its own).

Generation: greedy `generate()` of `--new_tokens` tokens after a 16-token prompt at batch 1 and 8, with the
default dynamic cache (eager forward) and with a static cache (which transformers' `generate` compiles on
accelerators), attention `sdpa` and `eager`; tokens/s, minirope / Llama.

Sizes: the default recipe's 1.15M model (3 layers x 96), ~30M (8 x 512), ~125M (12 x 768, vocabulary 32,000), and
`tiny` for the CPU test.
Writes `--output` (JSON: device, torch, CUDA and transformers versions, rows) and prints markdown tables.
"""

import argparse
import importlib.util
import json
import time
from pathlib import Path

import torch
import transformers
from bench_speed import command_line  # this folder's helpers
from transformers import Trainer, TrainerCallback, TrainingArguments

from minirope import MiniRopeConfig, MiniRopeForCausalLM
from minirope.convert import to_llama
from minirope.machine import time_matmul_peak
from minirope.training.throughput import training_flops_per_token
from minirope.training.trainer import MiniRopeTrainer

SIZES = {  # config, (batch, block)
    "tiny": (dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=256), (2, 32)),  # noqa: E501
    "1.15M": (dict(hidden_size=96, intermediate_size=288, num_hidden_layers=3, num_attention_heads=2, vocab_size=4096), (32, 256)),  # noqa: E501
    "30M": (dict(hidden_size=512, intermediate_size=1376, num_hidden_layers=8, num_attention_heads=8, vocab_size=8192), (16, 512)),  # noqa: E501
    "125M": (dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12, vocab_size=32000), (16, 1024)),  # noqa: E501
}  # fmt: skip


class StepWall(TrainerCallback):
    """Wall time from the end of the warm-up's last step to the end of the last step, the device synchronised."""

    def __init__(self, warmup: int) -> None:
        self.warmup, self.start, self.end = warmup, 0.0, 0.0

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step in (self.warmup, state.max_steps):
            if torch.accelerator.is_available():
                torch.accelerator.synchronize()
            setattr(self, "start" if state.global_step == self.warmup else "end", time.perf_counter())


def build(size: str, attention: str) -> dict[str, transformers.PreTrainedModel]:
    fields, (_, block) = SIZES[size]
    torch.manual_seed(0)
    config = MiniRopeConfig(**fields, max_position_embeddings=block + 64, tie_word_embeddings=False)
    config._attn_implementation = attention
    model = MiniRopeForCausalLM(config)
    llama = to_llama(model)
    llama.config._attn_implementation = attention
    return {"minirope": model, "llama": llama}


def train_seconds(model, trainer_class, size: str, args: argparse.Namespace, compile: bool, liger: bool) -> dict:
    """One round of training `model`: seconds per step after the warm-up, peak memory (CUDA) in MiB."""
    batch, block = SIZES[size][1]
    generator = torch.Generator().manual_seed(1)
    rows = torch.randint(3, model.config.vocab_size, (batch * (args.warmup + args.steps), block), generator=generator)
    dataset = [{"input_ids": row, "labels": row} for row in rows]
    clock = StepWall(args.warmup)
    training_args = TrainingArguments(
        output_dir=str(args.scratch),
        per_device_train_batch_size=batch,
        max_steps=args.warmup + args.steps,
        learning_rate=1e-4,
        bf16=args.bf16,
        optim="adamw_torch_fused" if torch.cuda.is_available() else "adamw_torch",
        torch_compile=compile,
        use_liger_kernel=liger,
        save_strategy="no",
        logging_strategy="no",
        report_to=[],
        disable_tqdm=True,
        dataloader_pin_memory=torch.cuda.is_available(),
    )
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    trainer = trainer_class(model=model, args=training_args, train_dataset=dataset, callbacks=[clock])
    trainer.train()
    memory = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None
    return {"seconds": (clock.end - clock.start) / args.steps, "peak_mib": memory}


def training_rows(args: argparse.Namespace, peak: float) -> list[dict]:
    rows = []
    for size in args.sizes:
        batch, block = SIZES[size][1]
        for attention in args.attention:
            for compile in [False] if args.no_compile else [False, True]:
                for liger in [False, True] if args.liger else [False]:
                    models = build(size, attention)
                    trainers = {"minirope": MiniRopeTrainer, "llama": Trainer}
                    best = {}
                    for _ in range(args.rounds):
                        for name, model in models.items():
                            result = train_seconds(model, trainers[name], size, args, compile, liger)
                            if name not in best or result["seconds"] < best[name]["seconds"]:
                                best[name] = result
                    flops = training_flops_per_token(models["minirope"].config, block) * batch * block
                    row = dict(size=size, attention=attention, compile=compile, liger=liger, batch=batch, block=block)
                    for name, result in best.items():
                        row[name] = {**result, "tokens_per_s": batch * block / result["seconds"],
                                     "mfu": flops / result["seconds"] / peak}  # fmt: skip
                    row["speed_ratio"] = best["llama"]["seconds"] / best["minirope"]["seconds"]
                    rows.append(row)
                    print_training(row)
    return rows


def generation_rows(args: argparse.Namespace) -> list[dict]:
    rows = []
    caches = ["dynamic"] if args.no_compile else ["dynamic", "static"]
    for size in args.sizes:
        for attention in ["sdpa", "eager"]:
            models = build(size, attention)
            for model in models.values():
                model.to(args.device, dtype=torch.bfloat16 if args.bf16 else torch.float32).eval()
            for batch in (1, 8):
                prompt = torch.randint(3, models["minirope"].config.vocab_size, (batch, 16), device=args.device)
                for cache in caches:
                    rates = {name: [] for name in models}
                    for round_ in range(args.rounds + 1):  # round 0 warms up (and compiles the static cache's)
                        for name, model in models.items():
                            start = time.perf_counter()
                            with torch.no_grad():
                                model.generate(prompt, do_sample=False, max_new_tokens=args.new_tokens,
                                               min_new_tokens=args.new_tokens, pad_token_id=0,
                                               cache_implementation=None if cache == "dynamic" else cache)  # fmt: skip
                            if torch.accelerator.is_available():
                                torch.accelerator.synchronize()
                            if round_:
                                rates[name].append(batch * args.new_tokens / (time.perf_counter() - start))
                    row = dict(size=size, attention=attention, batch=batch, cache=cache)
                    row |= {name: max(values) for name, values in rates.items()}
                    row["speed_ratio"] = row["minirope"] / row["llama"]
                    rows.append(row)
                    print(f"| {size} | {attention} | {batch} | {cache} | {row['minirope']:,.0f} | "
                          f"{row['llama']:,.0f} | {row['speed_ratio']:.2f}x |", flush=True)  # fmt: skip
    return rows


def print_training(row: dict) -> None:
    mini, llama = row["minirope"], row["llama"]
    memory = f"{mini['peak_mib']:,.0f} / {llama['peak_mib']:,.0f}" if mini["peak_mib"] is not None else "n/a (CPU)"
    print(f"| {row['size']} | {row['attention']} | {'yes' if row['compile'] else 'no'} | "
          f"{'yes' if row['liger'] else 'no'} | {mini['tokens_per_s']:,.0f} | {llama['tokens_per_s']:,.0f} | "
          f"{row['speed_ratio']:.2f}x | {mini['mfu']:.1%} / {llama['mfu']:.1%} | {memory} |", flush=True)  # fmt: skip


def device_description() -> str:
    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()}, CUDA {torch.version.cuda}"
    return "CPU"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["1.15M", "30M", "125M"], choices=SIZES)
    parser.add_argument("--attention", nargs="+", help="training attention (default: sdpa, and flash_attention_2 "
                        "and flex_attention where they run)")  # fmt: skip
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--new_tokens", type=int, default=64)
    parser.add_argument("--no_compile", action="store_true", help="leave out torch.compile and the static cache")
    parser.add_argument("--skip_generation", action="store_true")
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "results" / "gpu.json")
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/minirope-gpu-bench"))
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    args.device = "cuda" if cuda else "cpu"
    args.bf16 = cuda and torch.cuda.is_bf16_supported()
    if args.attention is None:
        args.attention = ["sdpa"]
        args.attention += ["flash_attention_2"] if cuda and importlib.util.find_spec("flash_attn") else []
        args.attention += ["flex_attention"] if cuda else []
    args.liger = cuda and importlib.util.find_spec("liger_kernel") is not None
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    peak, peak_size = time_matmul_peak(args.device, dtype)
    precision = str(dtype).removeprefix("torch.")
    print(f"{device_description()}; torch {torch.__version__}, transformers {transformers.__version__}; "
          f"{precision} matmul peak {peak / 1e12:.1f} TFLOP/s at {peak_size}-square matmuls")  # fmt: skip
    print("\n| size | attention | compile | liger | minirope tokens/s | Llama tokens/s | ratio | MFU | peak MiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    training = training_rows(args, peak)
    generation = []
    if not args.skip_generation:
        print("\n| size | attention | batch | cache | minirope tokens/s | Llama tokens/s | ratio |")
        print("|---|---|---|---|---|---|---|")
        generation = generation_rows(args)
    record = dict(
        command=command_line(),
        device=device_description(),
        torch=torch.__version__,
        transformers=transformers.__version__,
        dtype=str(dtype).removeprefix("torch."),
        matmul_peak_tflops=peak / 1e12,
        matmul_peak_size=peak_size,
        training=training,
        generation=generation,
    )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
