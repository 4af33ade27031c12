"""The training commands' `TrainingArguments`, how command lines are parsed, and what every run does first.

Defaults decided for the machine at hand, each by measurement: bf16 where bf16 matrix products are faster than
float32 ones (`bf16_is_faster`), `torch.compile` where bf16 runs, eager attention when training on CPU, and glibc
keeping freed memory for the next step (`reuse_freed_memory`).
"""

import ctypes
import ctypes.util
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import HfArgumentParser, TrainingArguments, set_seed

from minirope.training.trainer import resolve_resume


def bf16_is_faster(device: torch.device, size: int = 512) -> bool:
    """Whether bf16 matrix products beat float32 ones on `device`, timed on one `(size, size)` product each.

    On CUDA, whether the GPU supports bf16. CPUs differ by two orders of magnitude: with AVX-512 BF16 or AMX,
    bf16 products run about 4x faster than float32; without them (e.g. AMD Zen 3, AVX2 only) PyTorch emulates
    bf16 about 150x slower (measured on this project's machines: 132 vs 0.9 GFLOP/s).
    """
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type != "cpu":
        return False
    seconds = {}
    for dtype in (torch.float32, torch.bfloat16):
        a = torch.randn(size, size, dtype=dtype)
        a @ a  # warm-up
        start = time.perf_counter()
        a @ a
        seconds[dtype] = time.perf_counter() - start
    return seconds[torch.bfloat16] < seconds[torch.float32]


@dataclass
class MiniRopeTrainingArguments(TrainingArguments):
    """`TrainingArguments` with the defaults the minirope commands share, `--overwrite_output_dir` and
    `--attn_implementation`."""

    overwrite_output_dir: bool = field(
        default=False, metadata={"help": "Replace a different model already in --output_dir."}
    )
    attn_implementation: str | None = field(
        default=None,
        metadata={
            "help": "eager, sdpa, flash_attention_2, ... Default: eager when training on CPU (PyTorch's CPU "
            "flash-attention kernel is slower for blocks this short), else sdpa."
        },
    )
    bf16: bool | None = field(
        default=None,
        metadata={
            "help": "bf16 mixed precision. Default: on where bf16 matrix products are faster than float32 "
            "(timed at start; see minirope.training.arguments.bf16_is_faster), else float32."
        },
    )
    use_cpu: bool | None = field(
        default=None, metadata={"help": "Train on the CPU. Default: only where there is no GPU or accelerator."}
    )
    per_device_eval_batch_size: int = 32
    lr_scheduler_type: str = "cosine"
    seed: int = 42

    def __post_init__(self) -> None:
        if self.use_cpu is None:  # with an accelerator, Trainer/accelerate place the model on it
            self.use_cpu = not torch.accelerator.is_available()
        if self.bf16 is None:
            device = torch.device("cpu") if self.use_cpu else torch.accelerator.current_accelerator()
            self.bf16 = bf16_is_faster(device)
        if self.torch_compile is None:  # a script's "decide for me" default: compile where bf16 runs
            self.torch_compile = self.bf16
        super().__post_init__()

    def attention(self) -> str:
        """`--attn_implementation`, or the default: `eager` on CPU, else `sdpa`.

        Measured on the default pretraining step (16 x 256 tokens, bf16, compiled, 2-core CPU): 0.32 s with eager
        attention (matrix products plus a softmax Inductor fuses) against 0.43 s with PyTorch's CPU
        flash-attention kernel behind `sdpa`. Same function: `tests/test_model_conformance.py` checks eager = sdpa.
        """
        return self.attn_implementation or ("eager" if self.device.type == "cpu" else "sdpa")


def parse_cli_args(dataclass_types: tuple, argv: list[str] | None = None) -> tuple:
    """`HfArgumentParser` over `dataclass_types`; a single `.json` argument is read as a file of arguments."""
    parser = HfArgumentParser(dataclass_types)
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 1 and argv[0].endswith(".json"):
        return parser.parse_json_file(argv[0])
    return parser.parse_args_into_dataclasses(args=argv)


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


def start_run(dataclass_types: tuple, argv: list[str] | None = None) -> tuple:
    """Parse `argv` into `dataclass_types` (the last one a `TrainingArguments`), seed, tune the allocator on CPU and
    find the checkpoint to resume. Returns the parsed arguments followed by a `RunStart`.

    Raises:
        FileNotFoundError: `--resume_from_checkpoint` names no checkpoint (see `resolve_resume`).
    """
    started = time.perf_counter()
    *arguments, training_args = parse_cli_args(dataclass_types, argv)
    set_seed(training_args.seed)
    if training_args.device.type == "cpu":
        reuse_freed_memory()
    run = RunStart(started, Path(training_args.output_dir), resolve_resume(training_args))
    return (*arguments, training_args, run)
