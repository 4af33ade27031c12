"""minirope: a Llama-architecture causal LM with Rotary Position Embedding.

RoPE follows RoFormer (Su et al. 2021, arXiv:2104.09864) in the layout of transformers'
`LlamaRotaryEmbedding`: a cos/sin cache of shape `(cached_positions, head_dim)` gathered by
`position_ids`, and `rotate_half`. The rest of the network is Llama's (pre-norm RMSNorm,
grouped-query attention, SwiGLU MLP) with the same module and parameter names, so a state dict moves
between `MiniRopeForCausalLM` and `transformers.LlamaForCausalLM` unchanged.

Shapes use: B batch, T query length, S key length (cache + T), H query heads, K key/value heads,
d head_dim, D hidden_size, V vocab_size.

This file reads like the paper: RoPE itself is in `rotary_minirope.py`, the fused loss and Llama's shared eager
attention (`repeat_kv`, `eager_attention_forward`) in `kernels_minirope.py`,
the loading rules in `loading_minirope.py`, the cache keyword of the installed transformers (`cache`, formerly
`past_key_values`) in `compat_minirope.py`. Its matmuls are `nn.Linear`'s, exactly Llama's. It imports only torch,
transformers and those files, so that `save_pretrained` ships all of them as remote code.
"""

from collections.abc import Callable

import torch
from torch import nn
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache
from transformers.generation import GenerationMixin
from transformers.masking_utils import create_causal_mask
from transformers.modeling_layers import (
    GenericForQuestionAnswering,
    GenericForSequenceClassification,
    GenericForTokenClassification,
    GradientCheckpointingLayer,
)
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel, slice_logits_to_keep
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs
from transformers.utils.generic import can_return_tuple, merge_with_config_defaults
from transformers.utils.output_capturing import capture_outputs

from .compat_minirope import cache_argument, cache_keyword, cache_of, old_cache_name, update_cache
from .configuration_minirope import MiniRopeConfig
from .kernels_minirope import eager_attention_forward, embed_token_ids, fused_causal_lm_loss
from .loading_minirope import MiniRopeLoadingMixin
from .rotary_minirope import MiniRopeRotaryEmbedding, apply_rotary_pos_emb


class MiniRopeRMSNorm(nn.Module):
    """Root-mean-square layer norm (Zhang & Sennrich 2019): `x / sqrt(mean(x^2) + eps) * weight`.

    Normalised in float32, cast back to the input dtype, then scaled by `weight`: the rounding steps of
    `LlamaRMSNorm`, in one call (`torch.nn.functional.rms_norm`: a fused kernel on CUDA; on CPU torch decomposes it
    into Llama's elementwise steps) which also scales when input and weight are float32 (the same rounding; three
    fewer operations per call, ~1 % of a decoding step of the default model). Input and output: `(..., D)`.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if hidden_states.dtype == self.weight.dtype == torch.float32:
            return nn.functional.rms_norm(hidden_states, self.weight.shape, self.weight, self.variance_epsilon)
        normalized = nn.functional.rms_norm(hidden_states.float(), self.weight.shape, eps=self.variance_epsilon)
        return self.weight * normalized.to(hidden_states.dtype)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}"


class MiniRopeAttention(nn.Module):
    """Causal grouped-query self-attention with RoPE on queries and keys.

    The kernel comes from transformers' attention interface (`config._attn_implementation`: `eager`,
    `sdpa`, `flash_attention_2`, `flex_attention`, ...); new keys/values go through `Cache.update`.
    """

    def __init__(self, config: MiniRopeConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.num_key_value_groups = config.num_attention_heads // config.num_key_value_heads
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        self.is_causal = True
        q_out, kv_out = config.num_attention_heads * self.head_dim, config.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_out, bias=config.attention_bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_out, bias=config.attention_bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_out, bias=config.attention_bias)
        self.o_proj = nn.Linear(q_out, config.hidden_size, bias=config.attention_bias)

    @old_cache_name
    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`(B, T, D)` -> `((B, T, D), attention weights (B, H, T, S) or None)`."""
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)

        query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        key_states = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)

        cos, sin = position_embeddings
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)

        if cache is not None:
            key_states, value_states, kwargs = update_cache(cache, key_states, value_states, self.layer_idx, kwargs)

        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        attn_output, attn_weights = attention_interface(
            self,
            query_states,
            key_states,
            value_states,
            attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout,
            scaling=self.scaling,
            **kwargs,
        )
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        return self.o_proj(attn_output), attn_weights


class MiniRopeMLP(nn.Module):
    """SwiGLU feed-forward (Shazeer 2020): `down_proj(silu(gate_proj(x)) * up_proj(x))`, `(..., D)` -> `(..., D)`."""

    def __init__(self, config: MiniRopeConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class MiniRopeDecoderLayer(GradientCheckpointingLayer):
    """Pre-norm block: `x + attn(norm(x))`, then `x + mlp(norm(x))`. `(B, T, D)` -> `(B, T, D)`."""

    def __init__(self, config: MiniRopeConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = MiniRopeAttention(config=config, layer_idx=layer_idx)
        self.mlp = MiniRopeMLP(config)
        self.input_layernorm = MiniRopeRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = MiniRopeRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    @old_cache_name
    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> torch.Tensor:
        residual = hidden_states
        hidden_states, _ = self.self_attn(
            self.input_layernorm(hidden_states),
            position_embeddings=position_embeddings,
            attention_mask=attention_mask,
            cache=cache,
            **kwargs,
        )
        hidden_states = residual + hidden_states
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class MiniRopePreTrainedModel(MiniRopeLoadingMixin, PreTrainedModel):
    """Weight init, attention backends and loading conventions (`MiniRopeLoadingMixin`) of the minirope models."""

    config: MiniRopeConfig
    config_class = MiniRopeConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["MiniRopeDecoderLayer"]
    _skip_keys_device_placement = ["cache", "past_key_values"]
    _supports_flash_attn = True
    _supports_sdpa = True
    _supports_flex_attn = True
    _can_compile_fullgraph = True
    _supports_attention_backend = True
    _can_record_outputs = {
        "hidden_states": MiniRopeDecoderLayer,
        "attentions": MiniRopeAttention,
    }

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        # transformers resets `inv_freq`/`original_inv_freq` of any "*RotaryEmbedding" module;
        # the cos/sin tables derived from them are rebuilt here.
        super()._init_weights(module)
        if isinstance(module, MiniRopeRotaryEmbedding):
            module.max_seq_len_cached = module.original_max_seq_len
            module.reset_cache()


class MiniRopeModel(MiniRopePreTrainedModel):
    """The decoder stack: token embedding, `num_hidden_layers` decoder layers, final RMSNorm."""

    def __init__(self, config: MiniRopeConfig) -> None:
        super().__init__(config)
        self.padding_idx = config.pad_token_id
        self.vocab_size = config.vocab_size
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, self.padding_idx)
        self.layers = nn.ModuleList(
            [MiniRopeDecoderLayer(config, layer_idx) for layer_idx in range(config.num_hidden_layers)]
        )
        self.norm = MiniRopeRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = MiniRopeRotaryEmbedding(config=config)
        self.gradient_checkpointing = False
        self.post_init()

    @old_cache_name
    @merge_with_config_defaults
    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        use_cache: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutputWithPast:
        """Run the decoder.

        Args:
            input_ids: `(B, T)` int64 token ids in `[0, V)`; or give `inputs_embeds` `(B, T, D)` instead.
            attention_mask: `(B, S)` with 1 for real tokens and 0 for padding (left padding supported), or
                a prepared 4D mask; `None` means all tokens are real.
            position_ids: `(B, T)` int64 positions m used for RoPE; default `past_len .. past_len + T - 1`.
                With left padding, `generate()` passes `cumsum(attention_mask) - 1`, so each sequence starts
                at position 0 whatever its padding.
            cache: a transformers `Cache` (`DynamicCache`, `StaticCache`, ...) to read and extend, or continuous
                batching's `PagedAttentionCache` (with `position_ids`). Also taken as `past_key_values`, its name
                before transformers 5.24 (which `generate()` of 5.23 passes).
            use_cache: create and return a `DynamicCache` when none is given.

        Returns:
            `BaseModelOutputWithPast` with `last_hidden_state` `(B, T, D)` and the cache, in the field the installed
            transformers declares (`cache`; `past_key_values` before 5.24).

        Raises:
            ValueError: if both or neither of `input_ids` and `inputs_embeds` are given, both `cache` and
                `past_key_values`, or (CPU tensors) an id is outside `[0, vocab_size)`.
        """
        cache = cache_argument(cache, kwargs)
        if (input_ids is None) ^ (inputs_embeds is not None):
            raise ValueError("Pass exactly one of input_ids or inputs_embeds.")
        if inputs_embeds is None:
            inputs_embeds = embed_token_ids(self.embed_tokens, input_ids, self.config.vocab_size)
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        past_seen_tokens = cache.get_seq_length() if isinstance(cache, Cache) else 0
        if position_ids is None:  # past_len .. past_len + T - 1, one row for the batch
            position_ids = torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device)[None] + past_seen_tokens
        if not torch.compiler.is_compiling():  # known on the host (no device read), but for continuous batching's cache
            paged = cache is not None and not isinstance(cache, Cache)
            self.rotary_emb.grow(int(position_ids.max()) + 1 if paged else past_seen_tokens + inputs_embeds.shape[1])

        causal_mask = create_causal_mask(
            config=self.config,
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            position_ids=position_ids,
            **cache_keyword(cache),
        )
        hidden_states = inputs_embeds
        position_embeddings = self.rotary_emb(hidden_states, position_ids=position_ids)
        for decoder_layer in self.layers[: self.config.num_hidden_layers]:
            hidden_states = decoder_layer(
                hidden_states, position_embeddings, causal_mask, position_ids=position_ids, cache=cache, **kwargs
            )
        return BaseModelOutputWithPast(last_hidden_state=self.norm(hidden_states), **cache_keyword(cache))


class MiniRopeForCausalLM(MiniRopePreTrainedModel, GenerationMixin):
    """`MiniRopeModel` with a linear LM head; the model `AutoModelForCausalLM` builds for `minirope`."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}
    _pp_plan = {"lm_head": (["hidden_states"], ["logits"])}

    def __init__(self, config: MiniRopeConfig) -> None:
        super().__init__(config)
        self.model = MiniRopeModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    @old_cache_name
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        skip_logits: bool = False,
        **kwargs: Unpack[TransformersKwargs],
    ) -> CausalLMOutputWithPast:
        """Next-token logits, and the language-modelling loss when `labels` are given.

        Args:
            input_ids, attention_mask, position_ids, cache (or `past_key_values`), inputs_embeds, use_cache: as in
                `MiniRopeModel.forward`.
            labels: `(B, T)` int64 targets aligned with `input_ids` (shifted inside the loss); -100 is ignored.
            logits_to_keep: compute logits only for the last N positions (0 = all), or for given indices.
            skip_logits: with `labels`, return only the loss (`logits=None`) and compute it chunk by chunk
                (`LinearCrossEntropy`): the same loss and gradients without the `(B, T, V)` float32 logits in
                memory. `MiniRopeTrainer` sets it for training steps (transformers' Trainer passes the same
                flag with `--use_liger_kernel`).

        Returns:
            `CausalLMOutputWithPast` with `logits` `(B, T', V)` (float, model dtype; None with `skip_logits`)
            and `loss`, a scalar mean cross-entropy in nats per predicted token.

        Raises:
            ValueError: `skip_logits=True` without `labels`; both `cache` and `past_key_values`.
        """
        cache = cache_argument(cache, kwargs)
        if skip_logits and labels is None:
            raise ValueError("skip_logits=True returns only the loss: pass labels, or drop skip_logits.")
        outputs: BaseModelOutputWithPast = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        loss = fused_causal_lm_loss(self.lm_head, outputs.last_hidden_state, labels, **kwargs) if skip_logits else None
        logits = None
        if loss is None:  # without skip_logits, or where the head cannot be fused: the logits, then the loss
            logits = self.lm_head(slice_logits_to_keep(outputs.last_hidden_state, logits_to_keep))
            if labels is not None:
                loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        return CausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            **cache_keyword(cache_of(outputs)),
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )


# Task heads: the forward passes, outputs and losses of transformers' generic heads, the ones Llama's own heads
# use, so weights and outputs match `LlamaFor{SequenceClassification,TokenClassification,QuestionAnswering}`.
# Each builds its decoder as `MiniRopeModel(config)`: the generic `AutoModel.from_config(config)` cannot resolve
# a config class loaded as remote code.


class MiniRopeForSequenceClassification(GenericForSequenceClassification, MiniRopePreTrainedModel):
    """A bias-free linear `score` head `(D -> num_labels)` read at each sequence's last non-pad token.

    `logits` `(B, num_labels)`; `loss` by `config.problem_type` (regression, single- or multi-label
    classification). The last non-pad token is found from `config.pad_token_id` (left or right padding);
    without a pad id, batches must hold one sequence.
    """

    def __init__(self, config: MiniRopeConfig) -> None:
        MiniRopePreTrainedModel.__init__(self, config)
        self.num_labels = config.num_labels
        self.model = MiniRopeModel(config)
        self.score = nn.Linear(config.hidden_size, config.num_labels, bias=False)
        self.post_init()


class MiniRopeForTokenClassification(GenericForTokenClassification, MiniRopePreTrainedModel):
    """Dropout (`config.classifier_dropout`, default 0.1) then a linear `score` head: `logits` `(B, T, num_labels)`."""

    def __init__(self, config: MiniRopeConfig) -> None:
        MiniRopePreTrainedModel.__init__(self, config)
        self.num_labels = config.num_labels
        self.model = MiniRopeModel(config)
        dropout = getattr(config, "classifier_dropout", None)
        self.dropout = nn.Dropout(0.1 if dropout is None else dropout)
        self.score = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()


class MiniRopeForQuestionAnswering(GenericForQuestionAnswering, MiniRopePreTrainedModel):
    """Extractive QA: `qa_outputs` `(D -> 2)` gives `start_logits` and `end_logits`, each `(B, T)`.

    The decoder sits under `transformer` (not `model`), as in `LlamaForQuestionAnswering`, so the state dicts
    of the two stay interchangeable.
    """

    base_model_prefix = "transformer"

    def __init__(self, config: MiniRopeConfig) -> None:
        MiniRopePreTrainedModel.__init__(self, config)
        self.transformer = MiniRopeModel(config)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.post_init()
