"""A CPU run's freed heap handed back to the system while it trains (`minirope.training.heap`), on glibc's allocator:
pages freed in the middle of the heap stay resident without it and leave with it."""

import ctypes
import os
import threading
import time

import pytest

from minirope.training.heap import malloc_trim, trimmed_heap

pytestmark = pytest.mark.skipif(malloc_trim() is None, reason="glibc's malloc_trim: Linux with glibc only")

BLOCK = 64 * 1024  # under glibc's smallest mmap threshold (128 KiB): served from the heap
BLOCKS = 1024  # 64 MiB


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.fixture
def libc():
    library = ctypes.CDLL(None)
    library.malloc.argtypes, library.malloc.restype = [ctypes.c_size_t], ctypes.c_void_p
    library.free.argtypes, library.free.restype = [ctypes.c_void_p], None
    library.memset.argtypes, library.memset.restype = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t], ctypes.c_void_p
    return library


def fragment(libc) -> list[int]:
    """64 MiB of touched blocks freed between blocks of their size that stay (so none of it is the heap's top, which
    free() trims itself, nor joins a freed neighbour); returns the blocks that stay, to free later."""
    blocks = []
    for _ in range(2 * BLOCKS):
        blocks.append(libc.malloc(BLOCK))
        libc.memset(blocks[-1], 1, BLOCK)
    for block in blocks[::2]:
        libc.free(block)
    return blocks[1::2]


def test_freed_pages_stay_resident_without_trimming_and_leave_with_it(libc):
    kept = fragment(libc)
    resident = resident_bytes()
    time.sleep(0.3)
    assert resident - resident_bytes() < BLOCKS * BLOCK / 4, "freed without trimming: glibc kept none resident"
    with trimmed_heap(interval_s=0.05) as trimming:
        time.sleep(0.3)
        assert trimming
        assert resident - resident_bytes() > BLOCKS * BLOCK * 3 / 4
    for block in kept:
        libc.free(block)


def test_the_trimming_thread_runs_only_inside_the_block_and_only_when_active():
    def trimming_threads() -> list[str]:
        return [thread.name for thread in threading.enumerate() if thread.name == "minirope-malloc-trim"]

    with trimmed_heap(active=False) as trimming:
        assert not trimming and not trimming_threads()
    with pytest.raises(RuntimeError, match="inside"), trimmed_heap(interval_s=0.01) as trimming:
        assert trimming and trimming_threads() == ["minirope-malloc-trim"]
        raise RuntimeError("inside")
    assert not trimming_threads()
