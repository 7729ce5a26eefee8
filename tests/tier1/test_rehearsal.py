"""ddl bench rehearsal's pure parts: the replayed stream is the one ddl plan prices, and the compute scaling."""

from __future__ import annotations

import random

import numpy as np
import pytest
from ddl_bench import rehearsal

from ddl.reduction import cost
from ddl.tools import plan
from ddl.tools.plan_models import resnet50_sizes


def test_buckets_close_when_plan_says_they_are_ready() -> None:
    rng = random.Random(5)
    for _ in range(10):
        sizes = [rng.choice([1, 100, 10_000, 1_000_000]) for _ in range(rng.randint(1, 30))]
        stream = rehearsal.Stream.build(sizes, 4, compute=2.0, backward_fraction=0.6, first_cap=1 << 20, cap=4 << 20)
        events = stream.events()
        assert sorted(i for _, i, _, _ in events) == list(range(len(sizes)))  # every gradient lands once
        assert [t for t, *_ in events] == sorted(t for t, *_ in events)
        closed = {k: t for t, _, k, closes in events if closes}
        runs = plan.step_schedule(sizes, 4, plan.plan_topology("2"), cost.CostModel(links=(cost.SHARED_MEMORY,)),
                                  step=2.0, backward_fraction=0.6, first_cap=1 << 20, cap=4 << 20)
        assert len(closed) == len(runs) == len(stream.buckets)
        assert [closed[k] for k in range(len(runs))] == pytest.approx([r.ready for r in runs])
        assert max(closed.values()) == pytest.approx(2.0)  # the last gradient lands as the step's compute ends


def test_resnet50_lands_from_the_classifier_back() -> None:
    stream = rehearsal.Stream.build(resnet50_sizes(), 4, compute=0.3, backward_fraction=2 / 3,
                                    first_cap=1 << 20, cap=25 << 20)
    first = stream.events()[0]
    assert first[1] == len(stream.sizes) - 1 and first[0] == pytest.approx(0.1, rel=1e-3)  # fc bias, after forward
    assert stream.buckets[0] == [len(stream.sizes) - 1]  # DDP's small first bucket: the bias alone


def test_bucket_buffers_carry_ddl_torchs_flags() -> None:
    stream = rehearsal.Stream.build([3, 5, 2], 4, compute=1.0, backward_fraction=0.5, first_cap=8, cap=1 << 20)
    bufs = rehearsal.Buckets(stream, np.dtype(np.float32))
    assert [len(b) for b in bufs.buffers] == [2 + 2, 5 + 3 + 2 * 2]  # two presence flags per gradient
    for _, i, k, closes in stream.events():
        bufs.land(i, 2.0)
        if closes:
            bufs.close(k)
    assert bufs.correct(2.0, 0.0)
    bufs.buffers[1][0] = 3.0
    assert not bufs.correct(2.0, 1e-6)


def test_compute_keeps_the_reference_clusters_ratio_to_the_link_bound() -> None:
    ddl_p100 = rehearsal.REFERENCES["ddl-p100"]
    nbytes = 102_228_128
    step = rehearsal.scaled_compute(nbytes, 8, "200mbit", ddl_p100)
    here = rehearsal.link_bound(nbytes, 8, 25e6)
    there = rehearsal.link_bound(nbytes, 64, 12.5e9)
    assert step / here == pytest.approx(0.2 / there)
    assert 80 < step < 100  # ResNet-50 at 200 Mbit/s on 8 hosts: 7.2 s of link time, 12.4x that of compute
    with pytest.raises(plan.PlanError, match="compute-ms"):
        rehearsal.scaled_compute(nbytes, 1, "200mbit", ddl_p100)
