"""The numbers behind docs/scaling.md: parameters and training FLOPs per token of three model sizes (the code's
own count, `training_flops_per_token`), and a projection of wall time on GPU clusters.

    python benchmarks/scaling_plan.py            # prints the markdown tables (no training, a second)

Projection, clearly not a measurement: hours = FLOPs per token x tokens / (GPUs x peak x MFU), with the
peak and MFU stated in the table. Everything measured lives in docs/scaling.md next to it.
"""

import torch

from minirope import MiniRopeConfig, MiniRopeForCausalLM
from minirope.commands.pretrain import PretrainingArguments
from minirope.training.throughput import training_flops_per_token

DEMO = PretrainingArguments(output_dir="unused")
DEMO_CONTEXT = MiniRopeConfig().max_position_embeddings  # the default block: the trained context
# name: (config fields, context, token budget, MFU assumed on H100s)
SIZES = {
    "default (make demo)": ({}, DEMO_CONTEXT, DEMO.max_steps * DEMO.per_device_train_batch_size * DEMO_CONTEXT, None),
    "~125M (GPT-2 small shape)": (
        dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12, vocab_size=32000),
        1024,
        2_500_000_000,  # ~20 tokens per parameter (Chinchilla)
        0.40,
    ),
    "~1.1B (TinyLlama shape)": (
        dict(
            hidden_size=2048,
            intermediate_size=5632,
            num_hidden_layers=22,
            num_attention_heads=32,
            num_key_value_heads=4,
            vocab_size=32000,
        ),
        2048,
        22_000_000_000,
        0.40,
    ),
}
H100_BF16_PEAK = 989e12  # NVIDIA H100 SXM dense bf16 (data sheet); 798e12 measured on one here (8192^3 product)


def main() -> None:
    print("| model | parameters | context | training FLOPs / token | tokens | total FLOPs | 8 x H100 | 64 x H100 |")
    print("|---|---|---|---|---|---|---|---|")
    for name, (fields, context, tokens, mfu) in SIZES.items():
        config = MiniRopeConfig(**fields, max_position_embeddings=context)
        with torch.device("meta"):
            parameters = MiniRopeForCausalLM(config).num_parameters()
        per_token = training_flops_per_token(config, context)
        total = per_token * tokens
        cells = []
        for gpus in (8, 64):
            if mfu is None:
                cells.append("launch-bound (see text)")
            else:
                hours = total / (gpus * H100_BF16_PEAK * mfu) / 3600
                cells.append(f"{hours:.2f} h at MFU {mfu:.0%}")
        print(
            f"| {name} | {parameters / 1e6:,.2f}M | {context} | {per_token / 1e6:,.2f} MFLOP | {tokens:,} | "
            f"{total:.3g} | {cells[0]} | {cells[1]} |"
        )


if __name__ == "__main__":
    main()
