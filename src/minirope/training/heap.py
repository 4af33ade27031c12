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
import threading
from collections.abc import Callable, Iterator

# seconds; docs/studies/posttrain_speed.md: every 0.2 s held the same at 1.27x the time; every 3 s, more
TRIM_INTERVAL_S = 1.0
HEAP_TRIM_HELP = (  # --heap_trim_seconds of minirope-posttrain and minirope-finetune
    "On a CPU with glibc: hand the heap's freed pages back to the system every this many seconds (malloc_trim), "
    "which holds a LoRA run near its tensors' memory (docs/studies/posttrain_speed.md: SmolLM2's LoRA GRPO "
    "2.50-2.65 GB instead of 3.78-3.86, in about the same time); 0: never."
)


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
def trimmed_training(on_cpu: bool, interval_s: float) -> Iterator[bool]:
    """`trimmed_heap` for a training command's run: on a CPU, every `interval_s` seconds (its `--heap_trim_seconds`;
    0: never), said in one line where it happens."""
    with trimmed_heap(active=on_cpu, interval_s=interval_s) as trimming:
        if trimming:
            print(f"[minirope] memory: the heap's freed pages handed back to the system every {interval_s:g} s "
                  "(glibc's malloc_trim; --heap_trim_seconds 0: never)")  # fmt: skip
        yield trimming
