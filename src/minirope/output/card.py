"""The model card every command writes (README.md, the Hub's model page): `model_card` (metadata with the measured
validation metrics, how the model was trained, how to load it, the weights' licence), the name it loads the model by
(`card_name`), the licence read from the weights' source (`licence_of`, `own_licence`) and the optimizer's line
(`optimizer_description`); `OwnModelCard` keeps the Trainer's and TRL's own cards from overwriting it."""

import struct
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, metadata
from pathlib import Path

from huggingface_hub import EvalResult, ModelCard, ModelCardData, hf_hub_download
from transformers import PreTrainedConfig, TrainingArguments

from minirope.folders import looks_local


@dataclass(frozen=True)
class Licence:
    """The licence of a model's weights: `id`, the Hub's licence identifier (`apache-2.0`, `mit`, `llama3.2`, ...;
    None: unknown), and `source`, where it was read (a GGUF's `general.license`, a folder's or Hub repo's card)."""

    id: str | None
    source: str

    def line(self) -> str:
        """The card's sentence about the licence."""
        if self.id is None:
            return (f"Unknown: {self.source} states no licence, so none is claimed here; check the terms of the "
                    f"original weights before you use or share them.")  # fmt: skip
        return f"`{self.id}`, as stated by {self.source}."


def own_licence() -> Licence:
    """The licence of a model minirope trained from scratch: the minirope package's own (its metadata's
    `License-Expression`, or `License`)."""
    try:
        meta = metadata("minirope")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return Licence(None, "the minirope package (not installed here)")
    name = meta.get("License-Expression") or meta.get("License")
    return Licence(name.lower() if name else None, "minirope's package licence (trained from scratch by minirope)")


def gguf_licence(path: Path) -> Licence:
    """`general.license` of a GGUF file (llama.cpp's metadata), read by the `gguf` package.

    Raises:
        ValueError: the file is not a readable GGUF (truncated, corrupt).
    """
    from gguf import GGUFReader

    try:
        field = GGUFReader(path).get_field("general.license")
    except (OSError, ValueError, KeyError, IndexError, struct.error) as error:
        raise ValueError(f"{path} is not a readable GGUF file ({type(error).__name__}: {error}).") from None
    text = str(field.contents()).strip() if field is not None else ""
    return Licence(text or None, f"{path.name}'s `general.license`")


def licence_of(source: str, revision: str = "main") -> Licence:
    """The licence the weights at `source` state: a `.gguf` file's `general.license`, else the `license` of the
    model card (README.md metadata) of a local folder or, for a Hub id, of the Hub repository at `revision`. A card
    without one, no card, or a Hub card that cannot be read: `Licence(None, ...)` (unknown; nothing is invented)."""
    if source.lower().endswith(".gguf"):
        return gguf_licence(Path(source))
    local = looks_local(source)
    where = f"{Path(source).name}'s model card" if local else f"the Hub card of {source}"
    try:
        path = Path(source) / "README.md" if local else hf_hub_download(source, "README.md", revision=revision)
        card = ModelCard.load(path)
    except Exception:  # no card (a missing file or repo, no network): the licence is unknown, which the card says
        return Licence(None, where)
    return Licence(card.data.license or None, where)


def card_name(args: TrainingArguments) -> str:
    """The name a model card loads the model by: the Hub repository's full id when the run pushes (`check_push` set
    it), else the output folder's name."""
    return args.hub_model_id if args.push_to_hub and args.hub_model_id else Path(args.output_dir).name


CARD_BODY = """
# {name}

A [minirope](https://pypi.org/project/minirope/) causal language model: a Llama-architecture decoder
({size}, context {context}, vocabulary {vocab}) with Rotary Position
Embedding (RoFormer), `rope_parameters` = `{rope}`.

## Training

{how_trained}

{evaluation}
## Use

```python
from transformers import AutoModelForCausalLM, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained("{name}")
{load}
inputs = tokenizer("ROMEO:\\n", return_tensors="pt")
print(tokenizer.decode(model.generate(**inputs, max_new_tokens=100, do_sample=True)[0]))
```

The weights are named as in `LlamaForCausalLM`; `minirope.convert.to_llama` turns the model into a
plain Llama checkpoint.

## Licence

{licence}
"""


def eval_results(metrics: dict, dataset: str | None) -> list[EvalResult]:
    """The card's metadata results: validation bits per byte, loss and perplexity, where `metrics` has them."""
    return [
        EvalResult(
            task_type="text-generation",
            dataset_type=dataset,
            dataset_name=dataset,
            dataset_split="validation",
            metric_type=metric,
            metric_name=label,
            metric_value=round(float(metrics[key]), 4),
        )
        for key, metric, label in (
            ("eval_bits_per_byte", "bits_per_byte", "Validation bits per byte"),
            ("eval_nats_per_token", "loss", "Validation loss (nats/token)"),
            ("eval_perplexity", "perplexity", "Validation perplexity"),
        )
        if key in metrics
    ]


def load_code(name: str, adapter: bool) -> str:
    """The card's lines that load the model: peft's for an adapter, else with minirope or as remote code."""
    if adapter:
        return f'from peft import AutoPeftModelForCausalLM\nmodel = AutoPeftModelForCausalLM.from_pretrained("{name}")'
    return (
        "# with minirope installed (pip install minirope):\n"
        f'import minirope\nmodel = AutoModelForCausalLM.from_pretrained("{name}")\n'
        "# without minirope: the folder ships its model code (the tokenizer loader reads the same config)\n"
        f'tokenizer = AutoTokenizer.from_pretrained("{name}", trust_remote_code=True)\n'
        f'model = AutoModelForCausalLM.from_pretrained("{name}", trust_remote_code=True)'
    )


def evaluation_section(dataset: str | None, results: list[EvalResult]) -> str:
    """The card's evaluation section (none without a dataset)."""
    if not dataset:
        return ""
    rows = "\n".join(f"| {result.metric_name} | {result.metric_value} |" for result in results)
    return f"""## Evaluation (validation split of {dataset})

| metric | value |
|---|---|
{rows}

Bits per byte: each validation document tokenized whole (as `tokenizer(text)` does), every token
predicted once in windows of the model's context; summed loss in nats / ln 2 / the document's UTF-8
bytes (independent of the tokenizer). lm-evaluation-harness's `loglikelihood_rolling` computes the same.
"""


def model_card(
    name: str,
    config: PreTrainedConfig,
    metrics: dict,
    dataset: str | None,
    how_trained: str,
    *,
    base_model: str | None = None,
    methods: tuple[str, ...] = (),
    adapter: bool = False,
    licence: Licence,
) -> ModelCard:
    """A Hub model card (README.md): metadata with the measured validation metrics, and how to load the model.

    `base_model` (the model the run started from) goes into the metadata, with the Hub's `base_model_relation`
    (`adapter` for an adapter, else `finetune`), when it is a Hub id: a local folder means nothing on the Hub, and
    the training text names it. `methods` are tags for how it was trained (`lora`, `dpo`, ...). `dataset` None (a
    model not trained by this run, e.g. imported): no dataset and no evaluation section. `licence`: the weights'
    (`licence_of` the source a run started from, `own_licence` for a model trained from scratch): its id in the
    metadata, and a section saying where it was read, or that it is unknown (then no licence field).
    """
    on_hub = base_model is not None and not looks_local(base_model)
    results = eval_results(metrics, dataset)
    data = ModelCardData(
        model_name=name,
        library_name="peft" if adapter else "transformers",
        pipeline_tag="text-generation",
        license=licence.id,
        tags=["minirope", "rope", "llama", "causal-lm", "text-generation", *methods],
        datasets=[dataset] if dataset else None,
        base_model=base_model if on_hub else None,
        base_model_relation=("adapter" if adapter else "finetune") if on_hub else None,
        eval_results=results,
    )
    size = f"{config.num_hidden_layers} layers, hidden {config.hidden_size}, {config.num_attention_heads} heads"
    load, evaluation = load_code(name, adapter), evaluation_section(dataset, results)
    body = CARD_BODY.format(name=name, size=size, context=config.max_position_embeddings, vocab=config.vocab_size,
                            rope=config.rope_parameters, how_trained=how_trained, evaluation=evaluation, load=load,
                            licence=licence.line())  # fmt: skip
    return ModelCard(f"---\n{data.to_yaml()}\n---\n{body}")


class OwnModelCard:
    """Trainer mixin: the card is minirope's (`model_card`, written by `finish_run` before the push); the Trainer's
    and TRL's `create_model_card`, which `push_to_hub` and TRL's checkpoints call, would overwrite it."""

    def create_model_card(self, *args, **kwargs) -> None:
        """Leave the card `finish_run` wrote."""


def optimizer_description(args: TrainingArguments) -> str:
    """How the weights were updated, for model cards: `AdamW lr 0.003 (cosine, 40 warm-up steps), weight decay 0.1`,
    or `Muon for the hidden matrices and AdamW for the rest, lr ...` with `--optim_hidden muon`."""
    scheduler = getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)
    schedule = f"{scheduler} {args.lr_scheduler_kwargs}" if args.lr_scheduler_kwargs else scheduler
    muon = getattr(args, "optim_hidden", "adamw") == "muon"
    optimizer = "Muon for the hidden matrices and AdamW for the rest," if muon else "AdamW"
    return (
        f"{optimizer} lr {args.learning_rate} ({schedule}, {args.warmup_steps:g} warm-up steps), weight decay "
        f"{args.weight_decay}"
    )
