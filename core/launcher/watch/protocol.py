"""The messages a rank's keeper sends ``ddlrun``: one JSON object a line, versioned, typed here.

Output travels as text decoded with ``surrogateescape``, so any bytes a rank writes come
out on ``ddlrun``'s side exactly as written.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from ddl.base.notes import Note

VERSION = 1
STREAMS = ("stdout", "stderr")


class KeeperProtocolError(ValueError):
    """A line that is not a message of this version (another ddl's keeper, or garbage)."""


@dataclasses.dataclass(frozen=True)
class KeeperHello:
    """The first message: who the rank is. ``token`` must be the job's (from ``DDL_MONITOR``)."""

    rank: int
    host: str
    pid: int
    token: str
    version: int = VERSION


@dataclasses.dataclass(frozen=True)
class Output:
    """One line (without its end) the rank wrote on ``stream``."""

    rank: int
    stream: str
    text: str


@dataclasses.dataclass(frozen=True)
class Noted:
    """What ddl in the rank told its keeper (:mod:`ddl.base.notes`)."""

    rank: int
    note: Note


@dataclasses.dataclass(frozen=True)
class Ended:
    """The rank's process ended: by ``code``, or killed by ``signal``; its last stderr lines,
    the shared-memory files its keeper removed after it, and whether it was ``stopped``
    (its keeper had passed it a signal from outside: ddlrun ending the job, or the
    launcher killing the keeper's anchor) rather than ending by itself."""

    rank: int
    code: int | None
    signal: int | None
    last_words: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    stopped: bool = False

    @property
    def status(self) -> int:
        """The status a shell would show: the code, or 128 + the signal."""
        return 128 + self.signal if self.signal is not None else int(self.code or 0)


Message = KeeperHello | Output | Noted | Ended
_TYPES: dict[str, type] = {"hello": KeeperHello, "output": Output, "noted": Noted, "ended": Ended}
_NAMES = {cls: name for name, cls in _TYPES.items()}


def encode(message: Message) -> bytes:
    """One line of JSON for ``message``."""
    fields: dict[str, Any] = {"type": _NAMES[type(message)], "v": VERSION}
    for f in dataclasses.fields(message):
        value = getattr(message, f.name)
        if isinstance(value, Note):
            value = json.loads(value.encode())
        elif isinstance(value, tuple):
            value = list(value)
        fields[f.name] = value
    return (json.dumps(fields) + "\n").encode()


def decode(line: bytes) -> Message:
    """The message in one line.

    Raises:
        KeeperProtocolError: not JSON, another version, an unknown type or missing fields.
    """
    try:
        data = json.loads(line)
    except ValueError as exc:
        raise KeeperProtocolError(f"not a keeper message ({exc}): {line[:80]!r}") from None
    if not isinstance(data, dict) or data.get("v") != VERSION or data.get("type") not in _TYPES:
        raise KeeperProtocolError(f"not a keeper message of version {VERSION}: {line[:80]!r}")
    cls = _TYPES[data["type"]]
    try:
        kwargs = {f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data}
        if cls is Noted:
            kwargs["note"] = Note.decode(json.dumps(kwargs["note"]))
        for name in ("last_words", "removed"):
            if name in kwargs:
                kwargs[name] = tuple(str(x) for x in kwargs[name])
        message: Message = cls(**kwargs)
    except (KeyError, TypeError, ValueError) as exc:
        raise KeeperProtocolError(f"malformed {data['type']} message ({exc}): {line[:80]!r}") from None
    if isinstance(message, Output) and message.stream not in STREAMS:
        raise KeeperProtocolError(f"output on unknown stream {message.stream!r}")
    return message


def parse_monitor(text: str) -> tuple[str, int, str]:
    """``DDL_MONITOR``'s ``HOST:PORT/TOKEN`` as (host, port, token).

    Raises:
        ValueError: not of that form.

    Example:
        >>> parse_monitor("10.0.0.1:4242/ab12")
        ('10.0.0.1', 4242, 'ab12')
    """
    address, slash, token = text.partition("/")
    host, colon, port = address.rpartition(":")
    if not (slash and colon and host and port.isdigit() and token):
        raise ValueError(f"DDL_MONITOR={text!r} is not HOST:PORT/TOKEN (ddlrun sets it)")
    return host, int(port), token
