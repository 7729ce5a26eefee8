"""Tie a process's life to its parent's (Linux ``PR_SET_PDEATHSIG``), so no rank outlives its job."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import sys

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int) -> None:
    """Have the kernel send ``sig`` to this process when its parent dies (no-op off Linux).

    Called in a process that may be orphaned: a keeper whose ``mpiexec`` was killed, a
    rank whose keeper was. If the parent is already gone, the signal is sent now.
    """
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
    if os.getppid() != parent:  # orphaned before the call took effect
        os.kill(os.getpid(), sig)
