"""The training commands' `TrainingArguments`, how command lines are parsed, and what every run does first.

Defaults decided for the machine at hand, each by measurement: bf16 where bf16 matrix multiplications are clearly faster
than float32 ones (`choose_bf16`), `torch.compile` where bf16 runs, eager attention where a CPU run compiles, and glibc
keeping freed memory for the next step (`reuse_freed_memory`).
"""

import ctypes
import ctypes.util
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch
import yaml
from transformers import HfArgumentParser, TrainingArguments, set_seed
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from minirope.data.documents import read_utf8
from minirope.folders import check_output, first_line
from minirope.output.folder import claim
from minirope.output.hub import TokenNotSaved, check_push
from minirope.training.checkpoints import resolve_resume, resume_requested
from minirope.training.optimizers import MUON_MOMENTUM
from minirope.training.precision import decide_bf16

# LoRA's default target modules (minirope-finetune --lora, minirope-posttrain --use_peft): every projection of
# attention and the MLP, as QLoRA found best (Dettmers et al. 2023, section 4)
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
OPTIM_HIDDEN_HELP = (
    "Optimizer of the decoder's hidden matrices: adamw (--optim, like every other parameter) or muon (Muon, with "
    "AdamW for the embeddings, LM head and norms; same --learning_rate, --weight_decay and schedule: "
    "minirope.training.optimizers)."
)


def retuned(config: type, name: str, default: object) -> object:
    """A dataclass field for the flag `name` of `config` (`TrainingArguments`, a TRL config) with a new `default` and
    its own help text, which `--help` shows with the default (a bare `name: type = value` in a subclass would drop
    both)."""
    metadata = next(item for item in fields(config) if item.name == name).metadata
    if isinstance(default, list | dict):
        return field(default_factory=lambda: type(default)(default), metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass
class MiniRopeTrainingArguments(TokenNotSaved, TrainingArguments):
    """`TrainingArguments` with the defaults the minirope commands share, `--overwrite_output_dir` and
    `--attn_implementation`."""

    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Replace a model of another architecture that minirope wrote in --output_dir, or write the run "
            "into a folder of your files (they are left as they are)."
        },
    )
    attn_implementation: str | None = field(
        default=None,
        metadata={
            "help": "eager, sdpa, flash_attention_2, ... Default: eager for a compiled model on CPU (Inductor "
            "fuses its softmax; PyTorch's CPU flash-attention kernel is slower there), else sdpa."
        },
    )
    bf16: bool | None = field(
        default=None,
        metadata={
            "help": "bf16 mixed precision. Default: on where bf16 matmuls run 1.5x faster than float32 ones "
            "or more (timed once per machine, printed; see minirope.training.precision.choose_bf16), else float32."
        },
    )
    use_cpu: bool | None = field(
        default=None, metadata={"help": "Train on the CPU. Default: only where there is no GPU or accelerator."}
    )
    measured_matmuls: bool = field(
        default=True,
        metadata={
            "help": "In a float32 eager run on a CPU: the matmuls of more than 8 rows on oneDNN wherever this "
            "machine measures it faster than torch's default (timed once per CPU and weight shape, cached, printed; "
            "minirope.cpu_matmuls). False: torch's matmuls, as Llama's."
        },
    )
    optim_hidden: str = field(default="adamw", metadata={"help": OPTIM_HIDDEN_HELP})
    muon_momentum: float = field(
        default=MUON_MOMENTUM, metadata={"help": "With --optim_hidden muon: Muon's Nesterov momentum, in [0, 1)."}
    )
    per_device_eval_batch_size: int = retuned(TrainingArguments, "per_device_eval_batch_size", 32)
    lr_scheduler_type: str = retuned(TrainingArguments, "lr_scheduler_type", "cosine")
    hub_strategy: str = field(
        default="end",
        metadata={
            "help": "With --push_to_hub: end (the finished folder, pushed once when the run ends; the default here), "
            "every_save, checkpoint (also the last checkpoint, to resume from) or all_checkpoints."
        },
    )
    seed: int = retuned(TrainingArguments, "seed", 42)

    def __post_init__(self) -> None:
        if self.use_cpu is None:  # with an accelerator, Trainer/accelerate place the model on it
            self.use_cpu = not torch.accelerator.is_available()
        self.precision_line = decide_bf16(self)  # the line that says why, when the precision was chosen here
        if self.torch_compile is None:  # a script's "decide for me" default: compile where bf16 runs
            self.torch_compile = self.bf16
        super().__post_init__()
        self.check_ranges()

    def check_ranges(self) -> None:
        """Raise `ValueError` for a flag outside its range, when the flags are parsed (before any work)."""
        at_least = {
            "per_device_train_batch_size": 1,
            "per_device_eval_batch_size": 1,
            "gradient_accumulation_steps": 1,
            "warmup_steps": 0,
            "weight_decay": 0,
            "max_grad_norm": 0,
            "seed": 0,
            "dataloader_num_workers": 0,
        }
        for name, low in at_least.items():
            if getattr(self, name) < low:
                raise ValueError(f"--{name} must be >= {low}, got {getattr(self, name)}.")
        if not self.learning_rate > 0:
            raise ValueError(f"--learning_rate must be > 0, got {self.learning_rate}: e.g. 3e-4.")
        if self.max_steps == 0 or self.max_steps < -1:
            raise ValueError(f"--max_steps must be > 0, or -1 to train for --num_train_epochs, got {self.max_steps}.")
        if self.max_steps == -1 and not self.num_train_epochs > 0:
            raise ValueError(f"--num_train_epochs must be > 0 with --max_steps -1, got {self.num_train_epochs}.")
        for strategy, steps in (
            ("eval_strategy", "eval_steps"),
            ("save_strategy", "save_steps"),
            ("logging_strategy", "logging_steps"),
        ):
            value = getattr(self, steps)
            if getattr(getattr(self, strategy), "value", getattr(self, strategy)) == "steps" and not (
                value and value > 0
            ):
                raise ValueError(f"--{steps} must be > 0 with --{strategy} steps, got {value}.")
        if self.save_total_limit is not None and self.save_total_limit < 1:
            raise ValueError(
                f"--save_total_limit must be >= 1 (or unset: keep every checkpoint), got {self.save_total_limit}."
            )
        if self.seed >= 2**32:
            raise ValueError(f"--seed must be below 2**32, got {self.seed}.")
        if not 0 <= self.muon_momentum < 1:
            raise ValueError(f"--muon_momentum must be in [0, 1), got {self.muon_momentum}: e.g. 0.95.")
        if self.optim_hidden not in ("adamw", "muon"):
            raise ValueError(f"--optim_hidden must be adamw or muon, got {self.optim_hidden!r}.")
        optim = getattr(self.optim, "value", self.optim)
        if self.optim_hidden == "muon" and optim not in ("adamw_torch", "adamw_torch_fused"):
            raise ValueError(
                f"--optim {optim} does not combine with --optim_hidden muon (Muon trains the hidden matrices, "
                f"torch's AdamW the rest): add --optim_hidden adamw to train every parameter with {optim}."
            )
        known = ("eager", *ALL_ATTENTION_FUNCTIONS.valid_keys())
        if self.attn_implementation is not None and self.attn_implementation not in known:
            raise ValueError(f"--attn_implementation {self.attn_implementation!r} is not one of {', '.join(known)}.")

    def attention(self) -> str:
        """`--attn_implementation`, or the default: `eager` for a compiled model on CPU, else `sdpa`.

        Measured on 2-core CPUs: compiled in bf16 (16 x 256 tokens, AVX-512 BF16), 0.32 s a step with eager
        attention (matrix multiplications plus a softmax Inductor fuses) against 0.43 s with PyTorch's CPU
        flash-attention kernel behind `sdpa`; in eager float32 (the default pretraining step, 8 x 256 tokens, AVX2),
        116.7 ms a step with `sdpa` against 119.2 ms with eager (medians of 10 alternating rounds of 25 steps;
        2 % faster). Same function: `tests/test_model_conformance.py` checks eager = sdpa.
        """
        compiled_on_cpu = self.device.type == "cpu" and self.torch_compile
        return self.attn_implementation or ("eager" if compiled_on_cpu else "sdpa")


def read_arguments_file(path: str | Path, flag: str | None = None) -> dict:
    """The flags of an arguments file: JSON (`{"flag": value, ...}`, as `HfArgumentParser.parse_json_file` reads a
    single `.json` argument) or, given by a `flag` (TRL's `--config`), YAML, as `TrlParser` reads it. The one reader
    of arguments files for every command.

    Raises:
        ValueError: the file is missing, not JSON/YAML (naming the problem) or not one mapping of flags.
    """
    path, label = Path(path), f"{flag} {path}" if flag else f"arguments file {path}"
    if not path.is_file():
        raise ValueError(f"{label} does not exist: check the path.")
    try:
        arguments = yaml.safe_load(read_utf8(path)) if flag else json.loads(read_utf8(path))
    except json.JSONDecodeError as error:
        raise ValueError(f"{label} is not JSON ({error.msg}, line {error.lineno}).") from None
    except yaml.YAMLError as error:
        raise ValueError(f"{label} is not YAML ({first_line(error)}).") from None
    if not isinstance(arguments, dict):
        example = "as `trl grpo --config` reads one" if flag else 'e.g. {"learning_rate": 0.001, "max_steps": 100}'
        raise ValueError(f"{label} must hold one mapping of flag names and values ({example}).")
    return arguments


def json_arguments(argv: list[str]) -> str | None:
    """The path of a single `.json` argument (a file of arguments, as transformers' example scripts take one)."""
    return argv[0] if len(argv) == 1 and argv[0].endswith(".json") else None


def parse_cli_args(dataclass_types: tuple, argv: list[str] | None = None) -> tuple:
    """`HfArgumentParser` over `dataclass_types`; a single `.json` argument is read as a file of arguments. The last
    dataclass (the `TrainingArguments`) gets `given`: the flags the user set (`given_flags`).

    Raises:
        ValueError: a flag outside its range (the dataclasses' checks), or an arguments file that is missing, not
            JSON (naming its line) or holds keys no flag has.
    """
    parser = HfArgumentParser(dataclass_types)
    argv = sys.argv[1:] if argv is None else argv
    file = read_arguments_file(argv[0]) if json_arguments(argv) else None
    parsed = parser.parse_dict(file) if file is not None else parser.parse_args_into_dataclasses(args=argv)
    parsed[-1].given = given_flags(argv, file or {})
    return parsed


def given_flags(argv: list[str], arguments: dict) -> frozenset[str]:
    """The flags the user set, by field name: each `--name` / `--name=value` (or `--name-with-dashes`) of `argv`,
    and each key of the `--config` YAML file or JSON arguments file (`arguments`). A sized default or a measured
    choice (`sizing`, the precision) applies only to a flag not among them, whatever value the user gave."""
    named = {item[2:].split("=", 1)[0].replace("-", "_") for item in argv if item.startswith("--")}
    return frozenset(named | set(arguments))


def take_flags(argv: list[str], names) -> tuple[list[str], dict[str, str]]:
    """`argv` without the flags `names` (each `--name value` or `--name=value`), and the value each had there (the
    last one given; "" for a flag at the end without one): how an earlier flag is read before it reaches the parser."""
    out, taken, items = [], {}, iter(argv)
    for item in items:
        flag, equals, value = item.partition("=")
        if flag.startswith("--") and flag[2:] in names:
            taken[flag[2:]] = value if equals else next(items, "")
        else:
            out.append(item)
    return out, taken


def reuse_freed_memory() -> bool:
    """Keep memory freed by one training step for the next (glibc on Linux; CPU training).

    By default glibc returns large freed blocks to the OS, so every step page-faults its activations back in,
    which on the benchmark machine costs more than some of the arithmetic. This serves allocations up to 32 MiB
    (glibc's ceiling) from the heap and never trims it: the default pretraining step went from 0.61 to 0.42 s.
    The process keeps its peak resident memory until it exits. Returns whether glibc accepted the settings.
    """
    path = ctypes.util.find_library("c")
    if sys.platform != "linux" or path is None:
        return False
    libc = ctypes.CDLL(path)
    if not hasattr(libc, "mallopt"):  # not glibc
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(libc.mallopt(m_mmap_threshold, 32 * 2**20)) and bool(libc.mallopt(m_trim_threshold, 2**30))


@dataclass
class RunStart:
    """What every training run knows when it starts: the clock, the output folder and the checkpoint to resume."""

    started: float
    output_dir: Path
    resume: str | None

    def seconds(self) -> float:
        return round(time.perf_counter() - self.started, 1)


def start_run(dataclass_types: tuple, argv: list[str] | None, inputs: Callable[..., dict]) -> tuple:
    """Parse `argv` into `dataclass_types` (the last one a `TrainingArguments`), seed, tune the allocator on CPU, check
    the output folder against the run's `inputs` (a function of the parsed arguments: flag -> path), with
    `--push_to_hub` check the push can happen, check the output folder is the run's to write (`claim`),
    and find the checkpoint to resume (on the Hub too): every check before anything is written or downloaded. Returns
    the parsed arguments followed by a `RunStart`.

    Raises:
        FileNotFoundError: `--resume_from_checkpoint` names no checkpoint (see `resolve_resume`).
        ValueError: an output folder that is an input, holds one or is not the run's to write (`claim`); a push that
            cannot happen (`minirope.output.hub.check_push`).
    """
    started = time.perf_counter()
    *arguments, training_args = parse_cli_args(dataclass_types, argv)
    set_seed(training_args.seed)
    if training_args.precision_line:  # chosen here, not by a flag: said before any work
        print(f"[minirope] {training_args.precision_line}; torch.compile: {training_args.torch_compile}")
    check_output(training_args.output_dir, "--output_dir", inputs(*arguments))
    check_push(training_args)
    claim(training_args.output_dir, training_args.overwrite_output_dir, resume_requested(training_args))
    if training_args.device.type == "cpu":
        reuse_freed_memory()
    run = RunStart(started, Path(training_args.output_dir), resolve_resume(training_args))
    return (*arguments, training_args, run)
