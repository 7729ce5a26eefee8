"""Checkpoints of a torch model and optimizer in ddl's format: saved as shards, loaded at any world size.

``save`` is called on every rank: each writes its part of the model (a byte-balanced
share of ``model.state_dict()``) and of the optimizer state (with a sharded optimizer,
the state it owns; with a replicated one, a byte-balanced share of it), and rank 0
commits one manifest (:mod:`ddl.checkpoint`). ``load`` on every rank of any world: each
reads the whole model and the optimizer state of the parameters it owns now (all of
them for an unsharded optimizer), after checking names, shapes, dtypes, the optimizer's
class and each file's sha256; a problem on any rank raises the same error on all, before
anything is changed.

Example:
    >>> ddl.torch.checkpoint.save("ckpt", model=model, optimizer=opt, extra={"epoch": 3})  # doctest: +SKIP
    >>> extra = ddl.torch.checkpoint.load("ckpt", model=model, optimizer=opt)               # doctest: +SKIP
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

import ddl
import torch
from ddl.checkpoint import Checkpoint, CheckpointError, Manifest, Tensor, together
from ddl.checkpoint import save as save_shards
from ddl.checkpoint.checks import check_class, check_replicas, saved_optimizer
from ddl.checkpoint.manifest import decode_value, encode_value
from ddl.checkpoint.replicas import local, read_hook, same_on_every_rank, save_hook, saves_hook
from ddl.reduction.partition import NOBODY, partition_by_bytes

from .local_sgd import _Periodic
from .optimizer import DistributedOptimizer, _all_params
from .sharded_optimizer import ShardedOptimizer, partition_of

FRAMEWORK = "torch"


def save(path: str | Path, *, model: torch.nn.Module, optimizer: Any = None,
         extra: Mapping[str, Any] | None = None) -> Manifest:
    """Save ``model`` and ``optimizer`` into the folder ``path`` (call it on every rank).

    What a resume needs is saved with the optimizer: a stateful hook's state (PowerSGD's
    call counts and Q, each rank's error feedback, the gradient order the buckets follow),
    and for ``LocalSGD`` and ``DiLoCo`` each rank's inner optimizer state, the anchor, the
    outer optimizer, a round still in flight (finished and kept, not applied early) and,
    between rounds, each rank's own weights (the ranks differ then). Nothing of it changes
    training: a resume at the same world size continues exactly; see :func:`load` for
    another world size.

    Args:
        path: a folder every rank can reach (a shared filesystem across hosts).
        model: the model; its ``state_dict()`` (parameters and buffers) is saved.
        optimizer: a ``torch.optim.Optimizer``, ``ddl.torch.DistributedOptimizer`` (sharded
            or not, with a hook or not), ``ZeroRedundancyOptimizer``, ``LocalSGD`` or ``DiLoCo``;
            None saves the model alone.
        extra: your own JSON-able values (epoch, scheduler state...), returned by :func:`load`.

    Returns:
        The committed manifest.

    Raises:
        ddl.checkpoint.CheckpointError: a rank could not write (the previous checkpoint at
            ``path`` is untouched); or the ranks hold different models while the optimizer
            does not say why (``LocalSGD``/``DiLoCo`` between rounds: pass it), before
            anything is written.
        TypeError: ``extra`` or a hyperparameter is not JSON-able.

    Example:
        >>> ddl.torch.checkpoint.save("ckpt", model=model, optimizer=opt)  # doctest: +SKIP
    """
    rank, size = _world()
    tensors: dict[str, Tensor] = {}
    values: dict[str, Any] = {}
    state = model.state_dict()
    periodic = isinstance(optimizer, _Periodic)
    if periodic:
        optimizer._land()  # a round in flight: finished (every rank saves at the same step) and kept
    same = _same_on_every_rank(state)
    if not same and not periodic:
        raise CheckpointError(
            "ddl.torch.checkpoint.save: the ranks hold different models, so no one file holds the model; with "
            "LocalSGD or DiLoCo between rounds pass optimizer=opt (each rank's weights are saved, and a load "
            "continues exactly), or call opt.synchronize() first. Nothing was written")
    if same:
        writers = partition_by_bytes([t.numel() * t.element_size() for t in state.values()], size).owners
        for (key, t), writer in zip(state.items(), writers, strict=True):
            if writer == rank:
                tensors[f"model/{key}"] = _tensor(t)
    else:
        for key, t in state.items():
            tensors[f"{local(rank)}/model/{key}"] = _tensor(t)
    meta: dict[str, Any] = {"model": {"keys": list(state), "replicas": None if same else size}}
    if optimizer is not None:
        if periodic:
            meta["optimizer"] = _save_periodic(optimizer, model, tensors, values, rank, size)
        else:
            meta["optimizer"] = _save_optimizer(optimizer, model, tensors, values, rank, size)
    return save_shards(path, tensors, values, framework=FRAMEWORK, meta=meta, extra=extra)


def _save_optimizer(optimizer: Any, model: torch.nn.Module, tensors: dict[str, Tensor], values: dict[str, Any],
                    rank: int, size: int) -> dict[str, Any]:
    """A torch optimizer or a DistributedOptimizer (sharded or not, with a stateful hook or not)."""
    inner, params, names = _optimizer_parts(optimizer, model)
    sharded = isinstance(optimizer, ShardedOptimizer)
    owners = optimizer.partition.owners if sharded else partition_of(params, size).owners
    _state_entries(inner, params, names, "optimizer/state",
                   lambda i: (owners[i] if owners[i] != NOBODY else 0) == rank, tensors, values)
    info: dict[str, Any] = {"class": _class_name(inner), "params": names, "sharded": sharded,
                            "param_groups": _groups_of(inner)}
    hook: Any = getattr(optimizer, "hook_state", None)
    if isinstance(optimizer, DistributedOptimizer) and saves_hook(hook):
        scaler = optimizer.__dict__.get("_grad_scaler")
        if scaler is not None:  # the scale the next step will use (the scaler's state resumes with it)
            hook.loss_scale = float(scaler.get_scale())
        info["hook"] = {**save_hook(hook, "hook", tensors, rank), "order": optimizer.gradient_order()}
    return info


def _save_periodic(opt: _Periodic, model: torch.nn.Module, tensors: dict[str, Tensor], values: dict[str, Any],
                   rank: int, size: int) -> dict[str, Any]:
    """LocalSGD or DiLoCo: what the ranks share once (anchor, a landed round, the outer
    optimizer, Q), and what each rank holds alone (its inner state, where it started a landed
    round, its hook errors)."""
    names = _names(opt._params, model, {})
    if any(n.startswith("param.") for n in names):
        raise ValueError(f"{type(opt).__name__} trains tensors that are not the model's parameters; save the model "
                         "whose parameters it averages")
    writers = partition_of(opt._params, size).owners
    mine = [i for i, w in enumerate(writers) if (w if w != NOBODY else 0) == rank]
    for what, shared in (("anchor", opt._anchor), ("landed", opt._landed)):
        for i in mine if shared is not None else []:
            tensors[f"optimizer/{what}/{names[i]}"] = _tensor(shared[i])  # type: ignore[index]
    if opt._landed is not None:
        for name, b in zip(names, opt._boundary, strict=True):
            tensors[f"{local(rank)}/boundary/{name}"] = _tensor(b)
    inner, inner_params, inner_names = _optimizer_parts(opt.optimizer, model)
    _state_entries(inner, inner_params, inner_names, f"{local(rank)}/inner", lambda i: True, tensors, values)
    info: dict[str, Any] = {
        "class": _class_name(opt), "params": names, "sharded": False, "param_groups": _groups_of(inner),
        "periodic": {"world": size, "period": opt.period, "overlap": opt.overlap, "steps": opt.steps,
                     "unsent": opt._unsent, "merge_at": opt._merge_at, "anchored": opt._anchor is not None,
                     "landed": opt._landed is not None},
        "inner": {"class": _class_name(inner), "params": inner_names},
    }
    outer = getattr(opt, "outer_optimizer", None)
    if isinstance(outer, torch.optim.Optimizer):
        outer_parts = _optimizer_parts(outer, model)
        owners = partition_of(outer_parts[1], size).owners
        _state_entries(*outer_parts, "optimizer/outer", lambda i: (owners[i] if owners[i] != NOBODY else 0) == rank,
                       tensors, values)
        info["outer"] = {"class": _class_name(outer), "params": outer_parts[2], "param_groups": _groups_of(outer)}
    if saves_hook(opt.hook_state):
        info["hook"] = save_hook(opt.hook_state, "hook", tensors, rank)
    return info


def load(path: str | Path, *, model: torch.nn.Module, optimizer: Any = None) -> dict[str, Any]:
    """Load a checkpoint saved by :func:`save` at any world size into ``model`` and ``optimizer``
    (call it on every rank; each reads the model and its own part of the optimizer state).

    Tensors load by name: a model that registers its parameters in another order loads.
    A stateful hook's state comes back with the optimizer: at the world size it was saved
    at each rank takes its own error feedback, at another every rank the saved ranks' mean
    (PowerSGD's average depends on the ranks' errors only through their mean, so the run
    goes on as it would have). ``LocalSGD``/``DiLoCo`` saved at this world size continue
    exactly, each rank from its own weights and inner state; saved at another between
    rounds, every rank continues from what ``synchronize()`` would have given at the save
    (the outer step over the saved ranks' weights, a landed round applied first), with the
    saved ranks' mean inner optimizer state and hook errors (and float buffers).

    Args:
        path: the checkpoint's folder.
        model: a model with the saved names, shapes and dtypes.
        optimizer: an optimizer of the saved class over the saved parameters (sharded or
            not, whichever way it was saved), or None to load the model alone.

    Returns:
        The ``extra`` values given to :func:`save`.

    Raises:
        ddl.checkpoint.CheckpointError: on every rank, naming the file and the field: no
            checkpoint, a missing or corrupt file, other names, shapes or dtypes, another
            optimizer class. Nothing has been changed then.

    Example:
        >>> extra = ddl.torch.checkpoint.load("ckpt", model=model, optimizer=opt)  # doctest: +SKIP
    """
    ckpt, model_values, loaded = together(lambda: _read(path, model, optimizer))
    with torch.no_grad():
        for t, value in model_values:
            t.copy_(value)
    if optimizer is None:
        return dict(ckpt.manifest.extra)
    assert loaded is not None
    if isinstance(optimizer, _Periodic):
        _load_periodic(optimizer, model, loaded)
        return dict(ckpt.manifest.extra)
    if isinstance(optimizer, ShardedOptimizer):
        optimizer.load_shard(loaded["state"])
    else:
        _inner(optimizer).load_state_dict(loaded["state"])
    if loaded.get("hook") is not None:
        if loaded["order"] is not None:
            optimizer._adopt_order(loaded["order"])
        optimizer.hook_state.load_state_dict(*loaded["hook"])
    return dict(ckpt.manifest.extra)


def _read(path: str | Path, model: torch.nn.Module,
          optimizer: Any) -> tuple[Checkpoint, list[tuple[torch.Tensor, torch.Tensor]], dict[str, Any] | None]:
    """Everything this rank loads, read and checked, nothing applied yet."""
    ckpt = Checkpoint.open(path, framework=FRAMEWORK)
    m, where = ckpt.manifest, Path(path) / "manifest.json"
    rank, size = _world()
    state = model.state_dict()
    _check_names(list(m.meta.get("model", {}).get("keys", [])), list(state), f"{where}: field meta.model.keys",
                 "the model's state_dict")
    replicas = m.meta["model"].get("replicas")
    periodic = isinstance(optimizer, _Periodic)
    check_replicas(where, replicas, size, periodic=periodic)
    if replicas is None:
        model_values = [(t, _entry(ckpt, f"model/{key}", t, where)) for key, t in state.items()]
    elif replicas == size:
        model_values = [(t, _entry(ckpt, f"{local(rank)}/model/{key}", t, where)) for key, t in state.items()]
    else:
        model_values = []  # the periodic optimizer's load sets them from every saved rank's
    if optimizer is None:
        return ckpt, model_values, None
    info = saved_optimizer(where, m.meta)
    wanted = _class_name(optimizer) if periodic else _class_name(_inner(optimizer))
    check_class(where, "meta.optimizer.class", info["class"], wanted)
    if periodic:
        return ckpt, model_values, _read_periodic(ckpt, info, optimizer, model, where, replicas)
    inner, params, names = _optimizer_parts(optimizer, model)
    _check_names(list(info["params"]), names, f"{where}: field meta.optimizer.params", "the optimizer's parameters")
    groups = _groups_by_name(decode_value(info["param_groups"]), list(info["params"]), inner, names,
                             f"{where}: field meta.optimizer.param_groups")
    sharded = isinstance(optimizer, ShardedOptimizer)
    state_of = _read_state(ckpt, "optimizer/state", params, names,
                           lambda i: not sharded or optimizer.owns(params[i]))  # another rank's part in this world
    loaded: dict[str, Any] = {"state": {"state": state_of, "param_groups": groups}, "hook": None, "order": None}
    hook = info.get("hook")
    if hook is not None and isinstance(optimizer, DistributedOptimizer) and saves_hook(optimizer.hook_state):
        loaded["hook"] = read_hook(ckpt, hook, "hook", saved_world=m.world_size, rank=rank, size=size)
        loaded["order"] = hook.get("order")
    return ckpt, model_values, loaded


def _read_periodic(ckpt: Checkpoint, info: dict[str, Any], opt: _Periodic, model: torch.nn.Module, where: Path,
                   replicas: int | None) -> dict[str, Any]:
    """LocalSGD/DiLoCo: this rank's part (its own at the saved world size, the saved ranks'
    mean at another) and, for another world between rounds, every saved rank's weights."""
    rank, size = _world()
    periodic = info["periodic"]
    saved_world = int(periodic["world"])
    names = _names(opt._params, model, {})
    _check_names(list(info["params"]), names, f"{where}: field meta.optimizer.params", "the optimizer's parameters")
    if (int(periodic["period"]), int(periodic["overlap"])) != (opt.period, opt.overlap):
        raise CheckpointError(f"{where}: field meta.optimizer.periodic has period={periodic['period']}, "
                              f"overlap={periodic['overlap']}; the optimizer period={opt.period}, "
                              f"overlap={opt.overlap}: build it as it was saved")
    inner, inner_params, inner_names = _optimizer_parts(opt.optimizer, model)
    check_class(where, "meta.optimizer.inner.class", info["inner"]["class"], _class_name(inner), "the inner optimizer")
    _check_names(list(info["inner"]["params"]), inner_names, f"{where}: field meta.optimizer.inner.params",
                 "the inner optimizer's parameters")
    same_world = saved_world == size
    ranks = [rank] if same_world else list(range(saved_world))
    inner_states = [_read_state(ckpt, f"{local(r)}/inner", inner_params, inner_names, lambda i: True) for r in ranks]
    out: dict[str, Any] = {
        "periodic": periodic,
        "inner": {"state": inner_states[0] if same_world else _mean_states(inner_states),
                  "param_groups": _groups_by_name(decode_value(info["param_groups"]), list(info["inner"]["params"]),
                                                  inner, inner_names, f"{where}: field meta.optimizer.param_groups")},
        "anchor": _read_tensors(ckpt, "optimizer/anchor", names, opt._params) if periodic["anchored"] else None,
        "landed": _read_tensors(ckpt, "optimizer/landed", names, opt._params) if periodic["landed"] else None,
        "boundary": None, "outer": None, "hook": None, "replicas": None,
    }
    if periodic["landed"] and same_world:
        out["boundary"] = _read_tensors(ckpt, f"{local(rank)}/boundary", names, opt._params)
    outer = getattr(opt, "outer_optimizer", None)
    if "outer" in info and isinstance(outer, torch.optim.Optimizer):
        outer_inner, outer_params, outer_names = _optimizer_parts(outer, model)
        check_class(where, "meta.optimizer.outer.class", info["outer"]["class"], _class_name(outer_inner),
                    "the outer optimizer")
        out["outer"] = {"state": _read_state(ckpt, "optimizer/outer", outer_params, outer_names, lambda i: True),
                        "param_groups": _groups_by_name(decode_value(info["outer"]["param_groups"]),
                                                        list(info["outer"]["params"]), outer_inner, outer_names,
                                                        f"{where}: field meta.optimizer.outer.param_groups")}
    if info.get("hook") is not None and saves_hook(opt.hook_state):
        out["hook"] = read_hook(ckpt, info["hook"], "hook", saved_world=saved_world, rank=rank, size=size)
    if replicas is not None and not same_world:
        state = model.state_dict()
        out["replicas"] = [{key: _entry(ckpt, f"{local(r)}/model/{key}", t, where) for key, t in state.items()}
                           for r in range(replicas)]
        if periodic["landed"]:
            out["boundaries"] = [_read_tensors(ckpt, f"{local(r)}/boundary", names, opt._params)
                                 for r in range(replicas)]
        out["names"] = names
    return out


def _load_periodic(opt: _Periodic, model: torch.nn.Module, loaded: dict[str, Any]) -> None:
    periodic = loaded["periodic"]
    opt.optimizer.load_state_dict(loaded["inner"])
    if loaded["outer"] is not None:
        opt.outer_optimizer.load_state_dict(loaded["outer"])  # type: ignore[attr-defined]
    opt.steps, opt._unsent, opt._merge_at = int(periodic["steps"]), int(periodic["unsent"]), int(periodic["merge_at"])
    opt._anchor = opt._like_params(loaded["anchor"])
    opt._landed = opt._like_params(loaded["landed"])
    opt._boundary = opt._like_params(loaded["boundary"]) or []
    opt._pending = None
    if loaded["hook"] is not None:
        opt.hook_state.load_state_dict(*loaded["hook"])
    replicas = loaded["replicas"]
    if replicas is None:
        return
    # Saved between rounds at another world size: every rank continues from what
    # synchronize() would have given there (other state: float buffers the saved ranks'
    # mean, the rest rank 0's; the optimizer's parameters are set from the anchor).
    names = loaded["names"]
    with torch.no_grad():
        for key, t in model.state_dict().items():
            if key not in names:
                t.copy_(_mean([r[key] for r in replicas]) if t.dtype.is_floating_point else replicas[0][key])
    weights = [[r[key].to(p.device, p.dtype) for key, p in zip(names, opt._params, strict=True)] for r in replicas]
    boundaries = loaded.get("boundaries")
    opt._synchronize_saved(weights, [[b.to(p.device, p.dtype) for b, p in zip(bs, opt._params, strict=True)]
                                     for bs in boundaries] if boundaries else None)


# -- the pieces ---------------------------------------------------------------------------------
def _same_on_every_rank(state: Mapping[str, torch.Tensor]) -> bool:
    """Whether every rank holds these very bytes (a collective)."""
    return same_on_every_rank((_tensor(t).data for t in state.values()), name="ddl.torch.checkpoint.same")


def _names(params: list[torch.Tensor], model: torch.nn.Module, given: Mapping[torch.Tensor, str]) -> list[str]:
    by_model: dict[torch.Tensor, str] = {p: n for n, p in model.named_parameters()}
    return [by_model.get(p) or given.get(p) or f"param.{i}" for i, p in enumerate(params)]


def _groups_of(optimizer: torch.optim.Optimizer) -> list[Any]:
    groups = optimizer.state_dict()["param_groups"]
    return [encode_value(g, f"param_groups[{i}]") for i, g in enumerate(groups)]


def _state_entries(inner: torch.optim.Optimizer, params: list[torch.Tensor], names: list[str], prefix: str,
                   writes: Callable[[int], bool], tensors: dict[str, Tensor], values: dict[str, Any]) -> None:
    """The per-parameter state of ``inner`` that this rank writes, under ``prefix/<name>/<slot>``."""
    for i, p in enumerate(params):
        if not writes(i) or p not in inner.state:
            continue
        for slot, value in inner.state[p].items():
            key = f"{prefix}/{names[i]}/{slot}"
            if isinstance(value, torch.Tensor):
                tensors[key] = _tensor(value)
            else:
                values[key] = value


def _read_state(ckpt: Checkpoint, prefix: str, params: list[torch.Tensor], names: list[str],
                reads: Callable[[int], bool]) -> dict[int, dict[str, Any]]:
    """The per-parameter state under ``prefix``, by place in the optimizer, for those ``reads`` takes."""
    m = ckpt.manifest
    state_of: dict[int, dict[str, Any]] = {}
    for i, name in enumerate(names):
        if not reads(i):
            continue
        start = f"{prefix}/{name}/"
        slots = {}
        for key in m.keys(start):
            entry = m.entries[key]
            slots[key[len(start):]] = (entry.value if entry.inline
                                       else _from_raw(ckpt.reader.raw(key), entry.dtype, entry.shape))
        if slots:
            state_of[i] = slots
    return state_of


def _read_tensors(ckpt: Checkpoint, prefix: str, names: list[str], like: list[torch.Tensor]) -> list[torch.Tensor]:
    where = ckpt.folder / "manifest.json"
    return [_entry(ckpt, f"{prefix}/{name}", t, where) for name, t in zip(names, like, strict=True)]


def _entry(ckpt: Checkpoint, key: str, like: torch.Tensor, where: Path) -> torch.Tensor:
    """Tensor ``key``, checked against the shape and dtype of ``like``."""
    entry = ckpt.reader.entry(key)
    if tuple(entry.shape) != tuple(like.shape) or entry.dtype != _dtype_name(like.dtype):
        raise CheckpointError(f"{where}: entry {key!r} is {entry.dtype}{list(entry.shape)}, the model's "
                              f"tensor is {_dtype_name(like.dtype)}{list(like.shape)}")
    return _from_raw(ckpt.reader.raw(key), entry.dtype, entry.shape)


def _mean(tensors: list[torch.Tensor]) -> torch.Tensor:  # in torch: bfloat16 and devices as they are
    return torch.stack([t.double() for t in tensors]).mean(0).to(tensors[0].dtype)


def _mean_states(states: list[dict[int, dict[str, Any]]]) -> dict[int, dict[str, Any]]:
    """The saved ranks' states combined for a world of another size: floating tensors averaged
    over the ranks that hold the slot, anything else rank 0's (the first that holds it)."""
    out: dict[int, dict[str, Any]] = {}
    for i in sorted({i for s in states for i in s}):
        slots: dict[str, Any] = {}
        for slot in dict.fromkeys(k for s in states if i in s for k in s[i]):
            held = [s[i][slot] for s in states if i in s and slot in s[i]]
            first = held[0]
            slots[slot] = (_mean(held) if isinstance(first, torch.Tensor) and first.is_floating_point() else first)
        out[i] = slots
    return out


def _check_names(saved: list[str], now: list[str], field: str, what: str) -> None:
    """The same names, in any order (tensors load by name), or an error naming the differences."""
    if set(saved) == set(now) and len(saved) == len(now):
        return
    missing = [k for k in now if k not in set(saved)]
    unexpected = [k for k in saved if k not in set(now)]

    def some(keys: list[str]) -> str:
        return f"{keys[:5]}" + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")

    raise CheckpointError(f"{field} differs from {what}: {len(missing)} missing from the checkpoint {some(missing)}, "
                          f"{len(unexpected)} not in {what} {some(unexpected)}: load it into the model it was saved "
                          "from (or rename the keys)")


def _groups_by_name(saved: list[dict[str, Any]], saved_names: list[str], inner: torch.optim.Optimizer,
                    names: list[str], field: str) -> list[dict[str, Any]]:
    """The saved parameter groups (their hyperparameters) renumbered for ``inner``'s parameters,
    which may list the same names in another order; each group must hold the same names."""
    now = [[names[i] for i in range(start, start + len(g["params"]))]
           for start, g in zip(_starts(inner.param_groups), inner.param_groups, strict=True)]
    then = [[saved_names[int(i)] for i in g["params"]] for g in saved]
    if len(then) != len(now) or any(set(a) != set(b) for a, b in zip(then, now, strict=True)):
        raise CheckpointError(f"{field} has groups of {[len(g) for g in then]} parameters "
                              f"(first names {[g[:2] for g in then]}), the optimizer "
                              f"{[len(g) for g in now]} (first names {[g[:2] for g in now]}): build the "
                              "optimizer's parameter groups as they were saved")
    return [{**g, "params": list(range(start, start + len(g["params"])))}
            for start, g in zip(_starts(inner.param_groups), saved, strict=True)]


def _starts(groups: list[dict[str, Any]]) -> list[int]:
    out, at = [], 0
    for g in groups:
        out.append(at)
        at += len(g["params"])
    return out


def consolidate(path: str | Path, out: str | Path, *, optimizer_out: str | Path | None = None) -> list[str]:
    """Write the checkpoint at ``path`` as plain one-process torch files: ``out`` gets the
    model's ``state_dict`` (``model.load_state_dict(torch.load(out))``), ``optimizer_out``
    (if given) the optimizer's (``opt.load_state_dict(torch.load(optimizer_out))``).

    Returns:
        What was written, one line each.

    Raises:
        ddl.checkpoint.CheckpointError: no checkpoint, a missing or corrupt file, or an
            optimizer file asked of a checkpoint without one.

    Example:
        >>> ddl.torch.checkpoint.consolidate("ckpt", "model.pt", optimizer_out="opt.pt")  # doctest: +SKIP
    """
    ckpt = Checkpoint.open(path, framework=FRAMEWORK)
    m = ckpt.manifest
    state = OrderedDict((key, _from_raw(ckpt.reader.raw(f"model/{key}"), m.entries[f"model/{key}"].dtype,
                                        m.entries[f"model/{key}"].shape))
                        for key in m.meta["model"]["keys"])
    torch.save(state, out)
    lines = [f"{out}: model state_dict, {len(state)} tensors"]
    if optimizer_out is not None:
        info = m.meta.get("optimizer")
        if info is None:
            raise CheckpointError(f"{Path(path) / 'manifest.json'}: field meta.optimizer is missing: no optimizer "
                                  "state to write")
        osd: dict[str, Any] = {"state": {}, "param_groups": [decode_value(g) for g in info["param_groups"]]}
        for i, name in enumerate(info["params"]):
            prefix = f"optimizer/state/{name}/"
            slots = {k[len(prefix):]: (m.entries[k].value if m.entries[k].inline else
                                       _from_raw(ckpt.reader.raw(k), m.entries[k].dtype, m.entries[k].shape))
                     for k in m.keys(prefix)}
            if slots:
                osd["state"][i] = slots
        torch.save(osd, optimizer_out)
        lines.append(f"{optimizer_out}: {info['class']} state_dict, state for {len(osd['state'])} of "
                     f"{len(info['params'])} parameters")
    return lines


def write_consolidated(path: str, out: str, optimizer_out: str | None = None) -> list[str]:
    """``ddl checkpoint consolidate PATH -o FILE.pt``'s writer (the ``ddl.checkpoint.writers`` entry point)."""
    return consolidate(path, out, optimizer_out=optimizer_out)


# -- plumbing ------------------------------------------------------------------------------
def _world() -> tuple[int, int]:
    return (ddl.rank(), ddl.size()) if ddl.is_initialized() else (0, 1)


def _inner(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer inside ddl's wrappers (or ``optimizer`` itself)."""
    if isinstance(optimizer, DistributedOptimizer):
        inner = optimizer.optimizer
    elif isinstance(optimizer, torch.optim.Optimizer):
        inner = optimizer
    else:
        inner = getattr(optimizer, "optimizer", None)  # Horovod's Adasum wrapper holds one too
    if not isinstance(inner, torch.optim.Optimizer):
        raise TypeError(f"ddl.torch.checkpoint takes a torch optimizer or a ddl wrapper of one, got "
                        f"{type(optimizer).__name__}")
    return inner


def _optimizer_parts(optimizer: Any, model: torch.nn.Module) -> tuple[torch.optim.Optimizer, list[torch.Tensor], list[str]]:
    """The torch optimizer, its parameters in group order, and their names (the model's)."""
    inner = _inner(optimizer)
    params = _all_params(inner)
    by_model = {p: n for n, p in model.named_parameters()}
    given = getattr(optimizer, "_parameter_names", {}) if optimizer is not inner else {}
    names = []
    for g, group in enumerate(inner.param_groups):
        for i, p in enumerate(group["params"]):
            names.append(by_model.get(p) or given.get(p) or f"param_groups[{g}].params[{i}]")
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ValueError(f"the optimizer holds parameter {dup!r} twice; a checkpoint names each once")
    return inner, params, names


def _class_name(optimizer: torch.optim.Optimizer) -> str:
    cls = type(optimizer)
    return f"{cls.__module__}.{cls.__qualname__}"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _tensor(t: torch.Tensor) -> Tensor:
    """A tensor's bytes for the core (on the host, contiguous; no copy for a contiguous CPU tensor)."""
    flat = t.detach().reshape(-1).contiguous().cpu()
    return Tensor(flat.view(torch.uint8).numpy(), _dtype_name(t.dtype), tuple(t.shape))


def _from_raw(raw: np.ndarray, dtype: str, shape: tuple[int, ...]) -> torch.Tensor:
    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise CheckpointError(f"this checkpoint holds a tensor of dtype {dtype!r}, which torch does not know")
    return torch.from_numpy(raw).view(torch_dtype).reshape(shape)
