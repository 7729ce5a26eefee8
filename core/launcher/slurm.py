"""Hosts and slots of a Slurm allocation, from the ``SLURM_*`` variables ``ddl.base.config`` reads."""

from __future__ import annotations

import re

from ddl.base.config import JobEnv
from ddl.launcher.hosts import HostListError, HostSlots

_BRACKETS = re.compile(r"\[([^\]]*)\]")
_REPEAT = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


class SlurmError(HostListError):
    """A ``SLURM_*`` value ddlrun cannot read, or an allocation it cannot place ranks on."""


def expand_hostlist(text: str) -> list[str]:
    """Expand Slurm's compressed host list (``scontrol show hostnames`` does the same).

    Each comma-separated entry may hold bracketed ranges and lists; zero padding is kept,
    several bracket groups multiply out, and commas inside brackets do not split entries.

    Raises:
        SlurmError: unbalanced brackets or a malformed range.

    Example:
        >>> expand_hostlist("node[01-03,07],gpu5")
        ['node01', 'node02', 'node03', 'node07', 'gpu5']
    """
    hosts: list[str] = []
    for entry in _split_top_level(text):
        if entry:
            hosts += _expand_entry(entry, text)
    if not hosts:
        raise SlurmError(f"Slurm host list {text!r} names no host")
    return hosts


def expand_tasks_per_node(text: str) -> list[int]:
    """Expand ``SLURM_TASKS_PER_NODE`` (``2(x3),1`` is 2, 2, 2, 1).

    Raises:
        SlurmError: an entry is not ``N`` or ``N(xM)``.

    Example:
        >>> expand_tasks_per_node("2(x2),1")
        [2, 2, 1]
    """
    counts: list[int] = []
    for entry in text.split(","):
        found = _REPEAT.match(entry.strip())
        if not found:
            raise SlurmError(f"SLURM_TASKS_PER_NODE={text!r}: {entry!r} is not 'N' or 'N(xM)'")
        counts += [int(found.group(1))] * int(found.group(2) or 1)
    return counts


def allocation_hosts(job: JobEnv) -> tuple[HostSlots, ...]:
    """The allocation's hosts with their task counts as slots, in Slurm's node order.

    Returns:
        An empty tuple outside Slurm (no ``SLURM_JOB_ID``).

    Raises:
        SlurmError: the node list or task counts are missing, malformed, or disagree.

    Example:
        >>> allocation_hosts(JobEnv(slurm_job_id="7", slurm_nodelist="h[1-2]",
        ...                         slurm_tasks_per_node="2(x2)"))
        (HostSlots(name='h1', slots=2), HostSlots(name='h2', slots=2))
    """
    if not job.in_slurm:
        return ()
    if not job.slurm_nodelist:
        raise SlurmError(f"Slurm job {job.slurm_job_id} has no SLURM_JOB_NODELIST; give -H or --hostfile")
    if not job.slurm_tasks_per_node:
        raise SlurmError(
            f"Slurm job {job.slurm_job_id} has no SLURM_TASKS_PER_NODE (the allocation has no task "
            "count); allocate with -n or --ntasks-per-node, or give -np and -H"
        )
    names = expand_hostlist(job.slurm_nodelist)
    counts = expand_tasks_per_node(job.slurm_tasks_per_node)
    if len(counts) != len(names):
        raise SlurmError(
            f"SLURM_JOB_NODELIST={job.slurm_nodelist!r} names {len(names)} host(s) but "
            f"SLURM_TASKS_PER_NODE={job.slurm_tasks_per_node!r} gives {len(counts)} count(s); "
            "give -np and -H yourself"
        )
    return tuple(HostSlots(name, count) for name, count in zip(names, counts, strict=True) if count > 0)


def _split_top_level(text: str) -> list[str]:
    entries, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            raise SlurmError(f"Slurm host list {text!r} has unbalanced brackets")
        if char == "," and depth == 0:
            entries.append(text[start:i].strip())
            start = i + 1
    if depth:
        raise SlurmError(f"Slurm host list {text!r} has unbalanced brackets")
    entries.append(text[start:].strip())
    return entries


def _expand_entry(entry: str, text: str) -> list[str]:
    found = _BRACKETS.search(entry)
    if not found:
        return [entry]
    head, tail = entry[: found.start()], entry[found.end() :]
    expanded = []
    for value in _expand_ranges(found.group(1), text):
        expanded += _expand_entry(head + value + tail, text)
    return expanded


def _expand_ranges(inner: str, text: str) -> list[str]:
    values = []
    for part in inner.split(","):
        low, dash, high = part.strip().partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise SlurmError(f"Slurm host list {text!r}: [{inner}] holds {part!r}, not N or N-M")
        if not dash:
            values.append(low)
            continue
        if int(high) < int(low):
            raise SlurmError(f"Slurm host list {text!r}: range {part!r} runs backwards")
        width = len(low)  # Slurm keeps the zero padding of the range's start
        values += [str(n).zfill(width) for n in range(int(low), int(high) + 1)]
    return values
