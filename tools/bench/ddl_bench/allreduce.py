"""``ddl bench allreduce``: every algorithm, auto and the peers, in one run.

Float32 sums over sizes 4 KiB ... 256 MiB (powers of 4). Per size and contender: the
median over repeats of the slowest rank's time, algbw = bytes / time and busbw =
algbw * 2(p-1)/p (as nccl-tests report them), and a check of the result. Prints a
table, writes JSON and a PNG plot (busbw against size). ``--fused N`` compares N
tensors of size S submitted asynchronously with one tensor of N*S. ``-np N`` re-launches it
on N ranks of this host under ``ddlrun``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import ddl
from ddl.engine.codec import inline_capacity
from ddl.reduction.algorithms import SCHEDULED
from ddl.tools.arg_types import amount, count
from ddl.tools.helptext import plain
from ddl_bench import peers

ALGORITHMS = ["mpi", "ring", "multiring", "halving_doubling", "shm", "auto"]


def sizes(lo: int, hi: int) -> list[int]:
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= 4
    return out


def timed(comm: Any, fn: Callable[[], Any], *, budget: float, max_reps: int) -> tuple[float, Any]:
    """Median of the slowest rank's time over repeats that fit ``budget`` seconds."""
    from mpi4py import MPI

    result = fn()  # warm-up, and the result that is checked
    comm.Barrier()
    t0 = time.perf_counter()
    fn()
    first = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
    reps = int(max(3, min(max_reps, budget / max(first, 1e-6))))
    reps = comm.bcast(reps, root=0)
    times = []
    for _ in range(reps):
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        times.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    return statistics.median(times), result


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ddl bench allreduce", description=plain(__doc__))
    parser.add_argument("-np", dest="np", type=count(), help="re-launch on N ranks of this host under ddlrun")
    parser.add_argument("--min-bytes", type=count(), default=4 << 10)
    parser.add_argument("--max-bytes", type=count(), default=256 << 20)
    parser.add_argument("--sizes", type=lambda v: [int(x) for x in v.split(",")], default=None, metavar="B,B,...",
                        help="exact sizes in bytes, multiples of 4 (instead of powers of 4 from --min-bytes)")
    parser.add_argument("--budget", type=amount, default=0.4, help="seconds of repeats per size and contender")
    parser.add_argument("--max-reps", type=count(), default=50)
    parser.add_argument("--rounds", type=count(), default=3, help="interleaved rounds per size (median of them)")
    parser.add_argument("--fused", type=count(0), default=0, metavar="N", help="also compare N async tensors with one")
    parser.add_argument("--fused-bytes", type=count(4), default=16 << 10, metavar="S")
    parser.add_argument("--no-inplace", action="store_true",
                        help="skip the in-place, back-to-back table (ddl.allreduce_ against MPI's IN_PLACE)")
    parser.add_argument("--no-gloo", "--no-peers", dest="no_peers", action="store_true",
                        help="skip the peers adapters register (torch-gloo)")
    parser.add_argument("--out", default="bench-results", help="folder for the JSON and the PNG")
    return parser


def main(argv: list[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    # Checked here, before ranks start or a peer's framework is imported (torch: seconds).
    if "-np" in args_list:
        i = args_list.index("-np")
        ranks = _ranks(args_list, i)
        if ranks is None:
            return 2
        _checked(parser, parser.parse_args(args_list[:i] + args_list[i + 2 :]))
        return _relaunch(ranks, args_list[:i] + args_list[i + 2 :])
    args = _checked(parser, parser.parse_args(args_list))

    from mpi4py import MPI

    t_init = time.perf_counter()
    ddl.init()
    t_init = time.perf_counter() - t_init
    comm = MPI.COMM_WORLD.Dup()
    rank, p = comm.Get_rank(), comm.Get_size()
    runnable = [a for a in ALGORITHMS if a not in SCHEDULED or SCHEDULED[a].unavailable(ddl.topology()) is None]
    contenders: dict[str, Callable[[np.ndarray], np.ndarray]] = {f"ddl:{a}": ddl_allreduce(a) for a in runnable}
    contenders["MPI_Allreduce"] = peers.mpi_allreduce(comm)
    cal = ddl.context().calibration
    notes = [f"ddl.init {t_init * 1e3:.0f} ms; {cal.describe() if cal else 'no calibration'}"]
    if not args.no_peers:
        for name, (peer, why) in peers.registered(comm).items():
            if peer is None:
                notes.append(f"{name} skipped: {why}")
            else:
                contenders[name] = peer
    rows = []
    expected = p * (p + 1) / 2
    for nbytes in args.sizes or sizes(args.min_bytes, args.max_bytes):
        x = np.full(nbytes // 4, rank + 1, np.float32)
        # Rounds interleave the contenders, so a burst of noise hits them all alike.
        per: dict[str, list[float]] = {name: [] for name in contenders}
        results: dict[str, Any] = {}
        for _ in range(args.rounds):
            for name, fn in contenders.items():
                t, results[name] = timed(comm, bind(fn, x), budget=args.budget / args.rounds,
                                         max_reps=args.max_reps)
                per[name].append(t)
        for name in contenders:
            t, y = statistics.median(per[name]), results[name]
            ok = bool(comm.allreduce(bool(np.all(y == expected)), op=MPI.LAND))
            algbw = nbytes / t / 1e9
            resolved = ""
            if name == "ddl:auto":
                # from 65 ranks: no payloads; from 17, 88 bytes unless the records are shared
                inline = p > 1 and nbytes <= inline_capacity(p, ddl.context().comm.shared_negotiation)
                resolved = "inline" if inline else auto_choice(ddl.context(), nbytes)
            rows.append({"bytes": nbytes, "contender": name, "time_s": t, "algbw_GBps": algbw,
                         "busbw_GBps": algbw * 2 * (p - 1) / p if p > 1 else algbw, "correct": ok,
                         "auto_picked": resolved})
        del x
    sizes_run = args.sizes or sizes(args.min_bytes, args.max_bytes)
    inplace_rows = [] if args.no_inplace else run_inplace(comm, sizes_run, args.rounds, args.budget)
    fused_rows = run_fused(comm, args.fused, args.fused_bytes) if args.fused else []
    if rank == 0:
        report(rows, fused_rows, p, notes, Path(args.out), inplace_rows)
    ddl.shutdown()
    return 0 if all(r["correct"] for r in rows + inplace_rows) else 1


def auto_choice(ctx: Any, nbytes: int) -> str:
    """What auto ran at ``nbytes`` float32: init's pick, or what its trials settled on instead."""
    from ddl.reduction import cost

    picked: str = ctx.resolve_algorithm("auto", nbytes // 4, 4)
    settled = ctx.trials.overridden.get((cost.size_class(nbytes), 4)) if ctx.trials is not None else None
    return f"{settled} (trials; init {picked})" if settled else picked


def ddl_allreduce(algorithm: str) -> Callable[[np.ndarray], np.ndarray]:
    def run(x: np.ndarray) -> np.ndarray:
        return ddl.allreduce(x, op=ddl.Sum, algorithm=algorithm)

    return run


def bind(fn: Callable[[np.ndarray], np.ndarray], x: np.ndarray) -> Callable[[], np.ndarray]:
    def run() -> np.ndarray:
        return fn(x)

    return run


def timed_loop(comm: Any, fn: Callable[[], Any], *, budget: float) -> float:
    """Seconds per call of ``fn`` called back to back after one barrier (the slowest rank's):
    a training loop's steady state, where a call starts as soon as the last one ended."""
    from mpi4py import MPI

    fn()
    comm.Barrier()
    t0 = time.perf_counter()
    fn()
    first = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
    calls = comm.bcast(int(max(3, min(2000, budget / max(first, 1e-7)))), root=0)
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return float(comm.allreduce((time.perf_counter() - t0) / calls, op=MPI.MAX))


def inplace_contenders(comm: Any, buf: np.ndarray) -> dict[str, Callable[[], Any]]:
    from mpi4py import MPI

    def ddl_inplace() -> None:
        ddl.allreduce_(buf, op=ddl.Sum)

    def mpi_inplace() -> None:
        comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)

    return {"ddl:auto in place": ddl_inplace, "MPI in place": mpi_inplace}


def run_inplace(comm: Any, nbytes_list: list[int], rounds: int, budget: float) -> list[dict[str, Any]]:
    """``ddl.allreduce_`` (auto) against MPI's ``Allreduce(IN_PLACE)`` on the same buffer,
    back to back, as frameworks call them (a gradient bucket, SyncBatchNorm's statistics),
    interleaved in rounds whose order alternates. The buffer holds zeros while timed, so
    repeated sums stay finite; the result is checked on one call of fresh data."""
    from mpi4py import MPI

    rank, p = comm.Get_rank(), comm.Get_size()
    out = []
    for nbytes in nbytes_list:
        buf = np.zeros(nbytes // 4, np.float32)
        contenders = inplace_contenders(comm, buf)
        per: dict[str, list[float]] = {name: [] for name in contenders}
        for r in range(max(rounds, 2)):
            order = list(contenders) if r % 2 == 0 else list(reversed(contenders))
            for name in order:
                per[name].append(timed_loop(comm, contenders[name], budget=budget / max(rounds, 2)))
        buf[...] = rank + 1
        ddl.allreduce_(buf, op=ddl.Sum)
        ok = bool(comm.allreduce(bool(np.all(buf == p * (p + 1) / 2)), op=MPI.LAND))
        t_ddl, t_mpi = statistics.median(per["ddl:auto in place"]), statistics.median(per["MPI in place"])
        out.append({"bytes": nbytes, "time_ddl_s": t_ddl, "time_mpi_s": t_mpi, "ratio": t_ddl / t_mpi,
                    "ratios": [a / b for a, b in zip(per["ddl:auto in place"], per["MPI in place"], strict=True)],
                    "correct": ok})
    return out


def run_fused(comm: Any, n: int, nbytes: int) -> list[dict[str, Any]]:
    """N async tensors against one of N*S (interleaved repeats: same noise for both),
    the engine's extra memory for the N, and what one negotiation cycle costs."""
    import tracemalloc

    from ddl.runtime import lifecycle as runtime
    xs = [np.ones(nbytes // 4, np.float32) for _ in range(n)]
    one = np.ones(n * nbytes // 4, np.float32)
    eng = runtime.engine()

    def many() -> list[np.ndarray]:
        hs = [ddl.allreduce_async(x, op=ddl.Sum, name=f"f{i}") for i, x in enumerate(xs)]
        return [h.wait() for h in hs]

    def grouped() -> list[np.ndarray]:
        return ddl.grouped_allreduce_async(xs, op=ddl.Sum, name="grouped").wait()  # type: ignore[no-any-return]

    t_many, t_one, t_grouped, cycles = [], [], [], []
    for _ in range(5):
        c0 = eng.cycles
        t_many.append(timed(comm, many, budget=0.3, max_reps=10)[0])
        cycles.append((eng.cycles - c0) / 11)
        t_one.append(timed(comm, bind(ddl_allreduce("auto"), one), budget=0.3, max_reps=10)[0])
        t_grouped.append(timed(comm, grouped, budget=0.3, max_reps=10)[0])
    comm.Barrier()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    results = many()
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    out_bytes = sum(r.nbytes for r in results)
    del results
    comm.Barrier()
    cycle = eng.time_cycle()
    from mpi4py import MPI

    cycle = comm.allreduce(cycle, op=MPI.MAX)
    extra = comm.allreduce(peak - out_bytes, op=MPI.MAX)
    tm, to, tg = statistics.median(t_many), statistics.median(t_one), statistics.median(t_grouped)
    return [{"tensors": n, "bytes_each": nbytes, "time_async_s": tm, "time_one_s": to, "ratio": tm / to,
             "ratios": [a / b for a, b in zip(t_many, t_one, strict=True)],
             "time_grouped_s": tg, "grouped_ratio": tg / to,
             "grouped_ratios": [a / b for a, b in zip(t_grouped, t_one, strict=True)], "cycle_s": cycle,
             "cycles_per_step": statistics.median(cycles), "cycle_bytes": eng.cycle_bytes(),
             "cycle_protocol": "compact allreduce" if eng.exchange.compact else "gathered records",
             "peak_traced_bytes": peak, "result_bytes": out_bytes,
             "extra_bytes": extra, "largest_fused_bytes": min(n * nbytes, runtime.engine().fusion_threshold)}]


def _checked(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """``args``, or exit 2 with argparse's usage line naming what is wrong."""
    if args.sizes and any(b <= 0 or b % 4 for b in args.sizes):
        parser.error(f"--sizes takes positive multiples of 4 bytes (float32), got {args.sizes}")
    return args


def _ranks(argv: list[str], i: int) -> int | None:
    """The N of ``-np N`` at ``argv[i]`` (None, said on stderr: not a whole number)."""
    try:
        return int(argv[i + 1])
    except (IndexError, ValueError):
        print("ddl bench allreduce: -np needs a whole number of ranks, e.g. -np 2", file=sys.stderr)
        return None


def _relaunch(ranks: int, rest: list[str]) -> int:
    """This benchmark with the arguments ``rest`` on ``ranks`` ranks, ddlrun running in this process."""
    from ddl.launcher.cli import main as ddlrun
    from ddl.launcher.relaunch import relaunch_argv

    return ddlrun(relaunch_argv(ranks, ["-m", "ddl_bench.allreduce", *rest])[3:])


def report(rows: list[dict[str, Any]], fused: list[dict[str, Any]], p: int, notes: list[str], out: Path,
           inplace: list[dict[str, Any]] | None = None) -> None:
    names = list(dict.fromkeys(r["contender"] for r in rows))
    print(f"allreduce float32 sum, {p} ranks — busbw GB/s (time ms); * = result wrong")
    print(f"{'size':>9} " + " ".join(f"{n:>20}" for n in names) + "   auto/best  auto picked")
    for nbytes in dict.fromkeys(r["bytes"] for r in rows):
        cells, picked = [], ""
        for n in names:
            r = next(r for r in rows if r["bytes"] == nbytes and r["contender"] == n)
            cells.append(f"{r['busbw_GBps']:8.3f} ({r['time_s'] * 1e3:8.3f}){'' if r['correct'] else '*'}")
            picked = r["auto_picked"] or picked
        at = {r["contender"]: r["time_s"] for r in rows if r["bytes"] == nbytes}
        best = min(t for n, t in at.items() if n.startswith("ddl:") and n != "ddl:auto")
        print(f"{human(nbytes):>9} " + " ".join(f"{c:>20}" for c in cells) + f"   {at['ddl:auto'] / best:9.2f}  {picked}")
    for f in fused:
        print(f"fusion: {f['tensors']} x {human(f['bytes_each'])} async {f['time_async_s'] * 1e3:.2f} ms vs one "
              f"{human(f['tensors'] * f['bytes_each'])} {f['time_one_s'] * 1e3:.2f} ms: ratio {f['ratio']:.2f} "
              f"(per round: {', '.join(f'{r:.2f}' for r in f['ratios'])})")
        print(f"fusion: the same {f['tensors']} as one grouped_allreduce_async {f['time_grouped_s'] * 1e3:.2f} ms: "
              f"ratio {f['grouped_ratio']:.2f} (per round: {', '.join(f'{r:.2f}' for r in f['grouped_ratios'])})")
        print(f"checks: one negotiation cycle {f['cycle_s'] * 1e6:.0f} us and {f['cycle_bytes']} bytes per rank "
              f"({f['cycle_protocol']}), {f['cycles_per_step']:.1f} cycles a "
              f"step = {f['cycle_s'] * f['cycles_per_step'] / f['time_async_s'] * 100:.1f} % of the step")
        print(f"memory: peak {f['peak_traced_bytes'] / 2**20:.2f} MiB traced during the step, results "
              f"{f['result_bytes'] / 2**20:.2f} MiB: extra {f['extra_bytes'] / 2**20:.2f} MiB = "
              f"{f['extra_bytes'] / f['largest_fused_bytes']:.2f}x the largest fused buffer")
    if inplace:
        print(f"in place, back to back (ddl.allreduce_ vs MPI Allreduce IN_PLACE), {p} ranks; * = result wrong")
        print(f"{'size':>9} {'ddl us':>11} {'MPI us':>11} {'ddl/MPI':>8}  per round")
        for r in inplace:
            rounds = " ".join(f"{x:.2f}" for x in r["ratios"])
            print(f"{human(r['bytes']):>9} {r['time_ddl_s'] * 1e6:11.1f} {r['time_mpi_s'] * 1e6:11.1f} "
                  f"{r['ratio']:8.2f}{'' if r['correct'] else '*'}  {rounds}")
    summarize(rows)
    for note in notes:
        print(note)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"allreduce-np{p}"
    stem.with_suffix(".json").write_text(json.dumps({"ranks": p, "rows": rows, "fused": fused, "inplace": inplace or [],
                                                     "notes": notes}, indent=1))
    plot(rows, names, p, stem.with_suffix(".png"))
    print(f"wrote {stem}.json and {stem}.png")


def summarize(rows: list[dict[str, Any]]) -> None:
    """auto against the best fixed algorithm and against MPI's own allreduce, per size."""
    worst = 0.0
    line = []
    for nbytes in dict.fromkeys(r["bytes"] for r in rows):
        at = {r["contender"]: r["time_s"] for r in rows if r["bytes"] == nbytes}
        best = min(t for n, t in at.items() if n.startswith("ddl:") and n != "ddl:auto")
        worst = max(worst, at["ddl:auto"] / best)
        if "MPI_Allreduce" in at:
            line.append(f"{human(nbytes)} {at['ddl:auto'] / at['MPI_Allreduce']:.2f}x")
    if line:
        print("auto / MPI_Allreduce time: " + ", ".join(line))
    print(f"auto vs best fixed algorithm: worst {worst:.2f}x over all sizes")


def plot(rows: list[dict[str, Any]], names: list[str], p: int, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    fig, ax = plt.subplots(figsize=(8, 5))
    for n in names:
        pts = [(r["bytes"], r["busbw_GBps"]) for r in rows if r["contender"] == n]
        ax.plot([a for a, _ in pts], [b for _, b in pts], marker="o", label=n,
                linewidth=2.5 if n == "ddl:auto" else 1.2)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(f"allreduce float32, {p} ranks")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n}{unit}"
        n //= 1024
    return f"{n}TiB"


if __name__ == "__main__":
    raise SystemExit(main())
