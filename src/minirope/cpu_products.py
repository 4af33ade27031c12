"""Decoding products on oneDNN where this machine measures them faster: opt-in, decided per weight shape.

A decoding step multiplies a few rows (one per sequence) by every weight of the model, so its speed is the speed of
reading the weights. On x86 CPUs torch sends float32 products to MKL, which runs such few-row products on one thread;
oneDNN (the kernel library behind torch's bf16 products) spreads them over all threads, but costs ~20 us more per
call. Which wins depends on the CPU, the thread count, the weight's shape and the batch: oneDNN has run a
`(1, 2048) @ (2048, 8192)` product 2.3x faster than MKL on a 2-core AVX-512 EPYC and a `(1, 96) @ (96, 288)` one 5x
slower (docs/performance.md). So nothing here is decided by a rule: `use_measured_products(model)` times both
kernels on this machine for each of the model's weight shapes at 1 and 8 rows, the weight among as many bytes of
weights as the model has (medians of `REPS`), keeps oneDNN only where it wins by `MARGIN` and where the model's
whole one-token step is then faster by `STEP_MARGIN`, and caches the per-shape decisions per CPU model, torch
version and thread count in `~/.cache/minirope/cpu_products.json` (`MINIROPE_CACHE` moves it), outside any model
folder.

A chosen `nn.Linear` keeps its parameters and state-dict keys; only inference products (no gradient) of plain float32
CPU tensors with at most 8 rows change kernel, outside tracing and compiling: the same product, summed in another
order (float32 rounding differences only). Training and everything else stay on `nn.Linear`'s path. The model files
that `save_pretrained` ships know nothing of this: a saved folder computes exactly Llama's products.

    model = AutoModelForCausalLM.from_pretrained(path)
    print(use_measured_products(model))      # {'model.layers.0.mlp.up_proj': ['1 row'], ...}
    model.generate(...)                      # the chosen decoding products on oneDNN
"""

import json
import math
import os
import platform
import statistics
import time
import types
from pathlib import Path

import torch
from torch import nn

MARGIN = 1.2  # a product moves to oneDNN only where its median is this many times faster
STEP_MARGIN = 1.05  # ... and only if the model's whole decoding step is then this many times faster
REPS = 9
ROWS = (1, 8)  # batch-1 and batch-8 decoding; products of up to 8 rows take the 8-row decision


def available() -> bool:
    """Whether this torch can run float32 products on oneDNN here: an x86 CPU and torch built with mkldnn."""
    return platform.machine().lower() in ("x86_64", "amd64") and torch.backends.mkldnn.is_available()


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`x @ weight.T + bias` on oneDNN. x `(..., K)`, weight `(N, K)`, bias `(N,)` or None -> `(..., N)`."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def cpu_model_name() -> str:
    """The CPU's model name (Linux `/proc/cpuinfo`; `platform.processor()` elsewhere)."""
    try:
        names = [line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")]
    except OSError:
        names = []
    return names[0].split(":", 1)[1].strip() if names else platform.processor()


def machine() -> str:
    """What the decisions depend on: the CPU's model name, torch's version and its thread count."""
    return f"{cpu_model_name()} | torch {torch.__version__} | {torch.get_num_threads()} threads"


def cache_path() -> Path:
    return Path(os.environ.get("MINIROPE_CACHE", "~/.cache/minirope")).expanduser() / "cpu_products.json"


def median_seconds(product, x: torch.Tensor, weights: list[torch.Tensor]) -> float:
    """Median time of `product(x, weight)`, cycling through `weights` (copies of one weight standing for the model's
    other weights: each call finds its weight where a decoding step would, in the cache or in memory)."""
    for weight in weights[:2]:
        product(x, weight)  # warm-up: oneDNN builds its kernel for the shape on the first call
    times = []
    for rep in range(max(REPS, len(weights))):
        start = time.perf_counter()
        product(x, weights[rep % len(weights)])
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(in_features: int, out_features: int, rows: int, model_mib: int) -> dict:
    """Both kernels' median microseconds for `(rows, in) @ (out, in).T` with its weight among `model_mib` MiB of
    weights (a model that fits in the cache decodes from the cache; a larger one reads every weight from memory),
    and whether oneDNN wins by `MARGIN`."""
    weight_bytes = 4 * in_features * out_features
    copies = max(1, min(64, model_mib * 2**20 // weight_bytes))
    weights = [torch.randn(out_features, in_features) for _ in range(copies)]
    x = torch.randn(rows, in_features)
    with torch.no_grad():
        torch_us = median_seconds(nn.functional.linear, x, weights) * 1e6
        onednn_us = median_seconds(onednn_linear, x, weights) * 1e6
    return {"torch_us": round(torch_us, 1), "onednn_us": round(onednn_us, 1), "onednn": torch_us > MARGIN * onednn_us}


def decisions(shapes: set[tuple[int, int]], model_mib: int) -> dict[str, dict]:
    """`{"IN x OUT, R rows, M MiB": measure(...)}` for every shape at every row count of `ROWS` in a model of
    `model_mib` MiB of float32 weights: read from the cache for this machine, measured (and added) where missing."""
    path, key = cache_path(), machine()
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        cache = {}
    known = cache.setdefault(key, {})
    wanted = {f"{i} x {o}, {rows} rows, {model_mib} MiB": (i, o, rows, model_mib) for i, o in sorted(shapes)
              for rows in ROWS}  # fmt: skip
    missing = {name: args for name, args in wanted.items() if name not in known}
    for name, args in missing.items():
        known[name] = measure(*args)
    if missing:
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch = path.with_suffix(f".{os.getpid()}.tmp")
        scratch.write_text(json.dumps(cache, indent=1))
        scratch.replace(path)  # whole or not at all
    return {name: known[name] for name in wanted}


def forward(module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """A chosen `nn.Linear`'s forward (bound to it as a method, so that `copy.deepcopy` of the model binds the copy):
    inference products of plain float32 CPU tensors whose row count took a oneDNN decision (`module.onednn_rows`: 1
    and/or 8, the latter covering 2-8 rows) on oneDNN; everything else `nn.Linear.forward`."""
    rows = x.numel() // x.shape[-1] if x.dim() else 0
    bucket = 1 if rows == 1 else 8 if 1 < rows <= 8 else None
    if (
        bucket in module.onednn_rows
        and not torch.is_grad_enabled()
        and x.device.type == "cpu"
        and x.dtype == module.weight.dtype == torch.float32
        and type(x) is torch.Tensor
        and type(module.weight) is nn.Parameter
        and not torch.is_autocast_enabled("cpu")
        and not torch.compiler.is_compiling()
        and not torch.jit.is_tracing()
    ):
        return onednn_linear(x, module.weight, module.bias)
    return nn.Linear.forward(module, x)


def move(module: nn.Linear, rows: tuple[int, ...]) -> None:
    """Give `module` the measured forward for products of `rows` rows (nothing: back to `nn.Linear`'s)."""
    module.__dict__.pop("forward", None)
    module.__dict__.pop("onednn_rows", None)
    if rows:
        module.onednn_rows = rows
        module.forward = types.MethodType(forward, module)


def step_seconds(model: nn.Module, rows: int) -> float:
    """The fastest of `REPS` one-token forwards of `rows` sequences: a decoding step's products (without a past).
    The fastest, not the median: another process busy on the same cores can slow a step down, not speed it up."""
    ids = torch.zeros((rows, 1), dtype=torch.long)
    best = float("inf")
    with torch.no_grad():
        model(ids)  # warm-up
        for _ in range(REPS):
            start = time.perf_counter()
            model(ids)
            best = min(best, time.perf_counter() - start)
    return best


def use_measured_products(model: nn.Module) -> dict[str, list[str]]:
    """Send `model`'s decoding products to oneDNN where this machine measured it faster (see the module docstring).

    Two measurements decide: each weight shape's product alone (cached, `decisions`), then, for each row count, the
    model's whole one-token step with the products that won against the step without them: they move only if the
    step is `STEP_MARGIN` times faster (a product faster alone can be slower among the others, e.g. a small model's
    head that stays in the cache).

    Returns `{module name: ["1 row", "8 rows"] or a part of it}` for the `nn.Linear` modules that changed kernel;
    `{}` where none did or oneDNN is not available (nothing is changed then). Calling it again measures again.
    """
    linears = {name: m for name, m in model.named_modules() if type(m) is nn.Linear and m.weight.device.type == "cpu"}
    if not available() or not linears:
        return {}
    for module in linears.values():
        move(module, ())  # a previous call's choice
    weights = sum(m.weight.numel() for m in {id(m.weight): m for m in linears.values()}.values())
    model_mib = 2 ** max(0, math.ceil(math.log2(4 * weights / 2**20)))  # rounded up to a power of 2: fewer entries
    measured = decisions({(m.in_features, m.out_features) for m in linears.values()}, model_mib)
    kept = {}
    for rows in ROWS:
        faster = [
            name
            for name, m in linears.items()
            if measured[f"{m.in_features} x {m.out_features}, {rows} rows, {model_mib} MiB"]["onednn"]
        ]
        if not faster:
            continue
        plain = step_seconds(model, rows)
        for name in faster:
            move(linears[name], (rows,))
        moved = step_seconds(model, rows)
        for name in faster:
            move(linears[name], ())
        if plain > STEP_MARGIN * moved:
            kept[rows] = set(faster)
    chosen = {}
    for name, module in linears.items():
        rows = tuple(r for r in kept if name in kept[r])
        move(module, rows)
        if rows:
            chosen[name] = [f"{r} row{'s' if r > 1 else ''}" for r in rows]
    return chosen
