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

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import keras
import numpy as np

import ddl
from ddl.checkpoint import Checkpoint, CheckpointError, Manifest, Tensor, together
from ddl.checkpoint import save as save_shards
from ddl.checkpoint.checks import check_class, check_replicas, saved_optimizer
from ddl.checkpoint.replicas import (
    local,
    mean,
    read_hook,
    same_on_every_rank,
    save_hook,
    saves_hook,
)
from ddl.reduction.partition import partition_by_bytes

from .local_sgd import _Periodic
from .lossscale import is_loss_scale
from .optimizer import DistributedOptimizer
from .slots import local_index, slots

FRAMEWORK = "keras"


def save(path: str | Path, *, model: keras.Model, optimizer: Any = None,
         extra: Mapping[str, Any] | None = None) -> Manifest:
    """Save ``model`` and ``optimizer`` into the folder ``path`` (call it on every rank).

    The optimizer may be layered: a ``LossScaleOptimizer`` (around or inside), a
    ``DistributedOptimizer`` (sharded or not, with a PowerSGD hook or not), ``LocalSGD`` or
    ``DiLoCo``, around the Keras optimizer that holds the slots. Saved with it: the slots, each
    layer's counters (step counts, a loss scale and its growth counter), a hook's shared state
    and each rank's errors, and for LocalSGD/DiLoCo the anchor, the outer optimizer and, per
    rank, the inner state, where a round in flight started and, between rounds, the weights.

    Args:
        path: a folder every rank can reach.
        model: the Keras model; all of ``model.weights`` is saved.
        optimizer: a built Keras optimizer (any of the above, e.g. ``model.optimizer``); None
            saves the model alone.
        extra: your own JSON-able values, returned by :func:`load`.

    Returns:
        The committed manifest.

    Raises:
        ddl.checkpoint.CheckpointError: a rank could not write (the previous checkpoint
            stays); or the ranks hold different models and the optimizer does not say why
            (LocalSGD/DiLoCo between rounds: pass it), before anything is written.
        ValueError: the optimizer is not built yet.

    Example:
        >>> ddl.tensorflow.keras.checkpoint.save("ckpt", model=model, optimizer=model.optimizer)  # doctest: +SKIP
    """
    rank, size = _world()
    weights = list(model.weights)
    arrays = [np.asarray(v) for v in weights]
    layers = _Layers(optimizer) if optimizer is not None else None
    periodic = layers is not None and layers.periodic is not None
    same = same_on_every_rank(arrays, name="ddl.keras.checkpoint.same")
    if not same and not periodic:
        raise CheckpointError(
            "ddl.tensorflow.keras.checkpoint.save: the ranks hold different models, so no one file holds the model; "
            "with LocalSGD or DiLoCo between rounds pass optimizer=model.optimizer (each rank's weights are saved), "
            "or call optimizer.synchronize() first. Nothing was written")
    tensors: dict[str, Tensor] = {}
    values: dict[str, Any] = {}
    if same:
        writers = partition_by_bytes([_nbytes(v) for v in weights], size).owners
        for i, (a, writer) in enumerate(zip(arrays, writers, strict=True)):
            if writer == rank:
                tensors[f"model/{i:05d}"] = Tensor.of(a)
    else:
        for i, a in enumerate(arrays):
            tensors[f"{local(rank)}/model/{i:05d}"] = Tensor.of(a)
    meta: dict[str, Any] = {"model": {"paths": [v.path for v in weights], "config": _config(model),
                                      "replicas": None if same else size}}
    if layers is not None:
        meta["optimizer"] = layers.save(tensors, values, rank, size)
    return save_shards(path, tensors, values, framework=FRAMEWORK, meta=meta, extra=extra)


def load(path: str | Path, *, model: keras.Model, optimizer: Any = None) -> dict[str, Any]:
    """Load a checkpoint saved by :func:`save` at any world size (call it on every rank).

    The optimizer must be built (``optimizer.build(model.trainable_variables)``, as
    ``model.fit``'s first step would) so that its variables exist to load into. At the
    world size it was saved at, each rank takes what it held alone (a hook's errors;
    LocalSGD/DiLoCo's inner state and weights); at another, a hook's errors and a
    LocalSGD/DiLoCo inner state are the saved ranks' mean, counters and loss scales rank 0's,
    and LocalSGD/DiLoCo saved between rounds continue from what ``synchronize()`` would have
    given at the save.

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
    ckpt, assignments, after = together(lambda: _read(path, model, optimizer))
    for variable, value in assignments:
        variable.assign(value)
    for step in after:
        step()
    return dict(ckpt.manifest.extra)


def _read(path: str | Path, model: keras.Model,
          optimizer: Any) -> tuple[Checkpoint, list[tuple[Any, np.ndarray]], list[Callable[[], None]]]:
    ckpt = Checkpoint.open(path, framework=FRAMEWORK)
    m, where = ckpt.manifest, Path(path) / "manifest.json"
    rank, size = _world()
    weights = list(model.weights)
    paths = m.meta["model"]["paths"]
    if len(paths) != len(weights):
        raise CheckpointError(f"{where}: field meta.model.paths lists {len(paths)} variables, the model has "
                              f"{len(weights)}: build the model the checkpoint was saved from")
    replicas = m.meta["model"].get("replicas")
    layers = _Layers(optimizer) if optimizer is not None else None
    periodic = layers is not None and layers.periodic is not None
    check_replicas(where, replicas, size, periodic=periodic)

    def model_key(i: int, r: int | None) -> str:
        return f"model/{i:05d}" if r is None else f"{local(r)}/model/{i:05d}"

    def entry(key: str, v: Any, i: int) -> np.ndarray:
        e = ckpt.reader.entry(key)
        if tuple(e.shape) != tuple(v.shape) or e.dtype != np.dtype(v.dtype).name:
            raise CheckpointError(f"{where}: entry {key!r} ({paths[i]}) is {e.dtype}{list(e.shape)}, the model's "
                                  f"{v.path} is {np.dtype(v.dtype).name}{list(v.shape)}")
        return ckpt.reader.array(key)

    out: list[tuple[Any, np.ndarray]] = []
    every: list[list[np.ndarray]] | None = None
    if replicas is None or replicas == size:
        mine = None if replicas is None else rank
        out = [(v, entry(model_key(i, mine), v, i)) for i, v in enumerate(weights)]
    else:  # the periodic optimizer continues from every saved rank's weights
        every = [[entry(model_key(i, r), v, i) for i, v in enumerate(weights)] for r in range(replicas)]
    if layers is None:
        return ckpt, out, []
    info = saved_optimizer(where, m.meta)
    assigned, after = layers.read(ckpt, info, where, rank, size)
    out += assigned
    if every is not None:
        assert layers.periodic is not None
        after.append(layers.synchronize_saved(model, every, info, ckpt))
    return ckpt, out, after


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


def _world() -> tuple[int, int]:
    return (ddl.rank(), ddl.size()) if ddl.is_initialized() else (0, 1)


#: Per-variable lists of ddl's wrappers: saved once (the ranks share them) or per rank.
_SHARED_LISTS, _OWN_LISTS = ("_anchors",), ("_boundary", "_accumulators")


class _Layers:
    """An optimizer as its layers, outermost first: a LossScaleOptimizer outside, a ddl wrapper
    (``DistributedOptimizer``, ``LocalSGD``, ``DiLoCo``), a LossScaleOptimizer inside, and the
    optimizer that holds the slots. What each keeps, and where it goes in a checkpoint:

    - the holder's slots: by owner (sharded), a byte-balanced share (replicated), or per rank
      (LocalSGD/DiLoCo, whose ranks step alone);
    - every layer's scalars (step counts, learning rate, loss scale and its counter) and ddl's
      per-variable lists of one rank (``_boundary``, ``_accumulators``): per rank, small;
    - LocalSGD/DiLoCo's anchor and DiLoCo's outer optimizer: once (the ranks share them);
    - a communication hook's state: :mod:`ddl.checkpoint.replicas`.
    """

    def __init__(self, optimizer: Any) -> None:
        if not optimizer.built:
            raise ValueError("the optimizer has no slot variables yet: call optimizer.build(model.trainable_variables) "
                             "first (model.fit's first step would)")
        self.top = optimizer
        self.roles: dict[str, Any] = {}
        layer = optimizer
        if is_loss_scale(layer) and hasattr(type(layer.inner_optimizer), "_before_loss_scale_check"):
            self.roles["lossscale-outside"], layer = layer, layer.inner_optimizer
        if isinstance(layer, (DistributedOptimizer, _Periodic)):
            self.roles["wrapper"], layer = layer, layer.inner_optimizer
        if is_loss_scale(layer):
            self.roles["lossscale"], layer = layer, layer.inner_optimizer
        self.roles["holder"] = self.holder = layer
        self.wrapper: Any = self.roles.get("wrapper")
        self.periodic: _Periodic | None = self.wrapper if isinstance(self.wrapper, _Periodic) else None
        self.sharded = isinstance(self.wrapper, DistributedOptimizer) and self.wrapper.shard_optimizer_state
        self.tvs = list(optimizer._trainable_variables)
        outer = getattr(self.periodic, "outer_optimizer", None)
        self.outer = outer if isinstance(outer, keras.optimizers.Optimizer) else None

    @property
    def hook(self) -> Any:
        state = getattr(self.wrapper, "hook_state", None)
        return state if saves_hook(state) else None

    def owned(self) -> list[int]:
        """The variables whose slots this rank holds."""
        if self.sharded:
            mine = {id(v) for v in self.wrapper.owned_variables()}
            return [i for i, v in enumerate(self.tvs) if id(v) in mine]
        return list(range(len(self.tvs)))

    def _scalars(self) -> dict[str, Any]:
        """Every layer's scalar variables, keyed ``<role>/<name>`` (the outer optimizer's too)."""
        out = {}
        for role, layer in [*self.roles.items(), *([("outer", self.outer)] if self.outer is not None else [])]:
            for v in layer._variables:
                if tuple(v.shape) == ():
                    out[f"{role}/{v.name}"] = v
        return out

    def _lists(self, names: tuple[str, ...]) -> dict[str, Any]:
        """ddl's per-variable lists of the wrapper, keyed ``<list>/<index>``."""
        out = {}
        for name in names:
            for i, v in enumerate(getattr(self.wrapper, name, None) or []):
                out[f"{name.lstrip('_')}/{i:05d}"] = v
        return out

    # -- saving -------------------------------------------------------------------------
    def save(self, tensors: dict[str, Tensor], values: dict[str, Any], rank: int, size: int) -> dict[str, Any]:
        holder, tvs = self.holder, self.tvs
        by_bytes = partition_by_bytes([_nbytes(v) for v in tvs], size).owned_by(rank)
        writes = self.owned() if self.sharded else (list(range(len(tvs))) if self.periodic else by_bytes)
        slot_prefix = f"{local(rank)}/state" if self.periodic else "optimizer/state"
        for slot, variables in slots(holder).items():
            for i in writes:
                tensors[f"{slot_prefix}/{i:05d}/{slot}"] = Tensor.of(np.asarray(variables[local_index(holder, tvs[i])]))
        for key, v in {**self._scalars(), **self._lists(_OWN_LISTS)}.items():
            tensors[f"{local(rank)}/opt/{key}"] = Tensor.of(np.asarray(v))
        for key, v in self._lists(_SHARED_LISTS).items():
            if int(key.rsplit("/", 1)[1]) in by_bytes:
                tensors[f"optimizer/{key}"] = Tensor.of(np.asarray(v))
        if self.outer is not None:
            for slot, variables in slots(self.outer).items():
                for i in by_bytes:
                    tensors[f"optimizer/outer/{i:05d}/{slot}"] = Tensor.of(
                        np.asarray(variables[local_index(self.outer, tvs[i])]))
        info: dict[str, Any] = {
            "class": _class_name(holder), "params": [v.path for v in tvs], "shapes": [list(v.shape) for v in tvs],
            "sharded": self.sharded, "slots": sorted(slots(holder)), "world": size,
            "layers": {role: _class_name(layer) for role, layer in self.roles.items()},
            "scalars": sorted(self._scalars()), "lists": sorted(self._lists(_OWN_LISTS + _SHARED_LISTS)),
            "periodic": None, "hook": None,
        }
        if self.periodic is not None:
            info["periodic"] = {"class": _class_name(self.periodic), "period": self.periodic.period,
                                "overlap": self.periodic.overlap,
                                "outer": None if self.outer is None else sorted(slots(self.outer))}
        if self.hook is not None:
            info["hook"] = save_hook(self.hook, "hook", tensors, rank)
        return info

    # -- loading ------------------------------------------------------------------------
    def read(self, ckpt: Checkpoint, info: dict[str, Any], where: Path, rank: int,
             size: int) -> tuple[list[tuple[Any, np.ndarray]], list[Callable[[], None]]]:
        holder, tvs = self.holder, self.tvs
        check_class(where, "meta.optimizer.class", info["class"], _class_name(holder))
        if [list(s) for s in info["shapes"]] != [list(v.shape) for v in tvs]:
            raise CheckpointError(f"{where}: field meta.optimizer.shapes differs from the optimizer's variables "
                                  f"({len(info['shapes'])} saved, {len(tvs)} now)")
        found = slots(holder)
        if found and info["slots"] and sorted(found) != list(info["slots"]):  # a rank with no variables has no slots
            raise CheckpointError(f"{where}: field meta.optimizer.slots is {info['slots']}, the optimizer has "
                                  f"{sorted(found)} (other options, e.g. amsgrad or momentum?)")
        saved_periodic = (info.get("periodic") or {}).get("class")
        mine_periodic = None if self.periodic is None else _class_name(self.periodic)
        if saved_periodic != mine_periodic and saved_periodic is not None:
            raise CheckpointError(f"{where}: field meta.optimizer.periodic.class is {saved_periodic}, the optimizer "
                                  f"is {mine_periodic or _class_name(self.top)}: build the optimizer it was saved with")
        world = int(info.get("world", size))
        same_world = world == size
        m = ckpt.manifest
        out: list[tuple[Any, np.ndarray]] = []
        per_rank_slots = saved_periodic is not None
        for slot, variables in found.items():
            for i in self.owned():
                target = variables[local_index(holder, tvs[i])]
                if not per_rank_slots:
                    out.append((target, ckpt.reader.array(f"optimizer/state/{i:05d}/{slot}")))
                elif same_world:
                    out.append((target, ckpt.reader.array(f"{local(rank)}/state/{i:05d}/{slot}")))
                else:  # the saved ranks' mean
                    out.append((target, mean([ckpt.reader.array(f"{local(r)}/state/{i:05d}/{slot}")
                                              for r in range(world)])))
        source = rank if same_world else 0
        saved = set(info.get("scalars", [])) | set(info.get("lists", []))
        for key, v in {**self._scalars(), **self._lists(_OWN_LISTS)}.items():
            stored = f"{local(source)}/opt/{key}"
            if key in saved and stored in m.entries and tuple(m.entries[stored].shape) == tuple(v.shape):
                out.append((v, ckpt.reader.array(stored)))
        for key, v in self._lists(_SHARED_LISTS).items():
            if key in saved:
                out.append((v, ckpt.reader.array(f"optimizer/{key}")))
        if self.outer is not None and saved_periodic is not None:
            for slot, variables in slots(self.outer).items():
                for i in range(len(tvs)):
                    out.append((variables[local_index(self.outer, tvs[i])],
                                ckpt.reader.array(f"optimizer/outer/{i:05d}/{slot}")))
        after: list[Callable[[], None]] = []
        hook = self.hook
        if hook is not None and info.get("hook") is not None:
            shared, errors = read_hook(ckpt, info["hook"], "hook", saved_world=world, rank=rank, size=size)
            after.append(lambda: hook.load_state_dict(shared, errors))
        if self.periodic is not None:
            after.append(self.periodic._restored)
        return out, after

    def synchronize_saved(self, model: keras.Model, every: list[list[np.ndarray]], info: dict[str, Any],
                          ckpt: Checkpoint) -> Callable[[], None]:
        """After the load: every rank on from what synchronize() would have given at the save
        (float weights that are not trained: the saved ranks' mean, the rest rank 0's)."""
        assert self.periodic is not None
        periodic, world = self.periodic, len(every)
        trained = {id(v) for v in self.tvs}
        weights = list(model.weights)
        boundaries = None
        if getattr(periodic, "_boundary", None):
            boundaries = [[ckpt.reader.array(f"{local(r)}/opt/boundary/{i:05d}") for i in range(len(self.tvs))]
                          for r in range(world)]
        index = {id(v): i for i, v in enumerate(weights)}

        def run() -> None:
            for i, v in enumerate(weights):
                if id(v) not in trained:
                    floating = np.issubdtype(np.dtype(v.dtype), np.floating)
                    v.assign(mean([w[i] for w in every]) if floating else every[0][i])
            replicas = [[w[index[id(v)]] for v in self.tvs] for w in every]
            periodic._synchronize_saved(replicas, boundaries)

        return run


def _class_name(optimizer: Any) -> str:
    cls = type(optimizer)
    return f"{cls.__module__}.{cls.__qualname__}"
