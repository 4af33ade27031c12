"""`minirope-posttrain`'s command line, read once: the method and the data named (`preparse`, which decides the
method's config class and the defaults sized from the model), the `--config` YAML file (TRL's) or a single JSON
arguments file (`arguments_file`), then TRL's `TrlParser` over `(PosttrainArguments, the method's config,
PosttrainModelConfig)`, recording which flags the user set (`given_flags`). The flags themselves are
`minirope.posttraining.arguments`'."""

import sys
from dataclasses import dataclass, field, fields
from pathlib import Path

from transformers import HfArgumentParser
from trl import TrlParser

from minirope.posttraining.arguments import (
    CONFIGS,
    METHODS,
    VERSE_CONFIGS,
    PosttrainArguments,
    PosttrainModelConfig,
)
from minirope.posttraining.sizing import count_parameters, sized_defaults
from minirope.training.arguments import given_flags, json_arguments, read_arguments_file


@dataclass
class Preparsed:
    """What decides the config class (the method, and whether data is given, else the verse task) and the defaults
    sized from the model (`sizing`)."""

    method: str = PosttrainArguments.__dataclass_fields__["method"].default
    dataset_name: str | None = None
    train_file: list[str] | None = None
    model_name_or_path: str | None = field(default=None, metadata={"aliases": ["--model"]})
    model_revision: str = field(default="main", metadata={"aliases": ["--revision"]})
    trust_remote_code: bool = False
    use_peft: bool = False

    def sized_defaults(self) -> dict:
        """The flags' defaults for this model (`sizing.sized_defaults`); {} without a model, a method or a config
        to read (each refused later, with its own message)."""
        if not self.model_name_or_path or self.method not in METHODS:
            return {}
        try:
            parameters = count_parameters(self.model_name_or_path, self.model_revision, self.trust_remote_code)
        except (ValueError, OSError):
            return {}
        return sized_defaults(self.method, parameters, self.use_peft)


def preparse(argv: list[str], arguments: dict) -> Preparsed:
    """`--method`, `--dataset_name` and `--train_file` of a command line, read by the argument parser over
    `arguments` (the keys of its `--config` YAML file or JSON arguments file); the method "grpo" when none names one
    (an unknown method is refused by `PosttrainArguments`)."""
    parser = HfArgumentParser(Preparsed, add_help=False)
    parser.set_defaults(**{key: value for key, value in arguments.items() if key in Preparsed.__annotations__})
    known, _ = parser.parse_known_args(args=[] if json_arguments(argv) else argv)
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
    the command line): TRL's `TrlParser` with `--config file.yaml` (the command line wins over the file), or a
    single JSON arguments file. The config's class is the method's (`CONFIGS`), or the verse task's without data.

    Raises:
        ValueError: an unknown method, a flag outside its range, or a missing or bad arguments file.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    argv = [part for item in argv for part in (item.split("=", 1) if item.startswith("--config=") else [item])]
    arguments = arguments_file(argv)
    known = preparse(argv, arguments)
    configs = CONFIGS if known.dataset_name or known.train_file else VERSE_CONFIGS
    types = (PosttrainArguments, configs.get(known.method, configs["grpo"]), PosttrainModelConfig)
    sized = known.sized_defaults()
    if json_arguments(argv):
        parsed = HfArgumentParser(types).parse_dict({**sized, **arguments})
    else:
        if arguments:
            flags = {item.name for kind in types for item in fields(kind)} | {"env"}  # TRL's `env:` sets variables
            unknown = sorted(set(arguments) - flags)
            if unknown:
                raise ValueError(f"--config {config_path(argv)}: {', '.join(unknown)} is not a flag of "
                                 f"minirope-posttrain --method {known.method} (--help lists them).")  # fmt: skip
        parser = TrlParser(types)
        parser.set_defaults(**sized)  # the YAML file's values, then the command line's, win
        parsed = parser.parse_args_and_config(args=argv)
    parsed[0].given = given_flags(argv, arguments)
    parsed[0].sized = {name: value for name, value in sized.items() if name not in parsed[0].given}
    return parsed
