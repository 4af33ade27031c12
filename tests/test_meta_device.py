"""The forward reads no tensor value on the host: it runs on the `meta` device, as transformers' Llama's does.

On an accelerator, a host read of a tensor value (e.g. `int(position_ids.max())` to size the cos/sin tables) is a
device-to-host synchronisation at every forward, which stops the CPU from queueing kernels ahead. On the meta device
any such read raises, so running there proves there is none.
"""

import pytest
import torch
from conftest import tiny_config
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, StaticCache

from minirope import MiniRopeForCausalLM
from minirope.compat_minirope import cache_keyword, cache_of
from minirope.convert import SHARED_FIELDS


def forwards_on_meta(model, config) -> None:
    """A prefill longer than `max_position_embeddings` (32) into a DynamicCache, a decode step, a training loss, and
    a StaticCache prefill, all on the meta device."""
    ids = torch.zeros((2, 40), dtype=torch.long, device="meta")
    prefill = model(input_ids=ids, **cache_keyword(DynamicCache(config=config)), use_cache=True)
    assert prefill.logits.shape == (2, 40, config.vocab_size)
    step = model(input_ids=ids[:, :1], **cache_keyword(cache_of(prefill)), use_cache=True)
    assert step.logits.shape == (2, 1, config.vocab_size)
    assert model(input_ids=ids, labels=ids).loss.shape == ()
    model(input_ids=ids[:, :8], **cache_keyword(StaticCache(config=config, max_cache_len=16)), use_cache=True)


@pytest.mark.parametrize("family", ["llama", "minirope"])
def test_the_forward_runs_on_the_meta_device(family):
    config = tiny_config()
    with torch.device("meta"):
        if family == "llama":  # the oracle: the same calls run for transformers' Llama
            fields = {name: getattr(config, name) for name in SHARED_FIELDS}
            config = LlamaConfig(**fields, rope_parameters=dict(config.rope_parameters))
            model = LlamaForCausalLM(config)
        else:
            model = MiniRopeForCausalLM(config)
    forwards_on_meta(model, config)
    if family == "minirope":
        assert model.model.rotary_emb.cached_positions >= 41  # grown from the lengths known on the host
        ids = torch.zeros((2, 8), dtype=torch.long, device="meta")
        assert model(input_ids=ids, labels=ids, skip_logits=True).loss.shape == ()  # the Trainer's fused loss
