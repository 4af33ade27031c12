"""Every benchmark and example script runs at a tiny size, as its user would start it (a subprocess from the
project root), and writes what it says: a refactor that breaks one fails here, not after a user's hour of training.

bench_speed.py, gpu.py and fused_loss.py have their own tests (test_benchmarks.py); evals/shakespeare.py is run by
the real lm-eval CLI (test_lm_eval.py).
"""

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY_RUN

ROOT = Path(__file__).parent.parent
# The tiny model's shape, for scripts that take pretraining flags.
TINY_SHAPE = TINY_RUN[: TINY_RUN.index("--tokenizer_vocab_size")]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_script(script: str, *args: str, timeout: int = 300) -> str:
    """Run `script` from the project root; its stdout, or a failure with its stderr's tail."""
    command = [sys.executable, script, *map(str, args)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(command)} exited {result.returncode}:\n{result.stderr[-4000:]}"
    return result.stdout


def test_rope_plots(tmp_path):
    printed = run_script("benchmarks/rope_plots.py", "--out", tmp_path)
    for name in ("rope_wavelengths.png", "rope_long_term_decay.png", "rope_cos_sin_cache.png"):
        assert (tmp_path / name).stat().st_size > 1000, name
    assert printed.strip()


def test_scaling_plan_prints_the_table_docs_clusters_shows():
    printed = run_script("benchmarks/scaling_plan.py")
    rows = [line for line in printed.splitlines() if line.startswith("|")]
    assert len(rows) == 5 and "| default (make demo) | 1.15M | 256 |" in printed  # the make demo model's shape
    page = (ROOT / "docs" / "clusters.md").read_text()
    assert all(row in page for row in rows), "docs/clusters.md's table is not what scaling_plan.py prints"


@pytest.mark.slow  # a benchmark's smoke run (~14 s); minirope-pretrain itself runs in test_pretrain_e2e.py
def test_recipe_runs_a_pretraining_and_records_it(tmp_path):
    results, flags = tmp_path / "recipe.json", " ".join(TINY_RUN)
    printed = run_script("benchmarks/recipe.py", f"budget-tiny@6:{flags}", "--results", results, "--plots", tmp_path)
    record = json.loads(results.read_text())["budget-tiny@6"]
    assert record["steps"] == 6 and 0 < record["bits_per_byte"] < 10
    assert record["model_flops"] > 0  # the budget plot's axis: model FLOPs, as minirope-pretrain reports them
    assert (tmp_path / "recipe_wall_time.png").is_file() and (tmp_path / "recipe_budget.png").is_file()
    assert "budget-tiny@6" in printed


@pytest.mark.slow  # 5 pretraining processes (~50 s); test_stream.py covers streaming itself in the default run
def test_streaming_benchmark(tmp_path):
    out = tmp_path / "streaming.json"
    run_script(
        "benchmarks/streaming.py", "--dir", tmp_path / "corpora", "--out", out, "--sections", "corpora",
        "--scale", "0.0001", "--steps", "2", "--pretrain_flags", " ".join([*TINY_SHAPE, "--bf16", "False"]),
    )  # fmt: skip
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 5 and all(row["peak_rss_mb"] > 0 for row in rows)


@pytest.mark.slow  # four models trained and scored (~30 s); test_extend.py and test_rope.py cover the code
def test_context_extension(tmp_path):
    printed = run_script(
        "benchmarks/context_extension.py", "--context", "16", "--max_steps", "2", "--batch_size", "2",
        "--eval_tokens", "256", "--out", tmp_path,
    )  # fmt: skip
    report = json.loads((tmp_path / "context_extension.json").read_text())
    assert {"rope, no scaling", "rope + YaRN", "nope", "learned absolute"} <= set(report["bits_per_byte"])
    assert (tmp_path / "context_extension.png").is_file() and "| model, inference |" in printed


@pytest.mark.slow  # the context-extension benchmark (~16 s); test_extend.py covers the code it runs
def test_long_context(tmp_path, tiny_pretrained):
    printed = run_script(
        "benchmarks/long_context.py", "--base", tiny_pretrained, "--factors", "2", "--types", "yarn", "--seeds", "1",
        "--max_steps", "1", "--eval_document_tokens", "64", "--out", tmp_path / "long_context",
    )  # fmt: skip
    assert "yarn-2-1" in json.loads((tmp_path / "long_context.json").read_text())
    assert "yarn" in printed


@pytest.mark.slow  # a benchmark's smoke run (~16 s); test_export.py runs llama.cpp and onnxruntime themselves
@pytest.mark.client
def test_exports_benchmark(tmp_path, tiny_pretrained):
    pytest.importorskip("llama_cpp")  # the script's clients: llama.cpp and onnxruntime
    pytest.importorskip("onnxruntime")
    pytest.importorskip("executorch")
    printed = run_script("benchmarks/exports.py", "--model", tiny_pretrained, "--output", tmp_path, "--executorch",
                         "--prompt", "ROMEO:\n", "JULIET:\n")  # fmt: skip
    record = json.loads((tmp_path / "exports.json").read_text())
    assert record["command"].startswith("benchmarks/exports.py --model") and list(record["generate"]) == [
        "ROMEO:\n",
        "JULIET:\n",
    ]
    rows = {row["export"].split(" (")[0]: row for row in record["rows"]}
    assert list(rows) == ["to_llama", "onnx", "gguf f32", "gguf f16", "gguf q8_0", "executorch f32", "executorch 8da8w"]
    for name in ("to_llama", "onnx", "gguf f32", "executorch f32"):  # float32 forms: the same logits
        assert rows[name]["max_abs_logit_difference"] < 1e-4, printed
    assert all(rows[name]["greedy_identical"] == [True, True] for name in ("onnx", "gguf f32", "executorch f32")), (
        printed
    )


def test_classify_plays(tmp_path, tiny_pretrained):
    printed = run_script(
        "examples/classify_plays.py", "--model", tiny_pretrained, "--output_dir", tmp_path, "--max_length", "32",
        "--max_steps", "2", "--per_device_train_batch_size", "8", "--eval_strategy", "no", "--save_strategy", "no",
        "--report_to", "none", "--use_cpu", "True",
    )  # fmt: skip
    assert "accuracy" in printed


@pytest.mark.client
@pytest.mark.slow  # SFT on conversations, then served (~22 s); test_chat.py checks both in the default run
def test_shakespeare_chat(tmp_path, tiny_pretrained):
    printed = run_script(
        "examples/shakespeare_chat.py", "--model", tiny_pretrained, "--output_dir", tmp_path / "chat",
        "--data_dir", tmp_path / "data", "--max_steps", "2", "--port", free_port(),
    )  # fmt: skip
    assert "assistant-turn loss on held-out plays" in printed and printed.count("[assistant]") == 3


@pytest.mark.slow  # ~45 s: pretraining and GRPO end to end; the posttrain tests cover a user's task by default
def test_arithmetic_example_pretrains_and_posttrains_on_its_own_data(tmp_path):
    printed = run_script(
        "examples/arithmetic/arithmetic.py", "--output_dir", tmp_path, "--small", "--methods", "grpo", timeout=600
    )
    report = json.loads((tmp_path / "arithmetic.json").read_text())
    before = report["results"]["grpo"]["before"]
    assert set(before["rewards_greedy"]) == {"exact_match", "first_number"} and before["prompts"] == 4
    assert "| grpo |" in printed
    summary = json.loads((tmp_path / "grpo" / "run_summary.json").read_text())
    assert summary["corpus_term"]["lm_coef"] == 0.0 and "pretrain.jsonl" in summary["corpus_term"]["source"]


def test_the_arithmetic_rewards_pay_only_an_answer_that_ends(monkeypatch):
    """The example's rewards, called as TRL calls them: the exact answer alone (spaces aside) earns 1; a right
    number followed by more text, a wrong number or no number earns 0 (the loophole of a policy that runs on);
    first_number, the measure of the arithmetic alone, reads the first number whatever follows."""
    monkeypatch.syspath_prepend(str(ROOT / "examples" / "arithmetic"))
    import arithmetic_rewards as rewards

    completions = [" 85", "85", "85 What is 12 + 3?", "86", "105", "", [{"role": "assistant", "content": "85 "}]]
    solution = ["85"] * len(completions)
    assert rewards.exact_match(completions, solution=solution, prompts=["What is 37 + 48?"] * 7) == [
        1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0,
    ]  # fmt: skip
    assert rewards.first_number(completions, solution=solution) == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0]


@pytest.mark.slow  # 25 s on a 2-core Zen 4: in `make test-slow`, to keep the default run under 15 minutes
def test_post_training_records_runs_interpolates_and_plots(tmp_path, tiny_pretrained):
    pytest.importorskip("trl")
    small = "--max_steps 1 --num_prompts 4 --eval_prompts 1 --num_generations_eval 2 --eval_max_new_tokens 8"
    grpo = f"tiny:--method grpo {small} --per_device_train_batch_size 2 --num_generations 2 --max_completion_length 8"
    common = [
        "--results",
        tmp_path / "post.json",
        "--plot_path",
        tmp_path / "frontier.png",
        "--runs_dir",
        tmp_path / "runs",
        "--eval_prompts",
        "1",
        "--num_generations_eval",
        "2",
        "--eval_max_new_tokens",
        "8",
    ]
    printed = run_script(
        "benchmarks/post_training.py",
        grpo,
        "--base",
        tiny_pretrained,
        "--interpolate",
        "tiny",
        "--alphas",
        "0.5",
        *common,
    )
    assert "tiny:" in printed and "0.5:" in printed
    record = json.loads((tmp_path / "post.json").read_text())["tiny"]
    assert record["steps"] == 1 and record["machine"]["trl"] and record["process_seconds"] > 0
    assert 0 <= record["interpolation"]["0.5"]["scan_share"] <= 1
    assert (tmp_path / "frontier.png").stat().st_size > 1000


@pytest.mark.client
@pytest.mark.slow  # a benchmark's smoke run (~40 s on a Zen 3); the arithmetic example below pretrains and post-trains
def test_user_tasks_benchmark_pretrains_on_a_task_and_runs_grpo_with_its_flags(tmp_path):
    """benchmarks/user_tasks.py at a tiny size: the task's text and `datasets` folder written, a model pretrained on
    the text, GRPO with the reward module it writes beside them; one row appended with the measures and the machine."""
    flags = ["--max_steps", "2", "--per_device_train_batch_size", "4", "--num_generations", "2",
             "--max_completion_length", "8", "--eval_prompts", "4", "--num_generations_eval", "2",
             "--eval_max_new_tokens", "8"]  # fmt: skip
    run_script("benchmarks/user_tasks.py", "--output_dir", tmp_path, "--tasks", "max", "--size", "tiny", "--flags",
               *flags)  # fmt: skip
    (row,) = [json.loads(line) for line in (tmp_path / "user_tasks.jsonl").read_text().splitlines()]
    assert (row["task"], row["size"], row["steps"]) == ("max", "tiny", 2) and 0 <= row["before"] <= 1
    assert row["cpu"] and row["torch"] and row["trl"] and "held-out" in row["gained"]
    assert (tmp_path / "max" / "pretrain.txt").read_text().startswith("max ")


@pytest.mark.client
def test_quantization_benchmark_measures_each_form_it_is_given(tmp_path, tiny_pretrained):
    pytest.importorskip("torchao")  # the forms' libraries: torchao, and llama.cpp for GGUF
    pytest.importorskip("llama_cpp")
    forms = ["float32", "torchao int8 weight-only", "GGUF q4_0"]
    printed = run_script(
        "benchmarks/quantization.py", "--model", tiny_pretrained, "--output", tmp_path / "q.json", "--max_windows", "2",
        "--forms", *forms,
    )  # fmt: skip
    rows = json.loads((tmp_path / "q.json").read_text())["rows"]
    assert [row["form"] for row in rows] == forms and all(form in printed for form in forms)
    assert all(row["tokens_per_second"] > 0 and 0 < row["bits_per_byte"] < 20 for row in rows)
    assert rows[1]["bytes"] < rows[0]["bytes"] and rows[2]["bytes"] < rows[1]["bytes"]
