"""Checkpoints of a Keras 3 model and optimizer in ddl's format: saved as shards, loaded at any world size.

The model's variables are keyed by their place in ``model.weights`` (Keras names layers
by process-wide counters, so a name differs between processes that built other models
first); their paths, shapes and dtypes are recorded and checked. The optimizer's slot
variables (Adam's ``_momentums``, SGD's ``momentums``, ...) are keyed by the place of the
variable they belong to and the slot list's name, with the step counter beside them. A
sharded :class:`~ddl.tensorflow.keras.DistributedOptimizer` writes and reads the slots of
its own variables; an unsharded one writes a byte-balanced share and reads them all.

Example:
    >>> ddl.tensorflow.keras.checkpoint.save("ckpt", model=model, optimizer=model.optimizer)  # doctest: +SKIP
    >>> ddl.tensorflow.keras.checkpoint.load("ckpt", model=model, optimizer=model.optimizer)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import keras
import numpy as np

import ddl
from ddl.checkpoint import Checkpoint, CheckpointError, Manifest, Tensor, together
from ddl.checkpoint import save as save_shards
from ddl.reduction.partition import partition_by_bytes

from .optimizer import DistributedOptimizer
from .slots import local_index, slots

FRAMEWORK = "keras"


def save(path: str | Path, *, model: keras.Model, optimizer: Any = None,
         extra: Mapping[str, Any] | None = None) -> Manifest:
    """Save ``model`` and ``optimizer`` into the folder ``path`` (call it on every rank).

    Args:
        path: a folder every rank can reach.
        model: the Keras model; all of ``model.weights`` is saved.
        optimizer: a built Keras optimizer or ``ddl.tensorflow.keras.DistributedOptimizer``
            (sharded or not); None saves the model alone.
        extra: your own JSON-able values, returned by :func:`load`.

    Returns:
        The committed manifest.

    Raises:
        ddl.checkpoint.CheckpointError: a rank could not write; the previous checkpoint stays.
        ValueError: the optimizer is not built yet.

    Example:
        >>> ddl.tensorflow.keras.checkpoint.save("ckpt", model=model, optimizer=model.optimizer)  # doctest: +SKIP
    """
    rank, size = (ddl.rank(), ddl.size()) if ddl.is_initialized() else (0, 1)
    weights = list(model.weights)
    tensors: dict[str, Tensor] = {}
    writers = partition_by_bytes([_nbytes(v) for v in weights], size).owners
    for i, (v, writer) in enumerate(zip(weights, writers, strict=True)):
        if writer == rank:
            tensors[f"model/{i:05d}"] = Tensor.of(np.asarray(v))
    meta: dict[str, Any] = {"model": {"paths": [v.path for v in weights], "config": _config(model)}}
    values: dict[str, Any] = {}
    if optimizer is not None:
        inner, tvs, owned = _optimizer_parts(optimizer, model)
        writes = owned if _sharded(optimizer) else partition_by_bytes([_nbytes(v) for v in tvs], size).owned_by(rank)
        for slot, variables in slots(inner).items():
            for i in writes:
                tensors[f"optimizer/state/{i:05d}/{slot}"] = Tensor.of(np.asarray(variables[local_index(inner, tvs[i])]))
        if rank == 0:
            values["optimizer/iterations"] = int(np.asarray(inner._iterations))
        meta["optimizer"] = {"class": _class_name(inner), "params": [v.path for v in tvs],
                             "shapes": [list(v.shape) for v in tvs], "sharded": _sharded(optimizer),
                             "slots": sorted(slots(inner))}
    return save_shards(path, tensors, values, framework=FRAMEWORK, meta=meta, extra=extra)


def load(path: str | Path, *, model: keras.Model, optimizer: Any = None) -> dict[str, Any]:
    """Load a checkpoint saved by :func:`save` at any world size (call it on every rank).

    The optimizer must be built (``optimizer.build(model.trainable_variables)``, as
    ``model.fit``'s first step would) so that its slot variables exist to load into.

    Returns:
        The ``extra`` values given to :func:`save`.

    Raises:
        ddl.checkpoint.CheckpointError: on every rank, naming the file and the field: no
            checkpoint, a missing or corrupt file, other shapes or dtypes, another
            optimizer class or slots. Nothing has been changed then.

    Example:
        >>> opt.build(model.trainable_variables)                                          # doctest: +SKIP
        >>> extra = ddl.tensorflow.keras.checkpoint.load("ckpt", model=model, optimizer=opt)  # doctest: +SKIP
    """
    ckpt, assignments, iterations = together(lambda: _read(path, model, optimizer))
    for variable, value in assignments:
        variable.assign(value)
    if iterations is not None:
        _inner(optimizer)._iterations.assign(iterations)
    return dict(ckpt.manifest.extra)


def _read(path: str | Path, model: keras.Model, optimizer: Any) -> tuple[Checkpoint, list[tuple[Any, np.ndarray]], int | None]:
    ckpt = Checkpoint.open(path, framework=FRAMEWORK)
    m, where = ckpt.manifest, Path(path) / "manifest.json"
    weights = list(model.weights)
    paths = m.meta["model"]["paths"]
    if len(paths) != len(weights):
        raise CheckpointError(f"{where}: field meta.model.paths lists {len(paths)} variables, the model has "
                              f"{len(weights)}: build the model the checkpoint was saved from")
    out: list[tuple[Any, np.ndarray]] = []
    for i, v in enumerate(weights):
        entry = ckpt.reader.entry(f"model/{i:05d}")
        if tuple(entry.shape) != tuple(v.shape) or entry.dtype != np.dtype(v.dtype).name:
            raise CheckpointError(f"{where}: entry 'model/{i:05d}' ({paths[i]}) is {entry.dtype}{list(entry.shape)}, "
                                  f"the model's {v.path} is {np.dtype(v.dtype).name}{list(v.shape)}")
        out.append((v, ckpt.reader.array(f"model/{i:05d}")))
    if optimizer is None:
        return ckpt, out, None
    info = m.meta.get("optimizer")
    if info is None:
        raise CheckpointError(f"{where}: field meta.optimizer is missing: saved without an optimizer; load with "
                              "optimizer=None")
    inner, tvs, owned = _optimizer_parts(optimizer, model)
    if info["class"] != _class_name(inner):
        raise CheckpointError(f"{where}: field meta.optimizer.class is {info['class']}, the optimizer is "
                              f"{_class_name(inner)}: build the optimizer the checkpoint was saved with")
    if [list(s) for s in info["shapes"]] != [list(v.shape) for v in tvs]:
        raise CheckpointError(f"{where}: field meta.optimizer.shapes differs from the optimizer's variables "
                              f"({len(info['shapes'])} saved, {len(tvs)} now)")
    found = slots(inner)
    if found and info["slots"] and sorted(found) != list(info["slots"]):  # a rank with no variables has no slots
        raise CheckpointError(f"{where}: field meta.optimizer.slots is {info['slots']}, the optimizer has "
                              f"{sorted(found)} (other options, e.g. amsgrad or momentum?)")
    for slot, variables in found.items():
        for i in owned:
            out.append((variables[local_index(inner, tvs[i])], ckpt.reader.array(f"optimizer/state/{i:05d}/{slot}")))
    return ckpt, out, int(m.entries["optimizer/iterations"].value)


def consolidate(path: str | Path, out: str | Path, *, model: keras.Model | None = None) -> list[str]:
    """Write the model of the checkpoint at ``path`` as a Keras ``.weights.h5`` file.

    The model is rebuilt from the config saved with it (functional and Sequential models),
    or pass ``model`` (a subclassed one): its weights are set from the checkpoint first.

    Raises:
        ddl.checkpoint.CheckpointError: a missing or corrupt file, or no config to rebuild from.

    Example:
        >>> ddl.tensorflow.keras.checkpoint.consolidate("ckpt", "model.weights.h5")  # doctest: +SKIP
    """
    ckpt = Checkpoint.open(path, framework=FRAMEWORK)
    if model is None:
        config = ckpt.manifest.meta["model"].get("config")
        if config is None:
            raise CheckpointError(f"{Path(path) / 'manifest.json'}: field meta.model.config is missing (a subclassed "
                                  "model); call ddl.tensorflow.keras.checkpoint.consolidate(path, out, model=model)")
        model = keras.models.model_from_json(config)
    n = len(ckpt.manifest.meta["model"]["paths"])
    model.set_weights([ckpt.reader.array(f"model/{i:05d}") for i in range(n)])
    model.save_weights(str(out))
    return [f"{out}: {n} model variables"]


def write_consolidated(path: str, out: str, optimizer_out: str | None = None) -> list[str]:
    """``ddl checkpoint consolidate PATH -o FILE.weights.h5``'s writer (an entry point)."""
    if optimizer_out is not None:
        raise CheckpointError("a Keras .weights.h5 file holds the model only: drop --optimizer")
    return consolidate(path, out)


# -- plumbing --------------------------------------------------------------------------------
def _nbytes(v: Any) -> int:
    count = int(np.prod(v.shape, dtype=np.int64))
    return count * int(np.dtype(v.dtype).itemsize)


def _config(model: keras.Model) -> str | None:
    try:
        return str(model.to_json())
    except (NotImplementedError, TypeError, ValueError):
        return None  # a subclassed model without get_config


def _sharded(optimizer: Any) -> bool:
    return isinstance(optimizer, DistributedOptimizer) and optimizer.shard_optimizer_state


def _inner(optimizer: Any) -> Any:
    return optimizer.inner_optimizer if isinstance(optimizer, DistributedOptimizer) else optimizer


def _optimizer_parts(optimizer: Any, model: keras.Model) -> tuple[Any, list[Any], list[int]]:
    """The Keras optimizer holding the slots, the variables it trains (in the order the
    wrapper was built with) and the indices of those whose slots this rank holds."""
    if not optimizer.built:
        raise ValueError("the optimizer has no slot variables yet: call optimizer.build(model.trainable_variables) "
                         "first (model.fit's first step would)")
    tvs = list(optimizer._trainable_variables)
    if _sharded(optimizer):
        mine = {id(v) for v in optimizer.owned_variables()}
        return optimizer.inner_optimizer, tvs, [i for i, v in enumerate(tvs) if id(v) in mine]
    return _inner(optimizer), tvs, list(range(len(tvs)))


def _class_name(optimizer: Any) -> str:
    cls = type(optimizer)
    return f"{cls.__module__}.{cls.__qualname__}"
