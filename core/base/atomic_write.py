"""Writing a file whole or not at all: a temporary name beside it, renamed over it at the end.

A reader (another rank, the next world, a process started after a crash) sees the old
file or the new one, never a part: the new bytes go to a temporary file in the same
folder (a rename is atomic only within one file system), which replaces the target only
once the writer's block ends without an error, and is removed when it does not.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

#: How the finished temporary file takes the target's place: ``put(temporary, target)``.
Put = Callable[[Path, Path], Any]


def temporary_beside(path: str | Path) -> Path:
    """The default temporary name for writing ``path``: hidden, beside it, this process's own.

    Example:
        >>> temporary_beside("/run/ddl/state.bin").name.startswith(".state.bin.")
        True
    """
    p = Path(path)
    return p.with_name(f".{p.name}.{os.getpid()}")


@contextlib.contextmanager
def atomic_path(path: str | Path, *, temporary: str | Path | None = None, durable: bool = False,
                put: Put | None = None) -> Iterator[Path]:
    """A temporary path to create the new ``path`` at (for writers that take a path:
    a compiler, h5py); it becomes ``path`` when the block ends without an error.

    Args:
        path: the file to write.
        temporary: the temporary name (default :func:`temporary_beside`); the same folder.
        durable: sync the file before the rename and the folder after it, so the new
            file survives a power loss once this returns (a checkpoint's commit).
        put: what moves the finished file into place (default ``os.replace``).

    Raises:
        Whatever the block raised, after the temporary file is removed (the old file stays).

    Example:
        >>> import tempfile
        >>> target = Path(tempfile.mkdtemp()) / "out.bin"
        >>> with atomic_path(target) as tmp:
        ...     _ = tmp.write_bytes(b"whole")
        >>> target.read_bytes()
        b'whole'
    """
    target = Path(path)
    tmp = Path(temporary) if temporary is not None else temporary_beside(target)
    try:
        yield tmp
        if durable:
            _sync(tmp)
        (put or os.replace)(tmp, target)  # looked up now: a test may stand in for os.replace
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        sync_folder(target.parent)


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "wb", *, size: int | None = None,
                temporary: str | Path | None = None, durable: bool = False, put: Put | None = None) -> Iterator[IO[Any]]:
    """A file opened (``mode``: ``"wb"`` or ``"w"``) to write the new ``path`` through; it
    becomes ``path`` when the block ends without an error (see :func:`atomic_path`).

    Args:
        size: the file's size when known: its blocks are reserved first
            (``posix_fallocate``; writing a large file is faster than letting the file
            system allocate them as the pages arrive); a size that was not exact leaves
            no reserved tail.

    Example:
        >>> import tempfile
        >>> target = Path(tempfile.mkdtemp()) / "notes.txt"
        >>> with atomic_open(target, "w") as f:
        ...     _ = f.write("all of it")
        >>> target.read_text()
        'all of it'
    """
    if mode not in ("wb", "w"):
        raise ValueError(f"atomic_open writes a new file: mode 'wb' or 'w', not {mode!r}")
    with atomic_path(path, temporary=temporary, durable=durable, put=put) as tmp, open(tmp, mode) as f:
        if size:
            with contextlib.suppress(OSError):
                os.posix_fallocate(f.fileno(), 0, size)
        yield f
        if size:
            f.truncate(f.tell())


def write_atomically(path: str | Path, data: bytes | str, *, temporary: str | Path | None = None,
                     durable: bool = False) -> None:
    """Replace ``path`` with ``data`` (bytes, or text written as UTF-8) in one atomic step.

    Example:
        >>> import tempfile
        >>> target = Path(tempfile.mkdtemp()) / "calibration.json"
        >>> write_atomically(target, "{}")
        >>> target.read_text()
        '{}'
    """
    if isinstance(data, str):
        data = data.encode()
    with atomic_open(path, "wb", temporary=temporary, durable=durable) as f:
        f.write(data)


def sync_folder(folder: str | Path) -> None:
    """Sync a folder's entries (a rename in it) to disk, where the file system allows it."""
    with contextlib.suppress(OSError):  # some file systems cannot open or sync a folder: the rename is still atomic
        _sync(Path(folder))


def _sync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
