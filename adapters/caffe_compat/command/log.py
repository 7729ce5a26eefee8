"""Caffe-style (glog) log lines on stderr for rank 0, and a progress bar when stderr is a terminal."""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import TextIO

_LEVEL = {logging.DEBUG: "I", logging.INFO: "I", logging.WARNING: "W", logging.ERROR: "E", logging.CRITICAL: "F"}


class GlogFormatter(logging.Formatter):
    """``I1203 06:14:27.123456  4242 solver.py] message``: the prefix Caffe log parsers expect."""

    def format(self, record: logging.LogRecord) -> str:
        t = time.localtime(record.created)
        us = int((record.created % 1) * 1e6)
        prefix = f"{_LEVEL.get(record.levelno, 'I')}{time.strftime('%m%d %H:%M:%S', t)}.{us:06d} {os.getpid():5d} {record.module}.py:{record.lineno}]"
        return f"{prefix} {record.getMessage()}"


class Progress:
    """A one-line bar redrawn on a terminal; log lines clear it first (see ``setup``)."""

    def __init__(self, stream: TextIO, total: int, start: int) -> None:
        self.stream, self.total, self.start, self.shown = stream, total, start, False
        self.t0 = time.perf_counter()

    def update(self, it: int) -> None:
        frac = it / self.total if self.total else 1.0
        done = int(30 * frac)
        rate = (it - self.start) / max(time.perf_counter() - self.t0, 1e-9)
        self.stream.write(f"\r[{'#' * done}{'.' * (30 - done)}] {it}/{self.total} {rate:.1f} it/s")
        self.stream.flush()
        self.shown = True

    def clear(self) -> None:
        if self.shown:
            self.stream.write("\r\033[K")
            self.shown = False


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    progress: Progress | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.progress is not None:
            self.progress.clear()
        super().emit(record)


_handler: _Handler | None = None


def setup(*, rank: int, stream: TextIO | None = None) -> None:
    """Log ``ddl.caffe`` messages at INFO on rank 0 (warnings and errors on every rank)."""
    global _handler
    logger = logging.getLogger("ddl.caffe")
    if _handler is not None:
        logger.removeHandler(_handler)
    _handler = _Handler(stream or sys.stderr)
    _handler.setFormatter(GlogFormatter())
    logger.addHandler(_handler)
    logger.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    logger.propagate = False


def progress(total: int, start: int) -> Progress | None:
    """A progress bar on stderr when it is a terminal and logging is set up, else None."""
    if _handler is None or not sys.stderr.isatty() or logging.getLogger("ddl.caffe").level > logging.INFO:
        return None
    _handler.progress = Progress(sys.stderr, total, start)
    return _handler.progress
