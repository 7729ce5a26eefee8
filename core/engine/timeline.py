"""Chrome-trace timeline of collectives (loads in Perfetto or chrome://tracing).

Rank 0 records, per tensor, its phases: queued -> fused (copy into the fusion
buffer) -> each algorithm phase (e.g. "reduce-scatter dim 0") -> done, with the fused
buffer's size and algorithm in the event args. Written as JSON at shutdown.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any


class Timeline:
    """Collects trace events in memory; :meth:`write` saves them."""

    def __init__(self, path: str | Path, *, rank: int = 0) -> None:
        self.path = Path(path)
        self.rank = rank
        self._events: list[dict[str, Any]] = []
        self._rows: dict[str, int] = {}             # a tensor's name -> its row (the trace's tid)
        self._lock = threading.Lock()

    def _row(self, name: str) -> int:
        if name not in self._rows:
            self._rows[name] = len(self._rows) + 1
            self._events.append({"name": "thread_name", "ph": "M", "pid": self.rank,
                                 "tid": self._rows[name], "args": {"name": name}})
        return self._rows[name]

    def _x(self, row: int, name: str, start: float, end: float, args: dict[str, Any] | None = None) -> None:
        event: dict[str, Any] = {"name": name, "ph": "X", "pid": self.rank, "tid": row,
                                 "ts": start * 1e6, "dur": max(0.0, end - start) * 1e6}
        if args:
            event["args"] = args
        self._events.append(event)

    def tensor(
        self, name: str, submitted: float, start: float, fused: float,
        phases: list[tuple[str, float, float]], end: float, info: dict[str, Any],
    ) -> None:
        """One allreduced tensor: queued, fused, each algorithm phase, done."""
        with self._lock:
            row = self._row(name)
            self._x(row, "queued", submitted, start)
            self._x(row, "fused", start, fused, info)
            for phase, a, b in phases:
                self._x(row, phase, a, b, {"algorithm": info.get("algorithm")})
            self._events.append({"name": "done", "ph": "i", "s": "t", "pid": self.rank, "tid": row, "ts": end * 1e6})

    def span(self, name: str, kind: str, submitted: float, start: float, end: float, info: dict[str, Any]) -> None:
        """A collective other than allreduce: queued, then ``kind``."""
        with self._lock:
            row = self._row(name)
            self._x(row, "queued", submitted, start)
            self._x(row, kind, start, end, info)

    def write(self) -> None:
        """Save the trace (``{"traceEvents": [...]}``)."""
        with self._lock:
            data = {"traceEvents": list(self._events), "displayTimeUnit": "ms"}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(data))
