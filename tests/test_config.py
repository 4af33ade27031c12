"""Every invalid MiniRopeConfig value raises ValueError naming the field."""

import pytest

from minirope import MiniRopeConfig


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        (dict(hidden_size=64, num_attention_heads=4, head_dim=15), "head_dim"),
        (dict(hidden_size=60, num_attention_heads=4), "head_dim"),  # 60 / 4 = 15, odd
        (dict(hidden_size=64, num_attention_heads=5), "hidden_size"),
        (dict(num_attention_heads=4, num_key_value_heads=3), "num_key_value_heads"),
        (dict(rope_parameters={"rope_type": "spiral", "rope_theta": 10000.0}), "rope_type"),
        (dict(rope_parameters={"rope_type": "default", "rope_theta": -1.0}), "rope_theta"),
        (dict(vocab_size=0), "vocab_size"),
        (dict(hidden_size=-64, head_dim=16), "hidden_size"),
        (dict(intermediate_size=0), "intermediate_size"),
        (dict(num_hidden_layers=0), "num_hidden_layers"),
        (dict(num_attention_heads=0), "num_attention_heads"),
        (dict(num_key_value_heads=0), "num_key_value_heads"),
        (dict(max_position_embeddings=0), "max_position_embeddings"),
        (dict(head_dim=0), "head_dim"),
    ],
)
def test_invalid_values_raise_value_error_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        MiniRopeConfig(**kwargs)


def test_defaults_and_llama_field_names():
    config = MiniRopeConfig()
    assert config.model_type == "minirope"
    assert config.rope_parameters == {"rope_type": "default", "rope_theta": 10000.0}
    assert config.head_dim == config.hidden_size // config.num_attention_heads
    assert config.num_key_value_heads == config.num_attention_heads
    gqa = MiniRopeConfig(hidden_size=128, num_attention_heads=8, num_key_value_heads=2)
    assert (gqa.head_dim, gqa.num_key_value_heads) == (16, 2)


def test_config_round_trips_through_json(tmp_path):
    config = MiniRopeConfig(
        hidden_size=96,
        num_attention_heads=6,
        num_key_value_heads=2,
        rope_parameters={"rope_type": "linear", "rope_theta": 500.0, "factor": 2.0},
    )
    config.save_pretrained(tmp_path)
    loaded = MiniRopeConfig.from_pretrained(tmp_path)
    assert loaded.to_dict() == config.to_dict()
