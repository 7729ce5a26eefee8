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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

import ddl
import torch
from ddl.checkpoint import Checkpoint, CheckpointError, Manifest, Tensor, together
from ddl.checkpoint import save as save_shards
from ddl.checkpoint.manifest import decode_value, encode_value
from ddl.reduction.partition import NOBODY, partition_by_bytes

from .optimizer import DistributedOptimizer, _all_params
from .sharded_optimizer import ShardedOptimizer, partition_of

FRAMEWORK = "torch"


def save(path: str | Path, *, model: torch.nn.Module, optimizer: Any = None,
         extra: Mapping[str, Any] | None = None) -> Manifest:
    """Save ``model`` and ``optimizer`` into the folder ``path`` (call it on every rank).

    Args:
        path: a folder every rank can reach (a shared filesystem across hosts).
        model: the model; its ``state_dict()`` (parameters and buffers) is saved.
        optimizer: a ``torch.optim.Optimizer``, ``ddl.torch.DistributedOptimizer`` (sharded
            or not) or ``ZeroRedundancyOptimizer``; None saves the model alone.
        extra: your own JSON-able values (epoch, scheduler state...), returned by :func:`load`.

    Returns:
        The committed manifest.

    Raises:
        ddl.checkpoint.CheckpointError: a rank could not write; the previous checkpoint
            at ``path`` is untouched.
        TypeError: ``extra`` or a hyperparameter is not JSON-able.

    Example:
        >>> ddl.torch.checkpoint.save("ckpt", model=model, optimizer=opt)  # doctest: +SKIP
    """
    rank, size = _world()
    tensors: dict[str, Tensor] = {}
    values: dict[str, Any] = {}
    state = model.state_dict()
    writers = partition_by_bytes([t.numel() * t.element_size() for t in state.values()], size).owners
    for (key, t), writer in zip(state.items(), writers, strict=True):
        if writer == rank:
            tensors[f"model/{key}"] = _tensor(t)
    meta: dict[str, Any] = {"model": {"keys": list(state)}}
    if optimizer is not None:
        inner, params, names = _optimizer_parts(optimizer, model)
        sharded = isinstance(optimizer, ShardedOptimizer)
        owners = optimizer.partition.owners if sharded else partition_of(params, size).owners
        for i, p in enumerate(params):
            if (owners[i] if owners[i] != NOBODY else 0) != rank or p not in inner.state:
                continue
            for slot, value in inner.state[p].items():
                key = f"optimizer/state/{names[i]}/{slot}"
                if isinstance(value, torch.Tensor):
                    tensors[key] = _tensor(value)
                else:
                    values[key] = value
        groups = inner.state_dict()["param_groups"]
        meta["optimizer"] = {"class": _class_name(inner), "params": names, "sharded": sharded,
                             "param_groups": [encode_value(g, f"param_groups[{i}]") for i, g in enumerate(groups)]}
    return save_shards(path, tensors, values, framework=FRAMEWORK, meta=meta, extra=extra)


def load(path: str | Path, *, model: torch.nn.Module, optimizer: Any = None) -> dict[str, Any]:
    """Load a checkpoint saved by :func:`save` at any world size into ``model`` and ``optimizer``
    (call it on every rank; each reads the model and its own part of the optimizer state).

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
    staged = together(lambda: _read(path, model, optimizer))
    ckpt, model_values, opt_state = staged
    with torch.no_grad():
        for t, value in model_values:
            t.copy_(value)
    if optimizer is not None:
        assert opt_state is not None
        if isinstance(optimizer, ShardedOptimizer):
            optimizer.load_shard(opt_state)
        else:
            _inner(optimizer).load_state_dict(opt_state)
    return dict(ckpt.manifest.extra)


def _read(path: str | Path, model: torch.nn.Module,
          optimizer: Any) -> tuple[Checkpoint, list[tuple[torch.Tensor, torch.Tensor]], dict[str, Any] | None]:
    """Everything this rank loads, read and checked, nothing applied yet."""
    ckpt = Checkpoint.open(path, framework=FRAMEWORK)
    m, where = ckpt.manifest, Path(path) / "manifest.json"
    state = model.state_dict()
    _check_names(list(m.meta.get("model", {}).get("keys", [])), list(state), f"{where}: field meta.model.keys",
                 "the model's state_dict")
    model_values = []
    for key, t in state.items():
        entry = ckpt.reader.entry(f"model/{key}")
        if tuple(entry.shape) != tuple(t.shape) or entry.dtype != _dtype_name(t.dtype):
            raise CheckpointError(f"{where}: entry 'model/{key}' is {entry.dtype}{list(entry.shape)}, the model's "
                                  f"tensor is {_dtype_name(t.dtype)}{list(t.shape)}")
        model_values.append((t, _from_raw(ckpt.reader.raw(f"model/{key}"), entry.dtype, entry.shape)))
    if optimizer is None:
        return ckpt, model_values, None
    info = m.meta.get("optimizer")
    if info is None:
        raise CheckpointError(f"{where}: field meta.optimizer is missing: this checkpoint was saved without an "
                              "optimizer; load it with optimizer=None")
    inner, params, names = _optimizer_parts(optimizer, model)
    if info["class"] != _class_name(inner):
        raise CheckpointError(f"{where}: field meta.optimizer.class is {info['class']}, the optimizer is "
                              f"{_class_name(inner)}: build the optimizer the checkpoint was saved with")
    _check_names(list(info["params"]), names, f"{where}: field meta.optimizer.params", "the optimizer's parameters")
    groups = _groups_by_name(decode_value(info["param_groups"]), list(info["params"]), inner, names,
                             f"{where}: field meta.optimizer.param_groups")
    sharded = isinstance(optimizer, ShardedOptimizer)
    state_of: dict[int, dict[str, Any]] = {}
    for i, (p, name) in enumerate(zip(params, names, strict=True)):
        if sharded and not optimizer.owns(p):
            continue  # another rank's part in this world
        prefix = f"optimizer/state/{name}/"
        slots = {}
        for key in m.keys(prefix):
            entry = m.entries[key]
            slots[key[len(prefix):]] = (entry.value if entry.inline
                                        else _from_raw(ckpt.reader.raw(key), entry.dtype, entry.shape))
        if slots:
            state_of[i] = slots
    return ckpt, model_values, {"state": state_of, "param_groups": groups}


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
