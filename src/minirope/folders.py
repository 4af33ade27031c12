"""Model folders as the commands read them: the flags that name one, and its config, tokenizer and causal LM, each
loaded with one clear error naming the folder and the fix.

Used by every command that starts from a trained model (`minirope-finetune`, `-extend`, `-generate`, `-export`), so
that a folder that is not there, is not a model, holds corrupt weights or lacks a tokenizer reads the same everywhere.
"""

import os
from dataclasses import dataclass, field
from pathlib import Path

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
    model_revision: str = field(
        default="main",
        metadata={"help": "With a Hub id: the branch, tag or commit to load.", "aliases": ["--revision"]},
    )


def first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def looks_local(path: str) -> bool:
    """Whether `path` names a local folder rather than a Hub id (`org/name`)."""
    return path.startswith((".", "/", "~")) or path.count("/") > 1 or Path(path).exists()


def load_config(args: ModelArguments) -> PreTrainedConfig:
    """The folder's config, which must describe a causal LM.

    Raises:
        ValueError: a local path that does not exist or is a file (a GGUF file: `minirope-import` it first), no
            config (not a model folder), a config no Auto class knows or whose values are invalid, or a model that is
            not a causal LM.
    """
    path = args.model_name_or_path
    if looks_local(path) and not Path(path).is_dir():
        if Path(path).is_file() and path.endswith(".gguf"):
            raise ValueError(f"cannot load a model from {path!r}: it is a GGUF file; import it into a folder first "
                             f"(`minirope-import {path} --output_dir DIR`) and give that folder.")  # fmt: skip
        what = "is a file" if Path(path).exists() else "does not exist"
        raise ValueError(
            f"cannot load a model from {path!r}: it {what}; give the folder written by minirope-pretrain or "
            f"save_pretrained."
        )
    try:
        config = AutoConfig.from_pretrained(
            path, trust_remote_code=args.trust_remote_code, revision=args.model_revision
        )
    except (OSError, ValueError) as error:
        config_file = Path(path) / "config.json"
        if config_file.is_file() and "Unrecognized model" not in str(error):
            raise ValueError(f"the config of {path!r} is invalid: {first_line(error)} (in {config_file}).") from None
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
        return AutoTokenizer.from_pretrained(
            args.model_name_or_path, trust_remote_code=args.trust_remote_code, revision=args.model_revision
        )
    except (OSError, ValueError) as error:
        raise ValueError(
            f"cannot load a tokenizer from {args.model_name_or_path!r} ({first_line(error)}): save it next to the "
            f"model with tokenizer.save_pretrained(folder)."
        ) from None


def parameter_count(config: PreTrainedConfig) -> int:
    """The parameters a Llama-architecture `config` declares (embeddings, attention, MLP, norms, an untied head),
    counted from its sizes alone, before anything is allocated."""
    hidden, layers = config.hidden_size, config.num_hidden_layers
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
    mlp = 3 * hidden * config.intermediate_size
    embeddings = config.vocab_size * hidden * (1 if getattr(config, "tie_word_embeddings", False) else 2)
    return embeddings + layers * (attention + mlp + 2 * hidden) + hidden


def check_fits(config: PreTrainedConfig, source: str, dtype: torch.dtype = torch.float32) -> None:
    """Refuse a config whose declared sizes cannot fit this machine's memory in `dtype`, before anything is
    allocated (transformers allocates the declared tensors first, then reports the mismatch: an out-of-memory kill).

    Raises:
        ValueError: naming the source, the parameters declared, the bytes they need and the machine's memory.
    """
    import psutil

    try:
        needed = parameter_count(config) * torch.empty((), dtype=dtype).element_size()
    except (AttributeError, TypeError, ZeroDivisionError):  # not a Llama-like config: transformers' checks apply
        return
    memory = psutil.virtual_memory().total
    if needed > memory:
        dtype_name = str(dtype).removeprefix("torch.")
        raise ValueError(
            f"the config of {source!r} declares {parameter_count(config) / 1e9:.1f}B parameters ({needed / 2**30:.1f} "
            f"GiB in {dtype_name}), more than this machine's {memory / 2**30:.1f} GiB of memory: check its sizes "
            f"(hidden_size, num_hidden_layers, vocab_size), or load it on a larger machine."
        )


def check_weights(path: str, loading: dict) -> None:
    """Refuse weights that do not fit the config, where transformers would re-initialise the tensors at random.

    Raises:
        ValueError: naming the first tensor whose shape differs (both shapes), or the tensors the config has and the
            weights lack.
    """
    for name, saved, expected in sorted(loading["mismatched_keys"]):
        raise ValueError(
            f"the weights in {path!r} do not fit its config: {name} is {tuple(saved)} in model.safetensors but "
            f"{tuple(expected)} by config.json: restore the config.json saved with these weights."
        )
    missing = sorted(loading["missing_keys"])
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise ValueError(
            f"the weights in {path!r} lack {missing[0]}{more}, which its config describes (e.g. more layers than were "
            f"saved): restore the config.json saved with these weights."
        )


def load_causal_lm(args: ModelArguments, **kwargs) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """The folder's causal LM (`AutoModelForCausalLM.from_pretrained(..., **kwargs)`) and tokenizer.

    Raises:
        ValueError: see `load_config` and `load_tokenizer`; or the tokenizer has more tokens than the model's
            embedding has rows.
        OSError: the weights are missing, truncated or corrupt, or a pickle only (naming the folder).
    """
    config = kwargs.pop("config", None) or load_config(args)
    path = args.model_name_or_path
    dtype = kwargs.get("dtype")
    check_fits(config, path, dtype if isinstance(dtype, torch.dtype) else torch.float32)
    try:
        model, loading = AutoModelForCausalLM.from_pretrained(
            path,
            config=config,
            trust_remote_code=args.trust_remote_code,
            revision=args.model_revision,
            ignore_mismatched_sizes=True,  # reported below, with the tensor and both shapes
            output_loading_info=True,
            **kwargs,
        )
    except OSError as error:
        raise OSError(f"cannot load a model from {path!r}: {first_line(error)}") from error
    check_weights(path, loading)
    tokenizer = load_tokenizer(args)
    rows = model.get_input_embeddings().num_embeddings
    if len(tokenizer) > rows:
        raise ValueError(
            f"the tokenizer has {len(tokenizer)} tokens but the model's vocab_size is {rows}: use the tokenizer "
            f"saved with the model, or call model.resize_token_embeddings(len(tokenizer)) and save it first."
        )
    return model, tokenizer


def check_output(output: str | Path, flag: str, inputs: dict[str, str | None], folder: bool = True) -> None:
    """Refuse an output path that would destroy or replace what the user has, before any work.

    Refused: an output that is one of `inputs` (flag -> path; None skipped), inside one, or holding one (a checkpoint
    rotation or a replaced folder would delete it); a file where a folder is written (`folder`), or a folder where a
    file is; a place that cannot be written.

    Raises:
        ValueError: naming the flag, the path and the fix.
    """
    output = Path(output).expanduser()
    target = output.resolve()
    for input_flag, path in inputs.items():
        if not path:
            continue
        source = Path(path).expanduser().resolve()
        if target == source or source in target.parents or target in source.parents:
            relation = "is" if target == source else "is inside" if source in target.parents else "holds"
            raise ValueError(
                f"{flag} {output} {relation} {input_flag} {path}: writing there would change or delete it; choose "
                f"another {flag}."
            )
    if output.exists() and output.is_dir() != folder:
        kind = "a file" if folder else "a folder"
        raise ValueError(
            f"{flag} {output} is {kind}, where {'a folder' if folder else 'a file'} is written: choose another {flag}."
        )
    start = target if target.is_dir() else target.parent  # a folder is written into; a file's folder is written
    existing = next(parent for parent in (start, *start.parents) if parent.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(
            f"{flag} {output} cannot be written ({existing} is not a writable folder): choose another {flag}."
        )
