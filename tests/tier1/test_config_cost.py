"""Config parsing from DDL_* variables, and the network cost model behind ``auto``."""

from __future__ import annotations

import dataclasses

import pytest

from ddl.base.config import DEFAULT_SEGMENT_BYTES, SETTINGS, Config
from ddl.base.topology import Topology, build_topology
from ddl.reduction import cost
from ddl.reduction.algorithms import SCHEDULED

# -- Config ----------------------------------------------------------------------


def test_defaults_from_empty_env() -> None:
    cfg = Config.from_env({})
    assert cfg == Config()
    assert cfg.topology is None
    assert cfg.algorithm == "auto"
    assert cfg.segment_bytes == DEFAULT_SEGMENT_BYTES == 1 << 20
    assert cfg.abort_on_exception is True
    assert cfg.hostname is None
    assert cfg.verbose is False
    assert cfg.fusion_threshold == 64 << 20
    assert cfg.stall_timeout == 60.0
    assert cfg.cycle_time == pytest.approx(0.002)
    assert cfg.timeline is None
    assert cfg.calibration is None


ALL_VARS = (
    "DDL_TOPOLOGY", "DDL_ALGORITHM", "DDL_SEGMENT_BYTES", "DDL_ABORT_ON_EXCEPTION", "DDL_HOSTNAME",
    "DDL_VERBOSE", "DDL_FUSION_THRESHOLD", "DDL_STALL_TIMEOUT", "DDL_CYCLE_TIME_MS", "DDL_TIMELINE",
    "DDL_CALIBRATION",
)


def test_blank_values_mean_default() -> None:
    env = {k: "  " for k in ALL_VARS}
    assert Config.from_env(env) == Config()


@pytest.mark.parametrize(
    ("var", "value", "field", "expected"),
    [
        ("DDL_TOPOLOGY", "4x16", "topology", "4x16"),
        ("DDL_TOPOLOGY", " r:2x2 ", "topology", "r:2x2"),
        ("DDL_ALGORITHM", "multiring", "algorithm", "multiring"),
        ("DDL_ALGORITHM", "ring", "algorithm", "ring"),
        ("DDL_SEGMENT_BYTES", "4096", "segment_bytes", 4096),
        ("DDL_SEGMENT_BYTES", " 1 ", "segment_bytes", 1),
        ("DDL_ABORT_ON_EXCEPTION", "0", "abort_on_exception", False),
        ("DDL_ABORT_ON_EXCEPTION", "false", "abort_on_exception", False),
        ("DDL_ABORT_ON_EXCEPTION", "No", "abort_on_exception", False),
        ("DDL_ABORT_ON_EXCEPTION", "off", "abort_on_exception", False),
        ("DDL_ABORT_ON_EXCEPTION", "1", "abort_on_exception", True),
        ("DDL_HOSTNAME", "node07", "hostname", "node07"),
        ("DDL_VERBOSE", "1", "verbose", True),
        ("DDL_VERBOSE", "TRUE", "verbose", True),
        ("DDL_VERBOSE", "yes", "verbose", True),
        ("DDL_VERBOSE", "on", "verbose", True),
        ("DDL_VERBOSE", "0", "verbose", False),
        ("DDL_FUSION_THRESHOLD", "0", "fusion_threshold", 0),
        ("DDL_FUSION_THRESHOLD", "1048576", "fusion_threshold", 1 << 20),
        ("DDL_STALL_TIMEOUT", "2.5", "stall_timeout", 2.5),
        ("DDL_CYCLE_TIME_MS", "5", "cycle_time", 0.005),
        ("DDL_TIMELINE", "/tmp/trace.json", "timeline", "/tmp/trace.json"),
        ("DDL_CALIBRATION", "/tmp/calib.json", "calibration", "/tmp/calib.json"),
        ("DDL_CALIBRATION", "OFF", "calibration", "off"),
        ("DDL_CALIBRATION", "off", "calibration", "off"),
    ],
)
def test_each_variable(var: str, value: str, field: str, expected: object) -> None:
    cfg = Config.from_env({var: value})
    want = pytest.approx(expected) if isinstance(expected, float) else expected
    assert getattr(cfg, field) == want
    assert type(getattr(cfg, field)) is type(expected)
    # Nothing else changes.
    others = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name != field}
    assert others == {f.name: getattr(Config(), f.name) for f in dataclasses.fields(cfg) if f.name != field}


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("DDL_SEGMENT_BYTES", "abc"),
        ("DDL_SEGMENT_BYTES", "1.5"),
        ("DDL_SEGMENT_BYTES", "1MB"),
        ("DDL_SEGMENT_BYTES", "0"),
        ("DDL_SEGMENT_BYTES", "-4"),
        ("DDL_ABORT_ON_EXCEPTION", "maybe"),
        ("DDL_ABORT_ON_EXCEPTION", "2"),
        ("DDL_VERBOSE", "yep"),
        ("DDL_FUSION_THRESHOLD", "-1"),
        ("DDL_FUSION_THRESHOLD", "64MB"),
        ("DDL_STALL_TIMEOUT", "0"),
        ("DDL_STALL_TIMEOUT", "-3"),
        ("DDL_STALL_TIMEOUT", "soon"),
        ("DDL_CYCLE_TIME_MS", "nan"),
    ],
)
def test_bad_values_name_the_variable(var: str, value: str) -> None:
    with pytest.raises(ValueError, match=var) as info:
        Config.from_env({var: value})
    assert value.lower() in str(info.value).lower()


def test_calibration_on_means_measure() -> None:
    assert Config.from_env({"DDL_CALIBRATION": "on"}).calibration is None


def test_reads_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDL_ALGORITHM", "halving_doubling")
    monkeypatch.setenv("DDL_SEGMENT_BYTES", "64")
    monkeypatch.delenv("DDL_TOPOLOGY", raising=False)
    cfg = Config.from_env()
    assert cfg.algorithm == "halving_doubling" and cfg.segment_bytes == 64 and cfg.topology is None
    monkeypatch.setenv("DDL_VERBOSE", "loud")
    with pytest.raises(ValueError, match="DDL_VERBOSE"):
        Config.from_env()


def test_config_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Config().algorithm = "ring"  # type: ignore[misc]


def test_launcher_flags_map_to_variables_from_env_reads() -> None:
    samples = {"DDL_TOPOLOGY": "2x2", "DDL_ALGORITHM": "ring", "DDL_SEGMENT_BYTES": "77", "DDL_VERBOSE": "1",
               "DDL_TIMELINE": "t.json", "DDL_FUSION_THRESHOLD": "5", "DDL_STALL_TIMEOUT": "9",
               "DDL_CALIBRATION": "off"}
    for flag, var in ((s.field, s.env) for s in SETTINGS if s.flag):
        assert var.startswith("DDL_")
        assert flag in {f.name for f in dataclasses.fields(Config)}, flag
        if var not in samples:
            continue  # a flag added after this test; its parsing is covered above or elsewhere
        cfg = Config.from_env({var: samples[var]})
        assert getattr(cfg, flag) != getattr(Config(), flag), f"--{flag} -> {var} is not read"


# -- cost model ---------------------------------------------------------------------


def _two_hosts() -> Topology:
    return build_topology(0, ["a"] * 4 + ["b"] * 4, "4x2")


def _sixteen_hosts() -> Topology:
    return build_topology(0, [f"h{i}" for i in range(16) for _ in range(4)], "4x16")


# Intra-host links much faster than the network (NVLink/IB-like): network-bound.
NETWORK_BOUND = cost.CostModel(
    links=(cost.Link(alpha=1e-6, beta=1 / 50e9), cost.Link(alpha=5e-6, beta=1 / 1e9)), gamma=0.0
)


def test_default_model_links() -> None:
    assert cost.default_model(_two_hosts()).links == (cost.SHARED_MEMORY, cost.NETWORK)
    single = build_topology(0, ["a"] * 8, "2x4")
    assert cost.default_model(single).links == (cost.SHARED_MEMORY, cost.SHARED_MEMORY)
    assert cost.default_model(build_topology(0, ["a"] * 3)).links == (cost.SHARED_MEMORY,)
    model = cost.default_model(_two_hosts())
    assert model.link(0) == cost.SHARED_MEMORY and model.link(5) == cost.NETWORK


@pytest.mark.parametrize("algorithm", ["mpi", *SCHEDULED])
@pytest.mark.parametrize("topo_fn", [_two_hosts, _sixteen_hosts, lambda: build_topology(0, ["a"] * 6)],
                         ids=["4x2", "4x16", "flat6"])
def test_predict_monotone_in_size(algorithm: str, topo_fn: object) -> None:
    topo = topo_fn()  # type: ignore[operator]
    model = cost.default_model(topo)
    sizes = [0, 1, 2, 7, 64, 1000, 4096, 65_536, 1 << 20]
    times = [cost.predict(algorithm, topo, n, 4, model) for n in sizes]
    assert times == sorted(times), times
    assert times[-1] > times[1] > 0
    # Wider elements cost more.
    assert cost.predict(algorithm, topo, 1 << 16, 8, model) > cost.predict(algorithm, topo, 1 << 16, 4, model)


def test_predict_single_rank_is_free() -> None:
    topo = build_topology(0, ["a"])
    model = cost.default_model(topo)
    for name in ("mpi", *SCHEDULED):
        assert cost.predict(name, topo, 1000, 4, model) == 0.0
    assert cost.choose(topo, 1000, 4, model) == "mpi"


def test_ring_prediction_matches_formula() -> None:
    # One host, one link type: T = 2(p-1) alpha + 2(p-1)/p N beta + (p-1)/p N gamma.
    p, n, item = 8, 8 * 1000, 4
    topo = build_topology(0, ["a"] * p)
    model = cost.CostModel(links=(cost.Link(alpha=1e-5, beta=1e-9),), gamma=1e-10)
    want = 2 * (p - 1) * 1e-5 + 2 * (p - 1) / p * n * item * 1e-9 + (p - 1) / p * n * item * 1e-10
    assert cost.predict("ring", topo, n, item, model) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("algorithm", ["ring", "multiring"])
def test_predict_ignores_unit_dims_on_one_link(algorithm: str) -> None:
    # With one link type everywhere, "1x6" and "6" are the same ranks on the same wires.
    model = cost.CostModel(links=(cost.Link(alpha=1e-5, beta=1e-9),), gamma=1e-10)
    flat = build_topology(0, ["a"] * 6, "6")
    unit = build_topology(0, ["a"] * 6, "1x6")
    assert cost.predict(algorithm, unit, 1 << 20, 4, model) == pytest.approx(
        cost.predict(algorithm, flat, 1 << 20, 4, model))


def test_predict_halving_doubling_unit_inner_dim() -> None:
    model = cost.CostModel(links=(cost.Link(alpha=1e-5, beta=1e-9),), gamma=1e-10)
    flat = build_topology(0, ["a"] * 6, "6")
    unit = build_topology(0, ["a"] * 6, "1x6")
    assert cost.predict("halving_doubling", unit, 1 << 20, 4, model) == pytest.approx(
        cost.predict("halving_doubling", flat, 1 << 20, 4, model))


def test_outer_links_are_shared_by_a_host() -> None:
    # The 4 ranks of a host cross the network at once in multiring's dim-1 phase: they
    # share the port, so making the network slower hurts multiring 4x per byte.
    topo = _two_hosts()
    fast = cost.CostModel(links=(cost.Link(0.0, 0.0), cost.Link(0.0, 1e-9)), gamma=0.0)
    n = 8000
    # dim-1 phase: 2 steps (reduce-scatter + allgather) of N/8 elements, 4 flows.
    assert cost.predict("multiring", topo, n, 1, fast) == pytest.approx(2 * 4 * n / 8 * 1e-9)


@pytest.mark.parametrize("topo_fn", [_two_hosts, _sixteen_hosts], ids=["4x2", "4x16"])
def test_choose_mpi_for_tiny_messages(topo_fn: object) -> None:
    topo = topo_fn()  # type: ignore[operator]
    model = cost.default_model(topo)
    assert cost.choose(topo, 0, 4, model) == "mpi"
    for n in (1, 8):
        # Never a ring schedule, which pays 2(d-1) latencies per dim. The uncalibrated
        # model prices MPI's allreduce as log2(p) steps all on the network, so shm (two
        # local group steps and 2(H-1) network steps) may undercut it across hosts.
        costs = {a: cost.predict(a, topo, n, 4, model) for a in ("mpi", *SCHEDULED)}
        assert cost.choose(topo, n, 4, model) in ("mpi", "shm")
        assert min(costs["mpi"], costs["shm"]) < min(costs[a] for a in ("ring", "multiring", "halving_doubling"))
    # On one host, where the MPI library and the schedules use the same link.
    single = build_topology(0, ["a"] * 8, "2x4")
    for n in (1, 8):
        assert cost.choose(single, n, 4, NETWORK_BOUND) == "mpi"


def test_choose_scheduled_for_large_messages_network_bound() -> None:
    topo = _two_hosts()
    choice = cost.choose(topo, 1 << 24, 4, NETWORK_BOUND)
    assert choice in SCHEDULED
    costs = {name: cost.predict(name, topo, 1 << 24, 4, NETWORK_BOUND) for name in ("mpi", *SCHEDULED)}
    assert costs[choice] == min(costs.values())


def test_choose_scheduled_for_large_messages_default_model() -> None:
    topo = _two_hosts()
    assert cost.choose(topo, 1 << 24, 4, cost.default_model(topo)) in SCHEDULED


def test_multiring_cheaper_than_ring_on_4x16() -> None:
    topo = _sixteen_hosts()
    default = cost.default_model(topo)
    # Latency-bound to mid-size messages under the default model: 36 steps against 126.
    for n in (1 << 10, 1 << 16):
        assert cost.predict("multiring", topo, n, 4, default) < cost.predict("ring", topo, n, 4, default), n
    # Large messages when the network is the bottleneck: multiring's outer rings carry
    # 2(H-1)/H N per host port against the flat ring's 2(p-1)/p N.
    for n in (1 << 24, 1 << 26):
        assert cost.predict("multiring", topo, n, 4, NETWORK_BOUND) < cost.predict("ring", topo, n, 4, NETWORK_BOUND)


def test_multiring_much_cheaper_than_ring_on_two_hosts() -> None:
    topo = _two_hosts()
    ring = cost.predict("ring", topo, 1 << 24, 4, NETWORK_BOUND)
    multi = cost.predict("multiring", topo, 1 << 24, 4, NETWORK_BOUND)
    assert multi < 0.65 * ring


def test_choose_is_deterministic_and_cached() -> None:
    topo = _sixteen_hosts()
    model = cost.default_model(topo)
    assert cost.choose(topo, 12345, 4, model) == cost.choose(topo, 12345, 4, model)
    # Every rank's topology object yields the same choice (ranks must agree on it).
    choices = {cost.choose(dataclasses.replace(topo, rank=r), 1 << 18, 4, NETWORK_BOUND) for r in (0, 5, 63)}
    assert len(choices) == 1
