"""Plots for docs/rope.md: RoPE wavelengths, RoFormer's long-term decay bound, and the cos/sin cache.

    python benchmarks/rope_plots.py [--out docs/img]

Writes rope_wavelengths.png, rope_long_term_decay.png and rope_cos_sin_cache.png (and prints the
numbers the doc quotes).
"""

import argparse
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from minirope import MiniRopeConfig, MiniRopeRotaryEmbedding  # noqa: E402


def long_term_decay(distances: torch.Tensor, d: int, base: float) -> torch.Tensor:
    """RoFormer section 3.4.3: the relative upper bound (1 / (d/2)) * sum_j |S_j|, S_j = sum_{k<j} e^{i r theta_k}."""
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    phases = torch.polar(torch.ones(len(distances), d // 2, dtype=torch.float64), distances[:, None] * theta)
    partial_sums = phases.cumsum(dim=1)  # S_1 .. S_{d/2}
    return partial_sums.abs().mean(dim=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("docs/img"))
    out = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    config = MiniRopeConfig()  # the default model: head_dim 64, base 10000, context 256
    d, base, context = config.head_dim, config.rope_parameters["rope_theta"], config.max_position_embeddings

    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    wavelengths = 2 * math.pi / theta
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    ax.semilogy(range(d // 2), wavelengths, "o-", markersize=3)
    ax.axhline(context, color="gray", linestyle="--", label=f"trained context ({context} tokens)")
    ax.set_xlabel("pair index i (dims i and i + d/2 in rotate_half layout)")
    ax.set_ylabel("wavelength 2π/θ_i (tokens)")
    ax.set_title(f"RoPE wavelengths, d={d}, base={base:g}")
    ax.legend()
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(out / "rope_wavelengths.png")
    plt.close(fig)
    longer = int((wavelengths > context).sum())
    print(
        f"wavelengths: {wavelengths[0]:.2f} .. {wavelengths[-1]:.0f} tokens; {longer}/{d // 2} pairs longer "
        f"than the {context}-token context (they never complete a turn in training)"
    )

    distances = torch.arange(0, 1001, dtype=torch.float64)
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    for dim in (32, 64, 128):
        ax.plot(distances, long_term_decay(distances, dim, base), label=f"d = {dim}", linewidth=1)
    ax.set_xlabel("relative distance n - m (tokens)")
    ax.set_ylabel("relative upper bound (1/(d/2)) Σ_j |S_j|")
    ax.set_title("RoFormer §3.4.3: long-term decay of the attention bound (base 10000)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "rope_long_term_decay.png")
    plt.close(fig)
    bound = long_term_decay(torch.tensor([0.0, 10.0, 50.0, 250.0, 1000.0], dtype=torch.float64), 128, base)
    print("decay bound, d=128, at distance 0/10/50/250/1000:", [round(v, 2) for v in bound.tolist()])

    rope = MiniRopeRotaryEmbedding(config)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), dpi=120, sharey=True)
    for ax, table, name in zip(axes, (rope.cos_cached, rope.sin_cached), ("cos_cached", "sin_cached"), strict=True):
        image = ax.imshow(table.numpy(), aspect="auto", cmap="RdBu", vmin=-1, vmax=1, interpolation="nearest")
        ax.set_title(f"{name}  ({tuple(table.shape)[0]} positions × {d} dims)")
        ax.set_xlabel("dim j (j and j + d/2 share θ_{j mod d/2})")
    axes[0].set_ylabel("position m")
    fig.colorbar(image, ax=axes, shrink=0.8)
    fig.savefig(out / "rope_cos_sin_cache.png", bbox_inches="tight")
    plt.close(fig)
    print(f"wrote {out}/rope_wavelengths.png, rope_long_term_decay.png, rope_cos_sin_cache.png")


if __name__ == "__main__":
    main()
