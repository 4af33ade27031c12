"""save_pretrained -> from_pretrained gives the same model, with auto_map and the model files shipped."""

import json

import torch
from conftest import left_padded_batch, random_model, tiny_config
from transformers import AutoConfig, AutoModelForCausalLM

from minirope import MiniRopeConfig, MiniRopeForCausalLM


def test_round_trip_is_bit_identical_and_ships_remote_code(tmp_path, layout):
    model = random_model(tiny_config(layout, tie_word_embeddings=layout == "mha"))
    model.save_pretrained(tmp_path)

    files = {path.name for path in tmp_path.iterdir()}
    assert {
        "model.safetensors",
        "config.json",
        "modeling_minirope.py",
        "configuration_minirope.py",
        "kernels_minirope.py",
        "rotary_minirope.py",
        "loading_minirope.py",
    } <= files
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "minirope"
    assert saved["auto_map"] == {  # every Auto class can load the folder as remote code
        "AutoConfig": "configuration_minirope.MiniRopeConfig",
        "AutoModel": "modeling_minirope.MiniRopeModel",
        "AutoModelForCausalLM": "modeling_minirope.MiniRopeForCausalLM",
        "AutoModelForSequenceClassification": "modeling_minirope.MiniRopeForSequenceClassification",
        "AutoModelForTokenClassification": "modeling_minirope.MiniRopeForTokenClassification",
        "AutoModelForQuestionAnswering": "modeling_minirope.MiniRopeForQuestionAnswering",
    }

    input_ids, attention_mask, position_ids = left_padded_batch(model.config.vocab_size)
    with torch.no_grad():
        want = model(input_ids, attention_mask=attention_mask).logits
    for loader in (MiniRopeForCausalLM, AutoModelForCausalLM):
        loaded = loader.from_pretrained(tmp_path).eval()
        assert type(loaded) is MiniRopeForCausalLM
        assert isinstance(AutoConfig.from_pretrained(tmp_path), MiniRopeConfig)
        # the non-persistent cos/sin cache was rebuilt after meta-device construction, not left as garbage
        rope = loaded.model.rotary_emb
        torch.testing.assert_close(rope.cos_cached, model.model.rotary_emb.cos_cached, rtol=0, atol=0)
        torch.testing.assert_close(rope.inv_freq, model.model.rotary_emb.inv_freq, rtol=0, atol=0)
        with torch.no_grad():
            got = loaded(input_ids, attention_mask=attention_mask).logits
        assert torch.equal(got, want)
