"""Exact validation metrics from the Trainer's evaluation loop: nats per token, perplexity, bits per byte.

The Trainer reduces each batch's logits to per-token losses (`preprocess_logits_for_metrics`), so
nothing of size V is kept, and `compute_metrics` sums them over the whole split:

    bits per byte = (sum of losses in nats over every predicted token) / ln 2
                    / (UTF-8 bytes that those predicted tokens decode to)

This is independent of the tokenizer, so it compares with character-level models (bits per character
on ASCII text) and with models that use other vocabularies.
"""

import math

import numpy as np
import torch
from transformers import EvalPrediction

from minirope.data.blocks import IGNORE_INDEX
from minirope.data.tokenizer import token_byte_lengths


def per_token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy in nats of each next-token prediction, float32 `(B, T-1)`; 0 where the target is ignored.

    Args:
        logits: `(B, T, V)`; position t predicts `labels[:, t + 1]`.
        labels: `(B, T)` int64 with -100 for ignored positions (padding).
    """
    targets = labels[:, 1:]
    losses = torch.nn.functional.cross_entropy(
        logits[:, :-1].float().transpose(1, 2), targets, ignore_index=IGNORE_INDEX, reduction="none"
    )
    return losses


class LanguageModelingMetrics:
    """`compute_metrics` for the Trainer. Needs `preprocess_logits_for_metrics=per_token_loss`.

    Args:
        token_bytes: `(V,)` int64, the UTF-8 bytes each token id decodes to.
    """

    def __init__(self, token_bytes: np.ndarray) -> None:
        self.token_bytes = token_bytes

    def __call__(self, prediction: EvalPrediction) -> dict[str, float]:
        losses = np.asarray(prediction.predictions, dtype=np.float64)
        targets = np.asarray(prediction.label_ids)[:, 1:]
        scored = targets != IGNORE_INDEX
        nats = float(losses[scored].sum())
        tokens = int(scored.sum())
        num_bytes = int(self.token_bytes[targets[scored]].sum())
        nats_per_token = nats / tokens
        return {
            "nats_per_token": nats_per_token,
            "perplexity": math.exp(nats_per_token),
            "bits_per_byte": nats / math.log(2) / num_bytes,
            "scored_tokens": tokens,
            "scored_bytes": num_bytes,
        }


def language_model_metrics(tokenizer) -> dict:
    """The two `Trainer` arguments that make `evaluate()` report exact nats per token, perplexity and bits per
    byte: `compute_metrics` (`LanguageModelingMetrics` over the tokenizer's byte lengths) and the
    `preprocess_logits_for_metrics` it needs (`per_token_loss`)."""
    return {
        "compute_metrics": LanguageModelingMetrics(token_byte_lengths(tokenizer)),
        "preprocess_logits_for_metrics": per_token_loss,
    }
