"""``python -m tools.caffe.trajectory --peer DEST --solver S``: every number ``caffe train`` logs against what
``ddl-caffe train`` logs, from the same weights and data, with Caffe's own spread beside it.

Both tools start from one ``.caffemodel`` (``--weights``, else written here from the solver's net and seed) and read
the solver's own data. Caffe runs once per OpenBLAS core in ``--cores`` (``OPENBLAS_CORETYPE``): its float32 rounding
follows the BLAS kernels (FMA or not, summation order), so the spread between its own runs is how far apart two
correct float32 trainings of this solver drift. Printed: each logged value (train losses and outputs, test outputs
and loss) of each run, ddl's difference from the first core's run, and the width of Caffe's own range on that row;
rows where ddl lies outside Caffe's range by more than its width are marked.

Example (the kitchen net of issue 41: RMSProp with L1, where the spread is wide):
    python -m tools.caffe.trajectory --peer /work/peers/caffe --solver kitchen_solver.prototxt \
        --cores SkylakeX,Haswell,Prescott
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

_LINE = re.compile(r"\] (?:Iteration (\d+)\b.*, loss = (\S+)|\s+(Train|Test) net output #(\d+): (\S+) = (\S+)"
                   r"|Test loss: (\S+)|Iteration (\d+), Testing net)")


def logged_values(text: str) -> list[tuple[str, float]]:
    """(label, value) for each number a training log prints, in order: ``it 20 loss``, ``it 20 train #0 loss``,
    ``it 100 test #0 accuracy``, ``it 100 test loss``."""
    out: list[tuple[str, float]] = []
    it = "0"
    for m in _LINE.finditer(text):
        if m.group(1) is not None:
            it = m.group(1)
            out.append((f"it {it} loss", float(m.group(2))))
        elif m.group(3) is not None:
            out.append((f"it {it} {m.group(3).lower()} #{m.group(4)} {m.group(5)}", float(m.group(6))))
        elif m.group(7) is not None:
            out.append((f"it {it} test loss", float(m.group(7))))
        else:
            it = m.group(8)
    return out


def initial_weights(solver: Path, out: Path) -> None:
    """The solver's train net, filled with its random_seed (or 1), written as a .caffemodel for both tools."""
    import torch

    from ddl.caffe.formats import schema
    from ddl.caffe.formats.protofile import read_solver
    from ddl.caffe.net.net import Net
    from ddl.caffe.solver.solver import net_params

    sp = read_solver(solver)
    train, _ = net_params(sp)
    seed = sp.random_seed if sp.random_seed >= 0 else 1
    Net(train, schema.TRAIN, gen=torch.Generator().manual_seed(seed), quiet=True).save(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.caffe.trajectory", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peer", default=os.environ.get("CAFFE_PEER"), help="a build-caffe.sh DEST (or $CAFFE_PEER)")
    ap.add_argument("--solver", required=True)
    ap.add_argument("--weights", help="the .caffemodel both start from (default: one written from the solver's net)")
    ap.add_argument("--cores", default="SkylakeX,Haswell,Prescott",
                    help="OpenBLAS cores to run Caffe on (OPENBLAS_CORETYPE), the first one ddl is compared with")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--iterations", type=int, help="override max_iter")
    a = ap.parse_args(argv)
    if not a.peer:
        print("trajectory: give --peer DEST (a build-caffe.sh build) or set CAFFE_PEER", file=sys.stderr)
        return 2
    from tools.caffe.real_caffe import Peer, PeerError

    peer = Peer(Path(a.peer))
    try:
        peer.check(pycaffe=False)
    except PeerError as e:
        print(f"trajectory: {e}", file=sys.stderr)
        return 2
    solver = Path(a.solver).resolve()
    with tempfile.TemporaryDirectory(prefix="trajectory-") as tmp:
        weights = Path(a.weights).resolve() if a.weights else Path(tmp) / "init.caffemodel"
        if not a.weights:
            initial_weights(solver, weights)
        extra = ["--iterations", str(a.iterations)] if a.iterations else []
        runs: dict[str, str] = {}
        for core in a.cores.split(","):
            env = peer.env(a.threads)
            env.update(OPENBLAS_CORETYPE=core, GLOG_minloglevel="0", GLOG_logtostderr="1")
            proc = subprocess.run([str(peer.caffe), "train", "--solver", str(solver), "--weights", str(weights),
                                   *extra], capture_output=True, text=True, env=env, cwd=solver.parent, timeout=7200)
            if proc.returncode:
                print(f"trajectory: caffe ({core}) failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
                return 1
            runs[f"caffe {core}"] = proc.stderr
        env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
        proc = subprocess.run([sys.executable, "-m", "ddl.caffe.command.cli", "train", "--solver", str(solver),
                               "--weights", str(weights), "--threads", str(a.threads), *extra],
                              capture_output=True, text=True, env=env, cwd=solver.parent, timeout=7200)
        if proc.returncode:
            print(f"trajectory: ddl-caffe failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
            return 1
        runs["ddl-caffe"] = proc.stderr
    for line in table(runs):
        print(line)
    return 0


def table(runs: dict[str, str]) -> list[str]:
    """The rows: each logged value per run, ddl minus the first Caffe run, and Caffe's own largest spread."""
    values = {name: logged_values(text) for name, text in runs.items()}
    caffes = [n for n in runs if n != "ddl-caffe"]
    labels = [label for label, _ in values[caffes[0]]]
    lines = [f"{'logged value':32s}" + "".join(f"{n:>16s}" for n in runs) + f"{'ddl - caffe':>14s}{'caffe spread':>14s}"]
    worse = 0
    for i, label in enumerate(labels):
        row = [values[n][i][1] if i < len(values[n]) and values[n][i][0] == label else float("nan") for n in runs]
        by_name = dict(zip(runs, row, strict=True))
        diff = abs(by_name["ddl-caffe"] - by_name[caffes[0]])
        low, high = min(by_name[c] for c in caffes), max(by_name[c] for c in caffes)
        spread = high - low
        outside = max(low - by_name["ddl-caffe"], by_name["ddl-caffe"] - high, 0.0)
        flag = "  *" if outside > max(spread, 1e-6 * max(1.0, abs(by_name[caffes[0]]))) else ""
        worse += bool(flag)
        lines.append(f"{label:32s}" + "".join(f"{v:16.6g}" for v in row) + f"{diff:14.3g}{spread:14.3g}{flag}")
    lines.append(f"{len(labels)} logged values; ddl-caffe lies outside Caffe's own range by more than that range's width "
                 f"on {worse} (marked *)")
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
