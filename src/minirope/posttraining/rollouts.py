"""Sampling from a LoRA model at its base model's cost: the adapter merged into the base weights while the model
generates (the held-out measures; GRPO's rollouts and distillation's on-policy completions where LoRA has no
dropout, `--lora_dropout 0`) and unmerged before the next gradient.

Unmerged, every LoRA layer of a decoding step runs three matmuls instead of one (the base's, `x @ A.T`, then
`@ B.T`), a dropout and a sum, a few more kernel launches per layer per token: with LoRA on SmolLM2-135M's 210
linear layers a batch-16 rollout took 214-236 ms a token against 161-178 ms for the model without its adapter
(2-core Zen 3, float32; docs/studies/posttrain_speed.md). Merged, the layers compute `x @ (W + s B A).T`, the same
function in one product. Merging and unmerging cost a pass over the adapted weights each (0.4 s each for SmolLM2
there), once per rollout, not per token. TRL does the same (`merge_adapter`, then `unmerge_adapter`) each time it
sends a LoRA model's weights to vLLM.
"""

from contextlib import contextmanager

import torch


def lora_layers(model) -> list:
    """`model`'s LoRA layers (peft's `LoraLayer`s); none for a model without them."""
    from peft.tuners.lora import LoraLayer

    return [module for module in model.modules() if isinstance(module, LoraLayer)]


def lora_base_weights(model) -> list[torch.Tensor]:
    """The base weights under `model`'s LoRA layers."""
    return [layer.get_base_layer().weight for layer in lora_layers(model)]


def mergeable(model) -> bool:
    """Whether merging `model`'s adapter leaves its base weights as they were after unmerging, up to float32
    rounding: a peft model whose adapted base weights are plain float32 tensors.

    Not for bf16 or float16 weights, where adding the adapter's small update and taking it away again rounds at a
    relative 2**-9 or 2**-11 each time and the base would drift over a run; not for quantized ones (QLoRA: the
    merge would round the update into the quantization), nor for weights sharded by FSDP (DTensors) or DeepSpeed
    ZeRO-3 (placeholders), which peft cannot merge in place."""
    if not hasattr(model, "merge_adapter"):
        return False
    weights = lora_base_weights(model)
    return bool(weights) and all(
        type(weight.data) is torch.Tensor and weight.dtype == torch.float32 and weight.numel() > 0 for weight in weights
    )


def dropped_out(model) -> bool:
    """Whether `model`'s LoRA layers apply dropout now: in training mode with a `lora_dropout` above 0."""
    return model.training and any(
        not isinstance(dropout, torch.nn.Identity)
        for layer in lora_layers(model)
        for dropout in layer.lora_dropout.values()
    )


@contextmanager
def merged_adapter(model):
    """While the block runs, `model`'s LoRA adapter merged into its base weights (peft's `merge_adapter`); unmerged
    after it, an exception included (`unmerge_adapter`). A model that is not `mergeable` runs as it is, and so does
    one whose LoRA layers apply dropout now (`dropped_out`: TRL's rollouts run in training mode, so with a
    `lora_dropout` above 0 they sample from dropped-out adapters, which a merged model cannot do; sampling without
    that dropout changed what GRPO learned: on docs/pretrained.md's largest-of-three task with SmolLM2, seeds 1 and 2
    gained +7.5 and +18.5 points on 200 other problems against +38.0 and +25.5 with it).

    Merged, the model computes the same function (a product of the summed weight instead of the sum of the matmuls:
    float32 rounding differences only; the greedy tokens of SmolLM2-135M with a random adapter were all equal).
    After unmerging, each base weight is back within float32 rounding of where it was (relative 1.3e-7 after 200
    merges of a moving adapter on SmolLM2).
    """
    if not mergeable(model) or dropped_out(model):
        yield model
        return
    model.merge_adapter()
    try:
        yield model
    finally:
        model.unmerge_adapter()
