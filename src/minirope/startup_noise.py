"""Start-up noise kept out of minirope's output: importing transformers' models imports torchao (its quantizers do,
when torchao is installed), which logs lines about itself on every start, before a command's own first line."""

import logging
import sys


class TorchaoStartupNoise(logging.Filter):
    """Drops the two kinds of lines transformers' import of torchao prints on every start (transformers'
    quantizers import it when installed): torchao's optional CUDA kernels that do not load on this machine, and
    torch's notice about torchao's enums registered with its pytree. They are about torchao, never about the user's
    model or run; any `-W`/`PYTHONWARNINGS` option (asking for warnings) keeps them."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        kernels = message.startswith("Failed to load ") and "torchao" in message
        return not (kernels or (message.startswith("<enum ") and "is an Enum subclass" in message))


def quiet_torchao_startup() -> None:
    """Filter `TorchaoStartupNoise` from the loggers that print it, unless any `-W`/`PYTHONWARNINGS` option is set."""
    if not sys.warnoptions:
        for name in ("torchao", "torch.utils._pytree"):
            logging.getLogger(name).addFilter(TorchaoStartupNoise())


quiet_torchao_startup()
