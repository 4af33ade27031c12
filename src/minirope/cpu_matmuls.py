"""Matmuls on oneDNN where this machine measures them faster: opt-in, decided per weight shape.

On x86 CPUs torch sends float32 matmuls to MKL. oneDNN (the kernel library behind torch's bf16 matmuls) can be
faster or slower, by a wide margin either way, depending on the CPU, the thread count, the weight's shape and the
rows: a decoding step's few-row matmuls MKL runs on one thread, oneDNN on all (but ~20 us more per call); a training
step's matmuls MKL ran at ~200 GFLOP/s on a 2-core AVX-512 AMD EPYC and oneDNN at ~450 (docs/performance.md), while
on an Intel Sapphire Rapids oneDNN was the slower. So nothing here is decided by a rule: `use_measured_matmuls(model)`
times both kernels on this machine for each of the model's weight shapes, keeps oneDNN only where its median wins by
`MARGIN`, and caches the per-shape decisions per CPU model, torch version and thread count with the machine's other
timings (`minirope.machine`: `~/.cache/minirope/machine.json`, outside any model folder). Two uses:

- decoding (`use_measured_matmuls(model)`, which `minirope-generate` applies): matmuls of 1 and of 2-8 rows, each
  weight timed among as many bytes of weights as the model has, and kept only where the model's whole one-token
  step is then faster by `STEP_MARGIN`;
- training (`use_measured_matmuls(model, training=True)`, which the minirope commands apply to a float32 eager CPU
  run): matmuls of more than 8 rows, forward and both backward matmuls, timed at `TRAINING_ROWS` rows; a head
  that moves takes the fused loss's three chunk matmuls with it (`loss_product`).

A chosen `nn.Linear` keeps its parameters and state-dict keys; only matmuls of plain float32 CPU tensors outside
autocast, tracing and compiling change kernel: the same product, summed in another order (float32 rounding
differences only), with the gradients of `nn.functional.linear`. Everything else stays on `nn.Linear`'s path. The
model files that `save_pretrained` ships know nothing of this: a saved folder computes exactly Llama's matmuls.

    model = AutoModelForCausalLM.from_pretrained(path)
    print(use_measured_matmuls(model))      # {'model.layers.0.mlp.up_proj': ['1 row'], ...}
    model.generate(...)                      # the chosen decoding matmuls on oneDNN
"""

import math
import time
import types

import torch
from torch import nn

from minirope import machine
from minirope.machine import onednn_linear

MARGIN = 1.2  # a product moves to oneDNN only where its median is this many times faster
STEP_MARGIN = 1.05  # ... and only if the model's whole decoding step is then this many times faster
REPS = 9
ROWS = (1, 8)  # batch-1 and batch-8 decoding; matmuls of up to 8 rows take the 8-row decision
TRAINING_ROWS = 1024  # matmuls of more rows (training, prefill, evaluation) take the decision timed at this many
TRAINING = "training"


class OneDnnLinear(torch.autograd.Function):
    """`nn.functional.linear` with the forward and both backward matmuls on oneDNN.

    Under `create_graph=True` (a gradient of a gradient) the backward matmuls use `nn.functional.linear`, which
    autograd can differentiate again; the oneDNN op has no derivative of its own.
    """

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return onednn_linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        product = nn.functional.linear if torch.is_grad_enabled() else onednn_linear
        grad_2d, x_2d = grad.reshape(-1, grad.shape[-1]), x.reshape(-1, x.shape[-1])
        grad_x = product(grad, weight.T) if ctx.needs_input_grad[0] else None  # grad @ W
        grad_weight = product(grad_2d.T, x_2d.T) if ctx.needs_input_grad[1] else None  # grad^T @ x
        grad_bias = grad_2d.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_x, grad_weight, grad_bias


def measure(in_features: int, out_features: int, rows: int, model_mib: int) -> dict:
    """Both kernels' median microseconds for `(rows, in) @ (out, in).T` with its weight among `model_mib` MiB of
    weights (`machine.onednn_product_us`; at `TRAINING_ROWS` rows, with the two backward products), and whether
    oneDNN wins by `MARGIN`."""
    timed = machine.onednn_product_us(in_features, out_features, rows, model_mib, training=rows >= TRAINING_ROWS)
    return timed | {"onednn": timed["torch_us"] > MARGIN * timed["onednn_us"]}


def decision_name(in_features: int, out_features: int, rows: int | str, model_mib: int) -> str:
    """The cache's name for the decision on an `(in, out)` weight at `rows` rows (or `TRAINING`) in a model of
    `model_mib` MiB."""
    if rows == TRAINING or rows >= TRAINING_ROWS:  # compute-bound: the other weights do not matter
        return f"{in_features} x {out_features}, {TRAINING_ROWS} rows, training"
    return f"{in_features} x {out_features}, {rows} rows, {model_mib} MiB"


def decisions(
    shapes: set[tuple[int, int]], model_mib: int, rows: tuple[int, ...] = ROWS, timing: bool = True
) -> dict[str, dict] | None:
    """`{decision_name: measure(...)}` for every `(in, out)` shape at every row count of `rows` in a model of
    `model_mib` MiB of float32 weights: read from this machine's cache (`machine.measured`), measured (and added)
    where missing; without `timing`, None where any is missing (nothing is timed)."""
    wanted = {decision_name(i, o, r, model_mib): (i, o, r, model_mib if r < TRAINING_ROWS else 0)
              for i, o in sorted(shapes) for r in rows}  # fmt: skip
    if not timing and any(machine.measured(name, dict, timing=False) is None for name in wanted):
        return None
    return {name: machine.measured(name, lambda args=args: measure(*args)) for name, args in wanted.items()}


def step_decision(
    model: nn.Module, linears: dict, faster: list[str], other: dict, rows: int, timing: bool
) -> bool | None:
    """Whether moving the `faster` matmuls to oneDNN makes the model's whole one-token step of `rows` sequences
    `STEP_MARGIN` times faster (`step_seconds` with and without them), cached per machine under the model's shapes and
    the moved matmuls; without `timing`, the cached answer or None (nothing is timed)."""
    shapes = sorted({(m.in_features, m.out_features) for m in linears.values()})

    def timed() -> dict:
        plain = step_seconds(model, rows)
        for module_name in faster:
            move(linears[module_name], (*other[module_name], rows))
        moved = step_seconds(model, rows)
        for module_name in faster:
            move(linears[module_name], other[module_name])
        return {"torch_s": round(plain, 6), "onednn_s": round(moved, 6), "onednn": plain > STEP_MARGIN * moved}

    name = f"step, {rows} rows, {len(linears)} linears {shapes}, moved {sorted(faster)}"
    decision = machine.measured(name, timed, timing=timing)
    return None if decision is None else decision["onednn"]


def plain_float32_cpu(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the product of `x` and `weight` may change kernel: both float32 on the CPU, `x` a plain tensor (no
    subclass: FakeTensor, DTensor, ...), outside autocast, compiling and tracing (which record torch's own ops)."""
    return (
        x.device.type == "cpu"
        and x.dtype == weight.dtype == torch.float32
        and type(x) is torch.Tensor
        and not torch.is_autocast_enabled("cpu")
        and not torch.compiler.is_compiling()
        and not torch.jit.is_tracing()
    )


def forward(module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """A chosen `nn.Linear`'s forward (bound to it as a method, so that `copy.deepcopy` of the model binds the copy):
    matmuls of plain float32 CPU tensors whose row count took a oneDNN decision (`module.onednn_rows`: 1, 8 for
    2-8 rows, `TRAINING` for more) on oneDNN, differentiable where autograd records (`OneDnnLinear`); everything
    else `nn.Linear.forward`."""
    rows = x.numel() // x.shape[-1] if x.dim() else 0
    bucket = 1 if rows == 1 else 8 if 1 < rows <= 8 else TRAINING if rows > 8 else None
    if bucket in module.onednn_rows and type(module.weight) is nn.Parameter and plain_float32_cpu(x, module.weight):
        if torch.is_grad_enabled() and (x.requires_grad or module.weight.requires_grad):
            return OneDnnLinear.apply(x, module.weight, module.bias)
        return onednn_linear(x, module.weight, module.bias)
    return nn.Linear.forward(module, x)


def loss_product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`x @ weight.T` for the fused loss's chunks (`kernels_minirope.LinearCrossEntropy`) of a head whose training
    matmuls moved: on oneDNN where `plain_float32_cpu` (the weight a tensor or parameter: the head's, or a
    transposed operand of the backward matmuls), torch's `@` otherwise (a bf16 run's chunks under autocast).
    x `(R, K)`, weight `(N, K)`, any strides -> `(R, N)`."""
    if type(weight) in (torch.Tensor, nn.Parameter) and plain_float32_cpu(x, weight):
        return onednn_linear(x, weight)
    return x @ weight.T


def move(module: nn.Linear, rows: tuple) -> None:
    """Give `module` the measured forward for matmuls of `rows` rows (1, 8, `TRAINING`; none: `nn.Linear`'s), and
    with `TRAINING` the measured kernel for the fused loss's matmuls, where `module` is the model's head
    (`loss_product`, read by `kernels_minirope.fused_causal_lm_loss`: the same weight shape, the same three
    matmuls that the training decision timed)."""
    for name in ("forward", "onednn_rows", "loss_product"):
        module.__dict__.pop(name, None)
    if rows:
        module.onednn_rows = rows
        module.forward = types.MethodType(forward, module)
    if TRAINING in rows:
        module.loss_product = loss_product


def step_seconds(model: nn.Module, rows: int) -> float:
    """The fastest of `REPS` one-token forwards of `rows` sequences: a decoding step's matmuls (without a past).
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


def use_measured_matmuls(model: nn.Module, training: bool = False, timing: bool = True) -> dict[str, list[str]]:
    """Send `model`'s decoding matmuls (or with `training`, its matmuls of more than 8 rows: training, prefill,
    evaluation) to oneDNN where this machine measured it faster (see the module docstring).

    Decoding: two measurements decide, each weight shape's product alone (cached, `decisions`), then, for each row
    count, the model's whole one-token step with the matmuls that won against the step without them: they move
    only if the step is `STEP_MARGIN` times faster (a product faster alone can be slower among the others, e.g. a
    small model's head that stays in the cache). Training: each weight shape's forward and backward matmuls at
    `TRAINING_ROWS` rows (cached), which are compute-bound and as fast among the others as alone; so a machine
    makes the same choice in every run.

    Both decisions are cached per machine (`machine.measured`), so a machine makes the same choice in every run; without
    `timing` only cached decisions apply and nothing is timed (a short reply is not kept waiting for a benchmark:
    `minirope-generate`'s default), and a use with any decision missing changes nothing.

    Returns `{module name: ["1 row", "8 rows"] or a part of it, or ["training"]}` for the `nn.Linear` modules that
    changed kernel; `{}` where none did or oneDNN is not available (nothing is changed then). The other use's choice
    is kept.
    """
    linears = {name: m for name, m in model.named_modules() if type(m) is nn.Linear and m.weight.device.type == "cpu"}
    if not machine.onednn_available() or not linears:
        return {}
    rows_of_use = (TRAINING,) if training else ROWS
    other = {name: tuple(r for r in m.__dict__.get("onednn_rows", ()) if r not in rows_of_use)
             for name, m in linears.items()}  # fmt: skip
    for name, module in linears.items():
        move(module, other[name])  # this use's previous choice
    weights = sum(m.weight.numel() for m in {id(m.weight): m for m in linears.values()}.values())
    model_mib = 2 ** max(0, math.ceil(math.log2(4 * weights / 2**20)))  # rounded up to a power of 2: fewer entries
    shapes = {(m.in_features, m.out_features) for m in linears.values()}
    measured = decisions(shapes, model_mib, (TRAINING_ROWS,) if training else ROWS, timing)
    if measured is None:  # not cached and not to be timed: this use moves nothing
        return {}
    kept = {}
    for rows in rows_of_use:
        faster = [
            name
            for name, m in linears.items()
            if measured[decision_name(m.in_features, m.out_features, rows, model_mib)]["onednn"]
        ]
        if not faster or training or step_decision(model, linears, faster, other, rows, timing):
            kept[rows] = set(faster)
    chosen = {}
    for name, module in linears.items():
        rows = tuple(r for r in kept if name in kept[r])
        move(module, (*other[name], *rows))
        if rows:
            chosen[name] = [TRAINING if r == TRAINING else f"{r} row{'s' if r > 1 else ''}" for r in rows]
    return chosen
