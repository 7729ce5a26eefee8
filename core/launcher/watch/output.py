"""The ranks' output on ``ddlrun``'s terminal: whole lines, tagged with their rank, and optionally filed.

Each line a rank writes arrives whole from its keeper and is written whole here, so two
ranks' lines never run together. The tag is horovodrun's, ``[1]<stdout>:`` (Open MPI's
``--tag-output`` differs only by a job number); ``--no-tag-output`` drops it.
``--log-dir DIR`` also writes each rank's lines to ``DIR/rank.N/stdout`` and ``stderr``
(horovodrun's ``--output-filename`` layout; ``N`` zero-padded so the folders sort).
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import BinaryIO

#: The lines of hydra's report on a job it saw end badly; once ddlrun has ended the job
#: itself (and said why) they only repeat it, with advice that does not apply.
_HYDRA_BANNER = re.compile(
    r"^(=+\s*$|=\s+(BAD TERMINATION|PID \d+ RUNNING AT|EXIT CODE:|CLEANING UP REMAINING|YOU CAN IGNORE)|"
    r"YOUR APPLICATION TERMINATED WITH THE EXIT STRING|This typically refers to a problem with your application|"
    r"Please see the FAQ page for debugging suggestions)")


def hydra_banner(line: str) -> bool:
    """Whether ``line`` belongs to hydra's "BAD TERMINATION" report.

    Example:
        >>> hydra_banner("=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES"), hydra_banner("loss 0.3")
        (True, False)
    """
    return bool(_HYDRA_BANNER.match(line.strip() and line or "x"))


def tag(rank: int, stream: str) -> str:
    """The prefix of a rank's line.

    Example:
        >>> tag(1, "stdout")
        '[1]<stdout>:'
    """
    return f"[{rank}]<{stream}>:"


class OutputRouter:
    """Writes rank lines to ``stdout``/``stderr`` (tagged or not) and to ``log_dir``."""

    def __init__(self, *, np: int, tagged: bool, log_dir: Path | None, stdout: BinaryIO, stderr: BinaryIO) -> None:
        self.tagged = tagged
        self.log_dir = log_dir
        self.width = len(str(max(np - 1, 0)))
        self._terminal = {"stdout": stdout, "stderr": stderr}
        self._files: dict[tuple[int, str], BinaryIO] = {}

    def line(self, rank: int, stream: str, text: str) -> None:
        """One line (without its end) rank ``rank`` wrote on ``stream``."""
        data = text.encode("utf-8", "surrogateescape") + b"\n"
        out = self._terminal[stream]
        out.write(tag(rank, stream).encode() + data if self.tagged else data)
        if self.log_dir is not None:
            self._file(rank, stream).write(data)

    def launcher_line(self, stream: str, text: str, *, ended_by_ddlrun: bool) -> None:
        """A line from mpiexec itself (not from a rank): passed on as it is, except hydra's
        termination banner once ddlrun has ended the job and said why."""
        if ended_by_ddlrun and (not text.strip() or hydra_banner(text)):
            return
        self._terminal[stream].write(text.encode("utf-8", "surrogateescape") + b"\n")

    def flush(self) -> None:
        for out in (*self._terminal.values(), *self._files.values()):
            with contextlib.suppress(OSError, ValueError):
                out.flush()

    def close(self) -> None:
        self.flush()
        for f in self._files.values():
            f.close()
        self._files.clear()

    def _file(self, rank: int, stream: str) -> BinaryIO:
        found = self._files.get((rank, stream))
        if found is None:
            assert self.log_dir is not None
            folder = self.log_dir / f"rank.{rank:0{self.width}d}"
            folder.mkdir(parents=True, exist_ok=True)
            found = self._files[(rank, stream)] = open(folder / stream, "ab")  # noqa: SIM115 - kept open
        return found
