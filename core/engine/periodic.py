"""LocalSGD and DiLoCo's round schedule, written once for every framework.

Both adapters run the same schedule: an outer step (a round: the pseudo-gradients'
average) every ``period`` inner steps, its average applied ``overlap`` steps after the
round started (0: at once, before the next step), the steps taken since the last round
carried by one more round when the weights are synchronized. :class:`RoundSchedule`
makes those decisions from the counters alone, with arithmetic and comparison operators
only (``%``, ``==``, ``>=``, ``+``, ``&``), so the same code decides on Python ints
(``ddl.torch``, eagerly) and on TensorFlow tensors inside a ``tf.function``
(``ddl.tensorflow.keras``, where they are graph ops and the adapter branches with
``tf.cond``). The rounds themselves are :mod:`ddl.engine.hooked`'s buckets.
"""

from __future__ import annotations

import dataclasses
from typing import Any


def check_schedule(owner: str, period: Any, overlap: Any) -> None:
    """Raise ValueError unless ``period`` >= 1 and 0 <= ``overlap`` <= ``period`` are integers."""
    if not isinstance(period, int) or isinstance(period, bool) or period < 1:
        raise ValueError(f"{owner}: period must be an integer >= 1 (inner steps per outer step), got {period!r}")
    if not isinstance(overlap, int) or isinstance(overlap, bool) or not 0 <= overlap <= period:
        raise ValueError(f"{owner}: overlap must be an integer from 0 (wait for each average) to "
                         f"period={period} (apply it at the next outer step), got {overlap!r}")


@dataclasses.dataclass(frozen=True)
class RoundSchedule:
    """When LocalSGD/DiLoCo's rounds start and are applied, from the step counters.

    The counters are the adapter's: ``steps`` (inner steps taken, this one counted),
    ``in_flight`` (a round started and not applied yet, a boolean), ``merge_at`` (the step
    at which it is applied), ``unsent`` (steps no round has carried yet). On each inner
    step, after counting it, an adapter applies the round in flight when
    :meth:`merge_due`, then starts one when :meth:`round_due` (and applies it at once
    when :attr:`waits`), recording :meth:`merge_at`. Since ``overlap`` <= ``period``, a
    round is always applied before or at the step the next one starts.

    Example:
        >>> s = RoundSchedule.checked("LocalSGD", period=4, overlap=2)
        >>> [n for n in range(1, 13) if s.round_due(n)], s.merge_at(4), s.merge_due(6, True, 6)
        ([4, 8, 12], 6, True)
    """

    period: int
    overlap: int

    @classmethod
    def checked(cls, owner: str, period: Any, overlap: Any) -> RoundSchedule:
        """The schedule, after :func:`check_schedule` (ValueError naming ``owner``)."""
        check_schedule(owner, period, overlap)
        return cls(period, overlap)

    @property
    def waits(self) -> bool:
        """Whether a round is applied at the step it starts (``overlap`` 0): none is ever left in flight."""
        return self.overlap == 0

    def round_due(self, steps: Any) -> Any:
        """Whether the step just counted starts a round (every ``period``-th)."""
        return steps % self.period == 0

    def merge_at(self, steps: Any) -> Any:
        """The step at which a round started at ``steps`` is applied."""
        return steps + self.overlap

    def merge_due(self, steps: Any, in_flight: Any, merge_at: Any) -> Any:
        """Whether the round in flight is applied at the step just counted (before a round starts there).

        ``&``, not ``and``: on tensors it is the graph's logical and, with or without autograph.
        """
        return in_flight & (steps >= merge_at)

    @staticmethod
    def last_round_due(unsent: int, anchored: bool) -> bool:
        """On ``synchronize()``, eagerly: whether steps taken since the last round need one more."""
        return unsent > 0 and anchored
