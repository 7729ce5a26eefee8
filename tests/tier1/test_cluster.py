"""emulation.cluster without root: names, host lists, the launcher script, and the skip reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from emulation import cluster as cl
from emulation.cluster import Cluster, ClusterUnavailable


def test_cluster_names_fit_interfaces_and_stay_in_their_range(tmp_path: Path) -> None:
    c = Cluster(hosts=cl.MAX_HOSTS, ranks_per_host=3, rate=None)
    # Interface names: each host's veth and its switch-side peer (one letter apart), the
    # bridge and the launcher's pair. Linux takes at most 15 characters.
    interfaces = [c.veth(h) for h in c.hosts] + [c.veth(h)[:-1] + "b" for h in c.hosts]
    interfaces += [f"{c.tag}br", f"{c.tag}l0", f"{c.tag}l1"]
    assert max(len(n) for n in interfaces) == 15 and all(n.startswith("ddlh") for n in interfaces)
    assert all(cl._NAME.match(c.namespace(h)) for h in c.hosts)  # found again as leftovers
    assert c.host_list() == ",".join(f"h{i}:3" for i in range(1, cl.MAX_HOSTS + 1))
    assert c.hostfile(tmp_path / "hosts").read_text().splitlines()[0] == "h1 slots=3"
    assert all(c.address(h).startswith("10.231.") for h in c.hosts)
    script = c._exec_script()
    assert all(f"{h}|{c.address(h)}) ns={c.namespace(h)} ;;" in script for h in c.hosts)
    with pytest.raises(ValueError, match="1 to 16"):
        Cluster(hosts=cl.MAX_HOSTS + 1)



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


def test_the_link_account_splits_a_call_into_its_phases_against_the_bound() -> None:
    """``emulation.link_account``: phases of dim 0 and shared memory count as inside a host,
    the rest as between hosts; shares are the link bound over the measured times."""
    from emulation import link_account

    mib16 = 16 << 20
    data = {"rate": "1gbit", "hosts": 2, "ranks_per_host": 2, "load_average": 1.0, "one_host": {str(mib16): 0.003},
            "rows": [{"bytes": mib16, "algorithm": "shm", "total_s": 0.156, "bare_exchange_s": 0.140,
                      "per_rank_bytes": 8 << 20,
                      "phases_s": {"shm reduce-scatter": 0.007, "reduce-scatter dim 1": 0.070,
                                   "allgather dim 1": 0.062, "shm allgather": 0.017}},
                     {"bytes": mib16, "algorithm": "multiring", "total_s": 0.158, "bare_exchange_s": 0.140,
                      "per_rank_bytes": 8 << 20,
                      "phases_s": {"reduce-scatter dim 0": 0.009, "reduce-scatter dim 1": 0.071,
                                   "allgather dim 1": 0.070, "allgather dim 0": 0.008}}]}
    shm, ring = link_account.account(data)
    bound = mib16 / 125e6  # 2(H-1)/H x N at 1 Gbit/s, H = 2
    assert shm["bound_s"] == pytest.approx(bound)
    assert shm["inside_s"] == pytest.approx(0.024) and shm["across_s"] == pytest.approx(0.132)
    assert ring["inside_s"] == pytest.approx(0.017) and ring["across_s"] == pytest.approx(0.141)
    assert shm["share"] == pytest.approx(bound / 0.156) and shm["bare_share"] == pytest.approx(bound / 0.140)
    table = "\n".join(link_account.report(data, [shm, ring]))
    assert "| 16 MiB | shm | 134.2 | 140.0 (96%) | 132.0 | 24.0 | 0.0 | 156.0 (86%) |" in table
    assert "16 MiB 3.0 ms" in table


def test_down_removes_the_mpi_segments_killed_processes_left_and_nothing_else(monkeypatch: pytest.MonkeyPatch) -> None:
    """What SIGKILLed hosts left in the shared /dev/shm goes; a segment from before the
    cluster, one a live process maps, and one just made (by a job that may not have mapped
    it yet) are kept."""
    import os
    import subprocess
    import sys

    tag = f"mpich_shm_ddltest{os.getpid():x}"
    paths = {k: Path(f"/dev/shm/{tag}_{k}") for k in ("before", "left", "mapped")}
    paths["before"].write_bytes(b"\0" * 4096)
    before = cl._shm_entries()
    paths["left"].write_bytes(b"\0" * 4096)
    paths["mapped"].write_bytes(b"\0" * 4096)
    holder = subprocess.Popen([sys.executable, "-c", "import mmap, sys, time; f = open(sys.argv[1], 'r+b'); "
                               "m = mmap.mmap(f.fileno(), 4096); print('mapped', flush=True); time.sleep(60)",
                               str(paths["mapped"])], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "mapped"
        monkeypatch.setattr(cl, "_SEGMENT_GRACE_S", 3600.0)  # every new one "just made": none goes
        assert cl._remove_left_segments(before) == []
        monkeypatch.setattr(cl, "_SEGMENT_GRACE_S", 0.0)
        assert cl._remove_left_segments(before) == [str(paths["left"])]
        assert sorted(k for k, p in paths.items() if p.exists()) == ["before", "mapped"]
    finally:
        holder.kill()
        holder.wait()
        for p in paths.values():
            p.unlink(missing_ok=True)
