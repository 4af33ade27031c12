"""The MFU the pretraining run reports: PaLM's FLOP count, the step timing and the measured peak."""

import importlib.util
import math

import pytest
import torch
from conftest import tiny_config

from minirope import MiniRopeForCausalLM
from minirope.machine import time_matmul_peak
from minirope.training.throughput import ThroughputCallback, training_flops_per_token


def test_flops_per_token_counts_every_matrix_product_and_attention():
    config = tiny_config("gqa")  # grouped-query: k/v projections are narrower than q
    model = MiniRopeForCausalLM(config)
    linear_weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    attention = 12 * config.num_hidden_layers * config.num_attention_heads * config.head_dim * 32
    assert training_flops_per_token(config, seq_len=32) == 6 * linear_weights + attention


def test_metrics_use_the_median_step_after_warm_up():
    callback = ThroughputCallback(tokens_per_step=1000, flops_per_token=2e6, warmup_steps=2)
    assert callback.metrics() == {}
    callback.peak_flops = 1e10
    callback.step_seconds = [30.0, 20.0, 0.5, 0.4, 9.0]  # compilation first, one slow step later
    metrics = callback.metrics()
    assert metrics["step_seconds"] == 0.5
    assert metrics["tokens_per_second"] == 2000.0
    assert math.isclose(metrics["mfu"], 2e6 * 1000 / 0.5 / 1e10)


def test_first_step_and_step_interval_times(monkeypatch):
    """Wall time to the end of the first step (from the run's start), and between step ends (data loading in)."""
    from transformers import TrainerControl, TrainerState, TrainingArguments

    clock = iter([10.0, 12.0, 12.5, 13.0, 14.0, 14.5])  # begin/end of 3 steps; the run began at 7
    monkeypatch.setattr("minirope.training.throughput.time.perf_counter", lambda: next(clock))
    callback = ThroughputCallback(tokens_per_step=1000, flops_per_token=2e6, warmup_steps=0, run_started=7.0)
    args, state, control = TrainingArguments("unused"), TrainerState(), TrainerControl()
    for _ in range(3):
        callback.on_step_begin(args, state, control)
        callback.on_step_end(args, state, control)
    callback.peak_flops = 1e10
    metrics = callback.metrics()
    assert metrics["first_step_seconds"] == 5.0  # 12.0 - 7.0
    assert metrics["step_seconds"] == 0.5  # step bodies 2.0, 0.5, 0.5
    assert metrics["step_interval_seconds"] == 1.25  # step ends 12.0, 13.0, 14.5


def test_training_seconds_leave_out_evaluations_and_checkpoints(monkeypatch):
    """The compute budget's seconds: the steps and the time between them, not an evaluation or a checkpoint
    written between two steps (nor anything before the first step or after the last)."""
    from transformers import TrainerControl, TrainerState, TrainingArguments

    # step 1: 10-12; evaluation ends at 20, checkpoint at 25; step 2: 25.5-27; step 3: 27.5-28
    clock = iter([10.0, 12.0, 20.0, 25.0, 25.5, 27.0, 27.5, 28.0, 99.0])
    monkeypatch.setattr("minirope.training.throughput.time.perf_counter", lambda: next(clock))
    callback = ThroughputCallback(tokens_per_step=1000, flops_per_token=2e6, warmup_steps=0)
    args, state, control = TrainingArguments("unused"), TrainerState(), TrainerControl()
    callback.on_step_begin(args, state, control)
    callback.on_step_end(args, state, control)
    callback.on_evaluate(args, state, control)
    callback.on_save(args, state, control)
    for _ in range(2):
        callback.on_step_begin(args, state, control)
        callback.on_step_end(args, state, control)
    callback.on_evaluate(args, state, control)  # the final evaluation, after training: nothing to add
    assert callback.training_seconds == 2.0 + 0.5 + 1.5 + 0.5 + 0.5


def test_matmul_peak_is_a_plausible_rate():
    flops, size = time_matmul_peak(sizes=(128, 256), repeats=2)
    assert 1e8 < flops < 1e15  # between 0.1 GFLOP/s and 1 PFLOP/s
    assert size in (128, 256)


def test_matmul_peak_grows_the_product_until_the_rate_stops_rising(monkeypatch):
    """A GPU-like device whose rate rises up to 8192 x 8192 (as an H200's did: 440 TFLOP/s at 2048, 775 at 8192)
    is measured at 8192, not at the size where a small device is already full."""
    from minirope import machine

    rates = {512: 50e12, 1024: 200e12, 2048: 440e12, 4096: 700e12, 8192: 775e12, 16384: 780e12}
    measured = []

    def fake_seconds(size, device, dtype, repeats):
        measured.append(size)
        return 2 * size**3 / rates[size]

    monkeypatch.setattr(machine, "matmul_seconds", fake_seconds)
    assert machine.time_matmul_peak("cpu") == (pytest.approx(780e12), 16384)  # rose < 5 %: stop there
    assert measured == [512, 1024, 2048, 4096, 8192, 16384]
    rates.update({4096: 445e12})  # full at 2048: one more size to see it, no further
    measured.clear()
    assert machine.time_matmul_peak("cpu") == (pytest.approx(445e12), 4096)
    assert measured == [512, 1024, 2048, 4096]
    measured.clear()  # a slow device: a product of 0.1 s is large enough
    assert machine.time_matmul_peak("cpu", sizes=(512, 1024, 2048), long_enough=2 * 1024**3 / 200e12)[1] == 1024
    assert measured == [512, 1024]


def test_precision_and_compile_defaults_follow_the_bf16_measurement(monkeypatch):
    """`--bf16` unset: bf16 where its matmuls are `BF16_MARGIN` times faster or more; `--torch_compile`
    (pretraining) follows it; the choice comes with the line that says why."""
    from minirope import machine
    from minirope.commands import pretrain

    for speedup, bf16 in ((3.9, True), (1.49, False), (0.007, False)):
        monkeypatch.setattr(machine, "bf16_speedup", lambda speedup=speedup: speedup)
        args = pretrain.parse_args(["--use_cpu", "True"])[2]
        assert (args.bf16, args.torch_compile) == (bf16, bf16)
        assert args.precision_line.startswith(
            f"precision: {'bf16' if bf16 else 'float32'} (bf16 matmuls {speedup:.2g}x"
        )
    explicit = pretrain.parse_args(["--bf16", "True", "--torch_compile", "False"])[2]
    assert (explicit.bf16, explicit.torch_compile, explicit.precision_line) == (True, False, None)


def test_post_training_stays_float32_on_a_cpu_without_timing_its_matmuls(monkeypatch):
    """`minirope-posttrain` without `--bf16`: float32 on a CPU whatever bf16 matmuls would measure (GRPO learned less
    in bf16), so nothing is timed; the line gives the reason; `--bf16 True` decides instead."""
    from minirope import machine
    from minirope.posttraining.parsing import parse_args

    def timed():
        raise AssertionError("post-training on a CPU timed its matmuls")

    monkeypatch.setattr(machine, "bf16_speedup", timed)
    config = parse_args(["--method", "grpo", "--model", "./m", "--use_cpu", "True"])[1]
    assert config.bf16 is False
    assert config.precision_line.startswith("precision: float32 on a CPU (GRPO learned less in bf16")
    given = parse_args(["--method", "grpo", "--model", "./m", "--use_cpu", "True", "--bf16", "True"])[1]
    assert (given.bf16, given.precision_line) == (True, None)


def test_the_bf16_measurement_gives_one_answer_on_this_cpu():
    """Five measurements, one decision: the speedup is far from the margin on either side (native bf16 2-6x,
    emulated bf16 below 0.1x), which is what keeps a busy host from flipping the default run's precision."""
    from minirope.machine import time_bf16_speedup
    from minirope.training.precision import BF16_MARGIN

    speedups = [time_bf16_speedup() for _ in range(5)]
    print("bf16 speedups:", [f"{speedup:.3g}" for speedup in speedups])
    assert len({speedup >= BF16_MARGIN for speedup in speedups}) == 1


def test_float32_peak_is_measured_in_float32():
    callback = ThroughputCallback(tokens_per_step=1, flops_per_token=1.0)
    callback.measure_peak(type("Args", (), {"bf16": False, "device": torch.device("cpu")})())
    assert callback.peak_dtype == torch.float32 and callback.peak_flops > 1e8


def test_warmup_stable_decay_decays_over_the_last_30_percent_by_default():
    from minirope.commands import pretrain

    default = {"num_decay_steps": 30, "decay_type": "1-sqrt"}
    assert pretrain.parse_args(["--max_steps", "100"])[2].lr_scheduler_kwargs == default
    args = pretrain.parse_args(["--max_steps", "100", "--lr_scheduler_kwargs", '{"num_decay_steps": 7}'])[2]
    assert args.lr_scheduler_kwargs == {"num_decay_steps": 7, "decay_type": "1-sqrt"}
    args = pretrain.parse_args(["--max_steps", "100", "--lr_decay_type", "linear"])[2]
    assert args.lr_scheduler_kwargs == {"num_decay_steps": 30, "decay_type": "linear"}
    by_epochs = pretrain.parse_args(["--max_steps", "-1", "--num_train_epochs", "2", "--lr_decay_type", "linear"])[2]
    assert by_epochs.lr_scheduler_kwargs == {"decay_type": "linear"}  # the decay's steps are counted at the start


def test_half_precision_gpu_runs_turn_off_cudnn_attention(monkeypatch, tmp_path):
    """cuDNN's attention backward returns NaN for masked sequences of 64 + 128k tokens on H100/H200 (the bf16 GRPO
    run's step 13 on an H200: `avoid_cudnn_attention`'s docstring). Fine-tuning and post-training turn that kernel
    off for bf16 or fp16 runs on CUDA, and leave it alone for float32, CPU runs and machines without CUDA."""
    from types import SimpleNamespace

    from minirope.commands import finetune, posttrain
    from minirope.training.precision import avoid_cudnn_attention

    class Called(Exception):
        pass

    def called(args):
        raise Called(args)

    enabled = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        run = SimpleNamespace(bf16=True, fp16=False, use_cpu=False)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        assert avoid_cudnn_attention(run) is False and torch.backends.cuda.cudnn_sdp_enabled()  # no CUDA
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        for args in (
            SimpleNamespace(bf16=False, fp16=False, use_cpu=False),
            SimpleNamespace(bf16=True, fp16=False, use_cpu=True),
        ):
            assert avoid_cudnn_attention(args) is False and torch.backends.cuda.cudnn_sdp_enabled()
        assert avoid_cudnn_attention(SimpleNamespace(bf16=False, fp16=True, use_cpu=False)) is True
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(enabled)
    # Both commands ask, with their parsed arguments, before any work (posttrain where TRL is installed: without it,
    # the command stops first, saying how to install it).
    monkeypatch.chdir(tmp_path)
    commands = [(finetune, finetune, ["--play", "hamlet"])]
    if importlib.util.find_spec("trl"):
        from minirope.posttraining import setup  # every method's first step (`setup.start`)

        commands.append((posttrain, setup, []))
    for command, module, argv in commands:
        monkeypatch.setattr(module, "avoid_cudnn_attention", called)
        with pytest.raises(Called) as asked:
            command.run(
                [*argv, "--model_name_or_path", "x", "--output_dir", "out", "--bf16", "True", "--use_cpu", "True"]
            )
        assert asked.value.args[0].bf16 is True
    assert not any(tmp_path.iterdir())
