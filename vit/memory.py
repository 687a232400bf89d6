"""Memory that a training step frees, kept for the next step instead of handed back to the system.

PyTorch's CPU tensors come from the C library's `malloc`. glibc's serves a block larger than its
mmap threshold (128 KiB at first, rising to at most 32 MiB as blocks are freed) with a fresh
`mmap` and returns it to the system with `munmap` when it is freed; freed memory at the top of
its heap beyond the trim threshold goes back too. Every page of such memory is zeroed by the
kernel on its first touch: a minor page fault. A ViT's training step allocates and frees the same
activations every step, so on a 2-core CPU a bf16 step of the `cifar` model took 23,000-57,000
faults and 7-13% of its time doing so (benchmarks/profile_step.py; docs/speed.md).
`keep_freed_memory` sets both thresholds once for the process, so that blocks up to 32 MiB come
from the heap and freed memory stays in it: after the first step, a step takes no fault. The
price is that the process keeps its peak heap, which the next step would take again anyway.

Every command calls it at its start (`vit.commands.base.run_command`), as do the benchmarks;
DataLoader workers forked later inherit the setting. Other C libraries (macOS, musl) are left as
they are.
"""

from __future__ import annotations

import ctypes
import functools

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters, glibc's malloc.h
# glibc refuses an mmap threshold above half its largest heap (HEAP_MAX_SIZE / 2: 32 MiB on 64 bit)
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 1 << 30


@functools.cache
def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds for this process (once); False where the C library
    is not glibc or refuses."""
    try:  # the process's own symbols: the C library it runs on (find_library would start ldconfig)
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018 (glibc only: musl and macOS have no such function)
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
