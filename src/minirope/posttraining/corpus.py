"""Two measures against forgetting that post-training practice uses, on the user's own text:

- the corpus term (`--lm_coef c`): each update also takes `c` times the language-modelling loss of `--lm_batch_size`
  blocks of the user's pretraining text, as InstructGPT's PPO-ptx mixes pretraining gradients into PPO (Ouyang et
  al. 2022, eq. 2). The text is `--lm_train_file` or `--lm_dataset_name`; without either, the bundled plays only
  when the model's own run says it was trained on them (`trained_on`), otherwise the term is off. The run says which.
- `--weight_interpolation a`: the saved weights are `start + a * (tuned - start)` (WiSE-FT, Wortsman et al. 2022).

The term's loss is taken by the trainers' `CorpusTerm` (`minirope.posttraining.trainers`); here are its text
(`corpus_of`, in blocks: `Corpus.blocks`), the hand-over to a trainer (`add_corpus`) and the interpolation.
"""

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from huggingface_hub import ModelCard

from minirope.data.blocks import default_block_size
from minirope.data.bundled import BUNDLED_CORPUS, bundled_shards
from minirope.data.documents import Shard
from minirope.data.pipeline import TextDataArguments, data_description, training_blocks
from minirope.data.sources import dataset_shards, file_shards
from minirope.posttraining.arguments import USER_SOURCES, PosttrainArguments


def trained_on(model_path: str) -> str | None:
    """What a local model folder says it was trained on: its `run_summary.json`'s `training_data`, or (folders
    written before that key) its model card's first dataset; None for a Hub id or a folder that says nothing."""
    folder = Path(model_path)
    summary = folder / "run_summary.json"
    if summary.is_file():
        data = json.loads(summary.read_text()).get("training_data")
        if data:
            return data
    card = folder / "README.md"
    if card.is_file():
        datasets = ModelCard.load(card).data.datasets or []
        return datasets[0] if datasets else None
    return None


@dataclass
class Corpus:
    """The corpus term's text (`shards`, None: off), its weight in the method's updates (`coef`) and in the warm
    start's (`warm_coef`), where it comes from in words, the validation text of bits per byte, and what the model
    says it was trained on (`trained_on`, carried into the run summary)."""

    shards: list[Shard] | None
    coef: float
    warm_coef: float
    source: str
    validation: list[Shard] | None
    trained_on: str | None
    tokenized: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict, repr=False)

    def blocks(self, tokenizer, context: int, seed: int) -> torch.Tensor:
        """The text in blocks of `context` tokens, each document whole (`training_blocks`), `(N, context)` int64;
        tokenized once for each (context, seed), so the warm start and the method take the same blocks."""
        if (context, seed) not in self.tokenized:
            blocks = training_blocks(self.shards, tokenizer, TextDataArguments(block_size=context), seed)
            self.tokenized[context, seed] = blocks.with_format("torch")[:]["input_ids"]
        return self.tokenized[context, seed]


def corpus_of(args: PosttrainArguments, model: str) -> Corpus:
    """The corpus term of a run on `model` (its folder or Hub id) and the validation text of its bits per byte (see
    the module doc).

    Raises:
        ValueError: `--lm_coef` or `--sft_config`'s `lm_coef` above 0 with no text to take it on;
            FileNotFoundError: a missing file or dataset.
    """
    coef, warm_coef = args.lm_coef or 0.0, args.sft_lm_coef if args.warm_start_steps else 0.0
    validation = file_shards(args.lm_validation_file, "text", flag="--lm_validation_file") if (
        args.lm_validation_file) else None  # fmt: skip
    base = trained_on(model)
    if args.lm_train_file or args.lm_dataset_name:
        text = TextDataArguments(train_file=args.lm_train_file, dataset_name=args.lm_dataset_name)
        shards = file_shards(args.lm_train_file, "text", flag="--lm_train_file") if args.lm_train_file else (
            dataset_shards(text, "train"))  # fmt: skip
        return Corpus(shards if coef or warm_coef else None, coef, warm_coef, data_description(text), validation, base)
    if base == BUNDLED_CORPUS:
        source = f"{BUNDLED_CORPUS}, which {model} was trained on"
        shards = bundled_shards("train") if coef or warm_coef else None
        return Corpus(shards, coef, warm_coef, source, validation or bundled_shards("validation"), base)
    user = args.sft_sources.get("lm_coef") in USER_SOURCES  # not a recipe's
    weights = (("--lm_coef", args.lm_coef, "lm_coef" in args.given), ("--sft_config lm_coef", args.sft_lm_coef, user))
    for flag, value, given in weights:
        if value and given:  # a recipe's weight applies only where there is a corpus
            raise ValueError(
                f"{flag} {value} needs the text the model was pretrained on: give --lm_train_file or "
                f"--lm_dataset_name ({model} does not say it was trained on the bundled plays)."
            )
    trained = f"was trained on {base}" if base else "does not say what it was trained on"
    source = f"none ({model} {trained}; --lm_train_file adds one)"
    return Corpus(None, 0.0, 0.0, source, validation, base)


def check_corpus_term(corpus: Corpus, config) -> None:
    """The corpus term is a second backward pass after TRL's step, which DeepSpeed's engine does not take (it owns
    the backward and the step).

    Raises:
        ValueError: a corpus term (`--lm_coef`, `--sft_config`'s `lm_coef`) in a DeepSpeed run (`--deepspeed`, or
            accelerate's DeepSpeed plugin).
    """
    deepspeed = bool(config.deepspeed) or os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"
    if deepspeed and corpus.shards is not None and (corpus.coef or corpus.warm_coef):
        raise ValueError(
            f"the corpus term (--lm_coef {corpus.coef}, during the warm start {corpus.warm_coef}) is a second backward "
            f"pass after TRL's step, which DeepSpeed does not take: pass --lm_coef 0 --sft_config "
            f"'{{\"lm_coef\": 0}}' under DeepSpeed, or train without it."
        )


def add_corpus(trainer, corpus: Corpus, coef: float, args: PosttrainArguments, seed: int) -> None:
    """Hand `trainer` the corpus in blocks of the model's context (`Corpus.blocks`) with weight `coef` (nothing for a
    run without a corpus term, or a weight of 0)."""
    if corpus.shards is None or not coef:
        return
    context = default_block_size(trainer.model.config)
    trainer.set_corpus(corpus.blocks(trainer.processing_class, context, seed), coef, args.lm_batch_size, seed)


@torch.no_grad()
def interpolate_weights(model, start: dict[str, torch.Tensor], weight: float) -> None:
    """Set each parameter to `start + weight * (tuned - start)` in place (WiSE-FT); `weight == 1` leaves it."""
    if weight == 1:
        return
    for name, param in model.named_parameters():
        param.copy_(start[name] + weight * (param - start[name]))
