"""The job's decisions between worlds, pure: when to start the next world, and what a closed world means for the job.

:func:`start_decision` is asked on every tick while no world runs; :func:`after_close`
once per closed world. Both read only their arguments (tested in tier 1,
``tests/tier1/test_elastic_machines.py``: transitions J1..J7 of :data:`TRANSITIONS`).
"""

from __future__ import annotations

import dataclasses

from ddl.launcher.elastic.membership import WorldPlan
from ddl.launcher.elastic.world import Ending

TRANSITIONS: dict[str, str] = {
    "J1": "enough ranks are ready (the first world: -np or every listed slot, never fewer than --min-np; later: "
          "--min-np, or no host still starting with at least --min-np ready): start the world",
    "J2": "the first world: --start-timeout passed, or nothing is starting and no discovery script may add "
          "hosts, with at least --min-np ranks ready: start with what is ready",
    "J3": "the first world: the same, with fewer than --min-np ready: the job fails",
    "J4": "a later world: fewer than --min-np ranks and no host still starting: the job fails",
    "J5": "otherwise wait (hosts are still starting or importing)",
    "J6": "a world closed done or with an error: the job's result",
    "J7": "a world closed for a next one (lost, reset): counted; past --reset-limit the job fails",
}


@dataclasses.dataclass(frozen=True)
class StartWorld:
    plan: WorldPlan


@dataclasses.dataclass(frozen=True)
class Wait:
    pass


@dataclasses.dataclass(frozen=True)
class Finish:
    """The job ends with ``status``; ``message`` (if any) is ddlrun's error line."""

    status: int
    message: str = ""


def start_decision(*, plan: WorldPlan, first: bool, np: int | None, max_np: int, min_np: int, listed_slots: int,
                   hosts_starting: bool, elapsed: float, start_timeout: float,
                   discovery: bool) -> StartWorld | Wait | Finish:
    """Whether to start ``plan`` (the world the ready hosts make) now.

    Args:
        first: no world has run yet.
        np: ``-np`` (the first world's size), if given.
        listed_slots: the slots of the eligible listed hosts.
        hosts_starting: some host's agent is still starting or importing.
        elapsed: seconds since the job started.
        discovery: hosts come from a discovery script (more may be listed later).
    """
    # Never below --min-np: with fewer slots listed than that, the first world waits for more
    # (J5) until --start-timeout, then the job fails (J3); it never runs a world too small.
    wanted = max(min_np, (np or min(max_np, listed_slots)) if first else min_np)
    if plan.np >= wanted or (plan.np >= min_np and not hosts_starting):  # J1
        return StartWorld(plan)
    if first and (elapsed > start_timeout or (not hosts_starting and not discovery)):
        if plan.np >= min_np:  # J2
            return StartWorld(plan)
        return Finish(1, f"only {plan} ready after {elapsed:.0f} s; --min-np {min_np} needs more: check the "  # J3
                         "hosts and their agents' output above")
    if not first and not hosts_starting:  # J4
        return Finish(1, f"{plan} left, but --min-np is {min_np}; ending the job (no more hosts are listed: add "
                         "hosts to the discovery script, or lower --min-np)")
    return Wait()  # J5


def after_close(ending: Ending, *, status: int, mpiexec_status: int | None, resets: int,
                reset_limit: int | None) -> tuple[int, Finish | None]:
    """The job after a world closed with ``ending``: (resets so far, how the job ends or None to go on).

    ``status`` is the error's (0 when mpiexec ended the rank), ``mpiexec_status`` the world's mpiexec's.
    """
    if ending is Ending.DONE:  # J6
        return resets, Finish(0)
    if ending is Ending.ERROR:
        return resets, Finish(status or mpiexec_status or 1)
    resets += 1  # J7
    if reset_limit is not None and resets > reset_limit:
        return resets, Finish(1, f"{resets} resets, more than --reset-limit {reset_limit}")
    return resets, None
