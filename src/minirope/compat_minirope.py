"""The one place where minirope's model files meet a rename in transformers: the KV cache's keyword (and with it,
who writes a continuous-batching cache).

transformers 5.24 renamed the cache argument and output field `past_key_values` to `cache` (model forwards,
`create_causal_mask`, `BaseModelOutputWithPast`, `generate()`'s calls); 5.23 uses `past_key_values`. A saved
folder's model files run as remote code under whatever transformers its user has, so they name the cache `cache`
(the current name) and translate here, feature-detected from transformers itself (the field its output class
declares), never from a version string.

Shipped with `modeling_minirope.py` as remote code: imports only torch and transformers.
"""

from collections.abc import Callable

import torch
from transformers.cache_utils import Cache
from transformers.modeling_outputs import BaseModelOutputWithPast
from transformers.utils.deprecation import deprecate_kwarg

# The keyword transformers' own functions and output classes take for the cache: "cache" (5.24 and later) or
# "past_key_values" (5.23).
CACHE_NAME = "cache" if "cache" in BaseModelOutputWithPast.__dataclass_fields__ else "past_key_values"
# The release in which Llama's forwards stop taking `past_key_values` (their `deprecate_kwarg`, transformers 5.24).
PAST_KEY_VALUES_REMOVED_IN = "5.40.0"


def old_cache_name(forward: Callable) -> Callable:
    """Decorate a forward that takes `cache` as Llama's forwards are: where transformers names the cache `cache`
    (5.24 and later), transformers' own `deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")` (a
    `FutureWarning` naming the class, then the cache passed on as `cache`; given both names, `cache` wins with a
    warning); on 5.23, whose `generate()` passes `past_key_values` at every step, the forward unchanged and silent.
    """
    if CACHE_NAME == "cache":
        return deprecate_kwarg("past_key_values", PAST_KEY_VALUES_REMOVED_IN, new_name="cache")(forward)
    return forward


def cache_argument(cache: Cache | None, kwargs: dict) -> Cache | None:
    """The cache a caller passed, as `cache` or as `past_key_values` (the name transformers 5.23's `generate()` and
    older user code use; on 5.24 and later `old_cache_name` has already renamed it); the old name is removed from
    `kwargs` so it travels no further.

    Raises:
        ValueError: both names given.
    """
    legacy = kwargs.pop("past_key_values", None)
    if legacy is None:
        return cache
    if cache is not None:
        raise ValueError("Pass the KV cache once: as `cache` (or `past_key_values`, its older name), not both.")
    return legacy


def cache_keyword(cache: Cache | None) -> dict:
    """`{CACHE_NAME: cache}`: the cache as a keyword for a transformers function or output class of this version."""
    return {CACHE_NAME: cache}


def update_cache(
    cache: Cache | object, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, kwargs: dict
) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """A layer's new keys and values `(B, H_kv, T, d)` written into `cache`, as Llama's attention writes them: the keys
    and values to attend over, and the keyword arguments for the attention function.

    A `Cache` (`DynamicCache`, `StaticCache`, ...) is updated and returns the whole `(B, H_kv, S, d)`. A
    `PagedAttentionCache` (transformers' continuous batching: `generate_batch`, `transformers serve`, TRL's
    `use_transformers_continuous_batching`) is not a `Cache`: where transformers names the cache `cache` (5.24 and
    later) its `update` also fills the paged kernel's arguments into `kwargs`; on 5.23 the paged attention function
    writes it itself, from its `cache` keyword.
    """
    if isinstance(cache, Cache):
        return *cache.update(key_states, value_states, layer_idx), kwargs
    if CACHE_NAME == "cache":
        return *cache.update(key_states, value_states, layer_idx, kwargs=kwargs), kwargs
    return key_states, value_states, {**kwargs, "cache": cache}


def cache_of(output: BaseModelOutputWithPast) -> Cache | None:
    """The cache an output of this transformers version carries (its `cache` or `past_key_values` field)."""
    return getattr(output, CACHE_NAME)
