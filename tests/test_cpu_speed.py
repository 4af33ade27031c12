"""CPU speed settings: the model's products are `nn.Linear`'s (Llama's); decoding products move to oneDNN only where
`use_measured_products` measured it faster on this machine; and the training scripts' allocator setting."""

import copy
import json
import platform

import pytest
import torch
from conftest import llama_twin, random_model, tiny_config
from torch import nn

from minirope import cpu_products
from minirope.training.arguments import reuse_freed_memory

needs_onednn = pytest.mark.skipif(not cpu_products.available(), reason="oneDNN linear needs an x86 CPU and mkldnn")


def ran_on_onednn(run) -> bool:
    """Whether `run()` called oneDNN's linear (read from the profiler's record of the ops it ran)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        run()
    return any(event.name == "mkldnn::_linear_pointwise" for event in profile.events())


def test_the_model_runs_llamas_products():
    """No kernel choice of minirope's own in the model: every product is an `nn.Linear`, exactly as in Llama."""
    model = random_model(tiny_config())
    linears = [module for module in model.modules() if isinstance(module, nn.Linear)]
    assert linears and all(type(module) is nn.Linear for module in linears)
    with torch.no_grad():
        assert not ran_on_onednn(lambda: model(torch.tensor([[5, 6, 7]])))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIROPE_CACHE", str(tmp_path))
    return tmp_path / "cpu_products.json"


def fake_timings(monkeypatch, winner: str) -> list:
    """Timings in which `winner` ("onednn" or "torch") is 2x faster; returns the list of measured shapes."""
    measured = []

    def measure(in_features, out_features, rows, model_mib):
        measured.append((in_features, out_features, rows))
        return {"torch_us": 2.0, "onednn_us": 1.0} | {"onednn": winner == "onednn"}

    monkeypatch.setattr(cpu_products, "measure", measure)
    return measured


def fake_steps(monkeypatch, faster: bool) -> None:
    """A whole decoding step 2x faster with the moved products (`faster`), or 2x slower."""

    def step_seconds(model, rows):
        moved = any("forward" in module.__dict__ for module in model.modules())
        return 1.0 if moved == faster else 2.0

    monkeypatch.setattr(cpu_products, "step_seconds", step_seconds)


@needs_onednn
def test_measured_faster_products_move_and_give_the_same_tokens(cache, monkeypatch):
    model = random_model(tiny_config())
    measured = fake_timings(monkeypatch, "onednn")
    fake_steps(monkeypatch, faster=True)
    chosen = cpu_products.use_measured_products(model)
    assert set(chosen) == {name for name, m in model.named_modules() if type(m) is nn.Linear}
    assert len(measured) == 2 * len({(m.in_features, m.out_features) for m in model.modules() if type(m) is nn.Linear})
    layer = model.model.layers[0].mlp.up_proj
    x = torch.randn(1, layer.in_features)
    with torch.no_grad():
        assert ran_on_onednn(lambda: layer(x)) and ran_on_onednn(lambda: layer(torch.randn(8, layer.in_features)))
        assert not ran_on_onednn(lambda: layer(torch.randn(9, layer.in_features)))  # prefill: torch's path
        torch.testing.assert_close(layer(x), nn.functional.linear(x, layer.weight), rtol=1e-5, atol=1e-6)
    assert not ran_on_onednn(lambda: layer(x))  # training products keep nn.Linear's path
    assert "model.layers.0.mlp.up_proj.weight" in model.state_dict()  # parameters and keys unchanged
    twin = copy.deepcopy(model)  # a copy computes with its own weights, on the same kernels
    with torch.no_grad():
        twin.model.layers[0].mlp.up_proj.weight.zero_()
        assert ran_on_onednn(lambda: twin.model.layers[0].mlp.up_proj(x))
        assert twin.model.layers[0].mlp.up_proj(x).abs().max() == 0 and layer(x).abs().max() > 0
    settings = dict(max_new_tokens=20, min_new_tokens=20, do_sample=False, pad_token_id=0)
    prompt = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    assert torch.equal(model.generate(prompt, **settings), llama_twin(model).generate(prompt, **settings))
    # cached for this machine: a second model of the same shapes measures nothing
    saved = json.loads(cache.read_text())
    assert list(saved) == [cpu_products.machine()] and "torch" in cpu_products.machine()
    measured.clear()
    cpu_products.use_measured_products(random_model(tiny_config(), seed=1))
    assert measured == []


@needs_onednn
def test_products_that_are_not_clearly_faster_stay_on_torch(cache, monkeypatch):
    model = random_model(tiny_config())
    fake_timings(monkeypatch, "torch")
    assert cpu_products.use_measured_products(model) == {}
    layer = model.lm_head
    with torch.no_grad():
        assert not ran_on_onednn(lambda: layer(torch.randn(1, layer.in_features)))


@needs_onednn
def test_products_faster_alone_but_not_in_the_whole_step_stay_on_torch(cache, monkeypatch):
    model = random_model(tiny_config())
    fake_timings(monkeypatch, "onednn")
    fake_steps(monkeypatch, faster=False)
    assert cpu_products.use_measured_products(model) == {}
    assert not any("forward" in module.__dict__ for module in model.modules())  # nothing left moved


@needs_onednn
def test_the_real_measurement_decides_by_the_margin(cache):
    """On this CPU, for real: each decision is oneDNN exactly where its median beats torch's by `MARGIN`."""
    decisions = cpu_products.decisions({(96, 288), (384, 4096)}, model_mib=8)
    assert len(decisions) == 4
    for name, row in decisions.items():
        assert row["torch_us"] > 0 and row["onednn_us"] > 0
        assert row["onednn"] == (row["torch_us"] > cpu_products.MARGIN * row["onednn_us"]), name
    print(json.dumps(decisions, indent=1))


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_training_keeps_freed_memory_on_glibc():
    assert reuse_freed_memory()  # glibc accepted both settings (it refuses e.g. a threshold above 32 MiB)
