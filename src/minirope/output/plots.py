"""Run artefacts that are not model files: the loss-curve plot."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_loss_curve(log_history: list[dict], path: str | Path, title: str) -> None:
    """Training loss (every logging step) and validation loss (every evaluation) in nats/token against step."""
    train = [(entry["step"], entry["loss"]) for entry in log_history if "loss" in entry]
    valid = [(entry["step"], entry["eval_nats_per_token"]) for entry in log_history if "eval_nats_per_token" in entry]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    if train:
        ax.plot(*zip(*train, strict=True), label="train loss", linewidth=1.2)
    if valid:
        ax.plot(*zip(*valid, strict=True), "o-", label="validation loss", linewidth=1.5)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("cross-entropy (nats / token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if train or valid:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
