"""Writing a file whole or not at all, at the speed of the page cache: a temporary name beside it with its blocks
reserved up front, then swapped in for the old file, whose removal happens off the writer's path."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import itertools
import os
import threading
from pathlib import Path
from typing import BinaryIO, cast

from ddl.base.atomic_write import atomic_open

RENAME_EXCHANGE = 2             # linux/fs.h: swap two existing names atomically
_AT_FDCWD = -100
_serial = itertools.count()


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap the files named ``a`` and ``b`` (Linux renameat2); False where the system cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    if ctypes.get_errno() in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()), str(b))


def swap_in(tmp: Path, path: Path) -> None:
    """Put ``tmp`` at ``path``. Over an existing file the two are exchanged and the old one, now at ``tmp``, is
    removed by a background thread: replacing a large file by rename makes the file system allocate the new file's
    blocks and free the old one's inside the call (0.2 s for a 528 MB .caffemodel on ext4)."""
    if path.exists() and _exchange(tmp, path):
        # Out of the way first (a rename to a free name costs nothing), so the next write may reuse ``tmp`` at once.
        old = tmp.with_name(f"{tmp.name}.old-{os.getpid()}-{next(_serial)}")
        tmp.rename(old)
        threading.Thread(target=old.unlink, kwargs={"missing_ok": True}, name="ddl-caffe-unlink").start()
    else:
        tmp.replace(path)


def replacing(path: str | Path, size: int | None = None) -> contextlib.AbstractContextManager[BinaryIO]:
    """A file to write ``path`` through; it appears there only once the block ends without an error (put in
    place by :func:`swap_in`).

    Args:
        path: the file to write.
        size: its size when known: the blocks are reserved first (``posix_fallocate``), which makes writing a
            large file 30% faster than letting the file system allocate them as the pages arrive.
    """
    return cast("contextlib.AbstractContextManager[BinaryIO]", atomic_open(path, "wb", size=size, put=swap_in))
