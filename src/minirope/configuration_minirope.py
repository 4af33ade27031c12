"""Configuration of a minirope model: a Llama-architecture decoder whose positions come from RoPE.

Field names and meanings are those of `transformers.LlamaConfig`, so a config moves between the two by
copying fields (see `minirope.convert`). The defaults describe the model that `minirope-pretrain` trains
when run with no arguments (1.15M parameters with its 4096-token vocabulary: 3 layers, hidden 96, 2 heads of 48,
chosen by measurement on a 2-core CPU; see docs/studies/recipe.md).

This file is shipped next to `modeling_minirope.py` as remote code by `save_pretrained`: it imports
nothing from the rest of the package.
"""

import logging

from transformers import PreTrainedConfig
from transformers.activations import ACT2FN
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

ROPE_TYPES = ("default", *ROPE_INIT_FUNCTIONS)
DEFAULT_ROPE = {"rope_type": "default", "rope_theta": 10000.0}


class MiniRopeConfig(PreTrainedConfig):
    r"""Configuration for [`MiniRopeModel`] and [`MiniRopeForCausalLM`].

    Args:
        vocab_size (`int`): number of token ids the embedding and the LM head cover.
        hidden_size (`int`): width of the residual stream, d_model.
        intermediate_size (`int`): width of the SwiGLU MLP's hidden layer.
        num_hidden_layers (`int`): number of decoder layers.
        num_attention_heads (`int`): query heads per layer.
        num_key_value_heads (`int`, *optional*): key/value heads per layer (grouped-query attention,
            Ainslie et al. 2023). `None` means `num_attention_heads` (multi-head attention).
        head_dim (`int`, *optional*): size d of one head, the dimension RoPE rotates in pairs, so it must be
            even. `None` means `hidden_size // num_attention_heads`.
        hidden_act (`str`): activation of the gated MLP (`"silu"` gives SwiGLU).
        max_position_embeddings (`int`): the context length the model is trained for; also the initial
            length of the cos/sin cache (it grows on demand past it) and the "original length" that the
            scaled RoPE variants stretch.
        initializer_range (`float`): standard deviation of the normal init of linear and embedding weights.
        rms_norm_eps (`float`): epsilon added to the mean square in RMSNorm.
        use_cache (`bool`): whether `forward` returns a KV cache by default.
        pad_token_id, bos_token_id, eos_token_id (`int`, *optional*): special token ids.
        tie_word_embeddings (`bool`): share `lm_head.weight` with `model.embed_tokens.weight`.
        rope_parameters (`dict`, *optional*): RoPE settings, `{"rope_type": "default", "rope_theta": 10000.0}`
            when `None`. `rope_theta` is the base b of theta_i = b^(-2i/d) (RoFormer eq. 15); `rope_type` is
            `"default"` or any key of `transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS` (`linear`,
            `dynamic`, `yarn`, `longrope`, `llama3`, ...), with that type's extra keys (`factor`, ...).
        attention_bias (`bool`): bias in `q_proj`, `k_proj`, `v_proj`, `o_proj`.
        attention_dropout (`float`): dropout on attention probabilities during training.
        mlp_bias (`bool`): bias in `gate_proj`, `up_proj`, `down_proj`.

    Raises:
        ValueError: for any value the model cannot be built from; the message names the field and the fix.
    """

    model_type = "minirope"
    keys_to_ignore_at_inference = ["cache", "past_key_values"]
    base_model_tp_plan = {
        "layers.*.self_attn.q_proj": "colwise",
        "layers.*.self_attn.k_proj": "colwise",
        "layers.*.self_attn.v_proj": "colwise",
        "layers.*.self_attn.o_proj": "rowwise",
        "layers.*.mlp.gate_proj": "colwise",
        "layers.*.mlp.up_proj": "colwise",
        "layers.*.mlp.down_proj": "rowwise",
    }
    base_model_pp_plan = {
        "embed_tokens": (["input_ids"], ["inputs_embeds"]),
        "layers": (["hidden_states", "attention_mask"], ["hidden_states"]),
        "norm": (["hidden_states"], ["hidden_states"]),
    }

    vocab_size: int = 4096
    hidden_size: int = 96
    intermediate_size: int = 288
    num_hidden_layers: int = 3
    num_attention_heads: int = 2
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    hidden_act: str = "silu"
    max_position_embeddings: int = 256
    initializer_range: float = 0.02
    rms_norm_eps: float = 1e-6
    use_cache: bool = True
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    tie_word_embeddings: bool = False
    rope_parameters: dict | None = None
    attention_bias: bool = False
    attention_dropout: float = 0.0
    mlp_bias: bool = False

    def __post_init__(self, **kwargs):
        if self.rope_parameters is not None and not isinstance(self.rope_parameters, dict):
            raise ValueError(f"rope_parameters must be a dict, got {self.rope_parameters!r}: e.g. {DEFAULT_ROPE}.")
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None:
            self._check_positive("hidden_size", "num_attention_heads")
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(
                    f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                    f"({self.num_attention_heads}) when head_dim is not set: change one of them, "
                    f"or set head_dim explicitly."
                )
            self.head_dim = self.hidden_size // self.num_attention_heads
        super().__post_init__(**kwargs)
        self._check_architecture()

    def _check_positive(self, *names: str) -> None:
        for name in names:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}: set {name} to an int >= 1.")

    def _check_architecture(self) -> None:
        self._check_positive(
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "max_position_embeddings",
        )
        if self.head_dim % 2:
            raise ValueError(
                f"head_dim must be even because RoPE rotates pairs of dimensions, got {self.head_dim}: "
                f"choose an even head_dim (or hidden_size / num_attention_heads)."
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be divisible by num_key_value_heads "
                f"({self.num_key_value_heads}) for grouped-query attention: pick a divisor of "
                f"num_attention_heads."
            )
        if not 0.0 <= self.attention_dropout < 1.0:
            raise ValueError(f"attention_dropout must be in [0, 1), got {self.attention_dropout!r}.")
        if not self.rms_norm_eps > 0:
            raise ValueError(f"rms_norm_eps must be > 0, got {self.rms_norm_eps!r}.")
        if self.hidden_act not in ACT2FN:
            raise ValueError(
                f"hidden_act {self.hidden_act!r} is not an activation transformers knows: use 'silu' (SwiGLU, as "
                f"Llama) or another key of transformers.activations.ACT2FN."
            )
        self._check_rope()

    def _check_rope(self) -> None:
        """`rope_parameters` as transformers' RoPE validation reads it, with its complaints raised, not logged.

        Raises:
            ValueError: an unknown type, a missing key of the type, or a value of the wrong type or range.
        """
        rope = self.rope_parameters
        rope_type = rope.get("rope_type")
        if rope_type not in ROPE_TYPES:
            raise ValueError(
                f"rope_parameters['rope_type'] = {rope_type!r} is unknown: use one of {', '.join(ROPE_TYPES)}."
            )
        theta = rope.get("rope_theta")
        if isinstance(theta, bool) or not isinstance(theta, int | float) or not theta > 0:
            raise ValueError(f"rope_parameters['rope_theta'] must be a number > 0, got {theta!r}: e.g. 10000.0.")
        if rope.get("partial_rotary_factor", 1.0) != 1.0:
            raise ValueError(
                "rope_parameters['partial_rotary_factor'] is not supported: minirope rotates the whole head "
                "(as Llama does); remove the key."
            )
        complaints = _Complaints()
        logger = logging.getLogger("transformers.modeling_rope_utils")
        level = logger.level
        logger.addHandler(complaints)
        logger.setLevel(logging.WARNING)
        logger.propagate = False  # raised below, not printed
        try:
            self.validate_rope()
        except (KeyError, TypeError) as error:  # a missing key, or a value that does not compare
            raise ValueError(
                f"rope_parameters {rope} is invalid for rope_type {rope_type!r} ({error}): give every key the type "
                f"needs, as numbers (see transformers' modeling_rope_utils)."
            ) from None
        finally:
            logger.removeHandler(complaints)
            logger.setLevel(level)
            logger.propagate = True
        if complaints.errors:
            complaint = complaints.errors[0].replace("`", "")
            raise ValueError(f"rope_parameters {rope} is invalid: {complaint}: fix that value.")


class _Complaints(logging.Handler):
    """Collects what transformers' RoPE validation logs about a value that must be otherwise."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.errors: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        # not an invalid value: Llama 3 checkpoints are often saved with their original context as the maximum
        consistency = "must be less than max_position_embeddings" in message
        if ("must be" in message or "Missing required" in message) and not consistency:
            self.errors.append(message)


# The fields that define the network (its weights' shapes and what it computes), in declaration order: a folder
# whose config differs in one of them holds another model.
ARCHITECTURE_FIELDS = tuple(
    name
    for name in MiniRopeConfig.__annotations__
    if name not in ("initializer_range", "use_cache", "attention_dropout") and not name.endswith("token_id")
)

__all__ = ["MiniRopeConfig"]
