"""Extending a trained model's context: the RoPE scaling that `minirope-extend` writes into a config.

Each type is one of transformers' `ROPE_INIT_FUNCTIONS` (`rotary_minirope` computes it, with Llama's numbers); this
module only chooses the config fields: the type's parameters, `factor`, `original_max_position_embeddings`, and
the new `max_position_embeddings` (docs/long_context.md).
"""

# The scalings minirope-extend writes, with the parameters it sets beside `factor` and
# `original_max_position_embeddings` (`longrope` needs per-dimension factors fitted to a model: not written here).
EXTENSIONS = {
    "default": {},
    "linear": {},
    "dynamic": {},
    "yarn": {"beta_fast": 32.0, "beta_slow": 1.0},
    "llama3": {"low_freq_factor": 1.0, "high_freq_factor": 4.0},
}


def extended_rope(config, rope_type: str, factor: float, block_size: int) -> dict:
    """The config fields that extend `config` (trained at `config.max_position_embeddings` tokens) by `factor`.

    Returns `{"rope_parameters": ..., "max_position_embeddings": ...}`: the type's parameters as
    transformers' `ROPE_INIT_FUNCTIONS` read them, with `factor` and `original_max_position_embeddings`;
    `max_position_embeddings` is `block_size`, except for `dynamic`, which rescales past it and so keeps
    the original length.

    Raises:
        ValueError: an unknown `rope_type`, `factor <= 1`, a `block_size` beyond factor x the original
            context, or a model whose RoPE is already scaled.
    """
    if rope_type not in EXTENSIONS:
        raise ValueError(f"--rope_type {rope_type!r} is not one of {', '.join(EXTENSIONS)}: pick one of them.")
    if not factor > 1:
        raise ValueError(f"--factor must be > 1 (new context = factor x the trained one), got {factor}: e.g. 4.")
    current = dict(config.rope_parameters or {"rope_type": "default", "rope_theta": 10000.0})
    if current.get("rope_type", "default") != "default":
        raise ValueError(
            f"the model's RoPE is already scaled ({current}): extend the model it was extended from, with the "
            f"total factor."
        )
    original = config.max_position_embeddings
    if block_size > factor * original:
        raise ValueError(
            f"--block_size {block_size} is beyond factor x the trained context ({factor:g} x {original} = "
            f"{factor * original:g}): lower --block_size or raise --factor."
        )
    if rope_type == "default":
        return {"rope_parameters": current, "max_position_embeddings": block_size}
    rope = {
        "rope_type": rope_type,
        "rope_theta": current["rope_theta"],
        "factor": float(factor),
        "original_max_position_embeddings": original,
        **EXTENSIONS[rope_type],
    }
    return {"rope_parameters": rope, "max_position_embeddings": original if rope_type == "dynamic" else block_size}
