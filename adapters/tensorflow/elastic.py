"""Elastic training for TensorFlow 2 / Keras 3 with Horovod's names: ``run``, ``TensorFlowKerasState``, ...

Run the script with ``ddlrun --elastic``; see ``docs/guides/elastic.md``. The Keras
callbacks and ``KerasState`` are in :mod:`ddl.tensorflow.keras.elastic`.
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Sequence
from typing import Any

import numpy as np

import tensorflow as tf
from ddl.base.errors import HorovodInternalError, HostsUpdatedInterrupt
from ddl.runtime.elastic import ObjectState, State, run, updates_pending, world_number


def _tracks(value: Any) -> bool:
    """Objects kept through ``state_dict``/``load_state_dict`` (an ``ElasticDataset``, say)."""
    return callable(getattr(value, "state_dict", None)) and callable(getattr(value, "load_state_dict", None))


class _VariablesState(ObjectState):
    """Plain values, objects with a ``state_dict``, and lists of variables saved as numpy copies."""

    _objects: dict[str, Any]
    _saved_objects: dict[str, Any]

    def __init__(self, **values: Any) -> None:
        objects = {k: v for k, v in values.items() if _tracks(v)}
        object.__setattr__(self, "_objects", objects)
        object.__setattr__(self, "_saved_objects", {})
        for name, obj in objects.items():
            object.__setattr__(self, name, obj)
        self._saved_variables: list[np.ndarray] = []
        super().__init__(**{k: v for k, v in values.items() if k not in objects})

    def _variables(self) -> list[Any]:
        raise NotImplementedError

    def save(self) -> None:
        self._saved_variables = [np.array(v.numpy(), copy=True) for v in self._variables()]
        self._saved_objects = {name: copy.deepcopy(obj.state_dict()) for name, obj in self._objects.items()}
        super().save()

    def restore(self) -> None:
        variables = self._variables()
        if len(variables) != len(self._saved_variables):
            raise ValueError(f"the state holds {len(self._saved_variables)} variables but the model and optimizer "
                             f"have {len(variables)}; build the same model and optimizer in every world")
        for variable, value in zip(variables, self._saved_variables, strict=True):
            variable.assign(value)
        for name, obj in self._objects.items():
            if name in self._saved_objects:
                obj.load_state_dict(copy.deepcopy(self._saved_objects[name]))
        super().restore()

    def saved_bytes(self) -> bytes:
        return pickle.dumps({"variables": self._saved_variables, "objects": self._saved_objects,
                             "values": self._saved_state}, protocol=pickle.HIGHEST_PROTOCOL)

    def load_saved_bytes(self, payload: bytes) -> None:
        data = pickle.loads(payload)
        self._saved_variables, self._saved_objects = data["variables"], data["objects"]
        self._saved_state = data["values"]


class TensorFlowKerasState(_VariablesState):
    """State of a Keras model and its optimizer (built first if needed), and plain values.

    A ``DistributedOptimizer``'s stateful hook (PowerSGD) is kept too: what the ranks share
    of it (call counts, Q) comes from the commit, each rank's error feedback restarts at zero.
    ``LocalSGD`` and ``DiLoCo`` keep their anchors and counters as optimizer variables.

    Args:
        model: a built Keras model.
        optimizer: its optimizer (default: ``model.optimizer``, so compile first).
        values: plain attributes (``epoch=0``), and objects with ``state_dict`` /
            ``load_state_dict`` (``ElasticDataset``), kept with the state.
    """

    model: Any
    optimizer: Any

    def __init__(self, model: Any, optimizer: Any = None, **values: Any) -> None:
        if not getattr(model, "built", True):
            raise ValueError("the model must be built first: call model.build(input_shape) or run it on a batch")
        optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        if optimizer is None:
            raise ValueError("no optimizer: compile the model first, or pass optimizer=")
        if not optimizer.built:
            optimizer.build(model.trainable_variables)  # Keras 3 makes its slots lazily; the state needs them now
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "optimizer", optimizer)
        self._saved_shards: dict[str, np.ndarray] = {}
        super().__init__(**values)
        hook = getattr(optimizer, "hook_state", None)
        if _tracks(hook):  # PowerSGD's shared state (call counts, Q); its rank-local errors restart at zero
            self._objects["optimizer.hook_state"] = hook

    def _variables(self) -> list[Any]:
        seen: set[int] = set()
        out = []
        # A sharded optimizer's slots differ by rank: they travel as entries (below).
        kept = self.optimizer.replicated_variables() if self._is_sharded() else self.optimizer.variables
        for v in [*self.model.variables, *kept]:
            if id(v) not in seen:
                seen.add(id(v))
                out.append(v)
        return out

    # A sharded optimizer's slots: this rank's in memory, one whole copy per host's commit.
    def _is_sharded(self) -> bool:
        return bool(getattr(self.optimizer, "shard_optimizer_state", False))

    def _owned_slots(self) -> dict[str, Any]:
        """The slot variables of the variables this rank owns, by entry key ``optimizer/<i>/<slot>``."""
        from .keras.slots import local_index, slots

        opt = self.optimizer
        inner, tvs = opt.inner_optimizer, list(opt._trainable_variables)
        mine = {id(v) for v in opt.owned_variables()}
        return {f"optimizer/{i}/{slot}": variables[local_index(inner, v)]
                for slot, variables in slots(inner).items() for i, v in enumerate(tvs) if id(v) in mine}

    def save(self) -> None:
        if self._is_sharded():
            self._saved_shards = {k: np.array(v.numpy(), copy=True) for k, v in self._owned_slots().items()}
        super().save()

    def restore(self) -> None:
        if self._is_sharded():
            for key, variable in self._owned_slots().items():
                variable.assign(self._saved_shards[key])
        super().restore()

    def sharded_entries(self) -> dict[str, bytes] | None:
        if not self._is_sharded():
            return None
        return {k: pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL) for k, v in self._saved_shards.items()}

    def sharded_owner(self, key: str) -> int:
        return int(self.optimizer._owners[int(key.split("/")[1])])

    def load_sharded_entries(self, entries: dict[str, bytes]) -> None:
        self._saved_shards = {k: pickle.loads(blob) for k, blob in entries.items()}


class TensorFlowState(_VariablesState):
    """State of a list of ``tf.Variable`` (eager), and plain values."""

    variables: list[Any]

    def __init__(self, variables: Sequence[tf.Variable], **values: Any) -> None:
        object.__setattr__(self, "variables", list(variables))
        super().__init__(**values)

    def _variables(self) -> list[Any]:
        return list(self.variables)


__all__ = ["HorovodInternalError", "HostsUpdatedInterrupt", "ObjectState", "State", "TensorFlowKerasState",
           "TensorFlowState", "run", "updates_pending", "world_number"]
