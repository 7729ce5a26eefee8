"""A host's last committed elastic state, in one file on tmpfs, replaced atomically at each commit.

It outlives the training processes (a killed rank, a world that ``ddlrun`` ends to start
the next) and dies with the host (tmpfs): no durable checkpoint, nothing on a shared
filesystem. A write goes to a temporary file renamed over the last one, so a process
killed in the middle of a commit leaves the previous commit whole; the header's serial
and digest let the next world pick the newest whole commit among the survivors.
"""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

from ddl.base.atomic_write import atomic_open

MAGIC = b"DDLSTATE1\n"
_HEADER = struct.Struct("<QQ32s")  # serial, payload length, sha256 of the payload
STATE_FILE = "state.bin"


class CommitStore:
    """The committed state of one host, under ``folder``.

    Example:
        >>> import tempfile
        >>> store = CommitStore(tempfile.mkdtemp())
        >>> store.write(3, b"weights")
        >>> store.serial(), store.read()
        (3, (3, b'weights'))
    """

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.path = self.folder / STATE_FILE

    def write(self, serial: int, payload: bytes) -> None:
        """Replace the stored commit with ``payload`` as commit number ``serial``."""
        self.folder.mkdir(parents=True, exist_ok=True)
        header = _HEADER.pack(serial, len(payload), hashlib.sha256(payload).digest())
        with atomic_open(self.path) as f:  # tmpfs: nothing to sync
            f.write(MAGIC + header)
            f.write(payload)

    def serial(self) -> int:
        """The stored commit's number, or 0 when there is none (or it is damaged)."""
        found = self.read()
        return found[0] if found else 0

    def read(self) -> tuple[int, bytes] | None:
        """(serial, payload) of the stored commit, or None when there is none or it is damaged."""
        try:
            data = self.path.read_bytes()
        except OSError:
            return None
        start = len(MAGIC) + _HEADER.size
        if not data.startswith(MAGIC) or len(data) < start:
            return None
        serial, length, digest = _HEADER.unpack_from(data, len(MAGIC))
        payload = data[start:]
        if len(payload) != length or hashlib.sha256(payload).digest() != digest:
            return None
        return serial, payload
