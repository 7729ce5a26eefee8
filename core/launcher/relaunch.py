"""How ddl's own tools start a job: one argv builder and one runner, used by every ``ddl`` command.

A benchmark or the conformance suite runs a module of its own on N ranks; it builds the
``ddlrun`` command line here (``-np``, hosts, settings flags from the settings table)
instead of by hand, so the flags stay the launcher's.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping, Sequence

from ddl.launcher.command import FLAGGED


def relaunch_argv(np: int, python_args: Sequence[str], *, hosts: str | None = None,
                  settings: Mapping[str, object] | None = None) -> list[str]:
    """The argv that runs this interpreter with ``python_args`` on ``np`` ranks under ``ddlrun``.

    Args:
        np: ranks.
        python_args: what every rank's interpreter runs (``["-m", "ddl_bench.torch_training", ...]``).
        hosts: ``-H`` host list (``h1:2,h2:2``), or None for this host.
        settings: settings table fields with a ddlrun flag -> value (None or False: unset).

    Raises:
        ValueError: a setting ``ddlrun`` has no flag for.

    Example:
        >>> relaunch_argv(2, ["-m", "ddl_bench.allreduce"], settings={"calibration": "off"})[3:7]
        ['-np', '2', '--calibration', 'off']
    """
    argv = [sys.executable, "-m", "ddl.launcher.cli", "-np", str(np)]
    if hosts:
        argv += ["-H", hosts]
    for field, value in (settings or {}).items():
        row = FLAGGED.get(field)
        if row is None or row.flag is None:
            raise ValueError(f"ddlrun has no flag for setting {field!r}; flagged settings: {sorted(FLAGGED)}")
        if value is None or value is False:
            continue
        argv += [row.flag] if value is True else [row.flag, str(value)]
    # The tools read their ranks' output (tables, JSON lines): it comes without rank tags.
    return [*argv, "--no-tag-output", sys.executable, *python_args]


def relaunch(np: int, python_args: Sequence[str], *, hosts: str | None = None,
             settings: Mapping[str, object] | None = None, capture: bool = False,
             timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    """Run :func:`relaunch_argv`'s job and wait for it (output captured when ``capture``)."""
    return subprocess.run(relaunch_argv(np, python_args, hosts=hosts, settings=settings), text=True,
                          capture_output=capture, timeout=timeout)


def parse_rank_counts(text: str, what: str = "-np") -> list[int]:
    """World sizes from ``"1,2,4"``.

    Raises:
        ValueError: not a comma-separated list of positive whole numbers.
    """
    try:
        counts = [int(r) for r in text.split(",") if r.strip()]
    except ValueError:
        counts = []
    if not counts or any(c < 1 for c in counts):
        raise ValueError(f"{what} takes world sizes as whole numbers, like 1,2,4; got {text!r}")
    return counts
