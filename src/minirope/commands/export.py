"""`minirope-export`: a trained folder as a plain Llama folder, a GGUF file for llama.cpp, an ONNX model, or an
ExecuTorch program.

    minirope-export --model runs/minirope-shakespeare --format llama --output exports/llama
    minirope-export --model runs/minirope-shakespeare --format gguf --output exports/model.gguf --outtype q8_0
    minirope-export --model runs/minirope-shakespeare --format onnx --output exports/onnx
    minirope-export --model runs/minirope-shakespeare --format executorch --output exports/executorch --outtype 8da8w
    minirope-export --model me/minirope-shakespeare --format gguf --output exports/model.gguf --push_to_hub me/m-gguf

`--model` is a folder or a Hub id (`--revision`); `--push_to_hub REPO` uploads the export with its own model card,
which names the source model (as the Hub's GGUF repositories do), after checking the push can happen, before the
export. Each target is written next to its final path and moved there only once complete (`minirope.export`), so a
failed export leaves nothing half-written; an existing output is replaced only with `--overwrite`.
"""

import importlib
import sys
from dataclasses import dataclass, field
from pathlib import Path

from transformers import HfArgumentParser

from minirope.commands import run_cli
from minirope.export import (
    EXECUTORCH_OUTTYPES,
    FORMATS,
    GGUF_OUTTYPES,
    check_export_output,
    export_executorch,
    export_gguf,
    export_llama,
    export_onnx,
)
from minirope.folders import check_output, looks_local
from minirope.output.folder import visibility
from minirope.output.hub import check_write_access


@dataclass
class ExportArguments:
    model: str = field(
        metadata={"help": "A folder written by minirope (save_pretrained, with its tokenizer), or a Hub id."}
    )
    format: str = field(metadata={"help": f"{', '.join(FORMATS)}: one GGUF file, or a folder for the others."})
    output: str = field(metadata={"help": "Where to write: a folder (llama, onnx, executorch) or a .gguf file."})
    outtype: str = field(
        default="f32",
        metadata={
            "help": f"Weight type. gguf: {', '.join(GGUF_OUTTYPES)} (norms stay f32); executorch: "
            f"{', '.join(EXECUTORCH_OUTTYPES)} (int8 weights, int8 dynamic activations)."
        },
    )
    max_cache_len: int | None = field(
        default=None,
        metadata={"help": "executorch: positions in the static KV cache (default: the trained context)."},
    )
    overwrite: bool = field(
        default=False, metadata={"help": "Replace an output that minirope wrote (never a folder or file of yours)."}
    )
    revision: str = field(
        default="main",
        metadata={"help": "With a Hub id: the branch, tag or commit to export.", "aliases": ["--model_revision"]},
    )
    push_to_hub: str | None = field(
        default=None, metadata={"help": "A Hub repository (user/name) to upload the export to, with a model card."}
    )
    hub_private_repo: bool | None = field(
        default=None,
        metadata={"help": "With --push_to_hub: create the repository private (True) or public (False); by default "
                  "at the account's default visibility."},
    )  # fmt: skip


# The optional packages each target imports (the `export` and `executorch` extras), imported before the model is read.
TARGET_PACKAGES = {"gguf": ("gguf",), "onnx": ("onnx", "onnxscript"), "executorch": ("executorch",)}


def run(argv: list[str] | None = None) -> Path:
    """Parse `argv` (default: the command line), write the export and return its path.

    Raises:
        ValueError: an unknown format or outtype, or a model the target cannot express.
        OSError: no loadable model and tokenizer in `--model`.
        FileExistsError: the output exists and `--overwrite` is not set.
    """
    (args,) = HfArgumentParser(ExportArguments).parse_args_into_dataclasses(args=argv)
    if args.format not in FORMATS:
        raise ValueError(f"--format {args.format!r} is not one of {', '.join(FORMATS)}.")
    outtypes = {"gguf": GGUF_OUTTYPES, "executorch": EXECUTORCH_OUTTYPES}.get(args.format, ("f32",))
    if args.outtype not in outtypes:
        raise ValueError(f"--outtype {args.outtype} is not one of {', '.join(outtypes)} for --format {args.format}.")
    if args.max_cache_len is not None and args.format != "executorch":
        raise ValueError(f"--max_cache_len applies to --format executorch only: drop it for {args.format}.")
    for package in TARGET_PACKAGES.get(args.format, ()):  # a missing one is one line (run_cli), before any work
        importlib.import_module(package)
    model = args.model if looks_local(args.model) else None
    check_output(args.output, "--output", {"--model": model}, folder=args.format != "gguf")
    check_export_output(args.output, "--output", args.overwrite, {"--model": model})
    if args.push_to_hub:
        check_write_access(args.push_to_hub, None, "--push_to_hub")
    model = model or download(args.model, args.revision)
    if args.format == "gguf":
        path = export_gguf(model, args.output, args.outtype, args.overwrite)
    elif args.format == "executorch":
        path = export_executorch(model, args.output, args.outtype, args.max_cache_len, args.overwrite)
    elif args.format == "onnx":
        path = export_onnx(model, args.output, args.overwrite)
    else:
        path = export_llama(model, args.output, args.overwrite)
    print(f"minirope-export: wrote {path}", file=sys.stderr)
    if args.format == "gguf" and args.outtype in AMX_OUTTYPES and cpu_has_amx():
        print(AMX_NOTE, file=sys.stderr)
    if args.push_to_hub:
        url = push_export(path, args)
        print(f"minirope-export: pushed to {url} ({visibility(args.hub_private_repo)})", file=sys.stderr)
    return path


MODEL_FILES = ["*.json", "*.safetensors", "*.py", "*.jinja", "*.txt", "README.md"]  # a minirope folder, nothing else


def download(repo: str, revision: str) -> str:
    """The local snapshot of the Hub model `repo` at `revision` (`huggingface_hub.snapshot_download`).

    Raises:
        OSError: the Hub has no such repository or revision, or cannot be reached (naming it).
    """
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(repo, revision=revision, allow_patterns=MODEL_FILES)
    except Exception as error:  # HTTP and transport errors alike
        raise OSError(f"cannot download the model {repo!r} (revision {revision}) from the Hub: {error}") from None


def export_card(args: ExportArguments, path: Path):
    """The exported repository's model card: the format, the source model (`base_model` when it is a Hub id, with
    the Hub's `quantized` relation for GGUF and ExecuTorch files) and how to load it."""
    from huggingface_hub import ModelCard, ModelCardData

    from minirope.output.card import licence_of

    on_hub = not looks_local(args.model)
    quantized = args.format in ("gguf", "executorch")
    data = ModelCardData(
        library_name={"llama": "transformers", "onnx": "onnx", "executorch": "executorch"}.get(args.format),
        pipeline_tag="text-generation",
        license=licence_of(args.model, args.revision).id,
        tags=["minirope", "llama", args.format, *([args.outtype] if quantized else [])],
        base_model=args.model if on_hub else None,
        base_model_relation="quantized" if on_hub and quantized else None,
    )
    source = f"`{args.model}`" if on_hub else f"`{Path(args.model).name}`"
    load = {
        "gguf": f"from huggingface_hub import hf_hub_download\nfrom llama_cpp import Llama\n\n"
        f'llm = Llama(model_path=hf_hub_download("{args.push_to_hub}", "{path.name}"))\n'
        f'print(llm("ROMEO:\\n", max_tokens=64)["choices"][0]["text"])',
        "llama": f"from transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
        f'model = AutoModelForCausalLM.from_pretrained("{args.push_to_hub}")  # LlamaForCausalLM, no remote code\n'
        f'tokenizer = AutoTokenizer.from_pretrained("{args.push_to_hub}")',
    }.get(
        args.format,
        f'from huggingface_hub import snapshot_download\n\nfolder = snapshot_download("{args.push_to_hub}")',
    )
    body = (
        f"\n# {args.push_to_hub.split('/')[-1]}\n\nThe minirope model {source} exported by `minirope-export --format "
        f"{args.format} --outtype {args.outtype}` (weights {args.outtype}): a Llama-architecture decoder with Rotary "
        f"Position Embedding.\n\n```python\n{load}\n```\n"
    )
    return ModelCard(f"---\n{data.to_yaml()}\n---\n{body}")


def push_export(path: Path, args: ExportArguments) -> str:
    """Upload the export at `path` (a file, or a folder's files) and its card to `args.push_to_hub`, in one commit;
    returns the commit's URL.

    Raises:
        OSError: the upload failed (the export stays written at `path`).
    """
    from huggingface_hub import CommitOperationAdd, HfApi

    card = str(export_card(args, path)).encode()
    files = [path] if path.is_file() else sorted(item for item in path.rglob("*") if item.is_file())
    files = [item for item in files if not any(part.startswith(".") for part in item.relative_to(path.parent).parts)]
    root = path.parent if path.is_file() else path
    operations = [CommitOperationAdd(str(item.relative_to(root)), item) for item in files]
    operations = [op for op in operations if op.path_in_repo != "README.md"]
    operations.append(CommitOperationAdd("README.md", card))
    api = HfApi()
    try:
        repo = api.create_repo(args.push_to_hub, private=args.hub_private_repo, exist_ok=True).repo_id
        commit = api.create_commit(repo, operations, commit_message=f"minirope-export --format {args.format}")
    except Exception as error:  # HTTP and transport errors alike
        raise OSError(
            f"the export is written at {path}, but pushing it to {args.push_to_hub} failed ({error}): upload it with "
            f"`hf upload {args.push_to_hub} {path}`."
        ) from None
    return commit.commit_url


# llama.cpp repacks quantized weights into its AMX kernels where it was built with AMX (its system info shows
# `AMX_INT8 = 1`), and those kernels have segfaulted on Sapphire Rapids (ggml-org/llama.cpp#20824, open); f16 and f32
# weights do not take that path.
AMX_OUTTYPES = ("q8_0",)
AMX_NOTE = (
    "minirope-export: note: this CPU has AMX. A llama.cpp built with its AMX kernels (system info `AMX_INT8 = 1`) "
    "has crashed running q8_0 models on Sapphire Rapids (ggml-org/llama.cpp#20824). If yours does, export "
    "--outtype f16, or build llama-cpp-python without AMX: CFLAGS=-mno-amx-int8 CXXFLAGS=-mno-amx-int8 pip install "
    "--no-cache-dir --force-reinstall llama-cpp-python (as `make test` builds it)."
)


def cpu_has_amx() -> bool:
    """Whether the kernel reports the AMX int8 extension on this CPU (Linux `/proc/cpuinfo`; False elsewhere)."""
    try:
        return " amx_int8" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def main() -> None:
    run_cli("minirope-export", run)


if __name__ == "__main__":
    main()
