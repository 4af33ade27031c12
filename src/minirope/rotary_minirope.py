"""Rotary Position Embedding (RoPE; Su et al. 2021, RoFormer, arXiv:2104.09864), as transformers' Llama lays it out.

RoFormer rotates each pair of dimensions of a query or key at position m by the angle `m * theta_i`, with
`theta_i = base^(-2i/d)` (eq. 15), so that the score of a query at m and a key at n depends on n - m alone
(eq. 16). As in `LlamaRotaryEmbedding`, the pairs are `(x_i, x_{i+d/2})` (`rotate_half`) rather than the paper's
`(x_{2i}, x_{2i+1})`: the same rotation up to a fixed permutation of each head's dimensions (docs/rope.md). Unlike
Llama, which recomputes cos and sin at every forward, the cos/sin values are computed once for every position and
gathered by `position_ids` (as torchtune's `RotaryPositionalEmbeddings` does).

Shapes: B batch, T tokens, H query heads, K key/value heads, d head_dim.

This file is shipped with `modeling_minirope.py` as remote code: it imports only torch, transformers and the config.
"""

from collections.abc import Callable

import torch
from torch import nn
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from .configuration_minirope import MiniRopeConfig

# Types whose frequencies depend on the sequence length (NTK-aware "dynamic", LongRoPE's short/long factors).
LENGTH_DEPENDENT = ("dynamic", "longrope")


class MiniRopeRotaryEmbedding(nn.Module):
    """The cos/sin tables of RoPE, computed once and gathered by position.

    This module holds `inv_freq` = theta (shape `(d/2,)`) and, for every position m < `max_seq_len_cached`, the rows

        cos_cached[m] = cos(m * cat(theta, theta)) * attention_scaling     shape (max_seq_len_cached, d)
        sin_cached[m] = sin(m * cat(theta, theta)) * attention_scaling

    in the `rotate_half` layout (dim j and j + d/2 share the angle m * theta_j). The tables are float32
    non-persistent buffers: derived from the config, never saved, and rebuilt by the model's `_init_weights`
    (transformers builds models on the meta device in `from_pretrained`).

    The tables cover `max_position_embeddings` positions from the start. `MiniRopeModel` extends them before a
    forward whose positions may go further (`grow`, from lengths known on the host: the cache's length plus the
    new tokens), so the forward never reads tensor values on the host on an accelerator (no device-to-host sync,
    and it runs on the `meta` device, as Llama's). On CPU, where it costs no sync, `forward` also grows the tables
    for any position past their end (e.g. `position_ids` given by hand).

    Scaled variants come from `config.rope_parameters["rope_type"]`: `default` is eq. 15; every other type takes
    `inv_freq` and `attention_scaling` from `transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS`. `dynamic`
    (NTK-aware) and `longrope` recompute `inv_freq` from the largest position, on the same schedule as
    `LlamaRotaryEmbedding` (and so give the same numbers): like Llama's, they read it on the host at each forward.

    Inside a `torch.compile`d graph these length checks are skipped: positions must stay below
    `max_seq_len_cached` (call `reset_cache(n)` before compiling for longer contexts), and `dynamic`/`longrope`
    keep the frequencies they had when the graph was traced.

    Args:
        config: a `MiniRopeConfig` (uses `head_dim`, `max_position_embeddings`, `rope_parameters`).
        device: where to build the buffers.
    """

    inv_freq: torch.Tensor
    original_inv_freq: torch.Tensor
    cos_cached: torch.Tensor
    sin_cached: torch.Tensor

    def __init__(self, config: MiniRopeConfig, device: torch.device | None = None) -> None:
        super().__init__()
        self.config = config
        self.rope_type = config.rope_parameters["rope_type"]
        self.original_max_seq_len = config.max_position_embeddings
        inv_freq, self.attention_scaling = self.rope_init_fn(config, device)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("original_inv_freq", inv_freq.clone(), persistent=False)
        # The length `inv_freq` was computed for; only `dynamic` and `longrope` change it.
        self.rope_seq_len = self.original_max_seq_len
        cos, sin = self.compute_cos_sin(self.original_max_seq_len)
        self.register_buffer("cos_cached", cos, persistent=False)
        self.register_buffer("sin_cached", sin, persistent=False)

    @property
    def rope_init_fn(self) -> Callable[..., tuple[torch.Tensor, float]]:
        if self.rope_type == "default":
            return self.compute_default_rope_parameters
        return ROPE_INIT_FUNCTIONS[self.rope_type]

    @staticmethod
    def compute_default_rope_parameters(
        config: MiniRopeConfig, device: torch.device | None = None, seq_len: int | None = None, **kwargs
    ) -> tuple[torch.Tensor, float]:
        """RoFormer eq. 15: `theta_i = base^(-2i/d)` for i = 0 .. d/2-1.

        Returns:
            `(inv_freq, attention_scaling)`: float32 `(d/2,)` in radians per position, and 1.0.
        """
        base = config.rope_parameters["rope_theta"]
        dim = config.head_dim
        exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim
        return 1.0 / (base**exponents), 1.0

    @property
    def max_seq_len_cached(self) -> int:
        return self.cos_cached.shape[0]

    @torch.no_grad()
    def compute_cos_sin(self, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The tables for positions `0 .. seq_len-1` from the current `inv_freq`.

        Returns:
            `(cos, sin)`, each float32 `(seq_len, d)`, already multiplied by `attention_scaling`.
        """
        inv_freq = self.inv_freq.float()
        positions = torch.arange(seq_len, device=inv_freq.device, dtype=torch.float32)
        freqs = positions[:, None] * inv_freq  # (seq_len, d/2): m * theta_i
        emb = torch.cat((freqs, freqs), dim=-1)  # (seq_len, d): rotate_half pairs dim i with i + d/2
        return emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling

    @torch.no_grad()
    def reset_cache(self, seq_len: int | None = None) -> None:
        """Recompute the tables for `seq_len` positions (default: their current length) from `inv_freq`."""
        self.cos_cached, self.sin_cached = self.compute_cos_sin(seq_len or self.max_seq_len_cached)

    def grow(self, seq_len: int) -> None:
        """Make the tables cover positions `0 .. seq_len-1` (doubling their length as needed).

        `seq_len` is a host integer (e.g. a cache length plus new tokens): nothing is read from the device.
        """
        if seq_len > self.max_seq_len_cached:
            self.reset_cache(max(seq_len, 2 * self.max_seq_len_cached))

    @torch.no_grad()
    def _rescale_inv_freq(self, seq_len: int) -> bool:
        """`dynamic` and `longrope`: set `inv_freq` for a sequence of `seq_len` tokens, as Llama does.

        Returns whether `inv_freq` changed.
        """
        if self.rope_type == "dynamic":
            if seq_len > self.rope_seq_len:  # longer than any seen: stretch further
                new_len = seq_len
            elif seq_len < self.original_max_seq_len < self.rope_seq_len:  # short again: original angles
                new_len = self.original_max_seq_len
            else:
                return False
        else:
            original_len = self.config.rope_parameters["original_max_position_embeddings"]
            new_len = original_len + 1 if seq_len > original_len else self.original_max_seq_len
            if new_len == self.rope_seq_len:
                return False
        if new_len == self.original_max_seq_len:
            inv_freq = self.original_inv_freq
        else:
            inv_freq, _ = self.rope_init_fn(self.config, self.inv_freq.device, seq_len=new_len)
        self.inv_freq.copy_(inv_freq)
        self.rope_seq_len = new_len
        return True

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.LongTensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Gather the cos/sin rows of each token's position.

        Args:
            x: any tensor of the activations' dtype and device (only `x.dtype` is used).
            position_ids: `(B, T)` int64, absolute position m of each token.

        Returns:
            `(cos, sin)`, each `(B, T, d)` in `x.dtype`.
        """
        compiling = torch.compiler.is_compiling()
        if self.rope_type in LENGTH_DEPENDENT and not compiling:  # the angles depend on the longest position
            seq_len = int(position_ids.max()) + 1
            rescaled = self._rescale_inv_freq(seq_len)
            if seq_len > self.max_seq_len_cached:
                self.grow(seq_len)
            elif rescaled:
                self.reset_cache()
        elif position_ids.device.type == "cpu" and not compiling:
            try:  # no read of the positions before the gather: it fails, and only then, past the tables' end
                return self.cos_cached[position_ids].to(x.dtype), self.sin_cached[position_ids].to(x.dtype)
            except IndexError:
                self.grow(int(position_ids.max()) + 1)
        return self.cos_cached[position_ids].to(x.dtype), self.sin_cached[position_ids].to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """`(x_1, x_2) -> (-x_2, x_1)` on the two halves of the last dim, shape `(..., d)` -> `(..., d)`.

    With cos/sin laid out as `cat(theta, theta)`, `x * cos + rotate_half(x) * sin` rotates each pair
    `(x_i, x_{i+d/2})` by its angle: RoFormer eq. 34 with the pairs taken as (i, i + d/2) instead of
    (2i, 2i+1), a fixed permutation of the dims (see docs/rope.md).
    """
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate queries and keys by their positions' angles: `R_{Theta,m} x` (RoFormer eq. 34).

    `q' = q * cos + rotate_half(q) * sin` and the same for k. Values are never rotated: position enters
    attention only through the scores `q'_m . k'_n = q R_{n-m} k` (eq. 16), which depend on n - m alone.

    Args:
        q: `(B, H, T, d)` queries.
        k: `(B, K, T, d)` keys.
        cos, sin: `(B, T, d)` from `MiniRopeRotaryEmbedding`.
        unsqueeze_dim: the head axis of q and k that cos/sin are broadcast over (1 for `(B, H, T, d)`,
            2 for `(B, T, H, d)`).

    Returns:
        `(q', k')`, shaped as `q` and `k`.
    """
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed
