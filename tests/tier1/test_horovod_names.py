"""Every public name of horovod.torch, horovod.tensorflow and horovod.tensorflow.keras 0.28.1
is in the matching ddl module with a compatible signature."""

from __future__ import annotations

import pytest

from ddl.testing.horovod_api import HOROVOD_0_28_1, coverage

# The elastic submodules are the elastic-training work's; Horovod's internal helper class
# LocalGradientAggregationHelper is replaced by backward_passes_per_step (see the migration page).
ELSEWHERE = {"elastic", "LocalGradientAggregationHelper"}


@pytest.mark.parametrize("module", sorted(HOROVOD_0_28_1))
def test_every_horovod_name_with_its_signature(module: str) -> None:
    pytest.importorskip("torch" if "torch" in module else "tensorflow")
    rows = [r for r in coverage(module) if r.name not in ELSEWHERE]
    bad = [f"{r.name}: {r.why}" for r in rows if not (r.present and r.compatible)]
    assert not bad, f"{module}: " + "; ".join(bad)


def test_the_checker_catches_a_wrong_signature() -> None:
    from ddl.testing import horovod_api

    def allreduce(tensor, name=None, average=None):  # type: ignore[no-untyped-def]  # order swapped
        return tensor

    ok, why = horovod_api._compatible(allreduce, "tensor,average=,name=")
    assert not ok and "'name'" in why and "'average'" in why
    ok, why = horovod_api._compatible(lambda tensor, root_rank: None, "tensor,root_rank,name=")
    assert not ok
