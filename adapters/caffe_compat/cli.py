"""The ``ddl-caffe`` command: train, test, time, export and convert, shaped like ``caffe``."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import Any

import numpy as np
import torch

from . import log as caffelog
from . import schema
from .blobs import load_weights
from .layers.base import LayerError
from .lr_policy import LrPolicyError
from .net import Net
from .textio import CaffeFormatError, read_net, read_solver

log = logging.getLogger("ddl.caffe")
ERRORS = (CaffeFormatError, LayerError, LrPolicyError, ValueError, FileNotFoundError)


def _flag(p: argparse.ArgumentParser, name: str, **kw: Any) -> None:
    # gflags accepted both -name and --name; so do we, so that caffe command lines carry over.
    p.add_argument(f"--{name}", f"-{name}", **kw)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="ddl-caffe", description="Train, test, time and export Caffe models on PyTorch kernels, distributed by ddl.")
    sub = ap.add_subparsers(dest="command", required=True)
    tr = sub.add_parser("train", help="train from a solver prototxt")
    _flag(tr, "solver", required=True, help="solver .prototxt")
    _flag(tr, "weights", help="comma-separated .caffemodel files to start from (finetuning)")
    _flag(tr, "snapshot", help=".solverstate to resume from")
    _flag(tr, "iterations", type=int, help="override the solver's max_iter")
    _flag(tr, "ddl", default="", help='IBM Caffe-DDL options, e.g. "-mode r:2x2"')
    from .elastic import add_arguments as add_elastic_arguments
    add_elastic_arguments(tr)
    te = sub.add_parser("test", help="score a model on its TEST-phase data")
    tm = sub.add_parser("time", help="benchmark per-layer forward/backward times")
    ex = sub.add_parser("export", help="write a deploy net and its weights as ONNX")
    for p, need_w, iters in ((te, True, 50), (tm, False, 50), (ex, True, None)):
        _flag(p, "model", required=True, help="net .prototxt")
        _flag(p, "weights", required=need_w, help=".caffemodel file(s), comma-separated")
        if iters:
            _flag(p, "iterations", type=int, default=iters, help=f"batches to run (default {iters})")
        _flag(p, "phase", choices=("TRAIN", "TEST"), default="TRAIN" if p is tm else "TEST")
    for p in (tr, te, tm, ex):
        _flag(p, "threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ex.add_argument("-o", "--output", required=True, help="output .onnx file")
    ex.add_argument("--no-check", action="store_true", help="skip the onnxruntime comparison")
    cv = sub.add_parser("convert", help="write an LMDB of Datum records from arrays or an image list")
    cv.add_argument("output", help="LMDB directory to create")
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


def _generate_inputs(net: Net, gen: torch.Generator) -> None:
    """Random inputs for Input tops; tops used as labels get integers within the class count."""
    for la in net.layers:
        if la.type != "Input":
            continue
        for i, t in enumerate(la.top):
            classes = [net.shapes[c.bottom[0]][1] for c in net.layers if len(c.bottom) > 1 and c.bottom[1] == t and c.type in ("SoftmaxWithLoss", "Accuracy")]
            s = la.shapes[i]  # type: ignore[attr-defined]
            v = torch.randint(classes[0], s, generator=gen).float() if classes else torch.randn(s, generator=gen)
            la.values[i] = v  # type: ignore[attr-defined]


def _train(a: argparse.Namespace) -> int:
    import ddl

    from . import ddl_options
    from .distributed import solver_hooks
    from .solver import Solver
    opts = ddl_options.parse(a.ddl)
    ddl.init(topology=opts.topology, algorithm=opts.algorithm)
    rank, size = ddl.rank(), ddl.size()
    caffelog.setup(rank=rank)
    if a.weights and a.snapshot:
        raise ValueError("give --snapshot to resume training or --weights to finetune, not both")
    sp = read_solver(a.solver)
    if a.iterations is not None:
        sp.max_iter = a.iterations

    if rank == 0:
        log.info("Using %d rank(s) of ddl (topology %s, algorithm %s)", size, "x".join(map(str, ddl.topology().dims)), opts.algorithm or "default")
    reduce, bcast = solver_hooks()
    solver = Solver(sp, rank=rank, size=size, reduce=reduce, broadcast=bcast)
    if a.weights:
        load_weights(solver.net, a.weights)
        solver.sync_params()
    if a.elastic:
        from .elastic import train as train_elastic
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
    batch = sum(la.batch for la in solver.net.layers if la.type in ("Data", "HDF5Data"))  # type: ignore[attr-defined]
    if rank == 0 and secs > 0:
        per = solver.step_seconds / max(done, 1)
        imgs = f", {batch * sp.iter_size * size * done / solver.step_seconds:.0f} images/s" if batch and solver.step_seconds else ""
        log.info("ddl-caffe: %d ranks, %.3f ms per iteration (%.1f iter/s%s)", size, per * 1e3, 1 / per if per else 0, imgs)
    ddl.barrier()
    return 0


def _load(a: argparse.Namespace, phase: int) -> Net:
    if a.threads:
        torch.set_num_threads(a.threads)
    net = Net(read_net(a.model), phase, gen=torch.Generator().manual_seed(1701))
    if a.weights:
        load_weights(net, a.weights)
    return net


def _test(a: argparse.Namespace) -> int:
    from .solver import test_net
    caffelog.setup(rank=0)
    net = _load(a, schema.TRAIN if a.phase == "TRAIN" else schema.TEST)
    log.info("Running for %d iterations.", a.iterations)
    loss, sums = 0.0, None
    with torch.no_grad():
        for i in range(a.iterations):
            lv, blobs = net.forward()
            loss += float(lv)
            vals = [blobs[o].reshape(-1).double().numpy() for o in net.outputs]
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
    del test_net
    return 0


def _time(a: argparse.Namespace) -> int:
    from .timing import time_net
    caffelog.setup(rank=0)
    net = _load(a, schema.TRAIN if a.phase == "TRAIN" else schema.TEST)
    _generate_inputs(net, torch.Generator().manual_seed(7))
    time_net(net, a.iterations)
    return 0


def _export(a: argparse.Namespace) -> int:
    import onnx

    from .export import to_onnx
    caffelog.setup(rank=0)
    net = _load(a, schema.TEST)
    model = to_onnx(net)
    onnx.save(model, a.output)
    log.info("Wrote %s (%d nodes, opset %d)", a.output, len(model.graph.node), model.opset_import[0].version)
    if not a.no_check:
        diff = check_onnx(net, a.output)
        log.info("onnxruntime vs ddl-caffe forward: max abs difference %.3g", diff)
    return 0


def check_onnx(net: Net, path: str) -> float:
    """Run the ONNX file in onnxruntime on random inputs; max |difference| from the net's own outputs."""
    import onnxruntime as ort
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    _generate_inputs(net, torch.Generator().manual_seed(11))
    feeds = {}
    for i in sess.get_inputs():
        la = next(la for la in net.layers if i.name in la.top)
        feeds[i.name] = la.values[la.top.index(i.name)].numpy() if la.type == "Input" else np.random.default_rng(0).standard_normal(net.shapes[i.name]).astype(np.float32)  # type: ignore[attr-defined]
        if la.type != "Input":
            raise LayerError(f"layer '{la.name}' ({la.type}) feeds the exported graph; export a deploy net with an Input layer")
    with torch.no_grad():
        _, blobs = net.forward()
    outs = sess.run(None, feeds)
    return max(float(np.abs(o - blobs[i.name].numpy()).max()) for o, i in zip(outs, sess.get_outputs(), strict=True))


def _convert(a: argparse.Namespace) -> int:
    from . import convert
    caffelog.setup(rank=0)
    if a.npz:
        n = convert.from_npz(a.output, a.npz, x_key=a.x_key, y_key=a.y_key, shuffle=a.shuffle, seed=a.seed)
    else:
        n = convert.from_image_list(a.output, a.image_list, a.root, encoded=a.encoded, gray=a.gray,
                                    size=tuple(a.resize) if a.resize else None, shuffle=a.shuffle, seed=a.seed)
    log.info("Processed %d files.", n)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``ddl-caffe``."""
    a = _parser().parse_args(argv)
    run = {"train": _train, "test": _test, "time": _time, "export": _export, "convert": _convert}[a.command]
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
