"""Model folders as the commands read them: the flags that name one, and its config, tokenizer and causal LM, each
loaded with one clear error naming the folder and the fix.

Used by every command that starts from a trained model (`minirope-finetune`, `-extend`, `-generate`, `-export`), so
that a folder that is not there, is not a model, holds corrupt weights or lacks a tokenizer reads the same everywhere.
"""

from dataclasses import dataclass, field

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedConfig, PreTrainedTokenizerBase

import minirope  # noqa: F401  (registers the minirope classes with the Auto factories)


@dataclass
class ModelArguments:
    """The model a command starts from."""

    model_name_or_path: str = field(
        metadata={"help": "A folder written by minirope (save_pretrained), or a Hub id.", "aliases": ["--model"]}
    )
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow the folder's own model code."})


def first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def load_config(args: ModelArguments) -> PreTrainedConfig:
    """The folder's config, which must describe a causal LM.

    Raises:
        ValueError: no config (not a model folder), a config no Auto class knows, or a model that is not a causal LM.
    """
    path = args.model_name_or_path
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=args.trust_remote_code)
    except (OSError, ValueError) as error:
        raise ValueError(
            f"cannot load a model from {path!r}: it is not a model folder ({first_line(error)}): give a folder written "
            f"by minirope-pretrain or save_pretrained, or a Hub id."
        ) from None
    architectures = config.architectures or []
    if architectures and not any(name.endswith("ForCausalLM") for name in architectures):
        raise ValueError(
            f"{path!r} holds {', '.join(architectures)}, not a causal LM: give the pretrained model (a *ForCausalLM "
            f"folder), not one with a task head."
        )
    return config


def load_tokenizer(args: ModelArguments) -> PreTrainedTokenizerBase:
    """The folder's tokenizer.

    Raises:
        ValueError: the folder has no tokenizer that loads.
    """
    try:
        return AutoTokenizer.from_pretrained(args.model_name_or_path, trust_remote_code=args.trust_remote_code)
    except (OSError, ValueError) as error:
        raise ValueError(
            f"cannot load a tokenizer from {args.model_name_or_path!r} ({first_line(error)}): save it next to the "
            f"model with tokenizer.save_pretrained(folder)."
        ) from None


def load_causal_lm(args: ModelArguments, **kwargs) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """The folder's causal LM (`AutoModelForCausalLM.from_pretrained(..., **kwargs)`) and tokenizer.

    Raises:
        ValueError: see `load_config` and `load_tokenizer`; or the tokenizer has more tokens than the model's
            embedding has rows.
        OSError: the weights are missing, truncated or corrupt, or a pickle only (naming the folder).
    """
    config = kwargs.pop("config", None) or load_config(args)
    path = args.model_name_or_path
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, config=config, trust_remote_code=args.trust_remote_code, **kwargs
        )
    except OSError as error:
        raise OSError(f"cannot load a model from {path!r}: {first_line(error)}") from error
    tokenizer = load_tokenizer(args)
    rows = model.get_input_embeddings().num_embeddings
    if len(tokenizer) > rows:
        raise ValueError(
            f"the tokenizer has {len(tokenizer)} tokens but the model's vocab_size is {rows}: use the tokenizer "
            f"saved with the model, or call model.resize_token_embeddings(len(tokenizer)) and save it first."
        )
    return model, tokenizer
