"""Byte-level BPE tokenizer trained with `tokenizers`, saved as a transformers fast tokenizer.

Byte-level (as GPT-2): every string round-trips, no unknown token, and each character of a token's
vocabulary string stands for exactly one UTF-8 byte, which `token_byte_lengths` uses to count bytes for
the bits-per-byte metric.
"""

from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

SPECIAL_TOKENS = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE with `vocab_size` entries (3 special tokens + 256 bytes + merges) on `texts`.

    Raises:
        ValueError: `vocab_size` leaves no room for merges (must be > 259).
    """
    floor = len(SPECIAL_TOKENS) + 256
    if vocab_size <= floor:
        raise ValueError(f"tokenizer vocab_size must be > {floor} (specials + 256 bytes), got {vocab_size}.")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, clean_up_tokenization_spaces=False, **SPECIAL_TOKENS)


def load_or_train_tokenizer(
    path: str | Path, texts: Callable[[], Iterable[str]], vocab_size: int
) -> tuple[PreTrainedTokenizerBase, bool]:
    """The tokenizer saved at `path` if it has `vocab_size` entries, else a new one trained on `texts()`
    (called only then: with a stream it reads the sample).

    Returns `(tokenizer, reused)`. A trained tokenizer is not saved here: it is saved with the model.
    """
    if (Path(path) / "tokenizer.json").is_file():
        tokenizer = AutoTokenizer.from_pretrained(path)
        if len(tokenizer) == vocab_size:
            return tokenizer, True
    return train_tokenizer(texts(), vocab_size), False


def token_byte_lengths(tokenizer: PreTrainedTokenizerBase) -> np.ndarray:
    """UTF-8 bytes that each token id decodes to, shape `(len(tokenizer),)` int64; 0 for special tokens."""
    lengths = np.zeros(len(tokenizer), dtype=np.int64)
    special = set(tokenizer.all_special_ids)
    for token, index in tokenizer.get_vocab().items():
        lengths[index] = 0 if index in special else len(token)
    return lengths
