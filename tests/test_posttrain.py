"""`minirope-posttrain`: each method runs a few steps of TRL's trainer on a tiny model and writes a folder that
`AutoModelForCausalLM` loads and generates from; TRL's own `trl grpo` command takes minirope's reward by import path;
the pieces (prompts, pairs, interpolation, the corpus loss) against what they promise."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

pytest.importorskip("trl")
pytestmark = pytest.mark.client

from minirope.training.verse import training_prompts, validation_headers  # noqa: E402

from minirope.commands import posttrain  # noqa: E402
from minirope.training.corpus import VALIDATION_PLAYS, shakespeare_dataset  # noqa: E402
from minirope.training.posttraining import interpolate_weights, own_pairs, read_pairs  # noqa: E402

# A few steps at the tiny model's size: 2 prompts x 2 completions of 8 tokens a step, 2 x 2 samples measured.
TINY_POST = [
    "--max_steps", "2", "--num_prompts", "8", "--eval_prompts", "2", "--eval_samples_per_prompt", "2",
    "--eval_max_new_tokens", "8", "--logging_steps", "1",
]  # fmt: skip
TINY_GRPO = ["--per_device_train_batch_size", "4", "--num_generations", "2", "--max_completion_length", "8"]
# A reward with spread on a tiny model's text (its lines never scan): longer completions score higher.
LENGTH_REWARD = "def length_reward(completions, **kwargs):\n    return [float(len(c)) for c in completions]\n"


def loads_and_generates(folder: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    out = model.generate(**tokenizer("ROMEO:\n", return_tensors="pt"), max_new_tokens=4, do_sample=False)
    assert out.shape[1] > 1
    assert (folder / "modeling_minirope.py").is_file() and (folder / "README.md").is_file()


def summary(folder: Path) -> dict:
    return json.loads((folder / "run_summary.json").read_text())


def test_grpo_with_the_corpus_loss_and_interpolation_writes_a_model_that_loads(tiny_pretrained, tmp_path):
    out = tmp_path / "grpo"
    result = posttrain.run([
        "--method", "grpo", "--model_name_or_path", str(tiny_pretrained), "--output_dir", str(out), *TINY_POST,
        *TINY_GRPO, "--lm_coef", "0.5", "--lm_batch_size", "2", "--weight_interpolation", "0.5",
    ])  # fmt: skip
    loads_and_generates(out)
    written = summary(out)
    assert written["steps"] == 2 and written["method"] == "grpo" and written["reward_funcs"] == ["scansion_reward"]
    for side in ("before", "after"):
        assert written[side]["lines"] > 0 and 0 <= written[side]["scan_share"] <= 1
        assert 0 < written[side]["distinct_share"] <= 1 and 0 < written[side]["validation_bits_per_byte"] < 20
    assert result["after"] == written["after"]
    assert len(written["samples"]) == 2 and written["samples"][0]["prompt"].endswith(":\n")
    card = (out / "README.md").read_text()
    assert "minirope-posttrain" in card and "GRPOTrainer" in card and "scan" in card
    logged = json.loads((out / "trainer_state.json").read_text())["log_history"]
    assert any("rewards/scansion_reward/mean" in entry for entry in logged)  # TRL's loop ran with minirope's reward


def test_dpo_builds_pairs_from_its_own_samples_and_writes_them(tiny_pretrained, tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(LENGTH_REWARD)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "dpo"
    posttrain.run([
        "--method", "dpo", "--model_name_or_path", str(tiny_pretrained), "--output_dir", str(out), *TINY_POST,
        "--reward_funcs", "my_rewards.length_reward", "--samples_per_prompt", "3", "--per_device_train_batch_size", "2",
        "--max_length", "32",
    ])  # fmt: skip
    loads_and_generates(out)
    pairs = [json.loads(line) for line in (out / "preference_pairs.jsonl").read_text().splitlines()]
    assert pairs and all(len(pair["chosen"]) > len(pair["rejected"]) for pair in pairs)  # ranked by the reward
    assert {pair["prompt"] for pair in pairs} <= set(training_prompts(8, seed=42))  # TrainingArguments.seed
    assert summary(out)["steps"] == 2


def test_dpo_trains_on_a_preference_file(tiny_pretrained, tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    row = {"prompt": "ROMEO:\n", "chosen": "But soft, what light through yonder window breaks?\n", "rejected": "No.\n"}
    pairs.write_text("".join(json.dumps(row) + "\n" for _ in range(4)))
    out = tmp_path / "dpo-file"
    posttrain.run([
        "--method", "dpo", "--model_name_or_path", str(tiny_pretrained), "--output_dir", str(out), *TINY_POST,
        "--train_file", str(pairs), "--per_device_train_batch_size", "2", "--max_length", "32",
    ])  # fmt: skip
    loads_and_generates(out)
    assert not (out / "preference_pairs.jsonl").exists()  # the user's pairs are used as given
    logged = json.loads((out / "trainer_state.json").read_text())["log_history"]
    assert any("rewards/chosen" in entry for entry in logged)  # DPO's implicit rewards: TRL's loop ran


def test_distillation_from_a_teacher_writes_a_model_that_loads(tiny_pretrained, tmp_path):
    out = tmp_path / "distill"
    posttrain.run([
        "--method", "distill", "--model_name_or_path", str(tiny_pretrained), "--output_dir", str(out), *TINY_POST,
        "--teacher_model_name_or_path", str(tiny_pretrained), "--per_device_train_batch_size", "2",
        "--max_completion_length", "8",
    ])  # fmt: skip
    loads_and_generates(out)
    written = summary(out)
    assert written["teacher"] == str(tiny_pretrained) and written["reward_funcs"] == []


def test_trl_grpo_cli_runs_minirope_reward_on_a_minirope_folder(tiny_pretrained, tmp_path):
    """TRL's own command line, with minirope's reward by import path and prompts from a local dataset folder."""
    data = tmp_path / "prompts"
    data.mkdir()
    (data / "train.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in training_prompts(8)))
    trl = Path(sys.executable).parent / "trl"
    command = [
        str(trl), "grpo", "--model_name_or_path", str(tiny_pretrained), "--dataset_name", str(data),
        "--reward_funcs", "minirope.rewards.scansion_reward", "--output_dir", str(tmp_path / "out"),
        "--max_steps", "2", "--per_device_train_batch_size", "4", "--num_generations", "2",
        "--max_completion_length", "8", "--bf16", "False", "--report_to", "none", "--save_strategy", "no",
        "--trust_remote_code", "True", "--logging_steps", "1",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rewards/scansion_reward/mean" in result.stdout + result.stderr
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out", trust_remote_code=True)
    assert type(model).__name__ == "MiniRopeForCausalLM"


def test_prompts_come_from_the_training_plays_and_headers_from_the_validation_plays():
    prompts = training_prompts(64, seed=1)
    assert len(prompts) == 64 and prompts == training_prompts(64, seed=1) != training_prompts(64, seed=2)
    assert all(prompt.split("\n")[0].endswith(":") and prompt.endswith("\n") for prompt in prompts)
    assert sum(prompt.count("\n") == 2 for prompt in prompts) == 32  # half with the speech's first line
    validation = "".join(shakespeare_dataset()["validation"]["text"])
    training = "".join(shakespeare_dataset()["train"]["text"])
    assert all(prompt.split("\n", 1)[1] in training for prompt in prompts)
    headers = validation_headers(16)
    assert len(set(headers)) == 16 and all(f"\n{header}" in validation for header in headers)
    assert len(VALIDATION_PLAYS) == 4


def test_interpolate_weights_moves_each_parameter_part_of_the_way():
    model = torch.nn.Linear(3, 2)
    start = {name: torch.zeros_like(param) for name, param in model.named_parameters()}
    tuned = {name: param.detach().clone() for name, param in model.named_parameters()}
    interpolate_weights(model, start, 0.25)
    for name, param in model.named_parameters():
        torch.testing.assert_close(param, 0.25 * tuned[name])


def test_own_pairs_keep_only_prompts_whose_samples_differ_in_reward(tiny_pretrained):
    model = AutoModelForCausalLM.from_pretrained(tiny_pretrained)
    tokenizer = AutoTokenizer.from_pretrained(tiny_pretrained)
    flat = own_pairs(model, tokenizer, ["ROMEO:\n"], 4, lambda completions, **kw: [0.0] * len(completions), 0, 8)
    assert flat == []  # no preference without a difference
    lengths = lambda completions, **kw: [len(c) for c in completions]  # noqa: E731
    ranked = own_pairs(model, tokenizer, ["ROMEO:\n"], 4, lengths, 0, 8)
    assert len(ranked) == 1 and len(ranked[0]["chosen"]) > len(ranked[0]["rejected"])
    spread = len(ranked[0]["chosen"]) - len(ranked[0]["rejected"])
    assert own_pairs(model, tokenizer, ["ROMEO:\n"], 4, lengths, 0, 8, margin=spread) == ranked
    assert own_pairs(model, tokenizer, ["ROMEO:\n"], 4, lengths, 0, 8, margin=spread + 1) == []


def test_read_pairs_names_the_row_without_a_field(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps({"prompt": "a", "chosen": "b", "rejected": "c"}) + "\n" + json.dumps({"prompt": "a"}))
    with pytest.raises(ValueError, match="line 2 has no 'chosen' text"):
        read_pairs(str(path))
