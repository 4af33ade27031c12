"""What this machine measures, measured once: the timings that minirope's defaults and figures rest on.

- `bf16_speedup`: how many times faster bf16 matmuls run than float32's on this CPU, which decides a training run's
  precision (`training.precision.choose_bf16`);
- `matmul_peak`: the device's matmul rate in a precision, which MFU and the compute budget are measured against
  (`training.throughput`);
- `onednn_product_us`: a weight shape's matmuls on oneDNN against torch's default kernel, which decide the matmuls
  that `cpu_matmuls` moves.

Each figure is timed the first time a process on this machine needs it and kept (`measured`) under `machine(device)`
(the CPU's model, torch's version and its thread count, or the GPU's name and torch's version) in one file,
`~/.cache/minirope/machine.json` (`MINIROPE_CACHE` moves it), outside any model folder. So every run on a machine
takes the same precision and kernels, and times nothing that was timed before: delete the file to measure again
(after a hardware change). The matmul peak alone is timed again as every training run begins and the best
timing kept (`matmul_peak`): a first timing on a busy host would otherwise stay low, and MFU read high, for good.
Every timing draws its operands from its own generator: a run's random state is the same whether it measured or
read the cache.
"""

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

PRECISION_ROUNDS = 15
PRECISION_SHAPE = (1024, 256, 768)  # rows x inner x out: a decoder product of a small model's training step
PEAK_SIZES = (512, 1024, 2048, 4096, 8192, 16384)
REPS = 9


def cpu_model_name() -> str:
    """The CPU's model name, with its family and model numbers where the name alone is vague (a cloud "AMD EPYC"
    names several generations): Linux `/proc/cpuinfo`; `platform.processor()` elsewhere."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    fields = {}
    for line in lines:
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    if "model name" not in fields:
        return platform.processor()
    return f"{fields['model name']} (family {fields.get('cpu family', '?')}, model {fields.get('model', '?')})"


def machine(device: torch.device | str = "cpu") -> str:
    """What the figures of `device` depend on: on a CPU its model name, torch's version and its thread count; on a
    CUDA GPU its name and torch's version; elsewhere the device type and torch's version."""
    device = torch.device(device)
    if device.type == "cpu":
        return f"{cpu_model_name()} | torch {torch.__version__} | {torch.get_num_threads()} threads"
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    return f"{name} | torch {torch.__version__}"


def cache_path() -> Path:
    return Path(os.environ.get("MINIROPE_CACHE", "~/.cache/minirope")).expanduser() / "machine.json"


def read_cache() -> dict:
    """The whole cache file (`{machine: {figure name: figure}}`); {} where there is none or it is unreadable."""
    try:
        return json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return {}


def write_cache(cache: dict) -> None:
    """Write `cache` whole (a scratch file renamed over the old one); a read-only home only says so."""
    path = cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch = path.with_suffix(f".{os.getpid()}.tmp")
        scratch.write_text(json.dumps(cache, indent=1))
        scratch.replace(path)  # whole or not at all
    except OSError as error:  # decided all the same, measured again next time
        print(f"[minirope] could not cache this machine's timings in {path} ({error}); set MINIROPE_CACHE")


def measured(
    name: str,
    how: Callable[[], dict],
    device: torch.device | str = "cpu",
    timing: bool = True,
    stale: Callable[[dict], bool] | None = None,
) -> dict | None:
    """The figure `name` of `device`'s machine: read from the cache, or `how()` (a JSON mapping) timed now and
    cached; also timed again where `stale(cached)` says the cached figure cannot be right. Without `timing`, None
    where it is not cached (nothing is timed)."""
    cache = read_cache()
    known = cache.setdefault(machine(device), {})
    if name not in known or (stale is not None and stale(known[name])):
        if not timing:
            return known.get(name)
        known[name] = how()
        write_cache(cache)
    return known[name]


def onednn_available() -> bool:
    """Whether this torch can run float32 matmuls on oneDNN here: an x86 CPU and torch built with mkldnn."""
    return platform.machine().lower() in ("x86_64", "amd64") and torch.backends.mkldnn.is_available()


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`x @ weight.T + bias` on oneDNN. x `(..., K)`, weight `(N, K)`, bias `(N,)` or None -> `(..., N)`."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def time_bf16_speedup() -> float:
    """How many times faster bf16 matrix multiplications run than float32 ones on this CPU, timed now.

    Times a `PRECISION_SHAPE` product in each dtype, alternating, for `PRECISION_ROUNDS` rounds on one thread, and
    compares the fastest of each: the kernels' own speed, which another process busy on the same cores (a shared
    host, a second run) can slow down but not speed up; with all threads or medians, a busy host measured anything
    from 0.5x to 5.7x on one AVX512_BF16 CPU. A first round where bf16 is over 10x slower settles it at once
    (emulated bf16: the rest would take seconds).
    """
    rows, inner, out = PRECISION_SHAPE
    generator = torch.Generator().manual_seed(0)
    operands = {dtype: (torch.randn(rows, inner, dtype=dtype, generator=generator),
                        torch.randn(inner, out, dtype=dtype, generator=generator))
                for dtype in (torch.float32, torch.bfloat16)}  # fmt: skip
    best = dict.fromkeys(operands, float("inf"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(2):  # warm-up: the first bf16 product also builds oneDNN's kernel for the shape
            for a, b in operands.values():
                a @ b
        for round_ in range(PRECISION_ROUNDS):
            for dtype, (a, b) in operands.items():
                start = time.perf_counter()
                a @ b
                best[dtype] = min(best[dtype], time.perf_counter() - start)
            if round_ == 0 and best[torch.bfloat16] > 10 * best[torch.float32]:
                break
    finally:
        torch.set_num_threads(threads)
    return best[torch.float32] / best[torch.bfloat16]


def bf16_speedup() -> float:
    """`time_bf16_speedup` of this CPU, timed once per machine (`measured`)."""
    return measured("bf16 speedup", lambda: {"speedup": time_bf16_speedup()})["speedup"]


def matmul_seconds(size: int, device: torch.device, dtype: torch.dtype, repeats: int) -> float:
    """Seconds of the fastest of `repeats` `(size, size) @ (size, size)` matmuls of `dtype` on `device`; for float32
    on a CPU, the faster of torch's default kernel and oneDNN's (the training matmuls of `--measured_matmuls`)."""
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
    b = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
    synchronize = torch.accelerator.synchronize if device.type != "cpu" else lambda: None  # CPU matmuls are done
    matmuls = [torch.matmul]
    if device.type == "cpu" and dtype == torch.float32 and onednn_available():
        matmuls.append(lambda a, b: onednn_linear(a, b.T))
    best = float("inf")
    for product in matmuls:
        for _ in range(repeats + 1):  # the first one warms up
            synchronize()
            start = time.perf_counter()
            product(a, b)
            synchronize()
            best = min(best, time.perf_counter() - start)
    return best


def time_matmul_peak(
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    repeats: int = 5,
    sizes: tuple[int, ...] = PEAK_SIZES,
    long_enough: float = 0.1,
) -> tuple[float, int]:
    """The device's matmul rate, timed now at a size that fills it: FLOP/s and the `size` it was reached at.

    Square matmuls of growing `sizes` until the rate stops rising (by less than 5 % from one size to the
    next) or one product takes `long_enough` seconds: a small product does not fill a large device (on an
    H200, 2048 x 2048 bf16 ran at 440 TFLOP/s, 8192 x 8192 at 775), while on a 2-core CPU 2048 x 2048 already
    takes 0.25 s. Returns the best rate seen and its size.
    """
    device = torch.device(device)
    best, best_size = 0.0, sizes[0]
    for size in sizes:
        seconds = matmul_seconds(size, device, dtype, repeats)
        rate = 2 * size**3 / seconds
        rising = rate > 1.05 * best
        if rate > best:
            best, best_size = rate, size
        if not rising or seconds >= long_enough:
            break
    return best, best_size


def matmul_peak(
    device: torch.device | str = "cpu", dtype: torch.dtype = torch.bfloat16, again: bool = False
) -> tuple[float, int]:
    """The best `time_matmul_peak` of `device` in `dtype` seen on this machine: FLOP/s and the size. Timed where none
    is cached, and with `again` timed now too, the better of the two kept: a busy host can only lower a timing, so
    the figure rises to the machine's own peak over its runs and never falls."""
    name = f"matmul peak, {str(dtype).removeprefix('torch.')}"
    cached = measured(name, dict, device, timing=False) or {"flops": 0.0, "size": 0}

    def timed() -> dict:
        flops, size = time_matmul_peak(device, dtype)
        return {"flops": flops, "size": size} if flops > cached["flops"] else cached

    peak = measured(name, timed, device, stale=lambda _: again)
    return peak["flops"], peak["size"]


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


def onednn_product_us(in_features: int, out_features: int, rows: int, model_mib: int, training: bool) -> dict:
    """Both kernels' median microseconds for `(rows, in) @ (out, in).T`, timed now, with its weight among `model_mib`
    MiB of weights (a model that fits in the cache decodes from the cache; a larger one reads every weight from
    memory). With `training`, the sum of the forward product and the two backward ones (`grad @ W`, `grad.T @ x`),
    each kernel's own. Returns `{"torch_us", "onednn_us"}`."""
    weight_bytes = 4 * in_features * out_features
    copies = max(1, min(64, model_mib * 2**20 // weight_bytes))
    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(out_features, in_features, generator=generator) for _ in range(copies)]
    x = torch.randn(rows, in_features, generator=generator)
    with torch.no_grad():
        torch_us = median_seconds(nn.functional.linear, x, weights) * 1e6
        onednn_us = median_seconds(onednn_linear, x, weights) * 1e6
        if training:
            grad = torch.randn(rows, out_features, generator=generator)
            torch_us += 1e6 * (median_seconds(lambda g, w: g @ w, grad, weights)
                               + median_seconds(lambda g, a: g.T @ a, grad, [x]))  # fmt: skip
            onednn_us += 1e6 * (median_seconds(lambda g, w: onednn_linear(g, w.T), grad, weights)
                                + median_seconds(lambda g, a: onednn_linear(g.T, a.T), grad, [x]))  # fmt: skip
    return {"torch_us": round(torch_us, 1), "onednn_us": round(onednn_us, 1)}
