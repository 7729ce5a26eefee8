"""The settings of LocalSGD and DiLoCo's rounds, checked once for every framework.

Both adapters run the same schedule — an outer step every ``period`` inner steps, its
average applied ``overlap`` steps later (0: at once) — and refuse the same settings
with the same words; the rounds themselves are :mod:`ddl.engine.hooked`'s buckets.
"""

from __future__ import annotations

from typing import Any


def check_schedule(owner: str, period: Any, overlap: Any) -> None:
    """Raise ValueError unless ``period`` >= 1 and 0 <= ``overlap`` <= ``period`` are integers."""
    if not isinstance(period, int) or isinstance(period, bool) or period < 1:
        raise ValueError(f"{owner}: period must be an integer >= 1 (inner steps per outer step), got {period!r}")
    if not isinstance(overlap, int) or isinstance(overlap, bool) or not 0 <= overlap <= period:
        raise ValueError(f"{owner}: overlap must be an integer from 0 (wait for each average) to "
                         f"period={period} (apply it at the next outer step), got {overlap!r}")
