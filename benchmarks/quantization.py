"""Every smaller or on-device form of one trained folder, measured the same way on this machine: size, decoding
speed and whole-text validation bits per byte.

    python benchmarks/quantization.py --model runs/minirope-shakespeare

Forms: the folder in float32 and bfloat16; loaded through transformers' quantizers, torchao (int8 weight-only,
int8 dynamic activations + int8 weights, int4 weight-only in groups of 32: `IntxWeightOnlyConfig`, the int4 form
torchao runs on CPU) and quanto (int8 and int4 weights); the GGUF exports (f32, f16, q8_0, q4_0) run by llama.cpp
through llama-cpp-python; the ExecuTorch exports (f32, 8da8w) run by ExecuTorch's runtime and its LLM runner.

- size: the bytes a user ships: `model.safetensors` as `save_pretrained` writes it (quanto's weights cannot be
  serialized by transformers: no size), the `.gguf` file, the `.pte` file.
- decode: greedy tokens per second, batch 1, 128 new tokens after "ROMEO:\\n" (the median of 3 after a warm-up;
  half the context for a model of less than 256):
  `generate()` for the transformers forms, llama.cpp's `generate` (2 threads), ExecuTorch's `TextLLMRunner`.
- bits/byte: the four validation plays, whole, in windows of the model's context (`validation_windows`), every
  form's logits scored by the same code (`per_token_loss`, `LanguageModelingMetrics`), as `minirope-pretrain` reports.

Prints a markdown table and writes benchmarks/results/quantization.json (with the machine and versions).
"""

import argparse
import json
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from importlib.metadata import version
from pathlib import Path

import numpy as np
import torch
import transformers
from bench_speed import command_line  # this folder's helpers
from transformers import AutoModelForCausalLM, AutoTokenizer, EvalPrediction, QuantoConfig, TorchAoConfig

from minirope.data.pipeline import validation_windows
from minirope.data.sources import bundled_shards
from minirope.data.tokenizer import token_byte_lengths
from minirope.export import export_executorch, export_gguf
from minirope.machine import cpu_model_name
from minirope.training.metrics import LanguageModelingMetrics, per_token_loss

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "quantization.json"
PROMPT, REPEATS = "ROMEO:\n", 3


def torchao_configs() -> dict:
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig, IntxWeightOnlyConfig
    from torchao.quantization.granularity import PerGroup

    return {
        "torchao int8 weight-only": TorchAoConfig(Int8WeightOnlyConfig()),
        "torchao int8 dynamic activations + int8 weights": TorchAoConfig(Int8DynamicActivationInt8WeightConfig()),
        "torchao int4 weight-only (groups of 32)": TorchAoConfig(
            IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32))
        ),
    }


def bits_per_byte(logits_of: Callable[[torch.Tensor], torch.Tensor], windows, tokenizer, batch: int = 1) -> float:
    """Whole-text bits per byte of `windows` from `logits_of(input_ids (B, T)) -> (B, T, V)`."""
    losses, labels = [], []
    for start in range(0, len(windows), batch):
        rows = windows[start : start + batch]
        ids, targets = torch.tensor(rows["input_ids"]), torch.tensor(rows["labels"])
        with torch.no_grad():
            losses.append(per_token_loss(logits_of(ids).float(), targets).numpy())
        labels.append(targets.numpy())
    metrics = LanguageModelingMetrics(token_byte_lengths(tokenizer))
    prediction = EvalPrediction(predictions=np.concatenate(losses), label_ids=np.concatenate(labels))
    return metrics(prediction)["bits_per_byte"]


def tokens_per_second(decode: Callable[[], int]) -> float:
    decode()  # warm-up
    rates = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        tokens = decode()
        rates.append(tokens / (time.perf_counter() - start))
    return statistics.median(rates)


def new_tokens(context: int) -> int:
    """Tokens to decode: 128, or half the context of a smaller model (a GGUF or `.pte` holds no more)."""
    return min(128, context // 2)


def transformers_row(name: str, model_dir: str, tokenizer, windows, **loading) -> dict:
    model = AutoModelForCausalLM.from_pretrained(model_dir, **loading).eval()
    prompt = tokenizer(PROMPT, return_tensors="pt").input_ids
    count = new_tokens(model.config.max_position_embeddings)

    def decode() -> int:
        with torch.no_grad():
            model.generate(prompt, max_new_tokens=count, min_new_tokens=count, do_sample=False)
        return count

    size = None
    if "quantization_config" not in loading or isinstance(loading["quantization_config"], TorchAoConfig):
        with tempfile.TemporaryDirectory() as folder:
            model.save_pretrained(folder)
            size = sum(path.stat().st_size for path in Path(folder).glob("*.safetensors"))
    speed = tokens_per_second(decode)
    score = bits_per_byte(lambda ids: model(ids, use_cache=False).logits, windows, tokenizer, batch=16)
    runtime = f"transformers {transformers.__version__}"
    if "quantization_config" in loading:
        library = "torchao" if isinstance(loading["quantization_config"], TorchAoConfig) else "optimum-quanto"
        runtime += f" + {library} {version(library)}"
    return {"form": name, "runtime": runtime, "bytes": size, "tokens_per_second": speed, "bits_per_byte": score}


def gguf_row(outtype: str, model_dir: str, folder: Path, tokenizer, windows, context: int) -> dict:
    import llama_cpp

    path = export_gguf(model_dir, folder / f"model-{outtype}.gguf", outtype)
    options = dict(n_ctx=context, n_batch=context, n_threads=torch.get_num_threads(), logits_all=True, verbose=False)
    llm = llama_cpp.Llama(model_path=str(path), **options)
    prompt = tokenizer(PROMPT)["input_ids"]

    def decode() -> int:
        for count, _ in enumerate(llm.generate(prompt, temp=0.0, top_k=1, reset=True), start=1):
            if count == new_tokens(context):
                return count
        return count

    def logits_of(ids: torch.Tensor) -> torch.Tensor:
        llm.reset()
        llm.eval(ids[0].tolist())
        return torch.from_numpy(np.array(llm.scores[: ids.shape[1]]))[None]

    speed = tokens_per_second(decode)
    return {
        "form": f"GGUF {outtype}",
        "runtime": f"llama.cpp (llama-cpp-python {version('llama-cpp-python')})",
        "bytes": path.stat().st_size,
        "tokens_per_second": speed,
        "bits_per_byte": bits_per_byte(logits_of, windows, tokenizer),
    }


def executorch_row(outtype: str, model_dir: str, folder: Path, tokenizer, windows, context: int) -> dict:
    from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner
    from executorch.runtime import Runtime

    exported = export_executorch(model_dir, folder / f"executorch-{outtype}", outtype)
    pte = exported / "model.pte"
    runner = TextLLMRunner(str(pte), str(exported / "tokenizer.json"))
    config = GenerationConfig(echo=False, max_new_tokens=new_tokens(context), temperature=0.0)

    def decode() -> int:
        runner.reset()
        pieces = []
        runner.generate(PROMPT, config, token_callback=pieces.append)
        return len(pieces)

    forward = Runtime.get().load_program(pte).load_method("forward")

    def logits_of(ids: torch.Tensor) -> torch.Tensor:  # prefill up to the last position, then one cached step
        length = ids.shape[1]
        prefill = forward.execute([ids[:, :-1], torch.arange(length - 1)])[0]
        return torch.cat([prefill, forward.execute([ids[:, -1:], torch.tensor([length - 1])])[0]], dim=1)

    return {
        "form": f"ExecuTorch {outtype} (XNNPACK)",
        "runtime": f"ExecuTorch {version('executorch')}",
        "bytes": pte.stat().st_size,
        "tokens_per_second": tokens_per_second(decode),
        "bits_per_byte": bits_per_byte(logits_of, windows, tokenizer),
    }


def machine() -> dict:
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    vector = [flag for flag in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if f" {flag}" in flags]
    return {
        "cpu": cpu_model_name(),
        "vector_flags": vector,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def table(rows: list[dict]) -> str:
    lines = ["| form | runtime | size | decode tokens/s | validation bits/byte |", "|---|---|---|---|---|"]
    for row in rows:
        size = "not serializable" if row["bytes"] is None else f"{row['bytes'] / 1e6:.2f} MB"
        lines.append(
            f"| {row['form']} | {row['runtime']} | {size} | {row['tokens_per_second']:,.0f} | "
            f"{row['bits_per_byte']:.4f} |"
        )
    return "\n".join(lines)


def forms(model_dir: str, scratch: Path, tokenizer, windows, context: int) -> dict[str, Callable[[], dict]]:
    """Every form's measurement, by name, in the table's order (each run only when called)."""
    rows = {
        "float32": lambda: transformers_row("float32", model_dir, tokenizer, windows, dtype=torch.float32),
        "bfloat16": lambda: transformers_row("bfloat16", model_dir, tokenizer, windows, dtype=torch.bfloat16),
    }
    for name, config in {**torchao_configs(), **QUANTO}.items():
        rows[name] = partial(transformers_row, name, model_dir, tokenizer, windows, quantization_config=config)
    for outtype in ("f32", "f16", "q8_0", "q4_0"):
        rows[f"GGUF {outtype}"] = partial(gguf_row, outtype, model_dir, scratch, tokenizer, windows, context)
    for outtype in ("f32", "8da8w"):
        rows[f"ExecuTorch {outtype}"] = partial(
            executorch_row, outtype, model_dir, scratch, tokenizer, windows, context
        )
    return rows


QUANTO = {f"quanto {weights} weights": QuantoConfig(weights=weights) for weights in ("int8", "int4")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="runs/minirope-shakespeare")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--forms", nargs="+", default=None, help="Measure only these forms (default: all).")
    parser.add_argument("--max_windows", type=int, default=None, help="Score only this many windows (a quick run).")
    args = parser.parse_args()
    import minirope  # noqa: F401  (registers the classes with the Auto factories)

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    context = AutoModelForCausalLM.from_pretrained(args.model).config.max_position_embeddings
    windows = validation_windows(bundled_shards("validation"), tokenizer, context, max_samples=args.max_windows)
    with tempfile.TemporaryDirectory() as scratch:
        measures = forms(args.model, Path(scratch), tokenizer, windows, context)
        unknown = set(args.forms or []) - set(measures)
        if unknown:
            parser.error(f"unknown --forms {sorted(unknown)}: choose from {list(measures)}")
        rows = [measure() for name, measure in measures.items() if args.forms is None or name in args.forms]
    print(table(rows))
    result = {
        "command": command_line(),
        "machine": machine(),
        "model": args.model,
        "windows": len(windows),
        "rows": rows,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written to {args.output}")


if __name__ == "__main__":
    main()
