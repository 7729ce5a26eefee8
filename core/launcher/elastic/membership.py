"""Which hosts an elastic job's next world runs on: what discovery lists, failed hosts, and the rank bounds.

Pure: :class:`Membership` is told what discovery lists (:mod:`~ddl.launcher.elastic.discovery`
runs the script) and which hosts failed, and plans
each world. A failed host is left out until discovery stops listing it and lists it
again (a scheduler replaced or repaired it) or, with a cooldown, until the cooldown has
passed (Horovod's blacklist, with its doubling cooldown). Hosts of the previous world
come first, in their order, so the survivors keep the lowest ranks (rank 0 stays on a
host that holds the last commit); new hosts follow in discovery's order; ranks are
allotted host by host up to ``max_np``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from ddl.launcher.hosts import HostSlots, format_host_list


@dataclasses.dataclass(frozen=True)
class WorldPlan:
    """The hosts of one world, each with the ranks it runs there (in rank order)."""

    hosts: tuple[HostSlots, ...]

    @property
    def np(self) -> int:
        return sum(h.slots for h in self.hosts)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(h.name for h in self.hosts)

    def host_of(self, rank: int) -> str:
        """The host that runs ``rank`` (mpiexec fills each host's slots in turn)."""
        for host in self.hosts:
            if rank < host.slots:
                return host.name
            rank -= host.slots
        raise IndexError(f"rank out of range for {format_host_list(self.hosts)}")

    def __str__(self) -> str:
        return f"{self.np} rank(s) on {format_host_list(self.hosts) or 'no host'}"


class Membership:
    """What discovery lists, what failed, and the plan of the next world.

    Args:
        max_np: the most ranks a world runs.
        cooldown: (first, longest) seconds a failed host stays out; None: until discovery
            lists it again after leaving it out.
    """

    def __init__(self, *, max_np: int, cooldown: tuple[float, float] | None = None) -> None:
        self.max_np = max_np
        self.cooldown = cooldown
        self.listed: tuple[HostSlots, ...] = ()
        self.failed: dict[str, float] = {}  # host -> when it may return (inf: when re-listed)
        self.failures: dict[str, int] = {}
        self._unlisted_since_failure: set[str] = set()
        #: Failed hosts the last :meth:`observe` saw leave the list (they return when listed again).
        self.left: list[str] = []

    def observe(self, hosts: Iterable[HostSlots], now: float) -> list[str]:
        """Take discovery's latest list; returns the failed hosts it lets back in."""
        self.listed = tuple(hosts)
        names = {h.name for h in self.listed}
        back = []
        self.left = []
        for host, until in list(self.failed.items()):
            if host not in names:
                if host not in self._unlisted_since_failure:
                    self.left.append(host)
                self._unlisted_since_failure.add(host)
            elif host in self._unlisted_since_failure or now >= until:
                back.append(host)
                del self.failed[host]
                self._unlisted_since_failure.discard(host)
        return back

    def fail(self, host: str, now: float) -> None:
        """Leave ``host`` out of the next worlds (see the class docstring for how it returns)."""
        count = self.failures[host] = self.failures.get(host, 0) + 1
        if self.cooldown is None:
            self.failed[host] = float("inf")
        else:
            first, longest = self.cooldown
            self.failed[host] = now + min(longest, first * 2 ** (count - 1))
        self._unlisted_since_failure.discard(host)

    def eligible(self) -> tuple[HostSlots, ...]:
        """Listed hosts that have not failed, in discovery's order."""
        return tuple(h for h in self.listed if h.name not in self.failed)

    def plan(self, *, ready: Iterable[str], previous: Sequence[str] = ()) -> WorldPlan:
        """The next world on the eligible hosts in ``ready``: ``previous`` first, up to ``max_np`` ranks."""
        ready = set(ready)
        usable = {h.name: h for h in self.eligible() if h.name in ready}
        order = [name for name in previous if name in usable]
        order += [name for name in usable if name not in order]
        hosts, left = [], self.max_np
        for name in order:
            take = min(usable[name].slots, left)
            if take <= 0:
                break
            hosts.append(HostSlots(name, take))
            left -= take
        return WorldPlan(tuple(hosts))
