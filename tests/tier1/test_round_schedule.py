"""LocalSGD/DiLoCo's round schedule (ddl.engine.periodic.RoundSchedule): one piece that decides
alike on Python ints (ddl.torch) and on TensorFlow tensors inside a tf.function (ddl.tensorflow.keras)."""

from __future__ import annotations

import os

import pytest

from ddl.engine.periodic import RoundSchedule


def trace(schedule: RoundSchedule, steps: int) -> list[tuple[int, str]]:
    """The events an adapter's step loop makes of the schedule: ("merge", step), ("start", step), on ints."""
    events, in_flight, merge_at = [], False, 0
    for n in range(1, steps + 1):
        if schedule.merge_due(n, in_flight, merge_at):
            events.append((n, "merge"))
            in_flight = False
        if schedule.round_due(n):
            events.append((n, "start"))
            in_flight, merge_at = True, schedule.merge_at(n)
            if schedule.waits:
                events.append((n, "merge"))
                in_flight = False
    return events


def test_rounds_start_every_period_and_land_overlap_steps_later() -> None:
    assert trace(RoundSchedule(4, 0), 9) == [(4, "start"), (4, "merge"), (8, "start"), (8, "merge")]
    assert trace(RoundSchedule(4, 2), 11) == [(4, "start"), (6, "merge"), (8, "start"), (10, "merge")]
    # overlap == period: the round in flight lands at the step the next one starts, before it.
    assert trace(RoundSchedule(3, 3), 9) == [(3, "start"), (6, "merge"), (6, "start"), (9, "merge"), (9, "start")]
    assert trace(RoundSchedule(1, 1), 3) == [(1, "start"), (2, "merge"), (2, "start"), (3, "merge"), (3, "start")]


def test_synchronize_sends_one_more_round_only_for_unsent_steps_after_the_first() -> None:
    assert RoundSchedule.last_round_due(2, True)
    assert not RoundSchedule.last_round_due(0, True) and not RoundSchedule.last_round_due(3, False)


@pytest.mark.parametrize(("period", "overlap"), [(0, 0), (2, 3), (2, -1), (2.0, 0), (True, 0)])
def test_bad_settings_are_refused_with_the_owners_name(period: object, overlap: object) -> None:
    with pytest.raises(ValueError, match=r"^DiLoCo: (period|overlap) must be an integer"):
        RoundSchedule.checked("DiLoCo", period, overlap)


def tf_trace(schedule: RoundSchedule, steps: int) -> list[tuple[int, str]]:
    """The same loop in a tf.function on Keras variables, as ddl.tensorflow.keras's LocalSGD keeps its counters."""
    tf = pytest.importorskip("tensorflow")
    keras = pytest.importorskip("keras")
    counter = {"shape": (), "dtype": "int64", "initializer": "zeros", "trainable": False}
    taken, in_flight, merge_at = (keras.Variable(name=n, **counter) for n in ("steps", "in_flight", "merge_at"))

    @tf.function(autograph=False)  # the decisions must be graph ops by themselves, not by autograph's rewrite
    def step() -> tuple[tf.Tensor, tf.Tensor]:
        taken.assign_add(1)
        merge = schedule.merge_due(taken, tf.equal(in_flight, 1), merge_at)
        in_flight.assign(tf.where(merge, tf.constant(0, tf.int64), in_flight))
        start = schedule.round_due(taken)
        in_flight.assign(tf.where(start, tf.constant(1, tf.int64), in_flight))
        merge_at.assign(tf.where(start, schedule.merge_at(taken), merge_at))
        return merge, start

    events: list[tuple[int, str]] = []
    for n in range(1, steps + 1):
        merge, start = step()
        assert merge.dtype == tf.bool and start.dtype == tf.bool  # graph ops, not Python bools
        events += [(n, "merge")] * bool(merge) + [(n, "start")] * bool(start)
    return events


@pytest.mark.parametrize(("period", "overlap"), [(4, 2), (3, 3), (2, 1)])
def test_the_same_decisions_come_out_of_a_tf_function_on_keras_variables(period: int, overlap: int) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    schedule = RoundSchedule(period, overlap)
    assert tf_trace(schedule, 12) == trace(schedule, 12)
