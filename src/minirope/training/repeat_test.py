"""The repeat test: can a model look back D tokens? A passkey test that is natural for a language model.

For each sample, a window of real validation text

    <s>  passage (P tokens)  |  filler (D other tokens)  |  passage again (P tokens)

is scored, and the test reports bits per byte on the repeat divided by bits per byte on the first
occurrence of the same passage, as a function of the distance D. A model that can reach back D + P tokens
copies the repeat almost for free (ratio near 0); one that cannot scores it like fresh text (ratio near 1).
Positional retrieval is what context extension must preserve, and unlike a synthetic passkey it needs no
prompt format: the scored text is ordinary validation text. Both occurrences are scored on their tokens 2..P
(a passage's first token cannot be inferred from the passage in either place), so the ratio compares the
same tokens predicted with and without the passage in view.

Passage and filler come from different places of the given documents (e.g. the validation plays), drawn
with a fixed seed, so every model is scored on the same windows.
"""

import math
import random

import torch

from minirope.data.tokenizer import token_byte_lengths

PASSAGE_TOKENS = 64
DISTANCES = (16, 64, 112, 240, 480, 700, 880, 1400, 1900)


def repeat_windows(
    documents: list[list[int]], distance: int, passage_tokens: int, samples: int, prefix: int, seed: int = 0
) -> torch.Tensor:
    """`(samples, 1 + 2 * passage_tokens + distance)` int64 windows `prefix, passage, filler, passage`.

    Raises:
        ValueError: no document is long enough to give a passage and, elsewhere, a filler of `distance`.
    """
    rng = random.Random(f"{seed}-{distance}")
    usable = [doc for doc in documents if len(doc) >= 2 * (passage_tokens + distance)]
    if not usable:
        raise ValueError(
            f"no document has {2 * (passage_tokens + distance)} tokens for a passage of {passage_tokens} and a "
            f"filler of {distance} from another place: give longer documents or a smaller distance."
        )
    windows = []
    for _ in range(samples):
        doc = rng.choice(usable)
        half = len(doc) // 2  # passage from one half, filler from the other: they never overlap
        (p0, p1), (f0, f1) = sorted([(0, half), (half, len(doc))], key=lambda _: rng.random())
        a, b = rng.randrange(p0, p1 - passage_tokens + 1), rng.randrange(f0, f1 - distance + 1)
        passage, filler = doc[a : a + passage_tokens], doc[b : b + distance]
        windows.append([prefix, *passage, *filler, *passage])
    return torch.tensor(windows, dtype=torch.long)


@torch.no_grad()
def repeat_test(
    model,
    tokenizer,
    documents: list[str],
    distances: tuple[int, ...] = DISTANCES,
    passage_tokens: int = PASSAGE_TOKENS,
    samples: int = 32,
    batch_size: int = 8,
    seed: int = 0,
) -> list[dict]:
    """Score repeated passages at each distance D (tokens of filler between the two occurrences).

    Args:
        model: a causal LM (`model(input_ids).logits`, `(B, T, V)`), run in eval mode without gradients.
        tokenizer: its tokenizer; each document is tokenized whole, without special tokens, and windows
            start with its bos token (eos without one).
        documents: whole texts to draw passages and fillers from (e.g. the validation plays).

    Returns one dict per distance: `distance`, `window_tokens` (1 + 2P + D), `first_bits_per_byte`,
    `repeat_bits_per_byte` and `ratio` = repeat / first (the bytes are the same, so it is also the ratio
    of nats). Each is summed over `samples` windows.

    Raises:
        ValueError: see `repeat_windows`.
    """
    ids = tokenizer(list(documents), add_special_tokens=False)["input_ids"]
    prefix = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    token_bytes = token_byte_lengths(tokenizer)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    results = []
    for distance in distances:
        windows = repeat_windows(ids, distance, passage_tokens, samples, prefix, seed)
        first = slice(2, 1 + passage_tokens)  # tokens 2..P of the first occurrence
        repeat = slice(1 + passage_tokens + distance + 1, 1 + 2 * passage_tokens + distance)
        nats = {"first": 0.0, "repeat": 0.0}
        for batch in windows.split(batch_size):
            logits = model(input_ids=batch.to(device)).logits.float()
            losses = torch.nn.functional.cross_entropy(
                logits[:, :-1].transpose(1, 2), batch[:, 1:].to(device), reduction="none"
            )  # losses[:, t - 1] is the cost of token t
            nats["first"] += losses[:, first.start - 1 : first.stop - 1].sum().item()
            nats["repeat"] += losses[:, repeat.start - 1 : repeat.stop - 1].sum().item()
        num_bytes = int(token_bytes[windows[:, first].numpy()].sum())
        first_bpb = nats["first"] / math.log(2) / num_bytes
        repeat_bpb = nats["repeat"] / math.log(2) / num_bytes
        results.append(
            {
                "distance": distance,
                "window_tokens": windows.shape[1],
                "first_bits_per_byte": first_bpb,
                "repeat_bits_per_byte": repeat_bpb,
                "ratio": repeat_bpb / first_bpb,
            }
        )
    model.train(was_training)
    return results
