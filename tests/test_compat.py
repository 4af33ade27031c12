"""The cache keyword: minirope's forwards take `cache` (transformers 5.24's name) and `past_key_values` (5.23's),
and hand the cache to transformers, and return it, under the name the installed version declares."""

import pytest
import torch
from conftest import llama_twin, random_model, tiny_config
from transformers import DynamicCache
from transformers.modeling_outputs import BaseModelOutputWithPast

from minirope.compat_minirope import CACHE_NAME, cache_keyword, cache_of


def test_the_cache_name_is_the_one_the_installed_transformers_declares():
    assert CACHE_NAME in BaseModelOutputWithPast.__dataclass_fields__
    assert CACHE_NAME in ("cache", "past_key_values")


@pytest.mark.parametrize("keyword", ["cache", "past_key_values"])
def test_either_name_extends_the_cache_as_llama_does(keyword):
    """A prefill then one decoding step, the cache passed under either name, equal Llama's logits with its cache."""
    model = random_model(tiny_config())
    llama = llama_twin(model)
    ids = torch.randint(3, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    cache, llama_cache = DynamicCache(config=model.config), DynamicCache(config=model.config)
    with torch.no_grad():
        prefill = model(ids[:, :8], **{keyword: cache}, use_cache=True)
        step = model(ids[:, 8:], **{keyword: cache_of(prefill)}, use_cache=True)
        llama(ids[:, :8], **cache_keyword(llama_cache), use_cache=True)
        want = llama(ids[:, 8:], **cache_keyword(llama_cache), use_cache=True).logits
    assert cache_of(step) is cache and cache.get_seq_length() == 9
    torch.testing.assert_close(step.logits, want, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="not both"):
        model(ids, cache=cache, past_key_values=cache)
