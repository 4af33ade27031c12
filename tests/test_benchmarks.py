"""The GPU, fused-loss and CPU speed benchmarks run end to end (on CPU, small shapes) and write what they print."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).parent.parent / "benchmarks"


def test_gpu_benchmark_runs_on_cpu_and_writes_every_row(tmp_path):
    output = tmp_path / "gpu.json"
    command = [sys.executable, str(BENCHMARKS / "gpu.py"), "--sizes", "tiny", "--steps", "2", "--warmup", "1",
               "--rounds", "1", "--new_tokens", "3", "--no_compile", "--attention", "sdpa", "--output", str(output),
               "--scratch", str(tmp_path / "scratch")]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads(output.read_text())
    device = f"{torch.cuda.get_device_name()}, CUDA {torch.version.cuda}" if torch.cuda.is_available() else "CPU"
    assert record["device"] == device and record["matmul_peak_tflops"] > 0  # where a GPU is, the script takes it
    assert record["command"] == f"benchmarks/gpu.py {' '.join(command[2:])}"  # the row says what wrote it
    (training,) = record["training"]
    assert training["minirope"]["tokens_per_s"] > 0 and training["llama"]["tokens_per_s"] > 0
    assert 0 < training["minirope"]["mfu"] < 1
    assert {(row["attention"], row["batch"]) for row in record["generation"]} == {
        ("sdpa", 1), ("sdpa", 8), ("eager", 1), ("eager", 8)
    }  # fmt: skip
    assert "| tiny | sdpa | no | no |" in result.stdout


@pytest.mark.slow  # 37 s on a 2-core Zen 4: in `make test-slow`, for the default run's time
def test_fused_loss_benchmark_compares_with_llama(tmp_path):
    command = [sys.executable, str(BENCHMARKS / "fused_loss.py"), "--vocab", "512", "--reps", "1",
               "--output", str(tmp_path / "loss.json")]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    (row,) = json.loads((tmp_path / "loss.json").read_text())["rows"]
    assert row["vocab"] == 512 and row["minirope"]["seconds"] > 0 and row["llama"]["peak_rise_mib"] >= 0


@pytest.mark.slow  # 54 s on a 2-core Zen 4: in `make test-slow`, for the default run's time
def test_speed_benchmark_compares_the_default_model_with_llama(tmp_path):
    output = tmp_path / "speed.json"
    command = [sys.executable, str(BENCHMARKS / "bench_speed.py"), "--sizes", "default", "--reps", "1",
               "--skip_compile", "--skip_memory", "--skip_scaling", "--out", str(output),
               "--rows", str(tmp_path / "rows.jsonl")]  # fmt: skip
    env = {**os.environ, "MINIROPE_CACHE": str(tmp_path)}  # the measured matmuls' decisions stay here
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads(output.read_text())
    assert record["float32_peak_gflops"] > 0 and record["cpu"]
    cases = {row["case"]: row for row in record["cases"]}
    assert {"train default fp32 8x256", "greedy decode default fp32 batch 1, dynamic cache"} <= set(cases)
    assert all(row["minirope"] > 0 and row["llama"] > 0 and row["ratio"] > 0 for row in cases.values())
    assert "| train default fp32 8x256 | 1.1M |" in result.stdout
    assert all(row["mm_us"] > 0 and row["onednn_us"] > 0 for row in record["linear"])
    (line,) = (tmp_path / "rows.jsonl").read_text().splitlines()  # this machine's row, for the per-CPU table
    row = json.loads(line)
    assert row["cpu"] == record["cpu"] and row["torch"] == torch.__version__
    assert row["ratios"] == {name: round(case["ratio"], 3) for name, case in cases.items()}
    assert "greedy decode default fp32 batch 1, measured matmuls" in row["ratios"]


@pytest.mark.client
@pytest.mark.slow  # ~25 s: both sides for a step; `trl grpo` on a minirope folder is checked by default
def test_posttrain_speed_runs_trl_and_minirope_side_by_side_for_one_step(tiny_pretrained, tmp_path):
    """`benchmarks/posttrain_speed.py` on the tiny model for one step: both sides train in their own process, and
    the row names the machine, both times, both peak resident sets and their ratios."""
    pytest.importorskip("trl")
    output = tmp_path / "speed.jsonl"
    command = [sys.executable, str(BENCHMARKS / "posttrain_speed.py"), "--model", str(tiny_pretrained), "--steps", "1",
               "--max_completion_length", "4", "--output", str(output),
               "--minirope_flags=--eval_prompts 4 --num_generations_eval 2 --sft_steps 0"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = [json.loads(line) for line in output.read_text().splitlines()]
    assert row["trl_defaults"]["train_seconds"] > 0 and row["minirope"]["train_seconds"] > 0
    assert row["trl_defaults"]["gradient_checkpointing"] and row["trl_defaults"]["bf16"]  # TRL's own defaults
    assert row["train_time_ratio"] > 0 and 0 < row["peak_rss_ratio"] and row["machine"]["torch"]
    assert row["command"].startswith("benchmarks/posttrain_speed.py") and "minirope / TRL" in done.stdout


@pytest.mark.parametrize("method", ["grpo", "distill"])
def test_released_task_benchmark_refuses_trl_defaults_for_a_model_it_does_not_size(tiny_pretrained, tmp_path, method):
    """`--trl_defaults` runs TRL's side (GRPO, or with a teacher distillation) at the batch and steps minirope sizes
    for a released checkpoint; a model below that size is refused before any work, naming the method and the fix."""
    pytest.importorskip("trl")
    rows = tmp_path / "rows.jsonl"
    teacher = ["--teacher_model_name_or_path", str(tiny_pretrained)] if method == "distill" else []
    command = [sys.executable, str(BENCHMARKS / "released_task.py"), "--model", str(tiny_pretrained), "--output_dir",
               str(tmp_path / "runs"), "--seeds", "1", "--results", str(rows), "--trl_defaults", *teacher]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "--trl_defaults" in done.stderr and "released checkpoint" in done.stderr
    assert f"sizes {method} for" in done.stderr
    assert not rows.exists() and not (tmp_path / "runs" / "seed-1").exists()


@pytest.mark.slow  # 40 s on a 2-core Zen 3: in `make test-slow`, to keep the default run inside its time
@pytest.mark.client
@pytest.mark.parametrize("method", ["grpo", "distill"])
def test_released_task_benchmark_runs_a_seed_and_scores_it_on_the_other_problems(tiny_pretrained, tmp_path, method):
    """`benchmarks/released_task.py` on the tiny model, one seed of one step (GRPO with both rewards of its file, or
    distillation from a teacher): the row names the command, the machine, the seed, the teacher, both scores on the
    200 other problems, the run's measures, the time split and the peak resident set."""
    pytest.importorskip("trl")
    results = tmp_path / "rows.jsonl"
    small = ["--max_steps", "1", "--per_device_train_batch_size", "4", "--max_completion_length", "8",
             "--eval_prompts", "4", "--num_generations_eval", "2", "--eval_max_new_tokens", "8",
             "--require_reward_spread", "False", "--sft_steps", "0"]  # fmt: skip
    if method == "grpo":
        small += [
            "--num_generations",
            "2",
            "--reward_funcs",
            "largest_rewards.final_number",
            "largest_rewards.overlong",
        ]
    teacher = ["--teacher_model_name_or_path", str(tiny_pretrained)] if method == "distill" else []
    command = [sys.executable, str(BENCHMARKS / "released_task.py"), "--model", str(tiny_pretrained), *teacher,
               "--output_dir", str(tmp_path / "runs"), "--seeds", "1", "--results", str(results), "--flags",
               *small]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = [json.loads(line) for line in results.read_text().splitlines()]
    assert row["command"].startswith("benchmarks/released_task.py") and row["seed"] == 1 and row["flags"] == small
    assert row["other_problems"]["count"] == 200 and 0 <= row["other_problems"]["after"] <= 1
    assert set(row["held_out"]) == {"before", "after"} and row["steps"] == 1 and row["peak_rss_gb"] > 0
    assert row["time_split"]["total"] > 0 and row["machine"]["torch"] == torch.__version__
    assert row["teacher"] == (str(tiny_pretrained) if teacher else None)
    summary = json.loads((tmp_path / "runs" / "seed-1" / "run_summary.json").read_text())
    assert summary["method"] == method
    if method == "grpo":
        assert summary["reward_funcs"] == ["final_number", "soft_overlong_punishment_reward"]  # TRL's, by its name


@pytest.mark.slow  # the suite's default run is at its time limit on a 2-core Zen 3: in `make test-slow`
def test_lora_mfu_benchmark_times_full_and_lora_steps_and_counts_their_model_flops(tiny_pretrained, tmp_path):
    """`benchmarks/lora_mfu.py` on the tiny model with `--compile`: every case timed (the compiled one after its
    compilation, whose seconds the row keeps), LoRA's model FLOPs two thirds of a full step's (4N against 6N, the
    attention's alike), the row naming the command and the machine."""
    pytest.importorskip("peft")
    output = tmp_path / "rows.jsonl"
    command = [sys.executable, str(BENCHMARKS / "lora_mfu.py"), "--model", str(tiny_pretrained), "--rows", "4",
               "--tokens", "32", "--completion_tokens", "8", "--reps", "1", "--compile",
               "--output", str(output)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = [json.loads(line) for line in output.read_text().splitlines()]
    assert row["command"].startswith("benchmarks/lora_mfu.py") and row["machine"]["torch"] == torch.__version__
    cases = row["cases"]
    assert list(cases) == ["full", "lora (lora_dropout 0.05)", "lora (lora_dropout 0.05), torch.compile",
                           "lora (lora_dropout 0.05) + checkpointing", "lora (lora_dropout 0)"]  # fmt: skip
    assert all(case["seconds"] > 0 and 0 < case["mfu"] for case in cases.values()) and row["compile_seconds"] > 0
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_pretrained)
    weights = sum(layer.weight.numel() for layer in model.modules() if isinstance(layer, torch.nn.Linear))
    attention = row["flops_per_token"]["full"] - 6 * weights  # the attention's, alike in both
    assert 0 < attention < weights and row["flops_per_token"]["lora"] == pytest.approx(4 * weights + attention)


@pytest.mark.slow  # the suite's default run is at its time limit on a 2-core Zen 3: in `make test-slow`
def test_lora_heap_benchmark_reads_each_case_in_a_process_of_its_own(tiny_pretrained, tmp_path):
    """`benchmarks/lora_heap.py` on the tiny model, with glibc's threshold and a fixed one, the heap trimmed and not:
    four cases, each read from its own process (live bytes within the heap and mmapped blocks, so at most the resident
    peak), in the row."""
    pytest.importorskip("peft")
    output = tmp_path / "rows.jsonl"
    command = [sys.executable, str(BENCHMARKS / "lora_heap.py"), "--model", str(tiny_pretrained), "--reps", "1",
               "--targets", "all", "--mmap_thresholds", "0", "262144", "--trim_seconds", "0", "0.5",
               "--output", str(output)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = [json.loads(line) for line in output.read_text().splitlines()]
    assert row["command"].startswith("benchmarks/lora_heap.py") and row["machine"]["torch"] == torch.__version__
    cases = [(case["targets"], case["mmap_threshold"], case["trim_seconds"]) for case in row["cases"]]
    assert cases == [("every linear layer", 0, 0), ("every linear layer", 0, 0.5), ("every linear layer", 262144, 0),
                     ("every linear layer", 262144, 0.5)]  # fmt: skip
    assert "| every linear layer | glibc's own | every 0.5 s |" in done.stdout
    for case in row["cases"]:
        assert 0 < case["live_gb"] <= case["peak_rss_gb"] and 0 < case["heap_gb"] <= case["peak_rss_gb"], case
        assert case["step_seconds"] > 0


def results_rows(path: Path) -> list[dict]:
    """A results file's rows: a JSON-lines file's lines; a JSON file of named runs (each with its `flags`, as
    recipe.py and post_training.py keep them) its runs; any other JSON file, its one object."""
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    record = json.loads(path.read_text())
    runs = list(record.values())
    return runs if runs and all(isinstance(run, dict) and "flags" in run for run in runs) else [record]


def test_every_results_row_names_the_script_that_wrote_it():
    """Each row in benchmarks/results/ carries the `command` that wrote it: a script of this repository, or a
    target of its Makefile run in a fresh clone (`git clone ... && make demo`); the hand-assembled records live in
    benchmarks/results/history/, said so there."""
    targets = set(re.findall(r"^([a-z-]+):", (BENCHMARKS.parent / "Makefile").read_text(), re.MULTILINE))
    files = sorted((BENCHMARKS / "results").glob("*.json*"))
    assert len(files) >= 10
    for path in files:
        for row in results_rows(path):
            command = row.get("command", "")
            script = command.split(" ")[0]
            target = re.match(r"git clone \.\.\. && make ([a-z-]+)", command)
            from_script = script.startswith("benchmarks/") and (BENCHMARKS.parent / script).is_file()
            assert from_script or (target and target[1] in targets), (path.name, row)
