"""The verse task of post-training: prompts from the bundled plays, the model's lines sampled and scored with a reward
(`minirope.rewards`), and preference pairs built from them.

A prompt is the start of a speech, as the corpus writes it: the speaker's header, and for half of the speeches of
the training plays its first line too (`SPEAKER:\\n` or `SPEAKER:\\nline\\n`). Training prompts come from the training
plays only; the measurement's prompts are headers of the validation plays, so a post-trained model is measured on
speakers it was not tuned on.

`measure_verse` samples a model with fixed settings (temperature 0.8, top_k 50, a fixed seed), whatever the folder's
generation config says, and reports the share of sampled lines that scan and the share that are distinct.
"""

import random
from dataclasses import dataclass

import torch

from minirope.rewards import LINES_PER_COMPLETION, scans, verse_lines
from minirope.training.corpus import shakespeare_dataset

SAMPLING = {"do_sample": True, "temperature": 0.8, "top_k": 50, "top_p": 1.0}


def _speeches(play: str) -> list[tuple[str, list[str]]]:
    """Every speech of a play's text as (header, its lines)."""
    pieces = (speech.strip().partition("\n") for speech in play.split("\n\n"))
    return [(header, body.split("\n")) for header, _, body in pieces if body]


def training_prompts(count: int, seed: int = 0) -> list[str]:
    """`count` prompts from speeches of three or more lines in the training plays, drawn with `seed`: the header,
    and for every other prompt the speech's first line (each ends with a newline)."""
    plays = shakespeare_dataset()["train"]["text"]
    speeches = [(header, lines) for play in plays for header, lines in _speeches(play) if len(lines) >= 3]
    chosen = random.Random(seed).sample(speeches, min(count, len(speeches)))
    return [f"{header}\n" + (f"{lines[0]}\n" if index % 2 else "") for index, (header, lines) in enumerate(chosen)]


def validation_headers(count: int) -> list[str]:
    """The first `count` distinct speaker headers (`NAME:\\n`) of speeches of three or more lines in the validation
    plays, taken from the plays in turn."""
    texts = shakespeare_dataset()["validation"]["text"]
    plays = [[header for header, lines in _speeches(play) if len(lines) >= 3] for play in texts]
    headers: list[str] = []
    for row in range(max(map(len, plays), default=0)):
        for play in plays:
            if row < len(play) and f"{play[row]}\n" not in headers and len(headers) < count:
                headers.append(f"{play[row]}\n")
    return headers


@torch.no_grad()
def sample_completions(
    model, tokenizer, prompts: list[str], per_prompt: int, max_new_tokens: int, seed: int, batch: int = 256
) -> list[list[str]]:
    """`per_prompt` sampled completions of each prompt (`SAMPLING`, seeded), decoded without special tokens; prompts
    go to `generate()` left-padded, as many at a time as make at most `batch` sequences."""
    model.eval()
    torch.manual_seed(seed)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    completions = []
    try:
        step = max(1, batch // per_prompt)
        for first in range(0, len(prompts), step):
            inputs = tokenizer(prompts[first : first + step], return_tensors="pt", padding=True).to(model.device)
            out = model.generate(**inputs, **SAMPLING, max_new_tokens=max_new_tokens, num_return_sequences=per_prompt,
                                 pad_token_id=pad)  # fmt: skip
            texts = tokenizer.batch_decode(out[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
            completions += [texts[row : row + per_prompt] for row in range(0, len(texts), per_prompt)]
    finally:
        tokenizer.padding_side = side
    return completions


@dataclass
class VerseMeasure:
    """What `measure_verse` found: lines scored, the share that scan, the share that are distinct, and a few samples."""

    lines: int
    scan_share: float
    distinct_share: float
    samples: list[dict]

    def as_dict(self) -> dict:
        return {"lines": self.lines, "scan_share": self.scan_share, "distinct_share": self.distinct_share}


def measure_verse(
    model, tokenizer, prompts: int = 16, per_prompt: int = 16, max_new_tokens: int = 64, seed: int = 0
) -> VerseMeasure:
    """Sample `per_prompt` completions of each of `prompts` validation headers and score their first three verse
    lines: the share that scan (`minirope.rewards.scans`) and the share that are distinct."""
    headers = validation_headers(prompts)
    completions = sample_completions(model, tokenizer, headers, per_prompt, max_new_tokens, seed)
    lines = [line for group in completions for text in group for line in verse_lines(text, LINES_PER_COMPLETION)]
    samples = [{"prompt": header, "completion": group[0]} for header, group in zip(headers, completions, strict=True)]
    if not lines:
        return VerseMeasure(0, 0.0, 0.0, samples)
    return VerseMeasure(len(lines), sum(map(scans, lines)) / len(lines), len(set(lines)) / len(lines), samples)
