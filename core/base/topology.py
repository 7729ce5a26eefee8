"""The job's topology: ranks, hosts, and DDL's multi-ring dims (innermost first).

``"4x16"`` means 4 ranks per host x 16 hosts; ``"4x8x2"`` 4 per host x 8 hosts per
rack x 2 racks. A rank's coordinates come from its position in *topology order*
(ranks sorted by host, then by local rank), written in mixed radix with dim 0 varying
fastest, so the ranks that share dim-0 rings share a host whenever the dims allow.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re

from ddl.base.errors import TopologyError

# IBM DDL's -mode letters: one per dimension (or one for all) before the dims.
_MODE_LETTERS = {"r": "ring", "p": "auto"}
_SPEC = re.compile(r"^(?:(?P<mode>[A-Za-z]+):)?(?P<dims>\d+(?:[xX]\d+)*)$")


@dataclasses.dataclass(frozen=True)
class TopologySpec:
    """A parsed spec: dims innermost first, and DDL mode letters if given."""

    dims: tuple[int, ...]
    mode: str | None = None

    @property
    def size(self) -> int:
        return math.prod(self.dims)

    def __str__(self) -> str:
        body = "x".join(str(d) for d in self.dims)
        return f"{self.mode}:{body}" if self.mode else body


def parse_spec(spec: str) -> TopologySpec:
    """Parse ``"4x16"``, ``"4x8x2"`` or DDL's mode form ``"r:4x16"``.

    Raises:
        TopologyError: the spec is malformed, holds a zero, or uses an unknown mode.

    Example:
        >>> parse_spec("r:4x16").dims
        (4, 16)
    """
    text = spec.strip().replace(" ", "")
    match = _SPEC.match(text)
    if not match:
        raise TopologyError(
            f"topology spec {spec!r} is malformed; write dims innermost first, e.g. "
            "'4x16' (4 ranks per host x 16 hosts) or DDL's mode form 'r:4x16'"
        )
    dims = tuple(int(d) for d in re.split("[xX]", match["dims"]))
    if any(d == 0 for d in dims):
        raise TopologyError(f"topology spec {spec!r} has a zero dimension; every dim must be >= 1")
    mode = match["mode"]
    if mode is not None:
        mode = mode.lower()
        if len(mode) not in (1, len(dims)) or any(c not in _MODE_LETTERS for c in mode):
            known = ", ".join(f"'{k}' ({v})" for k, v in _MODE_LETTERS.items())
            raise TopologyError(
                f"topology spec {spec!r}: mode {mode!r} must be one letter, or one per "
                f"dimension ({len(dims)}), from {known}"
            )
    return TopologySpec(dims, mode)


def check_spec_size(spec: TopologySpec, world_size: int, *, source: str = "topology") -> None:
    """Raise :class:`TopologyError` unless the spec's product is the world size."""
    if spec.size != world_size:
        raise TopologyError(
            f"{source} {str(spec)!r} has product {spec.size} but the world size is "
            f"{world_size}; give dims whose product is {world_size} (e.g. '{world_size}')"
        )


@dataclasses.dataclass(frozen=True)
class Topology:
    """Where every rank sits: host grouping and multi-ring coordinates.

    Attributes:
        rank, size: this process and the world.
        hosts: host index of every world rank (hosts numbered by first appearance).
        dims: multi-ring dims, innermost first; their product is ``size``.
        order: world ranks in topology order (by host, then local rank).
        mode: DDL mode letters from the spec, if any.
    """

    rank: int
    size: int
    hosts: tuple[int, ...]
    dims: tuple[int, ...]
    order: tuple[int, ...]
    mode: str | None = None

    def __post_init__(self) -> None:
        check_spec_size(TopologySpec(self.dims), self.size)
        if sorted(self.order) != list(range(self.size)) or len(self.hosts) != self.size:
            raise ValueError("topology order must be a permutation of the world ranks")
        object.__setattr__(self, "_index", {r: i for i, r in enumerate(self.order)})

    # -- host view ---------------------------------------------------------------
    @property
    def local_rank(self) -> int:
        return self.local_rank_of(self.rank)

    @property
    def local_size(self) -> int:
        return self.hosts.count(self.hosts[self.rank])

    @property
    def cross_rank(self) -> int:
        return self.hosts[self.rank]

    @property
    def cross_size(self) -> int:
        return len(set(self.hosts))

    def local_rank_of(self, rank: int) -> int:
        return self.hosts[:rank].count(self.hosts[rank])

    # -- multi-ring view ---------------------------------------------------------
    def index_of(self, rank: int) -> int:
        """Position of ``rank`` in topology order."""
        return self._index[rank]  # type: ignore[attr-defined,no-any-return]

    def coords(self, rank: int | None = None) -> tuple[int, ...]:
        """Mixed-radix coordinates of ``rank`` (default: this rank), dim 0 first."""
        index = self.index_of(self.rank if rank is None else rank)
        out = []
        for d in self.dims:
            out.append(index % d)
            index //= d
        return tuple(out)

    def rank_at(self, coords: tuple[int, ...]) -> int:
        """The world rank at ``coords``."""
        index, stride = 0, 1
        for c, d in zip(coords, self.dims, strict=True):
            index += c * stride
            stride *= d
        return self.order[index]

    def ring(self, dim: int, rank: int | None = None) -> list[int]:
        """World ranks along ``dim`` through ``rank``, ordered by that coordinate."""
        base = list(self.coords(rank))
        members = []
        for c in range(self.dims[dim]):
            base[dim] = c
            members.append(self.rank_at(tuple(base)))
        return members

    @functools.cached_property
    def split_dim0_ring(self) -> tuple[int, ...] | None:
        """The first dim-0 ring whose ranks are on more than one host, or None (computed once)."""
        d0 = self.dims[0]
        for start in range(0, self.size, d0):
            members = self.order[start : start + d0]  # dim 0 varies fastest in topology order
            if len({self.hosts[r] for r in members}) > 1:
                return members
        return None

    def link_dim(self, a: int, b: int) -> int:
        """The outermost dimension in which ranks ``a`` and ``b`` differ (their link)."""
        ca, cb = self.coords(a), self.coords(b)
        return max((i for i in range(len(self.dims)) if ca[i] != cb[i]), default=0)

    def flat(self) -> Topology:
        """The same ranks as one ring of ``size`` (topology order kept)."""
        return dataclasses.replace(self, dims=(self.size,), mode=None)

    def __str__(self) -> str:
        return "x".join(str(d) for d in self.dims)


def discover_dims(hosts: tuple[int, ...]) -> tuple[int, ...]:
    """Dims from host placement: ``local x hosts`` when every host has as many ranks."""
    counts = [hosts.count(h) for h in sorted(set(hosts))]
    if len(counts) > 1 and len(set(counts)) == 1 and counts[0] > 1:
        return (counts[0], len(counts))
    return (len(hosts),)


def host_keys(hosts: list[tuple[str, int]]) -> list[str]:
    """The names that group ranks into hosts, from each rank's (host name, MPI node).

    A host name whose ranks sit on several MPI nodes (two launcher entries for one machine,
    whose ranks cannot share memory) becomes one host per node, ``name#node``; otherwise
    the name stays as it is.

    Example:
        >>> host_keys([("vm", 0), ("vm", 1), ("b", 2), ("b", 2)])
        ['vm#0', 'vm#1', 'b', 'b']
    """
    nodes: dict[str, set[int]] = {}
    for name, node in hosts:
        nodes.setdefault(name, set()).add(node)
    return [f"{name}#{node}" if len(nodes[name]) > 1 else name for name, node in hosts]


def build_topology(
    rank: int, hostnames: list[str], spec: str | TopologySpec | None = None, *, source: str = "topology"
) -> Topology:
    """Build the topology from every rank's host name and an optional spec.

    Raises:
        TopologyError: the spec is malformed or its product is not the world size.
    """
    size = len(hostnames)
    first_seen: dict[str, int] = {}
    for name in hostnames:
        first_seen.setdefault(name, len(first_seen))
    hosts = tuple(first_seen[name] for name in hostnames)
    order = tuple(sorted(range(size), key=lambda r: (hosts[r], r)))
    if spec is None:
        return Topology(rank, size, hosts, discover_dims(hosts), order)
    parsed = parse_spec(spec) if isinstance(spec, str) else spec
    check_spec_size(parsed, size, source=source)
    return Topology(rank, size, hosts, parsed.dims, order, parsed.mode)
