"""A run killed with SIGKILL after a checkpoint resumes to the result of an uninterrupted run."""

import json
import signal
import subprocess
import sys
import time

import pytest
from conftest import ON_CPU, TINY_RUN

from minirope.commands import pretrain

# fp32 on the CPU for bit-level determinism; no periodic evaluation; a checkpoint every 10 of 120 steps.
RUN = [*TINY_RUN, *ON_CPU, "--bf16", "False", "--max_steps", "120", "--save_steps", "10", "--eval_strategy", "no",
       "--max_train_samples", "400", "--save_total_limit", "2", "--seed", "7"]  # fmt: skip


def kill_when_written(command: list[str], path) -> None:
    """Run `command` and SIGKILL it as soon as `path` exists (failing if it ends or 240 s pass first)."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while not path.exists():
        assert process.poll() is None and time.monotonic() < deadline, f"{path} was not written before the run ended"
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL


@pytest.mark.slow  # 17 s; the default run resumes a SIGKILLed run exactly through the Hub (tests/test_hub.py)
def test_sigkill_then_resume_matches_an_uninterrupted_run(tmp_path):
    want = pretrain.run([*RUN, "--output_dir", str(tmp_path / "uninterrupted")])

    out = tmp_path / "killed"
    kill_when_written([sys.executable, "-m", "minirope.commands.pretrain", *RUN, "--output_dir", str(out)],
                      out / "checkpoint-10" / "trainer_state.json")  # fmt: skip
    # the killed run left checkpoints, and no folder that looks like a finished model
    assert not (out / "config.json").exists() and not (out / "model.safetensors").exists()
    killed_at = json.loads((out / "checkpoint-10" / "trainer_state.json").read_text())["global_step"]
    assert killed_at < 120

    got = pretrain.run([*RUN, "--output_dir", str(out), "--resume_from_checkpoint", "last"])
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 120
    relative = abs(got["eval_nats_per_token"] - want["eval_nats_per_token"]) / want["eval_nats_per_token"]
    assert relative <= 1e-4, (got["eval_nats_per_token"], want["eval_nats_per_token"])
