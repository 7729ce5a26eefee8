"""``ddl bench tensorflow``: training-step time of ddl.tensorflow against plain Keras and MWMS.

An MLP 784-2048-1024-10 (3.7 M parameters), batch ``--batch`` per rank, one thread per
process, at each world size in ``--ranks``. Contenders, timed in interleaved rounds of
the same run (a round's time is the slowest rank's):

- ``keras``: plain ``model.fit``, no distribution (at p ranks: p independent processes);
- ``ddl-fit``: ``model.fit`` with ``ddl.tensorflow.keras.DistributedOptimizer``;
- ``ddl-tape``: a ``tf.function`` loop with ``DistributedGradientTape``;
- ``mwms``: ``tf.distribute.MultiWorkerMirroredStrategy`` (RING collectives over gRPC on
  localhost) in a custom loop; Keras 3 ``model.fit`` does not run under it.

Prints a table, writes ``tensorflow.json`` (with every round's time and the host's
load average) and ``tensorflow.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ddl.launcher.relaunch import parse_rank_counts, relaunch
from ddl.tools.arg_types import count
from ddl.tools.helptext import plain
from ddl_bench.reports import publish

CONTENDERS = ["keras", "ddl-fit", "ddl-tape", "mwms"]
LAYERS = (784, 2048, 1024, 10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ddl bench tensorflow", description=plain(__doc__))
    parser.add_argument("-np", "--ranks", dest="np", default="1,2", help="world sizes to run, e.g. 1,2")
    parser.add_argument("--batch", type=count(), default=64, help="per rank")
    parser.add_argument("--rounds", type=count(), default=5)
    parser.add_argument("--steps", type=count(), default=10, help="timed steps per round and contender")
    parser.add_argument("--out", default="bench-results")
    parser.add_argument("--worker", metavar="JSON", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return _worker(args)
    try:
        ranks = parse_rank_counts(args.np)
    except ValueError as exc:
        parser.error(str(exc))
    runs = []
    for p in ranks:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "result.json"
            proc = relaunch(p, ["-m", "ddl_bench.tensorflow_training", "--worker", str(out), "--batch", str(args.batch),
                                "--rounds", str(args.rounds), "--steps", str(args.steps)])
            if proc.returncode != 0 or not out.exists():
                print(f"ddl bench tensorflow: the {p}-rank run failed (exit {proc.returncode})", file=sys.stderr)
                return 1
            runs.append(json.loads(out.read_text()))
    report = summarize(runs)
    folder = publish(report, format_table(report), args.out, "tensorflow.json")
    plot(report, folder / "tensorflow.png")
    return 0


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per world size and contender: step time, throughput, efficiency, ratios to Keras and MWMS."""
    base = next((r["step_s"]["keras"] for r in runs if r["size"] == 1), None)
    rows = []
    for run in runs:
        p, batch, per = run["size"], run["batch"], run["step_s"]
        for c in CONTENDERS:
            t = per[c]
            cpu = run.get("cpu_s", {}).get(c)
            rows.append({
                "ranks": p, "contender": c, "batch_per_rank": batch, "step_ms": t * 1e3,
                "cpu_ms": None if cpu is None else cpu * 1e3,
                "cpu_vs_mwms": None if cpu is None else cpu / run["cpu_s"]["mwms"],
                "samples_per_s": p * batch / t, "scaling_efficiency": None if base is None else base / t,
                "vs_keras_1rank": None if base is None else t / base, "vs_mwms": t / per["mwms"],
                "rounds_ms": [x * 1e3 for x in run.get("rounds_s", {}).get(c, [])],
                "load_average": run.get("load_average"),
            })
    first = runs[0] if runs else {}
    return {"rows": rows, "params": first.get("params"), "threads_per_process": 1,
            "date": time.strftime("%Y-%m-%d"), "tensorflow": first.get("tensorflow"), "keras": first.get("keras")}


def format_table(report: dict[str, Any]) -> str:
    def f(v: float | None) -> str:
        return "" if v is None else f"{v:.3f}"

    lines = [f"training step, MLP {'-'.join(map(str, LAYERS))} ({(report['params'] or 0) / 1e6:.2f}M params), "
             f"one thread per process (tensorflow {report['tensorflow']}, keras {report['keras']})",
             f"{'ranks':>5} {'contender':9} {'batch':>5} {'step ms':>9} {'samples/s':>10} {'efficiency':>10} "
             f"{'vs keras@1':>10} {'vs mwms':>7} {'cpu ms':>7} {'cpu vs mwms':>11}"]
    for r in report["rows"]:
        lines.append(f"{r['ranks']:5d} {r['contender']:9} {r['batch_per_rank']:5d} {r['step_ms']:9.2f} "
                     f"{r['samples_per_s']:10.1f} {f(r['scaling_efficiency']):>10} {f(r['vs_keras_1rank']):>10} "
                     f"{r['vs_mwms']:7.3f} {f(r['cpu_ms']):>7} {f(r['cpu_vs_mwms']):>11}")
    lines.append("efficiency: throughput at p ranks / (p x one plain Keras process); vs keras@1: step time / "
                 "plain Keras step at 1 rank; vs mwms: step time / MWMS step time at the same ranks; cpu ms: "
                 "CPU time per step and process (all threads)")
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    ranks = sorted({r["ranks"] for r in report["rows"]})
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(CONTENDERS)
    for i, c in enumerate(CONTENDERS):
        ms = [next(r["step_ms"] for r in report["rows"] if r["ranks"] == p and r["contender"] == c) for p in ranks]
        ax.bar([j + i * width for j in range(len(ranks))], ms, width, label=c)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(ranks))], [f"{p} rank(s)" for p in ranks])
    ax.set_ylabel("step time (ms), lower is better")
    ax.set_title(f"MLP {'-'.join(map(str, LAYERS))}, batch {report['rows'][0]['batch_per_rank']} per rank")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


# -- the worker (one per rank, under ddlrun) ------------------------------------------
def _worker(args: argparse.Namespace) -> int:
    from mpi4py import MPI

    from ddl_bench.peers import free_port

    comm = MPI.COMM_WORLD.Dup()
    rank, size = comm.Get_rank(), comm.Get_size()
    ports = comm.bcast([free_port() for _ in range(size)] if rank == 0 else None, root=0)

    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    # MWMS configures the eager context, so it comes before any other TensorFlow work.
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec({"worker": [f"localhost:{p}" for p in ports]}), task_type="worker", task_id=rank)
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver, communication_options=options)

    import keras

    import ddl.tensorflow as dtf
    import ddl.tensorflow.keras as dk

    dtf.init()
    rng = np.random.default_rng(rank)
    x = tf.constant(rng.normal(size=(args.batch, LAYERS[0])).astype(np.float32))
    y = tf.constant(rng.integers(0, LAYERS[-1], args.batch).astype(np.int32))
    data = tf.data.Dataset.from_tensors((x, y)).repeat()
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def mlp() -> keras.Model:
        keras.utils.set_random_seed(0)
        return keras.Sequential([keras.Input((LAYERS[0],)), *[keras.layers.Dense(n, activation="relu") for n in
                                 LAYERS[1:-1]], keras.layers.Dense(LAYERS[-1])])

    def sgd() -> Any:
        return keras.optimizers.SGD(0.01, momentum=0.9)

    def fit_runner(distributed: bool) -> Any:
        model = mlp()
        model.compile(optimizer=dk.DistributedOptimizer(sgd()) if distributed else sgd(), loss=loss_fn)
        return lambda n: model.fit(data, epochs=1, steps_per_epoch=n, shuffle=False, verbose=0)

    def tape_runner() -> Any:
        model, opt = mlp(), sgd()

        @tf.function  # type: ignore[misc,untyped-decorator]
        def step() -> None:
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            grads = dtf.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))

        return lambda n: [step() for _ in range(n)]

    def mwms_runner() -> Any:
        with strategy.scope():
            model, opt = mlp(), sgd()

        @tf.function  # type: ignore[misc,untyped-decorator]
        def step() -> None:
            def replica_step() -> None:
                with tf.GradientTape() as tape:
                    loss = loss_fn(y, model(x, training=True)) / strategy.num_replicas_in_sync
                grads = tape.gradient(loss, model.trainable_variables)
                # Keras 3's optimizer sums the gradients over the replicas itself (one
                # replica_context.all_reduce of the whole list), hence the scaled loss.
                opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))

            strategy.run(replica_step)

        return lambda n: [step() for _ in range(n)]

    runners = {"keras": fit_runner(False), "ddl-fit": fit_runner(True), "ddl-tape": tape_runner(),
               "mwms": mwms_runner()}
    for c in CONTENDERS:
        runners[c](2)  # warm-up: tracing, first-touch allocations, gRPC connections
    times: dict[str, list[float]] = {c: [] for c in CONTENDERS}
    cpu: dict[str, list[float]] = {c: [] for c in CONTENDERS}
    for r in range(args.rounds):
        for c in CONTENDERS[r % 4 :] + CONTENDERS[: r % 4]:  # rotate: no contender always goes first
            comm.Barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            runners[c](args.steps)
            times[c].append(comm.allreduce((time.perf_counter() - t0) / args.steps, op=MPI.MAX))
            # CPU seconds of all this process's threads (gRPC's and ddl's included), mean over ranks:
            # on a shared host it moves far less with the load than the wall time does.
            cpu[c].append(comm.allreduce((time.process_time() - c0) / args.steps, op=MPI.SUM) / size)
    if rank == 0:
        result = {"load_average": os.getloadavg()[0], "size": size, "batch": args.batch, "step_s": {c: statistics.median(v) for c, v in times.items()},
                  "cpu_s": {c: statistics.median(v) for c, v in cpu.items()},
                  "rounds_s": times, "params": mlp().count_params(), "tensorflow": tf.__version__,
                  "keras": keras.__version__}
        Path(args.worker).write_text(json.dumps(result))
    dtf.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
