"""What one rank holds alone in a checkpoint, beside what the ranks share: keys, the sameness check, hook state.

Most of a checkpoint is one logical state split over the ranks. Some of it is not: each
rank's own weights while LocalSGD or DiLoCo ranks train apart, their inner optimizer state,
a communication hook's error feedback. Such entries live under ``local/r<rank>/...`` (one
data file per rank); a load at the saved world size gives each rank its own, at another the
adapter combines them (PowerSGD's errors: their mean, which is what the average depends on).
numpy only, as the rest of :mod:`ddl.checkpoint`.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from typing import Any

import numpy as np

from ddl.checkpoint.collective import Checkpoint
from ddl.checkpoint.files import Tensor
from ddl.runtime import api, process


def local(rank: int) -> str:
    """The key prefix of what ``rank`` holds alone (its own data file, ``local-r00003.<save>.bin``).

    Example:
        >>> local(3)
        'local/r00003'
    """
    return f"local/r{rank:05d}"


def same_on_every_rank(arrays: Iterable[np.ndarray], *, name: str) -> bool:
    """Whether every rank holds these very bytes (a CRC-32 per array, compared: a collective)."""
    if not process.is_initialized() or process.size() == 1:
        return True
    sums = [zlib.crc32(np.ascontiguousarray(a).reshape(-1).view(np.uint8).tobytes()) for a in arrays]
    everyone = api.allgather_object(sums, name=name)
    return all(s == everyone[0] for s in everyone)


# -- a stateful communication hook (PowerSGD) -------------------------------------------------------
def saves_hook(state: Any) -> bool:
    """Whether ``state`` keeps shared and own parts (``state_dict``, ``errors_state_dict``)."""
    return all(callable(getattr(state, f, None)) for f in ("state_dict", "errors_state_dict", "load_state_dict"))


def save_hook(state: Any, prefix: str, tensors: dict[str, Tensor], rank: int) -> dict[str, Any]:
    """Add the hook's shared part (call counts and Q, written by rank 0 under
    ``optimizer/<prefix>``) and this rank's errors (under ``local/r<rank>/<prefix>``) to
    ``tensors``; returns its description for the manifest."""
    shared = state.state_dict()
    errors = state.errors_state_dict()["buckets"]
    buckets = []
    for k, (key, bucket) in enumerate(shared["buckets"].items()):
        buckets.append({"key": _encode_key(key), "calls": int(bucket["calls"]), "qs": len(bucket["qs"]),
                        "errors": len(errors.get(key, []))})
        if rank == 0:
            for j, q in enumerate(bucket["qs"]):
                tensors[f"optimizer/{prefix}/b{k}/q{j}"] = Tensor.of(np.asarray(q))
        for j, e in enumerate(errors.get(key, [])):
            tensors[f"{local(rank)}/{prefix}/b{k}/e{j}"] = Tensor.of(np.asarray(e))
    return {"buckets": buckets, "loss_scale": float(shared.get("loss_scale", 1.0))}


def read_hook(ckpt: Checkpoint, info: dict[str, Any], prefix: str, *, saved_world: int, rank: int,
              size: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The hook's shared state and this rank's errors, for ``load_state_dict(shared, errors)``:
    its own at the saved world size, else the saved ranks' mean."""
    shared: dict[tuple[Any, ...], Any] = {}
    errors: dict[tuple[Any, ...], Any] = {}
    ranks = [rank] if saved_world == size else list(range(saved_world))
    for k, bucket in enumerate(info["buckets"]):
        key = _decode_key(bucket["key"])
        shared[key] = {"calls": int(bucket["calls"]),
                       "qs": [ckpt.reader.array(f"optimizer/{prefix}/b{k}/q{j}") for j in range(int(bucket["qs"]))]}
        if int(bucket["errors"]):
            per_rank = [[ckpt.reader.array(f"{local(r)}/{prefix}/b{k}/e{j}") for j in range(int(bucket["errors"]))]
                        for r in ranks]
            errors[key] = [mean(list(e)) for e in zip(*per_rank, strict=True)]
    return {"buckets": shared, "loss_scale": float(info.get("loss_scale", 1.0))}, {"buckets": errors}


def mean(arrays: list[np.ndarray]) -> np.ndarray:
    """The element-wise mean of ``arrays`` (summed in float64), in their dtype.

    Example:
        >>> mean([np.ones(2, np.float32), np.zeros(2, np.float32)]).tolist()
        [0.5, 0.5]
    """
    out: np.ndarray = np.mean(np.stack(arrays).astype(np.float64), axis=0).astype(arrays[0].dtype)
    return out


def _encode_key(key: tuple[Any, ...]) -> Any:
    index, dtype, shapes = key
    return {"index": int(index), "dtype": str(dtype), "shapes": [list(s) for s in shapes]}


def _decode_key(raw: dict[str, Any]) -> tuple[Any, ...]:
    return int(raw["index"]), str(raw["dtype"]), tuple(tuple(int(n) for n in s) for s in raw["shapes"])
