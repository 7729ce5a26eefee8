"""``auto``'s choice re-checked during training, alike on every rank.

``ddl.init`` prices the algorithms from probes taken in whatever state the machine was in
then (another job's burst, a cold page cache); a bad probe fixes a slow algorithm for a
message size for the whole run. So the running job tries again, in its own buckets: for
each size class (four per octave of bytes, as :func:`ddl.reduction.cost.choose` prices
them) the model's pick and every other usable algorithm priced within :data:`WORTH` times
it each run :data:`TRIAL_RUNS` times in turn (not the runner-up alone: a probe that
misprices one algorithm threefold leaves it anywhere in the model's order), every rank
keeps its fastest time of each, and at the end of the cycle in which the last trial ran
the ranks agree on them (one allreduce of those times, MAX: the slowest rank's best) and
settle the class on the fastest. After :data:`RECHECK_RUNS` runs the class is tried
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
from collections.abc import Callable, Sequence

#: Runs of each contender per trial; its fastest counts (the first run of a size also
#: pays for compiling its schedule and for shared-memory windows).
TRIAL_RUNS = 3
#: Runs of a settled size class before it is tried again: the first time soon (a job's
#: first steps are noisy too: compiling, warming caches), then twice as long each time.
RECHECK_RUNS = 250
RECHECK_MAX = 4000
#: Another contender replaces the model's pick only when at least this much faster (noise).
MARGIN = 0.9
#: An algorithm priced above this many times the pick is never tried. A trial then costs
#: at most 3 x (WORTH - 1) calls' time per other contender, once per recheck period.
WORTH = 4.0

Key = tuple[int, int]  # (size class, item size)


@dataclasses.dataclass
class ClassTrial:
    """One size class: its contenders (the model's pick first), runs since the trial
    opened, this rank's best time of each, and the settled choice (None while trying)."""

    contenders: tuple[str, ...]
    runs: int = 0
    recheck: int = RECHECK_RUNS
    best: list[float] = dataclasses.field(default_factory=list)
    choice: str | None = None

    def __post_init__(self) -> None:
        self.best = [math.inf] * len(self.contenders)


class Trials:
    """Per size class: which algorithm a run uses, and what the ranks agreed."""

    def __init__(self) -> None:
        self._classes: dict[Key, ClassTrial] = {}
        #: Classes whose trial has run and awaits the ranks' agreement (same on every rank).
        self.awaiting: list[Key] = []
        #: Settled choices that differ from the model's pick, for reports and tests.
        self.overridden: dict[Key, str] = {}

    def pick(self, key: Key, rank: Callable[[], Sequence[tuple[str, float]]]) -> str:
        """The algorithm this run of class ``key`` uses; ``rank()``: the model's usable
        algorithms, cheapest first, with their predicted seconds (asked only the first time
        a class runs: pricing every algorithm on each large call cost microseconds)."""
        trial = self._classes.get(key)
        if trial is None:
            ranked = rank()
            pick, price = ranked[0]
            others = tuple(name for name, cost in ranked[1:] if cost <= WORTH * price)
            # Nothing worth trying: settled on the pick for good.
            trial = ClassTrial((pick, *others), choice=None if others else pick)
            self._classes[key] = trial
        n = trial.runs
        trial.runs = n + 1
        k = len(trial.contenders)
        if trial.choice is not None:
            if n < trial.recheck or k == 1:
                return trial.choice
            trial.runs, trial.best, trial.choice, n = 1, [math.inf] * k, None, 0  # try again from here
            trial.recheck = min(2 * trial.recheck, RECHECK_MAX)
        if n + 1 == k * TRIAL_RUNS:
            self.awaiting.append(key)
        if n < k * TRIAL_RUNS:
            return trial.contenders[n // TRIAL_RUNS]
        return trial.contenders[0]  # tried, not yet settled: the model's pick meanwhile

    def settled(self, key: Key) -> bool:
        """Whether class ``key`` has run and its trial is over (a benchmark times ``auto``
        from there: the steady state a training run sees between rechecks)."""
        trial = self._classes.get(key)
        return trial is not None and trial.choice is not None

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
        """Settle the awaiting classes from the MAX over ranks of :meth:`agreement`: each on
        its fastest contender where that beats the model's pick by :data:`MARGIN`."""
        want = sum(len(self._classes[key].contenders) for key in self.awaiting)
        if len(agreed) != want:
            raise ValueError(f"{len(agreed)} agreed times for {len(self.awaiting)} awaiting size classes "
                             f"({want} contenders)")
        at = 0
        for key in self.awaiting:
            trial = self._classes[key]
            times = agreed[at : at + len(trial.contenders)]
            at += len(times)
            fastest = min(range(len(times)), key=times.__getitem__)
            better = fastest > 0 and times[fastest] < MARGIN * times[0]
            trial.choice = trial.contenders[fastest] if better else trial.contenders[0]
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
            rows.append(f"{2 ** (klass / 4):.0f} B x{itemsize}: {' vs '.join(t.contenders)} "
                        f"({times} here) -> {state}")
        return "; ".join(rows)
