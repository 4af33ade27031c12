"""Running a CLI: expected failures become one clear line on stderr and a non-zero exit."""

import sys
from collections.abc import Callable

from minirope.training.trainer import NonFiniteLossError

EXPECTED_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError, OSError, NonFiniteLossError)


def run_cli(program: str, main: Callable[[], object]) -> None:
    """Run `main()`; on an expected error print `<program>: error: <message>` and exit with status 1."""
    try:
        main()
    except EXPECTED_ERRORS as error:
        message = " ".join(str(error).split())  # one line
        print(f"{program}: error: {message}", file=sys.stderr)
        sys.exit(1)
