"""Host lists for ddlrun: ``-H h1:2,h2:2`` and hostfiles, parsed into hosts with slot counts."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path


class HostListError(ValueError):
    """A host list or hostfile is malformed; the message names the entry (file and line)."""


@dataclasses.dataclass(frozen=True)
class HostSlots:
    """One host and how many ranks it may run (its slots)."""

    name: str
    slots: int = 1

    def __str__(self) -> str:
        return f"{self.name}:{self.slots}"


def parse_host_list(text: str) -> tuple[HostSlots, ...]:
    """Parse ``-H``'s comma-separated ``host[:slots]`` list (a host without a count has 1 slot).

    A host named twice gets the sum of its slots, as in Open MPI.

    Raises:
        HostListError: an entry is empty, has a non-positive or non-numeric slot count, or
            the list names no host.

    Example:
        >>> parse_host_list("h1:2,h2")
        (HostSlots(name='h1', slots=2), HostSlots(name='h2', slots=1))
    """
    entries = [entry.strip() for entry in text.split(",")]
    if not any(entries):
        raise HostListError(f"host list {text!r} names no host; write e.g. -H host1:2,host2:2")
    hosts = []
    for entry in entries:
        if not entry:
            raise HostListError(f"host list {text!r} has an empty entry; separate hosts by single commas")
        hosts.append(_parse_host_colon(entry, where=f"host list {text!r}"))
    return _merge(hosts)


def parse_hostfile(text: str, *, source: str) -> tuple[HostSlots, ...]:
    """Parse a hostfile's text: one host a line as ``host``, ``host:2`` or ``host slots=2``.

    ``#`` starts a comment; blank lines are skipped; a host listed twice gets the sum of
    its slots.

    Args:
        text: the file's contents.
        source: the file's name, used in error messages.

    Raises:
        HostListError: a line is malformed (the message names ``source`` and the line
            number), or the file lists no host.

    Example:
        >>> parse_hostfile("a slots=2  # rack 1\\nb:3\\n", source="hosts.txt")
        (HostSlots(name='a', slots=2), HostSlots(name='b', slots=3))
    """
    hosts = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if line:
            hosts.append(_parse_hostfile_line(line, where=f"hostfile {source} line {number}"))
    if not hosts:
        raise HostListError(
            f"hostfile {source} lists no host; write one a line as 'host', 'host:2' or 'host slots=2'"
        )
    return _merge(hosts)


def read_hostfile(path: str | Path) -> tuple[HostSlots, ...]:
    """Read and parse the hostfile at ``path`` (see :func:`parse_hostfile`).

    Raises:
        HostListError: the file cannot be read or is malformed.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise HostListError(f"cannot read hostfile {str(path)!r} ({exc}); check the path given to --hostfile") from None
    return parse_hostfile(text, source=str(path))


def format_host_list(hosts: Iterable[HostSlots]) -> str:
    """The ``h1:2,h2:2`` form that both ``mpiexec -hosts`` (MPICH) and ``-H`` (Open MPI) take."""
    return ",".join(str(host) for host in hosts)


def total_slots(hosts: Iterable[HostSlots]) -> int:
    """The number of ranks the hosts can run together."""
    return sum(host.slots for host in hosts)


def ranks_per_host(hosts: Iterable[HostSlots], np: int) -> tuple[int, ...]:
    """How many of ``np`` ranks each host runs when ranks fill the hosts' slots in order.

    This is the placement of both MPICH and Open MPI by slot, for ``np <= total_slots``.

    Example:
        >>> ranks_per_host(parse_host_list("a:2,b:2"), 3)
        (2, 1)
    """
    counts = []
    left = np
    for host in hosts:
        take = min(host.slots, left)
        counts.append(take)
        left -= take
    return tuple(counts)


def _parse_host_colon(entry: str, *, where: str) -> HostSlots:
    name, colon, count = entry.rpartition(":")
    if not colon:
        return _host(entry, 1, where=where, entry=entry)
    return _host(name, _slots(count, where=where, entry=entry), where=where, entry=entry)


def _parse_hostfile_line(line: str, *, where: str) -> HostSlots:
    words = line.split()
    if len(words) == 1:
        return _parse_host_colon(words[0], where=where)
    if len(words) == 2 and words[1].startswith("slots="):
        count = words[1].removeprefix("slots=")
        return _host(words[0], _slots(count, where=where, entry=line), where=where, entry=line)
    raise HostListError(f"{where}: {line!r} is not 'host', 'host:SLOTS' or 'host slots=SLOTS'")


def _slots(count: str, *, where: str, entry: str) -> int:
    try:
        slots = int(count)
    except ValueError:
        raise HostListError(f"{where}: {entry!r} has slot count {count!r}; give a whole number >= 1") from None
    if slots < 1:
        raise HostListError(f"{where}: {entry!r} has slot count {slots}; give a whole number >= 1")
    return slots


def _host(name: str, slots: int, *, where: str, entry: str) -> HostSlots:
    if not name or any(c.isspace() or c in ",=" for c in name):
        raise HostListError(f"{where}: {entry!r} has no valid host name before the slot count")
    return HostSlots(name, slots)


def _merge(hosts: list[HostSlots]) -> tuple[HostSlots, ...]:
    slots: dict[str, int] = {}
    for host in hosts:
        slots[host.name] = slots.get(host.name, 0) + host.slots
    return tuple(HostSlots(name, count) for name, count in slots.items())
