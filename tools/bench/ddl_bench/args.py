"""Argument types the benchmarks' command lines share: a count or an amount out of range is
refused by argparse with its usage line, before any rank starts (``--rounds 0`` used to run
every rank to a ``StatisticsError`` from deep inside the timing)."""

from __future__ import annotations

import argparse
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

    parse.__name__ = "count"  # (argparse names the type in its own messages)
    return parse


def amount(text: str) -> float:
    """An argparse type: a number greater than 0 (seconds, milliseconds, megabytes)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes a number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"takes a number greater than 0, got {text}")
    return value
