"""minirope computes the same function as transformers' LlamaForCausalLM with the same weights."""

import pytest
import torch
from conftest import left_padded_batch, llama_twin, random_model, tiny_config


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_logits_match_llama_with_left_padding(layout, attn):
    model = random_model(tiny_config(layout), attn=attn)
    llama = llama_twin(model)
    input_ids, attention_mask, position_ids = left_padded_batch(model.config.vocab_size)
    with torch.no_grad():
        ours = model(input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
        theirs = llama(input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    real = attention_mask.bool()
    assert ours.shape == theirs.shape == (*input_ids.shape, model.config.vocab_size)
    assert ours.std() > 0.1  # far from a uniform distribution, so agreement means something
    assert (ours[real] - theirs[real]).abs().max() <= 1e-5


def test_loss_and_gradients_match_llama(layout):
    model = random_model(tiny_config(layout)).train()
    llama = llama_twin(model).train()
    input_ids = torch.randint(3, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(3))
    ours, theirs = model(input_ids, labels=input_ids), llama(input_ids, labels=input_ids)
    torch.testing.assert_close(ours.loss, theirs.loss, rtol=0, atol=1e-6)
    ours.loss.backward()
    theirs.loss.backward()
    llama_grads = dict(llama.named_parameters())
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, llama_grads[name].grad, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize(
    "rope_parameters",
    [
        {"rope_type": "default", "rope_theta": 500.0},
        {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
        {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
        {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32},
        {
            "rope_type": "llama3",
            "rope_theta": 10000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    ],
    ids=lambda p: p["rope_type"],
)
def test_rope_variants_match_llama_past_the_trained_length(rope_parameters):
    model = random_model(tiny_config("gqa", rope_parameters=dict(rope_parameters)))
    llama = llama_twin(model)
    for length in (20, 80, 24):  # within, well past (4x 32 would grow the cache), and back within
        input_ids = torch.randint(3, model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(4))
        with torch.no_grad():
            ours, theirs = model(input_ids).logits, llama(input_ids).logits
        assert (ours - theirs).abs().max() <= 1e-5, f"length {length}"
