"""Documents -> tokens -> blocks: one stream for training in memory and streamed, resumable at any block.

Each document is tokenized exactly as `tokenizer(document)` tokenizes it, but in pieces (`TextPieces`), so a
document larger than memory is fine; documents are framed and joined, then cut into blocks:

    training    <s> doc_1 </s> <s> doc_2 </s> ...   concatenated, cut into blocks of `block_size` tokens
                                                     (the last partial block of an epoch dropped); the loss
                                                     covers every token, the separators included
    validation  <s> doc_i, alone, in windows of `block_size` tokens (`document_windows`)

`<s>` (bos) and `</s>` (eos) frame each document as in Llama pretraining; where a tokenizer has no bos,
the frame is `doc </s>` and windows start from `</s>`, as lm-evaluation-harness does.

The resumable stream of training blocks is `minirope.data.stream.BlockStream`.
"""

import random
from collections.abc import Iterator

import numpy as np
from transformers import PreTrainedTokenizerBase

from minirope.data.documents import Shard
from minirope.data.tokenizer import TextPieces

# Without --block_size, the model's context up to DEFAULT_BLOCK tokens (run_clm.py caps it at 1,024): a released
# model's 8,192 (SmolLM2's) in batches of 16 needed more than 24 GB on the CPU and made a handful of steps of a play;
# 16 x 256 tokens a step take SmolLM2-135M's LoRA fine-tune in about 6 GB.
DEFAULT_BLOCK = 256
IGNORE_INDEX = -100  # a label the loss skips (PyTorch's cross_entropy default, and transformers')

BATCH_CHARS = 1 << 20  # text tokenized in one call (parallel over its pieces), about 1 MB


def default_block_size(config) -> int:
    """The training block a fine-tune takes when none is given (`minirope-finetune`, the post-training warm start and
    corpus term): the model's context (`config.max_position_embeddings`) up to `DEFAULT_BLOCK` tokens."""
    return min(DEFAULT_BLOCK, config.max_position_embeddings)


def document_frame(tokenizer: PreTrainedTokenizerBase) -> tuple[list[int], list[int]]:
    """The ids put before and after each training document: `([bos], [eos])`, or `([], [eos])` without a bos.

    Raises:
        ValueError: the tokenizer has no eos token to separate documents.
    """
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no eos token to separate documents: set tokenizer.eos_token.")
    bos = [] if tokenizer.bos_token_id is None else [tokenizer.bos_token_id]
    return bos, [tokenizer.eos_token_id]


def token_pieces(
    shards: list[Shard],
    order: list[int],
    position: dict,
    pieces: TextPieces,
    frame: tuple[list[int], list[int]],
) -> Iterator[tuple[list[int], dict]]:
    """The framed ids of the documents of `shards` (in `order`) from `position`, piece by piece.

    Yields `(ids, where)`: `where` names the shard (index into `order`), the document's locator and the byte
    offset of the piece's text; `ids` are that text's ids, with `frame[0]` first if the offset is 0 and
    `frame[1]` last if the piece ends its document. Texts are tokenized `BATCH_CHARS` at a time.

    Raises:
        ValueError: a document tokenizes to no tokens (naming it), or a reader's error.
    """
    batch: list[tuple[str, dict, bool, bool]] = []
    batch_chars = 0

    def flush():
        texts = [text for text, *_ in batch]
        ids = pieces.tokenizer(texts, add_special_tokens=False, return_attention_mask=False)["input_ids"]
        for piece_ids, (_, where, first, last) in zip(ids, batch, strict=True):
            yield (frame[0] if first else []) + piece_ids + (frame[1] if last else []), where
        batch.clear()

    def pieces_of(document, offset):  # (text, byte offset of its start, is the last piece)
        previous = None
        for text in pieces.pieces(document.read(offset)):
            if previous is not None:
                yield previous, offset, False
                offset += len(previous.encode("utf-8"))
            previous = text
        if previous is None:
            raise ValueError(
                f"document {document.name} tokenizes to no tokens (it is empty): remove it or give it text."
            )
        yield previous, offset, True

    for shard_index in range(position["shard"], len(order)):
        resuming = shard_index == position["shard"]
        shard = shards[order[shard_index]]
        for document in shard.documents(position["document"] if resuming else None):
            offset = position["offset"] if resuming else 0
            resuming = False
            for text, at, last in pieces_of(document, offset):
                batch.append((text, {"shard": shard_index, "document": document.locator, "offset": at}, at == 0, last))
                batch_chars += len(text)
                if batch_chars >= BATCH_CHARS:
                    yield from flush()
                    batch_chars = 0
    if batch:
        yield from flush()


def pack(pieces: Iterator[tuple[list[int], dict]], block_size: int, skip: int) -> Iterator[tuple[np.ndarray, dict]]:
    """Cut the ids of `pieces` into blocks of `block_size`, the first `skip` ids left out; the last partial block
    is dropped. Yields `(block, where)`: `where` is the piece's, with `skip` = its ids used up to the block's end."""
    block, filled = np.empty(block_size, dtype=np.int64), 0
    for ids, where in pieces:
        ids = np.asarray(ids, dtype=np.int64)
        start, skip = skip, 0
        while start < len(ids):
            take = min(block_size - filled, len(ids) - start)
            block[filled : filled + take] = ids[start : start + take]
            filled, start = filled + take, start + take
            if filled == block_size:
                yield block.copy(), {**where, "skip": start}
                filled = 0


def insert_repeats(block: np.ndarray, index: int, fraction: float, max_length: int, seed: int) -> np.ndarray:
    """Teach copying: in a `fraction` of the training blocks, a passage of the block is written again
    further on, over the text there, so predicting the repeat only needs a look back.

    Long-context fine-tuning data mixes add such documents (passkey and retrieval data) so that looking far
    back pays. Measured on the previous default model (0.84M), shares up to 100 % taught it no copying within the
    budgets tried (docs/long_context.md); larger models are where it is meant to help. Per chosen block of
    length B: a passage length L uniform in `[max_length // 4, max_length]`, a gap D uniform in `[0, B - 2L]`
    (so long look-backs are as common as short ones), a start s uniform in `[0, B - 2L - D]`; tokens
    `[s, s + L)` are copied to `[s + L + D, s + 2L + D)`. Which blocks, and where, depends only on
    `(seed, index)`: the same blocks under any number of processes and on resume.
    """
    rng = random.Random(f"{seed}-{index}")
    length = min(max_length, len(block) // 2)
    if rng.random() < fraction and length >= 1:
        block = block.copy()
        length = rng.randint(max(1, length // 4), length)
        gap = rng.randint(0, len(block) - 2 * length)
        start = rng.randint(0, len(block) - 2 * length - gap)
        block[start + length + gap : start + 2 * length + gap] = block[start : start + length]
    return block


def document_windows(
    ids: Iterator[list[int]], block_size: int, pad_token_id: int, stride: int | None = None
) -> Iterator[tuple[list[int], list[int]]]:
    """Evaluation windows of one document, given as its framed ids `[prefix] + doc` in pieces: windows of
    `block_size` tokens starting every `stride` tokens, so that every document token is predicted exactly once.

    `stride = block_size - 1` (the default: one token of overlap) scores every token of every window: a
    token's context is whatever precedes it in its window (on average half a window). A smaller stride
    (sliding windows) scores only the last `stride` tokens of each window after the first, so every scored
    token sees at least `block_size - stride` tokens before it: the way to measure what a longer context
    buys. Yields `(input_ids, labels)`: labels equal `input_ids` (the model shifts them, so a window's first
    token is context only), -100 on the padding of the last window and on the tokens an earlier window
    scored; causal attention never lets a real token see the padding after it, so no attention mask is needed.

    Raises:
        ValueError: `stride` is not in `[1, block_size - 1]`.
    """
    stride = block_size - 1 if stride is None else stride
    if not 1 <= stride <= block_size - 1:
        raise ValueError(f"the scoring stride must be in [1, block_size - 1 = {block_size - 1}], got {stride}.")
    context_only = block_size - stride  # leading tokens of a later window that an earlier window scored
    buffer: list[int] = []  # the document's ids from `base` on
    base, start = 0, 0

    def window_at(start: int) -> tuple[list[int], list[int]]:
        window = buffer[start - base : start - base + block_size]
        padding = block_size - len(window)
        # label 0 is never a target (the model shifts labels): kept, as the first window keeps it
        scored = window if start == 0 else window[:1] + [IGNORE_INDEX] * (context_only - 1) + window[context_only:]
        return window + [pad_token_id] * padding, scored + [IGNORE_INDEX] * padding

    for piece in ids:
        buffer.extend(piece)
        while base + len(buffer) >= start + block_size:  # the window is whole: more text follows or not
            yield window_at(start)
            start += stride
            del buffer[: start - base]
            base = start
    length = base + len(buffer)
    while start < max(1, length - context_only):
        yield window_at(start)
        start += stride
