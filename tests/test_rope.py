"""The RoPE module: its cache equals the closed form, and the rotation has the paper's properties."""

import torch
from conftest import tiny_config

from minirope import MiniRopeRotaryEmbedding, apply_rotary_pos_emb, rotate_half


def closed_form(config, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of m * theta_i with theta_i = base^(-2i/d), written from RoFormer eq. 15 (float64)."""
    d = config.head_dim
    theta = config.rope_parameters["rope_theta"] ** (-torch.arange(0, d // 2, dtype=torch.float64) * 2 / d)
    angles = positions.double()[..., None] * theta
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def test_cache_equals_closed_form_including_past_its_initial_length():
    config = tiny_config("mha", max_position_embeddings=16)
    rope = MiniRopeRotaryEmbedding(config)
    assert rope.cos_cached.shape == (16, config.head_dim)
    positions = torch.tensor([[0, 1, 5, 15], [3, 2, 1, 0]])
    cos, sin = rope(torch.zeros(1, dtype=torch.float32), positions)
    want_cos, want_sin = closed_form(config, positions)
    torch.testing.assert_close(cos.double(), want_cos, rtol=0, atol=1e-6)
    torch.testing.assert_close(sin.double(), want_sin, rtol=0, atol=1e-6)

    far = torch.tensor([[16, 40, 1000]])  # past the initial 16 rows: the cache grows
    cos, sin = rope(torch.zeros(1), far)
    assert rope.cached_positions >= 1001
    want_cos, want_sin = closed_form(config, far)
    # float32 angles m * theta lose ~m * 6e-8 rad of precision, as in LlamaRotaryEmbedding
    torch.testing.assert_close(cos.double(), want_cos, rtol=0, atol=1e-4)
    torch.testing.assert_close(sin.double(), want_sin, rtol=0, atol=1e-4)
    # the grown cache still holds the first rows unchanged
    torch.testing.assert_close(
        rope(torch.zeros(1), positions)[0].double(), closed_form(config, positions)[0], rtol=0, atol=1e-6
    )


def test_output_follows_the_activation_dtype():
    rope = MiniRopeRotaryEmbedding(tiny_config("mha"))
    cos, sin = rope(torch.zeros(1, dtype=torch.bfloat16), torch.arange(5)[None])
    assert cos.dtype == sin.dtype == torch.bfloat16 and cos.shape == (1, 5, rope.config.head_dim)


def test_rotate_half_pairs_dim_i_with_i_plus_half():
    x = torch.arange(1.0, 7.0)  # d = 6: pairs (x0, x3), (x1, x4), (x2, x5)
    assert rotate_half(x).tolist() == [-4.0, -5.0, -6.0, 1.0, 2.0, 3.0]


def test_rotation_preserves_norm_and_scores_depend_only_on_relative_position():
    config = tiny_config("mha")
    rope = MiniRopeRotaryEmbedding(config)
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(1, 1, 1, config.head_dim, generator=generator, dtype=torch.float32)
    k = torch.randn(1, 1, 1, config.head_dim, generator=generator, dtype=torch.float32)

    def rotated(m: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        cos_m, sin_m = rope(q, torch.tensor([[m]]))
        cos_n, sin_n = rope(k, torch.tensor([[n]]))
        return apply_rotary_pos_emb(q, q, cos_m, sin_m)[0], apply_rotary_pos_emb(k, k, cos_n, sin_n)[1]

    q5, k9 = rotated(5, 9)
    torch.testing.assert_close(q5.norm(), q.norm())
    # <R_m q, R_n k> is a function of n - m alone (RoFormer eq. 16)
    scores = [(a * b).sum() for a, b in (rotated(m, m + 4) for m in (0, 5, 17, 30))]
    for score in scores[1:]:
        torch.testing.assert_close(score, scores[0], rtol=1e-5, atol=1e-5)
    assert not torch.allclose((q5 * k9).sum(), (q * k).sum())  # and it does depend on n - m


def test_compiled_length_dependent_types_follow_llama_past_the_tables():
    """`dynamic` and `longrope` rescale `inv_freq` with transformers' `dynamic_rope_update` (Llama's code); compiled,
    the tables follow the rescaled frequencies at every length, past the trained context and back (before 2026-11-24
    a compiled graph kept the frequencies it was traced with). One graph for every length (`dynamic=True`): a graph
    that baked in its first length's frequencies cannot pass."""
    import pytest
    from conftest import llama_twin, random_model

    head = tiny_config().head_dim // 2
    for rope_parameters in (
        {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
        {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * head, "long_factor": [2.0] * head,
         "original_max_position_embeddings": 16},
    ):  # fmt: skip
        model = random_model(tiny_config(rope_parameters=rope_parameters))
        llama = llama_twin(model)
        compiled = torch.compile(model.forward, dynamic=True)
        for length in (48, 20, 10, 70):  # the tables start at 32 positions
            ids = torch.randint(3, 97, (1, length), generator=torch.Generator().manual_seed(length))
            with torch.no_grad():
                got, want = compiled(input_ids=ids).logits, llama(input_ids=ids).logits
            assert (got - want).abs().max().item() == pytest.approx(0, abs=1e-4), (rope_parameters["rope_type"], length)
