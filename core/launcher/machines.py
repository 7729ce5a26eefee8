"""Host entries that name one machine (``localhost:1,127.0.0.1:1``) become one host before any rank starts.

MPI's launchers place ranks by entry: two entries for one machine make two "nodes" that
cannot share memory, while their ranks' host names say they are one host, and every
ddl algorithm that uses shared memory then refuses the topology at ``init``. ddlrun
merges such entries (their slots add up), saying so. A name is this machine when one of
its addresses is a loopback address or can be bound here; two names are one machine
when they resolve to the same addresses.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import Callable

from ddl.launcher.hosts import HostSlots

THIS_MACHINE = "this machine"


def resolve(name: str) -> frozenset[str]:
    """Every address ``name`` resolves to (empty when it does not)."""
    try:
        return frozenset(str(info[4][0]) for info in socket.getaddrinfo(name, None))
    except (OSError, UnicodeError):
        return frozenset()


def is_local_address(address: str) -> bool:
    """A loopback address, or one of this machine's (binding a socket to it succeeds)."""
    try:
        parsed = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return False
    if parsed.is_loopback:
        return True
    family = socket.AF_INET6 if parsed.version == 6 else socket.AF_INET
    with contextlib.suppress(OSError), socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.bind((address, 0))
        return True
    return False


def machine_of(name: str, *, lookup: Callable[[str], frozenset[str]] = resolve,
               local: Callable[[str], bool] = is_local_address) -> str | frozenset[str]:
    """What identifies the machine ``name`` names: :data:`THIS_MACHINE`, its addresses, or the
    name itself when it does not resolve (then it is only ever equal to itself)."""
    addresses = lookup(name)
    if not addresses:
        return name
    if any(local(a) for a in addresses):
        return THIS_MACHINE
    return addresses


def merge_same_machines(hosts: tuple[HostSlots, ...], *,
                        machine: Callable[[str], str | frozenset[str]] = machine_of,
                        ) -> tuple[tuple[HostSlots, ...], list[str]]:
    """``hosts`` with the entries that name one machine merged into the first of them
    (slots added up), and a sentence for each merge.

    Example:
        >>> same = {"localhost": "me", "127.0.0.1": "me", "b": "b"}
        >>> merged, said = merge_same_machines((HostSlots("localhost", 1), HostSlots("127.0.0.1", 1),
        ...                                     HostSlots("b", 2)), machine=same.__getitem__)
        >>> merged
        (HostSlots(name='localhost', slots=2), HostSlots(name='b', slots=2))
    """
    if len(hosts) < 2:
        return hosts, []
    groups: dict[str | frozenset[str], list[HostSlots]] = {}
    for host in hosts:
        groups.setdefault(machine(host.name), []).append(host)
    if all(len(group) == 1 for group in groups.values()):
        return hosts, []
    merged, said = [], []
    for key, group in groups.items():
        first = group[0]
        merged.append(HostSlots(first.name, sum(h.slots for h in group)))
        if len(group) > 1:
            which = "this machine" if key == THIS_MACHINE else f"one machine ({', '.join(sorted(key))})"
            names = ", ".join(h.name for h in group)
            said.append(f"hosts {names} are {which}: running their {sum(h.slots for h in group)} slots as one "
                        f"host, {first.name} (two entries for one machine cannot share memory under MPI)")
    return tuple(merged), said
