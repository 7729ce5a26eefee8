"""``ddlrun --elastic``'s flags (Horovod's names where Horovod has the flag) and what they ask for."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from typing import Any

from ddl.launcher.elastic.timing import Timing
from ddl.launcher.hosts import HostSlots


@dataclasses.dataclass(frozen=True, kw_only=True)
class ElasticOptions:
    """What ``ddlrun --elastic`` was asked for (see ``ddlrun --help``)."""

    command: tuple[str, ...]
    min_np: int
    max_np: int
    np: int | None = None
    hosts: tuple[HostSlots, ...] = ()
    discovery_script: str | None = None
    slots: int = 1
    settings: Mapping[str, object] = dataclasses.field(default_factory=dict)
    verbose: bool = False
    timing: Timing = Timing()
    cooldown: tuple[float, float] | None = None
    reset_limit: int | None = None
    cold_start: bool = False
    discovery_interval: float = 1.0
    discovery_timeout: float = 60.0
    store_root: str = "/dev/shm"


def check_bounds(np: int | None, min_np: int | None, max_np: int | None, slots_known: int | None,
                 ) -> tuple[int, int]:
    """(min_np, max_np) from the flags: defaults from ``-np`` (or 1 and the known slots).

    Raises:
        ValueError: a bound below 1, ``min > max``, or ``-np`` outside them.

    Example:
        >>> check_bounds(3, 2, None, None)
        (2, 3)
    """
    low = min_np if min_np is not None else (np or 1)
    high = max_np if max_np is not None else (np or slots_known or math.inf)
    if high == math.inf:
        raise ValueError("--elastic needs an upper bound: give --max-np N (or -np N)")
    high = int(high)
    if low < 1 or high < 1:
        raise ValueError(f"--min-np {low} / --max-np {high}: give whole numbers >= 1")
    if low > high:
        raise ValueError(f"--min-np {low} is more than --max-np {high}; give min <= max")
    if np is not None and not low <= np <= high:
        raise ValueError(f"-np {np} is outside --min-np {low} .. --max-np {high}")
    return low, high



def add_arguments(parser: Any) -> None:
    """``ddlrun``'s elastic flags (Horovod's names where Horovod has the flag)."""
    group = parser.add_argument_group("elastic training (a lost host does not end the job; see docs/guides/elastic.md)")
    group.add_argument("--elastic", action="store_true",
                       help="keep training when hosts are lost or added (needs the state objects of ddl.*.elastic)")
    group.add_argument("--min-np", type=int, metavar="N", help="fewest ranks to go on with (default: -np, or 1)")
    group.add_argument("--max-np", type=int, metavar="N", help="most ranks (default: -np, or all slots)")
    group.add_argument("--host-discovery-script", metavar="FILE",
                       help="executable that prints the available hosts, 'host:slots' a line; re-run every second")
    group.add_argument("--discovery-timeout", type=float, metavar="SECONDS", default=None,
                       help="a discovery run still going after this long is killed and counts as failed; the job "
                            "keeps the last list meanwhile (default 60)")
    group.add_argument("--slots", type=int, metavar="N", default=None,
                       help="slots of a host the discovery script lists without a count (default 1)")
    group.add_argument("--start-timeout", type=float, metavar="SECONDS", default=None,
                       help="longest wait for hosts and for a world's ranks to start (default 120)")
    group.add_argument("--elastic-timeout", type=float, metavar="SECONDS", default=None,
                       help="sets the heartbeat: agents beat every SECONDS/20, a host that misses 6 beats in a row "
                            "is lost (1.5 s at the default 5), a rank silent for twice that is frozen, an agent "
                            "that hears nothing from ddlrun for SECONDS ends its ranks")
    group.add_argument("--blacklist-cooldown-range", type=float, nargs=2, metavar=("MIN", "MAX"), default=None,
                       help="a failed host may return after MIN seconds, doubling per failure up to MAX "
                            "(default: only when the discovery script lists it again)")
    group.add_argument("--cold-start", action="store_true", default=None,
                       help="start each rank of each world with exec, not as a fork of its host agent's "
                            "pre-imported interpreter (for programs that must not fork; recovery then pays "
                            "the imports again)")
    group.add_argument("--reset-limit", type=int, metavar="N", default=None,
                       help="end the job after this many changes of hosts (default: no limit)")


ELASTIC_ONLY = ("min_np", "max_np", "host_discovery_script", "discovery_timeout", "slots", "start_timeout",
                "elastic_timeout",
                "blacklist_cooldown_range", "reset_limit", "cold_start")


def options_from_args(args: Any, *, command: tuple[str, ...], hosts: tuple[HostSlots, ...],
                      settings: Mapping[str, object]) -> ElasticOptions:
    """:class:`ElasticOptions` from ddlrun's parsed flags.

    Raises:
        ValueError: inconsistent bounds, ``--topology`` (its dims cannot follow the world's
            size), a discovery script with ``-H``/``--hostfile``, a timeout out of range
            (an explicit ``--start-timeout 0`` included: it is refused, not replaced), or no command.
    """
    if not command:
        raise ValueError("no COMMAND given; put the program after the options, e.g. ddlrun --elastic "
                         "--min-np 2 --max-np 4 -H h1,h2,h3,h4 python train.py")
    if settings.get("topology"):
        raise ValueError("--topology fixes the world's dims, but an elastic world changes size; leave it out "
                         "(each world finds its dims from its hosts)")
    script = args.host_discovery_script
    if script and hosts:
        raise ValueError("give the hosts by --host-discovery-script or by -H/--hostfile/Slurm, not both")
    if script and not os.access(script, os.X_OK):
        raise ValueError(f"--host-discovery-script {script!r} is not an executable file; chmod +x it")
    slots = args.slots or 1
    known = sum(h.slots for h in hosts) if hosts else None
    min_np, max_np = check_bounds(args.np, args.min_np, args.max_np, known)
    if args.discovery_timeout is not None and not args.discovery_timeout > 0:
        raise ValueError(f"--discovery-timeout {args.discovery_timeout:g}: give the longest a discovery run may "
                         "take, in seconds > 0 (default 60)")
    if args.discovery_timeout is not None and not script:
        raise ValueError("--discovery-timeout applies to --host-discovery-script; give one, or leave it out")
    cooldown = tuple(args.blacklist_cooldown_range) if args.blacklist_cooldown_range else None
    if cooldown is not None and not 0 <= cooldown[0] <= cooldown[1]:
        raise ValueError(f"--blacklist-cooldown-range {cooldown[0]:g} {cooldown[1]:g}: give 0 <= MIN <= MAX")
    return ElasticOptions(
        command=command, min_np=min_np, max_np=max_np, np=args.np, hosts=hosts, discovery_script=script,
        slots=slots, settings=dict(settings), verbose=bool(args.verbose),
        timing=Timing(**{name: float(value) for name, value in (("start_timeout", args.start_timeout),
                                                                 ("elastic_timeout", args.elastic_timeout))
                         if value is not None}),
        cooldown=(float(cooldown[0]), float(cooldown[1])) if cooldown else None, reset_limit=args.reset_limit,
        cold_start=bool(args.cold_start),
        discovery_timeout=60.0 if args.discovery_timeout is None else float(args.discovery_timeout),
        store_root="/dev/shm" if os.path.isdir("/dev/shm") else "/tmp",
    )
