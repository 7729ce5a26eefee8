"""``auto``'s choice re-checked during training, alike on every rank.

``ddl.init`` prices the algorithms from probes taken in whatever state the machine was in
then (another job's burst, a cold page cache); a bad probe fixes a slow algorithm for a
message size for the whole run. So the running job tries again, in its own buckets: for
each size class (four per octave of bytes, as :func:`ddl.reduction.cost.choose` prices
them) the model's pick and its runner-up each run :data:`TRIAL_RUNS` times in turn, every
rank keeps its fastest time of each, and at the end of the cycle in which the last trial
ran the ranks agree on them (one allreduce of those times, MAX: the slowest rank's best)
and settle the class on the faster one. After :data:`RECHECK_RUNS` runs the class is tried
again, then after twice as many each time (up to :data:`RECHECK_MAX`), so a trial spoiled
by noise is corrected later.

Ranks never disagree: which contender runs is a function of how often the class ran,
which is the same on every rank (buckets run in lockstep), and the settled choice is a
function of the agreed times. This module is pure; the engine runs the allreduce
(:meth:`Trials.agreement` says when and what).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

#: Runs of each contender per trial; its fastest counts (the first run of a size also
#: pays for compiling its schedule and for shared-memory windows).
TRIAL_RUNS = 3
#: Runs of a settled size class before it is tried again: the first time soon (a job's
#: first steps are noisy too: compiling, warming caches), then twice as long each time.
RECHECK_RUNS = 250
RECHECK_MAX = 4000
#: The runner-up replaces the model's pick only when at least this much faster (noise).
MARGIN = 0.9
#: A runner-up priced above this many times the pick is never tried (it cannot win).
WORTH = 4.0

Key = tuple[int, int]  # (size class, item size)


@dataclasses.dataclass
class ClassTrial:
    """One size class: its two contenders, runs since the trial opened, this rank's best
    time of each, and the settled choice (None while trying)."""

    contenders: tuple[str, str]
    runs: int = 0
    recheck: int = RECHECK_RUNS
    best: list[float] = dataclasses.field(default_factory=lambda: [math.inf, math.inf])
    choice: str | None = None


class Trials:
    """Per size class: which algorithm a run uses, and what the ranks agreed."""

    def __init__(self) -> None:
        self._classes: dict[Key, ClassTrial] = {}
        #: Classes whose trial has run and awaits the ranks' agreement (same on every rank).
        self.awaiting: list[Key] = []
        #: Settled choices that differ from the model's pick, for reports and tests.
        self.overridden: dict[Key, str] = {}

    def pick(self, key: Key, ranked: Sequence[tuple[str, float]]) -> str:
        """The algorithm this run of class ``key`` uses; ``ranked``: the model's usable
        algorithms, cheapest first, with their predicted seconds."""
        trial = self._classes.get(key)
        if trial is None:
            pick = ranked[0][0]
            if len(ranked) < 2 or not ranked[1][1] <= WORTH * ranked[0][1]:
                trial = ClassTrial((pick, pick), choice=pick)  # nothing worth trying
            else:
                trial = ClassTrial((pick, ranked[1][0]))
            self._classes[key] = trial
        n = trial.runs
        trial.runs = n + 1
        if trial.choice is not None:
            if n < trial.recheck or trial.contenders[0] == trial.contenders[1]:
                return trial.choice
            trial.runs, trial.best, trial.choice, n = 1, [math.inf, math.inf], None, 0  # try again from here
            trial.recheck = min(2 * trial.recheck, RECHECK_MAX)
        if n + 1 == 2 * TRIAL_RUNS:
            self.awaiting.append(key)
        if n < 2 * TRIAL_RUNS:
            return trial.contenders[n // TRIAL_RUNS]
        return trial.contenders[0]  # tried, not yet settled: the model's pick meanwhile

    def observe(self, key: Key, algorithm: str, seconds: float) -> None:
        """This rank's time of one run of class ``key`` with ``algorithm``."""
        trial = self._classes.get(key)
        if trial is None or trial.choice is not None:
            return
        for i, name in enumerate(trial.contenders):
            if name == algorithm and seconds < trial.best[i]:
                trial.best[i] = seconds

    def agreement(self) -> list[float]:
        """What this rank contributes to the agreement (empty: none due): the best time of
        each contender of every awaiting class, in :attr:`awaiting`'s order."""
        return [t for key in self.awaiting for t in self._classes[key].best]

    def settle(self, agreed: Sequence[float]) -> None:
        """Settle the awaiting classes from the MAX over ranks of :meth:`agreement`."""
        if len(agreed) != 2 * len(self.awaiting):
            raise ValueError(f"{len(agreed)} agreed times for {len(self.awaiting)} awaiting size classes")
        for i, key in enumerate(self.awaiting):
            trial = self._classes[key]
            first, second = agreed[2 * i], agreed[2 * i + 1]
            better = second < MARGIN * first
            trial.choice = trial.contenders[1] if better else trial.contenders[0]
            trial.runs = 0
            if better:
                self.overridden[key] = trial.choice
            else:
                self.overridden.pop(key, None)
        self.awaiting = []

    def describe(self) -> str:
        """One line per settled or trying class, for ``DDL_VERBOSE`` reports."""
        rows = []
        for (klass, itemsize), t in sorted(self._classes.items()):
            state = t.choice or "trying"
            times = "/".join("-" if math.isinf(b) else f"{b * 1e6:.0f}us" for b in t.best)
            rows.append(f"{2 ** (klass / 4):.0f} B x{itemsize}: {t.contenders[0]} vs {t.contenders[1]} "
                        f"({times} here) -> {state}")
        return "; ".join(rows)
