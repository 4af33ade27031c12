"""CPU speed settings: `MiniRopeLinear` (float32 products on oneDNN, the values and gradients of
`nn.functional.linear`) and the training scripts' allocator setting."""

import os
import platform
import subprocess
import sys

import pytest
import torch

from minirope import kernels_minirope as kernels
from minirope.kernels_minirope import MiniRopeLinear, matmul_nt, onednn_available, use_onednn
from minirope.training.arguments import reuse_freed_memory

needs_onednn = pytest.mark.skipif(not onednn_available(), reason="oneDNN linear needs an x86 CPU and mkldnn")


@pytest.fixture
def onednn(monkeypatch):
    """The oneDNN path switched on for every product, also on CPUs where minirope leaves it off for speed (AVX2)."""
    monkeypatch.setattr(kernels, "ONEDNN_EVERYWHERE", True)


@needs_onednn
def test_onednn_is_chosen_where_it_was_measured_faster():
    """Every product on AVX-512 CPUs; small ones nowhere else (AVX2: slower per call, docs/performance.md)."""
    avx512 = torch.backends.cpu.get_cpu_capability().startswith("AVX512")
    assert kernels.onednn_linear_enabled() == avx512
    assert use_onednn(torch.randn(3, 8), torch.randn(5, 8)) == avx512


def ran_on_onednn(run) -> bool:
    """Whether `run()` called oneDNN's linear (read from the profiler's record of the ops it ran)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        run()
    return any(event.name == "mkldnn::_linear_pointwise" for event in profile.events())


@needs_onednn
@pytest.mark.skipif(torch.get_num_threads() < 2, reason="the decoding rule needs several threads")
def test_decoding_products_with_large_weights_go_to_onednn_on_any_x86_cpu():
    """A few rows against a weight of >= 2^19 elements, without gradients: oneDNN's threads read the weight
    faster than `torch.mm`'s single-threaded product (docs/performance.md), with the same values."""
    torch.manual_seed(0)
    layer = MiniRopeLinear(512, kernels.LARGE_WEIGHT // 512)
    x = torch.randn(2, 8, 512)  # 16 rows: a batch of 16 sequences decoding one token each
    with torch.no_grad():
        assert ran_on_onednn(lambda: layer(x))
        reference = torch.nn.functional.linear(x, layer.weight, layer.bias)
        torch.testing.assert_close(layer(x), reference, rtol=1e-5, atol=1e-5)
        prefill = torch.randn(17, 512)  # more rows: where torch.mm is as fast
        assert ran_on_onednn(lambda: layer(prefill)) == kernels.onednn_linear_enabled()
        small = MiniRopeLinear(512, kernels.LARGE_WEIGHT // 512 - 1)
        assert ran_on_onednn(lambda: small(x)) == kernels.onednn_linear_enabled()  # below the size: AVX-512 only
    assert ran_on_onednn(lambda: layer(x)) == kernels.onednn_linear_enabled()  # training keeps its products
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        with torch.no_grad():
            assert ran_on_onednn(lambda: layer(x)) == kernels.onednn_linear_enabled()  # one thread: no gain
    finally:
        torch.set_num_threads(threads)


@needs_onednn
def test_onednn_is_used_for_float32_cpu_products_only(onednn):
    x, weight = torch.randn(3, 8), torch.randn(5, 8)
    assert use_onednn(x, weight)
    assert not use_onednn(x.bfloat16(), weight.bfloat16())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not use_onednn(x, weight)  # autocast's bf16 product is already oneDNN's


class Wrapped(torch.Tensor):
    """A tensor subclass standing in for DTensor, FakeTensor and friends: no rule for the oneDNN op."""


@needs_onednn
def test_tensor_subclasses_and_tracing_get_the_standard_linear(onednn):
    layer = MiniRopeLinear(8, 5)
    x = torch.randn(3, 8)
    assert not use_onednn(x.as_subclass(Wrapped), layer.weight)
    assert not use_onednn(x, layer.weight.detach().as_subclass(Wrapped))
    with torch.no_grad():
        traced = torch.jit.trace(layer, x)
    graph = str(traced.inlined_graph)
    assert "aten::linear" in graph and "mkldnn" not in graph
    exported = torch.export.export(layer, (x,)).graph_module.code
    assert "mkldnn" not in exported
    assert use_onednn(x, layer.weight)  # and eager float32 products are back on oneDNN afterwards


@needs_onednn
@pytest.mark.parametrize("bias", [False, True])
def test_linear_matches_torch_in_value_and_gradients(bias, onednn):
    torch.manual_seed(0)
    layer = MiniRopeLinear(48, 80, bias=bias)
    reference = torch.nn.Linear(48, 80, bias=bias)
    reference.load_state_dict(layer.state_dict())
    x = torch.randn(2, 7, 48, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    grad = torch.randn(2, 7, 80)
    out, out_ref = layer(x), reference(x_ref)
    assert type(out.grad_fn).__name__ == "OneDnnLinearBackward"
    torch.testing.assert_close(out, out_ref, rtol=1e-5, atol=1e-5)
    out.backward(grad)
    out_ref.backward(grad)
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-5, atol=1e-5)
    for (name, param), ref in zip(layer.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(param.grad, ref.grad, rtol=1e-5, atol=1e-4, msg=name)


@needs_onednn
def test_gradient_of_a_gradient_matches_torch(onednn):
    torch.manual_seed(1)
    layer = MiniRopeLinear(12, 6)
    x = torch.randn(5, 12, requires_grad=True)
    results = []
    for forward in (layer, lambda t: torch.nn.functional.linear(t, layer.weight, layer.bias)):
        (grad_x,) = torch.autograd.grad(forward(x).pow(2).sum(), x, create_graph=True)
        results.append(torch.autograd.grad(grad_x.pow(2).sum(), (x, layer.weight)))
    for ours, reference in zip(*results, strict=True):
        torch.testing.assert_close(ours, reference, rtol=1e-4, atol=1e-4)


@needs_onednn
def test_no_grad_and_non_contiguous_inputs(onednn):
    weight, x = torch.randn(6, 10), torch.randn(10, 4).T  # a transposed (non-contiguous) input
    with torch.no_grad():
        torch.testing.assert_close(matmul_nt(x, weight), x @ weight.T, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(matmul_nt(x, weight.T.contiguous().T), x @ weight.T, rtol=1e-5, atol=1e-5)


def test_environment_variable_turns_it_off():
    code = "import minirope.kernels_minirope as m; print(m.onednn_available(), m.onednn_linear_enabled())"
    env = {**os.environ, "MINIROPE_ONEDNN_LINEAR": "0"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False False"


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_training_keeps_freed_memory_on_glibc():
    assert reuse_freed_memory()  # glibc accepted both settings (it refuses e.g. a threshold above 32 MiB)
