"""Defaults sized from the model: what a run does with no flag but the model, the data and the rewards.

The methods' defaults (`arguments`) were measured on models minirope pretrains in minutes, 0.4M-5M parameters, where 300
GRPO steps of 64 completions take 3-6 minutes on 2 CPU cores. A released checkpoint is 30-1000 times larger, and the
same defaults would run for hours: SmolLM2-135M-Instruct takes 13-14 s for a GRPO step of 16 completions on a 2-core CPU
(docs/pretrained.md). Above `RELEASED_SIZE` parameters, the recipe `recipes/released_size.yaml` takes their place
(fewer, smaller steps; fewer, shorter measures; GRPO's LoRA adapter at its own learning rate, and after a warm start at
another: the stage `after_warm_start`; a shorter warm start on the data's answers: `answer_stage`). A flag given on the
command line or in the `--config` file always wins, and the run prints the sized values it used.
"""

from functools import cache

import torch
from transformers import AutoModelForCausalLM

from minirope.folders import ModelArguments, load_config
from minirope.posttraining.arguments import RECIPES, method_recipe
from minirope.training.arguments import read_arguments_file
from minirope.training.sizing import CHECKPOINTING, larger

RECIPE = RECIPES / "released_size.yaml"
STAGE = "answer_warm_start"  # the recipes' stage of the warm start on the data's answers (`answer_stage`)


def count_parameters(model_name_or_path: str, revision: str = "main", trust_remote_code: bool = False) -> int:
    """The model's parameters (tied weights once), from its config alone: the model is built on the meta device, no
    weight is read.

    Raises:
        ValueError: see `minirope.folders.load_config` (a missing folder, not a causal LM, an invalid config).
    """
    config = load_config(ModelArguments(model_name_or_path, trust_remote_code, revision))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    return sum(parameter.numel() for parameter in model.parameters())


@cache
def released_size_recipe() -> dict[str, dict]:
    """`RECIPE`'s sections (`every_method`, a method's, `<method>_use_peft`, `<method>_after_warm_start`), each a
    mapping of flags; `gradient_checkpointing` named as this transformers names it (`CHECKPOINTING`)."""
    sections = read_arguments_file(RECIPE, "recipe")
    return {section: {CHECKPOINTING if name == "gradient_checkpointing" else name: value
                      for name, value in flags.items()} for section, flags in sections.items()}  # fmt: skip


def sized_defaults(method: str, parameters: int | None, use_peft: bool = False) -> dict:
    """The flags' defaults for a model of `parameters` running `method` (with a LoRA adapter: `use_peft`): {} up to
    `RELEASED_SIZE` (the methods' own defaults), else the recipe's, with its `<method>_use_peft` values under
    `use_peft`."""
    if not larger(parameters):
        return {}
    recipe = released_size_recipe()
    lora = recipe.get(f"{method}_use_peft", {}) if use_peft else {}
    return {**recipe["every_method"], **recipe.get(method, {}), **lora}


def answer_stage(method: str, parameters: int) -> tuple[dict, str]:
    """The stage `answer_warm_start` of the recipes for `method` and a model of `parameters`: its `failing_share` (at
    least this share of the held-out prompts' samples all scoring alike below full credit starts it) and `sft_steps`
    (at most this many steps, at most one epoch): the method recipe's, `RECIPE`'s over them above `RELEASED_SIZE`;
    with the recipes' paths."""
    stage, paths = dict(method_recipe(method)[STAGE]), [f"{RECIPES / method}.yaml"]
    if larger(parameters):
        stage, paths = {**stage, **released_size_recipe()[STAGE]}, [*paths, str(RECIPE)]
    return stage, " and ".join(paths)


def after_warm_start(args, config) -> dict:
    """The stage after a warm start: set on `config` the recipe's `<method>_after_warm_start` values where the run's
    value is a sized default (`args.sized`: no flag and no `--config` file set it); returns them."""
    stage = released_size_recipe().get(f"{args.method}_after_warm_start", {})
    changes = {name: value for name, value in stage.items() if name in args.sized}
    for name, value in changes.items():
        setattr(config, name, value)
    return changes
