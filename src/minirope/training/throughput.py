"""Training throughput and model FLOP utilisation (MFU), measured inside the run.

MFU = achieved model FLOP/s / peak FLOP/s, with both numbers from the same machine:
the peak is the best rate of a square matrix product in the training's precision (bf16 under `--bf16`, else
float32; on a CPU, of torch's default kernel or oneDNN's, whichever is faster), grown until the rate stops rising,
timed as each training run begins, the best timing of the machine's runs counting (`minirope.machine.matmul_peak`), and
the model FLOPs are counted as in PaLM (Chowdhery et al. 2022, appendix B): per trained token

    6 * N  +  12 * L * H * d * T

N = the weights used in matrix multiplications (every Linear, `lm_head` included, the embedding lookup not),
L layers, H query heads of size d, T tokens per sequence (attention counted over the full T x T square,
the usual convention even though causal attention skips about half of it).
"""

import statistics
import time

import torch
from transformers import TrainerCallback

from minirope import MiniRopeConfig, machine


def training_flops_per_token(config: MiniRopeConfig, seq_len: int) -> float:
    """Model FLOPs to train on one token of a `seq_len`-token sequence (forward + backward), PaLM counting."""
    head_dim, heads, kv_heads = config.head_dim, config.num_attention_heads, config.num_key_value_heads
    attention = config.hidden_size * head_dim * (2 * heads + 2 * kv_heads)  # q, o and k, v projections
    mlp = 3 * config.hidden_size * config.intermediate_size
    matmul_weights = config.num_hidden_layers * (attention + mlp) + config.hidden_size * config.vocab_size
    return 6 * matmul_weights + 12 * config.num_hidden_layers * heads * head_dim * seq_len


class ThroughputCallback(TrainerCallback):
    """Times every optimizer step (forward, backward, update; not evaluation or checkpointing), and takes the
    matmul peak of the training device in the training's precision when training begins: the best timing of this
    machine's runs (`machine.matmul_peak`; a busy moment on a shared host only lowers a timing, so the best counts).
    Not when training ends: on a 2-core Xeon (AMX) the same process then timed 1.39 TFLOP/s bf16, after a
    compiled run, where a fresh one timed 2.7-2.8.

    Args:
        tokens_per_step: tokens one process trains on per optimizer step (batch x block x accumulation).
        flops_per_token: from `training_flops_per_token`.
        warmup_steps: first steps left out (they include torch.compile's compilation).
        run_started: `time.perf_counter()` when the run began; then `first_step_seconds` is the time from
            there to the end of the first optimizer step (data preparation, tokenizer, model set-up included).

    It also keeps the wall time between consecutive step ends (`step_interval_seconds`, median after
    warm-up), which includes what happens between steps: fetching the next batch from the data loader
    (reading and tokenizing, for a stream) and logging; and `training_seconds`, the wall time of training
    itself: every step (slow ones and compilation included) and the time between steps, but not the
    evaluations and checkpoints the Trainer runs between steps, nor the peak measurements (the compute
    budget of docs/studies/recipe.md is `training_seconds` x the peak).
    """

    def __init__(
        self, tokens_per_step: int, flops_per_token: float, warmup_steps: int = 10, run_started: float | None = None
    ):
        self.run_started = run_started
        self.first_step_seconds: float | None = None
        self.step_ends: list[float] = []
        self.tokens_per_step = tokens_per_step
        self.flops_per_token = flops_per_token
        self.warmup_steps = warmup_steps
        self.peak_flops = 0.0
        self.peak_size = 0
        self.peak_dtype = torch.bfloat16
        self.step_seconds: list[float] = []
        self.training_seconds = 0.0
        self._started = 0.0
        self._between_steps_since: float | None = None  # the last step's end, or the end of an evaluation/save

    def measure_peak(self, args) -> None:
        """The machine's best matmul peak in the training's precision, timed now too (`machine.matmul_peak`)."""
        self.peak_dtype = torch.bfloat16 if args.bf16 else torch.float32
        self.peak_flops, self.peak_size = machine.matmul_peak(args.device, self.peak_dtype, again=True)

    def on_train_begin(self, args, state, control, **kwargs):
        self.measure_peak(args)

    def achieved_flops(self) -> float | None:
        """Model FLOP/s of the median step after warm-up; None before any such step."""
        timed = self.step_seconds[self.warmup_steps :]
        return self.flops_per_token * self.tokens_per_step / statistics.median(timed) if timed else None

    def on_step_begin(self, args, state, control, **kwargs):
        self._started = time.perf_counter()
        if self._between_steps_since is not None:
            self.training_seconds += self._started - self._between_steps_since

    def on_step_end(self, args, state, control, **kwargs):
        now = time.perf_counter()
        self.step_seconds.append(now - self._started)
        self.training_seconds += now - self._started
        self._between_steps_since = now
        self.step_ends.append(now)
        if self.first_step_seconds is None and self.run_started is not None:
            self.first_step_seconds = now - self.run_started

    def on_evaluate(self, args, state, control, **kwargs):
        self._skip_to_now()

    def on_save(self, args, state, control, **kwargs):
        self._skip_to_now()

    def _skip_to_now(self) -> None:
        """Leave what ran since the last step's end (an evaluation, a checkpoint) out of `training_seconds`."""
        if self._between_steps_since is not None:
            self._between_steps_since = time.perf_counter()

    def metrics(self) -> dict:
        """Median step time after warm-up, tokens/s and model FLOP/s per process, the matmul peak and MFU.

        Empty if no step ran past the warm-up.
        """
        achieved = self.achieved_flops()
        if achieved is None or not self.peak_flops:
            return {}
        seconds = statistics.median(self.step_seconds[self.warmup_steps :])
        ends = self.step_ends[self.warmup_steps :]
        intervals = [later - earlier for earlier, later in zip(ends, ends[1:], strict=False)]
        extra = {} if self.first_step_seconds is None else {"first_step_seconds": round(self.first_step_seconds, 2)}
        if intervals:
            extra["step_interval_seconds"] = round(statistics.median(intervals), 4)
        return {
            **extra,
            "step_seconds": round(seconds, 4),
            "tokens_per_second": round(self.tokens_per_step / seconds, 1),
            "model_tflops": round(achieved / 1e12, 4),
            "matmul_peak_tflops": round(self.peak_flops / 1e12, 4),
            "matmul_peak_dtype": str(self.peak_dtype).removeprefix("torch."),
            "matmul_peak_size": self.peak_size,
            "mfu": round(achieved / self.peak_flops, 4),
        }
