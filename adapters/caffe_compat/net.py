"""A Caffe net on torch: layer filtering by NetState, blob wiring, shapes, losses, params and ToProto."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import torch

from . import schema
from .blobs import from_array
from .layers.base import Layer, LayerError
from .layers.registry import LAYERS

log = logging.getLogger("ddl.caffe")


@dataclass
class Param:
    """One learnable blob in Caffe's learnable_params order."""

    tensor: torch.Tensor
    lr_mult: float
    decay_mult: float
    layer: str
    index: int


def state_meets_rule(state: Any, rule: Any) -> bool:
    """Caffe's NetStateRule test: phase, min/max level, required and forbidden stages."""
    if rule.HasField("phase") and rule.phase != state.phase:
        return False
    if rule.HasField("min_level") and state.level < rule.min_level:
        return False
    if rule.HasField("max_level") and state.level > rule.max_level:
        return False
    stages = set(state.stage)
    return all(s in stages for s in rule.stage) and not any(s in stages for s in rule.not_stage)


def filter_layers(param: Any, state: Any) -> list[Any]:
    """The layers of ``param`` that ``state`` includes (Caffe's FilterNet)."""
    out = []
    for lp in param.layer:
        if len(lp.include) and len(lp.exclude):
            raise LayerError(f"layer '{lp.name}': give include or exclude rules, not both")
        keep = not len(lp.include)
        if any(state_meets_rule(state, r) for r in lp.exclude):
            keep = False
        if any(state_meets_rule(state, r) for r in lp.include):
            keep = True
        if keep:
            out.append(lp)
    return out


def _legacy_inputs(param: Any) -> list[Any]:
    """The deprecated net-level ``input``/``input_shape``/``input_dim`` as Input layers."""
    if not len(param.input):
        return []
    lp = schema.LayerParameter(name="input", type="Input")
    lp.top.extend(param.input)
    if len(param.input_shape):
        for s in param.input_shape:
            lp.input_param.shape.add().dim.extend(s.dim)
    elif len(param.input_dim) == 4 * len(param.input):
        for i in range(len(param.input)):
            lp.input_param.shape.add().dim.extend(param.input_dim[4 * i: 4 * i + 4])
    else:
        raise LayerError(f"net '{param.name}': {len(param.input)} inputs need input_shape or 4 input_dim values each")
    return [lp]


class Net:
    """Layers of one phase, wired by blob names; ``forward`` returns the weighted loss and all blobs.

    Args:
        param: the NetParameter.
        phase: ``schema.TRAIN`` or ``schema.TEST``.
        level, stages: the rest of the NetState.
        gen: the torch generator for fillers, dropout and crops.
        rank, size: this process's place, so data layers read their own shard in TRAIN.
    """

    def __init__(self, param: Any, phase: int, *, gen: torch.Generator | None = None, level: int = 0,
                 stages: tuple[str, ...] = (), rank: int = 0, size: int = 1, quiet: bool = False) -> None:
        self.name = param.name
        self.param = param
        self.phase = phase
        self.gen = gen or torch.Generator().manual_seed(0)
        state = schema.NetState(phase=phase, level=level)
        state.stage.extend(stages)
        self.layers: list[Layer] = []
        self.shapes: dict[str, tuple[int, ...]] = {}
        owners: dict[str, torch.Tensor] = {}
        self.params: list[Param] = []
        for lp in _legacy_inputs(param) + filter_layers(param, state):
            cls = LAYERS.get(lp.type)
            if cls is None:
                raise LayerError(f"layer '{lp.name}': type '{lp.type}' is not supported by ddl-caffe; "
                                 f"supported types: {', '.join(sorted(LAYERS))}")
            layer = cls(lp, phase, self.gen)
            layer.rank, layer.size = rank, size          # type: ignore[attr-defined]
            for b in layer.bottom:
                if b not in self.shapes:
                    raise layer.error(f"bottom blob '{b}' is not produced by any earlier layer")
            shapes = [self.shapes[b] for b in layer.bottom]
            layer.setup(shapes)
            self._share(layer, owners)
            tops = layer.top_shapes() if layer.is_data else self._probe(layer, shapes)
            if not quiet:
                log.info("Setting up %s", layer.name)
            for t, s in zip(layer.top, tops, strict=True):
                self.shapes[t] = tuple(s)
                if not quiet:
                    log.info("Top shape: %s (%d)", " ".join(str(d) for d in s), math.prod(s))
            self.layers.append(layer)
        self._by_name = {la.name: la for la in self.layers}
        self.outputs = self._outputs()
        self.loss_weights = {t: la.loss_weight(i) for la in self.layers for i, t in enumerate(la.top)}

    def _outputs(self) -> list[str]:
        # Caffe's output blobs: those still "available" after the last layer (never consumed later).
        available: list[str] = []
        for la in self.layers:
            for b in la.bottom:
                if b in available:
                    available.remove(b)
            for t in la.top:
                if t not in available:
                    available.append(t)
        return available

    def _share(self, layer: Layer, owners: dict[str, torch.Tensor]) -> None:
        for i, t in enumerate(layer.blobs):
            name = layer.lp.param[i].name if i < len(layer.lp.param) else ""
            if name and name in owners:
                if owners[name].shape != t.shape:
                    raise layer.error(f"shared param '{name}' has shape {list(t.shape)} here but {list(owners[name].shape)} in its owner")
                layer.blobs[i] = owners[name]
                continue
            if name:
                owners[name] = t
            lr, decay = layer.param_mults(i)
            self.params.append(Param(t, lr, decay, layer.name, i))

    def _probe(self, layer: Layer, shapes: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
        layer.update_stats = False
        try:
            with torch.no_grad():
                outs = layer.forward([torch.zeros(s) for s in shapes])
        finally:
            layer.update_stats = True
        return [tuple(o.shape) for o in outs]

    def layer_by_name(self, name: str) -> Layer | None:
        return self._by_name.get(name)

    def feed(self, name: str, value: Any) -> None:
        """Set the value of an ``Input`` top (numpy array or tensor of its declared shape)."""
        for la in self.layers:
            if la.type == "Input" and name in la.top:
                i = la.top.index(name)
                t = torch.as_tensor(value, dtype=torch.float32)
                if tuple(t.shape) != la.shapes[i]:      # type: ignore[attr-defined]
                    raise la.error(f"input '{name}' has shape {list(la.shapes[i])}, got {list(t.shape)}")  # type: ignore[attr-defined]
                la.values[i] = t                         # type: ignore[attr-defined]
                return
        raise LayerError(f"net '{self.name}' has no Input top named '{name}'")

    def forward(self) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Run every layer; returns (sum of loss_weight x top, blobs by name)."""
        blobs: dict[str, torch.Tensor] = {}
        loss: torch.Tensor = torch.zeros(())
        for la in self.layers:
            tops = la.forward([blobs[b] for b in la.bottom])
            for i, (name, t) in enumerate(zip(la.top, tops, strict=True)):
                blobs[name] = t
                w = la.loss_weight(i)
                if w:
                    loss = loss + (t.sum() if w == 1 else w * t.sum())
        return loss, blobs

    def share_from(self, other: Net) -> None:
        """Use the blobs of same-named layers of ``other`` (Caffe's ShareTrainedLayersWith)."""
        for la in self.layers:
            src = other.layer_by_name(la.name)
            if src is None or not src.blobs:
                continue
            if [t.shape for t in src.blobs] != [t.shape for t in la.blobs]:
                raise la.error(f"cannot share blobs with the train net: shapes {[list(t.shape) for t in src.blobs]} vs {[list(t.shape) for t in la.blobs]}")
            la.blobs = src.blobs

    def to_proto(self, *, write_diff: bool = False) -> Any:
        """A NetParameter with every layer's definition and blobs (Caffe's Net::ToProto)."""
        out = schema.NetParameter(name=self.name)
        for la in self.layers:
            lp = out.layer.add()
            lp.CopyFrom(la.lp)
            del lp.blobs[:]
            for t in la.blobs:
                g = t.grad.detach().numpy() if (write_diff and t.grad is not None) else None
                lp.blobs.append(from_array(t.detach().numpy(), diff=g))
        return out
