"""A CPU run's freed heap handed back to the operating system while it trains (glibc's `malloc_trim`).

A LoRA step on a CPU allocates and frees thousands of temporaries between the blocks that live on (activations kept for
the backward, gradients, optimizer moments), and glibc's allocator grows its heap around them: on SmolLM2-135M with
LoRA on every linear layer, 0.64 GB of tensors held at the peak took a 1.9 GB heap, and the process's resident set grew
step after step (`benchmarks/lora_heap.py`). The freed pages in the middle of the heap stay resident until
`malloc_trim(0)` hands them back (`madvise(MADV_DONTNEED)`); calling it every second kept three such steps at 1.45 GB
resident instead of 2.86 GB in the same time, and `minirope-posttrain`'s LoRA GRPO on SmolLM2 at 2.5-2.65 GB instead of
3.8-3.9 (docs/studies/posttrain_speed.md names the machine). Where the C library is not glibc (macOS, musl) there is
nothing to call, and nothing is done.
"""

import contextlib
import ctypes
import os
import threading
from collections.abc import Callable, Iterator

from minirope.training.arguments import take_flags

# seconds; docs/studies/posttrain_speed.md: every 0.2 s held the same at 1.27x the time; every 3 s, more
TRIM_INTERVAL_S = 1.0
TRIM_VARIABLE = "MINIROPE_HEAP_TRIM_SECONDS"  # a machine's setting, as glibc's own MALLOC_TRIM_THRESHOLD_ is


def trim_interval(value: str | None = None) -> float:
    """Seconds between two trims of a CPU run's heap: `value`, else `$MINIROPE_HEAP_TRIM_SECONDS` (0: never), else
    `TRIM_INTERVAL_S`.

    Raises:
        ValueError: a value that is not a number >= 0.
    """
    value = os.environ.get(TRIM_VARIABLE, str(TRIM_INTERVAL_S)) if value is None else value
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise ValueError(f"{TRIM_VARIABLE}={value}: give a number of seconds >= 0 (0: never trim the heap).")
    return seconds


def moved_trim_flag(argv: list[str]) -> list[str]:
    """`argv` without the earlier `--heap_trim_seconds S`, whose value goes to `$MINIROPE_HEAP_TRIM_SECONDS`, saying
    so in one line.

    Raises:
        ValueError: a value that is not a number >= 0 (checked before it is set).
    """
    argv, taken = take_flags(argv, {"heap_trim_seconds"})
    if (value := taken.get("heap_trim_seconds")) is not None:
        trim_interval(value)
        os.environ[TRIM_VARIABLE] = value
        print(f"[minirope] --heap_trim_seconds is now the variable {TRIM_VARIABLE} (a machine's setting); the run "
              f"takes {TRIM_VARIABLE}={os.environ[TRIM_VARIABLE]}.")  # fmt: skip
    return argv


def malloc_trim() -> Callable[[int], int] | None:
    """glibc's `int malloc_trim(size_t pad)`, or None where the process's C library has no such function."""
    try:
        function = ctypes.CDLL(None).malloc_trim  # the symbols the process has loaded, its C library's among them
    except (OSError, AttributeError, TypeError):  # no such function (macOS, musl); no CDLL(None) (Windows)
        return None
    function.argtypes, function.restype = [ctypes.c_size_t], ctypes.c_int
    return function


@contextlib.contextmanager
def trimmed_heap(active: bool = True, interval_s: float = TRIM_INTERVAL_S) -> Iterator[bool]:
    """While the block runs, a daemon thread calls `malloc_trim(0)` every `interval_s` seconds (the call releases the
    GIL; it holds each malloc arena's lock while it walks it). Yields whether it does: False when not `active` (a run
    on a GPU, whose tensors are not on this heap) or without glibc.

    Source: glibc's manual, "Memory Allocation Tunables" and malloc_trim(3).
    """
    trim = malloc_trim() if active and interval_s > 0 else None
    if trim is None:
        yield False
        return
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval_s):
            trim(0)

    thread = threading.Thread(target=loop, name="minirope-malloc-trim", daemon=True)
    thread.start()
    try:
        yield True
    finally:
        stop.set()
        thread.join()


@contextlib.contextmanager
def trimmed_training(on_cpu: bool) -> Iterator[bool]:
    """`trimmed_heap` for a training command's run: on a CPU, every `trim_interval()` seconds, said in one line where
    it happens.

    Raises:
        ValueError: a `$MINIROPE_HEAP_TRIM_SECONDS` that is not a number >= 0.
    """
    interval_s = trim_interval()
    with trimmed_heap(active=on_cpu, interval_s=interval_s) as trimming:
        if trimming:
            print(f"[minirope] memory: the heap's freed pages handed back to the system every {interval_s:g} s "
                  f"(glibc's malloc_trim; {TRIM_VARIABLE}=0: never)")  # fmt: skip
        yield trimming
