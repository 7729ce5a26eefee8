"""Caffe's learning-rate policies: fixed, step, exp, inv, multistep, poly, sigmoid."""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

log = logging.getLogger("ddl.caffe")
POLICIES = ("fixed", "step", "exp", "inv", "multistep", "poly", "sigmoid")


class LrPolicyError(ValueError):
    """The solver's lr policy is unknown or misses a parameter it needs."""


def check(sp: Any) -> None:
    """Raise LrPolicyError when ``sp.lr_policy`` is unknown or lacks its parameters."""
    pol = sp.lr_policy
    if pol not in POLICIES:
        raise LrPolicyError(f"lr_policy '{pol}' is unknown; use one of {', '.join(POLICIES)}")
    need = {"step": ("gamma", "stepsize"), "exp": ("gamma",), "inv": ("gamma", "power"),
            "multistep": ("gamma",), "poly": ("power", "max_iter"), "sigmoid": ("gamma", "stepsize")}.get(pol, ())
    missing = [f for f in need if not sp.HasField(f)]
    if missing:
        raise LrPolicyError(f"lr_policy '{pol}' needs {', '.join(missing)} in the solver")
    if pol == "step" and sp.stepsize <= 0:
        raise LrPolicyError("stepsize must be positive for lr_policy 'step'")


def learning_rate(sp: Any, it: int, current_step: int) -> tuple[float, int]:
    """(rate, new current_step) at iteration ``it``, computed as Caffe does (float32 result).

    ``current_step`` only matters for multistep, which advances it by at most one per call
    and is saved in the .solverstate.
    """
    pol, base = sp.lr_policy, float(np.float32(sp.base_lr))
    gamma, power = float(np.float32(sp.gamma)), float(np.float32(sp.power))
    if pol == "fixed":
        rate = base
    elif pol == "step":
        current_step = it // sp.stepsize
        rate = base * math.pow(gamma, current_step)
    elif pol == "exp":
        rate = base * math.pow(gamma, it)
    elif pol == "inv":
        rate = base * math.pow(1.0 + gamma * it, -power)
    elif pol == "multistep":
        if current_step < len(sp.stepvalue) and it >= sp.stepvalue[current_step]:
            current_step += 1
            log.info("MultiStep Status: Iteration %d, step = %d", it, current_step)
        rate = base * math.pow(gamma, current_step)
    elif pol == "poly":
        rate = base * math.pow(1.0 - it / float(sp.max_iter), power)
    elif pol == "sigmoid":
        rate = base * (1.0 / (1.0 + math.exp(-gamma * (it - float(sp.stepsize)))))
    else:
        raise LrPolicyError(f"lr_policy '{pol}' is unknown; use one of {', '.join(POLICIES)}")
    return float(np.float32(rate)), current_step
