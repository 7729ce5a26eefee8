"""Run the real engine and public collectives on N fake ranks (threads) in one process.

Each rank gets its own :class:`~ddl.engine.context.Context`, :class:`~ddl.engine.engine.Engine` (with
its background thread) and :class:`~ddl.engine.collectives.Collectives` over a
:class:`~ddl.testing.FakeComm`, so negotiation, matching, fusion, refusals and shutdown
are exercised exactly as under ``mpiexec``, in plain pytest.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from typing import TypeVar

from ddl.base.config import Config
from ddl.base.topology import build_topology
from ddl.engine.collectives import Collectives
from ddl.engine.context import Context
from ddl.engine.engine import Engine
from ddl.testing.fake_comm import FakeAbort, FakeComm, run_ranks

T = TypeVar("T")


def run_engines(
    size: int, fn: Callable[[Collectives], T], *, hostnames: Sequence[str] | None = None,
    spec: str | None = None, config: Config | None = None, stop: bool = True, persistent: bool = True,
    shared_records: bool = False,
) -> list[T]:
    """Run ``fn(collectives)`` on ``size`` fake ranks; return the results by rank.

    ``config`` defaults to tiny segments (to force chunking) and a 10 s stall timeout.
    When ``fn`` raises on a rank, that rank aborts the fake job (as the abort hook does
    under MPI), so the others end too; the first error is re-raised here. ``persistent``:
    whether the fake library offers prepared collectives (see :func:`run_ranks`);
    ``shared_records``: the engine's records sized as one memory node's (``Comm.shared_negotiation``).

    Example:
        >>> import numpy as np
        >>> run_engines(2, lambda c: float(c.allreduce(np.ones(1), op="sum")[0]))
        [2.0, 2.0]
    """
    names = list(hostnames or ["solo"] * size)
    cfg = config or Config(segment_bytes=64, stall_timeout=10.0)

    def body(comm: FakeComm) -> T:
        comm.shared_negotiation = shared_records
        topo = build_topology(comm.rank, names, spec)
        ctx = Context(comm, topo, dataclasses.replace(cfg))
        ctx.hostnames = tuple(names)
        engine = Engine(ctx, fusion_threshold=cfg.fusion_threshold, stall_timeout=cfg.stall_timeout,
                        cycle_time=cfg.cycle_time)
        try:
            result = fn(Collectives(engine))
        except BaseException:
            with contextlib.suppress(FakeAbort):
                comm.abort(1)
            raise
        if stop:
            engine.stop()
        return result

    return run_ranks(size, body, hostnames=names, persistent=persistent)
