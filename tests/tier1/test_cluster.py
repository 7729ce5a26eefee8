"""emulation.cluster without root: names, host lists, the launcher script, and the skip reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from emulation import cluster as cl
from emulation.cluster import Cluster, ClusterUnavailable


def test_cluster_names_fit_interfaces_and_stay_in_their_range(tmp_path: Path) -> None:
    c = Cluster(hosts=9, ranks_per_host=3, rate=None)
    names = [c.veth(h) for h in c.hosts] + [c.namespace(h) for h in c.hosts] + [c.switch, c.launcher]
    assert all(n.startswith("ddlh") and len(n) + 1 <= 15 for n in names)  # +1: the peer end's letter
    assert c.host_list() == ",".join(f"h{i}:3" for i in range(1, 10))
    assert c.hostfile(tmp_path / "hosts").read_text().splitlines()[0] == "h1 slots=3"
    assert all(c.address(h).startswith("10.231.") for h in c.hosts)
    script = c._exec_script()
    assert all(f"{h}|{c.address(h)}) ns={c.namespace(h)} ;;" in script for h in c.hosts)
    with pytest.raises(ValueError):
        Cluster(hosts=10)



def test_without_root_it_says_why_and_makes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cl.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(cl.subprocess, "run", lambda *a, **k: pytest.fail(f"ran {a}"))
    reason = cl.unavailable_reason()
    assert reason is not None and "root" in reason
    with pytest.raises(ClusterUnavailable, match="root"):
        Cluster(hosts=2).up()


def test_stale_names_belong_to_this_prefix_only() -> None:
    c = Cluster(hosts=3)
    for ns in (c.switch, c.launcher, *map(c.namespace, c.hosts)):
        m = cl._NAME.match(ns)
        assert m is not None and int(m.group(1), 16) == cl.os.getpid()
    for other in ("ddlx0001234s", "ddlh00123", "netns1", "ddlh0012340s-extra"):
        assert cl._NAME.match(other) is None
