"""The checkpoint read checks shared by the torch and Keras loaders."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddl.checkpoint import CheckpointError
from ddl.checkpoint.checks import check_class, check_replicas, saved_optimizer

WHERE = Path("ckpt/manifest.json")


def test_replicas_saved_apart_load_at_their_own_size_or_through_the_periodic_optimizer() -> None:
    check_replicas(WHERE, None, 4, periodic=False)  # one set of weights: any size
    check_replicas(WHERE, 3, 3, periodic=False)  # each rank its own
    check_replicas(WHERE, 3, 2, periodic=True)  # LocalSGD/DiLoCo joins them
    with pytest.raises(CheckpointError, match=r"meta.model.replicas is 3: .* load it at 3 ranks, or with optimizer="):
        check_replicas(WHERE, 3, 2, periodic=False)


def test_an_optimizer_asked_for_must_have_been_saved() -> None:
    assert saved_optimizer(WHERE, {"optimizer": {"class": "SGD"}}) == {"class": "SGD"}
    with pytest.raises(CheckpointError, match=r"ckpt/manifest.json: field meta.optimizer is missing: .*optimizer=None"):
        saved_optimizer(WHERE, {"model": {}})


def test_another_class_is_refused_naming_the_field_and_both_classes() -> None:
    check_class(WHERE, "meta.optimizer.class", "torch.optim.sgd.SGD", "torch.optim.sgd.SGD")
    with pytest.raises(CheckpointError, match=r"field meta.optimizer.inner.class is a.Adam, the inner optimizer is "
                                              r"a.SGD: build the one"):
        check_class(WHERE, "meta.optimizer.inner.class", "a.Adam", "a.SGD", "the inner optimizer")
