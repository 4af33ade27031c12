"""Start-up noise kept out of minirope's commands: importing transformers' models imports torchao (its quantizers do,
when torchao is installed), which logs lines about itself on every start, before a command's own first line.

Only a minirope command's process gets the filters (`command_process`): a program that imports minirope keeps its
loggers as it set them. They are installed while `import minirope` runs, since the package's import is what imports
torchao, and a command's own module is imported after its package."""

import logging
import sys
from pathlib import Path


class TorchaoStartupNoise(logging.Filter):
    """Drops the two kinds of lines transformers' import of torchao prints on every start (transformers'
    quantizers import it when installed): torchao's optional CUDA kernels that do not load on this machine, and
    torch's notice about torchao's enums registered with its pytree. They are about torchao, never about the user's
    model or run; any `-W`/`PYTHONWARNINGS` option (asking for warnings) keeps them."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        kernels = message.startswith("Failed to load ") and "torchao" in message
        return not (kernels or (message.startswith("<enum ") and "is an Enum subclass" in message))


def command_process(argv: list[str] | None = None) -> bool:
    """Whether this process runs one of minirope's commands: a `minirope-*` console script (directly, or under
    `torchrun`/`accelerate launch`, which run the same script) or `python -m minirope.commands.<name>`.

    Args:
        argv: the interpreter's own command line (`sys.orig_argv`, Python >= 3.10) by default.
    """
    argv = sys.orig_argv if argv is None else argv
    module = argv[argv.index("-m") + 1] if "-m" in argv[:-1] else ""
    scripts = [Path(arg).name for arg in argv[1:3] if not arg.startswith("-")]
    return module.startswith("minirope.commands.") or any(name.startswith("minirope-") for name in scripts)


def quiet_torchao_startup() -> None:
    """Filter `TorchaoStartupNoise` from the loggers that print it, in a command's process (`command_process`) where
    no `-W`/`PYTHONWARNINGS` option is set."""
    if command_process() and not sys.warnoptions:
        for name in ("torchao", "torch.utils._pytree"):
            logging.getLogger(name).addFilter(TorchaoStartupNoise())


quiet_torchao_startup()
