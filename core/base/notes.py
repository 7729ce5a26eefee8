"""What a rank tells the keeper ``ddlrun`` started it under: how far it got and why it is leaving.

Under ``ddlrun`` every rank runs under a keeper process (:mod:`ddl.launcher.watch.keeper`)
that reports to ``ddlrun`` how the rank ended. What only the rank knows travels on a
pipe the keeper opened (``DDL_NOTES_FD``): that ``ddl.init`` began (a rank that exits
before it, while others wait in theirs, ends the job at once), that init finished, that
the rank is leaving (and after what), that shutdown completed, and which exception ended
it. One JSON object a line, each written whole; without a keeper every call is a no-op.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from typing import Any

from ddl.base.config import notes_fd

#: The kinds of note, in the order a rank normally sends them.
INIT, READY, LEAVING, DONE = "init", "ready", "leaving", "done"
#: An uncaught exception (``text``; ``blame``: the rank whose leaving caused it, if one did).
FAILING = "failing"
#: ddl ends the job itself (a stall, a failed cycle): the rank exits with ``code`` next.
ABORT = "abort"
KINDS = (INIT, READY, LEAVING, DONE, FAILING, ABORT)
#: Longest text carried (a note stays one atomic pipe write).
MAX_TEXT = 1500


@dataclasses.dataclass(frozen=True)
class Note:
    """One note. ``text``: a one-line summary; ``blame``: a rank; ``code``: an exit status."""

    kind: str
    text: str = ""
    blame: int | None = None
    code: int | None = None

    def encode(self) -> bytes:
        fields: dict[str, Any] = {"kind": self.kind}
        if self.text:
            fields["text"] = self.text[:MAX_TEXT]
        if self.blame is not None:
            fields["blame"] = self.blame
        if self.code is not None:
            fields["code"] = self.code
        return (json.dumps(fields) + "\n").encode()

    @classmethod
    def decode(cls, line: bytes | str) -> Note:
        """Raises ValueError: not a note (the keeper then ignores the line)."""
        data = json.loads(line)
        if not isinstance(data, dict) or data.get("kind") not in KINDS:
            raise ValueError(f"not a ddl note: {line!r}")
        blame, code = data.get("blame"), data.get("code")
        return cls(str(data["kind"]), str(data.get("text", "")), blame if isinstance(blame, int) else None,
                   code if isinstance(code, int) else None)


_lock = threading.Lock()
_fd: int | None = None  # None: not looked up yet; 0: no keeper (or it went away)


def _channel() -> int:
    global _fd
    if _fd is None:
        fd = notes_fd()
        if fd:
            try:
                os.fstat(fd)
                os.set_inheritable(fd, False)  # programs this rank starts must not report as it
            except OSError:
                fd = 0
        _fd = fd
    return _fd


def active() -> bool:
    """Whether a keeper watches this rank (``ddlrun`` started it)."""
    return bool(_channel())


def send(kind: str, text: str = "", *, blame: int | None = None, code: int | None = None) -> None:
    """Tell the keeper (nothing happens without one, or once it is gone)."""
    global _fd
    fd = _channel()
    if not fd:
        return
    data = Note(kind, text, blame, code).encode()
    with _lock:
        try:
            os.write(fd, data)
        except OSError:  # the keeper is gone: nobody to tell
            _fd = 0
