"""Interoperability with Llama checkpoints.

`MiniRopeForCausalLM` and transformers' `LlamaForCausalLM` share module names, parameter names and math,
so conversion is a config translation plus a strict state-dict copy. A plain Llama folder written by
`to_llama(model, save_directory=...)` loads with transformers alone, no remote code; `minirope-export`
(`minirope.export`) adds the tokenizer and a model card, and writes GGUF (llama.cpp) and ONNX.

RoPE layouts: transformers (and minirope) rotate the pairs `(x_i, x_{i+d/2})` (`rotate_half`); Meta's
original Llama code and the complex-number form (`torch.polar`, `view_as_complex`) rotate interleaved
pairs `(x_{2i}, x_{2i+1})`. The two are the same rotation after a fixed permutation of each head's
dims, applied to the output rows of `q_proj` and `k_proj` (`interleaved_to_half_split` and its inverse
`half_split_to_interleaved`); this is what transformers' `convert_llama_weights_to_hf.py` does.
"""

from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from minirope.configuration_minirope import MiniRopeConfig
from minirope.modeling_minirope import MiniRopeForCausalLM

# Every field a minirope config declares means the same in a LlamaConfig; RoPE's dict is copied apart.
SHARED_FIELDS = tuple(name for name in MiniRopeConfig.__annotations__ if name != "rope_parameters")


def _copy_config(source, target_class):
    fields = {name: getattr(source, name) for name in SHARED_FIELDS}
    config = target_class(**fields, rope_parameters=dict(source.rope_parameters))
    config._attn_implementation = source._attn_implementation
    return config


def to_llama(model: MiniRopeForCausalLM, save_directory: str | Path | None = None) -> LlamaForCausalLM:
    """The same model as a `transformers.LlamaForCausalLM` (same weights, same logits).

    Args:
        model: a minirope model.
        save_directory: if given, also write a plain Llama checkpoint folder there (`model_type: llama`,
            safetensors, no remote code).

    Raises:
        RuntimeError: a parameter of one model has no counterpart in the other (strict loading).
    """
    config = _copy_config(model.config, LlamaConfig)
    llama = LlamaForCausalLM(config).to(dtype=model.dtype).eval()
    llama.load_state_dict(model.state_dict(), strict=True)
    llama.generation_config = model.generation_config
    if save_directory is not None:
        llama.save_pretrained(save_directory)
    return llama


def from_llama(model_or_path: LlamaForCausalLM | str | Path, **from_pretrained_kwargs) -> MiniRopeForCausalLM:
    """A minirope model from a `LlamaForCausalLM` or a Llama checkpoint folder / Hub id (same logits).

    Raises:
        ValueError: the Llama model uses a feature minirope does not have (e.g. `pretraining_tp > 1`).
    """
    llama = model_or_path
    if not isinstance(llama, LlamaForCausalLM):
        llama = LlamaForCausalLM.from_pretrained(model_or_path, **from_pretrained_kwargs)
    if getattr(llama.config, "pretraining_tp", 1) not in (None, 1):
        raise ValueError("pretraining_tp > 1 is not supported: set config.pretraining_tp = 1 (same math).")
    config = _copy_config(llama.config, MiniRopeConfig)
    model = MiniRopeForCausalLM(config).to(dtype=llama.dtype).eval()
    model.load_state_dict(llama.state_dict(), strict=True)
    model.generation_config = llama.generation_config
    return model


def interleaved_to_half_split(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Permute the output rows of a `q_proj`/`k_proj` weight from the interleaved RoPE layout to `rotate_half`'s.

    Within each head of size d, row `2i` (first of pair i) moves to `i` and row `2i+1` to `i + d/2`.

    Args:
        weight: `(num_heads * d, in_features)` (or a bias `(num_heads * d,)`).
        num_heads: heads in this projection (`num_attention_heads` for q, `num_key_value_heads` for k).

    Returns:
        The permuted tensor, same shape.
    """
    rows, rest = weight.shape[0], weight.shape[1:]
    d = rows // num_heads
    return weight.reshape(num_heads, d // 2, 2, *rest).transpose(1, 2).reshape(rows, *rest)


def half_split_to_interleaved(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """The inverse of `interleaved_to_half_split`: rows `i` and `i + d/2` of each head become `2i` and `2i+1`."""
    rows, rest = weight.shape[0], weight.shape[1:]
    d = rows // num_heads
    return weight.reshape(num_heads, 2, d // 2, *rest).transpose(1, 2).reshape(rows, *rest)
