"""``python -m emulation.rehearsal``: ``ddl bench rehearsal`` on emulated hosts (root only).

Brings up :class:`emulation.cluster.Cluster` (``--hosts`` x ``--ranks-per-host``, every
host's port shaped to ``--link``), runs the rehearsal there under ``ddlrun -H`` with
``init``'s calibration written to a file, and watches the harness while it runs: the
machine's cores (``/proc/stat``: busy, kernel and softirq shares — the network stack's
work), each host's veth bytes against what the allreduces must move, the ``tbf`` drops
and TCP retransmissions. Options it does not know go to ``ddl bench rehearsal``.

Example:
    python -m emulation.rehearsal --hosts 8 --ranks-per-host 2 --link 200mbit --model resnet50
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, TypeVar

from emulation.cluster import Cluster

#: /proc/stat's first line: user nice system idle iowait irq softirq steal.
_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def cpu_times() -> dict[str, int]:
    with open("/proc/stat") as f:
        words = f.readline().split()[1 : 1 + len(_FIELDS)]
    return dict(zip(_FIELDS, map(int, words), strict=True))


_S = TypeVar("_S", bound="Sampler")


class Sampler:
    """Calls :meth:`sample` every ``period`` seconds on a thread of its own while a ``with``
    block runs, once at its start and once at its end."""

    def __init__(self, period: float) -> None:
        self.period = period
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self: _S) -> _S:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self.period):
                self.sample()
                return

    def sample(self) -> None:
        raise NotImplementedError


class CoreWatch(Sampler):
    """Samples the machine's core use every ``period`` seconds while a job runs."""

    def __init__(self, period: float = 1.0) -> None:
        super().__init__(period)
        self.samples: list[tuple[float, dict[str, int]]] = []

    def sample(self) -> None:
        self.samples.append((time.monotonic(), cpu_times()))

    def shares(self) -> dict[str, float]:
        """Each kind of core time as a share of all, over the whole run, and the busiest second's."""
        if len(self.samples) < 2:
            return {}
        first, last = self.samples[0][1], self.samples[-1][1]
        total = sum(last.values()) - sum(first.values()) or 1
        out = {k: (last[k] - first[k]) / total for k in _FIELDS}
        out["busy"] = 1 - out["idle"] - out["iowait"]
        peaks = []
        for (_, a), (_, b) in zip(self.samples, self.samples[1:], strict=False):
            span = sum(b.values()) - sum(a.values()) or 1
            peaks.append(1 - (b["idle"] - a["idle"] + b["iowait"] - a["iowait"]) / span)
        out["busy_p90"] = sorted(peaks)[int(0.9 * (len(peaks) - 1))]
        out["load_average"] = os.getloadavg()[0]
        return out


def qdisc_drops(cluster: Cluster) -> dict[str, int]:
    """``tbf`` drops on both ends of each host's link (a full queue drops packets; TCP resends them)."""
    out = {}
    for h in cluster.hosts:
        for ns, dev in ((cluster.namespace(h), cluster.veth(h)), (cluster.switch, cluster.veth(h)[:-1] + "b")):
            text = subprocess.run(["tc", "-n", ns, "-s", "qdisc", "show", "dev", dev], capture_output=True,
                                  text=True, check=False).stdout
            m = re.search(r"dropped (\d+)", text)
            out[dev] = int(m.group(1)) if m else 0
    return out


def retransmissions(cluster: Cluster) -> int:
    """TCP segments resent, summed over the hosts' namespaces."""
    total = 0
    for h in cluster.hosts:
        text = subprocess.run(["ip", "netns", "exec", cluster.namespace(h), "cat", "/proc/net/snmp"],
                              capture_output=True, text=True, check=False).stdout
        rows = [ln.split() for ln in text.splitlines() if ln.startswith("Tcp:")]
        if len(rows) == 2 and "RetransSegs" in rows[0]:
            total += int(rows[1][rows[0].index("RetransSegs")])
    return total


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m emulation.rehearsal", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", type=int, default=8)
    p.add_argument("--ranks-per-host", type=int, default=2)
    p.add_argument("--link", default="200mbit", help="each host's port, both directions (tc tbf rate)")
    p.add_argument("--burst", default="128kb", help="tbf bucket: bytes a port may send at once after idling")
    p.add_argument("--queue", default="100ms",
                   help="tbf latency: the port's queue. Deep enough that TCP's flows sharing a port are not "
                        "dropped (DDL's InfiniBand loses nothing; a 5 ms queue dropped thousands of packets)")
    p.add_argument("--out", default="bench-results")
    p.add_argument("--timeout", type=float, default=4 * 3600)
    return p


def main(argv: list[str] | None = None) -> int:
    args, bench_args = parser().parse_known_args(argv)
    from emulation.cluster import unavailable_reason

    reason = unavailable_reason()
    if reason:
        print(f"emulation.rehearsal: {reason}", file=sys.stderr)
        return 2
    shape = f"{args.ranks_per_host}x{args.hosts}"
    stem = f"rehearsal-{shape}-{args.link}"
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    calibration = out / f"{stem}-calibration.json"
    with Cluster(hosts=args.hosts, ranks_per_host=args.ranks_per_host, rate=args.link, burst=args.burst,
                 latency=args.queue) as cluster:
        argv_job = [sys.executable, "-m", "ddl.launcher.cli", "-np", str(args.hosts * args.ranks_per_host),
                    "-H", cluster.host_list(), "--calibration", str(calibration),
                    sys.executable, "-m", "ddl_bench.rehearsal", "--link", args.link, "--out", str(out),
                    "--tag", stem, *bench_args]
        before, drops0, resent0 = cluster.counters(), qdisc_drops(cluster), retransmissions(cluster)
        t0 = time.monotonic()
        with CoreWatch() as cores:
            proc = subprocess.Popen(cluster.launch_argv(argv_job), env=cluster.env(), text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            assert proc.stdout is not None
            for line in proc.stdout:  # the bench's progress, as it comes
                print(line, end="", flush=True)
            code = proc.wait(timeout=args.timeout)
        wall = time.monotonic() - t0
        after, drops1, resent1 = cluster.counters(), qdisc_drops(cluster), retransmissions(cluster)
    if code != 0:
        print(f"emulation.rehearsal: the job failed ({code})", file=sys.stderr)
        return 1
    result_path = out / f"{stem}.json"
    record: dict[str, Any] = json.loads(result_path.read_text())
    harness = {
        "hosts": args.hosts, "ranks_per_host": args.ranks_per_host, "link": args.link, "burst": args.burst,
        "queue": args.queue, "job_seconds": wall, "cores": cores.shares(), "cpus": os.cpu_count(),
        "veth_bytes": {h: [after[h][0] - before[h][0], after[h][1] - before[h][1]] for h in after},
        "tbf_drops": sum(drops1.values()) - sum(drops0.values()), "tcp_retransmissions": resent1 - resent0,
    }
    record["harness"] = harness
    result_path.write_text(json.dumps(record, indent=1))
    for line in harness_lines(record):
        print(line)
    return 0 if record.get("correct") else 1


def harness_lines(record: dict[str, Any]) -> list[str]:
    """What the links and cores did during the job."""
    h = record["harness"]
    sent = [v[0] for v in h["veth_bytes"].values()]
    # Each allreduce of N bytes must move at least 2(H-1)/H x N through every port.
    runs = sum(len(c["steps"]) + 2 for c in record["contenders"].values())
    floor = 2 * (h["hosts"] - 1) / h["hosts"] * record.get("wire_bytes", record["bytes"]) * runs
    c = h["cores"]
    return [
        f"harness: {h['hosts']} hosts x {h['ranks_per_host']} ranks, links {h['link']} (tbf burst {h['burst']}, "
        f"queue {h['queue']}), job {h['job_seconds']:.0f} s",
        f"links: each host sent {min(sent) / 1e9:.2f}-{max(sent) / 1e9:.2f} GB over its veth; the "
        f"{runs} step replays must move at least {floor / 1e9:.2f} GB each; tbf drops {h['tbf_drops']}, "
        f"TCP retransmissions {h['tcp_retransmissions']}",
        f"cores ({h['cpus']}): busy {c.get('busy', 0):.0%} of the job (90th percentile second "
        f"{c.get('busy_p90', 0):.0%}); kernel {c.get('system', 0):.0%}, softirq {c.get('softirq', 0):.0%}, "
        f"user {c.get('user', 0):.0%}; load average at the end {c.get('load_average', 0):.1f}",
    ]


if __name__ == "__main__":
    raise SystemExit(main())
