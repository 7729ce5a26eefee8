"""Opt-in: the zoo job on real zoo prototxt files fetched into the folder $CAFFE_ZOO_DIR names.

Only when the variable is set: a folder left in /tmp must not add minutes to the default suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]     # the checkout: tools.caffe runs from there
ZOO = Path(os.environ["CAFFE_ZOO_DIR"]) if os.environ.get("CAFFE_ZOO_DIR") else None


@pytest.mark.skipif(ZOO is None or not ZOO.is_dir(),
                    reason=f"opt-in: fetch the nets' prototxt files into a folder and set CAFFE_ZOO_DIR to it "
                    f"(now {os.environ.get('CAFFE_ZOO_DIR', 'unset')}), or run from a checkout: python -m tools.caffe.zoo --dir <folder>")
def test_every_zoo_net_loads_runs_trains_and_exports() -> None:
    assert ZOO is not None
    proc = subprocess.run([sys.executable, "-m", "tools.caffe.zoo", "--dir", str(ZOO), "--json", str(ZOO / "zoo_results.json")],
                          capture_output=True, text=True, timeout=3600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
