"""Tier 1: the conformance table's comparisons and verdicts on hand-made records, and the CLI's input checks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ddl.tools.cli import main as ddl_main
from ddl.tools.conformance.metrics import max_rel_diff, rel_diff
from ddl.tools.conformance.report import build_rows, format_table

W = {"fc.weight": np.array([[1.0, -2.0], [0.5, 4.0]], np.float32), "fc.bias": np.array([0.0, 1e-3], np.float32)}


def _record(out: Path, p: int, rows: list[dict], weights: dict[tuple[str, str], dict[str, np.ndarray]]) -> None:
    (out / f"np{p}").mkdir(parents=True, exist_ok=True)
    (out / f"np{p}.json").write_text(json.dumps(rows))
    for (fw, opt), w in weights.items():
        np.savez(out / f"np{p}" / f"{fw}-mlp-{opt}.npz", **w)


def _base(fw: str, p: int, **extra: object) -> dict:
    rec = {"framework": fw, "model": "mlp", "optimizer": "sgd", "ranks": p, "identical": True}
    rec.update(extra)
    return rec


def test_rel_diff_is_relative_to_the_tensor_scale() -> None:
    assert rel_diff(np.array([1.0, 0.0]), np.array([1.0, 0.0])) == 0.0
    assert rel_diff(np.array([4.0, 1e-3]), np.array([4.0, 0.0])) == pytest.approx(2.5e-4)
    assert max_rel_diff(W, W) == 0.0
    with pytest.raises(ValueError, match="differ"):
        max_rel_diff(W, {"fc.weight": W["fc.weight"]})


def test_rows_pass_and_fail_on_the_right_checks(tmp_path: Path) -> None:
    off = {k: v.copy() for k, v in W.items()}
    off["fc.weight"][0, 0] += 1e-3  # 2.5e-4 of the tensor's scale: over 1e-5 and 1e-4
    _record(tmp_path, 1, [_base("torch", 1, onnx_weights=1e-7, onnx_export=2e-7),
                          _base("tensorflow", 1, onnx_weights=1e-7, onnx_export_error="ImportError: no tf2onnx")],
            {("torch", "sgd"): W, ("tensorflow", "sgd"): off})
    _record(tmp_path, 2, [_base("torch", 2), _base("tensorflow", 2, identical=False)],
            {("torch", "sgd"): off, ("tensorflow", "sgd"): off})
    rows, notes = build_rows(tmp_path, [1, 2])
    by = {(r.framework, r.ranks): r for r in rows}
    assert by[("torch", 1)].ok()
    assert by[("torch", 2)].checks["vs 1 rank"][0] == pytest.approx(2.5e-4, rel=1e-3) and not by[("torch", 2)].ok()
    tf1 = by[("tensorflow", 1)]
    assert tf1.checks["vs torch"][0] == pytest.approx(2.5e-4, rel=1e-3) and not tf1.ok()
    assert str(tf1.checks["ort(export)"][0]).startswith("FAILED")
    tf2 = by[("tensorflow", 2)]
    assert tf2.checks["vs 1 rank"][0] == 0.0 and tf2.checks["identical"][0] == "NO" and not tf2.ok()
    table = format_table(rows, notes)
    assert table.count("| FAIL |") == 3 and "1/4 rows pass" in table


def test_skipped_framework_is_a_note(tmp_path: Path) -> None:
    _record(tmp_path, 1, [_base("torch", 1, onnx_weights=0.0, onnx_export=0.0),
                          {"framework": "caffe", "ranks": 1, "skipped": "ImportError: no lmdb"}], {("torch", "sgd"): W})
    rows, notes = build_rows(tmp_path, [1])
    assert [r.framework for r in rows] == ["torch"] and notes == ["caffe: skipped (ImportError: no lmdb)"]


def test_missing_world_size_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no results for 2 rank"):
        build_rows(tmp_path, [2])


@pytest.mark.parametrize("args, message", [
    (["--frameworks", "torch,mxnet"], "unknown frameworks ['mxnet']"),
    (["--models", "resnet"], "unknown models ['resnet']"),
    (["--ranks", "2,4"], "must include 1"),
    (["--ranks", "one"], "whole numbers"),
])
def test_cli_rejects_bad_input(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert ddl_main(["conformance", *args]) == 2
    assert message in capsys.readouterr().err


def test_cli_refuses_a_timeout_that_is_not_positive(capsys: pytest.CaptureFixture[str]) -> None:
    # It reached ddlrun as a stall timeout and failed there, naming --stall-timeout (exit 1).
    with pytest.raises(SystemExit) as stop:
        ddl_main(["conformance", "--timeout", "-5"])
    assert stop.value.code == 2
    assert "argument --timeout: takes a number greater than 0, got -5" in capsys.readouterr().err
