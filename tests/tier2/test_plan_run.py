"""``ddl plan`` against a real 2-rank ``ddl.torch`` run: the same buckets, the same algorithm per bucket.

The worker (workers/worker_plan.py) trains three steps under ``ddlrun -np 2 --topology 1x2
--calibration off --timeline`` (each rank a host of its own); ddl.torch re-plans its buckets in the order it observed after the first
step. The plan is made from what a user has: the model's sizes, ``--calibration off``, the
bucket cap, and ``DistributedOptimizer.gradient_order()`` for the later steps. Compared per
bucket: its members (from the optimizer), the bytes its allreduce carried and the algorithm
that ran it (both from the engine's timeline), against ``ddl plan``'s JSON.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ddl.tools import plan

pytest.importorskip("torch")
WORKER = Path(__file__).parent / "workers" / "worker_plan.py"
pytestmark = pytest.mark.mpi


def timeline_buckets(path: Path) -> dict[str, list[tuple[int, str, int]]]:
    """Tensor name -> (bytes, algorithm, tensors) of each allreduce the engine ran for it, in order."""
    events = json.loads(path.read_text())["traceEvents"]
    rows = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "thread_name"}
    out: dict[str, list[tuple[int, str, int]]] = {}
    for e in sorted((e for e in events if e.get("name") == "fused"), key=lambda e: e["ts"]):
        info = e["args"]
        out.setdefault(rows[e["tid"]], []).append((int(info["bytes"]), info["algorithm"], int(info["tensors"])))
    return out


def planned(sizes: list[int], order: list[int] | None, tmp: Path) -> list[dict[str, object]]:
    argv = ["--topology", "1x2", "--calibration", "off", "--model", ",".join(map(str, sizes)), "--step-ms", "100",
            "--bucket-mb", "2.5", "--json", str(tmp)]
    if order is not None:
        argv += ["--order", json.dumps(order)]
    assert plan.main(argv) == 0
    return list(json.loads(tmp.read_text())["step"]["buckets"])


def test_plan_prices_the_buckets_and_algorithms_a_two_rank_torch_run_made(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "trace.json"
    cmd = [sys.executable, "-m", "ddl.launcher.cli", "-np", "2", "--topology", "1x2", "--calibration", "off",
           "--timeline", str(trace), sys.executable, str(WORKER)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = json.loads(re.search(r"^(?:\[\d+\]<stdout>:)?PLAN (.*)$", proc.stdout, re.M)[1])  # type: ignore[index]
    assert run["size"] == 2 and run["order"] == [6, 4, 1, 3, 0, 5, 2]  # the forward's order, reversed
    assert run["first"] != run["last"]  # ddl.torch did re-plan
    reduced = timeline_buckets(trace)
    rows = []
    for step, (members, names, order) in enumerate(((run["first"], run["first_names"], None),
                                                    (run["last"], run["last_names"], run["order"]))):
        predicted = planned(run["sizes"], order, tmp_path / f"plan{step}.json")
        assert [list(b["members"]) for b in predicted] == members, (step, predicted, members)
        for k, (bucket, name) in enumerate(zip(predicted, names, strict=True)):
            carried = reduced[name]
            assert all(t == 1 for _, _, t in carried), f"{name} was fused with another bucket: {carried}"
            assert {(b, a) for b, a, _ in carried} == {(bucket["nbytes"], bucket["algorithm"])}, (name, carried, bucket)
            rows.append((("first step", "after re-planning")[step], k, members[k], bucket["nbytes"],
                         bucket["algorithm"], carried[-1][0], carried[-1][1]))
    algorithms = {a for *_, a in rows}
    assert {"mpi", "ring"} <= algorithms, rows  # the choice depends on the size: a plan pricing MPI otherwise errs
    with capsys.disabled():
        print("\nplan vs 2-rank ddl.torch run (bucket, members, plan bytes / algorithm, run bytes / algorithm):")
        for row in rows:
            print("  {:<17} {} {:<10} {:>9} {:<17} {:>9} {}".format(*(str(v) for v in row)))
