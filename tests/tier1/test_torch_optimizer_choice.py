"""Which optimizer ``ddl.torch.DistributedOptimizer(...)`` builds, decided by name in one place."""

from __future__ import annotations

import pickle

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import ddl  # noqa: E402
import ddl.torch as dt  # noqa: E402
from ddl.torch.adasum_optimizer import DistributedAdasumOptimizer  # noqa: E402
from ddl.torch.optimizer import wrapper_class  # noqa: E402
from ddl.torch.sharded_optimizer import ShardedOptimizer, ZeroRedundancyOptimizer  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _world() -> None:
    dt.init()


def sgd() -> torch.optim.Optimizer:
    return torch.optim.SGD(nn.Linear(3, 2).parameters(), lr=0.1)


def test_the_plain_sharded_and_adasum_choices() -> None:
    plain = dt.DistributedOptimizer(sgd())
    assert type(plain) is dt.DistributedOptimizer
    sharded = dt.DistributedOptimizer(sgd(), shard_optimizer_state=True)
    assert type(sharded) is ShardedOptimizer and isinstance(sharded, dt.DistributedOptimizer)
    by_keyword = dt.DistributedOptimizer(sgd(), op=ddl.Adasum)
    by_position = dt.DistributedOptimizer(sgd(), None, None, 1, ddl.Adasum)
    for adasum in (by_keyword, by_position):
        assert type(adasum) is DistributedAdasumOptimizer and not isinstance(adasum, dt.DistributedOptimizer)
    assert type(dt.DistributedOptimizer(sgd(), None, None, 1, ddl.Sum)) is dt.DistributedOptimizer


def test_the_choice_reads_the_arguments_by_name_without_building_anything() -> None:
    cls = dt.DistributedOptimizer
    assert wrapper_class(cls, ("opt",), {"op": "adasum"}) is DistributedAdasumOptimizer
    assert wrapper_class(cls, ("opt", None, None, 1, ddl.Adasum), {}) is DistributedAdasumOptimizer
    assert wrapper_class(cls, (), {"optimizer": "opt", "op": ddl.Adasum}) is DistributedAdasumOptimizer
    assert wrapper_class(cls, ("opt",), {"shard_optimizer_state": True}) is ShardedOptimizer
    assert wrapper_class(cls, ("opt",), {"shard_optimizer_state": False}) is cls
    assert wrapper_class(cls, (), {}) is cls  # unpickling
    assert wrapper_class(ShardedOptimizer, ("opt",), {"shard_optimizer_state": True}) is ShardedOptimizer
    assert wrapper_class(cls, ("opt",), {"no_such_argument": 1}) is cls  # for __init__ to refuse


def test_refusals_and_copies_are_unchanged() -> None:
    with pytest.raises(TypeError, match="no_such_argument"):
        dt.DistributedOptimizer(sgd(), no_such_argument=1)
    with pytest.raises(TypeError, match="wraps a torch.optim.Optimizer"):
        dt.DistributedOptimizer("not an optimizer")
    with pytest.raises(TypeError, match="wrap it once"):
        dt.DistributedOptimizer(dt.DistributedOptimizer(sgd()))
    clone = pickle.loads(pickle.dumps(dt.DistributedOptimizer(sgd(), shard_optimizer_state=True)))
    assert type(clone) is ShardedOptimizer
    zero = ZeroRedundancyOptimizer(nn.Linear(3, 2).parameters(), optimizer_class=torch.optim.SGD, lr=0.1)
    assert isinstance(zero, ShardedOptimizer)
