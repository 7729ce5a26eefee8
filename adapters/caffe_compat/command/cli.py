"""The ``ddl-caffe`` command: train, test, time, export, upgrade, convert and state-dict, shaped like ``caffe``."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import Any

import torch

from ddl.caffe.command import log as caffelog
from ddl.caffe.command.memory import reuse_freed_memory
from ddl.caffe.formats import schema
from ddl.caffe.formats.errors import CaffeFormatError
from ddl.caffe.formats.protofile import read_net, read_solver
from ddl.caffe.layers.base import LayerError
from ddl.caffe.net.net import Net
from ddl.caffe.net.weights import load_weights
from ddl.caffe.solver.lr_policy import LrPolicyError
from ddl.tools.arg_types import count

log = logging.getLogger("ddl.caffe")
ERRORS = (CaffeFormatError, LayerError, LrPolicyError, ValueError, FileNotFoundError)
EXPORT_TOLERANCE = 1e-4          # largest relative difference from onnxruntime the export accepts


def _flag(p: argparse.ArgumentParser, name: str, **kw: Any) -> None:
    # gflags accepted both -name and --name; so do we, so that caffe command lines carry over.
    p.add_argument(f"--{name}", f"-{name}", **kw)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="ddl-caffe", description="Train, test, time and export Caffe models on PyTorch kernels, distributed by ddl.")
    sub = ap.add_subparsers(dest="command", required=True)
    tr = sub.add_parser("train", help="train from a solver prototxt")
    _flag(tr, "solver", required=True, help="solver .prototxt")
    _flag(tr, "weights", help="comma-separated .caffemodel files to start from (finetuning)")
    _flag(tr, "snapshot", help=".solverstate (or .solverstate.h5) to resume from")
    _flag(tr, "iterations", type=int, help="override the solver's max_iter")
    _flag(tr, "ddl", default="", help='IBM Caffe-DDL options, e.g. "-mode r:2x2"')
    from ddl.caffe.solver.elastic import add_arguments as add_elastic_arguments
    add_elastic_arguments(tr)
    te = sub.add_parser("test", help="score a model on its TEST-phase data")
    tm = sub.add_parser("time", help="benchmark per-layer forward/backward times")
    ex = sub.add_parser("export", help="write a net and its weights as ONNX, checked in onnxruntime")
    for p, need_w, iters in ((te, True, 50), (tm, False, 50), (ex, True, None)):
        _flag(p, "model", required=True, help="net .prototxt")
        _flag(p, "weights", required=need_w, help=".caffemodel file(s), comma-separated")
        if iters:
            _flag(p, "iterations", type=count(), default=iters, help=f"batches to run (default {iters})")
        _flag(p, "phase", choices=("TRAIN", "TEST"), default="TRAIN" if p is tm else "TEST")
        _flag(p, "level", type=int, default=None, help="the net state's level")
        _flag(p, "stage", default="", help="comma-separated net state stages")
    for p in (tr, te, tm, ex):
        _flag(p, "threads", type=count(0), default=0, help="torch CPU threads (0: torch's default)")
        _flag(p, "gpu", default=None, help="CUDA device ids as in caffe ('0', '0,1' or 'all'); the CPU, with a warning, when there is no CUDA")
    ex.add_argument("-o", "--output", required=True, help="output .onnx file")
    ex.add_argument("--no-check", action="store_true", help="skip the onnxruntime comparison")
    up = sub.add_parser("upgrade", help="upgrade a V0/V1 net (prototxt or .caffemodel) or an old solver, as Caffe's upgrade tools do")
    up.add_argument("input", help="net or solver .prototxt, or .caffemodel")
    up.add_argument("output", help="file to write (same kind as the input)")
    sd = sub.add_parser("state-dict", help="write a .caffemodel's weights as a PyTorch state_dict (.pt)")
    sd.add_argument("weights", help=".caffemodel or .caffemodel.h5")
    sd.add_argument("output", help="output .pt file")
    _flag(sd, "model", default=None, help="net .prototxt (names BatchNorm statistics as running_mean/running_var)")
    cv = sub.add_parser("convert", help="write an LMDB or LevelDB of Datum records from arrays or an image list")
    cv.add_argument("output", help="database folder to create")
    _flag(cv, "backend", default="lmdb", choices=("lmdb", "leveldb"),
          help="the database to write (Caffe's convert tools: lmdb by default; its Data layer reads leveldb by default)")
    src = cv.add_mutually_exclusive_group(required=True)
    src.add_argument("--npz", help=".npz with images and labels")
    src.add_argument("--image-list", help="text file of '<path> <label>' lines")
    cv.add_argument("--x-key", default="x")
    cv.add_argument("--y-key", default="y")
    cv.add_argument("--root", default="", help="folder the image-list paths are relative to")
    cv.add_argument("--encoded", action="store_true", help="store PNG-encoded images")
    cv.add_argument("--gray", action="store_true")
    cv.add_argument("--resize", type=int, nargs=2, metavar=("H", "W"))
    cv.add_argument("--shuffle", action="store_true")
    cv.add_argument("--seed", type=int, default=0)
    return ap


def device_for(gpu: str | None, *, local_rank: int = 0) -> torch.device:
    """The torch device a caffe ``-gpu`` value asks for: CUDA when present, else the CPU with one warning."""
    if gpu is None or gpu.strip() in ("", "-1"):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        log.warning("-gpu %s: no CUDA device is available here; running on the CPU", gpu)
        return torch.device("cpu")
    ids = list(range(torch.cuda.device_count())) if gpu.strip() == "all" else [int(g) for g in gpu.split(",") if g.strip()]
    if not ids or any(i < 0 or i >= torch.cuda.device_count() for i in ids):
        raise ValueError(f"-gpu {gpu}: this machine has CUDA devices 0 to {torch.cuda.device_count() - 1}")
    return torch.device("cuda", ids[local_rank % len(ids)])


def generate_inputs(net: Net, gen: torch.Generator) -> None:
    """Random inputs for Input and MemoryData tops; tops used as labels get integers within the class count."""
    from ddl.caffe.export.onnx_export import sample_inputs
    values = sample_inputs(net, seed=int(torch.randint(1 << 30, (1,), generator=gen)))
    for la in net.layers:
        if la.type == "Input":
            la.values = [values[t].to(net.device) for t in la.top]                # type: ignore[attr-defined]
        elif la.type == "MemoryData":
            x = values[la.top[0]].numpy()
            y = values[la.top[1]].numpy() if len(la.top) > 1 else torch.zeros(x.shape[0]).numpy()
            la.set_input_arrays(x, y)                                              # type: ignore[attr-defined]




def _train(a: argparse.Namespace) -> int:
    import ddl
    from ddl.caffe.command import ddl_options
    from ddl.caffe.solver.solver import Solver
    opts = ddl_options.parse(a.ddl)
    ddl.init(topology=opts.topology, algorithm=opts.algorithm)
    rank, size = ddl.rank(), ddl.size()
    caffelog.setup(rank=rank)
    if a.weights and a.snapshot:
        raise ValueError("give --snapshot to resume training or --weights to finetune, not both")
    sp = read_solver(a.solver)
    if a.iterations is not None:
        sp.max_iter = a.iterations
    device = device_for(a.gpu, local_rank=ddl.local_rank())
    if rank == 0:
        log.info("Using %d rank(s) of ddl (topology %s, algorithm %s) on %s", size, "x".join(map(str, ddl.topology().dims)),
                 opts.algorithm or "default", device)
    solver = Solver(sp, rank=rank, size=size, device=device)
    if a.weights:
        load_weights(solver.net, a.weights)
        solver.sync_params()
    if a.elastic:
        from ddl.caffe.solver.elastic import train as train_elastic
        train_elastic(a, solver)
        return 0
    if rank == 0:
        log.info("Starting Optimization")
    bar = caffelog.progress(sp.max_iter, solver.iter) if rank == 0 else None
    t0 = time.perf_counter()
    solver.solve(a.snapshot, on_iter=bar.update if bar else None)
    secs = time.perf_counter() - t0
    if bar:
        bar.clear()
    done = sp.max_iter
    batch = sum(getattr(la, "batch", 0) for la in solver.net.layers if la.is_data)
    if rank == 0 and secs > 0:
        per = solver.step_seconds / max(done, 1)
        imgs = f", {batch * sp.iter_size * size * done / solver.step_seconds:.0f} images/s" if batch and solver.step_seconds else ""
        log.info("ddl-caffe: %d ranks, %.3f ms per iteration (%.1f iter/s%s)", size, per * 1e3, 1 / per if per else 0, imgs)
        if solver.exchange is not None and solver.exchange.times.iterations:
            t = solver.exchange.times
            log.info("ddl-caffe: diffs averaged %s: %.1f ms per iteration from the first bucket sent to the last "
                     "result back, %.1f ms of it after backward (%.0f %% hidden behind backward)",
                     "layer-wise during backward" if sp.layer_wise_reduce else "after backward (layer_wise_reduce: "
                     "false)", t.span / t.iterations * 1e3, t.exposed / t.iterations * 1e3, 100 * t.hidden_share)
    ddl.barrier()
    return 0


def _load(a: argparse.Namespace, phase: int) -> Net:
    if a.threads:
        torch.set_num_threads(a.threads)
    stages = tuple(s for s in a.stage.split(",") if s)
    net = Net(read_net(a.model), phase, gen=torch.Generator().manual_seed(1701), level=a.level, stages=stages,
              device=device_for(a.gpu))
    if a.weights:
        load_weights(net, a.weights)
    return net


def _test(a: argparse.Namespace) -> int:
    caffelog.setup(rank=0)
    net = _load(a, schema.TRAIN if a.phase == "TRAIN" else schema.TEST)
    log.info("Running for %d iterations.", a.iterations)
    loss, sums = 0.0, None
    with torch.no_grad():
        for i in range(a.iterations):
            lv, blobs = net.forward()
            loss += float(lv)
            vals = [blobs[o].reshape(-1).double().cpu().numpy() for o in net.outputs]
            for o, v in zip(net.outputs, vals, strict=True):
                for x in v:
                    log.info("Batch %d, %s = %g", i, o, x)
            sums = vals if sums is None else [s + v for s, v in zip(sums, vals, strict=True)]
    log.info("Loss: %g", loss / a.iterations)
    for o, s in zip(net.outputs, sums or [], strict=True):
        w = net.loss_weights.get(o, 0.0)
        for x in s / a.iterations:
            extra = f" (* {w:g} = {w * x:g} loss)" if w else ""
            log.info("%s = %g%s", o, x, extra)
    return 0


def _time(a: argparse.Namespace) -> int:
    from ddl.caffe.net.layer_timing import time_net
    caffelog.setup(rank=0)
    net = _load(a, schema.TRAIN if a.phase == "TRAIN" else schema.TEST)
    generate_inputs(net, torch.Generator().manual_seed(7))
    time_net(net, a.iterations)
    return 0


def _export(a: argparse.Namespace) -> int:
    from ddl.caffe.export.onnx_export import export
    caffelog.setup(rank=0)
    net = _load(a, schema.TRAIN if a.phase == "TRAIN" else schema.TEST)
    rel = export(net, a.output, check=not a.no_check, tolerance=EXPORT_TOLERANCE)
    log.info("Wrote %s", a.output)
    for name, r in rel.items():
        log.info("onnxruntime vs ddl-caffe, output %s: max relative difference %.3g", name, r)
    return 0


def _upgrade(a: argparse.Namespace) -> int:
    from ddl.caffe.formats.protofile import upgrade_file
    caffelog.setup(rank=0)
    kind = upgrade_file(a.input, a.output)
    log.info("Wrote %s (%s)", a.output, kind)
    return 0


def _state_dict(a: argparse.Namespace) -> int:
    from ddl.caffe.export.state_dict import caffemodel_to_state_dict
    caffelog.setup(rank=0)
    sd = caffemodel_to_state_dict(a.weights, model=a.model)
    torch.save(sd, a.output)
    log.info("Wrote %s (%d tensors, %d values)", a.output, len(sd), sum(t.numel() for t in sd.values()))
    return 0


def _convert(a: argparse.Namespace) -> int:
    from ddl.caffe.data import convert
    from ddl.caffe.data.database import LEVELDB, LMDB
    caffelog.setup(rank=0)
    backend = LMDB if a.backend == "lmdb" else LEVELDB
    if a.npz:
        n = convert.from_npz(a.output, a.npz, x_key=a.x_key, y_key=a.y_key, shuffle=a.shuffle, seed=a.seed, backend=backend)
    else:
        n = convert.from_image_list(a.output, a.image_list, a.root, encoded=a.encoded, gray=a.gray,
                                    size=tuple(a.resize) if a.resize else None, shuffle=a.shuffle, seed=a.seed,
                                    backend=backend)
    log.info("Processed %d files.", n)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``ddl-caffe``."""
    a = _parser().parse_args(argv)
    if argv is None and a.command in ("train", "test", "time", "export"):
        reuse_freed_memory()           # the command's own process (not a caller that imports main)
    run = {"train": _train, "test": _test, "time": _time, "export": _export, "convert": _convert,
           "upgrade": _upgrade, "state-dict": _state_dict}[a.command]
    if getattr(a, "threads", 0):
        torch.set_num_threads(a.threads)
    try:
        return run(a)
    except ERRORS as e:
        import ddl
        if ddl.is_initialized() and ddl.size() > 1:
            raise             # ddl's excepthook ends every rank with this message
        print(f"ddl-caffe: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
