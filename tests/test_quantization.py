"""Quantized weights through transformers' own quantizers, on a minirope folder: torchao (int8 weight-only, int8
dynamic activations + int8 weights, int4 weight-only in groups of 32) and quanto (int8 and int4 weights). Each loads,
generates, stays near float32's logits and, where the library serializes, saves and reloads to the same tokens.
The sizes, speeds and bits/byte of every form: `benchmarks/quantization.py`."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, QuantoConfig, TorchAoConfig

from minirope import MiniRopeForCausalLM

pytestmark = pytest.mark.client


def torchao_config(name: str) -> TorchAoConfig:
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig, IntxWeightOnlyConfig
    from torchao.quantization.granularity import PerGroup

    return TorchAoConfig(
        {
            "int8_weight_only": Int8WeightOnlyConfig(),
            "int8_dynamic": Int8DynamicActivationInt8WeightConfig(),
            "int4_weight_only": IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32)),
        }[name]
    )


def greedy(model, ids: torch.Tensor) -> list[int]:
    with torch.no_grad():
        return model.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False)[0].tolist()


@pytest.mark.parametrize(
    ("name", "bound"), [("int8_weight_only", 0.02), ("int8_dynamic", 0.05), ("int4_weight_only", 0.3)]
)
def test_torchao_loads_generates_saves_and_reloads(tiny_pretrained, tmp_path, name, bound):
    pytest.importorskip("torchao")
    tokenizer = AutoTokenizer.from_pretrained(tiny_pretrained)
    ids = tokenizer("ROMEO:\nBut soft, what light", return_tensors="pt").input_ids
    quantized = AutoModelForCausalLM.from_pretrained(tiny_pretrained, quantization_config=torchao_config(name)).eval()
    assert isinstance(quantized, MiniRopeForCausalLM)
    assert type(quantized.model.layers[0].mlp.down_proj.weight).__module__.startswith("torchao")
    float32 = MiniRopeForCausalLM.from_pretrained(tiny_pretrained).eval()
    with torch.no_grad():
        difference = (quantized(ids).logits - float32(ids).logits).abs().max().item()
    print(f"torchao {name}: max |logit difference| = {difference:.4f}")
    assert 0 < difference < bound
    tokens = greedy(quantized, ids)
    quantized.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(reloaded.model.layers[0].mlp.down_proj.weight) is type(quantized.model.layers[0].mlp.down_proj.weight)
    assert greedy(reloaded, ids) == tokens


# int4 (29 s on a 2-core Zen 4) in `make test-slow`, to keep the default run under 15 minutes; int8 in every run
@pytest.mark.parametrize(("weights", "bound"), [("int8", 0.05), pytest.param("int4", 0.5, marks=pytest.mark.slow)])
def test_quanto_loads_and_generates_near_float32(tiny_pretrained, weights, bound):
    pytest.importorskip("optimum.quanto")
    tokenizer = AutoTokenizer.from_pretrained(tiny_pretrained)
    ids = tokenizer("ROMEO:\nBut soft, what light", return_tensors="pt").input_ids
    config = QuantoConfig(weights=weights)
    quantized = AutoModelForCausalLM.from_pretrained(tiny_pretrained, quantization_config=config)
    float32 = MiniRopeForCausalLM.from_pretrained(tiny_pretrained).eval()
    with torch.no_grad():
        difference = (quantized.eval()(ids).logits - float32(ids).logits).abs().max().item()
    assert type(quantized.model.layers[0].mlp.down_proj).__module__.startswith("optimum.quanto")
    print(f"quanto {weights}: max |logit difference| = {difference:.4f}")
    assert 0 < difference < bound
    assert len(greedy(quantized, ids)) == ids.shape[1] + 12
