"""`BlockStream` yields the training blocks of a list of shards (`minirope.data.documents`), epoch after
epoch, optionally with the shard order shuffled per epoch and the blocks shuffled in windows of
`shuffle_buffer` blocks. Its position after every block is a small JSON dict (the shard, the document, the
byte offset of the text piece being read, the tokens of it already used, ...), from which it continues
exactly; resuming re-reads at most one shuffle window. Memory is bounded by the text tokenized at once
(`BATCH_CHARS`), one block, and the shuffle window, whatever the size of the documents and the corpus.
"""

import random
from collections import deque
from collections.abc import Iterator

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from minirope.data.blocks import document_frame, insert_repeats, pack, token_pieces
from minirope.data.documents import Shard
from minirope.data.tokenizer import TextPieces

START = {"epoch": 0, "shard": 0, "document": None, "offset": 0, "skip": 0, "block": 0}


def shuffled_shards(count: int, seed: int, epoch: int) -> list[int]:
    """The order in which a shuffled stream reads its `count` shards in pass `epoch`."""
    order = list(range(count))
    random.Random(f"{seed}-shards-{epoch}").shuffle(order)
    return order


class BlockStream(torch.utils.data.IterableDataset):
    """The training blocks of `shards`, epoch after epoch (an endless stream), resumable at any block.

    Args:
        shards: where the documents come from (`minirope.data.documents`).
        tokenizer: tokenizes each document whole (in exact pieces) and frames it with bos/eos.
        block_size: tokens per block.
        seed: seeds the shard order, the shuffle windows and the repeats.
        shuffle_shards: read the shards in a new seeded order each epoch (else in the given order).
        shuffle_buffer: shuffle the blocks in consecutive windows of this many (0 or 1: in stream order).
        max_blocks: an epoch is the first `max_blocks` blocks (None: every block of every shard).
        repeat_fraction, repeat_length: `insert_repeats` in this share of the blocks.

    Items are `{"input_ids": (block_size,) int64, "labels": the same}`. `state_dict()` is the position
    after the last block read; `state_at(count)` the position after the `count`-th block (counted since the
    stream's start, across resumes), kept for the last `keep_states` blocks (enough to cover what a data
    loader reads ahead); `load_state_dict` makes the next iteration continue from a position.
    """

    def __init__(
        self,
        shards: list[Shard],
        tokenizer: PreTrainedTokenizerBase,
        block_size: int,
        seed: int = 0,
        shuffle_shards: bool = False,
        shuffle_buffer: int = 0,
        max_blocks: int | None = None,
        repeat_fraction: float = 0.0,
        repeat_length: int = 64,
        keep_states: int = 4096,
    ) -> None:
        self.shards, self.block_size, self.seed = shards, block_size, seed
        self.pieces, self.frame = TextPieces(tokenizer), document_frame(tokenizer)
        self.shuffle_shards, self.shuffle_buffer, self.max_blocks = shuffle_shards, shuffle_buffer, max_blocks
        self.repeat_fraction, self.repeat_length = repeat_fraction, repeat_length
        self.start = {"window": START, "emitted": 0, "count": 0}
        self.states: deque[dict] = deque(maxlen=keep_states)

    def shard_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.shards)))
        return shuffled_shards(len(self.shards), self.seed, epoch) if self.shuffle_shards else order

    def epoch_blocks(self, position: dict) -> Iterator[tuple[np.ndarray, dict]]:
        """The blocks of one epoch from `position` (stream order), each with the position after it.

        Raises:
            ValueError: the epoch's text is shorter than one block.
        """
        epoch, index = position["epoch"], position["block"]
        pieces = token_pieces(self.shards, self.shard_order(epoch), position, self.pieces, self.frame)
        tokens = 0

        def counted(pieces):
            nonlocal tokens
            for ids, where in pieces:
                tokens += len(ids)
                yield ids, where

        for block, where in pack(counted(pieces), self.block_size, position["skip"]):
            if self.max_blocks is not None and index >= self.max_blocks:
                return
            if self.repeat_fraction > 0:
                block = insert_repeats(block, index, self.repeat_fraction, self.repeat_length, self.seed)
            index += 1
            yield block, {"epoch": epoch, **where, "block": index}
        if index == 0:
            raise ValueError(
                f"the training text is {tokens} tokens, shorter than one block of --block_size {self.block_size}: "
                f"lower --block_size or give more text."
            )

    def stream_blocks(self, position: dict) -> Iterator[tuple[np.ndarray, dict]]:
        """Every epoch's blocks from `position`, in stream order, each with the position after it."""
        while True:
            yield from self.epoch_blocks(position)
            position = {**START, "epoch": position["epoch"] + 1}

    def blocks(self, state: dict) -> Iterator[tuple[np.ndarray, dict]]:
        """The blocks from `state`, shuffled in windows, each with the state after it."""
        window_start, skip, count = state["window"], state["emitted"], state["count"]
        upstream = self.stream_blocks(window_start)
        size = max(1, self.shuffle_buffer)
        while True:
            window = [next(upstream) for _ in range(size)]
            order = list(range(size))
            if size > 1:
                random.Random(f"{self.seed}-window-{window_start['epoch']}-{window_start['block']}").shuffle(order)
            for emitted in range(skip, size):
                count += 1
                block, after = window[order[emitted]]
                if size == 1:  # no window: the position after the block is all there is
                    yield block, {"window": after, "emitted": 0, "count": count}
                else:
                    yield block, {"window": window_start, "emitted": emitted + 1, "count": count}
            window_start, skip = window[-1][1], 0

    def __iter__(self):
        for block, state in self.blocks(self.start):
            self.states.append(state)
            yield {"input_ids": block, "labels": block}

    def state_dict(self) -> dict:
        return self.states[-1] if self.states else self.start

    def state_at(self, count: int) -> dict:
        """The position after the `count`-th block of the stream.

        Raises:
            KeyError: that block is not among the last `keep_states` read (or not read yet).
        """
        for state in reversed(self.states):
            if state["count"] == count:
                return state
        if count == self.start["count"]:
            return self.start
        raise KeyError(f"the stream holds no position for block {count} (it has read {self.state_dict()['count']})")

    def load_state_dict(self, state: dict) -> None:
        self.start = state
        self.states.clear()

    def one_epoch(self) -> Iterator[np.ndarray]:
        """The blocks of the first epoch, in stream order (no shuffle window): what training in memory samples."""
        for block, _ in self.epoch_blocks(START):
            yield block
