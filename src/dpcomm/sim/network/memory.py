"""How a process that prices large schedules asks for memory (``dpcomm netsim`` calls :func:`tune_memory`).

The flow model makes and drops arrays of hundreds of MB (a 4,096-server parameter server's step is 16.8 M
flows: 134 MB per int64 array). Two defaults make each such array cost its pages afresh: numpy advises the
kernel to back large arrays with huge pages (``madvise(MADV_HUGEPAGE)``), which the kernel zeroes and
compacts 2 MiB at a time, and glibc hands freed blocks of more than its mmap threshold (at most 32 MiB)
straight back to the kernel, so the next array of that size faults every page in again. Measured on the
2-core VM (``star:4096``, ps, 100 MB): 1.0-2.1 s of system time in the pricing with both defaults, 0.3-0.4 s
without them (the machine shared with other jobs: noisy). :func:`tune_memory` turns both off for the
process (glibc keeps freed blocks up to 1 GiB for reuse); it changes no result.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

import numpy as np

__all__ = ["tune_memory"]

_M_TRIM_THRESHOLD = -1  # glibc mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3
_KEEP = 1 << 30  # bytes: blocks up to this size come from, and go back to, the heap

log = logging.getLogger(__name__)


def tune_memory() -> bool:
    """Stop numpy's huge-page advice and let glibc reuse freed blocks up to 1 GiB (module docstring). Returns
    whether glibc took the setting (False on another C library; numpy's part holds anyway)."""
    setter = getattr(getattr(np, "_core", None), "multiarray", None)
    if setter is not None and hasattr(setter, "_set_madvise_hugepage"):
        setter._set_madvise_hugepage(False)
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        ok = bool(
            libc and libc.mallopt(_M_MMAP_THRESHOLD, _KEEP) and libc.mallopt(_M_TRIM_THRESHOLD, 2 * _KEEP)
        )
    except (OSError, AttributeError):
        ok = False
    if not ok:
        log.debug("mallopt not available: freed blocks go back to the system")
    return ok
