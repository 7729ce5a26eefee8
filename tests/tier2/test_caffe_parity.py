"""Opt-in: ddl-caffe against real BVLC Caffe, blob for blob (tools.caffe.parity), on the peer $CAFFE_PEER names.

$CAFFE_PEER is a Caffe build with pycaffe (the DEST of build-caffe.sh --python SRC DEST); with $CAFFE_ZOO_DIR set too,
the zoo folder's nets are compared, else the generated nets of tools.caffe.zoo_nets. Skipped, saying so, without
the peer: CI stays green on machines without Caffe, and nothing here builds or fetches it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]     # the checkout: tools.caffe runs from there
PEER = Path(os.environ["CAFFE_PEER"]) if os.environ.get("CAFFE_PEER") else None
ZOO = os.environ.get("CAFFE_ZOO_DIR", "")


@pytest.mark.skipif(PEER is None or not (PEER / "python" / "caffe" / "_caffe.so").is_file(),
                    reason=f"opt-in: set CAFFE_PEER to a BVLC Caffe build with pycaffe (now {os.environ.get('CAFFE_PEER', 'unset')}), "
                    "or run from a checkout: python -m tools.caffe.parity --peer DEST [--dir ZOO]")
def test_every_zoo_net_agrees_with_real_caffe_blob_for_blob(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "tools.caffe.parity", "--peer", str(PEER), "--json", str(tmp_path / "parity.json")]
    if ZOO and Path(ZOO).is_dir():
        cmd += ["--dir", ZOO]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=7200, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "| ok |" in proc.stdout
