"""`minirope-export`: a trained folder as a plain Llama folder, a GGUF file for llama.cpp, an ONNX model, or an
ExecuTorch program.

    minirope-export --model runs/minirope-shakespeare --format llama --output exports/llama
    minirope-export --model runs/minirope-shakespeare --format gguf --output exports/model.gguf --outtype q8_0
    minirope-export --model runs/minirope-shakespeare --format onnx --output exports/onnx
    minirope-export --model runs/minirope-shakespeare --format executorch --output exports/executorch --outtype 8da8w

Each target is written next to its final path and moved there only once complete (`minirope.export`), so a failed
export leaves nothing half-written; an existing output is replaced only with `--overwrite`.
"""

import sys
from dataclasses import dataclass, field
from pathlib import Path

from transformers import HfArgumentParser

from minirope.commands import run_cli
from minirope.export import (
    EXECUTORCH_OUTTYPES,
    FORMATS,
    GGUF_OUTTYPES,
    export_executorch,
    export_gguf,
    export_llama,
    export_onnx,
)
from minirope.folders import check_output


@dataclass
class ExportArguments:
    model: str = field(metadata={"help": "A folder written by minirope (save_pretrained, with its tokenizer)."})
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
    overwrite: bool = field(default=False, metadata={"help": "Replace an existing output."})


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
    check_output(args.output, "--output", {"--model": args.model}, folder=args.format != "gguf")
    if args.format == "gguf":
        path = export_gguf(args.model, args.output, args.outtype, args.overwrite)
    elif args.format == "executorch":
        path = export_executorch(args.model, args.output, args.outtype, args.max_cache_len, args.overwrite)
    elif args.format == "onnx":
        path = export_onnx(args.model, args.output, args.overwrite)
    else:
        path = export_llama(args.model, args.output, args.overwrite)
    print(f"minirope-export: wrote {path}", file=sys.stderr)
    if args.format == "gguf" and args.outtype in AMX_OUTTYPES and cpu_has_amx():
        print(AMX_NOTE, file=sys.stderr)
    return path


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
