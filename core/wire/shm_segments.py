"""The shared-memory segments a process maps from ``/dev/shm``, and removing the ones it left.

MPI libraries keep their intra-host buffers in named segments (MPICH's
``/dev/shm/mpich_shm_*``); a process that ends without ``MPI_Finalize`` (killed, aborted)
leaves them behind, and a container's 64 MB ``/dev/shm`` fills up after a few dozen such
jobs. Their names say nothing of the job, so they are found by what the process mapped
(``/proc/PID/maps``) while it ran, and removed only when the file at that path is still
the very one it mapped (same device and inode): never another job's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os

SHM_DIR = "/dev/shm/"


@dataclasses.dataclass(frozen=True, order=True)
class Segment:
    """One mapped file under ``/dev/shm``: its path, and the device and inode it had."""

    path: str
    device: int
    inode: int


def parse_maps(text: str) -> set[Segment]:
    """The ``/dev/shm`` files in a ``/proc/PID/maps`` text that still have their name.

    Example:
        >>> line = "7f00-7f10 rw-s 00000000 00:1a 42 /dev/shm/mpich_shm_ab_0\\n"
        >>> parse_maps(line) == {Segment("/dev/shm/mpich_shm_ab_0", os.makedev(0, 0x1a), 42)}
        True
        >>> parse_maps(line.replace("_0", "_0 (deleted)"))
        set()
    """
    found = set()
    for line in text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or not fields[5].startswith(SHM_DIR) or fields[5].endswith(" (deleted)"):
            continue
        major, _, minor = fields[3].partition(":")
        try:
            device, inode = os.makedev(int(major, 16), int(minor, 16)), int(fields[4])
        except ValueError:
            continue
        found.add(Segment(fields[5], device, inode))
    return found


def mapped_segments(pid: int) -> set[Segment]:
    """What process ``pid`` maps from ``/dev/shm`` now (empty once it is gone)."""
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as maps:
            return parse_maps(maps.read())
    except OSError:
        return set()


def in_use(segments: set[Segment]) -> set[Segment]:
    """Those of ``segments`` that some live process on this host maps now (a peer rank still
    running, which its MPI library unlinks itself when it finishes)."""
    wanted = {(s.device, s.inode): s for s in segments}
    used: set[Segment] = set()
    if not wanted:
        return used
    me = os.getpid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        for found in mapped_segments(int(entry.name)):
            hit = wanted.get((found.device, found.inode))
            if hit is not None:
                used.add(hit)
        if len(used) == len(wanted):
            break
    return used


def remove_left(segments: set[Segment]) -> list[str]:
    """Unlink each segment no live process maps whose path still names the file that was
    mapped; returns those removed.

    A segment another process still maps is left to it (its MPI library unlinks it at
    finalize; the last one to end without finalizing is cleaned up by its own keeper),
    and a path since reused by another job (another inode) is never touched.
    """
    removed = []
    for segment in sorted(segments - in_use(segments)):
        with contextlib.suppress(OSError):
            st = os.stat(segment.path, follow_symlinks=False)
            if st.st_ino == segment.inode and st.st_dev == segment.device:
                os.unlink(segment.path)
                removed.append(segment.path)
    return removed
