"""CPU speed settings: the model's matmuls are `nn.Linear`'s (Llama's); decoding matmuls move to oneDNN only where
`use_measured_matmuls` measured it faster on this machine; and the training scripts' allocator setting."""

import copy
import json
import platform

import pytest
import torch
from conftest import llama_twin, random_model, tiny_config
from torch import nn

from minirope import cpu_matmuls, machine
from minirope.training.arguments import MiniRopeTrainingArguments, reuse_freed_memory
from minirope.training.trainer import MiniRopeTrainer

needs_onednn = pytest.mark.skipif(not machine.onednn_available(), reason="oneDNN linear needs an x86 CPU and mkldnn")


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
    return tmp_path / "machine.json"


def fake_timings(monkeypatch, winner: str) -> list:
    """Timings in which `winner` ("onednn" or "torch") is 2x faster; returns the list of measured shapes."""
    measured = []

    def measure(in_features, out_features, rows, model_mib):
        measured.append((in_features, out_features, rows))
        return {"torch_us": 2.0, "onednn_us": 1.0} | {"onednn": winner == "onednn"}

    monkeypatch.setattr(cpu_matmuls, "measure", measure)
    return measured


def fake_steps(monkeypatch, faster: bool) -> None:
    """A whole decoding step 2x faster with the moved matmuls (`faster`), or 2x slower."""

    def step_seconds(model, rows):
        moved = any(rows in module.__dict__.get("onednn_rows", ()) for module in model.modules())
        return 1.0 if moved == faster else 2.0

    monkeypatch.setattr(cpu_matmuls, "step_seconds", step_seconds)


@needs_onednn
def test_measured_faster_products_move_and_give_the_same_tokens(cache, monkeypatch):
    model = random_model(tiny_config())
    measured = fake_timings(monkeypatch, "onednn")
    fake_steps(monkeypatch, faster=True)
    chosen = cpu_matmuls.use_measured_matmuls(model)
    assert set(chosen) == {name for name, m in model.named_modules() if type(m) is nn.Linear}
    assert len(measured) == 2 * len({(m.in_features, m.out_features) for m in model.modules() if type(m) is nn.Linear})
    layer = model.model.layers[0].mlp.up_proj
    x = torch.randn(1, layer.in_features)
    with torch.no_grad():
        assert ran_on_onednn(lambda: layer(x)) and ran_on_onednn(lambda: layer(torch.randn(8, layer.in_features)))
        assert not ran_on_onednn(lambda: layer(torch.randn(9, layer.in_features)))  # prefill: torch's path
        torch.testing.assert_close(layer(x), nn.functional.linear(x, layer.weight), rtol=1e-5, atol=1e-6)
    x.requires_grad_()  # under autograd the chosen product stays differentiable, with nn.Linear's gradient
    assert ran_on_onednn(lambda: layer(x).sum().backward())
    torch.testing.assert_close(x.grad, layer.weight.sum(0).expand_as(x), rtol=1e-5, atol=1e-6)
    assert not ran_on_onednn(lambda: layer(torch.randn(9, layer.in_features)))  # more rows: training's decision
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
    assert list(saved) == [machine.machine()] and "torch" in machine.machine()
    measured.clear()
    cpu_matmuls.use_measured_matmuls(random_model(tiny_config(), seed=1))
    assert measured == []


@needs_onednn
def test_without_timing_only_cached_decisions_apply_and_nothing_is_timed(cache, monkeypatch):
    """`minirope-generate`'s default (`timing=False`): on a fresh cache nothing is timed and nothing moves; once a
    timed use has cached the matmuls' and the whole step's decisions, an untimed use makes the same choice with no
    timing at all (a one-off reply waits for no benchmark)."""
    model = random_model(tiny_config())
    measured = fake_timings(monkeypatch, "onednn")
    steps = []
    monkeypatch.setattr(cpu_matmuls, "step_seconds", lambda model, rows: steps.append(rows) or 1.0 + len(steps) % 2)
    assert cpu_matmuls.use_measured_matmuls(model, timing=False) == {} and measured == [] and steps == []
    timed = cpu_matmuls.use_measured_matmuls(model)
    assert measured and steps
    measured.clear()
    steps.clear()
    assert cpu_matmuls.use_measured_matmuls(random_model(tiny_config(), seed=1), timing=False) == timed
    assert measured == [] and steps == []


@needs_onednn
def test_products_that_are_not_clearly_faster_stay_on_torch(cache, monkeypatch):
    model = random_model(tiny_config())
    fake_timings(monkeypatch, "torch")
    assert cpu_matmuls.use_measured_matmuls(model) == {}
    layer = model.lm_head
    with torch.no_grad():
        assert not ran_on_onednn(lambda: layer(torch.randn(1, layer.in_features)))


@needs_onednn
def test_products_faster_alone_but_not_in_the_whole_step_stay_on_torch(cache, monkeypatch):
    model = random_model(tiny_config())
    fake_timings(monkeypatch, "onednn")
    fake_steps(monkeypatch, faster=False)
    assert cpu_matmuls.use_measured_matmuls(model) == {}
    assert not any("forward" in module.__dict__ for module in model.modules())  # nothing left moved


@needs_onednn
def test_the_real_measurement_decides_by_the_margin(cache):
    """On this CPU, for real: each decision is oneDNN exactly where its median beats torch's by `MARGIN`."""
    rows = (*cpu_matmuls.ROWS, cpu_matmuls.TRAINING_ROWS)
    decisions = cpu_matmuls.decisions({(96, 288), (384, 4096)}, model_mib=8, rows=rows)
    assert len(decisions) == 6
    for name, row in decisions.items():
        assert row["torch_us"] > 0 and row["onednn_us"] > 0
        assert row["onednn"] == (row["torch_us"] > cpu_matmuls.MARGIN * row["onednn_us"]), name
    print(json.dumps(decisions, indent=1))


@needs_onednn
def test_measured_training_products_train_as_llama_does(cache, monkeypatch):
    """Training matmuls moved to oneDNN give Llama's loss and gradients (first and second order), to float32
    rounding; decoding matmuls and the saved weights are untouched."""
    model = random_model(tiny_config(), attn="eager").train()  # eager: sdpa has no second derivative on CPU
    measured = fake_timings(monkeypatch, "onednn")
    chosen = cpu_matmuls.use_measured_matmuls(model, training=True)
    linears = {name for name, m in model.named_modules() if type(m) is nn.Linear}
    assert chosen == dict.fromkeys(linears, ["training"])
    assert {rows for _, _, rows in measured} == {cpu_matmuls.TRAINING_ROWS}
    oracle = llama_twin(model).train()
    ids = torch.randint(0, model.config.vocab_size, (2, 12))
    losses, gradients = [], []
    for which in (model, oracle):
        loss = which(ids, labels=ids).loss
        params = [p for p in which.parameters() if p.requires_grad]
        grads = torch.autograd.grad(loss, params, create_graph=True)
        squared = sum(g.pow(2).sum() for g in grads)  # a gradient of a gradient: oneDNN's op has no derivative
        losses.append(loss.detach())
        gradients.append([g.detach() for g in grads] + list(torch.autograd.grad(squared, params)))
    assert ran_on_onednn(lambda: model(ids, labels=ids).loss.backward())
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-5, atol=1e-6)
    for ours, llamas in zip(*gradients, strict=True):
        torch.testing.assert_close(ours, llamas, rtol=1e-4, atol=1e-5)
    # the fused loss (`skip_logits`, as MiniRopeTrainer asks for it): the head's chunk matmuls move with the head
    calls, onednn_linear = [], cpu_matmuls.onednn_linear
    monkeypatch.setattr(
        cpu_matmuls, "onednn_linear", lambda x, w, b=None: calls.append(w.shape) or onednn_linear(x, w, b)
    )
    fused = model(ids, labels=ids, skip_logits=True).loss
    params = [p for p in model.parameters() if p.requires_grad]
    torch.testing.assert_close(fused, losses[1], rtol=1e-5, atol=1e-6)
    for ours, llamas in zip(torch.autograd.grad(fused, params), gradients[1], strict=False):  # first order
        torch.testing.assert_close(ours, llamas, rtol=1e-4, atol=1e-5)
    head = model.lm_head.weight.shape
    assert head in calls and head[::-1] in calls  # the logits' product and the hidden states' gradient's
    layer = model.model.layers[0].mlp.up_proj
    with torch.no_grad():
        assert not ran_on_onednn(lambda: layer(torch.randn(1, layer.in_features)))  # decoding: not measured here
        with torch.autocast("cpu", dtype=torch.bfloat16):  # bf16 runs: torch's own matmuls
            assert not ran_on_onednn(lambda: layer(torch.randn(4, 8, layer.in_features)))
    fake_steps(monkeypatch, faster=True)
    cpu_matmuls.use_measured_matmuls(model)  # decoding's choice is added, training's kept
    assert layer.onednn_rows == ("training", 1, 8)


@needs_onednn
@pytest.mark.parametrize("flags, moves", [({}, True), ({"measured_matmuls": False}, False), ({"bf16": True}, False)])
def test_the_trainer_moves_training_products_in_float32_eager_cpu_runs_only(cache, monkeypatch, capsys, tmp_path,
                                                                           flags, moves):  # fmt: skip
    fake_timings(monkeypatch, "onednn")
    args = MiniRopeTrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], torch_compile=False,
                                     **{"bf16": False} | flags)  # fmt: skip
    trainer = MiniRopeTrainer(model=random_model(tiny_config()), args=args)
    trainer.use_measured_matmuls()
    moved = [name for name, m in trainer.model.named_modules() if "onednn_rows" in m.__dict__]
    assert bool(moved) == moves
    line = "training matmuls on oneDNN, measured faster on this CPU: 15 of 15 linear layers"
    assert (line in capsys.readouterr().out) == moves


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_training_keeps_freed_memory_on_glibc():
    assert reuse_freed_memory()  # glibc accepted both settings (it refuses e.g. a threshold above 32 MiB)


def test_the_speed_measures_leave_the_runs_random_state_alone():
    """The matmuls timed to choose kernels and precision, and the matmul peak, draw their operands from their own
    generator: a run that measures (the first of a process; later ones read the cache) starts from the random state
    its seed gave, as a run that does not (two LoRA fine-tunes in one process trained differently before)."""
    torch.manual_seed(0)
    state = torch.random.get_rng_state()
    cpu_matmuls.measure(16, 16, 4, 1)
    machine.time_bf16_speedup()
    machine.time_matmul_peak(torch.device("cpu"), torch.float32)
    assert torch.equal(torch.random.get_rng_state(), state)


def test_the_machine_is_measured_once_and_its_figures_kept_per_machine(cache, monkeypatch):
    """The bf16 speedup and the matmul peak (each precision) are timed on a machine's first use and read from its
    one cache file after: the same precision and the same peak in every run; another thread count is another
    machine, measured anew."""
    timed = []
    monkeypatch.setattr(machine, "time_bf16_speedup", lambda: timed.append("bf16") or 3.0)
    monkeypatch.setattr(machine, "time_matmul_peak", lambda device, dtype: timed.append(dtype) or (2e12, 1024))
    for _ in range(2):
        assert machine.bf16_speedup() == 3.0
        assert machine.matmul_peak("cpu", torch.bfloat16) == (2e12, 1024)
        assert machine.matmul_peak("cpu", torch.float32) == (2e12, 1024)
    assert timed == ["bf16", torch.bfloat16, torch.float32]
    saved = json.loads(cache.read_text())[machine.machine()]
    assert saved["bf16 speedup"] == {"speedup": 3.0} and saved["matmul peak, float32"] == {"flops": 2e12, "size": 1024}
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        assert machine.bf16_speedup() == 3.0 and timed[-1] == "bf16" and len(timed) == 4
    finally:
        torch.set_num_threads(threads)
    assert len(json.loads(cache.read_text())) == 2


def test_the_peak_is_the_best_timing_of_the_machines_runs_and_the_line_names_the_cache(cache, monkeypatch):
    """A training run times the peak when it begins and keeps the better of that and the cached one (a busy host only
    lowers a timing: a low first timing does not stay); the precision line says where the timings are kept."""
    from minirope.training.precision import choose_bf16
    from minirope.training.throughput import ThroughputCallback

    rates = iter([(1e9, 256), (4e9, 512), (2e9, 1024)])  # busy, then free, then busy again
    monkeypatch.setattr(machine, "time_matmul_peak", lambda device, dtype: next(rates))
    args = type("Args", (), {"bf16": False, "device": torch.device("cpu")})()
    for best in ((1e9, 256), (4e9, 512), (4e9, 512)):
        callback = ThroughputCallback(tokens_per_step=2, flops_per_token=1e9, warmup_steps=0)
        callback.step_seconds = [1.0] * 3  # 2 model GFLOP/s
        callback.on_train_begin(args, None, None)
        assert (callback.peak_flops, callback.peak_size) == best
    assert callback.metrics()["mfu"] == 0.5 and machine.matmul_peak("cpu", torch.float32) == (4e9, 512)
    machine.measured("bf16 speedup", lambda: {"speedup": 1.2})
    bf16, line = choose_bf16(torch.device("cpu"))
    assert not bf16 and f"bf16 matmuls 1.2x float32's on this CPU, timed once, cached in {cache}" in line
