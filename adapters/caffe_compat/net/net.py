"""A Caffe net on torch: layer filtering by NetState, blob wiring, shapes, losses, params, propagate_down and ToProto."""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ddl.caffe.formats import schema
from ddl.caffe.formats.blobs import from_array
from ddl.caffe.layers.base import Layer, LayerError
from ddl.caffe.layers.registry import LAYERS

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


_PHASES = {schema.TRAIN: "TRAIN", schema.TEST: "TEST"}


def _rule_text(rule: Any) -> str:
    parts = [f"phase: {_PHASES[rule.phase]}"] if rule.HasField("phase") else []
    parts += [f"{k}: {getattr(rule, k)}" for k in ("min_level", "max_level") if rule.HasField(k)]
    parts += [f'stage: "{x}"' for x in rule.stage] + [f'not_stage: "{x}"' for x in rule.not_stage]
    return "{ " + " ".join(parts) + " }"


def _left_out(param: Any, chosen: list[Any], blob: str, state: Any) -> str:
    """Why no layer makes ``blob``, when the net's state filtered out the layers that would (a stage not given)."""
    kept = {id(lp) for lp in chosen}
    makers = [lp for lp in param.layer if blob in lp.top and id(lp) not in kept]
    if not makers:
        return ""
    rules = "; ".join(f"'{lp.name}' " + " ".join(f"include {_rule_text(r)}" for r in lp.include)
                      + " ".join(f"exclude {_rule_text(r)}" for r in lp.exclude) for lp in makers)
    stages = ", ".join(f'"{x}"' for x in state.stage) or "none"
    return (f"; the layers that make it are left out by their rules for this net's state (phase "
            f"{_PHASES[state.phase]}, level {state.level}, stages {stages}): {rules}. Give the stage they "
            "need (-stage on the command line, test_state in the solver)")


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


_warned: set[tuple[str, str]] = set()
#: The name of the top Caffe gives a loss layer that names none (AutoTopBlobs): never an input, never an output.
AUTOMATIC_TOP = "(automatic)"
COMMON_FIELDS = frozenset(("name", "type", "bottom", "top", "phase", "loss_weight", "param", "blobs", "propagate_down",
                           "include", "exclude"))


def _check_types(param: Any, layers: list[Any]) -> None:
    """All layer types of the net that ddl-caffe lacks, in one error."""
    missing: dict[str, list[str]] = {}
    for lp in layers:
        if lp.type not in LAYERS:
            missing.setdefault(lp.type or "(empty type)", []).append(lp.name or "?")
    if missing:
        parts = [f"'{t}' (layer{'s' if len(ns) > 1 else ''} {', '.join(repr(n) for n in ns)})" for t, ns in missing.items()]
        raise LayerError(f"net '{param.name}': {len(missing)} layer type(s) are not supported by ddl-caffe: "
                         f"{'; '.join(parts)}. Supported types: {', '.join(sorted(LAYERS))}")


def _warn_ignored(layers: list[Layer]) -> None:
    """One warning for the parameter fields set on layers that do not read them (Caffe ignores them too)."""
    notes = []
    for la in layers:
        for f, _ in la.lp.ListFields():
            if f.name in COMMON_FIELDS or f.name in la.params:
                continue
            if (la.name, f.name) not in _warned:
                _warned.add((la.name, f.name))
                notes.append(f"layer '{la.name}' ({la.type}): {f.name}")
    if notes:
        log.warning("ignored, as Caffe ignores them, fields these layers do not read: %s", "; ".join(notes))


def net_state(param: Any, phase: int, level: int | None, stages: tuple[str, ...]) -> Any:
    """The NetState a net is filtered by: the file's ``state`` (level, stages), then the caller's phase, level and stages."""
    state = schema.NetState(phase=phase, level=0)
    if param.HasField("state"):
        if param.state.HasField("level"):
            state.level = param.state.level
        state.stage.extend(param.state.stage)
    if level is not None:
        state.level = level
    state.stage.extend(stages)
    return state


class Net:
    """Layers of one phase, wired by blob names; ``forward`` returns the weighted loss and all blobs.

    Args:
        param: the NetParameter (V0/V1 nets are upgraded first).
        phase: ``schema.TRAIN`` or ``schema.TEST``.
        level, stages: the rest of the NetState, added to the file's own ``state``.
        gen: the torch generator for fillers, dropout and crops.
        rank, size: this process's place, so data layers read their own shard in TRAIN.
        device: where blobs live and layers run (default the CPU).
    """

    def __init__(self, param: Any, phase: int, *, gen: torch.Generator | None = None, level: int | None = None,
                 stages: tuple[str, ...] = (), rank: int = 0, size: int = 1, quiet: bool = False,
                 device: torch.device | str | None = None) -> None:
        from ddl.caffe.formats.upgrade import upgrade_net
        if len(param.layers) or len(param.input):
            param = copy.deepcopy(param)
            upgrade_net(param, source=f"net '{param.name}'")
        self.name = param.name
        self.param = param
        self.phase = phase
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.gen = gen or torch.Generator().manual_seed(0)
        self.state = net_state(param, phase, level, stages)
        self.force_backward = bool(param.force_backward)
        self.layers: list[Layer] = []
        self.shapes: dict[str, tuple[int, ...]] = {}
        owners: dict[str, torch.Tensor] = {}
        self.params: list[Param] = []
        chosen = filter_layers(param, self.state)
        _check_types(param, chosen)
        for lp in chosen:
            cls = LAYERS[lp.type]
            if cls.is_loss and not len(lp.top):
                # Caffe gives a loss layer without tops an anonymous one (AutoTopBlobs).
                lp = copy.deepcopy(lp)
                lp.top.append(AUTOMATIC_TOP)
            layer = cls(lp, phase, self.gen)
            layer.rank, layer.size = rank, size          # type: ignore[attr-defined]
            for b in layer.bottom:
                if b not in self.shapes:
                    raise layer.error(f"bottom blob '{b}' is not produced by any earlier layer{_left_out(param, chosen, b, self.state)}")
            shapes = [self.shapes[b] for b in layer.bottom]
            layer.setup(shapes)
            self._place(layer)
            self._share(layer, owners)
            tops = layer.top_shapes() if layer.is_data else (layer.infer_top_shapes(shapes) or self._probe(layer, shapes))
            if not quiet:
                log.info("Setting up %s", layer.name)
            for t, s in zip(layer.top, tops, strict=True):
                self.shapes[t] = tuple(s)
                if not quiet:
                    log.info("Top shape: %s (%d)", " ".join(str(d) for d in s), math.prod(s))
            self.layers.append(layer)
        _warn_ignored(self.layers)
        self.detach = [self._stopped_bottoms(la) for la in self.layers]
        self._by_name = {la.name: la for la in self.layers}
        self.outputs = self._outputs()
        if not quiet:
            for name in self.outputs:
                log.info("This network produces output %s", name)
        self.loss_weights = {t: la.loss_weight(i) for la in self.layers for i, t in enumerate(la.top)}

    def bottom_need_backward(self) -> list[list[bool]]:
        """Caffe's Net::Init analysis: per layer and bottom, whether backward computes that bottom's diff
        (blobs that need it, propagate_down, pruning of what does not reach a loss, force_backward)."""
        return self.backward_needs()[1]

    def layer_need_backward(self) -> list[bool]:
        """Caffe's ``layer_need_backward_``: whether backward runs layer ``i`` at all (its parameter diffs included)."""
        return self.backward_needs()[0]

    def backward_needs(self) -> tuple[list[bool], list[list[bool]]]:
        """(per layer, per layer and bottom): Caffe's ``layer_need_backward_`` and ``bottom_need_backward_``."""
        blob_need: dict[str, bool] = {}
        need: list[list[bool]] = []
        layer_need: list[bool] = []
        for la in self.layers:
            pd = list(la.lp.propagate_down)
            flags, any_need = [], False
            for j, b in enumerate(la.bottom):
                flags.append(bool(pd[j]) if pd else blob_need.get(b, False))
                any_need |= blob_need.get(b, False)
            any_need |= any(t.requires_grad for t in la.blobs)
            for t in la.top:
                blob_need[t] = any_need
            need.append(flags)
            layer_need.append(any_need)
        # Going backward, per blob name (the version the layers still to visit produced): which are under a loss,
        # which some visited layer reads, and which of those some visited layer needs the diff of. Caffe splits a
        # blob read by several layers (InsertSplits) and skips a blob only when every reader skips it; a name is
        # forgotten at its producer, so an in-place layer's bottom is judged by the readers of that version alone.
        under_loss: set[str] = set()
        read: set[str] = set()
        needed: set[str] = set()
        for i in range(len(self.layers) - 1, -1, -1):
            la = self.layers[i]
            contributes = any(la.loss_weight(j) or t in under_loss for j, t in enumerate(la.top))
            skip_down = all(t in read and t not in needed for t in la.top)
            if layer_need[i] and skip_down:
                layer_need[i] = False
                need[i] = [False] * len(need[i])
            if not contributes:
                layer_need[i] = False
            for t in la.top:
                under_loss.discard(t)
                read.discard(t)
                needed.discard(t)
            for j, b in enumerate(la.bottom):
                if contributes:
                    under_loss.add(b)
                else:
                    need[i][j] = False
                read.add(b)
                if need[i][j]:
                    needed.add(b)
        if self.force_backward:
            layer_need = [True] * len(self.layers)
            need = [[n or la.allow_force_backward(j) for j, n in enumerate(flags)] for la, flags in zip(self.layers, need, strict=True)]
        return layer_need, need

    def _place(self, layer: Layer) -> None:
        if self.device.type != "cpu":
            for t in layer.blobs:
                t.data = t.data.to(self.device)

    def _stopped_bottoms(self, la: Layer) -> tuple[bool, ...] | None:
        """Which bottoms get no gradient: ``propagate_down: false`` (unless force_backward allows it), as Caffe."""
        pd = list(la.lp.propagate_down)
        if not pd:
            return None
        if len(pd) != len(la.bottom):
            raise la.error(f"propagate_down must be given 0 or {len(la.bottom)} times (once per bottom), got {len(pd)}")
        stop = tuple(not (d or (self.force_backward and la.allow_force_backward(i))) for i, d in enumerate(pd))
        return stop if any(stop) else None

    def _outputs(self) -> list[str]:
        """Caffe's output blobs: those still "available" after the last layer (never read later), in the order of
        Caffe's ``std::set<string>`` of names, by byte value (so ``accuracy`` is output #0 and ``loss`` #1, whatever
        the layer order); a loss layer's anonymous top is not one (Caffe does not make it available)."""
        available: set[str] = set()
        for la in self.layers:
            available.difference_update(la.bottom)
            available.update(t for t in la.top if t != AUTOMATIC_TOP)
        return sorted(available, key=lambda name: name.encode())

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
            if lr == 0 and t.requires_grad and not self.force_backward:
                t.requires_grad_(False)          # Caffe computes no diff for lr_mult 0 blobs
            self.params.append(Param(t, lr, decay, layer.name, i))

    def _probe(self, layer: Layer, shapes: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
        """Top shapes from one forward on zeros (for the layers that cannot tell them from the bottom shapes)."""
        layer.update_stats = False
        try:
            with torch.no_grad():
                outs = layer.forward([torch.zeros(s, device=self.device) for s in shapes])
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
                la.values[i] = t.to(self.device)         # type: ignore[attr-defined]
                return
        raise LayerError(f"net '{self.name}' has no Input top named '{name}'")

    def set_input_arrays(self, data: Any, labels: Any, *, layer: str | None = None) -> None:
        """Hand arrays to a MemoryData layer (the only one, or the one named ``layer``), as pycaffe does."""
        mems = [la for la in self.layers if la.type == "MemoryData" and (layer is None or la.name == layer)]
        if len(mems) != 1:
            raise LayerError(f"net '{self.name}' has {len(mems)} MemoryData layers{' named ' + repr(layer) if layer else ''}; name one")
        mems[0].set_input_arrays(data, labels)           # type: ignore[attr-defined]

    def run_layer(self, i: int, ins: list[torch.Tensor]) -> list[torch.Tensor]:
        """Layer ``i``'s forward with Caffe's net rules: propagate_down cuts, data tops placed (and watched under force_backward)."""
        la = self.layers[i]
        stop = self.detach[i]
        if stop is not None:
            ins = [x.detach() if s else x for x, s in zip(ins, stop, strict=True)]
        tops = la.forward(ins)
        if la.is_data:
            if self.device.type != "cpu":
                tops = [t.to(self.device) for t in tops]
            if self.force_backward:
                tops = [t.detach().requires_grad_(True) if t.is_floating_point() else t for t in tops]
        return tops

    def forward(self, feeds: dict[str, torch.Tensor] | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Run every layer; returns (sum of loss_weight x top, blobs by name).

        ``feeds`` replaces the tops of data layers (a data layer whose tops are all fed is not run).
        """
        blobs: dict[str, torch.Tensor] = {}
        loss: torch.Tensor = torch.zeros((), device=self.device)
        for i, la in enumerate(self.layers):
            if feeds and la.is_data and all(t in feeds for t in la.top):
                tops = [feeds[t].to(self.device) for t in la.top]
            else:
                tops = self.run_layer(i, [blobs[b] for b in la.bottom])
            for j, (name, t) in enumerate(zip(la.top, tops, strict=True)):
                blobs[name] = t
                w = la.loss_weight(j)
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

    def layer_blobs(self, *, write_diff: bool = False) -> Iterator[tuple[Any, list[torch.Tensor], list[torch.Tensor | None]]]:
        """Per layer: its LayerParameter without blobs, its blobs, and their gradients (when ``write_diff``)."""
        for la in self.layers:
            lp = schema.LayerParameter()
            lp.CopyFrom(la.lp)
            del lp.blobs[:]
            diffs = [t.grad if (write_diff and t.grad is not None) else (torch.zeros_like(t) if write_diff else None)
                     for t in la.blobs]
            yield lp, list(la.blobs), diffs

    def save(self, path: str | Path, *, write_diff: bool = False) -> None:
        """Write the weights as a .caffemodel (streamed, Caffe's Net::ToProto) or, for a ``.h5`` path, Caffe's HDF5 layout."""
        from ddl.caffe.formats.caffemodel import write_caffemodel, write_hdf5_weights
        if str(path).endswith(".h5"):
            write_hdf5_weights(path, ((lp.name, data, diffs) for lp, data, diffs in self.layer_blobs(write_diff=write_diff)))
        else:
            write_caffemodel(path, self.name, self.layer_blobs(write_diff=write_diff))

    def to_proto(self, *, write_diff: bool = False) -> Any:
        """A NetParameter with every layer's definition and blobs (Caffe's Net::ToProto), in memory."""
        out = schema.NetParameter(name=self.name)
        for lp0, data, diffs in self.layer_blobs(write_diff=write_diff):
            lp = out.layer.add()
            lp.CopyFrom(lp0)
            for t, d in zip(data, diffs, strict=True):
                g = d.detach().cpu().numpy() if d is not None else None
                lp.blobs.append(from_array(t.detach().cpu().numpy(), diff=g))
        return out
