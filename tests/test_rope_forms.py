"""The three forms of RoPE agree: RoFormer's rotation matrix (eq. 15), the complex product (eq. 12/34
in complex notation, as Meta's code writes it) and transformers' rotate_half (eq. 34 on permuted dims).
docs/rope.md walks through each step these tests check."""

import torch

from minirope import MiniRopeConfig, MiniRopeRotaryEmbedding, apply_rotary_pos_emb
from minirope.convert import interleaved_to_half_split

D, BASE = 8, 10000.0


def theta(d: int = D, base: float = BASE) -> torch.Tensor:
    """theta_i = base^(-2(i-1)/d), i = 1 .. d/2 (eq. 15), in float64."""
    return base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)


def rotation_matrix(m: int, d: int = D) -> torch.Tensor:
    """R^d_{Theta,m}: block-diagonal, one 2x2 rotation by m * theta_i per pair (x_2i, x_2i+1) (eq. 15)."""
    R = torch.zeros(d, d, dtype=torch.float64)
    for i, angle in enumerate(m * theta(d)):
        c, s = torch.cos(angle), torch.sin(angle)
        R[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = torch.stack([torch.stack([c, -s]), torch.stack([s, c])])
    return R


def complex_form(x: torch.Tensor, m: int) -> torch.Tensor:
    """(x_2i + i x_2i+1) * e^{i m theta_i}, as in `torch.polar` / `view_as_complex` code."""
    pairs = torch.view_as_complex(x.reshape(-1, 2).contiguous())
    return torch.view_as_real(pairs * torch.polar(torch.ones_like(theta()), m * theta())).flatten()


def rotate_half_form(x_half_split: torch.Tensor, m: int) -> torch.Tensor:
    """minirope's path: the cached cos/sin row of position m and apply_rotary_pos_emb (float64 cache)."""
    config = MiniRopeConfig(
        hidden_size=D, num_attention_heads=1, rope_parameters={"rope_type": "default", "rope_theta": BASE}
    )
    rope = MiniRopeRotaryEmbedding(config).double()
    rope.reset_cache(64)
    cos, sin = rope(x_half_split, torch.tensor([[m]]))
    rotated, _ = apply_rotary_pos_emb(x_half_split[None, None, None], x_half_split[None, None, None], cos, sin)
    return rotated.flatten()


def test_matrix_and_complex_forms_agree():
    x = torch.randn(D, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for m in (0, 1, 7, 50):
        torch.testing.assert_close(complex_form(x, m), rotation_matrix(m) @ x)


def test_rotate_half_form_is_the_matrix_form_on_permuted_dims():
    x = torch.randn(D, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    permute = lambda v: interleaved_to_half_split(v, num_heads=1)  # noqa: E731
    for m in (0, 1, 7, 50):
        torch.testing.assert_close(rotate_half_form(permute(x), m), permute(rotation_matrix(m) @ x))


def test_rotation_matrix_properties():
    # orthogonal (norm preserving), R_m^T R_n = R_{n-m} (eq. 16), R_0 = I
    for m, n in ((0, 5), (3, 9), (20, 4)):
        Rm, Rn = rotation_matrix(m), rotation_matrix(n)
        torch.testing.assert_close(Rm.T @ Rm, torch.eye(D, dtype=torch.float64))
        torch.testing.assert_close(Rm.T @ Rn, rotation_matrix(n - m))
    torch.testing.assert_close(rotation_matrix(0), torch.eye(D, dtype=torch.float64))
