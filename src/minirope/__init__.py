"""minirope: a Hugging Face-compatible causal LM built around Rotary Position Embedding.

`import minirope` registers the model with transformers' Auto classes, so that
`AutoConfig`, `AutoModel` and `AutoModelForCausalLM` resolve `model_type="minirope"`, and marks the
classes for `save_pretrained` to write `auto_map` and ship the two model files as remote code.
"""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from .configuration_minirope import MiniRopeConfig
from .modeling_minirope import (
    MiniRopeForCausalLM,
    MiniRopeModel,
    MiniRopePreTrainedModel,
    MiniRopeRotaryEmbedding,
    apply_rotary_pos_emb,
    rotate_half,
)

AutoConfig.register(MiniRopeConfig.model_type, MiniRopeConfig, exist_ok=True)
AutoModel.register(MiniRopeConfig, MiniRopeModel, exist_ok=True)
AutoModelForCausalLM.register(MiniRopeConfig, MiniRopeForCausalLM, exist_ok=True)
MiniRopeConfig.register_for_auto_class()
MiniRopeModel.register_for_auto_class("AutoModel")
MiniRopeForCausalLM.register_for_auto_class("AutoModelForCausalLM")

__version__ = "0.1.0"
__all__ = [
    "MiniRopeConfig",
    "MiniRopeForCausalLM",
    "MiniRopeModel",
    "MiniRopePreTrainedModel",
    "MiniRopeRotaryEmbedding",
    "apply_rotary_pos_emb",
    "rotate_half",
]
