"""bf16 or float32 for a run: decided by how much faster this CPU runs bf16 matrix multiplications than float32 ones
(`choose_bf16`, timed once per machine by `minirope.machine`), so every run on a machine takes the same precision,
printed with its figures."""

import contextlib

import torch

from minirope import machine

# bf16 is chosen on a CPU only where its matmuls beat float32's by this factor: a CPU with native bf16
# (AVX512_BF16, AMX) measures 2-6x, one without emulates it 100x or more slower.
BF16_MARGIN = 1.5


def choose_bf16(device: torch.device, cpu_float32: str | None = None) -> tuple[bool, str]:
    """The default precision on `device`, and the line that says why.

    On CUDA, bf16 where the GPU supports it; on other accelerators float32; on a CPU, bf16 where its matrix
    multiplications run at least `BF16_MARGIN` times faster than float32's (`machine.bf16_speedup`), else float32.
    `cpu_float32`: a measured reason to train in float32 on a CPU whatever its matmuls would measure (post-training:
    `POSTTRAINING_FLOAT32`): nothing is timed, and the line gives that reason.
    """
    if device.type == "cuda":
        supported = torch.cuda.is_bf16_supported()
        return supported, f"precision: {'bf16' if supported else 'float32'} (bf16 supported by this GPU: {supported})"
    if cpu_float32 and device.type == "cpu":  # the answer is fixed: nothing to time
        return False, f"precision: float32 on a CPU ({cpu_float32}; --bf16 True decides instead)"
    if device.type != "cpu":
        return False, f"precision: float32 (the default on {device.type})"
    speedup = machine.bf16_speedup()
    bf16 = speedup >= BF16_MARGIN
    return bf16, (
        f"precision: {'bf16' if bf16 else 'float32'} (bf16 matmuls {speedup:.2g}x float32's on this CPU, timed once, "
        f"cached in {machine.cache_path()}; bf16 from {BF16_MARGIN}x; --bf16 True/False decides instead)"
    )


def precision_name(args) -> str:
    """The precision `args` (a `TrainingArguments`, TRL's configs too) trains in: "fp16", "bf16" or "float32"."""
    return "fp16" if args.fp16 else "bf16" if args.bf16 else "float32"


def run_autocast(args, device_type: str) -> contextlib.AbstractContextManager:
    """The mixed precision `args` (a `TrainingArguments`, TRL's configs too; None: float32) trains in, for work a run
    does outside the Trainer's step on the same weights (its held-out generation): `torch.autocast` to bf16 or
    float16 on `device_type`, as accelerate wraps the trained model's forward, or no autocast for float32."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision_name(args) if args is not None else "")
    return torch.autocast(device_type, dtype=dtype) if dtype else contextlib.nullcontext()


def decide_bf16(args, cpu_float32: str | None = None) -> str | None:
    """Set `args.bf16` (a `TrainingArguments`, TRL's configs too) where no flag set it (None) and `--fp16` is off:
    `choose_bf16` on the device the run trains on (the CPU under `use_cpu` or without an accelerator; `cpu_float32`
    as there). Returns the line that says why, or None where a flag decided."""
    if args.bf16 is not None or args.fp16:
        return None
    cpu = args.use_cpu or not torch.accelerator.is_available()
    device = torch.device("cpu") if cpu else torch.accelerator.current_accelerator()
    args.bf16, line = choose_bf16(device, cpu_float32)
    return line


def avoid_cudnn_attention(args) -> bool:
    """Turn off torch's cuDNN attention kernel (`torch.backends.cuda.enable_cudnn_sdp(False)`, for this process) when
    `args` (a `TrainingArguments`, TRL's configs too) trains in bf16 or fp16 on a CUDA GPU; say so. Returns whether it
    did.

    Why: on H100/H200 GPUs since torch 2.11, the cuDNN kernel of `scaled_dot_product_attention` returns NaN query
    gradients when an attention mask is passed, the sequence is 64 tokens past a multiple of 128, and a query row
    attends to almost nothing (a left-padding row: pytorch/pytorch#196678, huggingface/trl#7181); the optimizer
    step then writes NaN into every weight. Padded batches are what fine-tuning and post-training train on: on an
    H200 (torch 2.11.0+cu130), `minirope-posttrain --method grpo --bf16 True` had NaN gradients at step 13 of 500,
    whose batch was 16 prompt + 48 completion tokens, in `ScaledDotProductCudnnAttentionBackward0` (anomaly mode),
    and ran through with this kernel off. The other kernels (flash, memory-efficient, math) compute the same
    attention. float32 and CPU runs never use cuDNN's kernel: nothing changes for them.
    """
    if not ((args.bf16 or args.fp16) and torch.cuda.is_available() and not args.use_cpu):
        return False
    torch.backends.cuda.enable_cudnn_sdp(False)
    print(
        "[minirope] attention: torch's cuDNN kernel off for this half-precision GPU run (its backward returns NaN for "
        "masked sequences of 64 + 128k tokens: pytorch/pytorch#196678); flash or memory-efficient attention instead"
    )
    return True
