"""Caffe's solver update rules, in its exact order: clip, normalize, regularize, compute update, apply."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import torch

log = logging.getLogger("ddl.caffe")
TYPES = ("SGD", "Nesterov", "AdaGrad", "RMSProp", "AdaDelta", "Adam")
_LEGACY = {0: "SGD", 1: "Nesterov", 2: "AdaGrad", 3: "RMSProp", 4: "AdaDelta", 5: "Adam"}


def solver_type(sp: object) -> str:
    """The solver type: ``type`` (string), or the deprecated ``solver_type`` enum when only it is set."""
    if not sp.HasField("type") and sp.HasField("solver_type"):   # type: ignore[attr-defined]
        return _LEGACY[sp.solver_type]                             # type: ignore[attr-defined]
    t: str = sp.type                                               # type: ignore[attr-defined]
    if t not in TYPES:
        raise ValueError(f"solver type '{t}' is unknown; use one of {', '.join(TYPES)}")
    return t


def history_count(kind: str, nparams: int) -> int:
    """Blobs of history per net: AdaDelta and Adam keep two per parameter, the others one."""
    return 2 * nparams if kind in ("AdaDelta", "Adam") else nparams


def clip_gradients(diffs: Sequence[torch.Tensor], clip: float) -> None:
    """Scale every diff so that their global L2 norm is at most ``clip`` (Caffe's ClipGradients)."""
    if clip < 0:
        return
    sumsq = sum(float(torch.dot(d.reshape(-1).double(), d.reshape(-1).double())) for d in diffs)
    l2 = math.sqrt(sumsq)
    if l2 > clip:
        factor = clip / l2
        log.info("Gradient clipping: scaling down gradients (L2 norm %g > %g) by scale factor %g", l2, clip, factor)
        for d in diffs:
            d.mul_(factor)


def regularize(diff: torch.Tensor, data: torch.Tensor, decay: float, kind: str) -> None:
    """Add the weight-decay term: L2 ``decay * w``, L1 ``decay * sign(w)``."""
    if not decay:
        return
    if kind == "L2":
        diff.add_(data, alpha=decay)
    elif kind == "L1":
        diff.add_(torch.sign(data), alpha=decay)
    else:
        raise ValueError(f"regularization_type '{kind}' is unknown; use L2 or L1")


def compute_update(kind: str, diff: torch.Tensor, hist: list[torch.Tensor], rate: float, *, momentum: float,
                   momentum2: float, delta: float, rms_decay: float, t: int) -> None:
    """Turn ``diff`` into the step that Caffe subtracts from the weights, updating ``hist`` in place.

    ``hist`` is [history] or, for AdaDelta and Adam, [history, second history]; ``t`` is the
    iteration counted from 1 (Adam's bias correction).
    """
    h = hist[0]
    if kind == "SGD":
        h.mul_(momentum).add_(diff, alpha=rate)             # v = mu v + lr g
        diff.copy_(h)
    elif kind == "Nesterov":
        old = h.clone()
        h.mul_(momentum).add_(diff, alpha=rate)
        diff.copy_(h * (1 + momentum) - old * momentum)      # step back, then over-step
    elif kind == "AdaGrad":
        h.add_(diff * diff)
        diff.div_(h.sqrt().add_(delta)).mul_(rate)
    elif kind == "RMSProp":
        h.mul_(rms_decay).add_(diff * diff, alpha=1 - rms_decay)
        diff.div_(h.sqrt().add_(delta)).mul_(rate)
    elif kind == "AdaDelta":
        h2 = hist[1]
        h.mul_(momentum).add_(diff * diff, alpha=1 - momentum)
        diff.mul_(((h2 + delta) / (h + delta)).sqrt_())
        h2.mul_(momentum).add_(diff * diff, alpha=1 - momentum)
        diff.mul_(rate)
    elif kind == "Adam":
        m, v = hist
        m.mul_(momentum).add_(diff, alpha=1 - momentum)
        v.mul_(momentum2).add_(diff * diff, alpha=1 - momentum2)
        correction = math.sqrt(1 - momentum2 ** t) / (1 - momentum ** t)
        diff.copy_(m / (v.sqrt() + delta)).mul_(rate * correction)
    else:
        raise ValueError(f"solver type '{kind}' is unknown; use one of {', '.join(TYPES)}")
