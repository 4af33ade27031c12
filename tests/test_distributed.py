"""The pretraining and fine-tuning scripts run unchanged on 2 processes (DDP, gloo on CPU).

Tolerance: the 2-process run sees the same global batch (2 x 4 blocks vs 1 x 8) in the same order, in
fp32; only the order of the gradient summation differs (an all-reduce of two half-batch means), which
changes results by float32 rounding, ~1e-7 relative per step. 1e-5 relative on the losses after 10 steps
leaves room for that and still fails on any real difference (a wrong batch, a missed all-reduce or a
different learning-rate schedule moves the loss by > 1e-3).
"""

import json
import subprocess
import sys

import pytest
from conftest import TINY_RUN

TOLERANCE = 1e-5
RUN = [*TINY_RUN, "--bf16", "False", "--max_steps", "10", "--eval_strategy", "no", "--save_strategy", "no",
       "--logging_steps", "1", "--max_train_samples", "200", "--seed", "1"]  # fmt: skip


def launch(command: list[str], cwd) -> None:
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=cwd)
    assert result.returncode == 0, result.stderr[-4000:]


def losses(folder) -> tuple[list[float], float]:
    state = json.loads((folder / "trainer_state.json").read_text())
    train = [entry["loss"] for entry in state["log_history"] if "loss" in entry]
    return train, json.loads((folder / "eval_results.json").read_text())["eval_nats_per_token"]


def assert_close(single, multi):
    (train_a, eval_a), (train_b, eval_b) = losses(single), losses(multi)
    assert len(train_a) == len(train_b) == 10
    for a, b in [*zip(train_a, train_b, strict=True), (eval_a, eval_b)]:
        assert abs(a - b) <= TOLERANCE * abs(a), (a, b)


@pytest.fixture(scope="module")
def single_process(tmp_path_factory):
    out = tmp_path_factory.mktemp("single")
    launch([sys.executable, "-m", "minirope.training.pretrain", *RUN, "--per_device_train_batch_size", "8",
            "--output_dir", str(out)], out)  # fmt: skip
    return out


def test_torchrun_two_processes_match_one(single_process, tmp_path):
    launch([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m",
            "minirope.training.pretrain", *RUN, "--per_device_train_batch_size", "4", "--output_dir",
            str(tmp_path)], tmp_path)  # fmt: skip
    assert_close(single_process, tmp_path)


def test_accelerate_launch_fine_tuning_runs_on_two_processes(tiny_pretrained, tmp_path):
    launch([sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "--cpu", "-m",
            "minirope.training.finetune", "--model_name_or_path", str(tiny_pretrained), "--play", "the-tempest",
            "--max_steps", "4", "--per_device_train_batch_size", "2", "--torch_compile", "False",
            "--output_dir", str(tmp_path / "out")], tmp_path)  # fmt: skip
    summary = json.loads((tmp_path / "out" / "run_summary.json").read_text())
    assert summary["steps"] == 4
    assert summary["after"]["eval_nats_per_token"] < summary["before"]["eval_nats_per_token"]
