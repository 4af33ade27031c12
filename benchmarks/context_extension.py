"""Context-extension study: what happens past the trained context, with and without RoPE scaling.

Three models are trained identically on the bundled Shakespeare corpus at a short context (128 tokens):
  - rope     minirope as is (RoPE, base 10000);
  - nope     no position encoding at all (cos = 1, sin = 0: causal attention alone carries order);
  - learned  learned absolute position embeddings added to the token embeddings (GPT-2 / the paper's
             baseline), with rows for 8x the context, of which only the first 128 are ever trained.
Each is then evaluated on the validation plays in non-overlapping windows of 1x, 2x, 4x and 8x the
training context; the RoPE model also with inference-time scaling through `rope_parameters`:
`linear` (position interpolation, factor = window / 128), `dynamic` (NTK-aware, base rescaled from the
current length), and `yarn` (factor = window / 128, with its attention temperature).

    python benchmarks/context_extension.py            # ~10 min on 2 CPU cores
    python benchmarks/context_extension.py --max_steps 50 --eval_tokens 8192   # a quick smoke run

Prints a table of validation bits per byte and writes docs/context_extension.json and .png. The two
baselines live here, not in the model file.
"""

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from torch import nn  # noqa: E402
from transformers import Trainer, TrainingArguments, default_data_collator, set_seed  # noqa: E402

from minirope import MiniRopeConfig, MiniRopeForCausalLM  # noqa: E402
from minirope.data.bundled import shakespeare_dataset  # noqa: E402
from minirope.data.tokenizer import token_byte_lengths, train_tokenizer  # noqa: E402
from minirope.training.metrics import per_token_loss  # noqa: E402

MULTIPLES = (1, 2, 4, 8)


class NoPositionEmbedding(nn.Module):
    """Stands in for the rotary module: cos = 1, sin = 0, so q and k are not rotated."""

    def __init__(self, head_dim: int) -> None:
        super().__init__()
        self.head_dim = head_dim

    def grow(self, seq_len: int) -> None:
        """Nothing to extend (the rotary module's tables grow before a long forward; this one has none)."""

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (*position_ids.shape, self.head_dim)
        return torch.ones(shape, dtype=x.dtype, device=x.device), torch.zeros(shape, dtype=x.dtype, device=x.device)


class NoPE(MiniRopeForCausalLM):
    def __init__(self, config: MiniRopeConfig) -> None:
        super().__init__(config)
        self.model.rotary_emb = NoPositionEmbedding(config.head_dim)


class LearnedAbsolute(NoPE):
    """NoPE plus a learned position embedding table added to the token embeddings."""

    def __init__(self, config: MiniRopeConfig, max_positions: int) -> None:
        super().__init__(config)
        self.position_embeddings = nn.Embedding(max_positions, config.hidden_size)
        nn.init.normal_(self.position_embeddings.weight, std=config.initializer_range)

    def forward(self, input_ids: torch.LongTensor, labels: torch.LongTensor | None = None, **kwargs):
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        inputs_embeds = self.model.embed_tokens(input_ids) + self.position_embeddings(positions)
        return super().forward(inputs_embeds=inputs_embeds, labels=labels, **kwargs)


def blocks(ids: list[int], length: int, limit: int | None = None) -> torch.Tensor:
    count = len(ids) // length if limit is None else min(len(ids) // length, max(1, limit // length))
    return torch.tensor(ids[: count * length]).view(count, length)


def train(model: nn.Module, train_blocks: torch.Tensor, args: argparse.Namespace, out: Path) -> float:
    rows = train_blocks.tolist()
    data = Dataset.from_dict({"input_ids": rows, "labels": rows})
    training_args = TrainingArguments(
        output_dir=str(out),
        max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size,
        learning_rate=3e-3,
        weight_decay=0.1,
        adam_beta2=0.95,
        warmup_steps=30,
        lr_scheduler_type="cosine",
        bf16=True,
        use_cpu=not torch.accelerator.is_available(),
        torch_compile=True,
        logging_steps=50,
        save_strategy="no",
        report_to="none",
        seed=args.seed,
        disable_tqdm=True,
    )
    started = time.perf_counter()
    Trainer(model=model, args=training_args, train_dataset=data, data_collator=default_data_collator).train()
    return time.perf_counter() - started


@torch.no_grad()
def bits_per_byte(model: nn.Module, eval_blocks: torch.Tensor, token_bytes: torch.Tensor, batch_size: int) -> float:
    model.eval()
    nats, num_bytes = 0.0, 0
    for start in range(0, len(eval_blocks), batch_size):
        batch = eval_blocks[start : start + batch_size]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(input_ids=batch).logits
        nats += per_token_loss(logits, batch).double().sum().item()
        num_bytes += int(token_bytes[batch[:, 1:]].sum())
    return nats / math.log(2) / num_bytes


def scaled(model: MiniRopeForCausalLM, rope_parameters: dict) -> MiniRopeForCausalLM:
    """The same weights with other RoPE settings (inference-time scaling)."""
    config = MiniRopeConfig(**{**model.config.to_dict(), "rope_parameters": rope_parameters})
    copy = MiniRopeForCausalLM(config)
    copy.load_state_dict(model.state_dict())
    return copy


def rope_settings(multiple: int, context: int, base: float) -> dict[str, dict]:
    return {
        "rope, no scaling": {"rope_type": "default", "rope_theta": base},
        "rope + linear": {"rope_type": "linear", "rope_theta": base, "factor": float(multiple)},
        "rope + dynamic NTK": {"rope_type": "dynamic", "rope_theta": base, "factor": 1.0},
        "rope + YaRN": {
            "rope_type": "yarn",
            "rope_theta": base,
            "factor": float(multiple),
            "original_max_position_embeddings": context,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--max_steps", type=int, default=500)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--eval_tokens", type=int, default=65536, help="validation tokens per window size")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--out", type=Path, default=Path("docs"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    data = shakespeare_dataset()
    tokenizer = train_tokenizer(data["train"]["text"], vocab_size=4096)
    token_bytes = torch.from_numpy(token_byte_lengths(tokenizer))
    train_ids = tokenizer("".join(data["train"]["text"]))["input_ids"]
    valid_ids = tokenizer("".join(data["validation"]["text"]))["input_ids"]
    config = MiniRopeConfig(
        vocab_size=len(tokenizer),
        hidden_size=192,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=3,
        max_position_embeddings=args.context,
        pad_token_id=tokenizer.pad_token_id,
    )
    base = config.rope_parameters["rope_theta"]
    train_blocks = blocks(train_ids, args.context)

    models, seconds = {}, {}
    for name, build in (
        ("rope", lambda: MiniRopeForCausalLM(config)),
        ("nope", lambda: NoPE(config)),
        ("learned absolute", lambda: LearnedAbsolute(config, max_positions=args.context * max(MULTIPLES))),
    ):
        set_seed(args.seed)
        models[name] = build()
        seconds[name] = train(models[name], train_blocks, args, Path(tempfile.mkdtemp(prefix="minirope-ctx-")))
        print(f"trained {name}: {seconds[name]:.0f} s", flush=True)

    results: dict[str, dict[int, float]] = {}
    for multiple in MULTIPLES:
        length = args.context * multiple
        eval_blocks = blocks(valid_ids, length, args.eval_tokens)
        for name, rope_parameters in rope_settings(multiple, args.context, base).items():
            model = scaled(models["rope"], rope_parameters)
            results.setdefault(name, {})[length] = bits_per_byte(model, eval_blocks, token_bytes, 8)
        for name in ("nope", "learned absolute"):
            results.setdefault(name, {})[length] = bits_per_byte(models[name], eval_blocks, token_bytes, 8)
        print(f"evaluated windows of {length} tokens", flush=True)

    lengths = [args.context * multiple for multiple in MULTIPLES]
    header = "| model, inference | " + " | ".join(f"{n} ({n // args.context}x)" for n in lengths) + " |"
    lines = [header, "|---" * (len(lengths) + 1) + "|"]
    lines += [f"| {name} | " + " | ".join(f"{row[n]:.3f}" for n in lengths) + " |" for name, row in results.items()]
    table = "\n".join(lines)
    print("\nvalidation bits per byte by evaluation window (trained at", args.context, "tokens)\n" + table)

    report = {
        "context": args.context,
        "max_steps": args.max_steps,
        "batch_size": args.batch_size,
        "eval_tokens_per_window": args.eval_tokens,
        "config": config.to_dict(),
        "train_seconds": seconds,
        "bits_per_byte": results,
        "table": table,
    }
    (args.out / "context_extension.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=120)
    for name, row in results.items():
        ax.plot(lengths, [row[n] for n in lengths], "o-", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [f"{n}\n({n // args.context}x)" for n in lengths])
    ax.set_xlabel("evaluation window (tokens)")
    ax.set_ylabel("validation bits per byte (lower is better)")
    ax.set_title(f"Trained at {args.context} tokens: evaluated on longer windows")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out / "context_extension.png")
    print(f"wrote {args.out}/context_extension.json and context_extension.png")


if __name__ == "__main__":
    main()
