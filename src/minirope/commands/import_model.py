"""`minirope-import`: a released Llama-architecture checkpoint as a minirope folder (`minirope-export` backwards).

    minirope-import HuggingFaceTB/SmolLM2-135M-Instruct --output_dir smol            # a Hub id (--revision)
    minirope-import path/to/llama-folder --output_dir my-llama --dtype bfloat16     # a transformers folder
    minirope-import SmolLM2-135M-Instruct.Q4_1.gguf --output_dir smol               # a GGUF file (llama.cpp's)
    minirope-import SmolLM2-135M-Instruct.Q4_1.gguf --output_dir smol --push_to_hub me/smol   # and upload it

The source is read by transformers itself: `LlamaForCausalLM.from_pretrained(source)` (a GGUF with `gguf_file=`, its
quantized tensors dequantized by transformers' GGUF loader) and `AutoTokenizer.from_pretrained` (the chat template
included); `minirope.convert.from_llama` copies the weights into `MiniRopeForCausalLM` under the same names, so the
logits are Llama's. The folder holds safetensors weights (`--dtype`), the config with minirope's remote code, the
tokenizer, the generation config and a model card naming the source (`base_model` for a Hub id). It is written beside
its final place and moved there complete; what minirope cannot represent is refused before anything is written.
`--push_to_hub REPO` checks the token's right to write REPO before any work, then uploads the finished folder in one
commit; its card's code loads REPO (with `trust_remote_code=True` where minirope is not installed).
"""

import json
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoConfig, AutoTokenizer, HfArgumentParser, LlamaForCausalLM

from minirope.commands import run_cli
from minirope.folders import check_fits, check_output, first_line, looks_local

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class ImportArguments:
    source: str = field(
        metadata={"help": "A Llama-architecture checkpoint: a transformers folder, a Hub id, or a .gguf file."}
    )
    output_dir: str = field(metadata={"help": "The minirope folder to write."})
    revision: str = field(
        default="main",
        metadata={"help": "With a Hub id: the branch, tag or commit to read.", "aliases": ["--model_revision"]},
    )
    dtype: str = field(
        default="float32",
        metadata={"help": f"The weights' dtype in the folder: {', '.join(DTYPES)} (a GGUF is dequantized to it)."},
    )
    overwrite: bool = field(
        default=False, metadata={"help": "Replace an --output_dir that minirope wrote (never a folder of your files)."}
    )
    push_to_hub: str | None = field(
        default=None,
        metadata={
            "help": "Upload the written folder to this Hub repository (`user/name`; a bare name is in your "
            "namespace), in one commit; the token's right to write it is checked before any work."
        },
    )
    hub_private_repo: bool | None = field(
        default=None,
        metadata={"help": "With --push_to_hub: create the repository private (True) or public (False); by default "
                  "at the account's default visibility."},
    )  # fmt: skip

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"--dtype {self.dtype!r} is not one of {', '.join(DTYPES)}.")

    @property
    def gguf(self) -> bool:
        return self.source.lower().endswith(".gguf")

    @property
    def local(self) -> bool:
        """A file or folder on this machine, not a Hub id."""
        return self.gguf or looks_local(self.source)

    def from_pretrained_kwargs(self) -> dict:
        """Where transformers reads the source: the GGUF's folder and `gguf_file`, or the folder / Hub id."""
        if self.gguf:
            path = Path(self.source)
            return {"pretrained_model_name_or_path": str(path.parent), "gguf_file": path.name}
        return {"pretrained_model_name_or_path": self.source, "revision": self.revision}


def parse_args(argv: list[str] | None) -> ImportArguments:
    """`minirope-import SOURCE --output_dir DIR ...`: SOURCE may come first, without its flag."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and not argv[0].startswith("-"):
        argv = ["--source", *argv]
    usage = "minirope-import SOURCE --output_dir DIR [flags]  (or --source SOURCE; -h lists the flags)"
    (args,) = HfArgumentParser(ImportArguments, usage=usage).parse_args_into_dataclasses(args=argv)
    return args


def check_source(args: ImportArguments):
    """The source's config, read by transformers, when minirope represents it exactly.

    Raises:
        ValueError: a missing file or folder, a source transformers cannot read, another architecture, or
            `pretraining_tp` > 1.
    """
    if args.local and args.revision != "main":
        raise ValueError(f"--revision {args.revision} reads a Hub repository's branch, tag or commit, and "
                         f"{args.source} is a local file or folder: drop --revision (or give the Hub id).")  # fmt: skip
    if args.local and not Path(args.source).exists():
        raise ValueError(f"{args.source} does not exist: give a Llama folder, a Hub id or a .gguf file.")
    try:
        config = AutoConfig.from_pretrained(**args.from_pretrained_kwargs())
    except (OSError, ValueError, KeyError, RuntimeError, struct.error) as error:  # struct: a truncated GGUF
        raise ValueError(f"cannot read a model config from {args.source}: {first_line(error)}") from None
    if config.model_type != "llama":
        architectures = ", ".join(config.architectures or []) or "no architecture named"
        raise ValueError(
            f"{args.source} is a {config.model_type} model ({architectures}): minirope-import reads Llama-architecture "
            f"checkpoints (LlamaForCausalLM: Llama 2/3, SmolLM, TinyLlama, ...), which minirope represents exactly."
        )
    check_fits(config, args.source, DTYPES[args.dtype])
    if getattr(config, "pretraining_tp", 1) not in (None, 1):
        raise ValueError(
            f"{args.source} sets pretraining_tp {config.pretraining_tp}: minirope computes its matmuls whole; set it "
            f"to 1 in the config (the same function) and import again."
        )
    return config


def drop_tokens_past_vocabulary(folder: Path, vocab_size: int) -> list[str]:
    """Remove from a saved tokenizer the added tokens whose ids are past the model's `vocab_size` (transformers'
    GGUF tokenizer conversion adds `<|endoftext|>` to a GPT-2-style vocabulary that lacks it); returns them. A token
    without an embedding row would make every command refuse the folder, and the model can never predict it."""
    tokenizer_file, config_file = folder / "tokenizer.json", folder / "tokenizer_config.json"
    if not tokenizer_file.is_file():
        return []
    backend = json.loads(tokenizer_file.read_text())
    dropped = [token["content"] for token in backend["added_tokens"] if token["id"] >= vocab_size]
    if dropped:
        backend["added_tokens"] = [token for token in backend["added_tokens"] if token["id"] < vocab_size]
        tokenizer_file.write_text(json.dumps(backend, ensure_ascii=False, indent=2))
        config = json.loads(config_file.read_text())
        decoder = config.get("added_tokens_decoder", {})
        config["added_tokens_decoder"] = {key: value for key, value in decoder.items() if int(key) < vocab_size}
        for key in ("unk_token", "bos_token", "eos_token", "pad_token"):
            if config.get(key) in dropped:
                config[key] = None
        config_file.write_text(json.dumps(config, ensure_ascii=False, indent=2))
    return dropped


def card(args: ImportArguments, model, name: str, licence):
    """The folder's model card: what it was imported from, `base_model` when that is a Hub id (never a file or a
    folder), the source's own `licence` (`minirope.output.card.licence_of`); its code loads `name` (the Hub
    repository when pushing, else the folder's name)."""
    from minirope.output.card import model_card

    source = Path(args.source).name if args.local else args.source
    how = (
        f"Imported from `{source}`{'' if args.revision == 'main' or args.gguf else f' at {args.revision}'} with "
        f"`minirope-import`: transformers' `LlamaForCausalLM` load of it, copied into `MiniRopeForCausalLM` under the "
        f"same parameter names (the same logits), saved as {args.dtype}"
        + (", its quantized tensors dequantized by transformers' GGUF loader." if args.gguf else ".")
    )
    result = model_card(name, model.config, {}, None, how, base_model=None if args.local else source,
                        methods=("imported",), licence=licence)  # fmt: skip
    result.data.base_model_relation = None  # the same weights: neither a fine-tune nor an adapter
    return result


def is_empty_folder(path: Path) -> bool:
    """Whether `path` is an existing folder with nothing in it (written into as a new one)."""
    return path.is_dir() and not any(path.iterdir())


def run(argv: list[str] | None = None) -> Path:
    """Parse `argv`, read the source with transformers, write the minirope folder; returns its path.

    Raises:
        ValueError: bad flags, a source minirope cannot represent (`check_source`), an `--output_dir` of other files
            (`check_replaceable`) or a push that cannot happen (`check_write_access`); nothing is written.
        FileExistsError: `--output_dir` holds a model and `--overwrite` is not set.
        OSError: the upload failed after the folder was written (the message gives the command to upload it).
    """
    from minirope.convert import from_llama
    from minirope.export import check_export_output, staged
    from minirope.output.card import licence_of
    from minirope.output.folder import upload, visibility
    from minirope.output.hub import check_write_access

    args = parse_args(argv)
    output = Path(args.output_dir)
    inputs = {"source": args.source if args.local else None}
    check_output(output, "--output_dir", inputs)
    check_export_output(output, "--output_dir", args.overwrite or is_empty_folder(output), inputs)
    repo = check_write_access(args.push_to_hub, None, "--push_to_hub") if args.push_to_hub else None
    check_source(args)
    licence = licence_of(args.source, args.revision)
    kwargs = args.from_pretrained_kwargs()
    llama = LlamaForCausalLM.from_pretrained(**kwargs, dtype=DTYPES[args.dtype])
    tokenizer = AutoTokenizer.from_pretrained(**kwargs)
    model = from_llama(llama)
    del llama
    with staged(output, overwrite=True, command="minirope-import", flag="--output_dir", inputs=inputs) as folder:
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        dropped = drop_tokens_past_vocabulary(folder, model.config.vocab_size)
        card(args, model, repo or output.name, licence).save(folder / "README.md")
    if dropped:
        print(f"[minirope] left out {', '.join(dropped)}: added by transformers' tokenizer conversion past the "
              f"model's {model.config.vocab_size} embedding rows, so the model has no weights for them")  # fmt: skip
    parameters = sum(param.numel() for param in model.parameters())
    template = "with its chat template" if tokenizer.chat_template else "no chat template"
    print(f"[minirope] {args.source} -> {output}/: {parameters / 1e6:.1f}M parameters ({args.dtype}), "
          f"{len(tokenizer)} tokens ({template}); load it with AutoModelForCausalLM.from_pretrained")  # fmt: skip
    if repo:
        files = sorted(path.name for path in output.iterdir() if not path.name.startswith("."))
        url = upload(output, repo, f"minirope-import {Path(args.source).name}", files, private=args.hub_private_repo)
        print(f"[minirope] pushed to {url} ({visibility(args.hub_private_repo)})")
    return output


def main() -> None:
    run_cli("minirope-import", run)


if __name__ == "__main__":
    main()
