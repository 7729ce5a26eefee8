"""The conformance suite: every reference model x installed framework x optimiser at 1, 2 and 4 ranks.

One ddlrun job per world size trains everything (each framework starts once per rank);
the table is printed (``pytest -s``) and every row must pass.
"""

from __future__ import annotations

import time

import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("sklearn")

from ddl.tools.conformance.adapter_hooks import RECIPES, available  # noqa: E402
from ddl.tools.conformance.models import MODELS  # noqa: E402
from ddl.tools.conformance.suite import run_suite  # noqa: E402

pytestmark = pytest.mark.mpi
RANKS = [1, 2, 4]


def test_conformance_table(tmp_path) -> None:
    frameworks = available()
    if "torch" not in frameworks:
        pytest.skip("the conformance suite's reference framework (torch) is not installed")
    t0 = time.perf_counter()
    rows, table = run_suite(tmp_path, ranks=RANKS, frameworks=frameworks, models=list(MODELS),
                            optimizers=list(RECIPES), timeout=600, concurrent=True)
    print(f"\n{table}\nconformance suite: {time.perf_counter() - t0:.0f} s")
    seen = {(r.model, r.framework, r.optimizer, r.ranks) for r in rows}
    # every framework here has both optimisers; a missing row would be a silent gap
    assert seen == {(m, f, o, p) for m in MODELS for f in frameworks for o in RECIPES for p in RANKS}, table
    failed = [r for r in rows if not r.ok()]
    assert not failed, table
    for r in rows:  # the checks that make a row mean something are there
        assert r.checks["identical"][0] == "yes"
        assert ("vs 1 rank" in r.checks) == (r.ranks > 1)
        assert ("ort(weights)" in r.checks and "ort(export)" in r.checks) == (r.ranks == 1)
