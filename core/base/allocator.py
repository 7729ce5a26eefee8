"""Keep the memory a training step frees in the process, instead of glibc handing it back every step.

A CPU training step allocates and frees the same large blocks every step: fresh
gradients (``zero_grad`` sets them to None), an optimizer's temporaries (AdamW's for-loop
builds several per weight), activations. glibc's malloc serves a block above its mmap
threshold (dynamic, at most 32 MiB) with a fresh mapping and unmaps it when freed, and
trims the heap's free top once it exceeds its trim threshold (twice the mmap threshold):
the next step then faults every page in again and the kernel zeroes it. Measured here
(numpy, one process, a fresh array and two temporaries a step): 8 MiB blocks took
6.7 ms a step against 1.7 ms kept, 64 MiB 33.9 against 18.4 ms; 4 emulated hosts training
the slow-links MLP with DiLoCo's inner AdamW computed 108-153 ms a step before training
and 82-92 ms after it, where the heap no longer trimmed (with the thresholds raised: 72-92 ms
from the start). PyTorch's own CPU tuning guide swaps the allocator (jemalloc, tcmalloc)
for this reason; ddl sets glibc's two thresholds instead, which needs no library.

:func:`keep_freed_memory` raises both thresholds with ``mallopt``. It changes how much
freed memory the process keeps (up to the trim threshold, per arena), not what it
allocates: a steady training loop's resident memory stays at its peak, as with those
allocators. ``ddl.init()`` calls it through :func:`policy` unless ``DDL_MALLOC=system``, or
the user already chose an allocator policy (:func:`ddl.base.config.allocator_choice`);
``ddl doctor`` prints what :func:`policy` would do, without doing it.

Example:
    >>> keep_freed_memory()  # doctest: +SKIP
    'glibc 2.36: trim threshold 1024 MiB, mmap threshold 256 MiB'
"""

from __future__ import annotations

import ctypes
import sys

__all__ = ["MMAP_BYTES", "TRIM_BYTES", "glibc_version", "keep_freed_memory", "policy"]

#: Free memory the top of a heap may hold before glibc returns it to the system.
TRIM_BYTES = 1 << 30
#: Blocks from this size on get their own mapping (unmapped, and so faulted again, each time).
MMAP_BYTES = 256 << 20
#: glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: The mmap threshold a glibc that caps it at HEAP_MAX_SIZE / 2 accepts (64-bit); tried where the larger
#: one is refused (glibc 2.36 here took 256 MiB: 128 MiB blocks freed and made again fault nothing).
_CAPPED_MMAP_LIMIT = 32 << 20


def policy(setting: str, chosen: str | None, *, apply: bool = True) -> str:
    """The allocator policy for ``DDL_MALLOC=setting`` where the user chose ``chosen``
    (:func:`ddl.base.config.allocator_choice`), as one line; ``apply``: set it in this
    process (else only say what would be set)."""
    if setting == "system":
        return "the C library's own (DDL_MALLOC=system)"
    if chosen:
        return f"left as the user chose ({chosen})"
    if not apply:
        version = glibc_version()
        return f"{_describe(version, TRIM_BYTES, MMAP_BYTES)} at ddl.init (DDL_MALLOC=keep)" if version \
            else "the C library's own (not glibc)"
    return keep_freed_memory() or "the C library's own (not glibc, or it refused the thresholds)"


def glibc_version() -> str | None:
    """This process's glibc version (``'2.36'``), or None where the C library is another."""
    libc = _glibc()
    return None if libc is None else _version(libc)


def _version(libc: ctypes.CDLL) -> str:
    version_of = libc.gnu_get_libc_version
    version_of.restype = ctypes.c_char_p
    return (version_of() or b"?").decode()


def _describe(version: str, trim_bytes: int, mmap_bytes: int) -> str:
    """One line of what is set (``mmap_bytes`` 0: glibc kept its own mmap threshold)."""
    mmap_text = f"mmap threshold {mmap_bytes >> 20} MiB" if mmap_bytes else "mmap threshold glibc's own"
    return f"glibc {version}: trim threshold {trim_bytes >> 20} MiB, {mmap_text}"


def _glibc() -> ctypes.CDLL | None:
    """The process's C library where it is glibc on Linux (it has ``mallopt`` and says its version)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - present in glibc only
        libc.mallopt  # noqa: B018
    except (OSError, AttributeError):  # not glibc
        return None
    return libc


def keep_freed_memory(trim_bytes: int = TRIM_BYTES, mmap_bytes: int = MMAP_BYTES) -> str | None:
    """Raise glibc's trim and mmap thresholds for this process; what was set, or None
    where the C library is not glibc (musl, macOS: their allocators work otherwise) or
    refused. Setting either threshold also ends glibc's dynamic adjustment of both."""
    libc = _glibc()
    if libc is None:
        return None
    mallopt = libc.mallopt
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    if not mallopt(_M_TRIM_THRESHOLD, trim_bytes):
        return None
    mmap_set = mmap_bytes if mallopt(_M_MMAP_THRESHOLD, mmap_bytes) else \
        (_CAPPED_MMAP_LIMIT if mallopt(_M_MMAP_THRESHOLD, min(mmap_bytes, _CAPPED_MMAP_LIMIT)) else 0)
    return _describe(_version(libc), trim_bytes, mmap_set)
