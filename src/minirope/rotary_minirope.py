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

import torch
from torch import nn
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS, dynamic_rope_update

from .configuration_minirope import MiniRopeConfig

# Types whose frequencies depend on the sequence length (NTK-aware "dynamic", LongRoPE's short/long factors).
LENGTH_DEPENDENT = ("dynamic", "longrope")


class MiniRopeRotaryEmbedding(nn.Module):
    """The cos/sin tables of RoPE, computed once and gathered by `position_ids`. For each m < `cached_positions`:

        cos_cached[m] = cos(m * cat(theta, theta)) * attention_scaling     float32 (cached_positions, d)
        sin_cached[m] = sin(m * cat(theta, theta)) * attention_scaling

    (the `rotate_half` layout: dims j and j + d/2 share the angle m * theta_j). `inv_freq` (theta, `(d/2,)`) is eq. 15
    for `default` and comes from transformers' `ROPE_INIT_FUNCTIONS` for every other `rope_type`; `dynamic` and
    `longrope` recompute it from the longest position with transformers' own `dynamic_rope_update` (Llama's numbers),
    and the tables follow. All buffers are non-persistent (derived from the config; rebuilt by `_init_weights`).

    The tables cover `max_position_embeddings` positions at first; `MiniRopeModel` grows them from lengths known on the
    host (`grow`), and on CPU `forward` grows them for any later position. Inside a `torch.compile`d graph positions
    must stay below `cached_positions` (`reset_cache(n)` before compiling for longer contexts), except for `dynamic`
    and `longrope`, which read the longest position as Llama's do. Under `torch.export` (the ONNX and ExecuTorch
    exports) the rows are computed from `position_ids` instead, so an exported graph has no length limit.
    """

    inv_freq: torch.Tensor
    original_inv_freq: torch.Tensor
    tables_inv_freq: torch.Tensor  # the `inv_freq` the tables were computed from
    cos_cached: torch.Tensor
    sin_cached: torch.Tensor

    def __init__(self, config: MiniRopeConfig, device: torch.device | None = None) -> None:
        super().__init__()
        self.config = config
        self.rope_type = config.rope_parameters["rope_type"]
        # `max_seq_len_cached` is the length `inv_freq` was computed for, read and set by `dynamic_rope_update`.
        self.max_seq_len_cached = self.original_max_seq_len = config.max_position_embeddings
        default = self.rope_type == "default"
        init = self.compute_default_rope_parameters if default else ROPE_INIT_FUNCTIONS[self.rope_type]
        inv_freq, self.attention_scaling = init(config, device)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("original_inv_freq", inv_freq.clone(), persistent=False)
        self.reset_cache(config.max_position_embeddings)

    @staticmethod
    def compute_default_rope_parameters(config: MiniRopeConfig, device=None, seq_len=None, **kwargs):
        """RoFormer eq. 15: float32 `theta_i = base^(-2i/d)`, i = 0 .. d/2-1 (radians per position), and scaling 1."""
        base, dim = config.rope_parameters["rope_theta"], config.head_dim
        exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim
        return 1.0 / (base**exponents), 1.0

    @property
    def cached_positions(self) -> int:
        return self.cos_cached.shape[0]

    @torch.no_grad()
    def reset_cache(self, seq_len: int | None = None) -> None:
        """Compute the tables for positions `0 .. seq_len-1` (default: as many as now) from the current `inv_freq`."""
        positions = torch.arange(seq_len or self.cached_positions, device=self.inv_freq.device, dtype=torch.float32)
        cos, sin = self.angles(positions)
        self.register_buffer("tables_inv_freq", self.inv_freq.clone(), persistent=False)
        self.register_buffer("cos_cached", cos, persistent=False)
        self.register_buffer("sin_cached", sin, persistent=False)

    def angles(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 `(cos, sin)` of `positions * cat(theta, theta)` times `attention_scaling`: `(..., d)` for `(...)`."""
        freqs = positions[..., None].float() * self.inv_freq.float()  # (..., d/2): m * theta_i
        emb = torch.cat((freqs, freqs), dim=-1)  # (..., d): rotate_half pairs dim i with i + d/2
        return emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling

    def grow(self, seq_len: int) -> None:
        """Cover positions `0 .. seq_len-1` (a host integer: nothing is read from the device), doubling as needed."""
        if seq_len > self.cached_positions:
            self.reset_cache(max(seq_len, 2 * self.cached_positions))

    @torch.no_grad()
    @dynamic_rope_update
    def forward(self, x: torch.Tensor, position_ids: torch.LongTensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`(cos, sin)` rows of each token's position, each `(B, T, d)` in `x.dtype`; `position_ids` `(B, T)` int64."""
        if torch.compiler.is_exporting() and self.rope_type not in LENGTH_DEPENDENT:
            # An exported graph (ONNX, ExecuTorch) computes the rows from the positions, as Llama's forward does:
            # the same float32 operations as the tables, and no length limit baked into the graph.
            cos, sin = self.angles(position_ids)
            return cos.to(x.dtype), sin.to(x.dtype)
        if self.rope_type in LENGTH_DEPENDENT:  # reads the longest position, as Llama's (a graph break when compiled)
            needed = int(position_ids.max()) + 1
            if not torch.equal(self.inv_freq, self.tables_inv_freq):  # `dynamic_rope_update` rescaled `inv_freq`
                self.reset_cache(max(self.cached_positions, needed))
            self.grow(needed)
        elif position_ids.device.type == "cpu" and not torch.compiler.is_compiling():
            self.grow(int(position_ids.max()) + 1)  # no device sync on CPU
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
