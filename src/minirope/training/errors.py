"""Errors of training that a command reports as one line (see `minirope.commands.run_cli`)."""


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite; raised before the optimizer step, so no update is applied."""
