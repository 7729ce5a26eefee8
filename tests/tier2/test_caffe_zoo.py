"""Opt-in: the zoo job on real zoo prototxt files fetched into $CAFFE_ZOO_DIR (default /tmp/caffe-zoo); skipped without them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ZOO = Path(os.environ.get("CAFFE_ZOO_DIR", "/tmp/caffe-zoo"))


@pytest.mark.skipif(not ZOO.is_dir(), reason=f"no zoo folder at {ZOO}: fetch the nets' prototxt files there (or set CAFFE_ZOO_DIR) "
                    "and run: python -m ddl.caffe.zoo --dir <folder>")
def test_every_zoo_net_loads_runs_trains_and_exports() -> None:
    proc = subprocess.run([sys.executable, "-m", "ddl.caffe.zoo", "--dir", str(ZOO), "--json", str(ZOO / "zoo_results.json")],
                          capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
