"""The elastic target run on emulated hosts, and the timeline of its recovery.

Three hosts x one rank on 1 Gbit/s links; ``ddlrun --elastic`` runs an example whose rank 0
prints ``step N world W size S ... t=UNIX`` lines and whose ranks end with
``final rank R of N: step S, ... weights DIGEST``. At step ``--kill-step`` the last host is
lost (all its processes SIGKILLed, or ``--partition``: its link set down) and removed from
the discovery file; at step ``--relist-step`` of the next world it is listed again (link
up); the example holds at ``--join-step`` until ddlrun announces it, so it joins there.
Prints the recovery timeline (kill -> detection -> new world -> synced -> first step) and
checks the targets; ``--runs 2`` also compares the final weights of two runs.

    python -m emulation.elastic_run torch --runs 2
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from emulation.cluster import Cluster

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = {
    "torch": ["python", str(ROOT / "examples/elastic/torch_digits.py")],
    "keras": ["python", str(ROOT / "examples/elastic/keras_digits.py")],
    "caffe": ["ddl-caffe", "train", "--solver", str(ROOT / "examples/elastic/caffe/digits_solver.prototxt"),
              "--elastic"],
}


def example_arguments(example: str, *, steps: int, join_step: int, step_seconds: float) -> list[str]:
    """The example's own flags for the run's length, commits every 5 steps, and the held join."""
    if example == "caffe":  # Caffe's words; a LeNet iteration is short enough without a pause
        return ["--iterations", str(steps), "--commit-every", "5", "--wait-for-hosts-at", str(join_step)]
    return ["--steps", str(steps), "--commit-every", "5", "--wait-for-hosts-at", str(join_step),
            "--step-seconds", str(step_seconds)]
_LOG = re.compile(r"ddlrun: elastic \[\s*([\d.]+) s\] (.*)")
_STEP = re.compile(r"step\s+(\d+) world (\d+) size (\d+) .*?t=(\d+\.\d{3})")
_FINAL = re.compile(r"final rank (\d+) of (\d+): step (\d+),.*?weights ([0-9a-f]{16})")


@dataclasses.dataclass
class Outcome:
    """What one run did, read from its output."""

    rc: int
    output: list[str]
    killed_at: float = 0.0
    start_unix: float = 0.0
    events: list[tuple[float, str]] = dataclasses.field(default_factory=list)  # (unix time, ddlrun's line)
    steps: list[tuple[int, int, int, float]] = dataclasses.field(default_factory=list)  # step, world, size, t
    finals: dict[int, tuple[int, int, str]] = dataclasses.field(default_factory=dict)  # rank -> size, step, digest

    def event(self, text: str, after: float = 0.0) -> float | None:
        return next((t for t, line in self.events if text in line and t >= after), None)

    def timeline(self) -> dict[str, float | int | None]:
        """Seconds from the kill to each stage of the recovery, and where training resumed."""
        k = self.killed_at
        after = [s for s in self.steps if s[1] == 2]
        detected = self.event("lost host", k)
        started = self.event("world 2: starting", k)
        synced = self.event("world 2: every rank synced", k)
        return {
            "detected_s": None if detected is None else detected - k,
            "new_world_s": None if started is None else started - k,
            "synced_s": None if synced is None else synced - k,
            "first_step_s": after[0][3] - k if after else None,
            "resumed_after_step": after[0][0] - 1 if after else None,
            "last_step_before_kill": max((s[0] for s in self.steps if s[1] == 1), default=None),
        }


def run_once(cluster: Cluster, command: list[str], *, kill_step: int, relist_step: int, partition: bool,
             extra: list[str], timeout: float, ddlrun_flags: tuple[str, ...] = ()) -> Outcome:
    """One target run on ``cluster`` (3 hosts); the last host is lost at ``kill_step``."""
    assert cluster.workdir is not None
    victim = cluster.hosts[-1]
    listing = cluster.workdir / "hosts.txt"
    listing.write_text("".join(f"{h}:1\n" for h in cluster.hosts))
    discovery = cluster.workdir / "discover.sh"
    discovery.write_text(f"#!/bin/sh\ncat {listing}\n")
    discovery.chmod(0o755)
    python = sys.executable
    cmd = [python if w == "python" else w for w in command]
    if cmd[0] == "ddl-caffe":
        cmd[0] = str(Path(python).parent / "ddl-caffe")
    argv = [python, "-m", "ddl.launcher.cli", "--elastic", "-np", "3", "--min-np", "2", "--max-np", "3",
            "--host-discovery-script", str(discovery), *ddlrun_flags, *cmd, *extra]
    job = subprocess.Popen(cluster.launch_argv(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=cluster.env())
    timer = threading.Timer(timeout, lambda: job.send_signal(signal.SIGTERM))
    timer.start()
    out = Outcome(rc=-1, output=[])
    link_down = False
    try:
        assert job.stdout is not None
        for line in job.stdout:
            out.output.append(line.rstrip("\n"))
            if m := re.search(r"started at unix time ([\d.]+)", line):
                out.start_unix = float(m.group(1))
            if m := _LOG.search(line):
                out.events.append((out.start_unix + float(m.group(1)), m.group(2)))
            if m := _STEP.search(line):
                step, world, size = int(m.group(1)), int(m.group(2)), int(m.group(3))
                out.steps.append((step, world, size, float(m.group(4))))
                if world == 1 and step == kill_step and not out.killed_at:
                    listing.write_text("".join(f"{h}:1\n" for h in cluster.hosts if h != victim))
                    out.killed_at = time.time()
                    if partition:
                        set_link(cluster, victim, up=False)
                        link_down = True
                    else:
                        kill_host(cluster, victim)
                if world == 2 and step == relist_step:
                    if link_down:
                        set_link(cluster, victim, up=True)
                    listing.write_text("".join(f"{h}:1\n" for h in cluster.hosts))
            for m in _FINAL.finditer(line):  # hydra may join two ranks' lines into one
                out.finals[int(m.group(1))] = (int(m.group(2)), int(m.group(3)), m.group(4))
        out.rc = job.wait()
    finally:
        timer.cancel()
        if job.poll() is None:
            job.kill()
            job.wait()
    return out


def kill_host(cluster: Cluster, host: str) -> None:
    """SIGKILL every process in ``host``'s namespace (its agent, its ranks, hydra's proxies)."""
    for _ in range(3):
        for pid in cluster.pids(host):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def set_link(cluster: Cluster, host: str, *, up: bool) -> None:
    """Take ``host``'s link down (a partition: the host runs on, unreachable) or up again."""
    subprocess.run(["ip", "-n", cluster.namespace(host), "link", "set", cluster.veth(host), "up" if up else "down"],
                   check=True, capture_output=True)


def check(out: Outcome, *, steps: int, commit_every: int = 5) -> list[str]:
    """The targets this run missed (empty: all met)."""
    problems = []
    t = out.timeline()
    if out.rc != 0:
        problems.append(f"rc {out.rc}")
    if t["first_step_s"] is None or t["first_step_s"] > 10:
        problems.append(f"first step of the new world {t['first_step_s']} s after the loss (target <= 10 s)")
    resumed, reached = t["resumed_after_step"], t["last_step_before_kill"]
    if resumed is None or reached is None or not reached - commit_every <= resumed <= reached:
        problems.append(f"resumed after step {resumed}, but world 1 reached step {reached}: more than "
                        f"{commit_every} steps lost")
    digests = {d for _, _, d in out.finals.values()}
    if len(out.finals) != 3 or len(digests) != 1:
        problems.append(f"final weights: {out.finals} (want 3 ranks, one digest)")
    if any(step != steps for _, step, _ in out.finals.values()):
        problems.append(f"not every rank finished {steps} steps: {out.finals}")
    if not any(world >= 3 and size == 3 for _, world, size, _ in out.steps):
        problems.append("the lost host did not take part again")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("example", choices=sorted(EXAMPLES))
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--kill-step", type=int, default=22)
    parser.add_argument("--relist-step", type=int, default=30)
    parser.add_argument("--join-step", type=int, default=40)
    parser.add_argument("--partition", action="store_true", help="lose the host by its link, not by SIGKILL")
    parser.add_argument("--cold-start", action="store_true", help="ddlrun --cold-start: ranks exec'd, not forked")
    parser.add_argument("--calibrate", action="store_true",
                        help="measure the cost model in each world (ddl's default); else --calibration off, "
                             "which also makes auto's choices, and so the weights, the same in every run")
    parser.add_argument("--step-seconds", type=float, default=0.2)
    parser.add_argument("--rate", default="1gbit")
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--json", help="write the outcomes here")
    parser.add_argument("--show-output", action="store_true")
    args = parser.parse_args(argv)
    outcomes = []
    started = time.time()
    with Cluster(hosts=3, ranks_per_host=1, rate=args.rate) as cluster:
        for run in range(args.runs):
            extra = example_arguments(args.example, steps=args.steps, join_step=args.join_step,
                                      step_seconds=args.step_seconds)
            out = run_once(cluster, EXAMPLES[args.example], kill_step=args.kill_step, relist_step=args.relist_step,
                           partition=args.partition, extra=extra, timeout=args.timeout,
                           ddlrun_flags=(*(("--cold-start",) if args.cold_start else ()),
                                         *(() if args.calibrate else ("--calibration", "off"))))
            outcomes.append(out)
            if args.show_output:
                print("\n".join(out.output))
            t = out.timeline()
            print(f"\nrun {run + 1}: rc {out.rc}; {'link down' if args.partition else 'SIGKILL'} of h3 at step "
                  f"{args.kill_step} (world 1 reached step {t['last_step_before_kill']})")
            print("  kill -> detected      {:>6}".format(_s(t["detected_s"])))
            print("  kill -> new world     {:>6}  (mpiexec of world 2 started)".format(_s(t["new_world_s"])))
            print("  kill -> synced        {:>6}  (every rank holds the commit)".format(_s(t["synced_s"])))
            print("  kill -> first step    {:>6}  (resumed after step {})".format(_s(t["first_step_s"]),
                                                                            t["resumed_after_step"]))
            for when, line in out.events:
                print(f"    {when - out.start_unix:8.3f} s  {line}")
            print(f"  final: {sorted(out.finals.items())}")
            problems = check(out, steps=args.steps)
            print("  targets: " + ("met" if not problems else "MISSED: " + "; ".join(problems)))
    # The killed host could not remove its store folder (emulated hosts share /dev/shm).
    for folder in Path("/dev/shm").glob("ddl-elastic-*"):
        if folder.stat().st_mtime >= started:
            subprocess.run(["rm", "-rf", str(folder)], check=False)
    if args.runs > 1:
        digests = [{d for _, _, d in o.finals.values()} for o in outcomes]
        same = all(d == digests[0] and len(d) == 1 for d in digests)
        print(f"\nfinal weights of {args.runs} runs: {digests} -> {'identical' if same else 'DIFFERENT'}")
    if args.json:
        Path(args.json).write_text(json.dumps([{"rc": o.rc, "timeline": o.timeline(), "finals": o.finals,
                                                "events": o.events} for o in outcomes], indent=1))
    ok = all(not check(o, steps=args.steps) for o in outcomes)
    return 0 if ok else 1


def _s(x: float | int | None) -> str:
    return "-" if x is None else f"{x:.2f} s"


if __name__ == "__main__":
    raise SystemExit(main())
