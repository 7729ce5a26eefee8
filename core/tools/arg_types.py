"""Argument types the command lines share (``ddl plan``, ``ddl bench``, ``ddl conformance``,
``ddl-caffe``): a count or an amount out of range is refused by argparse with its usage line
and the option's name, before anything runs (``ddl bench torch --rounds 0`` used to run every
rank to a ``StatisticsError`` from inside the timing, ``ddl plan --itemsize 0`` to a
``ZeroDivisionError``, and ``--segment-bytes 0`` or ``--backward-fraction 2`` gave a plan as if
they meant something). The environment's settings
have their own parsers (:mod:`ddl.base.settings`), whose messages name the variable instead."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def count(least: int = 1) -> Callable[[str], int]:
    """An argparse type: a whole number of at least ``least``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"takes a whole number, got {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"takes a whole number of at least {least}, got {value}")
        return value

    return parse


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"takes a finite number, got {text}")
    return value


def amount(text: str) -> float:
    """An argparse type: a finite number greater than 0 (seconds, milliseconds, megabytes)."""
    value = _number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"takes a number greater than 0, got {text}")
    return value


def share(text: str) -> float:
    """An argparse type: a fraction of a whole, greater than 0 and at most 1."""
    value = _number(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"takes a fraction greater than 0 and at most 1, got {text}")
    return value


def nonnegative(text: str) -> float:
    """An argparse type: a finite number of at least 0 (a cost that may be nothing)."""
    value = _number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"takes a number of at least 0, got {text}")
    return value
