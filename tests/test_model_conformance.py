"""minirope behaves as a Llama checkpoint does in the rest of the transformers ecosystem."""

import pytest
import torch
from conftest import left_padded_batch, llama_twin, random_model, tiny_config
from transformers import AutoModelForCausalLM, LlamaForCausalLM

from minirope import MiniRopeForCausalLM


def test_padded_rows_equal_each_sequence_alone(layout):
    model = random_model(tiny_config(layout))
    input_ids, attention_mask, position_ids = left_padded_batch(model.config.vocab_size)
    with torch.no_grad():
        batch = model(input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
        for row in range(input_ids.shape[0]):
            real = attention_mask[row].bool()
            alone = model(input_ids[row, real][None]).logits[0]
            assert (batch[row, real] - alone).abs().max() <= 1e-5


def test_eager_and_sdpa_agree(layout):
    eager = random_model(tiny_config(layout), attn="eager")
    sdpa = random_model(tiny_config(layout), attn="sdpa")
    input_ids, attention_mask, _ = left_padded_batch(eager.config.vocab_size)
    with torch.no_grad():
        a = eager(input_ids, attention_mask=attention_mask).logits
        b = sdpa(input_ids, attention_mask=attention_mask).logits
    real = attention_mask.bool()
    assert (a[real] - b[real]).abs().max() <= 1e-5


def test_attentions_and_hidden_states_match_llama():
    model = random_model(tiny_config("gqa"), attn="eager")
    llama = llama_twin(model)
    input_ids, attention_mask, _ = left_padded_batch(model.config.vocab_size)
    kwargs = dict(attention_mask=attention_mask, output_attentions=True, output_hidden_states=True)
    with torch.no_grad():
        ours, theirs = model(input_ids, **kwargs), llama(input_ids, **kwargs)
    batch, length = input_ids.shape
    config = model.config
    assert len(ours.attentions) == config.num_hidden_layers
    assert len(ours.hidden_states) == config.num_hidden_layers + 1
    for a, b in zip(ours.attentions, theirs.attentions, strict=True):
        assert a.shape == (batch, config.num_attention_heads, length, length)
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    for a, b in zip(ours.hidden_states, theirs.hidden_states, strict=True):
        assert a.shape == (batch, length, config.hidden_size)
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_return_dict_false_gives_tuples():
    model = random_model(tiny_config("mha"))
    input_ids = torch.randint(3, 97, (2, 5))
    with torch.no_grad():
        loss, logits, cache = model(input_ids, labels=input_ids, use_cache=True, return_dict=False)
        (hidden, _) = model.model(input_ids, use_cache=True, return_dict=False)
    assert loss.ndim == 0 and logits.shape == (2, 5, 97) and cache.get_seq_length() == 5
    assert hidden.shape == (2, 5, model.config.hidden_size)


def test_gradient_checkpointing_changes_nothing():
    model = random_model(tiny_config("gqa")).train()
    input_ids = torch.randint(3, 97, (2, 12), generator=torch.Generator().manual_seed(0))
    model(input_ids, labels=input_ids).loss.backward()
    plain = {name: param.grad.clone() for name, param in model.named_parameters()}
    loss = model(input_ids, labels=input_ids).loss.detach()
    model.zero_grad()
    model.gradient_checkpointing_enable()
    assert model.is_gradient_checkpointing
    checkpointed = model(input_ids, labels=input_ids).loss
    checkpointed.backward()
    torch.testing.assert_close(checkpointed.detach(), loss, rtol=0, atol=1e-6)
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, plain[name], rtol=0, atol=1e-6, msg=name)


def test_resize_token_embeddings():
    model = random_model(tiny_config("mha"))
    model.resize_token_embeddings(120)
    assert model.config.vocab_size == 120
    assert model.model.embed_tokens.weight.shape[0] == model.lm_head.weight.shape[0] == 120
    assert model(torch.tensor([[119, 3]])).logits.shape == (1, 2, 120)


@pytest.mark.parametrize("tied", [True, False])
def test_tied_and_untied_embeddings_save_and_load(tmp_path, tied):
    model = random_model(tiny_config("mha", tie_word_embeddings=tied))
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    model.save_pretrained(tmp_path)
    loaded = MiniRopeForCausalLM.from_pretrained(tmp_path)
    assert (loaded.lm_head.weight is loaded.model.embed_tokens.weight) == tied
    torch.testing.assert_close(loaded.lm_head.weight, model.lm_head.weight, rtol=0, atol=0)


def test_bfloat16_loading_matches_llama_in_bfloat16(tmp_path):
    model = random_model(tiny_config("gqa"))
    model.save_pretrained(tmp_path / "minirope")
    llama_twin(model).save_pretrained(tmp_path / "llama")
    bf16 = AutoModelForCausalLM.from_pretrained(tmp_path / "minirope", dtype=torch.bfloat16)
    llama_bf16 = LlamaForCausalLM.from_pretrained(tmp_path / "llama", dtype=torch.bfloat16)
    assert bf16.dtype == torch.bfloat16
    input_ids = torch.randint(3, 97, (1, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, got, llama_got = model(input_ids).logits, bf16(input_ids).logits, llama_bf16(input_ids).logits
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, rtol=0, atol=0.1)  # bf16 keeps ~3 significant digits
    torch.testing.assert_close(got, llama_got, rtol=0, atol=0.05)


def test_device_map_auto_loads_through_accelerate(tmp_path):
    """On an accelerator the oracle is Llama mapped the same way: the device's kernels round differently from the CPU's,
    and TF32 matmuls (which a Trainer run with `torch_compile` in the same process switches on) move the logits by
    ~2e-3 (H200, 2026-11-26), for both models alike."""
    model = random_model(tiny_config("gqa"))
    model.save_pretrained(tmp_path / "minirope")
    llama_twin(model).save_pretrained(tmp_path / "llama")
    mapped = AutoModelForCausalLM.from_pretrained(tmp_path / "minirope", device_map="auto")
    accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    assert mapped.device.type == (accelerator.type if accelerator else "cpu")  # where accelerate puts a small model
    input_ids = torch.randint(3, 97, (1, 10))
    with torch.no_grad():
        logits = mapped(input_ids.to(mapped.device)).logits.cpu()
        if accelerator:
            llama = LlamaForCausalLM.from_pretrained(tmp_path / "llama", device_map="auto")
            torch.testing.assert_close(logits, llama(input_ids.to(llama.device)).logits.cpu(), rtol=1e-4, atol=1e-5)
        else:
            assert torch.equal(logits, model(input_ids).logits)
