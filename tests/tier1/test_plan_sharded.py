"""ddl plan and ddl bench torch --memory on sharded optimizer state: memory per rank, the sharded step, the table."""

from __future__ import annotations

import pytest

from ddl.tools import plan


def _plan(*extra: str) -> tuple[list[str], dict]:
    args = plan.parser().parse_args(["--topology", "4", "--link", "10GB/s:2us", "--model", "1000,4000x1000,2000",
                                     *extra])
    return plan.make_plan(args)


def test_memory_per_rank_prices_the_state_sharded_and_not() -> None:
    lines, record = _plan("--optimizer", "adam")
    mem = record["memory"]
    params = (1000 + 4_000_000 + 2000) * 4
    assert mem["parameter_bytes"] == params and mem["state_bytes_unsharded"] == 2 * params
    # One tensor holds almost everything: its owner keeps its state (a whole tensor per rank).
    assert mem["largest_owned_parameter_bytes"] == 4_000_000 * 4 and mem["state_bytes_sharded"] == 2 * 4_000_000 * 4
    assert any(line.startswith("memory per rank (adam: 2 byte(s)") for line in lines)
    assert _plan("--optimizer", "sgd")[1]["memory"]["state_bytes_sharded"] == 0


def test_the_sharded_step_divides_the_update_and_adds_the_gather() -> None:
    lines, record = _plan("--step-ms", "100", "--update-ms", "40", "--bucket-mb", "1", "--first-bucket-mb", "1")
    step = record["sharded_step"]
    assert step["update_s"] == pytest.approx(0.040 * 16_000_000 / 16_012_000)  # the largest rank's share
    assert step["gather_s"] > 0 and step["unsharded_step_s"] >= 0.1
    assert step["step_s"] == pytest.approx(max(0.06, step["buckets"][-1]["end"]) + step["update_s"] + step["gather_s"])
    assert step["ratio"] == pytest.approx(step["step_s"] / step["unsharded_step_s"])
    assert any("shard_optimizer_state=True" in line for line in lines)
    with pytest.raises(plan.PlanError, match="--update-ms 200"):
        _plan("--step-ms", "100", "--update-ms", "200")


def test_the_memory_table_compares_rss_saved_with_state_saved() -> None:
    pytest.importorskip("torch")
    from ddl_bench.torch_memory import format_table, summarize

    mib = 1 << 20
    base = {"size": 2, "mode": "unsharded", "params": 10, "param_bytes": 100 * mib, "largest_bucket_bytes": 25 * mib,
            "state_bytes": [200 * mib, 200 * mib], "peak_rss_bytes": [900 * mib, 910 * mib]}
    zero = {**base, "mode": "sharded", "state_bytes": [120 * mib, 80 * mib], "peak_rss_bytes": [820 * mib, 800 * mib]}
    rows = summarize([zero, base])["rows"]
    assert [r["mode"] for r in rows] == ["unsharded", "sharded"]
    z = rows[1]
    assert z["bound_bytes"] == pytest.approx(100 * mib + 2 * 25 * mib) and z["within_bound"]
    assert z["state_saved_bytes"] == 80 * mib and z["rss_saved_bytes"] == 90 * mib
    assert z["rss_saved_over_state_saved"] == pytest.approx(90 / 80)
    assert "1.125" in format_table({**summarize([zero, base]), "load_average": [1.0, 2.0, 3.0]})
