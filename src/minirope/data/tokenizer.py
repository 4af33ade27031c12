"""Byte-level BPE tokenizer trained with `tokenizers`, saved as a transformers fast tokenizer, and the
exact tokenization of long texts in pieces.

Byte-level (as GPT-2 and Llama 3): every string round-trips, no unknown token, and each character of a token's
vocabulary string stands for exactly one UTF-8 byte, which `token_byte_lengths` uses to count bytes for
the bits-per-byte metric. Text is pre-tokenized with Llama 3's regex (`PRE_TOKENIZER_PATTERN`, the `Split` then
`ByteLevel` of Meta-Llama-3's `tokenizer.json`, which llama.cpp knows as `llama-bpe`). Unlike GPT-2's regex, it
keeps punctuation with the newlines after it (",\n" and ":\n" end most lines and speaker names of the
bundled plays: one token each, not two) and lets one other character lead a run of letters ("-d"): on the
validation plays the default 4096-entry tokenizer covers 3.30 bytes per token, where GPT-2's regex gave 3.00
(10 % fewer tokens for the same text: each training step and each 256-token window holds 10 % more of it;
docs/studies/recipe.md).

Long texts are tokenized piece by piece (`TextPieces`), with the same ids as `tokenizer(text)`: a text is cut
only where it has a single space or a single newline between two other characters. The byte-level
pre-tokenizers (Llama 3's regex, which minirope's tokenizer uses, and GPT-2's) always split there and look at
most one character ahead, so each side pre-tokenizes alone as it does inside the whole text, and BPE never
merges across pre-tokens. Each cut is also checked on the text around it (the two sides' ids, joined, equal
the ids of both together), and a tokenizer for which such cuts are not exact (a normalizer or pre-tokenizer
that looks further, e.g. SentencePiece's prefix space) has its documents tokenized whole.

The format it writes (pre-tokenizer regex, special tokens, the chat template) is `minirope.tokenizer_format`.
"""

import hashlib
import logging
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from minirope.data.documents import Shard
from minirope.tokenizer_format import (
    CHAT_TEMPLATE,
    CHAT_TOKENS,
    PRE_TOKENIZER_PATTERN,
    RESERVED_TOKENS,
    SPECIAL_TOKENS,
)

# Where a text may be cut: a single space or a single newline between two other characters.
CUT_POINT = re.compile(r"(?<=\S)(?= \S)|(?<=\S\n)(?=\S)")
PIECE_CHARS = 1 << 16  # characters per piece: about 16k tokens
# The most characters held while no exact cut point comes (CJK text without spaces, base64, a file of NULs, or a
# tokenizer that cannot be cut exactly): then a piece is cut anyway (`forced_cut`), so memory stays bounded.
MAX_UNCUT_CHARS = 64 * PIECE_CHARS
CHECK_CHARS = 64  # characters on each side of a cut that `TextPieces` checks
PROBE = "ROMEO:\nBut soft, what light through yonder window breaks?\nIt is the east, and 1234 suns.\n\n\tO! x y"

logger = logging.getLogger(__name__)


def add_chat_template(tokenizer: PreTrainedTokenizerBase) -> int:
    """Give `tokenizer` the chat template, adding the role markers that are not yet single special tokens; a
    tokenizer with its own template (a released model's) keeps it (`minirope.data.chat` finds its assistant turns).

    Returns the number of tokens added: when it is not 0, the model's embeddings must grow to `len(tokenizer)`
    (`model.resize_token_embeddings`) before training, and the new rows start untrained.
    """
    if tokenizer.chat_template and tokenizer.chat_template != CHAT_TEMPLATE:
        return 0
    missing = [token for token in CHAT_TOKENS if token not in tokenizer.get_vocab()]
    added = tokenizer.add_special_tokens({"additional_special_tokens": missing}) if missing else 0
    tokenizer.chat_template = CHAT_TEMPLATE
    return added


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE with `vocab_size` entries on `texts`, pre-tokenized with `PRE_TOKENIZER_PATTERN`:
    6 special tokens (bos, eos, pad and the chat template's three role markers, `minirope.data.chat`), 256
    bytes, merges; it carries the chat template.

    Raises:
        ValueError: `vocab_size` leaves no room for merges (must be > 262).
    """
    if vocab_size <= RESERVED_TOKENS:
        raise ValueError(f"tokenizer vocab_size must be > {RESERVED_TOKENS} (specials + 256 bytes), got {vocab_size}.")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRE_TOKENIZER_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[*SPECIAL_TOKENS.values(), *CHAT_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        clean_up_tokenization_spaces=False,
        extra_special_tokens=CHAT_TOKENS,
        chat_template=CHAT_TEMPLATE,
        **SPECIAL_TOKENS,
    )


CORPUS_KEY = "training_corpus_sha256"  # in tokenizer_config.json: the text the tokenizer was trained on


def corpus_fingerprint(texts: Iterable[str]) -> str:
    """SHA-256 (hex) of `texts`, each UTF-8 encoded and followed by a NUL: the text a tokenizer is trained on."""
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode("utf-8", "surrogatepass") + b"\0")
    return digest.hexdigest()


def sample_texts(shards: list[Shard], max_bytes: int) -> Iterator[str]:
    """The first `max_bytes` of text of `shards` (about: to the end of a piece), in pieces of at most `PIECE_CHARS`,
    cut between pre-tokens: what a tokenizer is trained on, with memory bounded by a piece whatever the size of the
    documents."""
    pieces, total = TextPieces(None), 0
    for shard in shards:
        for document in shard.documents():
            for text in pieces.pieces(document.read(0)):
                yield text
                total += len(text.encode("utf-8"))
                if total >= max_bytes:
                    return


def load_or_train_tokenizer(
    path: str | Path, shards: list[Shard], max_bytes: int, vocab_size: int
) -> tuple[PreTrainedTokenizerBase, str]:
    """The tokenizer saved at `path` if it was trained on the same sample of `shards` (their first `max_bytes` of
    text, `sample_texts`; its `tokenizer_config.json` records the sample's `corpus_fingerprint`) with `vocab_size`
    entries, else a new one trained on that sample, its fingerprint recorded (saved with the model:
    `save_pretrained` writes it to `tokenizer_config.json`).

    Returns `(tokenizer, how)`: `how` says in one phrase whether it was reused or trained, and why.
    """
    texts = list(sample_texts(shards, max_bytes))
    fingerprint = corpus_fingerprint(texts)
    how = "trained"
    if (Path(path) / "tokenizer.json").is_file():
        saved = AutoTokenizer.from_pretrained(path)
        recorded = saved.init_kwargs.get(CORPUS_KEY)
        if recorded == fingerprint and len(saved) == vocab_size:
            return saved, f"reused from {path} (trained on this corpus sample, sha256 {fingerprint[:12]})"
        if recorded is None:
            why = "has no record of the corpus it was trained on"
        elif recorded != fingerprint:
            why = f"was trained on another corpus (sha256 {recorded[:12]}, this run's {fingerprint[:12]})"
        else:
            why = f"has {len(saved)} tokens, not {vocab_size}"
        how = f"trained anew: the one in {path} {why}; it is replaced when the run ends"
    tokenizer = train_tokenizer(texts, vocab_size)
    tokenizer.init_kwargs[CORPUS_KEY] = fingerprint
    return tokenizer, how


def token_byte_lengths(tokenizer: PreTrainedTokenizerBase) -> np.ndarray:
    """UTF-8 bytes that each token id decodes to, shape `(len(tokenizer),)` int64; 0 for special tokens."""
    lengths = np.zeros(len(tokenizer), dtype=np.int64)
    special = set(tokenizer.all_special_ids)
    for token, index in tokenizer.get_vocab().items():
        lengths[index] = 0 if index in special else len(token)
    return lengths


class TextPieces:
    """Cut texts into pieces whose ids, joined, are the ids of the whole text (see the module doc).

    Args:
        tokenizer: the tokenizer whose ids must be reproduced (`tokenizer(text, add_special_tokens=False)`);
            None for the text a byte-level BPE is trained on (cut points alone, unchecked).
        piece_chars: the length pieces are cut at (about; a piece is cut at the last cut point before it).
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase | None, piece_chars: int = PIECE_CHARS,
                 max_uncut_chars: int = MAX_UNCUT_CHARS) -> None:  # fmt: skip
        self.tokenizer = tokenizer
        self.piece_chars = piece_chars
        self.max_uncut_chars = max(max_uncut_chars, 2 * (piece_chars + CHECK_CHARS))
        self.forced = 0  # pieces cut where no exact cut point came
        self.exact = all(self.cuts_exactly(PROBE, match.start()) for match in CUT_POINT.finditer(PROBE))
        if not self.exact:
            logger.warning(
                "%s cannot be cut exactly between pre-tokens: its documents are tokenized in pieces of %d "
                "characters, whose ids may differ from the whole text's at each cut.",
                type(tokenizer).__name__,
                self.max_uncut_chars,
            )

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False, return_attention_mask=False)["input_ids"]

    def cuts_exactly(self, text: str, at: int) -> bool:
        """Whether cutting `text` at `at` keeps the ids of the `CHECK_CHARS` characters on each side."""
        if self.tokenizer is None:
            return True
        left, right = text[max(0, at - CHECK_CHARS) : at], text[at : at + CHECK_CHARS]
        return self.encode(left) + self.encode(right) == self.encode(left + right)

    def cut(self, text: str) -> int | None:
        """The cut point nearest below `piece_chars` (at least half of it), else the first one past it, with
        `CHECK_CHARS` characters after it; None if `text` has none."""
        end = len(text) - CHECK_CHARS
        low, high = self.piece_chars // 2, min(end, self.piece_chars + 1)
        for start, stop in ((low, high), (high, end)):
            candidates = [match.start() for match in CUT_POINT.finditer(text, start, stop)]
            ordered = reversed(candidates[-8:]) if stop == high else candidates[:8]
            for at in ordered:
                if self.cuts_exactly(text, at):
                    return at
        return None

    def forced_cut(self, text: str) -> int:
        """Where to cut `text` that has no exact cut point for `max_uncut_chars` characters: near its end (one cut
        per `max_uncut_chars`), at the first of 64 places whose sides keep their ids (`cuts_exactly`), else the
        first of them; said once."""
        start = max(self.piece_chars, len(text) - CHECK_CHARS - 64)
        at = next((at for at in range(start, start + 64) if self.cuts_exactly(text, at)), start)
        if not self.forced:
            logger.warning(
                "a document runs %d characters without a place where it can be cut exactly (no single space or "
                "newline: CJK text, base64, one long token): it is cut there anyway, so that memory stays bounded; "
                "its ids may differ from the whole text's at such a cut.",
                len(text),
            )
        self.forced += 1
        return at

    def pieces(self, chunks: Iterable[str]) -> Iterator[str]:
        """The text of `chunks` (one document, in any split) regrouped into pieces cut at exact cut points.

        A text with no cut point for a long way (one huge word) stays in one piece until one comes, or until it holds
        `max_uncut_chars` characters: then it is cut anyway (`forced_cut`), so that no piece or buffer outgrows that.
        """
        carry, wait_until = "", self.piece_chars + CHECK_CHARS
        for chunk in chunks:
            carry += chunk
            while len(carry) >= wait_until:
                at = self.cut(carry) if self.exact else None
                if at is None and len(carry) >= self.max_uncut_chars:
                    at = self.forced_cut(carry)
                if at is None:
                    wait_until = min(2 * len(carry), self.max_uncut_chars)  # look again once the text has doubled
                    break
                yield carry[:at]
                carry, wait_until = carry[at:], self.piece_chars + CHECK_CHARS
        if carry:
            yield carry
