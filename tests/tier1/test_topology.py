"""Topology: spec parsing, size checks, host discovery, coordinates and rings."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest

from ddl import TopologyError
from ddl.base.topology import TopologySpec, build_topology, discover_dims, parse_spec


@pytest.mark.parametrize(
    ("spec", "dims", "mode"),
    [
        ("4x16", (4, 16), None),
        ("4X16", (4, 16), None),
        ("4x8x2", (4, 8, 2), None),
        ("8", (8,), None),
        (" 4 x 16 ", (4, 16), None),
        ("r:4x16", (4, 16), "r"),
        ("R:4x16", (4, 16), "r"),
        ("p:2x2", (2, 2), "p"),
        ("rr:2x2", (2, 2), "rr"),
        ("rp:2x2", (2, 2), "rp"),
    ],
)
def test_parse_spec_accepts(spec: str, dims: tuple[int, ...], mode: str | None) -> None:
    parsed = parse_spec(spec)
    assert parsed.dims == dims
    assert parsed.mode == mode
    assert parsed.size == math.prod(dims)


def test_spec_str_round_trips() -> None:
    assert str(parse_spec("4X16")) == "4x16"
    assert str(parse_spec("r:4x16")) == "r:4x16"
    assert parse_spec(str(parse_spec("rp:3x5"))) == TopologySpec((3, 5), "rp")


@pytest.mark.parametrize("spec", ["4x", "x4", "ax2", "", "   ", "4x-2", "4*16", "4x16x", "r:", ":4x4", "4.0x2"])
def test_parse_spec_rejects_malformed(spec: str) -> None:
    with pytest.raises(TopologyError, match="malformed") as info:
        parse_spec(spec)
    assert repr(spec) in str(info.value)


@pytest.mark.parametrize("spec", ["0x4", "4x0", "0", "2x0x2"])
def test_parse_spec_rejects_zero(spec: str) -> None:
    with pytest.raises(TopologyError, match="zero"):
        parse_spec(spec)


@pytest.mark.parametrize("spec", ["q:4", "rrr:2x2", "rq:2x2", "rrr:2x2x2x2"])
def test_parse_spec_rejects_bad_mode(spec: str) -> None:
    with pytest.raises(TopologyError, match="mode") as info:
        parse_spec(spec)
    # The message lists the known letters.
    assert "'r'" in str(info.value) and "'p'" in str(info.value)


def test_topology_error_is_value_error() -> None:
    assert issubclass(TopologyError, ValueError)
    with pytest.raises(ValueError):
        parse_spec("4x")


def test_size_mismatch_names_spec_product_and_world() -> None:
    with pytest.raises(TopologyError) as info:
        build_topology(0, ["h"] * 4, "3x2")
    msg = str(info.value)
    assert "'3x2'" in msg
    assert "product 6" in msg
    assert "world size is 4" in msg


def test_size_mismatch_names_source() -> None:
    with pytest.raises(TopologyError, match="DDL_TOPOLOGY '2x3'"):
        build_topology(0, ["h"] * 4, "2x3", source="DDL_TOPOLOGY")


def test_build_topology_accepts_parsed_spec() -> None:
    topo = build_topology(1, ["h"] * 6, TopologySpec((2, 3), "r"))
    assert topo.dims == (2, 3)
    assert topo.mode == "r"
    assert topo.rank == 1 and topo.size == 6


# -- discovery ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("hosts", "dims"),
    [
        ((0, 0, 0, 0), (4,)),  # one host
        ((0,), (1,)),
        ((0, 0, 1, 1, 2, 2), (2, 3)),  # equal hosts
        ((0, 1, 0, 1), (2, 2)),  # equal, round robin
        ((0, 0, 0, 1), (4,)),  # unequal: flat
        ((0, 0, 1, 1, 1, 2), (6,)),
        ((0, 1, 2, 3), (4,)),  # one rank per host: flat
    ],
)
def test_discover_dims(hosts: tuple[int, ...], dims: tuple[int, ...]) -> None:
    assert discover_dims(hosts) == dims


def test_build_topology_discovers_from_hostnames() -> None:
    names = [f"node{i}" for i in range(3) for _ in range(4)]
    topo = build_topology(5, names)
    assert topo.dims == (4, 3)
    assert topo.local_size == 4 and topo.cross_size == 3
    assert topo.local_rank == 1 and topo.cross_rank == 1
    assert build_topology(0, ["a", "a", "b"]).dims == (3,)
    assert build_topology(0, ["solo"]).dims == (1,)


# -- coordinates --------------------------------------------------------------


@pytest.mark.parametrize("spec", ["2x3", "3x5x7", "1x8", "8x1", "2x2x2", "12"])
def test_coords_rank_at_round_trip(spec: str) -> None:
    parsed = parse_spec(spec)
    topo = build_topology(0, ["h"] * parsed.size, spec)
    seen = set()
    for r in range(topo.size):
        c = topo.coords(r)
        assert len(c) == len(parsed.dims)
        assert all(0 <= ci < di for ci, di in zip(c, parsed.dims, strict=True))
        assert topo.rank_at(c) == r
        seen.add(c)
    assert len(seen) == topo.size
    for c in itertools.product(*(range(d) for d in parsed.dims)):
        assert topo.coords(topo.rank_at(c)) == c


def test_coords_dim0_fastest_and_default_rank() -> None:
    topo = build_topology(4, ["h"] * 6, "2x3")
    assert [topo.coords(r) for r in range(6)] == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]
    assert topo.coords() == (0, 2)


def test_ring_membership() -> None:
    topo = build_topology(0, ["h"] * 24, "2x3x4")
    for r in range(24):
        for dim, d in enumerate(topo.dims):
            ring = topo.ring(dim, r)
            assert len(ring) == d and r in ring
            # Members differ from r only in coordinate `dim`, ordered by it.
            for c, member in enumerate(ring):
                mc, rc = topo.coords(member), topo.coords(r)
                assert mc[dim] == c
                assert all(mc[i] == rc[i] for i in range(3) if i != dim)
            # Every member sees the same ring.
            assert all(topo.ring(dim, m) == ring for m in ring)
    assert topo.ring(0, 5) == [4, 5]
    assert topo.ring(1, 5) == [1, 3, 5]
    assert topo.ring(2, 5) == [5, 11, 17, 23]
    assert topo.ring(1) == [0, 2, 4]  # default: this rank (0)


def test_link_dim_is_outermost_difference() -> None:
    topo = build_topology(0, ["h"] * 24, "2x3x4")
    assert topo.link_dim(0, 0) == 0
    assert topo.link_dim(0, 1) == 0  # (0,0,0)-(1,0,0)
    assert topo.link_dim(0, 2) == 1  # (0,0,0)-(0,1,0)
    assert topo.link_dim(0, 3) == 1  # (0,0,0)-(1,1,0): outermost is 1
    assert topo.link_dim(0, 6) == 2
    assert topo.link_dim(1, 23) == 2
    assert topo.link_dim(5, 4) == 0
    for a in range(24):
        for b in range(24):
            assert topo.link_dim(a, b) == topo.link_dim(b, a)


def test_flat_keeps_order_and_drops_mode() -> None:
    topo = build_topology(3, ["a", "b"] * 3, "r:2x3")
    flat = topo.flat()
    assert flat.dims == (6,) and flat.mode is None
    assert flat.order == topo.order and flat.rank == 3
    assert str(topo) == "2x3"


def test_round_robin_placement_groups_by_host() -> None:
    names = ["a", "b"] * 4  # ranks 0,2,4,6 on a; 1,3,5,7 on b
    topos = [build_topology(r, names) for r in range(8)]
    topo = topos[0]
    assert topo.hosts == (0, 1, 0, 1, 0, 1, 0, 1)
    assert topo.order == (0, 2, 4, 6, 1, 3, 5, 7)
    assert topo.dims == (4, 2)
    assert [t.local_rank for t in topos] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [t.cross_rank for t in topos] == [0, 1, 0, 1, 0, 1, 0, 1]
    assert all(t.local_size == 4 and t.cross_size == 2 for t in topos)
    # Dim-0 rings stay inside a host; dim-1 rings cross hosts.
    for r in range(8):
        assert {topo.hosts[m] for m in topo.ring(0, r)} == {topo.hosts[r]}
        assert {topo.hosts[m] for m in topo.ring(1, r)} == {0, 1}
    assert topo.ring(0, 2) == [0, 2, 4, 6]
    assert topo.ring(1, 2) == [2, 3]
    assert topo.coords(3) == (1, 1)
    assert topo.index_of(1) == 4
    # Host indices follow first appearance, not the names' order.
    assert build_topology(0, ["z", "a", "z", "a"]).hosts == (0, 1, 0, 1)


def test_topology_rejects_bad_order() -> None:
    base = build_topology(0, ["h"] * 4)
    with pytest.raises(ValueError, match="permutation"):
        dataclasses.replace(base, order=(0, 1, 1, 3))
    with pytest.raises(TopologyError):
        dataclasses.replace(base, dims=(3,))
