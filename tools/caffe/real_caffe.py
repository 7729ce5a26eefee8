"""Real BVLC Caffe as a peer: where its build is (``--peer DEST``, as ``build-caffe.sh SRC DEST`` left it), how to run
its ``caffe`` command and pycaffe at a given thread count. Nothing here builds or downloads Caffe."""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent


class PeerError(RuntimeError):
    """The peer named by ``--peer`` is not a usable Caffe build; the message says what is missing."""


@dataclass(frozen=True)
class Peer:
    """A built BVLC Caffe: ``root/build/tools/caffe`` and, when built with ``--python``, ``root/python``.

    Args:
        root: the build's DEST folder.
        python: the interpreter pycaffe was built against (Debian's, whose numpy matches).
        core: the OpenBLAS kernels Caffe runs on (``OPENBLAS_CORETYPE``, e.g. ``SkylakeX``). Debian 12's OpenBLAS
            0.3.21 may not recognise a newer CPU and fall back to generic SSE3 kernels (``Prescott``), leaving
            Caffe 1.5-2x slower than it can be; :func:`best_core` names the CPU's real one.
    """

    root: Path
    python: str = "/usr/bin/python3"
    core: str | None = None     # OPENBLAS_CORETYPE for every Caffe process (None: what OpenBLAS detects)

    @property
    def caffe(self) -> Path:
        return self.root / "build" / "tools" / "caffe"

    def check(self, *, pycaffe: bool) -> None:
        """Raise PeerError naming what is missing (the binary, pycaffe, its Python)."""
        if not self.caffe.is_file():
            raise PeerError(f"--peer {self.root}: no Caffe binary at {self.caffe}; build one with "
                            "build-caffe.sh SRC DEST and pass DEST")
        if pycaffe:
            if not (self.root / "python" / "caffe" / "_caffe.so").is_file():
                raise PeerError(f"--peer {self.root}: pycaffe is not built there ({self.root}/python/caffe/_caffe.so "
                                "is missing); build with build-caffe.sh --python")
            if not Path(self.python).is_file():
                raise PeerError(f"--peer-python {self.python}: no such interpreter (pycaffe needs the Python it was built for)")

    def env(self, threads: int) -> dict[str, str]:
        """The environment for a Caffe process on ``threads`` threads (OpenBLAS and OpenMP), quiet glog."""
        env = dict(os.environ)
        env.update(OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads), GLOG_minloglevel="1",
                   PYTHONPATH=str(self.root / "python"))
        env.pop("OPENBLAS_CORETYPE", None)
        if self.core:
            env["OPENBLAS_CORETYPE"] = self.core
        env.pop("PYTHONHOME", None)
        return env

    def blas_core(self) -> str:
        """The kernels OpenBLAS gives Caffe's processes (its ``OPENBLAS_VERBOSE=2`` "Core:" line)."""
        env = self.env(1)
        env["OPENBLAS_VERBOSE"] = "2"
        out = subprocess.run([str(self.caffe), "--version"], capture_output=True, text=True, env=env, timeout=60)
        m = re.search(r"^Core: (\S+)", out.stdout + out.stderr, re.M)
        return m.group(1) if m else "unknown (OpenBLAS printed no Core line)"

    def version(self) -> str:
        out = subprocess.run([str(self.caffe), "--version"], capture_output=True, text=True, env=self.env(1), timeout=60)
        commit = subprocess.run(["git", "-C", str(self.root), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=60).stdout.strip()
        return (out.stdout.strip() or out.stderr.strip()) + (f" ({commit})" if commit else "")

    def pycaffe(self, args: list[str], *, threads: int = 1, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
        """Run ``pycaffe_side.py`` with ``args`` under pycaffe's Python."""
        return subprocess.run([self.python, str(HERE / "pycaffe_side.py"), *args], capture_output=True, text=True,
                              env=self.env(threads), timeout=timeout)

    def run(self, args: list[str], *, threads: int, cwd: Path, timeout: float = 3600) -> subprocess.CompletedProcess[str]:
        """Run the ``caffe`` command (``time``, ``train``, ...) with ``args`` in ``cwd``."""
        env = self.env(threads)
        env["GLOG_minloglevel"] = "0"                     # its timings are INFO lines
        env["GLOG_logtostderr"] = "1"
        return subprocess.run([str(self.caffe), *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)


def cpu_flags() -> set[str]:
    """The CPU's feature flags (``/proc/cpuinfo``)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    m = re.search(r"^flags\s*:(.*)$", text, re.M)
    return set(m.group(1).split()) if m else set()


def best_core(flags: set[str] | None = None) -> str | None:
    """The OpenBLAS 0.3.21 core for this CPU's vector units: AVX-512 -> SkylakeX, AVX2 -> Haswell, else None
    (leave OpenBLAS to detect)."""
    flags = cpu_flags() if flags is None else flags
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        return "SkylakeX"
    if {"avx2", "fma"} <= flags:
        return "Haswell"
    return None


def ddl_side() -> str:
    """What ddl-caffe computes with: torch's version, its CPU capability and BLAS (no OpenBLAS core to set)."""
    import torch

    blas = "MKL" if torch.backends.mkl.is_available() else "its BLAS"
    return (f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}, {blas} and oneDNN "
            f"kernels{' (MKL_ENABLE_INSTRUCTIONS=' + os.environ['MKL_ENABLE_INSTRUCTIONS'] + ')' if 'MKL_ENABLE_INSTRUCTIONS' in os.environ else ''}")
