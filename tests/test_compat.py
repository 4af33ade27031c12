"""The cache keyword: minirope's forwards take `cache` (transformers 5.24's name) and `past_key_values` (5.23's),
and hand the cache to transformers, and return it, under the name the installed version declares."""

import warnings

import pytest
import torch
from conftest import llama_twin, random_model, tiny_config
from transformers import DynamicCache
from transformers.modeling_outputs import BaseModelOutputWithPast

from minirope.compat_minirope import CACHE_NAME, cache_keyword, cache_of
from minirope.modeling_minirope import MiniRopeForCausalLM, MiniRopeModel


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
    if CACHE_NAME == "past_key_values":  # 5.23: the old name is the current one; both at once is refused
        with pytest.raises(ValueError, match="not both"):
            model(ids, cache=cache, past_key_values=cache)


def llama_classes(model) -> dict:
    twin = llama_twin(model)
    return {MiniRopeForCausalLM: (model, twin), MiniRopeModel: (model.model, twin.model)}


@pytest.mark.parametrize("head", [MiniRopeForCausalLM, MiniRopeModel])
def test_past_key_values_is_deprecated_exactly_where_and_as_llama_deprecates_it(head):
    """On a transformers that names the cache `cache` (5.24+), `past_key_values=` warns as Llama's forward warns
    (transformers' `deprecate_kwarg`: the same message but the class name) and gives the logits of `cache=`; on
    5.23, whose `generate()` passes `past_key_values` at every step, neither model warns."""
    ours, llama = llama_classes(random_model(tiny_config()))[head]
    ids = torch.randint(3, ours.config.vocab_size, (1, 6), generator=torch.Generator().manual_seed(1))

    def call(module, keyword: str):
        cache = DynamicCache(config=ours.config)
        with warnings.catch_warnings(record=True) as caught, torch.no_grad():
            warnings.simplefilter("always")
            module(ids[:, :5], **{keyword: cache}, use_cache=True)
            output = module(ids[:, 5:], **{keyword: cache}, use_cache=True)
        messages = [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]
        return output, messages

    new, new_warnings = call(ours, "cache" if CACHE_NAME == "cache" else "past_key_values")
    old, ours_warned = call(ours, "past_key_values")
    _, llama_warned = call(llama, "past_key_values")
    assert new_warnings == []
    field = "logits" if head is MiniRopeForCausalLM else "last_hidden_state"
    torch.testing.assert_close(getattr(old, field), getattr(new, field), rtol=0, atol=0)
    rename = {type(llama).__name__: type(ours).__name__}
    assert [m.replace(*next(iter(rename.items()))) for m in llama_warned] == ours_warned
    assert len(ours_warned) == (2 if CACHE_NAME == "cache" else 0)
    if CACHE_NAME == "cache":
        assert "`past_key_values` is deprecated" in ours_warned[0] and "5.40.0" in ours_warned[0]
        assert f"{type(ours).__name__}.forward" in ours_warned[0]
