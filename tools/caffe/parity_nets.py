"""The nets both sides of ``python -m tools.caffe.parity`` load: data layers turned into ``Input`` layers of the same
shapes (so Caffe and ddl-caffe see the same values), the phase chosen, random weights of a trained model's scale."""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path
from typing import Any

import torch
from google.protobuf import text_format

from ddl.caffe.formats import schema
from ddl.caffe.layers.registry import FORK_TYPES
from ddl.caffe.net.net import Net
from tools.caffe.zoo_data import point_at_synthetic_data, set_input_batch

# Layer types with no backward in Caffe (NOT_IMPLEMENTED): under force_backward Caffe aborts on them, so a deploy
# net's terminal ones are left out of the compared net (their forward is checked by the zoo job's ONNX column).
NO_BACKWARD = frozenset(("Accuracy", "ArgMax"))


def has_loss(param: Any) -> bool:
    return any(lp.type.endswith("Loss") or len(lp.loss_weight) and any(lp.loss_weight) for lp in param.layer)


def phases_of(param: Any) -> list[int]:
    """TEST always; TRAIN too where it differs: phase rules, BatchNorm (batch statistics), Dropout."""
    differs = any(len(lp.include) or len(lp.exclude) or lp.type in ("BatchNorm", "Dropout") for lp in param.layer)
    # (BatchNorm differs even where the file pins use_global_stats: comparable() lets TRAIN use batch statistics.)
    return [schema.TEST, schema.TRAIN] if differs else [schema.TEST]


def _shapes(param: Any, phase: int, batch: int) -> dict[str, tuple[int, ...]]:
    """Every blob's shape in ``phase`` (data layers reading synthetic files of the shape they expect)."""
    p = copy.deepcopy(param)
    with tempfile.TemporaryDirectory(prefix="ddl-caffe-parity-data-") as tmp:
        point_at_synthetic_data(p, Path(tmp))
        set_input_batch(p, batch)
        net = Net(p, phase, quiet=True)
        return dict(net.shapes)


def comparable(param: Any, phase: int, *, batch: int) -> tuple[Any, list[str]]:
    """A copy of ``param`` (upgraded) for both sides: every data layer active in ``phase`` an ``Input`` of its tops'
    shapes, with ``batch`` items; ``force_backward`` for a net without a loss; in TRAIN, Dropout at ratio 0 and
    BatchNorm on batch statistics; fork layers BVLC lacks left out, with what reads them.

    Returns:
        (the NetParameter, notes on what was changed).
    """
    shapes = _shapes(param, phase, batch)
    data_types = {"Data", "ImageData", "WindowData", "HDF5Data", "MemoryData", "DummyData", "Input"}
    out = schema.NetParameter()
    out.CopyFrom(param)
    del out.layer[:]
    notes: list[str] = []
    loss = has_loss(param)
    if not loss:
        out.force_backward = True
    dropped: list[str] = []
    forks: list[str] = []
    produced: set[str] = set()
    for lp in param.layer:
        if lp.type in FORK_TYPES or any(b not in produced and b in shapes for b in lp.bottom):
            # BVLC Caffe lacks the type (SSD's Permute, PriorBox, ...), or its input was left out.
            forks.append(lp.name)
            continue
        produced.update(lp.top)
        if lp.type in data_types:
            tops = [t for t in lp.top if t in shapes]
            if not tops:
                continue                                  # inactive in this phase
            note = f"{lp.name} ({lp.type}) fed as Input"
            if lp.type != "Input" and note not in notes:
                notes.append(note)
            new = out.layer.add(name=lp.name, type="Input")
            new.top.extend(tops)
            for t in tops:
                dims = list(shapes[t])
                if dims:
                    dims[0] = batch                       # data layers' own batch sizes were clamped for speed
                new.input_param.shape.add().dim.extend(dims)
            new.include.extend(lp.include)
            new.exclude.extend(lp.exclude)
            continue
        if lp.type in NO_BACKWARD and not loss:
            dropped.append(lp.name)
            continue
        new = out.layer.add()
        new.CopyFrom(lp)
        if bvlc_fields(new):
            note = "a fork's pooling ceil_mode written as BVLC's round_mode"
            if note not in notes:
                notes.append(note)
        if phase == schema.TRAIN and lp.type == "Dropout":
            new.dropout_param.dropout_ratio = 0.0
        if phase == schema.TRAIN and new.batch_norm_param.HasField("use_global_stats"):
            # Deploy files pin BatchNorm to its stored statistics; in TRAIN the batch's own are what training uses.
            new.batch_norm_param.ClearField("use_global_stats")
            note = "TRAIN: BatchNorm on the batch's statistics (use_global_stats cleared, as a train_val net has it)"
            if note not in notes:
                notes.append(note)
    if forks:
        notes.append(f"left out, a fork's layers BVLC lacks and what reads them: {len(forks)} ({', '.join(forks[:4])}, ...)")
    if dropped:
        notes.append(f"left out (no backward in Caffe under force_backward): {', '.join(dropped)}")
    if phase == schema.TRAIN and any(lp.type == "Dropout" for lp in param.layer):
        notes.append("TRAIN: dropout_ratio 0 on both sides (Caffe's and ddl's random masks differ)")
    return out, notes


def bvlc_fields(lp: Any) -> bool:
    """Write a fork's field that BVLC Caffe has under another name in BVLC's form, in place: pooling's ``ceil_mode``
    (DenseNet-Caffe's files) is ``round_mode``, the same rule. Returns whether anything changed."""
    if not lp.pooling_param.HasField("ceil_mode"):
        return False
    lp.pooling_param.round_mode = 0 if lp.pooling_param.ceil_mode else 1      # CEIL, FLOOR
    lp.pooling_param.ClearField("ceil_mode")
    return True


def prototxt(param: Any) -> str:
    return str(text_format.MessageToString(param))


def randomize(net: Net, seed: int) -> None:
    """Random weights of a trained model's scale: He-scaled Gaussian weights, small biases, BatchNorm statistics of
    unit-ish variance (factor 1), Scale around 1, PReLU slopes in [0, 0.5)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for la in net.layers:
            for i, b in enumerate(la.blobs):
                if la.type == "BatchNorm":
                    b.copy_([torch.randn(b.shape, generator=gen) * 0.1, torch.rand(b.shape, generator=gen) + 0.5,
                             torch.ones(b.shape)][i])
                elif la.type == "Scale" and i == 0 and len(la.bottom) == 1:
                    b.copy_(1 + 0.1 * torch.randn(b.shape, generator=gen))
                elif la.type == "PReLU":
                    b.copy_(0.5 * torch.rand(b.shape, generator=gen))
                elif b.dim() >= 2:
                    fan_in = max(1, b.numel() // b.shape[0])
                    b.copy_(torch.randn(b.shape, generator=gen) * (2.0 / fan_in) ** 0.5)
                else:
                    b.copy_(0.1 * torch.randn(b.shape, generator=gen))


def calm_logits(net: Net, inputs: dict[str, torch.Tensor]) -> list[str]:
    """Scale the weights of each layer that feeds a Softmax so that its outputs have unit spread: deep nets with random
    weights give logits in the hundreds, the Softmax saturates, and every diff backward is exactly zero on both
    sides (a comparison of zeros). Returns the layers scaled."""
    with torch.no_grad():
        _, blobs = net.forward(feeds=inputs)
    producer = {t: la for la in net.layers for t in la.top if la.type not in ("ReLU", "Dropout")}
    scaled = []
    for la in net.layers:
        if la.type not in ("Softmax", "SoftmaxWithLoss"):
            continue
        src = producer.get(la.bottom[0])
        spread = float(blobs[la.bottom[0]].std()) if blobs[la.bottom[0]].numel() > 1 else 0.0
        if src is None or not src.blobs or spread <= 1.0:
            continue
        with torch.no_grad():
            for b in src.blobs:
                b.div_(spread)
        scaled.append(src.name)
    return scaled
