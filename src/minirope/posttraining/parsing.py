"""`minirope-posttrain`'s command line, read once: the method, the task and the data named (`preparse`, which decides
the method's config class, the task's recipe and the defaults sized from the model), the `--config` YAML file (TRL's)
or a single JSON arguments file (`arguments_file`), then TRL's `TrlParser` over `(PosttrainArguments, the method's
config, PosttrainModelConfig)`, recording which flags the user set (`given_flags`). A flag's value comes from, in
order of precedence: the command line, the `--config` file, the defaults sized from the model, the task's recipe
(`recipe`), the method's recipe (`arguments.method_recipe`), then the method's TRL config."""

import json
import sys
from dataclasses import dataclass, field, fields
from importlib import import_module
from pathlib import Path

from transformers import HfArgumentParser
from trl import TrlParser

from minirope.posttraining.arguments import (
    EVERY_METHOD,
    METHODS,
    RECIPES,
    USER_SOURCES,
    PosttrainArguments,
    method_recipe,
)
from minirope.posttraining.configs import sft_mapping
from minirope.posttraining.sizing import RECIPE, STAGE, count_parameters, sized_defaults
from minirope.posttraining.tasks import bundled, default_task, recipe_path
from minirope.training.arguments import given_flags, json_arguments, read_arguments_file, take_flags
from minirope.training.heap import moved_trim_flag


@dataclass
class Preparsed:
    """What decides the config class (the method), the task and its recipe (`--task`, or none given: the data's, or
    without data the bundled `default_task`), the method recipe's sections and the defaults sized from the model
    (`sizing`)."""

    method: str = PosttrainArguments.__dataclass_fields__["method"].default
    task: str | None = None
    dataset_name: str | None = None
    train_file: list[str] | None = None
    datasets: list[str] | None = None  # TRL's dataset mixture (`--datasets`, or its mappings in a --config file)
    sft_train_file: list[str] | None = None  # takes the method recipe's `with_sft_train_file`
    model_name_or_path: str | None = field(default=None, metadata={"aliases": ["--model"]})
    model_revision: str = field(default="main", metadata={"aliases": ["--revision"]})
    trust_remote_code: bool = False
    use_peft: bool = False  # takes the method recipe's `with_use_peft`

    def sized_defaults(self) -> dict:
        """The flags' defaults for this model (`sizing.sized_defaults`); {} without a model or a config to read
        (each refused later, with its own message)."""
        if not self.model_name_or_path:
            return {}
        try:
            parameters = count_parameters(self.model_name_or_path, self.model_revision, self.trust_remote_code)
        except (ValueError, OSError):
            return {}
        return sized_defaults(self.method, parameters, self.use_peft)

    @property
    def task_name(self) -> str | None:
        """The run's task: `--task`, else None for the user's data, else (no data) the bundled `default_task()`."""
        return self.task or (None if self.dataset_name or self.train_file or self.datasets else default_task())


def defaults_help(method: str) -> str:
    """The end of `--help`: where the defaults shown come from, the bundled tasks, and how to print a run's own."""
    return (
        f"Defaults: the ones shown are TRL's and, for your data, minirope's recipe {RECIPES / f'{method}.yaml'} "
        f"over {EVERY_METHOD.name} beside it. "
        f"A --task's recipe (bundled tasks: {', '.join(bundled())}; with no data: {default_task()}) and, for a "
        f"model above 20M parameters, {RECIPE} take their place where no flag or --config "
        "sets them. --print_settings True prints a run's effective settings, each with its source, and exits "
        "reading no weights and writing nothing; a run prints them in its first lines and saves them in "
        "run_summary.json (`settings`)."
    )


RENAMED = {"eval_samples_per_prompt": "num_generations_eval", "validation_split_percentage": "test_split_size"}
PERCENT = {"validation_split_percentage"}  # earlier flags in percent whose flag now (RENAMED) takes a share
INTO_SFT_CONFIG = {"sft_learning_rate": "learning_rate", "sft_batch_size": "per_device_train_batch_size",
                   "sft_lm_coef": "lm_coef"}  # earlier flags: their key of --sft_config now  # fmt: skip
MERGED = ("sft_config",)  # mappings whose keys each layer sets one by one (a layer replaces the keys it names)


def renamed(argv: list[str], arguments: dict) -> list[str]:
    """`argv` with each flag of `RENAMED` under its name now (a `PERCENT` one's value as a share, before the flags
    given, which win) and those of `INTO_SFT_CONFIG` as keys of `--sft_config` (below the keys it gives), saying so.

    Raises:
        ValueError: the arguments file's `arguments` name an earlier flag (the file is the user's to edit), or an
            earlier flag's value that is not a number.
    """
    if old := sorted(set(arguments) & {*RENAMED, *INTO_SFT_CONFIG}):
        now = RENAMED.get(old[0]) or f"the {INTO_SFT_CONFIG.get(old[0])} key of sft_config"
        share = ", a share: 5 % is 0.05" if old[0] in PERCENT else ""
        raise ValueError(f"the arguments file sets {old[0]}, which is now {now} (TRL's name{share}): rename it.")
    argv, old = take_flags(argv, {*INTO_SFT_CONFIG, *PERCENT})
    into, out = {}, []
    for name, value in old.items():
        try:
            number = (int if name == "sft_batch_size" else float)(value)
        except ValueError:
            raise ValueError(f"--{name} {value!r}: not a number.") from None
        if name in PERCENT:
            argv = [f"--{RENAMED[name]}", f"{number / 100:g}", *argv]
            print(f"[minirope] --{name} {value} is now --{RENAMED[name]} {number / 100:g} (TRL's name, a share); the "
                  f"run takes it as that.")  # fmt: skip
            continue
        into[INTO_SFT_CONFIG[name]] = number
        print(f"[minirope] --{name} is now the {INTO_SFT_CONFIG[name]} key of --sft_config (the warm start's "
              f"SFTConfig flags); the run takes it as that.")  # fmt: skip
    for item in argv:
        flag, equals, value = item.partition("=")
        if flag[2:] in RENAMED and flag.startswith("--"):
            print(f"[minirope] {flag} is now --{RENAMED[flag[2:]]} (TRL's name); the run takes it as that.")
            item = f"--{RENAMED[flag[2:]]}{equals}{value}"
        out.extend(item.split("=", 1) if flag == "--sft_config" else [item])
    if into:  # below the keys --sft_config gives itself
        if "--sft_config" not in out[:-1]:
            out += ["--sft_config", "{}"]
        at = out.index("--sft_config") + 1
        out[at] = json.dumps({**into, **sft_mapping(out[at])})
    return out


def layered(*layers: dict) -> dict:
    """The flags of `layers`, each over the ones before it; a mapping of `MERGED` key by key."""
    out = {}
    for layer in layers:
        for name, value in layer.items():
            out[name] = {**out.get(name, {}), **value} if name in MERGED else value
    return out


SECTIONS = {"with_use_peft": "use_peft", "with_sft_train_file": "sft_train_file"}  # a method recipe's, by their flag


def method_defaults(known: Preparsed) -> dict:
    """The method recipe's flags (`arguments.method_recipe`), with those of each of its `SECTIONS` whose flag `known`
    sets over them (`layered`: the warm start's `sft_config` key by key); its stage (`sizing.STAGE`) is no flag."""
    recipe = method_recipe(known.method)
    sections = [recipe.get(section, {}) for section, flag in SECTIONS.items() if getattr(known, flag)]
    return layered({name: value for name, value in recipe.items() if name not in {*SECTIONS, STAGE}}, *sections)


TOGETHER = {"reward_funcs": ("reward_weights", "rejected_by")}  # a recipe's values that only go with its own rewards


def recipe(known: Preparsed, given: frozenset) -> tuple[dict, str | None]:
    """The flags the task's recipe sets for the method (`tasks.recipe_path`), less those the user set, and less the
    values that go with a recipe's flag the user replaced (`TOGETHER`: the recipe's reward weights with the user's
    rewards); `({}, None)` for the user's data, a task without a recipe, or `--help`.

    Raises:
        ValueError: an unknown task, or a recipe that is not a mapping of flags.
    """
    if known.task_name is None:
        return {}, None
    path = recipe_path(known.task_name, known.method)
    values = {} if path is None else read_arguments_file(path, "--task recipe")
    for name, others in TOGETHER.items():
        if name in given:
            values = {key: value for key, value in values.items() if key not in others}
    return {key: value for key, value in values.items() if key not in given or key in MERGED}, path and str(path)


def preparse(argv: list[str], arguments: dict) -> Preparsed:
    """`--method` and the data flags (`--dataset_name`, `--train_file`, `--datasets`) of a command line, read by the
    argument parser over `arguments` (the keys of its `--config` YAML file or JSON arguments file); the method "grpo"
    when none names one.

    Raises:
        ValueError: a method that is not one of `METHODS`.
    """
    parser = HfArgumentParser(Preparsed, add_help=False)
    parser.set_defaults(**{key: value for key, value in arguments.items() if key in Preparsed.__annotations__})
    known, _ = parser.parse_known_args(args=[] if json_arguments(argv) else argv)
    if known.method not in METHODS:
        raise ValueError(f"--method {known.method!r} is not one of {', '.join(METHODS)}.")
    return Preparsed(**vars(known))


def config_path(argv: list[str]) -> Path | None:
    """The file of `--config FILE` (TRL's YAML file of flags), None without the flag.

    Raises:
        ValueError: the flag without a file, or a path that is not a file.
    """
    if "--config" not in argv:
        return None
    at = argv.index("--config") + 1
    path = Path(argv[at]) if at < len(argv) else None
    if path is None or not path.is_file():
        raise ValueError(f"--config {path or ''}: no such file; give a YAML file of flags (as `trl grpo --config`).")
    return path


def arguments_file(argv: list[str]) -> dict:
    """The flags a `--config file.yaml` (TRL's) or a single `.json` argument sets, read once; {} for neither.

    Raises:
        ValueError: a missing file, or one that is not JSON/YAML or not a mapping of flags.
    """
    if json_arguments(argv):
        return read_arguments_file(argv[0])
    path = config_path(argv)
    arguments = {} if path is None else read_arguments_file(path, "--config")
    hub = sorted(name for name in arguments.get("env") or {} if str(name).upper().startswith(("HF_", "HUGGING")))
    if hub:
        raise ValueError(
            f"--config {path} sets {', '.join(hub)} in its env: block, which would send your token or pushes where the "
            f"file says: set Hub variables in your own shell (or `hf auth login`), not in a config file."
        )
    return arguments


def parse_args(argv: list[str] | None = None) -> tuple:
    """`(PosttrainArguments, the method's TRL config, PosttrainModelConfig)`, TRL's script order, from `argv` (default:
    the command line; a first word `grpo`, `dpo` or `distill` is `--method`'s): TRL's `TrlParser` with `--config
    file.yaml` (the command line wins over the file), or a single JSON arguments file, over the method script's
    dataclasses (`<method>.ARGUMENTS`), the recipes and sized defaults as the parser's defaults (`layered`).

    Raises:
        ValueError: an unknown method, a flag outside its range, or a missing or bad arguments file.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in METHODS:  # the subcommand form: `minirope-posttrain grpo ...`, as `trl grpo ...`
        if any(item == "--method" or item.startswith("--method=") for item in argv):
            raise ValueError(f"give the method once: `minirope-posttrain {argv[0]} ...` or `--method {argv[0]}`.")
        argv = ["--method", *argv]
    argv = [part for item in argv for part in (item.split("=", 1) if item.startswith("--config=") else [item])]
    arguments = arguments_file(argv)
    argv = renamed(moved_trim_flag(argv), arguments)
    known = preparse(argv, arguments)
    types = import_module(f"minirope.posttraining.{known.method}").ARGUMENTS
    sized = known.sized_defaults()
    given = given_flags(argv, arguments)
    recipe_values, path = ({}, None) if {"-h", "--help"} & set(argv) else recipe(known, given)
    own = method_defaults(known)
    defaults = layered(own, recipe_values, sized)
    if json_arguments(argv):
        parsed = HfArgumentParser(types).parse_dict({**defaults, **arguments})
    else:
        if arguments:
            flags = {item.name for kind in types for item in fields(kind)} | {"env"}  # TRL's `env:` sets variables
            if unknown := sorted(set(arguments) - flags):
                raise ValueError(f"--config {config_path(argv)}: {', '.join(unknown)} is not a flag of "
                                 f"minirope-posttrain --method {known.method} (--help lists them).")  # fmt: skip
        parser = TrlParser(types, epilog=defaults_help(known.method))
        parser.set_defaults(**defaults)  # the YAML file's values, then the command line's, win
        parsed = parser.parse_args_and_config(args=argv)
    args = parsed[0]
    args.given, args.task, args.command_line = given, known.task_name, given_flags(argv, {})
    args.sized = {name: value for name, value in sized.items() if name not in given}
    args.recipe = {name: value for name, value in recipe_values.items() if name not in args.sized}
    args.recipe_path = path
    args.method_recipe = {name: value for name, value in own.items() if name not in {*given, *args.sized, *args.recipe}}
    merge_sft_config(args, defaults, arguments, (own, recipe_values, sized))
    return parsed


def merge_sft_config(args, defaults: dict, arguments: dict, layers: tuple[dict, dict, dict]) -> None:
    """`args.sft_config` key by key: the `--config` file's keys over the defaults' (`layers`: the method recipe, the
    task's recipe, the sized defaults), the command line's over both; each key's source."""
    given = args.sft_config if "sft_config" in args.command_line else {}
    in_file = sft_mapping(arguments.get("sft_config"), "the --config file's sft_config")
    args.sft_config = {**defaults.get("sft_config", {}), **in_file, **args.sft_config}
    sources = zip(("method recipe", "recipe", "sized", *reversed(USER_SOURCES)),
                  (*(layer.get("sft_config") or {} for layer in layers), in_file, given), strict=True)  # fmt: skip
    args.sft_sources = {key: source for source, layer in sources for key in layer}
