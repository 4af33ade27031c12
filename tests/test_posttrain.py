"""`minirope-posttrain`: each method runs a few steps of TRL's trainer on a tiny model and writes a folder that
`AutoModelForCausalLM` loads and generates from; a user's task (a `datasets` folder with a `solution` column, a reward
from the working directory) is trained and measured without the bundled plays; the corpus term gives the same update
under gradient accumulation; TRL's own `trl grpo` command takes minirope's reward by import path; the pieces
(prompts, pairs, interpolation) against what they promise."""

import importlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from datasets import Dataset, DatasetDict, load_from_disk
from huggingface_hub import ModelCard
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

pytest.importorskip("trl")
pytestmark = pytest.mark.client

from trl import SFTTrainer  # noqa: E402

from minirope.commands import posttrain  # noqa: E402
from minirope.data.bundled import BUNDLED_CORPUS, VALIDATION_PLAYS, shakespeare_dataset  # noqa: E402
from minirope.posttraining import (  # noqa: E402
    corpus,
    setup,  # noqa: E402
    warm_start,
)
from minirope.posttraining.configs import PosttrainDPOConfig  # noqa: E402
from minirope.posttraining.corpus import interpolate_weights  # noqa: E402
from minirope.posttraining.measures import TaskMeasure  # noqa: E402
from minirope.posttraining.parsing import parse_args  # noqa: E402
from minirope.posttraining.reward_calls import own_pairs  # noqa: E402
from minirope.posttraining.sampling import (  # noqa: E402
    SAMPLING,
    lora_base_weights,
    lora_layers,
    mergeable,
    merged_adapter,
    sample,
)
from minirope.posttraining.setup import prepare  # noqa: E402
from minirope.posttraining.tasks.verse import training_prompts, validation_headers  # noqa: E402
from minirope.training.heap import malloc_trim  # noqa: E402

# the warm start's SFTConfig flags in recipes/grpo.yaml and dpo.yaml
WARM_RECIPE = {
    "lm_coef": 0.5,
    "per_device_train_batch_size": 8,
    "learning_rate": 3e-4,
    "lr_scheduler_type": "cosine",
    "warmup_steps": 5,
}
# A few steps at the tiny model's size: 2 prompts x 2 completions of 8 tokens a step, 2 x 2 samples measured, a
# warm start of 2 steps.
TINY_POST = [
    "--max_steps", "2", "--num_prompts", "8", "--eval_prompts", "2", "--num_generations_eval", "2",
    "--eval_max_new_tokens", "8", "--logging_steps", "1", "--sft_steps", "2", "--keep_last", "True",
]  # fmt: skip
TINY_GRPO = ["--per_device_train_batch_size", "4", "--num_generations", "2", "--max_completion_length", "8"]
# A reward with spread on a tiny model's text (its lines never scan): longer completions score higher.
LENGTH_REWARD = "def length_reward(completions, **kwargs):\n    return [float(len(c)) for c in completions]\n"
# A user's task: rows with a `solution` column, and a reward that reads it (TRL passes columns as keyword arguments).
SOLUTION_REWARD = (
    "def starts_right(prompts, completions, solution, **kwargs):\n"
    "    assert len(prompts) == len(completions) == len(solution)\n"
    "    return [float(c.strip().startswith(s)) + len(c) / 100 for c, s in zip(completions, solution)]\n"
)


@pytest.fixture(scope="module")
def tiny_post(tmp_path_factory) -> list[str]:
    """`TINY_POST` with 20 kB of a validation play for the bits per byte measured before, after the warm start and
    after the method, instead of the four bundled validation plays three times a run."""
    validation = tmp_path_factory.mktemp("validation") / "validation.txt"
    validation.write_text(shakespeare_dataset()["validation"]["text"][0][:20_000])
    return [*TINY_POST, "--lm_validation_file", str(validation)]


def loads_and_generates(folder: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    out = model.generate(**tokenizer("ROMEO:\n", return_tensors="pt"), max_new_tokens=4, do_sample=False)
    assert out.shape[1] > 1
    assert (folder / "modeling_minirope.py").is_file() and (folder / "README.md").is_file()


def summary(folder: Path) -> dict:
    return json.loads((folder / "run_summary.json").read_text())


def test_grpo_with_a_warm_start_the_corpus_loss_and_interpolation_writes_a_model_that_loads(
    tiny_post, tiny_pretrained, tmp_path, monkeypatch, capsys
):
    """The warm start (TRL's SFTTrainer on the verse task's demonstrations) moves the weights before GRPO, and GRPO's
    KL term is taken against the warm-started model (TRL loads its reference from the path the model's config
    names), not against the folder the run started from. The corpus term takes part in the warm start's updates, on
    the blocks the method then takes: the text is tokenized once."""
    seen, add_corpus, training_blocks = {"tokenized": 0}, corpus.add_corpus, corpus.training_blocks

    def spy(trainer, *args):  # called once the method's trainer is built, before it trains
        seen["model"] = {name: value.to("cpu", copy=True) for name, value in trainer.model.state_dict().items()}
        seen["reference"] = {name: value.to("cpu", copy=True) for name, value in trainer.ref_model.state_dict().items()}
        add_corpus(trainer, *args)

    def warm_spy(trainer, *args):
        seen["warm_start"] = trainer
        add_corpus(trainer, *args)

    def blocks_spy(*args):
        seen["tokenized"] += 1
        return training_blocks(*args)

    monkeypatch.setattr(setup, "add_corpus", spy)
    monkeypatch.setattr(warm_start, "add_corpus", warm_spy)
    monkeypatch.setattr(corpus, "training_blocks", blocks_spy)
    out = tmp_path / "grpo"
    result = posttrain.run([
        "--method", "grpo", "--model_name_or_path", str(tiny_pretrained), "--output_dir", str(out), *tiny_post,
        *TINY_GRPO, "--lm_coef", "0.5", "--sft_config", '{"lm_coef": 1, "lr_scheduler_type": "constant"}',
        "--lm_batch_size", "2", "--weight_interpolation", "0.5",
        "--beta", "0.04",  # a KL term (the default is 0): its reference model is the warm-started one
    ])  # fmt: skip
    printed = capsys.readouterr().out
    assert ("heap's freed pages handed back to the system every 1 s" in printed) == (malloc_trim() is not None)
    loads_and_generates(out)
    start = load_file(tiny_pretrained / "model.safetensors")
    assert all(torch.equal(seen["reference"][name], seen["model"][name]) for name in start)
    assert not all(torch.equal(seen["model"][name], start[name]) for name in start)  # the warm start moved them
    written = summary(out)
    assert written["warm_start"]["steps"] == 2 and "iambic lines" in written["warm_start"]["data"]
    assert written["warm_start"]["batch_size"] == 8 and written["warm_start"]["lm_coef"] == 1
    assert seen["warm_start"].lm_coef == 1 and seen["tokenized"] == 1
    assert seen["warm_start"].args.lr_scheduler_type == "constant"  # --sft_config's SFTConfig flag, over minirope's
    warm_logged = seen["warm_start"].state.log_history
    assert isinstance(seen["warm_start"], SFTTrainer) and sum("lm_loss" in entry for entry in warm_logged) == 2
    assert written["warm_start"]["after"]["lines"] > 0 and written["warm_start"]["after"]["validation_bits_per_byte"]
    assert "SFTTrainer" in (out / "README.md").read_text() and "sft" in ModelCard.load(out / "README.md").data.tags
    assert written["steps"] == 2 and written["method"] == "grpo"
    assert written["reward_funcs"] == ["meter_reward", "word_variety_reward"]  # the verse task's defaults
    assert written["task"] == "verse" and written["recipe"]["path"].endswith("verse/grpo.yaml")
    assert written["recipe"]["values"]["learning_rate"] == 6e-4 and "beta" not in written["recipe"]["values"]
    assert written["settings"]["learning_rate"] == {"value": 6e-4, "source": "recipe"}
    assert written["settings"]["beta"] == {"value": 0.04, "source": "command line"}
    assert written["settings"]["sft_config"]["value"] == {**WARM_RECIPE, "lm_coef": 1, "lr_scheduler_type": "constant"}
    assert written["settings"]["sft_config"]["sources"] == {
        **dict.fromkeys(WARM_RECIPE, "method recipe"), "lm_coef": "command line", "lr_scheduler_type": "command line"
    }  # fmt: skip
    assert written["warm_start"]["learning_rate"] == seen["warm_start"].args.learning_rate == 3e-4  # the recipe's
    assert written["reward_weights"] == [1.0, 1.5] and written["beta"] == 0.04  # its weights; the flag given
    for side in ("before", "after"):
        assert written[side]["lines"] > 0 and 0 <= written[side]["scan_share"] <= 1
        assert 0 < written[side]["distinct_share"] <= 1 and 0 < written[side]["validation_bits_per_byte"] < 20
        assert 0 <= written[side]["rewards_sampled"]["meter_reward"] <= 1
        assert 0 <= written[side]["iambic_share"] <= written[side]["scan_share"]
    assert result["after"] == written["after"]
    assert len(written["samples"]) == 2 and written["samples"][0]["before"]["prompt"].endswith(":\n")
    assert written["corpus_term"]["lm_coef"] == 0.5 and BUNDLED_CORPUS in written["corpus_term"]["source"]
    split = written["time_split"]  # how the run's time went, every part but the writing it is saved by
    assert set(split) == {"loading", "measures", "warm start", "method", "writing", "total"}
    assert all(split[part] > 0 for part in ("loading", "measures", "warm start", "method"))
    assert sum(value for part, value in split.items() if part != "total") <= split["total"] + 0.1
    assert written["precision"] in ("bf16", "float32") and result["time_split"]["writing"] > 0
    card = (out / "README.md").read_text()
    assert "minirope-posttrain" in card and "GRPOTrainer" in card and "scan" in card
    logged = json.loads((out / "trainer_state.json").read_text())["log_history"]
    assert any("rewards/meter_reward/mean" in entry for entry in logged)  # TRL's loop ran with minirope's rewards
    assert any("rewards/word_variety_reward/mean" in entry for entry in logged)
    assert any("lm_loss" in entry for entry in logged)  # the corpus term, logged with TRL's metrics


def test_dpo_builds_pairs_from_its_own_samples_and_writes_them(tiny_post, tiny_pretrained, tmp_path, monkeypatch):
    shortness = "def shortness_reward(completions, **kwargs):\n    return [-2.0 * len(c) for c in completions]\n"
    (tmp_path / "my_rewards.py").write_text(LENGTH_REWARD + shortness)  # weighted 1 and 0: ranked by length
    monkeypatch.chdir(tmp_path)  # the reward module is found in the working directory, as `trl grpo` finds it
    monkeypatch.setattr(sys, "path", [path for path in sys.path if path not in ("", str(tmp_path))])
    out = tmp_path / "dpo"
    posttrain.run([
        "--method", "dpo", "--model_name_or_path", str(tiny_pretrained), "--output_dir", str(out), *tiny_post,
        "--reward_funcs", "my_rewards.length_reward", "my_rewards.shortness_reward", "--reward_weights", "1", "0",
        "--samples_per_prompt", "3", "--per_device_train_batch_size", "2", "--max_length", "32",
    ])  # fmt: skip
    loads_and_generates(out)
    pairs = [json.loads(line) for line in (out / "preference_pairs.jsonl").read_text().splitlines()]
    assert pairs and all(len(pair["chosen"]) > len(pair["rejected"]) for pair in pairs)  # ranked by the weighted sum
    assert {pair["prompt"] for pair in pairs} <= set(training_prompts(8, seed=42))  # TrainingArguments.seed
    assert summary(out)["steps"] == 2 and summary(out)["tokens_seen"] > 0
    assert summary(out)["rejected_by"] == "sum"  # the user's rewards: the worst by their sum


def test_dpo_rejects_by_the_first_reward_only_for_the_verse_tasks_default_rewards(tiny_pretrained, tmp_path):
    for given, rule in (
        ([], "first_reward"),
        (["--reward_funcs", "meter_reward"], "sum"),
        (["--rejected_by", "sum"], "sum"),
    ):
        argv = ["--method", "dpo", "--model_name_or_path", str(tiny_pretrained), "--output_dir", str(tmp_path), *given]
        args, config, model_args = parse_args(argv)
        prepare(args, config, model_args)
        assert args.rejected_by == rule, given


def test_dpo_trains_on_a_preference_file(tiny_post, tiny_pretrained, tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    row = {"prompt": "ROMEO:\n", "chosen": "But soft, what light through yonder window breaks?\n", "rejected": "No.\n"}
    pairs.write_text("".join(json.dumps(row) + "\n" for _ in range(4)))
    out = tmp_path / "dpo-file"
    posttrain.run([
        "--method", "dpo", "--model_name_or_path", str(tiny_pretrained), "--output_dir", str(out), *tiny_post,
        "--train_file", str(pairs), "--per_device_train_batch_size", "2", "--max_length", "32", "--sft_steps", "0",
    ])  # fmt: skip
    loads_and_generates(out)
    assert not (out / "preference_pairs.jsonl").exists()  # the user's pairs are used as given
    logged = json.loads((out / "trainer_state.json").read_text())["log_history"]
    assert any("rewards/chosen" in entry for entry in logged)  # DPO's implicit rewards: TRL's loop ran


def merged_states_of_rollouts(trainer_class, monkeypatch) -> list[set[bool]]:
    """A list that each call of TRL's `trainer_class._generate_single_turn` appends the `merged` states of the
    trainer's LoRA layers to, as the call begins."""
    states, generate_single_turn = [], trainer_class._generate_single_turn

    def watched(trainer, *args, **kwargs):
        states.append({layer.merged for layer in lora_layers(trainer.model)})
        return generate_single_turn(trainer, *args, **kwargs)

    monkeypatch.setattr(trainer_class, "_generate_single_turn", watched)
    return states


def test_dpo_and_distillation_train_a_lora_adapter_with_use_peft(tiny_post, tiny_pretrained, tmp_path, monkeypatch):
    """`--use_peft` reaches DPO's and distillation's TRL trainers too: the merged folder loads, differs from the base
    (the trained weights are kept: `--keep_last`), and says LoRA in its summary; the student's completions came from
    its adapters as TRL runs them, dropout included (`--lora_dropout` 0.05: not merged)."""
    from trl import DistillationTrainer

    completions = merged_states_of_rollouts(DistillationTrainer, monkeypatch)
    pairs = tmp_path / "pairs.jsonl"
    row = {"prompt": "ROMEO:\n", "chosen": "But soft, what light through yonder window breaks?\n", "rejected": "No.\n"}
    pairs.write_text("".join(json.dumps(row) + "\n" for _ in range(4)))
    start = load_file(tiny_pretrained / "model.safetensors")
    for method, flags in (
        ("dpo", ["--train_file", str(pairs), "--per_device_train_batch_size", "2", "--max_length", "32"]),
        ("distill", ["--teacher_model_name_or_path", str(tmp_path / "dpo"), "--max_completion_length", "8",
                     "--per_device_train_batch_size", "2"]),  # the teacher: the DPO-tuned model, one tokenizer
    ):  # fmt: skip
        out = tmp_path / method
        posttrain.run(["--method", method, "--model_name_or_path", str(tiny_pretrained), "--output_dir", str(out),
                       *tiny_post, "--sft_steps", "0", "--use_peft", "--lora_r", "4", "--learning_rate", "1e-2",
                       *flags])  # fmt: skip
        loads_and_generates(out)
        written = load_file(out / "model.safetensors")
        assert written.keys() == start.keys() and summary(out)["training"] == "LoRA r=4, alpha 32 (merged)", method
        assert not all(torch.equal(written[name], start[name]) for name in start), method
    assert completions and all(merged == {False} for merged in completions)


def test_distillation_from_a_teacher_writes_a_model_that_loads(tiny_post, tiny_pretrained, tmp_path):
    out = tmp_path / "distill"
    posttrain.run([
        "--method", "distill", "--model_name_or_path", str(tiny_pretrained), "--output_dir", str(out), *tiny_post,
        "--teacher_model_name_or_path", str(tiny_pretrained), "--per_device_train_batch_size", "2",
        "--max_completion_length", "8",
    ])  # fmt: skip
    loads_and_generates(out)
    written = summary(out)
    assert written["teacher"] == str(tiny_pretrained)
    assert written["reward_funcs"] == ["meter_reward", "word_variety_reward"]  # measured, not trained on


@pytest.mark.parametrize("half", ["bf16", "fp16"])
def test_half_precision_trains_in_it_after_the_measures(tiny_post, half, tiny_pretrained, tmp_path, monkeypatch):
    """`--bf16 True` or `--fp16 True` (with `--use_cpu True`, which transformers asks for on a CPU): the measures
    before and after the warm start evaluate in the run's precision, and the warm start trains in it, so every trainer
    starts in it (accelerate holds one precision a process; a float32 evaluation between them once stopped GRPO with
    "AcceleratorState has already been initialized", and an fp16 run's warm start once trained in float32)."""
    precision, add_corpus = {}, corpus.add_corpus

    def spy(trainer, *args):
        precision[type(trainer).__name__] = trainer.accelerator.mixed_precision
        add_corpus(trainer, *args)

    monkeypatch.setattr(setup, "add_corpus", spy)
    monkeypatch.setattr(warm_start, "add_corpus", spy)
    out = tmp_path / f"grpo-{half}"
    posttrain.run([
        "--method", "grpo", "--model_name_or_path", str(tiny_pretrained), "--output_dir", str(out), *tiny_post,
        *TINY_GRPO, f"--{half}", "True", "--use_cpu", "True",
    ])  # fmt: skip
    loads_and_generates(out)
    assert precision == {"MiniRopeSFTTrainer": half, "MiniRopeGRPOTrainer": half}
    written = summary(out)
    assert written["steps"] == 2 and written["warm_start"]["steps"] == 2
    assert 0 < written["after"]["validation_bits_per_byte"] < 20


def test_trl_grpo_cli_runs_minirope_reward_on_a_minirope_folder(tiny_pretrained, tmp_path):
    """TRL's own command line, with minirope's reward by import path and prompts from a local dataset folder."""
    data = tmp_path / "prompts"
    data.mkdir()
    (data / "train.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in training_prompts(8)))
    trl = Path(sys.executable).parent / "trl"
    command = [
        str(trl), "grpo", "--model_name_or_path", str(tiny_pretrained), "--dataset_name", str(data),
        "--reward_funcs", "minirope.posttraining.tasks.verse.rewards.scansion_reward",
        "--output_dir", str(tmp_path / "out"),
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
    assert all(f"\n{prompt}" in training for prompt in prompts)  # the header (and first line) as a speech starts
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


@pytest.mark.parametrize("method", ["grpo", "dpo", "distill"])
def test_the_measures_samples_take_trls_name_and_the_earlier_flag_still_sets_them(method, tiny_pretrained, tmp_path,
                                                                                   capsys):  # fmt: skip
    """`--num_generations_eval` (TRL's GRPO name) sets the measures' samples of a prompt for every method; the earlier
    `--eval_samples_per_prompt` on the command line is taken as it, said in one line; in a --config file it is
    refused, naming the new key."""
    model = ["--model_name_or_path", str(tiny_pretrained), "--dataset_name", "rows"]
    model += ["--teacher_model_name_or_path", str(tiny_pretrained)] if method == "distill" else []
    assert parse_args(model + ["--method", method])[1].num_generations_eval == 16
    assert parse_args(model + ["--method", method, "--num_generations_eval", "4"])[1].num_generations_eval == 4
    assert parse_args(model + ["--method", method, "--eval_samples_per_prompt=3"])[1].num_generations_eval == 3
    assert "--eval_samples_per_prompt is now --num_generations_eval" in capsys.readouterr().out
    old = tmp_path / "old.yaml"
    old.write_text("eval_samples_per_prompt: 3\n")
    with pytest.raises(ValueError, match="eval_samples_per_prompt, which is now num_generations_eval"):
        parse_args(model + ["--method", method, "--config", str(old)])
    with pytest.raises(ValueError, match="--num_generations_eval must be >= 1"):
        parse_args(model + ["--method", method, "--num_generations_eval", "0"])


def test_trls_dataset_mixture_is_read_and_the_first_rows_held_out(tiny_pretrained, tmp_path, capsys):
    """A `--config` file in `trl grpo`'s shape names its data as TRL's dataset mixture (`datasets:`, read by
    `trl.get_dataset`) and the held-out rows as `test_split_size` (a number of rows, or a share): the first rows are
    held out, the same every run, the rest trained on; the earlier `--validation_split_percentage` is read as the
    share with a note, and refused in a --config file; two sources of data are refused."""
    from minirope.posttraining.data import data_task

    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"{n} + 1 =", "solution": str(n + 1)}) + "\n" for n in range(20)))
    config = tmp_path / "grpo.yaml"
    config.write_text(f"datasets:\n  - path: json\n    data_files: {rows}\ntest_split_size: 4\n")
    model = ["--model_name_or_path", str(tiny_pretrained), "--reward_funcs", "accuracy_reward"]
    args = parse_args([*model, "--config", str(config)])[0]
    assert args.task is None and args.datasets[0].path == "json"  # the user's data, not the bundled task
    task = data_task(args)
    assert task.held_out["prompt"] == [f"{n} + 1 =" for n in range(4)] and len(task.train) == 16
    args = parse_args([*model, "--config", str(config), "--validation_split_percentage", "25"])[0]
    assert args.test_split_size == 0.25 and len(data_task(args).held_out) == 5
    assert "--validation_split_percentage 25 is now --test_split_size 0.25" in capsys.readouterr().out
    args = parse_args([*model, "--config", str(config), "--validation_split_percentage", "25", "--test_split_size",
                       "2"])[0]  # fmt: skip
    assert args.test_split_size == 2  # the flag given wins over the earlier one's
    args = parse_args([*model, "--config", str(config), "--test_split_size", "20"])[0]
    with pytest.raises(ValueError, match=r"--datasets has too few rows \(20\) to hold out 20 for validation"):
        data_task(args)  # every row held out: nothing to train on
    config.write_text(f"datasets:\n  - path: json\n    data_files: {rows}\nvalidation_split_percentage: 10\n")
    with pytest.raises(ValueError, match="which is now test_split_size .TRL's name, a share: 5 % is 0.05"):
        parse_args([*model, "--config", str(config)])
    with pytest.raises(ValueError, match="Give one of --dataset_name or --datasets"):
        parse_args([*model, "--dataset_name", "rows", "--datasets", "json"])


def test_sft_config_merges_key_by_key_and_the_earlier_flags_become_its_keys(tiny_pretrained, tmp_path, capsys):
    """`--sft_config` (the warm start's SFTConfig flags): the method recipe's keys, a --config file's over them, the
    command line's over both, each key's source recorded; `--sft_batch_size` / `--sft_learning_rate` are read as its
    keys with a note (the command line's own keys win); in a --config file an earlier key is refused."""
    model = ["--method", "dpo", "--model_name_or_path", str(tiny_pretrained), "--dataset_name", "rows"]
    args = parse_args(model)[0]
    assert args.sft_config == WARM_RECIPE  # dpo.yaml
    file = tmp_path / "run.yaml"
    file.write_text("sft_config:\n  learning_rate: 0.0001\n  lm_coef: 0.25\n")
    args = parse_args([*model, "--config", str(file), "--sft_config", '{"lm_coef": 0}', "--sft_batch_size", "4",
                       "--sft_learning_rate=2e-4"])[0]  # fmt: skip
    assert args.sft_config == {**WARM_RECIPE, "lm_coef": 0, "per_device_train_batch_size": 4, "learning_rate": 2e-4}
    assert args.sft_sources == {"lm_coef": "command line", "per_device_train_batch_size": "command line",
                                "learning_rate": "command line", "lr_scheduler_type": "method recipe",
                                "warmup_steps": "method recipe"}  # fmt: skip
    assert "--sft_learning_rate is now the learning_rate key of --sft_config" in capsys.readouterr().out
    args = parse_args([*model, "--config", str(file)])[0]
    assert args.sft_config == {**WARM_RECIPE, "lm_coef": 0.25, "learning_rate": 1e-4}
    assert args.sft_sources["learning_rate"] == args.sft_sources["lm_coef"] == "--config"
    assert args.sft_sources["per_device_train_batch_size"] == "method recipe"
    file.write_text("sft_batch_size: 4\n")
    with pytest.raises(ValueError, match="sft_batch_size, which is now the per_device_train_batch_size key"):
        parse_args([*model, "--config", str(file)])


def test_the_method_recipes_sections_go_with_their_flag_and_show_in_the_settings(tiny_pretrained, tmp_path):
    """A method recipe's `with_sft_train_file` (the warm start's steps) and `with_use_peft` (its learning rate) are
    taken only with their flag, from the command line or a --config file, and named as the method recipe's; a flag
    given wins."""
    model = ["--model_name_or_path", str(tiny_pretrained), "--dataset_name", "rows"]
    args = parse_args(model)[0]
    assert args.sft_steps is None and args.warm_start_steps == 0 and args.sft_learning_rate == 3e-4
    args = parse_args([*model, "--sft_train_file", "demos.jsonl", "--use_peft", "True"])[0]
    assert args.warm_start_steps == 300 and args.method_recipe["sft_steps"] == 300
    assert args.sft_learning_rate == 1e-3 and args.sft_sources["learning_rate"] == "method recipe"
    assert args.sft_config["lr_scheduler_type"] == "cosine"  # the recipe's other keys stay
    file = tmp_path / "run.yaml"
    file.write_text("sft_train_file: [demos.jsonl]\nsft_config:\n  learning_rate: 0.0002\n")
    args = parse_args([*model, "--config", str(file), "--use_peft", "True", "--sft_steps", "7"])[0]
    assert args.warm_start_steps == 7 and args.sft_learning_rate == 2e-4  # the user's, over the sections'
    assert "with_use_peft" not in args.method_recipe and "with_sft_train_file" not in args.method_recipe
    args = parse_args(["--method", "distill", *model, "--teacher_model_name_or_path", str(tiny_pretrained),
                       "--sft_train_file", "demos.jsonl"])[0]  # fmt: skip
    assert args.warm_start_steps == 0  # distillation takes no warm start: its recipe has no such section


def test_corpus_blocks_are_tokenized_once_for_each_context(tiny_pretrained, tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_text("".join(f"Line {i} of a corpus for the corpus term's blocks.\n" for i in range(200)))
    args = parse_args(["--model_name_or_path", str(tiny_pretrained), "--lm_train_file", str(text)])[0]
    blocks_of = corpus.corpus_of(args, str(tiny_pretrained))
    tokenizer = AutoTokenizer.from_pretrained(tiny_pretrained)
    short, long = blocks_of.blocks(tokenizer, 16, 0), blocks_of.blocks(tokenizer, 32, 0)
    assert short.shape[1] == 16 and long.shape[1] == 32 and short.dtype == torch.int64
    assert blocks_of.blocks(tokenizer, 16, 0) is short  # the warm start's and the method's: one tokenization


def test_own_pairs_keep_only_prompts_whose_samples_differ_in_reward(tiny_pretrained):
    model = AutoModelForCausalLM.from_pretrained(tiny_pretrained)
    tokenizer = AutoTokenizer.from_pretrained(tiny_pretrained)
    rows = Dataset.from_dict({"prompt": ["ROMEO:\n"], "speaker": ["ROMEO"]})
    samples = sample(model, tokenizer, rows, 4, 8, 0, SAMPLING)
    assert own_pairs(samples, [lambda completions, **kw: [0.0] * len(completions)]) == []  # no preference, no pair
    lengths = lambda completions, **kw: [len(c) for c in completions]  # noqa: E731
    ranked = own_pairs(samples, [lengths])
    assert len(ranked) == 1 and len(ranked[0]["chosen"]) > len(ranked[0]["rejected"])
    assert ranked[0]["speaker"] == "ROMEO"  # the row's other columns travel with the pair
    spread = len(ranked[0]["chosen"]) - len(ranked[0]["rejected"])
    assert own_pairs(samples, [lengths], margin=spread) == ranked
    assert own_pairs(samples, [lengths], margin=spread + 1) == []
    columns = lambda completions, speaker, **kw: [float(s == "ROMEO") for s in speaker]  # noqa: E731
    assert own_pairs(samples, [columns]) == []  # called with the row's columns, as TRL calls rewards
    # Rewards are summed: a second reward that prefers short completions by more cancels the first's ranking.
    shorter = lambda completions, **kw: [-2.0 * len(c) for c in completions]  # noqa: E731
    flipped = own_pairs(samples, [lengths, shorter])
    assert len(flipped[0]["chosen"]) == len(ranked[0]["rejected"])
    assert len(flipped[0]["rejected"]) == len(ranked[0]["chosen"])
    assert own_pairs(samples, [lengths, shorter], weights=[1.0, 0.0]) == ranked  # weighted as GRPO weights them
    none_for_short = lambda completions, **kw: [None if len(c) < 999 else 1.0 for c in completions]  # noqa: E731
    assert own_pairs(samples, [lengths, none_for_short]) == ranked  # None adds nothing
    two = sample(model, tokenizer, Dataset.from_dict({"prompt": ["ROMEO:\n", "JULIET:\n"]}), 3, 8, 0, SAMPLING)
    groups = []
    own_pairs(two, [lambda completions, **kw: groups.append(list(completions)) or [0.0] * len(completions)])
    assert groups == [two.completions[:3], two.completions[3:]]  # each prompt's completions scored together


def test_sampled_completion_ids_keep_their_end_of_sequence_token_as_trl_gives_them(tiny_pretrained):
    """A reward sees in the measures the token ids TRL's `GRPOTrainer` gives it in training: up to and including the
    first end-of-sequence token, or `max_new_tokens` ids for a completion cut short (TRL's `mask_truncated_completions`
    and its overlong punishment read exactly that); the text leaves the token out."""
    model = AutoModelForCausalLM.from_pretrained(tiny_pretrained)
    tokenizer = AutoTokenizer.from_pretrained(tiny_pretrained)
    newline = tokenizer("\n", add_special_tokens=False)["input_ids"][-1]
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, newline]  # a line ends a completion here
    samples = sample(model, tokenizer, Dataset.from_dict({"prompt": ["ROMEO:\n", "JULIET:\n"]}), 8, 12, 0, SAMPLING)
    ended = [ids for ids in samples.completion_ids if ids[-1] in (tokenizer.eos_token_id, newline)]
    assert ended and len(ended) < len(samples.completion_ids)  # both kinds met
    for ids, text in zip(samples.completion_ids, samples.completions, strict=True):
        stops = [place for place, token in enumerate(ids) if token in (tokenizer.eos_token_id, newline)]
        assert stops == [len(ids) - 1] if ids in ended else (stops == [] and len(ids) == 12)
        assert text == tokenizer.decode(ids, skip_special_tokens=True)
    assert samples.cut_share == 1 - len(ended) / len(samples.completion_ids)


def test_a_run_warns_when_many_samples_are_cut_at_the_token_limit(capsys):
    """GRPO on a user's task with half its held-out samples unfinished at the limit: one line naming TRL's overlong
    punishment; nothing below `CUT_SHARE`, for a task that cuts by design (the verse task), or where TRL's overlong
    punishment is among the rewards already."""
    from types import SimpleNamespace

    from trl.rewards import get_soft_overlong_punishment

    from minirope.posttraining.grpo import CUT_SHARE, check_cut

    def exact(completions, **kwargs):
        return [1.0] * len(completions)

    cut = SimpleNamespace(cut_share=0.5, max_new_tokens=32)
    check_cut(cut, [exact], cut_by_design=False)
    line = capsys.readouterr().out
    assert "50% of the held-out samples reach the 32-token limit" in line and "get_soft_overlong_punishment" in line
    check_cut(SimpleNamespace(cut_share=CUT_SHARE - 0.01, max_new_tokens=32), [exact], False)
    check_cut(cut, [exact], cut_by_design=True)
    check_cut(cut, [exact, get_soft_overlong_punishment(max_completion_len=32, soft_punish_cache=8)], False)
    assert capsys.readouterr().out == ""


def test_samples_read_each_prompt_once_and_equal_generates_num_return_sequences(tiny_pretrained):
    """`sample` prefills each prompt once for all its completions (`shared_prefill`): the same tokens as transformers'
    `generate(num_return_sequences=...)` on the same seed, for prompts of different lengths (left padding); the
    prefill reads `B` rows, not `B x per_prompt`."""
    from minirope.posttraining import sampling

    model = AutoModelForCausalLM.from_pretrained(tiny_pretrained).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_pretrained)
    prompts = ["ROMEO:\n", "FIRST CITIZEN:\nBefore we proceed any further, hear me speak.\n\nALL:\n"]
    rows = Dataset.from_dict({"prompt": prompts})
    shared = sample(model, tokenizer, rows, 4, 12, 7, SAMPLING)
    tokenizer.padding_side = "left"
    inputs = tokenizer(prompts, return_tensors="pt", padding=True)
    torch.manual_seed(7)
    out = model.generate(**inputs, **SAMPLING, max_new_tokens=12, num_return_sequences=4,
                         pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    eos = tokenizer.eos_token_id
    expected = [row[: row.index(eos)] if eos in row else row for row in out[:, inputs["input_ids"].shape[1] :].tolist()]
    assert shared.completion_ids == expected
    assert len(set(map(tuple, expected))) > 1  # sampled: the completions differ
    batches = []
    hook = model.register_forward_pre_hook(lambda module, args, kwargs: batches.append(kwargs["input_ids"].shape[0]),
                                           with_kwargs=True)  # fmt: skip
    with torch.no_grad():
        model.generate(**sampling.shared_prefill(model, inputs, 4), max_new_tokens=2, pad_token_id=0)
    hook.remove()
    assert batches[0] == 2 and batches[1:] == [8, 8]  # the prompts once, then every completion


@pytest.mark.parametrize("bf16", [False, True])
def test_the_measures_sample_the_first_eval_sampled_prompts_and_greedy_decode_all(tiny_pretrained, bf16):
    """... in the run's precision: a bf16 run's completions come from forwards under bf16 autocast, as its trainer's
    (accelerate's) forward computes; a float32 run's without autocast."""
    from types import SimpleNamespace

    from minirope.posttraining.measures import measure_task

    model = AutoModelForCausalLM.from_pretrained(tiny_pretrained)
    tokenizer = AutoTokenizer.from_pretrained(tiny_pretrained)
    rows = Dataset.from_dict({"prompt": ["ROMEO:\n", "JULIET:\n", "NURSE:\n"]})
    calls, autocast = [], set()
    reward = lambda completions, prompts, **kw: calls.append((prompts[0], len(completions))) or [1.0] * len(prompts)  # noqa: E731
    args = SimpleNamespace(eval_max_new_tokens=4, eval_sampled_prompts=2)
    run = SimpleNamespace(seed=0, bf16=bf16, fp16=False, num_generations_eval=3)
    hook = model.register_forward_pre_hook(
        lambda module, inputs: autocast.add(
            torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None
        )
    )
    measured = measure_task(model, tokenizer, rows, [reward], args, run, None)
    hook.remove()
    assert autocast == {torch.bfloat16 if bf16 else None}
    assert measured.precision == ("bf16" if bf16 else "float32") == measured.as_dict()["precision"]
    assert (measured.prompts, measured.sampled_prompts, measured.samples_per_prompt) == (3, 2, 3)
    greedy, sampled = [("ROMEO:\n", 1), ("JULIET:\n", 1), ("NURSE:\n", 1)], [("ROMEO:\n", 3), ("JULIET:\n", 3)]
    assert sorted(calls) == sorted(greedy + sampled)  # greedy: every prompt; sampled: the first two, 3 each
    assert [row["sampled"] is None for row in measured.samples] == [False, False, True]


def test_own_pairs_can_reject_the_worst_by_the_first_reward(tiny_pretrained):
    """`rejected_by="first_reward"`: the chosen is still the best by the weighted sum, the rejected the lowest by the
    first reward, ties to the lower sum, never one the first reward does not apply to."""
    model = AutoModelForCausalLM.from_pretrained(tiny_pretrained)
    tokenizer = AutoTokenizer.from_pretrained(tiny_pretrained)
    samples = sample(model, tokenizer, Dataset.from_dict({"prompt": ["ROMEO:\n"]}), 4, 8, 0, SAMPLING)
    texts = samples.completions

    def fixed(values):  # a reward giving the k-th completion values[k]
        return lambda completions, **kw: list(values)

    # sums 5, 3, -3, 11: the best is 3; by the sum the worst is 2; by the first reward 0 and 1 tie, 1 sums lower
    rewards = [fixed([0.0, 0.0, 1.0, 2.0]), fixed([5.0, 3.0, -4.0, 9.0])]
    by_sum, by_first = own_pairs(samples, rewards), own_pairs(samples, rewards, rejected_by="first_reward")
    assert (by_sum[0]["chosen"], by_sum[0]["rejected"]) == (texts[3], texts[2])
    assert (by_first[0]["chosen"], by_first[0]["rejected"]) == (texts[3], texts[1])
    assert own_pairs(samples, rewards, margin=8.1, rejected_by="first_reward") == []  # 11 - 3 < 8.1: no pair
    # the first reward does not apply to completion 0 (None): it is the worst by the sum, never by the first reward
    rewards = [fixed([None, 0.0, 1.0, 2.0]), fixed([-9.0, 3.0, -4.0, 9.0])]
    assert own_pairs(samples, rewards)[0]["rejected"] == texts[0]
    assert own_pairs(samples, rewards, rejected_by="first_reward")[0]["rejected"] == texts[1]
    # the first reward applies to none: the sum still ranks a pair, the first reward has nothing to reject
    rewards = [fixed([None] * 4), fixed([-9.0, 3.0, -4.0, 9.0])]
    assert own_pairs(samples, rewards)[0]["rejected"] == texts[0]
    assert own_pairs(samples, rewards, rejected_by="first_reward") == []
    with pytest.raises(ValueError, match="rejected_by must be one of sum, first_reward, got 'last'"):
        own_pairs(samples, rewards, rejected_by="last")


def test_the_method_is_parsed_from_a_json_arguments_file_and_takes_its_recipes_defaults(tmp_path):
    """(`./m` names no folder: nothing to size the defaults from, so the methods' own defaults.)"""
    arguments = tmp_path / "args.json"
    arguments.write_text(json.dumps({"model_name_or_path": "./m", "method": "dpo", "max_steps": 3}))
    args, config, _ = parse_args([str(arguments)])
    assert args.method == "dpo" and isinstance(config, PosttrainDPOConfig) and config.max_steps == 3
    args, config, _ = parse_args(["--model", "./m", "--method=dpo"])
    assert isinstance(config, PosttrainDPOConfig) and config.learning_rate == 5e-5  # minirope's, not TRL's 1e-6
    assert config.loss_type == ["sigmoid"] and args.rejected_by == "first_reward"  # the verse task's recipe
    assert args.method_recipe["learning_rate"] == 5e-5  # from recipes/dpo.yaml, the one home of the value
    # GRPO's retuned groups and reward scaling survive TRL's __post_init__, and the flags still override them
    _, config, _ = parse_args(["--model", "./m"])
    grouping = (config.num_generations, config.per_device_train_batch_size, config.max_steps, config.scale_rewards)
    assert grouping == (16, 32, 250, "batch")
    _, config, _ = parse_args(["--model", "./m", "--scale_rewards", "group", "--num_generations", "8"])
    assert (config.scale_rewards, config.num_generations) == ("group", 8)
    # with data, the defaults measured on users' tasks, not the verse task's (its learning rate made them worse)
    for data in (["--dataset_name", "d"], ["--train_file", "f.jsonl"]):
        _, config, _ = parse_args(["--model", "./m", *data])
        grouping = (config.num_generations, config.per_device_train_batch_size, config.max_steps, config.scale_rewards)
        assert grouping == (16, 64, 300, "group") and config.learning_rate == 1e-4 and config.temperature == 1.0
    arguments.write_text(json.dumps({"model_name_or_path": "./m", "dataset_name": "d"}))
    _, config, _ = parse_args([str(arguments)])
    assert config.learning_rate == 1e-4 and config.eval_steps == 0.2


def problems_folder(root: Path, test_split: bool) -> Path:
    """A `datasets` folder of a user's task: prompts with a `solution`, as `save_to_disk` writes it."""
    rows = [{"prompt": f"{name.upper()}:\n", "solution": name[:2]} for name in ("romeo", "juliet", "hamlet") * 8]
    splits = {"train": Dataset.from_list(rows)}
    if test_split:
        splits["test"] = Dataset.from_list(rows[:3])
    folder = root / "problems"
    DatasetDict(splits).save_to_disk(str(folder))
    return folder


def test_grpo_on_a_users_dataset_folder_with_a_reward_from_the_working_directory(tiny_pretrained, tmp_path,
                                                                                 monkeypatch):  # fmt: skip
    (tmp_path / "task_rewards.py").write_text(SOLUTION_REWARD)
    monkeypatch.chdir(tmp_path)
    folder = problems_folder(tmp_path, test_split=False)
    base = tmp_path / "base"
    shutil.copytree(tiny_pretrained, base)
    run_summary = json.loads((base / "run_summary.json").read_text())
    (base / "run_summary.json").write_text(json.dumps({**run_summary, "training_data": "my-corpus.txt"}))
    demonstrations = tmp_path / "demonstrations.jsonl"  # the warm start: prompt/completion rows of the task
    demonstrations.write_text("".join(json.dumps({"prompt": f"{name}:\n", "completion": f"{name[:2].lower()}\n"}) + "\n"
                                      for name in ("ROMEO", "JULIET", "HAMLET") * 4))  # fmt: skip
    out = tmp_path / "grpo-task"
    posttrain.run([
        "--method", "grpo", "--model_name_or_path", str(base), "--output_dir", str(out), *TINY_POST, *TINY_GRPO,
        "--dataset_name", str(folder), "--reward_funcs", "task_rewards.starts_right",
        "--sft_train_file", str(demonstrations), "--sft_steps", "2",
    ])  # fmt: skip
    loads_and_generates(out)
    written = summary(out)
    assert written["task"] == "user data" and written["data"] == str(folder)
    assert written["warm_start"]["steps"] == 2 and written["warm_start"]["data"] == "demonstrations.jsonl"
    assert written["corpus_term"]["lm_coef"] == 0.0 and "my-corpus.txt" in written["corpus_term"]["source"]
    before = written["before"]
    assert before["prompts"] == 1 and before["validation_bits_per_byte"] is None and "scan_share" not in before
    assert set(before["rewards_greedy"]) == {"starts_right"} and before["rewards_sampled"]["starts_right"] >= 0
    held_out = {sample["before"]["prompt"] for sample in written["samples"]}
    assert held_out == {"ROMEO:\n"}  # the first 5 % of the rows (at least one), never trained on
    logged = json.loads((out / "trainer_state.json").read_text())["log_history"]
    assert any("rewards/starts_right/mean" in entry for entry in logged)
    assert not any("lm_loss" in entry for entry in logged)  # no corpus term: the bundled plays never touched


def user_task(root: Path, monkeypatch) -> list[str]:
    """The flags of a GRPO run on a user's task (`problems_folder`, a reward in the working directory), tiny."""
    (root / "task_rewards.py").write_text(SOLUTION_REWARD)
    monkeypatch.chdir(root)
    folder = problems_folder(root, test_split=True)
    return ["--method", "grpo", "--dataset_name", str(folder), "--reward_funcs", "task_rewards.starts_right",
            *TINY_POST[:-2], *TINY_GRPO, "--sft_steps", "0", "--learning_rate", "1e-2"]  # fmt: skip


@pytest.mark.parametrize("keep_last", [False, True])
def test_a_run_that_beats_no_measure_keeps_the_starting_weights_and_says_so(tiny_pretrained, tmp_path, monkeypatch,
                                                                           capsys, keep_last):  # fmt: skip
    """Every measure during training scores below the start (the score patched to fall): the folder holds the
    starting weights, the run says nothing was gained (its last line, the summary, the card); with --keep_last the
    trained weights are written and the fall is said."""
    monkeypatch.setattr(setup, "held_out_score", lambda *args: -1.0)
    out = tmp_path / "grpo"
    posttrain.run([*user_task(tmp_path, monkeypatch), "--model_name_or_path", str(tiny_pretrained), "--output_dir",
                   str(out), "--max_steps", "3", "--eval_steps", "1", "--keep_last", str(keep_last)])  # fmt: skip
    start, written = load_file(tiny_pretrained / "model.safetensors"), load_file(out / "model.safetensors")
    same = all(torch.equal(written[name], start[name]) for name in start)
    run_summary, printed = summary(out), capsys.readouterr().out.strip().splitlines()
    assert [entry["step"] for entry in run_summary["kept"]["measured"]] == [0, 1, 2, 3]
    assert run_summary["kept"]["gained"] is False
    if keep_last:
        assert not same and run_summary["kept"]["kept_step"] == 3
        assert "fell" in printed[-1] and "kept anyway (--keep_last)" in printed[-1]
    else:
        assert same and run_summary["kept"]["kept_step"] == 0
        assert printed[-1].startswith("[minirope] nothing gained: no step beat the starting model's held-out")
        assert "--learning_rate" in printed[-1] and "nothing gained" in (out / "README.md").read_text()
    assert run_summary["gained"] in printed[-1]


def test_grpo_with_use_peft_from_a_yaml_config_trains_lora_and_keeps_the_start_when_nothing_was_gained(
    tiny_pretrained, tmp_path, monkeypatch, capsys
):
    """TRL's shape: the flags from a `--config` YAML file (the command line wins), its data TRL's dataset mixture
    (`datasets:`, the first `test_split_size` rows held out), `--use_peft --lora_r 8` trains a LoRA adapter (TRL's
    `get_peft_config`); with every measure below the start, the adapter's initial weights are put back, so the merged
    folder holds exactly the starting weights and loads with `AutoModelForCausalLM`."""
    monkeypatch.setattr(setup, "held_out_score", lambda *args: -1.0)
    flags = user_task(tmp_path, monkeypatch)
    at = flags.index("--dataset_name")
    rows = tmp_path / "problems.jsonl"
    load_from_disk(flags[at + 1])["train"].to_json(rows, lines=True)
    (tmp_path / "run.yaml").write_text(
        f"model_name_or_path: {tiny_pretrained}\noutput_dir: {tmp_path / 'lora'}\nuse_peft: true\nlora_r: 8\n"
        "lora_target_modules: [q_proj, v_proj]\nmax_steps: 5\neval_steps: 1\n"
        f"datasets:\n  - path: json\n    data_files: {rows}\ntest_split_size: 3\n"
    )
    run_summary = posttrain.run(["--config", str(tmp_path / "run.yaml"), *flags[:at], *flags[at + 2 :]])
    out = tmp_path / "lora"
    printed = capsys.readouterr().out
    assert run_summary["data"] == "json (problems.jsonl)"  # the mixture's entry, as the card names the data
    assert run_summary["training"] == "LoRA r=8, alpha 32 (merged)" and run_summary["steps"] == 2  # --max_steps 2
    assert [entry["step"] for entry in run_summary["kept"]["measured"]] == [0, 1, 2]
    start, written = load_file(tiny_pretrained / "model.safetensors"), load_file(out / "model.safetensors")
    assert written.keys() == start.keys() and all(torch.equal(written[name], start[name]) for name in start)
    assert not (out / "adapter_config.json").exists() and "- lora" in (out / "README.md").read_text()
    assert "nothing gained" in printed.strip().splitlines()[-1]
    loads_and_generates(out)


def test_lora_after_a_warm_start_that_gains_nothing_writes_the_model_the_run_started_from(
    tiny_pretrained, tmp_path, monkeypatch
):
    """The warm start (full SFT on the task's answers) moves every weight, then GRPO trains a LoRA adapter; when no
    measure beats the start, the folder holds the weights of --model_name_or_path itself, not the warm-started ones."""
    monkeypatch.setattr(setup, "held_out_score", lambda *args: -1.0)
    demonstrations = tmp_path / "answers.jsonl"
    demonstrations.write_text("".join(json.dumps({"prompt": f"{name}:\n", "completion": f"{name[:2].lower()}\n"}) + "\n"
                                      for name in ("ROMEO", "JULIET", "HAMLET") * 4))  # fmt: skip
    out = tmp_path / "lora-warm"
    run_summary = posttrain.run([*user_task(tmp_path, monkeypatch), "--model_name_or_path", str(tiny_pretrained),
                                 "--output_dir", str(out), "--use_peft", "--sft_train_file", str(demonstrations),
                                 "--sft_steps", "2"])  # fmt: skip
    assert run_summary["warm_start"]["steps"] == 2 and run_summary["kept"]["kept_step"] == 0
    assert not (out / "_warm_start").exists()  # no checkpoint to resume: the warm start's folder went with the run
    start, written = load_file(tiny_pretrained / "model.safetensors"), load_file(out / "model.safetensors")
    assert all(torch.equal(written[name], start[name]) for name in start)


def test_grpo_with_use_peft_and_merge_lora_false_saves_an_adapter_that_loads(tiny_pretrained, tmp_path, monkeypatch):
    """`--merge_lora False`: the adapter alone (peft's folder), trained (its B matrices no longer zero), loading with
    `AutoModelForCausalLM` onto the base model it names, and scoring as the run measured it. Without LoRA dropout,
    every rollout of TRL's trainer ran on the merged adapter."""
    from peft import AutoPeftModelForCausalLM
    from trl import GRPOTrainer

    rollouts = merged_states_of_rollouts(GRPOTrainer, monkeypatch)
    out = tmp_path / "adapter"
    posttrain.run([*user_task(tmp_path, monkeypatch), "--model_name_or_path", str(tiny_pretrained), "--output_dir",
                   str(out), "--use_peft", "--lora_r", "4", "--lora_dropout", "0", "--merge_lora", "False",
                   "--keep_last", "True"])  # fmt: skip
    assert rollouts and all(merged == {True} for merged in rollouts)
    assert not (out / "model.safetensors").exists()
    adapter = load_file(out / "adapter_model.safetensors")
    assert {name.split(".")[-2] for name in adapter} == {"lora_A", "lora_B"}
    assert any(value.abs().max() > 0 for name, value in adapter.items() if "lora_B" in name)
    assert summary(out)["training"] == "LoRA r=4, alpha 32 adapter"
    ids = torch.tensor([[1, 2, 3, 4]])
    loaded = AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        expected = AutoPeftModelForCausalLM.from_pretrained(out).eval()(ids).logits
        base = AutoModelForCausalLM.from_pretrained(tiny_pretrained).eval()(ids).logits
        torch.testing.assert_close(loaded(ids).logits, expected)
    assert not torch.allclose(expected, base)


def test_a_lora_model_samples_on_its_merged_adapter_and_gets_its_base_weights_back(tiny_pretrained):
    """`merged_adapter`: inside it every LoRA layer is merged and greedy tokens equal the unmerged model's; after it
    (an exception included) nothing is merged and the base weights are back within float32 rounding. A model without
    an adapter, with bf16 base weights (whose rounding would move the base at every merge), or whose adapters apply
    dropout (training mode) runs as it is."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    lora = LoraConfig(r=4, lora_dropout=0.1, target_modules=["q_proj", "v_proj", "down_proj"])
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_pretrained), lora).eval()
    for name, weight in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(weight, std=0.05)  # a trained adapter (B = 0 would change nothing)
    start = [weight.clone() for weight in lora_base_weights(model)]
    ids = torch.tensor([[1, 5, 9, 2]])
    greedy = {"max_new_tokens": 12, "do_sample": False, "pad_token_id": 0}
    unmerged = model.generate(input_ids=ids, **greedy)
    layers = lora_layers(model)
    with merged_adapter(model):
        assert all(layer.merged for layer in layers)
        assert torch.equal(model.generate(input_ids=ids, **greedy), unmerged)
    with pytest.raises(RuntimeError, match="stopped"), merged_adapter(model):
        raise RuntimeError("stopped")
    assert not any(layer.merged for layer in layers)
    with merged_adapter(model.train()):  # LoRA's dropout applies in training mode: a merged model would skip it
        assert not any(layer.merged for layer in layers)
    model.eval()
    for before, after in zip(start, lora_base_weights(model), strict=True):
        torch.testing.assert_close(after, before, rtol=1e-6, atol=1e-6)
    assert mergeable(model) and not mergeable(AutoModelForCausalLM.from_pretrained(tiny_pretrained))
    assert not mergeable(model.to(torch.bfloat16))


def test_grpo_warm_starts_on_the_rows_answers_when_every_group_scores_alike(tiny_pretrained, tmp_path, monkeypatch,
                                                                          capsys):  # fmt: skip
    """A reward that scores every sample alike gives GRPO nothing; the rows carry a `solution`, so instead of refusing,
    the run first fine-tunes on them (TRL's SFTTrainer, one epoch; the earlier --sft_batch_size read as --sft_config's
    per_device_train_batch_size, with a note), says so, and trains."""
    (tmp_path / "flat_rewards.py").write_text("def zero(completions, **kwargs):\n    return [0.0] * len(completions)\n")
    monkeypatch.chdir(tmp_path)
    folder = problems_folder(tmp_path, test_split=True)
    out = tmp_path / "warm"
    run_summary = posttrain.run([
        "--method", "grpo", "--model_name_or_path", str(tiny_pretrained), "--output_dir", str(out),
        "--dataset_name", str(folder), "--reward_funcs", "flat_rewards.zero", *TINY_POST[:-4], *TINY_GRPO,
        "--num_generations_eval", "8", "--sft_batch_size", "10", "--keep_last", "True",
    ])  # fmt: skip
    assert run_summary["warm_start"]["steps"] == 3  # every training row (24, not --num_prompts 8), 10 a step
    assert run_summary["warm_start"]["data"] == "the training rows' prompts and their `solution` column"
    assert run_summary["stages"]["answer_warm_start"] == {"failing_share": 0.9, "sft_steps": 3}
    assert run_summary["before"]["prompts_with_alike_samples_share"] == 1.0
    printed = capsys.readouterr().out
    assert "first 3 steps of supervised fine-tuning on the training rows' prompts" in printed
    assert "--sft_batch_size is now the per_device_train_batch_size key of --sft_config" in printed
    start, written = load_file(tiny_pretrained / "model.safetensors"), load_file(out / "model.safetensors")
    assert any(not torch.equal(written[name], start[name]) for name in start)
    loads_and_generates(out)


def test_answer_rows_are_trl_prompt_completion_rows():
    """Conversational prompts get the answer as the assistant's message; plain ones as text after a space unless one
    is there; rows without an answer column give none."""
    chat = Dataset.from_list([{"prompt": [{"role": "user", "content": "Add 2 and 3."}], "solution": 5}])
    assert warm_start.answer_rows(chat).to_list() == [
        {"prompt": [{"role": "user", "content": "Add 2 and 3."}], "completion": [{"role": "assistant", "content": "5"}]}
    ]
    plain = Dataset.from_list([{"prompt": "47 - 19 =", "solution": "28"}, {"prompt": "9 - 3 = ", "solution": "6"}])
    assert warm_start.answer_rows(plain)["completion"] == [" 28", "6"]
    both = Dataset.from_list([{"prompt": "Q:", "completion": " A", "solution": "B"}])
    assert warm_start.answer_rows(both)["completion"] == [" A"]  # TRL's completion first
    assert warm_start.answer_rows(Dataset.from_list([{"prompt": "Q:", "other": "A"}])) is None


def test_the_answer_warm_start_is_taken_by_grpo_and_dpos_own_pairs_only_when_samples_score_alike(tiny_pretrained):
    """GRPO and DPO ranking its own samples warm-start on the training rows' answers when 90 % of the held-out
    prompts' samples (8 or more) score alike; not below that share, with fewer samples, with --sft_steps given, for
    distillation or for an adapter saved alone. The share and the most steps are the recipes' stage, recorded."""
    from types import SimpleNamespace

    from minirope.posttraining.sizing import answer_stage

    model = AutoModelForCausalLM.from_pretrained(tiny_pretrained)
    rows = Dataset.from_list([{"prompt": "Q:", "solution": "A"}] * 5)
    lora = SimpleNamespace(saves_adapter=False)

    def warm(method, share, sft_steps=None, model_args=lora, samples=8, solved=0.0):
        data = SimpleNamespace(rows=rows)
        args = SimpleNamespace(method=method, answer_warm_start=method != "distill", sft_steps=sft_steps,
                               sft_batch_size=2)  # fmt: skip
        run = SimpleNamespace(data=data, model=model, model_args=model_args, stages=stages)
        measured = TaskMeasure(1, 1, {}, {}, 1.0, None, alike_share=share, solved_share=solved,
                               samples_per_prompt=samples)  # fmt: skip
        return warm_start.answer_warm_start(run, args, measured)

    for method in ("grpo", "dpo"):
        stages = {}
        taken = warm(method, 0.9)
        assert taken.steps == 3 and taken.rows["completion"] == [" A"] * 5  # one epoch of 5 rows, 2 a step
        assert stages == {"answer_warm_start": {"failing_share": 0.9, "sft_steps": 3}}  # the stage, in the summary
        stage, recipes = answer_stage(method, 135_000_000)  # a released checkpoint: released_size.yaml's steps
        assert stage == {"failing_share": 0.9, "sft_steps": 32} and recipes.endswith("released_size.yaml")
        assert answer_stage(method, model.num_parameters())[0] == {"failing_share": 0.9, "sft_steps": 300}
    assert warm("grpo", 0.85) is None and warm("grpo", 1.0, sft_steps=0) is None and warm("distill", 1.0) is None
    assert warm("grpo", 1.0, samples=4) is None  # 4 samples alike: too few to tell
    assert warm("grpo", 1.0, model_args=SimpleNamespace(saves_adapter=True)) is None
    assert warm("grpo", 1.0, solved=0.95) is None and warm("grpo", 1.0, solved=1.0) is None  # solved, not failing
    assert warm("grpo", 1.0, solved=0.05).steps == 3


def test_solved_prompts_are_told_from_failing_ones_and_an_all_solved_task_is_said_plainly():
    """Three prompts: all samples right (solved), all wrong, mixed; weights count for full credit. A GRPO run whose
    every held-out prompt is solved is refused with "already solved", not told to give the model a start."""
    from types import SimpleNamespace

    from minirope.posttraining.grpo import check_signal
    from minirope.posttraining.measures import solved_share

    values = {"exact": [[1.0, 1.0], [0.0, 0.0], [1.0, 0.0]], "format": [[1.0, 1.0], [1.0, 1.0], [1.0, 1.0]]}
    assert solved_share(values, None) == 1 / 3 and solved_share(values, [2.0, 0.0]) == 1 / 3
    assert solved_share({"exact": [[0.5, 0.5]]}, None) == 0  # alike at half credit: failing
    args = SimpleNamespace(method="grpo", require_reward_spread=True)
    alike = {"alike_share": 1.0, "samples_per_prompt": 8}
    with pytest.raises(ValueError, match="already solved on the held-out prompts"):
        check_signal(TaskMeasure(4, 4, {}, {}, 1.0, None, solved_share=1.0, **alike), args)
    with pytest.raises(ValueError, match="Give the model a start on the task"):
        check_signal(TaskMeasure(4, 4, {}, {}, 1.0, None, solved_share=0.25, **alike), args)
    check_signal(TaskMeasure(4, 4, {}, {}, 1.0, None, solved_share=0.25, alike_share=1.0, samples_per_prompt=4), args)


def test_keep_best_keeps_a_warm_start_that_no_later_step_beats(tiny_pretrained):
    """Start 0.1, warm start 0.5, then 0.3 and 0.4: the warm-started weights are put back, step 0, and the line says
    the warm start gained it; a warm start scoring below the start changes nothing."""
    from minirope.posttraining.keep_best import KeepBest

    model = AutoModelForCausalLM.from_pretrained(tiny_pretrained)
    scores = iter([0.3, 0.4])
    keep = KeepBest(lambda model: next(scores), every=1)
    keep.start(0.1, model)
    keep.warm_started(0.05, model)  # below the start: ignored
    assert keep.selection.before is None and keep.selection.start == 0.1
    with torch.no_grad():
        for param in model.parameters():
            param.add_(1.0)
    warm = {name: value.clone() for name, value in model.state_dict().items()}
    keep.warm_started(0.5, model)
    for _ in (1, 2):
        with torch.no_grad():
            for param in model.parameters():
                param.add_(1.0)
        keep.record(model, _)
    selection = keep.restore_best(model)
    assert selection.kept_step == 0 and selection.gained and selection.before == 0.1
    assert all(torch.equal(value, warm[name]) for name, value in model.state_dict().items())
    assert selection.line("exact").startswith("held-out exact 0.100 -> 0.500 by the warm start; no step of the method")


def test_a_resumed_run_keeps_its_checkpoints_best_step_over_the_warm_start_it_runs_again(tiny_pretrained, tmp_path):
    """A run resumed from a checkpoint whose history has step 2 as the best (0.9) runs its warm start again (0.5,
    above the start's 0.1): step 0's score becomes the warm start's, but the kept weights stay step 2's, as in the
    uninterrupted run (the warm start used to overwrite them, and the folder then held the warm start's weights under
    step 2's label)."""
    from safetensors.torch import save_file

    from minirope.posttraining.keep_best import BEST_WEIGHTS, HISTORY, KeepBest

    model = AutoModelForCausalLM.from_pretrained(tiny_pretrained)
    best = {name: param.detach() + 2.0 for name, param in model.named_parameters()}
    checkpoint = tmp_path / "checkpoint-4"
    checkpoint.mkdir()
    save_file(best, checkpoint / BEST_WEIGHTS)
    (checkpoint / HISTORY).write_text(json.dumps([{"step": 0, "score": 0.5}, {"step": 2, "score": 0.9},
                                                  {"step": 4, "score": 0.7}]))  # fmt: skip
    keep = KeepBest(lambda model: 0.0, every=2)
    keep.start(0.1, model)
    keep.resume(str(checkpoint))
    with torch.no_grad():
        for param in model.parameters():
            param.add_(1.0)  # the warm start
    keep.warm_started(0.5, model)
    assert keep.selection.history == [{"step": 0, "score": 0.5}, {"step": 2, "score": 0.9}, {"step": 4, "score": 0.7}]
    selection = keep.restore_best(model)
    assert selection.kept_step == 2 and selection.before == 0.1
    assert all(torch.equal(param, best[name]) for name, param in model.named_parameters())


@pytest.mark.parametrize("method", ["grpo", "dpo", "distill"])
def test_the_nothing_gained_line_suggests_only_flags_its_method_has(tiny_pretrained, method):
    """Each flag the "nothing gained" line suggests parses for that method (DPO and distillation have no
    --num_generations)."""
    import re

    from minirope.posttraining.keep_best import Selection

    advice = importlib.import_module(f"minirope.posttraining.{method}").ARGUMENTS[0].advice
    line = Selection(history=[{"step": 0, "score": 0.5}, {"step": 4, "score": 0.2}]).line("exact", advice)
    flags = re.findall(r"--[a-z_]+", line.split("(with --keep_last")[0])
    assert len(flags) == 3, line
    data = ["--dataset_name", "d"] if method != "distill" else ["--teacher_model_name_or_path", str(tiny_pretrained)]
    for flag in flags:
        parse_args(["--method", method, "--model", str(tiny_pretrained), *data, flag, "2"])  # raises if unknown


def test_a_released_size_model_gets_defaults_sized_for_it_and_a_given_flag_wins(tiny_pretrained, tmp_path):
    """A config of 40M parameters (no weights needed: counted on the meta device) gets the defaults of the recipe
    `recipes/released_size.yaml`; a flag on the command line, or in the --config file, wins; minirope's own tiny model
    keeps the methods' defaults."""
    from minirope import MiniRopeConfig
    from minirope.posttraining.sizing import CHECKPOINTING, after_warm_start, count_parameters, released_size_recipe

    recipe = released_size_recipe()

    shape = {"vocab_size": 32000, "hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 8,
             "num_attention_heads": 8, "num_key_value_heads": 4}  # fmt: skip
    MiniRopeConfig(**shape).save_pretrained(tmp_path / "big")
    with torch.device("meta"):
        llama = LlamaForCausalLM(LlamaConfig(**shape))
    assert count_parameters(str(tmp_path / "big")) == llama.num_parameters() > 20e6
    args, config, _ = parse_args(["--model", str(tmp_path / "big"), "--dataset_name", "d", "--max_steps", "7"])
    assert config.max_steps == 7 and config.num_generations == recipe["grpo"]["num_generations"] == 8
    assert args.eval_prompts == recipe["every_method"]["eval_prompts"] == 64 and "max_steps" not in args.sized
    assert args.eval_sampled_prompts == recipe["every_method"]["eval_sampled_prompts"] < args.eval_prompts
    assert getattr(config, CHECKPOINTING) is True  # memory: the activations of a released model's steps recomputed
    assert config.learning_rate == 1e-4  # full weights: the data default
    args, config, model_args = parse_args(["--model", str(tmp_path / "big"), "--dataset_name", "d", "--use_peft"])
    assert model_args.use_peft and config.learning_rate == recipe["grpo_use_peft"]["learning_rate"] == 5e-4
    assert (
        after_warm_start(args, config) == recipe["grpo_after_warm_start"] == {"learning_rate": 1e-4}
        and config.learning_rate == 1e-4
    )
    args, config, _ = parse_args(["--model", str(tmp_path / "big"), "--dataset_name", "d", "--use_peft",
                                  "--learning_rate", "3e-4"])  # fmt: skip
    assert after_warm_start(args, config) == {} and config.learning_rate == 3e-4  # the user's flag stays
    for flag in (["--learning_rate", "5e-4"], ["--learning_rate=5e-4"], ["--learning-rate", "5e-4"]):
        args, config, _ = parse_args(["--model", str(tmp_path / "big"), "--dataset_name", "d", "--use_peft", *flag])
        assert "learning_rate" in args.given and "learning_rate" not in args.sized  # the sized value, given: kept
        assert after_warm_start(args, config) == {} and config.learning_rate == 5e-4, flag
    (tmp_path / "lr.yaml").write_text("learning_rate: 5.0e-4\n")
    args, config, _ = parse_args(["--model", str(tmp_path / "big"), "--dataset_name", "d", "--use_peft", "--config",
                                  str(tmp_path / "lr.yaml")])  # fmt: skip
    assert after_warm_start(args, config) == {} and config.learning_rate == 5e-4
    (tmp_path / "run.yaml").write_text("num_generations: 4\n")
    _, config, _ = parse_args(["--model", str(tmp_path / "big"), "--dataset_name", "d", "--config",
                               str(tmp_path / "run.yaml")])  # fmt: skip
    assert config.num_generations == 4 and config.max_steps == recipe["grpo"]["max_steps"] == 20
    big = str(tmp_path / "big")
    _, config, _ = parse_args(["--method", "distill", "--model", big, "--teacher_model_name_or_path", big])
    assert (config.max_steps, config.max_completion_length) == (20, 32) != (200, 64)  # the method's own: 200, 64
    args, config, _ = parse_args(["--model", str(tiny_pretrained), "--dataset_name", "d"])
    assert args.sized == {} and config.max_steps == 300 and args.eval_prompts is None


def test_alike_share_counts_the_prompts_whose_completions_all_score_alike_by_the_weighted_sum():
    from minirope.posttraining.measures import alike_share

    values = {"exact": [[0.0, 0.0], [1.0, 0.0], [None, 0.0]], "length": [[0.3, 0.3], [0.1, 0.1], [0.2, 0.5]]}
    assert alike_share(values, None) == 1 / 3  # the first prompt alone: the third differs by length (None counts 0)
    assert alike_share(values, [1.0, 0.0]) == 2 / 3  # length measured only: the third's exact values are 0 and 0
    assert alike_share({}, None) is None


def test_keep_best_restores_the_weights_of_the_best_measure(tiny_pretrained):
    """Scores 0.1 (start), 0.3, 0.2: the weights of the second measure are put back, and the line names its step."""
    from minirope.posttraining.keep_best import KeepBest

    model = AutoModelForCausalLM.from_pretrained(tiny_pretrained)
    scores = iter([0.3, 0.2])
    keep = KeepBest(lambda model: next(scores), every=1)
    keep.start(0.1, model)
    weights = {}
    for step in (1, 2):
        with torch.no_grad():
            for param in model.parameters():
                param.add_(step)
        weights[step] = {name: value.clone() for name, value in model.state_dict().items()}
        keep.record(model, step)
    selection = keep.restore_best(model)
    assert selection.kept_step == 1 and selection.gained
    assert all(torch.equal(value, weights[1][name]) for name, value in model.state_dict().items())
    assert selection.line("exact (greedy)") == "held-out exact (greedy) 0.100 -> 0.300: kept step 1 of 2"


def test_a_killed_grpo_run_resumes_from_its_checkpoint_to_the_uninterrupted_weights(tiny_pretrained, tmp_path,
                                                                                    monkeypatch, capsys):  # fmt: skip
    """A run with checkpoints every 2 of 4 steps, and the folder a run killed after its first checkpoint leaves (that
    checkpoint alone): `--resume_from_checkpoint last` keeps the checkpoint, says nothing of removing it, and ends
    with the uninterrupted run's weights and measures."""
    flags = [*user_task(tmp_path, monkeypatch), "--model_name_or_path", str(tiny_pretrained), "--max_steps", "4",
             "--save_strategy", "steps", "--save_steps", "2", "--eval_steps", "1"]  # fmt: skip
    want = posttrain.run([*flags, "--output_dir", str(tmp_path / "whole")])
    killed = tmp_path / "killed"
    killed.mkdir()
    shutil.copytree(tmp_path / "whole" / "checkpoint-2", killed / "checkpoint-2")
    capsys.readouterr()
    got = posttrain.run([*flags, "--output_dir", str(killed), "--resume_from_checkpoint", "last"])
    assert "removed" not in capsys.readouterr().out and (killed / "checkpoint-2" / "trainer_state.json").is_file()
    whole, resumed = load_file(tmp_path / "whole" / "model.safetensors"), load_file(killed / "model.safetensors")
    assert all(torch.allclose(resumed[name], whole[name], atol=1e-6) for name in whole)
    assert got["kept"] == want["kept"] and got["steps"] == want["steps"] == 4


def test_the_warm_started_model_is_read_back_with_the_runs_dtype_and_attention(tiny_pretrained):
    from types import SimpleNamespace

    from minirope.posttraining.configs import PosttrainModelConfig
    from minirope.posttraining.warm_start import load_warm_started

    model_args = PosttrainModelConfig(model_name_or_path=str(tiny_pretrained), dtype="bfloat16",
                                      attn_implementation="eager")  # fmt: skip
    model = load_warm_started(tiny_pretrained, SimpleNamespace(trust_remote_code=False), model_args)
    assert model.dtype == torch.bfloat16 and model.config._attn_implementation == "eager"


# full weights in `make test-slow` (the suite's default run is at its time limit on a 2-core Zen 3): the default run
# resumes them without a warm start (test_a_killed_grpo_run_resumes_...) and with one under LoRA here
@pytest.mark.parametrize("lora", [pytest.param(False, marks=pytest.mark.slow), True])
def test_a_run_with_a_warm_start_killed_after_its_second_checkpoint_resumes_to_the_uninterrupted_weights(
    tiny_pretrained, tmp_path, monkeypatch, capsys, lora
):
    """GRPO after a warm start on demonstrations (`--sft_train_file`, `--sft_steps 2`), checkpoints every step, the
    held-out score of steps 1-4 patched so that the middle step 2 is the best: the folder a run killed after its
    second checkpoint leaves (`checkpoint-1`, `checkpoint-2` and the warm start's `_warm_start/`), resumed with
    `--resume_from_checkpoint last`, takes the warm start from there without training it again and ends with the
    uninterrupted run's weights (<= 1e-6), kept step and measures; with LoRA (an adapter in the checkpoints) and
    without."""
    from minirope.posttraining.keep_best import KeepBest
    from minirope.posttraining.warm_start import WARM_START_FOLDER

    scores = {1: 5.0, 2: 9.0, 3: 6.0, 4: 7.0}  # above any real score of the start (a reward in [0, 1])
    record = KeepBest.record
    monkeypatch.setattr(KeepBest, "record", lambda self, model, step, score=None: record(
        self, model, step, scores[step] if score is None else score))  # fmt: skip
    demonstrations = tmp_path / "answers.jsonl"
    demonstrations.write_text("".join(json.dumps({"prompt": f"{name}:\n", "completion": f"{name[:2].lower()}\n"}) + "\n"
                                      for name in ("ROMEO", "JULIET", "HAMLET") * 4))  # fmt: skip
    flags = [*user_task(tmp_path, monkeypatch), "--model_name_or_path", str(tiny_pretrained), "--max_steps", "4",
             "--sft_train_file", str(demonstrations), "--sft_steps", "2", "--save_strategy", "steps", "--save_steps",
             "1", "--eval_steps", "1", *(["--use_peft"] if lora else [])]  # fmt: skip
    want = posttrain.run([*flags, "--output_dir", str(tmp_path / "whole")])
    assert want["kept"]["kept_step"] == 2 and (tmp_path / "whole" / WARM_START_FOLDER).is_dir()  # checkpoints remain
    killed = tmp_path / "killed"
    killed.mkdir()
    for name in ("checkpoint-1", "checkpoint-2", WARM_START_FOLDER, ".minirope"):  # the marker: the run's folder
        shutil.copytree(tmp_path / "whole" / name, killed / name)
    monkeypatch.setattr(setup, "warm_start", lambda *args: pytest.fail("the warm start was trained again"))
    capsys.readouterr()
    got = posttrain.run([*flags, "--output_dir", str(killed), "--resume_from_checkpoint", "last"])
    assert "[minirope] warm start: the resumed run's (2 steps of SFT on answers.jsonl)" in capsys.readouterr().out
    whole, resumed = load_file(tmp_path / "whole" / "model.safetensors"), load_file(killed / "model.safetensors")
    assert all(torch.allclose(resumed[name], whole[name], atol=1e-6) for name in whole)
    assert got["kept"] == want["kept"] and got["warm_start"]["after"] == want["warm_start"]["after"]


@pytest.mark.parametrize("method", ["grpo", "dpo"])
def test_the_corpus_term_gives_the_same_update_with_gradient_accumulation(
    method, tiny_post, tiny_pretrained, tmp_path, monkeypatch
):
    """The method's own gradient is made zero, so a plain SGD step (no clipping) moves the weights by the corpus term
    alone: GRPO with every reward equal (zero advantages) and beta 0 (no KL term); DPO on pairs whose chosen and
    rejected completions are the same text (the log-ratio margin and its gradient are 0). 4 blocks in one micro-batch
    and 2 + 2 over two accumulated micro-batches must give the same step (TRL 1.16's trainers scale their own loss for
    accumulation inside compute_loss; a term added there would have weighed twice as much)."""
    (tmp_path / "flat.py").write_text("def flat(completions, **kwargs):\n    return [1.0] * len(completions)\n")
    monkeypatch.chdir(tmp_path)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(shakespeare_dataset()["validation"]["text"][0][:6000])
    pairs = tmp_path / "pairs.jsonl"
    line = "But soft, what light through yonder window breaks?\n"
    pairs.write_text("".join(json.dumps({"prompt": f"ROMEO {i}:\n", "chosen": line, "rejected": line}) + "\n"
                             for i in range(8)))  # fmt: skip
    own = {
        "grpo": [
            "--reward_funcs",
            "flat.flat",
            "--beta",
            "0",
            "--num_generations",
            "2",
            "--max_completion_length",
            "8",
        ],
        "dpo": ["--train_file", str(pairs), "--max_length", "32"],
    }[method]
    common = [
        "--method", method, "--model_name_or_path", str(tiny_pretrained), *tiny_post, "--max_steps", "1", *own,
        "--optim", "sgd", "--learning_rate", "1", "--max_grad_norm", "0", "--lr_scheduler_type", "constant",
        "--lm_train_file", str(corpus), "--lm_coef", "1", "--sft_steps", "0",
        "--bf16", "False",  # float32 on every CPU: a bf16 sum rounds at 2**-8 differently over 4 and 2 + 2 blocks
    ]  # fmt: skip
    runs = {
        "one": ["--per_device_train_batch_size", "4", "--lm_batch_size", "4"],
        "two": ["--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "2", "--lm_batch_size", "2"],
    }
    weights = {}
    for name, flags in runs.items():
        posttrain.run([*common, *flags, "--output_dir", str(tmp_path / name)])
        weights[name] = AutoModelForCausalLM.from_pretrained(tmp_path / name).state_dict()
    start = AutoModelForCausalLM.from_pretrained(tiny_pretrained).state_dict()
    moved = [name for name in start if not torch.equal(start[name], weights["one"][name])]
    assert moved  # the corpus term moved the weights
    for name in start:
        torch.testing.assert_close(weights["two"][name], weights["one"][name], rtol=1e-4, atol=1e-6)


def test_the_corpus_term_is_refused_under_deepspeed():
    """The corpus term's second backward pass is not DeepSpeed's: a run that would mix them is refused when prepared
    (before anything is written); without a corpus, or with its weights at 0, DeepSpeed is left alone."""
    from types import SimpleNamespace

    from minirope.posttraining.corpus import check_corpus_term

    deepspeed, plain = SimpleNamespace(deepspeed="ds_config.json"), SimpleNamespace(deepspeed=None)
    term = SimpleNamespace(shards=["text"], coef=0.5, warm_coef=0.0)
    with pytest.raises(ValueError, match=r"the corpus term \(--lm_coef 0.5, during the warm start 0.0\) .* DeepSpeed"):
        check_corpus_term(term, deepspeed)
    check_corpus_term(term, plain)
    check_corpus_term(SimpleNamespace(shards=["text"], coef=0.0, warm_coef=0.0), deepspeed)
    check_corpus_term(SimpleNamespace(shards=None, coef=0.5, warm_coef=0.5), deepspeed)
