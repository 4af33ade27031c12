"""The Trainer the minirope commands use: transformers' `Trainer` with a guard against non-finite losses, the
fused loss for training steps and a resumable stream position; and finding the checkpoint to resume."""

import inspect
import json
from collections import deque
from pathlib import Path

import torch
from transformers import SchedulerType, Trainer, TrainerCallback, default_data_collator
from transformers.trainer_utils import unwrap_peft_model

from minirope.cpu_matmuls import use_measured_matmuls
from minirope.data.stream import BlockStream
from minirope.output.folder import OwnFolder
from minirope.owned import write_atomic
from minirope.training.checkpoints import STREAM_STATE, last_complete_checkpoint, read_stream_state
from minirope.training.errors import NonFiniteLossError
from minirope.training.metrics import language_model_metrics
from minirope.training.optimizers import MuonWithAdamW


def check_stream_workers(num_workers: int) -> None:
    """A stream is read and tokenized in the training process (its position is saved with each checkpoint).

    Raises:
        ValueError: `num_workers` data-loader workers were asked for.
    """
    if num_workers:
        raise ValueError(
            "--streaming reads and tokenizes the stream in the training process: drop --dataloader_num_workers (or "
            "set it to 0)."
        )


class MiniRopeTrainer(OwnFolder, Trainer):
    """`Trainer` that stops on a NaN/inf loss, and leaves the model card to minirope.

    The check reads one scalar per micro-batch (a device sync on GPU, free on CPU). It runs before the
    optimizer step, so the weights, and every checkpoint already written, hold only finite values.

    Unless given, the data collator is `default_data_collator` (blocks of equal length: no padding, no attention
    mask), and evaluation reports exact nats per token, perplexity and bits per byte (`language_model_metrics` of
    the `processing_class` tokenizer).
    """

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("data_collator", default_data_collator)
        if kwargs.get("processing_class") is not None and "compute_metrics" not in kwargs:
            kwargs.update(language_model_metrics(kwargs["processing_class"]))
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
            check_stream_workers(self.args.dataloader_num_workers)
            self.accelerator.dataloader_config.dispatch_batches = False
            self.stream_position = StreamPosition(self.train_dataset)
            self.add_callback(self.stream_position)

    def train(self, resume_from_checkpoint=None, **kwargs):
        """`Trainer.train`; resuming a stream from a checkpoint continues the stream from the position saved in
        it (`StreamPosition`) instead of reading and skipping every batch already trained (`ignore_data_skip`).

        Raises:
            ValueError: resuming a stream from a checkpoint that holds no stream position.
        """
        self.use_measured_matmuls()
        if self.stream_position is not None and isinstance(resume_from_checkpoint, str):
            self.stream_position.resume_state = read_stream_state(resume_from_checkpoint)
            self.args.ignore_data_skip = True
        return super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)

    def use_measured_matmuls(self) -> None:
        """With `--measured_matmuls` (minirope's arguments) in a float32 eager CPU run, the model's matmuls of
        more than 8 rows on oneDNN where this machine measured it faster (`minirope.cpu_matmuls`), said in one
        line. Autocast (bf16) and compiled matmuls keep torch's path whatever is chosen."""
        args = self.args
        if not getattr(args, "measured_matmuls", False) or args.device.type != "cpu":
            return
        if args.bf16 or args.fp16 or args.torch_compile:
            return
        chosen = use_measured_matmuls(self.model, training=True)
        total = sum(type(module) is torch.nn.Linear for module in self.model.modules())
        print(f"[minirope] training matmuls on oneDNN, measured faster on this CPU: {len(chosen)} of {total} "
              f"linear layers (--measured_matmuls False: none)")  # fmt: skip

    def create_optimizer(self, model=None):
        """`Trainer.create_optimizer`; with `--optim_hidden muon`, `MuonWithAdamW` (Muon with `--muon_momentum` for
        the hidden matrices, AdamW with `--adam_beta1/2`, `--adam_epsilon` for the rest)."""
        if getattr(self.args, "optim_hidden", "adamw") != "muon" or self.optimizer is not None:
            return super().create_optimizer(model)
        model = model if model is not None else self.model
        decay = set(self.get_decay_parameter_names(model))
        self.optimizer = MuonWithAdamW(
            model,
            lr=self.args.learning_rate,
            weight_decay=self.args.weight_decay,
            no_decay={name for name, _ in model.named_parameters() if name not in decay},
            momentum=self.args.muon_momentum,
            betas=(self.args.adam_beta1, self.args.adam_beta2),
            eps=self.args.adam_epsilon,
        )
        return self.optimizer

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        """`Trainer.create_scheduler`; warmup-stable-decay without `num_decay_steps` (training by epochs, whose
        steps are known only now) decays over `--lr_decay_ratio` of the steps."""
        kwargs = self.args.lr_scheduler_kwargs or {}
        ratio = getattr(self.args, "lr_decay_ratio", None)
        if self.args.lr_scheduler_type == SchedulerType.WARMUP_STABLE_DECAY and "num_decay_steps" not in kwargs:
            if ratio is None:
                raise ValueError(
                    "--lr_scheduler_type warmup_stable_decay needs num_decay_steps in --lr_scheduler_kwargs."
                )
            self.args.lr_scheduler_kwargs = {**kwargs, "num_decay_steps": round(ratio * num_training_steps)}
        return super().create_scheduler(num_training_steps, optimizer)

    def training_step(self, model, inputs, num_items_in_batch=None) -> torch.Tensor:
        loss = super().training_step(model, inputs, num_items_in_batch)
        if not torch.isfinite(loss).all():
            last = last_complete_checkpoint(self.args.output_dir)
            raise NonFiniteLossError(
                f"the training loss became {loss.item()} at step {self.state.global_step + 1}; training stopped "
                f"before that update. Last good checkpoint: {last or 'none saved yet'}. Lower --learning_rate, "
                "raise --warmup_steps or clip gradients (--max_grad_norm 1.0), then resume with "
                "--resume_from_checkpoint."
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

    def save_to_checkpoint(self, folder: Path, args, state) -> None:
        """Called by `OwnFolder` before the Trainer's files: a checkpoint counts as complete only with its position."""
        position = self.stream.state_at(state.global_step * self.blocks_per_step(args))
        write_atomic(folder / STREAM_STATE, json.dumps(position))


def final_evaluation(trainer: Trainer) -> dict:
    """The validation metrics of the trained model: those of the periodic evaluation if it ran at the
    last step (the model has not changed since), else a new evaluation."""
    evaluations = [entry for entry in trainer.state.log_history if "eval_bits_per_byte" in entry]
    if evaluations and evaluations[-1]["step"] == trainer.state.global_step:
        return {key: value for key, value in evaluations[-1].items() if key.startswith("eval_") or key == "epoch"}
    return trainer.evaluate()


def parallelism(trainer: Trainer) -> dict:
    """How the run was spread: processes, accelerate's distributed type (`NO`, `MULTI_CPU`, `MULTI_GPU`, `FSDP`,
    ...) and, under FSDP, its version (2 = `fully_shard`)."""
    accelerator = trainer.accelerator
    described = {"processes": accelerator.num_processes, "distributed_type": accelerator.distributed_type.value}
    fsdp_plugin = getattr(accelerator.state, "fsdp_plugin", None)  # absent unless FSDP was set up
    if fsdp_plugin is not None:
        described["fsdp_version"] = fsdp_plugin.fsdp_version
    return described
