"""``python -m emulation.caffe_rehearsal``: the real ``ddl-caffe train`` on emulated hosts at IBM DDL's compute : link
ratio, with ``layer_wise_reduce`` true and false, beside ``ddl plan``'s prediction (root, from a checkout).

What runs: a ResNet-50 train_val net (``--net``: a model-zoo train_val, or a deploy net made trainable: its input
becomes a Data layer, its Softmax a SoftmaxWithLoss, BatchNorm on batch statistics; default: the generated ResNet-50
of ``tools.caffe.zoo_nets``) reading a local LMDB of random images, ``--batch`` images per rank, SGD with momentum, a
few iterations, one torch thread per rank.

Every emulated host shares this machine's cores, so N ranks on 2 cores each get a fraction of one, and "one rank's
throughput" must be measured in that same state. Scaling efficiency here is therefore

    efficiency = (throughput of the N ranks together) / (N x throughput of one of the N ranks computing alone)
               = T_alone / T_together,

both measured in one job of N ranks (``emulation.paced_caffe --alternate``): blocks of iterations where each rank
keeps its own diffs (its diff exchange set aside) alternate with blocks where the ranks average them, all ranks
starting each block together; the medians of each kind of block (each block's first iteration and the first
iterations of the job left out) are ``T_alone`` and ``T_together``.

Compute that leaves the cores to the network: on 2 cores, the N ranks' compute and the network stack and
reductions of the allreduce compete for the same cores, which DDL's cluster (a GPU per rank, InfiniBand moving the
bytes) did not. So by default every stretch of compute lasts ``--pace``+1 times the CPU time it took, the rest
asleep (:mod:`emulation.paced_caffe`: the real trainer, its clock stretched): the ranks compute as on a device of
their own, and the cores are mostly free for the network. ``--pace 0`` runs ``ddl-caffe`` as it is.

The link keeps IBM DDL's compute : link-time ratio (``--like ddl-p100``, as ``ddl bench rehearsal`` scales it): from
one rank's (paced) iteration time measured alone first, each host's port is shaped to move 2(H-1)/H of the gradient
bytes in that time / 12.35.

Also printed: the share of the reduction's span that ran behind backward (``ddl-caffe train``'s own figure: from the
first bucket sent to the last result back, the part before backward ended), and ``ddl plan``'s step and efficiency for
the same cluster (the calibration ``init`` measured there, the net's gradients, ``T_compute`` as the step), with
overlap and without.

Example:
    python -m emulation.caffe_rehearsal --hosts 8 --ranks-per-host 2 --batch 1 --iterations 8 \\
        --net /path/to/ResNet-50-deploy.prototxt --out bench-results
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from emulation.cluster import Cluster
from emulation.rehearsal import CoreWatch, Sampler, qdisc_drops, retransmissions

ROOT = Path(__file__).resolve().parents[1]
#: One iteration's line as ddl-caffe (and Caffe) logs it with ``display: 1``, and its glog time stamp.
_ITERATION = re.compile(r"^I\S* (\d\d):(\d\d):(\d\d\.\d+) .*\] Iteration (\d+) \(\S+ iter/s, (\S+)s/1 iters\)", re.M)
_EXCHANGE = re.compile(r"diffs averaged (.*?): ([\d.]+) ms per iteration from the first bucket sent to the last result "
                       r"back, ([\d.]+) ms of it after backward \(([\d.]+) % hidden")
WARMUP = 2  # iterations left out of every timing: the first builds buffers and the ranks agree on the bucket order


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m emulation.caffe_rehearsal", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", type=int, default=8)
    p.add_argument("--ranks-per-host", type=int, default=2)
    p.add_argument("--net", help="a train_val or deploy prototxt (default: the generated ResNet-50)")
    p.add_argument("--batch", type=int, default=1, help="images per rank per iteration")
    p.add_argument("--iterations", type=int, default=14, help=f"per run; the first {WARMUP} are not timed")
    p.add_argument("--block", type=int, default=3,
                   help="iterations per block: blocks alone (each rank's diffs its own) and together alternate, the "
                        "first alone; each block's first iteration is not timed")
    p.add_argument("--like", default="ddl-p100", help="the cluster whose compute : link ratio to keep")
    p.add_argument("--link", help="per-host port rate (default: scaled from the measured compute by --like)")
    p.add_argument("--layer-wise", default="true,false", help="layer_wise_reduce settings to run, in order")
    p.add_argument("--pace", default="auto",
                   help="each stretch of compute lasts PACE+1 times its CPU time (emulation.paced_caffe), so that the "
                        "ranks' compute leaves the cores to the network; auto: K+1 = 4 x ranks / cores; 0: ddl-caffe "
                        "as it is, compute and network sharing the cores")
    p.add_argument("--rounds", type=int, default=1, help="rounds of the settings, each on a fresh cluster")
    p.add_argument("--queue", default="100ms", help="tbf latency (the port's queue), as emulation.rehearsal")
    p.add_argument("--memory-margin", type=float, default=0.9,
                   help="refuse to start when the ranks' estimated memory exceeds this share of MemAvailable")
    p.add_argument("--out", default="bench-results")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per run")
    p.add_argument("--report", nargs="+", metavar="JSON", help="only print the table of these runs' JSON files")
    p.add_argument("--plot", metavar="PNG", help="with --report: also plot efficiency against hosts")
    return p


# -- the net, its data and solvers ----------------------------------------------------------------------------------
def trainable_net(path: str | None, batch: int, folder: Path) -> Any:
    """The NetParameter to train: ``path`` made trainable (see the module doc) or the generated ResNet-50, its Data
    layer reading a local LMDB of random images; TEST-phase layers dropped (the rehearsal does not test)."""
    from ddl.caffe.formats import schema
    from ddl.caffe.formats.protofile import parse_text, read_net
    from ddl.caffe.formats.upgrade import upgrade_net
    from tools.caffe import zoo_nets
    from tools.caffe.zoo_data import point_at_synthetic_data

    if path:
        net = read_net(path)
        upgrade_net(net, source=path)
    else:
        net = parse_text(zoo_nets.train_val(zoo_nets.resnet(50, batch)), schema.NetParameter())
    kept = [lp for lp in net.layer if not any(r.HasField("phase") and r.phase == schema.TEST for r in lp.include)]
    del net.layer[:]
    net.layer.extend(kept)
    for lp in list(net.layer):
        if lp.type == "Input":
            shape = [int(d) for d in lp.input_param.shape[0].dim]
            data = schema.LayerParameter(name=lp.name, type="Data", top=[lp.top[0], "label"])
            data.data_param.batch_size, data.data_param.backend = batch, 1
            data.data_param.source = "synthetic"  # replaced by point_at_synthetic_data
            data.transform_param.crop_size = shape[2]  # random crops of larger random images
            data.transform_param.mean_value.extend([104, 117, 123])
            net.layer.insert(list(net.layer).index(lp), data)
            net.layer.remove(lp)
        elif lp.type == "Softmax" and lp is net.layer[-1]:
            loss = schema.LayerParameter(name="loss", type="SoftmaxWithLoss", bottom=[lp.bottom[0], "label"],
                                         top=["loss"])
            net.layer.remove(lp)
            net.layer.append(loss)
        elif lp.type == "BatchNorm":
            lp.batch_norm_param.ClearField("use_global_stats")  # train from scratch: batch statistics, as DDL did
    if not any(lp.type == "Data" for lp in net.layer):
        raise SystemExit(f"caffe_rehearsal: {path or 'the net'} has no Data or Input layer to feed")
    point_at_synthetic_data(net, folder, records=64, keep_batch=True)
    for lp in net.layer:
        if lp.type == "Data":
            lp.data_param.batch_size = batch
    return net


def write_solvers(net: Any, folder: Path, iterations: int, settings: list[bool]) -> dict[bool, Path]:
    """One solver per ``layer_wise_reduce`` setting: SGD with momentum, a display line per iteration, no snapshots."""
    from google.protobuf import text_format

    net_path = folder / "train_val.prototxt"
    net_path.write_text(text_format.MessageToString(net))
    out = {}
    for layer_wise in settings:
        path = folder / f"solver_lw{int(layer_wise)}.prototxt"
        path.write_text(f'net: "{net_path}"\nbase_lr: 0.001\nmomentum: 0.9\nweight_decay: 0.0001\nlr_policy: "fixed"\n'
                        f'display: 1\nmax_iter: {iterations}\nsnapshot: 0\nsnapshot_after_train: false\n'
                        f'random_seed: 1\nlayer_wise_reduce: {str(layer_wise).lower()}\n')
        out[layer_wise] = path
    return out


def gradient_sizes(net: Any) -> list[int]:
    """Elements of each blob the solver reduces (learnable, lr_mult > 0), in the net's parameter order."""
    import torch

    from ddl.caffe.formats import schema
    from ddl.caffe.net.net import Net

    built = Net(net, schema.TRAIN, gen=torch.Generator().manual_seed(0), quiet=True)
    return [p.tensor.numel() for p in built.params if p.tensor.requires_grad]


# -- timing from the logs --------------------------------------------------------------------------------------------
def iterations(log: str) -> list[tuple[float, int, float]]:
    """(time of day in s, iteration, seconds since the previous display line) of every ``display: 1`` line."""
    out = []
    for m in _ITERATION.finditer(log):
        h, mi, s, it, lapse = m.groups()
        out.append((int(h) * 3600 + int(mi) * 60 + float(s), int(it), float(lapse)))
    return out


def steady_seconds(log: str) -> float:
    """The median iteration time of one log after the warm-up."""
    timed = [lapse for _, it, lapse in iterations(log) if it >= WARMUP]
    if not timed:
        raise RuntimeError("a run logged no timed iteration; give more --iterations")
    return statistics.median(timed)


# -- the runs ---------------------------------------------------------------------------------------------------------
class MemoryWatch(Sampler):
    """The largest sum of resident memory over the processes named ``ddl-caffe``/python children while a run lasts."""

    def __init__(self, pids: list[int]) -> None:
        super().__init__(0.5)
        self.pids, self.peak = pids, 0

    def sample(self) -> None:
        total = 0
        for pid in self.pids:
            try:
                text = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            m = re.search(r"RssAnon:\s+(\d+) kB", text)
            total += int(m.group(1)) * 1024 if m else 0
        self.peak = max(self.peak, total)


def mem_available() -> int:
    text = Path("/proc/meminfo").read_text()
    return int(re.search(r"MemAvailable:\s+(\d+) kB", text).group(1)) * 1024  # type: ignore[union-attr]


def train_cmd(solver: Path, pace: float, block: int | None = None) -> list[str]:
    """``ddl-caffe train`` on one torch thread, paced by :mod:`emulation.paced_caffe` (``pace`` 0: not at all);
    with ``block``, alternating blocks of iterations alone and with the other ranks."""
    alternating = ["--alternate", str(block)] if block else []
    return [sys.executable, "-m", "emulation.paced_caffe", "--pace", f"{pace:g}", *alternating, "train", "--solver",
            str(solver), "--threads", "1"]


def auto_pace(ranks: int, cores: int) -> float:
    """A pace that leaves three quarters of the cores free on average (``ranks`` ranks computing 1/(K+1) of the time
    use ``ranks``/(K+1) cores) and keeps a stretch's due time beyond what the ranks' own contention and a shared
    machine's load make it take: K+1 = 4 x ranks / cores."""
    return float(max(0, -(-4 * ranks // cores) - 1))


def one_rank(solver: Path, pace: float, timeout: float) -> tuple[float, int]:
    """One rank alone: (its steady iteration time, its peak private memory in bytes)."""
    proc = subprocess.Popen([*train_cmd(solver, pace), "--iterations", str(WARMUP + 3)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    with MemoryWatch([proc.pid]) as mem:
        out, _ = proc.communicate(timeout=timeout)
    if proc.returncode:
        raise RuntimeError(f"one rank failed:\n{out[-3000:]}")
    return steady_seconds(out), mem.peak


def split_blocks(log: str, block: int) -> tuple[list[float], list[float]]:
    """Rank 0's iteration times in the blocks computing alone and in those averaging diffs (``--alternate``): the
    warm-up and each block's first iteration (the switch, the barrier) left out."""
    alone, together = [], []
    for _, it, lapse in iterations(log):
        if it < WARMUP or it % block == 0:
            continue
        (alone if (it // block) % 2 == 0 else together).append(lapse)
    return alone, together


def distributed(cluster: Cluster, solver: Path, calibration: Path, pace: float, block: int,
                timeout: float) -> dict[str, Any]:
    """The N-rank ``ddl-caffe train`` on the cluster, alternating blocks alone and together: the median iteration
    time of each, the exchange's own figures, what the links and cores did."""
    ranks = len(cluster.hosts) * cluster.ranks_per_host
    argv = [sys.executable, "-m", "ddl.launcher.cli", "-np", str(ranks), "-H", cluster.host_list(), "--calibration",
            str(calibration), *train_cmd(solver, pace, block)]
    before, drops0, resent0 = cluster.counters(), qdisc_drops(cluster), retransmissions(cluster)
    with CoreWatch() as cores:
        proc = subprocess.run(cluster.launch_argv(argv), env=cluster.env(), capture_output=True, text=True,
                              timeout=timeout, cwd=ROOT)
    after = cluster.counters()
    log = proc.stdout + proc.stderr
    if proc.returncode:
        raise RuntimeError(f"the {ranks}-rank job failed ({proc.returncode}):\n{log[-4000:]}")
    alone, together = split_blocks(log, block)
    if not alone or not together:
        raise RuntimeError(f"the {ranks}-rank job timed no iteration alone or together; give more --iterations")
    m = _EXCHANGE.search(log)
    return {"compute_s": statistics.median(alone), "step_s": statistics.median(together), "alone_s": alone,
            "together_s": together, "cores": cores.shares(),
            "exchange": {"how": m.group(1), "span_ms": float(m.group(2)), "exposed_ms": float(m.group(3)),
                         "hidden_percent": float(m.group(4))} if m else None,
            "veth_bytes": {h: [after[h][0] - before[h][0], after[h][1] - before[h][1]] for h in after},
            "tbf_drops": sum(qdisc_drops(cluster).values()) - sum(drops0.values()),
            "tcp_retransmissions": retransmissions(cluster) - resent0}


def link_rate(gradient_bytes: int, hosts: int, compute_s: float, like: str) -> float:
    """Bytes/s per port that make compute : link time ``like``'s (the link time of one allreduce of the gradients)."""
    from ddl_bench.rehearsal import REFERENCES, link_bound

    from ddl.tools import plan

    ref = REFERENCES[like]
    ratio = ref.step_ms / 1e3 / link_bound(gradient_bytes, ref.hosts, plan.parse_bandwidth(ref.link))
    return 2 * (hosts - 1) / hosts * gradient_bytes / (compute_s / ratio)


def predicted(sizes: list[int], hosts: int, ranks_per_host: int, calibration: Path, compute_s: float) -> dict[str, float]:
    """``ddl plan``'s step and efficiency, with overlap and without, for this cluster (the topology its ranks saw,
    built from their host names; the cost model ``init`` calibrated there), net and compute."""
    from ddl.base.config import DEFAULT_SEGMENT_BYTES
    from ddl.base.topology import build_topology
    from ddl.reduction.buckets import BUCKET_BYTES, FIRST_BUCKET_BYTES
    from ddl.tools import plan

    topology = build_topology(0, [f"h{r // ranks_per_host}" for r in range(hosts * ranks_per_host)], None)
    model, _ = plan.model_from_calibration(calibration, topology, segment_bytes=DEFAULT_SEGMENT_BYTES)
    if not model.native_points:
        model = plan.with_native_estimate(model, topology)
    planned = plan.plan_step(sizes, 4, topology, model, step=compute_s, backward_fraction=2 / 3,
                             first_cap=FIRST_BUCKET_BYTES, cap=BUCKET_BYTES,
                             inline_bytes=plan.engine_inline_bytes(topology))
    comm = sum(r.end - r.start for r in planned.reductions)
    step = max(compute_s, planned.end)
    return {"step_s": step, "efficiency": compute_s / step, "step_no_overlap_s": compute_s + comm,
            "efficiency_no_overlap": compute_s / (compute_s + comm), "allreduce_s": comm,
            "dims": "x".join(map(str, topology.dims))}


def report(paths: list[str], plot: str | None) -> int:
    """The table of several runs' JSON records (and, with ``plot``, efficiency against hosts)."""
    records = [json.loads(Path(p).read_text()) for p in paths]
    print("\n".join(table(records)))
    if plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6.4, 4.0))
        for lw, style in (("true", "o-"), ("false", "s--")):
            pts = sorted((rec["hosts"], 100 * row["runs"][lw]["efficiency"]) for rec in records
                         for row in rec["rounds"] if lw in row["runs"])
            plan = sorted((rec["hosts"], 100 * (row["runs"][lw]["plan"]["efficiency"] if lw == "true" else
                                                row["runs"][lw]["plan"]["efficiency_no_overlap"]))
                          for rec in records for row in rec["rounds"] if lw in row["runs"])
            label = "layer_wise_reduce: " + lw
            if pts:
                ax.plot(*zip(*pts, strict=True), style, label=f"{label}, measured")
                ax.plot(*zip(*plan, strict=True), style[0] + ":", alpha=0.6, label=f"{label}, ddl plan")
        ax.set_xlabel("emulated hosts")
        ax.set_ylabel("scaling efficiency, %")
        ax.set_title("ddl-caffe train, ResNet-50, at DDL's compute : link ratio")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(plot, dpi=110)
        print(f"wrote {plot}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.report:
        return report(args.report, args.plot)
    from emulation.cluster import unavailable_reason

    reason = unavailable_reason()
    if reason:
        print(f"caffe_rehearsal: {reason}", file=sys.stderr)
        return 2
    settings = [s.strip().lower() == "true" for s in args.layer_wise.split(",")]
    ranks = args.hosts * args.ranks_per_host
    dims = f"{args.ranks_per_host}x{args.hosts}" if args.ranks_per_host > 1 else str(args.hosts)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    pace = auto_pace(ranks, os.cpu_count() or 1) if args.pace == "auto" else float(args.pace)
    stem = f"caffe-rehearsal-{dims}-b{args.batch}-pace{pace:g}"
    with tempfile.TemporaryDirectory(prefix="caffe-rehearsal-") as tmp:
        work = Path(tmp)
        net = trainable_net(args.net, args.batch, work)
        solvers = write_solvers(net, work, args.iterations, settings)
        sizes = gradient_sizes(net)
        grad_bytes = 4 * sum(sizes)
        print(f"net {net.name}: {len(sizes)} reduced blobs, {grad_bytes / 2**20:.1f} MiB; batch {args.batch} per rank; "
              f"{ranks} ranks ({dims}); load average {os.getloadavg()[0]:.1f}", flush=True)
        alone, private = one_rank(solvers[settings[0]], pace, args.timeout)
        need, have = ranks * (private + grad_bytes), mem_available()  # + the exchange's bucket buffers
        print(f"pace {pace:g}; one rank alone: {alone:.3f} s per iteration, {private / 2**20:.0f} MiB private memory; {ranks} ranks "
              f"need ~{need / 2**30:.1f} GiB, MemAvailable {have / 2**30:.1f} GiB", flush=True)
        if need > args.memory_margin * have:
            print(f"caffe_rehearsal: {ranks} ranks of ~{(private + grad_bytes) / 2**20:.0f} MiB each do not fit in "
                  f"{args.memory_margin:.0%} of the {have / 2**30:.1f} GiB available; use fewer ranks per host or a "
                  "smaller --batch", file=sys.stderr)
            return 3
        record: dict[str, Any] = {"net": args.net or "generated ResNet-50 (tools.caffe.zoo_nets)", "hosts": args.hosts,
                                  "ranks_per_host": args.ranks_per_host, "batch": args.batch, "ranks": ranks,
                                  "gradient_bytes": grad_bytes, "blobs": len(sizes), "one_rank_s": alone,
                                  "private_bytes": private, "like": args.like, "pace": pace, "rounds": []}
        rate = args.link or f"{max(1, int(link_rate(grad_bytes, args.hosts, alone, args.like) * 8 / 1e6))}mbit"
        record["link"] = rate
        for r in range(args.rounds):
            row: dict[str, Any] = {"load_start": os.getloadavg()[0], "runs": {}}
            calibration = out / f"{stem}-calibration-{r}.json"  # kept: ddl plan can price the run again
            with Cluster(hosts=args.hosts, ranks_per_host=args.ranks_per_host, rate=rate, burst="128kb",
                         latency=args.queue) as cluster:
                for layer_wise in settings:
                    got = distributed(cluster, solvers[layer_wise], calibration, pace, args.block, args.timeout)
                    got["efficiency"] = got["compute_s"] / got["step_s"]
                    got["plan"] = predicted(sizes, args.hosts, args.ranks_per_host, calibration, got["compute_s"])
                    row["runs"][str(layer_wise).lower()] = got
                    hidden = got["exchange"]["hidden_percent"] if got["exchange"] else float("nan")
                    print(f"round {r + 1}: layer_wise_reduce {str(layer_wise).lower()}: alone {got['compute_s']:.3f} "
                          f"s, together {got['step_s']:.3f} s per iteration: efficiency {got['efficiency']:.1%}, "
                          f"{hidden:.0f} % of the reduction hidden behind backward", flush=True)
            row["load_end"] = os.getloadavg()[0]
            record["rounds"].append(row)
    (out / f"{stem}.json").write_text(json.dumps(record, indent=1))
    print("\n".join(table([record])))
    return 0


def table(records: list[dict[str, Any]]) -> list[str]:
    """One row per (cluster, round, layer_wise_reduce): measured and ``ddl plan``'s figures."""
    lines = [f"{'hosts x ranks':>13} {'batch':>5} {'pace':>4} {'link':>9} {'layer_wise':>10} {'alone s':>8} "
             f"{'step s':>8} {'eff %':>6} {'hidden %':>8} {'plan s':>8} {'plan %':>6} {'m/p':>5} {'load':>9}"]
    for rec in records:
        for row in rec["rounds"]:
            for lw, got in row["runs"].items():
                plan = got["plan"]
                plan_s = plan["step_s"] if lw == "true" else plan["step_no_overlap_s"]
                plan_e = plan["efficiency"] if lw == "true" else plan["efficiency_no_overlap"]
                hidden = got["exchange"]["hidden_percent"] if got.get("exchange") else float("nan")
                # the 1-minute load average when the round began and ended, and when each job ended
                loads = [row["load_start"], row["load_end"]] + [g["cores"].get("load_average", row["load_start"])
                                                                for g in row["runs"].values()]
                lines.append(f"{rec['hosts']:>7} x {rec['ranks_per_host']:<3} {rec['batch']:>5} {rec['pace']:>4g} "
                             f"{rec['link']:>9} {lw:>10} {got['compute_s']:8.3f} {got['step_s']:8.3f} "
                             f"{100 * got['efficiency']:6.1f} {hidden:8.0f} {plan_s:8.3f} {100 * plan_e:6.1f} "
                             f"{got['step_s'] / plan_s:5.2f} {min(loads):4.1f}-{max(loads):<4.1f}")
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
