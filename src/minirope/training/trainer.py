"""The Trainer the minirope scripts use: transformers' `Trainer` with a guard against non-finite losses."""

import ctypes
import ctypes.util
import inspect
import json
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import HfArgumentParser, Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, unwrap_peft_model

from minirope.training.blocks import BlockStream

STREAM_STATE = "stream_state.json"


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
    """`TrainingArguments` with the defaults both minirope scripts share, plus `--overwrite_output_dir`."""

    overwrite_output_dir: bool = field(
        default=False, metadata={"help": "Replace a different model already in --output_dir."}
    )
    bf16: bool | None = field(
        default=None,
        metadata={
            "help": "bf16 mixed precision. Default: on where bf16 matrix products are faster than float32 "
            "(timed at start; see minirope.training.trainer.bf16_is_faster), else float32."
        },
    )
    # CPU only where there is no GPU/accelerator (with one, Trainer/accelerate place the model on it).
    use_cpu: bool = not torch.accelerator.is_available()
    per_device_eval_batch_size: int = 32
    lr_scheduler_type: str = "cosine"
    seed: int = 42

    def __post_init__(self) -> None:
        if self.bf16 is None:
            device = torch.device("cpu") if self.use_cpu else torch.accelerator.current_accelerator()
            self.bf16 = bf16_is_faster(device)
        if self.torch_compile is None:  # a script's "decide for me" default: compile where bf16 runs
            self.torch_compile = self.bf16
        super().__post_init__()


def parse_cli_args(dataclass_types: tuple, argv: list[str] | None = None) -> tuple:
    """`HfArgumentParser` over `dataclass_types`; a single `.json` argument is read as a file of arguments."""
    parser = HfArgumentParser(dataclass_types)
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 1 and argv[0].endswith(".json"):
        return parser.parse_json_file(argv[0])
    return parser.parse_args_into_dataclasses(args=argv)


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite; raised before the optimizer step, so no update is applied."""


class MiniRopeTrainer(Trainer):
    """`Trainer` that stops on a NaN/inf loss, and leaves the model card to minirope.

    The check reads one scalar per micro-batch (a device sync on GPU, free on CPU). It runs before the
    optimizer step, so the weights, and every checkpoint already written, hold only finite values.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # Decided once, as Trainer decides `model_accepts_loss_kwargs` (a LoRA model reports its base model's).
        model = unwrap_peft_model(self.accelerator.unwrap_model(self.model))
        self.model_accepts_skip_logits = "skip_logits" in inspect.signature(model.forward).parameters
        self.stream_position: StreamPosition | None = None
        if isinstance(self.train_dataset, BlockStream):
            # Every process reads the whole stream and keeps its part of each global batch (accelerate's
            # IterableDatasetShard, once batch dispatching is off): the same global batches as one process, and
            # the same position in every process. With dispatching (accelerate's default for a stream: process
            # 0 reads and sends) the position saved counted a batch read ahead, and a resumed run drifted.
            if self.args.dataloader_num_workers:
                raise ValueError(
                    "--streaming reads and tokenizes the stream in the training process: drop "
                    "--dataloader_num_workers (or set it to 0)."
                )
            self.accelerator.dataloader_config.dispatch_batches = False
            self.stream_position = StreamPosition(self.train_dataset)
            self.add_callback(self.stream_position)

    def train(self, resume_from_checkpoint=None, **kwargs):
        """`Trainer.train`; resuming a stream from a checkpoint continues the stream from the position saved in
        it (`StreamPosition`) instead of reading and skipping every batch already trained (`ignore_data_skip`).

        Raises:
            FileNotFoundError: resuming a stream from a checkpoint that holds no stream position.
        """
        if self.stream_position is not None and isinstance(resume_from_checkpoint, str):
            state_file = Path(resume_from_checkpoint) / STREAM_STATE
            if not state_file.is_file():
                raise FileNotFoundError(
                    f"{resume_from_checkpoint} holds no {STREAM_STATE}, the stream's position: resume a streaming run "
                    f"from a checkpoint of a streaming run."
                )
            self.stream_position.resume_state = json.loads(state_file.read_text())
            self.args.ignore_data_skip = True
        return super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)

    def training_step(self, model, inputs, num_items_in_batch=None) -> torch.Tensor:
        loss = super().training_step(model, inputs, num_items_in_batch)
        if not torch.isfinite(loss).all():
            last = last_complete_checkpoint(self.args.output_dir)
            raise NonFiniteLossError(
                f"the training loss became {loss.item()} at step {self.state.global_step + 1}; training stopped "
                f"before that update. Last good checkpoint: {last or 'none saved yet'}. Lower --learning_rate, "
                f"raise --warmup_steps or keep --max_grad_norm > 0, then resume with --resume_from_checkpoint."
            )
        return loss

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """Training steps ask a model that supports it for the loss alone (`skip_logits=True`).

        minirope then computes the loss chunk by chunk without the full float32 logits (same loss and
        gradients, less memory and time: see `LinearCrossEntropy`). Evaluation still gets logits.
        """
        if model.training and not return_outputs and "labels" in inputs and self.model_accepts_skip_logits:
            inputs = {**inputs, "skip_logits": True}
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    def create_model_card(self, *args, **kwargs) -> None:
        """minirope writes its own card (`minirope.training.output.model_card`) before any push."""


class StreamPosition(TrainerCallback):
    """Saves the training stream's position after the blocks trained on as `stream_state.json` in each
    checkpoint, and continues the stream from it when training resumes (see `MiniRopeTrainer.train`).

    The data loader reads ahead of training (a global batch buffered for splitting between processes, one
    batch prefetched, the micro-batches of a step): the position saved is the stream's after exactly the
    blocks that the steps so far trained on (`BlockStream.state_at`), the same on every process.
    """

    def __init__(self, stream: BlockStream) -> None:
        self.stream = stream
        self.resume_state: dict | None = None

    @staticmethod
    def blocks_per_step(args) -> int:
        return args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size

    def on_train_begin(self, args, state, control, **kwargs):
        self.stream.states = deque(maxlen=3 * self.blocks_per_step(args) + 1)
        if self.resume_state is not None:
            self.stream.load_state_dict(self.resume_state)

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
            position = self.stream.state_at(state.global_step * self.blocks_per_step(args))
            (folder / STREAM_STATE).write_text(json.dumps(position))


def resolve_resume(training_args: TrainingArguments) -> str | None:
    """`--resume_from_checkpoint last` (or `True`) means the newest `checkpoint-N` in `--output_dir`.

    Raises:
        FileNotFoundError: the checkpoint (or any complete checkpoint, for `last`) does not exist.
    """
    resume = training_args.resume_from_checkpoint
    if resume in (None, "", "False", "false"):
        return None
    if resume in ("last", "True", "true"):
        last = last_complete_checkpoint(training_args.output_dir)
        if last is None:
            raise FileNotFoundError(f"no complete checkpoint-N folder in {training_args.output_dir} to resume from.")
        return last
    if not Path(resume).is_dir():
        raise FileNotFoundError(f"--resume_from_checkpoint {resume} is not a checkpoint folder: check the path.")
    return resume


def last_complete_checkpoint(output_dir: str | Path) -> str | None:
    """The newest `checkpoint-N` in `output_dir` whose `trainer_state.json` (written last) exists.

    The Trainer writes a checkpoint file by file; one cut short by a crash lacks that file and is skipped.
    """
    folders = [path for path in Path(output_dir).glob("checkpoint-*") if path.name.split("-")[-1].isdigit()]
    complete = [path for path in folders if (path / "trainer_state.json").is_file()]
    return str(max(complete, key=lambda path: int(path.name.split("-")[-1]))) if complete else None


def final_evaluation(trainer: Trainer) -> dict:
    """The validation metrics of the trained model: those of the periodic evaluation if it ran at the
    last step (the model has not changed since), else a new evaluation."""
    evaluations = [entry for entry in trainer.state.log_history if "eval_bits_per_byte" in entry]
    if evaluations and evaluations[-1]["step"] == trainer.state.global_step:
        return {key: value for key, value in evaluations[-1].items() if key.startswith("eval_") or key == "epoch"}
    return trainer.evaluate()


def scheduler_name(training_args: TrainingArguments) -> str:
    scheduler = training_args.lr_scheduler_type
    return getattr(scheduler, "value", scheduler)


def default_attention(training_args: TrainingArguments) -> str:
    """The attention kernel when `--attn_implementation` is not given: `eager` on CPU, else `sdpa`.

    Measured on the default pretraining step (16 x 256 tokens, bf16, compiled, 2-core CPU): 0.32 s with eager
    attention (matrix products plus a softmax Inductor fuses) against 0.43 s with PyTorch's CPU flash-attention
    kernel behind `sdpa`. Same function: `tests/test_model_conformance.py` checks eager = sdpa.
    """
    return "eager" if training_args.device.type == "cpu" else "sdpa"


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


def parallelism(trainer: Trainer) -> dict:
    """How the run was spread: processes, accelerate's distributed type (`NO`, `MULTI_CPU`, `MULTI_GPU`, `FSDP`,
    ...) and, under FSDP, its version (2 = `fully_shard`)."""
    accelerator = trainer.accelerator
    described = {"processes": accelerator.num_processes, "distributed_type": accelerator.distributed_type.value}
    fsdp_plugin = getattr(accelerator.state, "fsdp_plugin", None)  # absent unless FSDP was set up
    if fsdp_plugin is not None:
        described["fsdp_version"] = fsdp_plugin.fsdp_version
    return described
