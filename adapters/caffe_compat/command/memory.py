"""Keep freed memory for reuse, as Caffe keeps its blobs: large tensors then come back without page faults."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

log = logging.getLogger("ddl.caffe")
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
_done = False


def reuse_freed_memory() -> bool:
    """Ask glibc to serve every allocation from its heap and never hand freed memory back to the system.

    glibc gives large blocks (here AlexNet's 150 MB fc6 gradient, every iteration) fresh mmap'd pages
    that the kernel must fault in and zero: measured, that doubled AlexNet's training step at batch 1.
    Caffe allocates its diffs once and reuses them; this gets torch the same. The process keeps its
    peak memory instead of returning it. Returns False where it does not apply (not glibc).
    """
    global _done
    if _done:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, (1 << 31) - 1))
    except (OSError, AttributeError):
        return False
    _done = ok
    return ok
