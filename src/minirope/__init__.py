"""minirope: a Hugging Face-compatible causal LM built around Rotary Position Embedding.

`import minirope` registers the model with transformers' Auto classes, so that `AutoConfig`, `AutoModel`,
`AutoModelForCausalLM` and the task heads' classes (`AutoModelForSequenceClassification`,
`AutoModelForTokenClassification`, `AutoModelForQuestionAnswering`) resolve `model_type="minirope"`, and
marks the classes for `save_pretrained` to write `auto_map` and ship the model files as remote code.
"""

from . import startup_noise  # noqa: F401  (first: importing the model below imports torchao)

# isort: split
import transformers

from . import modeling_minirope
from .configuration_minirope import MiniRopeConfig
from .loading_minirope import AUTO_CLASSES
from .modeling_minirope import (
    MiniRopeForCausalLM,
    MiniRopeForQuestionAnswering,
    MiniRopeForSequenceClassification,
    MiniRopeForTokenClassification,
    MiniRopeModel,
    MiniRopePreTrainedModel,
)
from .rotary_minirope import MiniRopeRotaryEmbedding, apply_rotary_pos_emb, rotate_half

transformers.AutoConfig.register(MiniRopeConfig.model_type, MiniRopeConfig, exist_ok=True)
MiniRopeConfig.register_for_auto_class()
for auto_name, class_name in AUTO_CLASSES.items():
    model_class = getattr(modeling_minirope, class_name)
    getattr(transformers, auto_name).register(MiniRopeConfig, model_class, exist_ok=True)
    model_class.register_for_auto_class(auto_name)

__version__ = "0.1.0"
__all__ = [
    "MiniRopeConfig",
    "MiniRopeForCausalLM",
    "MiniRopeForQuestionAnswering",
    "MiniRopeForSequenceClassification",
    "MiniRopeForTokenClassification",
    "MiniRopeModel",
    "MiniRopePreTrainedModel",
    "MiniRopeRotaryEmbedding",
    "apply_rotary_pos_emb",
    "rotate_half",
]
