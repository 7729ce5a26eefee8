"""The core never imports a deep-learning framework: ddl works with them blocked."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

BLOCKED = ("torch", "tensorflow", "keras", "jax")

SCRIPT = textwrap.dedent(
    """
    import importlib.abc
    import sys

    BLOCKED = {blocked!r}

    class Blocker(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"blocked import of {{name}} (ddl core must not import it)")
            return None

    sys.meta_path.insert(0, Blocker())
    for name in list(sys.modules):
        if name.split(".")[0] in BLOCKED:
            del sys.modules[name]

    import numpy as np

    import ddl
    import ddl.testing

    ddl.init()
    assert ddl.size() == 1 and ddl.rank() == 0
    out = ddl.allreduce(np.arange(4.0), op=ddl.Sum)
    assert out.tolist() == [0.0, 1.0, 2.0, 3.0], out
    assert ddl.allreduce(np.ones(3)).tolist() == [1.0, 1.0, 1.0]
    assert ddl.testing.run_ranks(2, lambda comm: comm.rank) == [0, 1]
    ddl.shutdown()
    leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    assert not leaked, leaked
    # The blocker itself works: this must fail.
    try:
        import torch  # noqa: F401
    except ImportError:
        pass
    else:
        raise SystemExit("blocker did not block torch")
    print("isolation ok")
    """
).format(blocked=BLOCKED)


def test_ddl_imports_without_frameworks() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DDL_", "PMI_", "OMPI_", "MPICH_"))}
    env["DDL_CALIBRATION"] = "off"  # no link measurement at init: keep it fast
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, env=env,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "isolation ok" in proc.stdout


def test_ddl_torch_does_not_load_tensorflow() -> None:
    pytest.importorskip("torch")
    script = ("import sys, ddl, ddl.torch\n"
              "leaked = sorted({m.split('.')[0] for m in sys.modules} & {'tensorflow', 'keras'})\n"
              "assert not leaked, leaked\n"
              "print('torch isolation ok')")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "torch isolation ok" in proc.stdout


def test_import_ddl_loads_nothing_until_used() -> None:
    """``import ddl`` costs milliseconds (launchers, ``ddl doctor``): no numpy, no MPI, no
    ml_dtypes until a name is used; every public name then resolves, and unknown ones fail."""
    script = textwrap.dedent(
        """
        import sys, time
        t0 = time.perf_counter()
        import ddl
        took = time.perf_counter() - t0
        heavy = sorted({m.split('.')[0] for m in sys.modules} & {'numpy', 'mpi4py', 'ml_dtypes'})
        assert not heavy, heavy
        assert callable(ddl.topology) and ddl.__version__
        assert sorted(ddl.__all__) == sorted(ddl._LAZY)  # the literal names exactly the lazy names
        for name in ddl.__all__:
            assert getattr(ddl, name) is not None, name
        assert set(ddl.__all__) <= set(dir(ddl))
        try:
            ddl.no_such_name
        except AttributeError as exc:
            assert "no_such_name" in str(exc)
        else:
            raise SystemExit("unknown attribute did not raise")
        from ddl import Sum, allreduce  # from-imports resolve lazily too
        ddl.init()  # loads every layer's package: none of them may shadow a public name
        import ddl.engine.context
        from ddl.engine.context import Context
        assert ddl.context().topology.size == 1 and ddl.topology().size == 1 and ddl.rank() == 0
        assert isinstance(ddl.context(), Context)
        import pkgutil, types
        layers = {m.name for m in pkgutil.iter_modules(ddl.__path__)}
        assert not layers & set(ddl.__all__), layers & set(ddl.__all__)
        for name in ddl.__all__:
            assert not isinstance(getattr(ddl, name), types.ModuleType), name
        print(f"lazy ok {took:.3f}")
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "lazy ok" in proc.stdout
