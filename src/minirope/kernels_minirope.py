"""CPU fast paths of the minirope model: float32 products on oneDNN (all of them on AVX-512 CPUs, decoding products
with large weights on any x86 CPU) and the chunked linear cross-entropy.

Kept apart from `modeling_minirope.py` (which reads like the paper) and shipped beside it as remote code:
`save_pretrained` copies this file with the model file, so a folder loaded with `trust_remote_code=True`
runs the same kernels where minirope is not installed. Both paths give the math of `nn.functional.linear`
and transformers' `ForCausalLMLoss` (float32 rounding differences only) and step aside (plain
`nn.functional.linear`) wherever they are not safe: tensor subclasses (DTensor, fake tensors), tracing and
exporting, autocast, other devices and dtypes (`use_onednn`).

Imports only torch, so that it can be shipped as remote code.
"""

import os
import platform

import torch
from torch import nn

PLAIN_TENSORS = (torch.Tensor, nn.Parameter)


# Decided once, at import, as constants that compiled code reads like any global (no call Dynamo must trace).
ONEDNN_AVAILABLE = (
    os.environ.get("MINIROPE_ONEDNN_LINEAR", "1") != "0"
    and platform.machine().lower() in ("x86_64", "amd64")
    and torch.backends.mkldnn.is_available()
)
AVX512 = torch.backends.cpu.get_cpu_capability().startswith("AVX512")
ONEDNN_EVERYWHERE = ONEDNN_AVAILABLE and AVX512  # every float32 product, training included (`onednn_linear_enabled`)


def onednn_linear_enabled() -> bool:
    """Whether every float32 matrix product on this CPU goes to oneDNN (the kernel library behind torch's bf16
    products and Inductor's CPU linears) rather than to the BLAS behind `torch.mm`: on x86 CPUs with AVX-512.
    Elsewhere only decoding products with large weights do (`few_rows_large_weight`).

    Measured (benchmarks/bench_speed.py, docs/performance.md): on an AVX-512 AMD EPYC, oneDNN ran the narrow
    products of small models 1.6-2.3x faster, forward and backward. On an AVX2-only AMD EPYC (Zen 3, torch 2.13,
    2 threads) it lost almost everywhere: a fixed ~25 us more per call (a `(1, 64) @ (64, 192)` decode product
    took 27.5 us against `torch.mm`'s 4.1 us), 0.84-1.08x `torch.mm`'s speed on 4,096-row training products
    (two runs), and its transposed weight-gradient product 1.3-1.5x the time; so there, products stay on
    `torch.mm` (`bench_speed.py` prints both at decode and training shapes), except the decoding products that
    `few_rows_large_weight` picks.
    Same products, summed in another order (float32 rounding differences only).
    """
    return ONEDNN_EVERYWHERE


def onednn_available() -> bool:
    """Whether this torch can run float32 products on oneDNN here: an x86 CPU, torch built with mkldnn, and
    `MINIROPE_ONEDNN_LINEAR` not set to 0 (read at import: it turns oneDNN off everywhere)."""
    return ONEDNN_AVAILABLE


# Inference products of at most this many rows with a weight of at least this many elements (2 MiB in float32) go to
# oneDNN on every x86 CPU (`few_rows_large_weight`).
FEW_ROWS = 16
LARGE_WEIGHT = 2**19


def few_rows_large_weight(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `x @ weight.T` is a decoding product (at most `FEW_ROWS` rows, no gradient) with a weight of at least
    `LARGE_WEIGHT` elements, which oneDNN runs faster than `torch.mm` on any x86 CPU when torch has several threads.

    Such a product reads the whole weight for a few rows: its speed is memory bandwidth. MKL, behind `torch.mm`,
    runs it on one thread (the same time with 1 and 2 threads); oneDNN spreads it over all of them. Measured on a
    2-core AVX2 AMD EPYC (torch 2.13.0, 2 threads, weights cycled through 128 MiB so they come from memory, as in
    decoding a model larger than the cache; benchmarks/bench_speed.py prints these `linear` rows): 1 x 768 x 2048
    400 -> 243 us, 1 x 384 x 4096 494 -> 272 us, 1 x 2048 x 8192 3.2 -> 1.8 ms, 8 x 2048 x 8192 11.4 -> 4.9 ms;
    at 256 rows and more `torch.mm` is as fast or faster. oneDNN's ~25 us more per call outweighs the gain below
    about 2^19 elements, and for weights that stay in the cache (the default model's 96 x 4096 head: 5 % slower
    decoding). Greedy decoding, whole `generate()` against the same model on `torch.mm`: 100M model 1.11x at batch
    1 and 1.13x at batch 8, 12M 1.02x (only its head is this large), the default model unchanged (none is).
    """
    return (
        ONEDNN_AVAILABLE
        and weight.numel() >= LARGE_WEIGHT
        and not torch.is_grad_enabled()
        and not torch.compiler.is_compiling()
        and x.numel() <= FEW_ROWS * x.shape[-1]
        and torch.get_num_threads() > 1
    )


def use_onednn(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `x @ weight.T` should run on oneDNN: float32 CPU tensors, outside autocast, run eagerly.

    Only plain tensors (`torch.Tensor`, `nn.Parameter`): a tensor subclass (DTensor under tensor parallel or
    FSDP2, fake/functional tensors inside `torch.export`, PEFT or quantization wrappers) has no sharding or
    decomposition rule for the oneDNN op, so it gets `nn.functional.linear`. Never while tracing or exporting
    (TorchScript tracing, the legacy ONNX exporter, `torch.export`): exported graphs must hold standard ops.
    In a `torch.compile`d graph only for inference with Inductor's `freezing` (weights become constants,
    which its oneDNN lowering needs); otherwise Inductor chooses its own kernels.
    """
    if not (
        ONEDNN_AVAILABLE
        and x.device.type == "cpu"
        and x.dtype == weight.dtype == torch.float32
        and not torch.is_autocast_enabled("cpu")
    ):
        return False
    if torch.compiler.is_compiling():
        return (
            ONEDNN_EVERYWHERE
            and not torch.compiler.is_exporting()
            and not torch.is_grad_enabled()
            and inductor_freezes_weights()
        )
    return (
        (ONEDNN_EVERYWHERE or few_rows_large_weight(x, weight))
        and type(x) in PLAIN_TENSORS
        and type(weight) in PLAIN_TENSORS
        and not torch.jit.is_tracing()
        and not torch.onnx.is_in_onnx_export()
    )


def inductor_freezes_weights() -> bool:
    import torch._inductor.config

    return torch._inductor.config.freezing


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`x @ weight.T + bias` on oneDNN. x `(..., K)`, weight `(N, K)` (any strides), bias `(N,)` -> `(..., N)`."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


class OneDnnLinear(torch.autograd.Function):
    """`nn.functional.linear` with the forward and both backward products on oneDNN.

    Under `create_graph=True` (a gradient of a gradient) the backward products use `nn.functional.linear`,
    which autograd can differentiate again; the oneDNN op has no derivative of its own.
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


def matmul_nt(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`nn.functional.linear(x, weight, bias)`, on oneDNN where `use_onednn` says so."""
    if not use_onednn(x, weight):
        return nn.functional.linear(x, weight, bias)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias)):
        return OneDnnLinear.apply(x, weight, bias)
    return onednn_linear(x, weight, bias)


class MiniRopeLinear(nn.Linear):
    """`nn.Linear` (same parameters, init and state-dict keys) whose float32 CPU products run on oneDNN where that
    was measured faster: all of them on AVX-512 CPUs (`onednn_linear_enabled`), decoding products with large weights
    on any x86 CPU (`few_rows_large_weight`); elsewhere exactly `nn.Linear`.

    A subclass, so PEFT, quantization and `isinstance(module, nn.Linear)` checks treat it as a Linear.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # a layer below `LARGE_WEIGHT` never qualifies off AVX-512: tested on plain attributes, its products cost
        # no more to call than nn.Linear's; a larger one lets `use_onednn` (in `matmul_nt`) decide, once
        if ONEDNN_EVERYWHERE or self.in_features * self.out_features >= LARGE_WEIGHT:
            return matmul_nt(x, self.weight, self.bias)
        return nn.functional.linear(x, self.weight, self.bias)  # exactly nn.Linear's forward


class LinearCrossEntropy(torch.autograd.Function):
    """Cross-entropy of `hidden @ weight.T` against `targets`, a chunk of rows at a time.

    The value and gradients of transformers' `ForCausalLMLoss(lm_head(hidden), ...)` (logits upcast to
    float32, `ignore_index` -100, mean over the counted targets or sum / `num_items_in_batch`) without the
    `(N, V)` logits or their gradient ever existing in full. For each chunk of `chunk_size` rows the float32
    logits give the loss and, at once, their gradient `softmax - one_hot(target)` (scaled by 1 / count),
    which is multiplied into the gradients of `hidden` and `weight` and dropped; `backward` only scales those
    by the incoming gradient. The weight's gradient is one float32 `(V, D)` accumulator, added to inside the
    product (`addmm_`) in float32. Under autocast the three matrix products run in the autocast dtype, as
    `nn.Linear` and its backward would, and each chunk's product is added to the accumulator. Same approach as
    Liger Kernel's fused linear cross-entropy.

    Args (of `apply`): hidden `(N, D)`; weight `(V, D)`; targets `(N,)` int64 in `[0, V)` or -100;
    num_items_in_batch: the denominator (tensor or int), or None for the number of counted targets;
    chunk_size: rows per chunk.
    Returns: the scalar loss, float32, in nats per counted target.
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, num_items_in_batch, chunk_size):
        ctx.weight_dtype = weight.dtype
        device = hidden.device.type
        autocast = device != "meta" and torch.is_autocast_enabled(device)  # meta: no autocast state
        dtype = torch.get_autocast_dtype(device) if autocast else hidden.dtype
        compute_hidden, compute_weight = hidden.to(dtype), weight.to(dtype)
        counted = targets != -100
        denominator = counted.sum() if num_items_in_batch is None else num_items_in_batch
        scale = counted / denominator  # (N,): d loss / d (per-row loss)
        targets = targets.masked_fill(~counted, 0)
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if ctx.needs_input_grad[1] else None
        loss = hidden.new_zeros((), dtype=torch.float32)
        for start in range(0, hidden.shape[0], chunk_size):
            rows = slice(start, start + chunk_size)
            logits = matmul_nt(compute_hidden[rows], compute_weight).float()
            target_logit = logits.gather(-1, targets[rows, None])
            top_logit = logits.amax(-1, keepdim=True)
            probs = logits.softmax(-1)
            del logits  # one chunk of logits alive at a time, as before
            # -log softmax(logits)_target = logsumexp(logits) - target logit, the log-sum-exp read off the top
            # logit's probability 1 / sum(exp(logits - top)) (>= 1 / V: it never underflows): one exp pass for
            # the loss and its gradient, where log_softmax then exp took two
            row_loss = top_logit - probs.amax(-1, keepdim=True).log() - target_logit
            loss += (row_loss.squeeze(-1) * scale[rows]).sum()
            if grad_hidden is None and grad_weight is None:
                continue
            grad_logits = probs
            grad_logits.scatter_add_(-1, targets[rows, None], torch.full_like(target_logit, -1.0))
            grad_logits = grad_logits.mul_(scale[rows, None]).to(dtype)
            if grad_hidden is not None:
                grad_hidden[rows] = matmul_nt(grad_logits, compute_weight.T)
            if grad_weight is None:
                continue
            if grad_weight.dtype == dtype:  # accumulated inside the product: no (V, D) temporary, no extra pass
                grad_weight.addmm_(grad_logits.T, compute_hidden[rows])
            else:  # bfloat16 products into the float32 accumulator (mixed-dtype addmm has no CPU kernel)
                grad_weight += matmul_nt(grad_logits.T, compute_hidden[rows].T)
        ctx.save_for_backward(grad_hidden, grad_weight)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        grad_hidden, grad_weight = ctx.saved_tensors
        return (
            None if grad_hidden is None else grad_hidden * grad_loss,
            None if grad_weight is None else (grad_weight * grad_loss).to(ctx.weight_dtype),
            None,
            None,
            None,
        )


def fused_causal_lm_loss(
    lm_head: nn.Module, hidden_states: torch.Tensor, labels: torch.LongTensor, **kwargs
) -> torch.Tensor | None:
    """The causal-LM loss of `lm_head(hidden_states)` against `labels` without the logits (`chunked_causal_lm_loss`),
    or None where the head cannot be fused: a wrapped head (e.g. PEFT LoRA), a head with a bias, or inside
    `torch.compile`, where the fused function's gradients came out zero (measured on CUDA, torch 2.11) and Inductor
    fuses the head and the loss itself. The caller then computes logits and the loss from them.
    """
    fusable = type(lm_head) in (nn.Linear, MiniRopeLinear) and lm_head.bias is None
    if not fusable or torch.compiler.is_compiling():
        return None
    return chunked_causal_lm_loss(hidden_states, lm_head.weight, labels, **kwargs)


# Rows per chunk of `LinearCrossEntropy`, at least: enough that the weight-gradient product (V x rows x D) is
# compute-bound rather than a pass over the (V, D) accumulator per chunk. CPU, 2-core AVX2 EPYC, V = 128,256
# (benchmarks/fused_loss.py): 16 rows (the former 2M logits a chunk) 0.42x Llama's step, 256 rows 1.16x; a sweep
# taken under load ranked 256 rows first, ahead of 64 and of 1,024 (which also took twice the memory).
# Accelerators move ~100x more FLOPs per byte: 1,024 rows (reasoned, not yet measured on a GPU).
MIN_CHUNK_ROWS_CPU = 256
MIN_CHUNK_ROWS_ACCELERATOR = 1024
CHUNK_LOGITS = 2**21  # more rows while a chunk's float32 logits stay within 8 MiB (small vocabularies)


def loss_chunk_rows(vocab_size: int, device_type: str) -> int:
    """Rows per chunk of `LinearCrossEntropy` for a `vocab_size`-entry head on `device_type` ("cpu", "cuda", ...).

    The chunk's float32 logits and their gradient (`rows x vocab_size`) are the loss's working memory: at least
    256 rows on CPU and 1,024 on accelerators (125 MiB of float32 logits at V = 128,256 on CPU, where Llama's loss
    holds the whole batch's), or more while they fit in 2M logits.
    """
    least = MIN_CHUNK_ROWS_CPU if device_type == "cpu" else MIN_CHUNK_ROWS_ACCELERATOR
    return max(least, CHUNK_LOGITS // vocab_size)


def embed_token_ids(embedding: nn.Module, input_ids: torch.LongTensor, vocab_size: int) -> torch.Tensor:
    """`embedding(input_ids)`, with a clear error for an id outside `[0, vocab_size)` instead of a bare IndexError.

    The ids are read (`check_token_ids`) only after the lookup failed, so a valid batch costs nothing more. CPU
    tensors outside compiled graphs only: elsewhere an out-of-range id raises the device's own error.

    Args: `input_ids` `(B, T)` int64. Returns: `(B, T, D)` embeddings.
    Raises:
        ValueError: naming the id and the fix.
    """
    if input_ids.device.type != "cpu" or torch.compiler.is_compiling():
        return embedding(input_ids)
    try:
        return embedding(input_ids)
    except IndexError:
        check_token_ids(input_ids, vocab_size)
        raise


def check_token_ids(input_ids: torch.LongTensor, vocab_size: int) -> None:
    """Raise a clear error for ids outside `[0, vocab_size)` (a reduction over `input_ids`, read on the host).

    Raises:
        ValueError: naming the id and the fix.
    """
    if input_ids.numel() == 0:
        return
    low, high = (int(value) for value in torch.aminmax(input_ids))
    if low < 0 or high >= vocab_size:
        raise ValueError(
            f"input_ids hold token id {high if high >= vocab_size else low}, outside the vocabulary "
            f"[0, {vocab_size}): tokenize with this model's tokenizer, or resize_token_embeddings()."
        )


def chunked_causal_lm_loss(
    hidden_states: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.LongTensor,
    num_items_in_batch: torch.Tensor | int | None = None,
    shift_labels: torch.LongTensor | None = None,
    **kwargs,
) -> torch.Tensor:
    """transformers' `ForCausalLMLoss` of `hidden_states @ weight.T` via `LinearCrossEntropy`, without the logits.

    Args: hidden_states `(B, T, D)`; weight `(V, D)` (the LM head); labels `(B, T)` aligned with the inputs
    (token t predicts label t + 1) or `shift_labels` already shifted; -100 is ignored.
    Returns: the scalar float32 loss, in nats per counted target (or summed / `num_items_in_batch`).

    Rows per chunk from `loss_chunk_rows`: enough for compute-bound matrix products at any vocabulary size.
    """
    if shift_labels is None:
        shift_labels = nn.functional.pad(labels, (0, 1), value=-100)[..., 1:]
    hidden = hidden_states.reshape(-1, hidden_states.shape[-1])
    targets = shift_labels.reshape(-1).to(hidden.device)
    chunk_size = loss_chunk_rows(weight.shape[0], hidden.device.type)
    return LinearCrossEntropy.apply(hidden, weight, targets, num_items_in_batch, chunk_size)
