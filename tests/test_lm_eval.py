"""The real lm-evaluation-harness, run as users run it, agrees with the bits per byte the run reports."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY_RUN

from minirope.commands import pretrain
from minirope.data.bundled import shakespeare_dataset

EVALS = Path(__file__).parent.parent / "evals"


@pytest.mark.client
def test_lm_eval_bits_per_byte_equals_the_runs_own_evaluation(tmp_path):
    """Same documents (the four validation plays, each tokenized whole), same context (the model's
    max_position_embeddings = the run's block size). The window schemes differ by one token: lm-eval's
    windows predict `max_length` tokens each, the run's `block_size - 1` (the labels convention keeps the
    last position's logits unused), so each scored token has up to one token less context in the run."""
    pytest.importorskip("lm_eval")
    output_dir = tmp_path / "model"
    at = TINY_RUN.index("--max_eval_samples")
    run_args = TINY_RUN[:at] + TINY_RUN[at + 2 :]  # the whole validation split, evaluated once, at the end
    metrics = pretrain.run([*run_args, "--block_size", "64", "--max_steps", "60", "--eval_steps", "60",
                            "--output_dir", str(output_dir)])  # fmt: skip
    command = [
        str(Path(sys.executable).parent / "lm_eval"), "--model", "hf",
        "--model_args", f"pretrained={output_dir},trust_remote_code=True,dtype=float32",
        "--include_path", str(EVALS), "--tasks", "minirope_shakespeare", "--device", "cpu", "--batch_size", "32",
        "--output_path", str(tmp_path / "lm_eval"),
    ]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True, text=True, timeout=1200)
    results = json.loads(next((tmp_path / "lm_eval").rglob("results_*.json")).read_text())["results"]
    lm_eval_bits_per_byte = results["minirope_shakespeare"]["bits_per_byte,none"]
    assert abs(lm_eval_bits_per_byte - metrics["eval_bits_per_byte"]) < 0.01, (
        lm_eval_bits_per_byte,
        metrics["eval_bits_per_byte"],
    )
    plays = shakespeare_dataset()["validation"]["text"]
    assert metrics["eval_scored_bytes"] == sum(len(play.encode()) for play in plays)  # every byte, once
