"""The fused causal-LM loss of the minirope model (`LinearCrossEntropy`: the loss and its gradients without the
`(N, V)` logits), the token-id check of the embedding, and Llama's eager attention (`eager_attention_forward`,
`repeat_kv` for grouped-query attention).

Kept apart from `modeling_minirope.py` (which reads like the paper) and shipped beside it as remote code:
`save_pretrained` copies this file with the model file, so a folder loaded with `trust_remote_code=True`
computes the same loss where minirope is not installed. The model's own matmuls are `nn.Linear`'s, exactly
Llama's; the loss gives the value and gradients of transformers' `ForCausalLMLoss` (float32 rounding differences
only).

Imports only torch, so that it can be shipped as remote code.
"""

import torch
from torch import nn


class LinearCrossEntropy(torch.autograd.Function):
    """Cross-entropy of `hidden @ weight.T` against `targets`, a chunk of rows at a time.

    The value and gradients of transformers' `ForCausalLMLoss(lm_head(hidden), ...)` (logits upcast to
    float32, `ignore_index` -100, mean over the counted targets or sum / `num_items_in_batch`) without the
    `(N, V)` logits or their gradient ever existing in full. For each chunk of `chunk_size` rows the float32
    logits give the loss and, at once, their gradient `softmax - one_hot(target)` (scaled by 1 / count),
    which is multiplied into the gradients of `hidden` and `weight` and dropped; `backward` only scales those
    by the incoming gradient. The weight's gradient is one float32 `(V, D)` accumulator, added to inside the
    product (`addmm_`) in float32. Under autocast the three matrix multiplications run in the autocast dtype, as
    `nn.Linear` and its backward would, and each chunk's product is added to the accumulator. Same approach as
    Liger Kernel's fused linear cross-entropy.

    The three matmuls are torch's `@` unless `product` is given: a function `(x, w) -> x @ w.T` (the same math,
    another kernel: `minirope.cpu_matmuls` passes oneDNN's where this machine measured it faster); each chunk's
    weight-gradient product is then added to the accumulator.

    Args (of `apply`): hidden `(N, D)`; weight `(V, D)`; targets `(N,)` int64 in `[0, V)` or -100;
    num_items_in_batch: the denominator (tensor or int), or None for the number of counted targets;
    chunk_size: rows per chunk; product: None, or the function above.
    Returns: the scalar loss, float32, in nats per counted target.
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, num_items_in_batch, chunk_size, product=None):
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
        matmul_nt = product or (lambda x, w: x @ w.T)
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
            if grad_weight.dtype == dtype and product is None:  # inside the product: no (V, D) temporary
                grad_weight.addmm_(grad_logits.T, compute_hidden[rows])
            else:  # bfloat16 matmuls into the float32 accumulator (mixed-dtype addmm has no CPU kernel)
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
            None,
        )


def fused_causal_lm_loss(
    lm_head: nn.Module, hidden_states: torch.Tensor, labels: torch.LongTensor, **kwargs
) -> torch.Tensor | None:
    """The causal-LM loss of `lm_head(hidden_states)` against `labels` without the logits (`chunked_causal_lm_loss`),
    or None where the head cannot be fused: a wrapped head (e.g. PEFT LoRA), a head with a bias, or inside
    `torch.compile`, where the fused function's gradients came out zero (measured on CUDA, torch 2.11) and Inductor
    fuses the head and the loss itself. The caller then computes logits and the loss from them.

    A head may carry its own product kernel as `lm_head.loss_product` (`(x, w) -> x @ w.T`; set by
    `minirope.cpu_matmuls` where this machine measured oneDNN faster, absent otherwise): the chunks use it.
    """
    fusable = type(lm_head) is nn.Linear and lm_head.bias is None
    if not fusable or torch.compiler.is_compiling():
        return None
    product = getattr(lm_head, "loss_product", None)
    return chunked_causal_lm_loss(hidden_states, lm_head.weight, labels, product=product, **kwargs)


# Rows per chunk of `LinearCrossEntropy`, at least: enough that the weight-gradient product (V x rows x D) is
# compute-bound rather than a pass over the (V, D) accumulator per chunk; accelerators move ~100x more FLOPs per
# byte, so more rows there. The measurements behind both: docs/performance.md, "Constants and their measurements".
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
    product=None,
    **kwargs,
) -> torch.Tensor:
    """transformers' `ForCausalLMLoss` of `hidden_states @ weight.T` via `LinearCrossEntropy`, without the logits.

    Args: hidden_states `(B, T, D)`; weight `(V, D)` (the LM head); labels `(B, T)` aligned with the inputs
    (token t predicts label t + 1) or `shift_labels` already shifted; -100 is ignored; product: the chunks'
    `(x, w) -> x @ w.T` kernel, or None for torch's `@` (`LinearCrossEntropy`).
    Returns: the scalar float32 loss, in nats per counted target (or summed / `num_items_in_batch`).

    Rows per chunk from `loss_chunk_rows`: enough for compute-bound matrix multiplications at any vocabulary size.
    """
    if shift_labels is None:
        shift_labels = nn.functional.pad(labels, (0, 1), value=-100)[..., 1:]
    hidden = hidden_states.reshape(-1, hidden_states.shape[-1])
    targets = shift_labels.reshape(-1).to(hidden.device)
    chunk_size = loss_chunk_rows(weight.shape[0], hidden.device.type)
    return LinearCrossEntropy.apply(hidden, weight, targets, num_items_in_batch, chunk_size, product)


def repeat_kv(hidden_states: torch.Tensor, n_rep: int) -> torch.Tensor:
    """Share each key/value head with `n_rep` query heads: `(B, K, S, d)` -> `(B, K * n_rep, S, d)`."""
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain softmax attention, `softmax(q k^T * scaling + mask) v`, softmax in float32: transformers'
    `modeling_llama.eager_attention_forward`, the `attn_implementation="eager"` entry beside the attention interface's
    sdpa and flash kernels.

    Args: query `(B, H, T, d)`, key/value `(B, K, S, d)`, attention_mask additive `(B, 1, T, S)` or None.
    Returns: `(output (B, T, H, d), weights (B, H, T, S))`.
    """
    key_states = repeat_kv(key, module.num_key_value_groups)
    value_states = repeat_kv(value, module.num_key_value_groups)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value_states)
    return attn_output.transpose(1, 2).contiguous(), attn_weights
