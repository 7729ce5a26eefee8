"""ddl.init keeps the blocks a training step frees (ddl.base.allocator), unless told or already chosen otherwise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from ddl.base import allocator
from ddl.base.config import Config, allocator_choice
from ddl.base.settings import SettingError

# One process: ddl.init(), then a step's worth of fresh 16 MiB blocks (a gradient and two
# temporaries), freed and made again; page faults per step after three warm-up steps.
STEP_FAULTS = textwrap.dedent("""
    import json, resource
    import numpy as np
    import ddl
    from ddl.runtime import lifecycle
    ddl.init()
    def step():
        a = np.ones(4 << 20, np.float32)
        b = a * 2.0
        return float(np.sqrt(b)[0])
    for _ in range(3):
        step()
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
        step()
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / 10
    print(json.dumps({"faults": faults, "policy": lifecycle.allocator_policy}))
    ddl.shutdown()
""")


def _step_faults(**env: str) -> dict[str, object]:
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("MALLOC_", "DDL_", "PMI_", "OMPI_")) and k not in ("GLIBC_TUNABLES", "LD_PRELOAD")}
    proc = subprocess.run([sys.executable, "-c", STEP_FAULTS], capture_output=True, text=True, timeout=120,
                          env={**clean, **env})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's thresholds are a Linux matter")
def test_init_keeps_freed_blocks_and_system_leaves_glibc_to_fault_them_in_again() -> None:
    kept = _step_faults()
    if not str(kept["policy"]).startswith("glibc"):
        pytest.skip(f"not glibc here: {kept['policy']}")
    system = _step_faults(DDL_MALLOC="system")
    assert system["policy"] == "the C library's own (DDL_MALLOC=system)"
    # 3 x 16 MiB a step: 12,288 small pages (here ~1,500-2,000 faults a step, transparent huge
    # pages taking the rest), or 24 huge ones where the kernel backs every mapping with them.
    assert float(system["faults"]) >= 20, system  # type: ignore[arg-type]
    assert float(kept["faults"]) < 0.05 * float(system["faults"]), (kept, system)  # type: ignore[arg-type]
    assert str(kept["policy"]).endswith(f": trim threshold {allocator.TRIM_BYTES >> 20} MiB, "
                                        f"mmap threshold {allocator.MMAP_BYTES >> 20} MiB"), kept


def test_a_policy_the_user_chose_is_left_alone() -> None:
    got = _step_faults(MALLOC_TRIM_THRESHOLD_="131072")
    assert got["policy"] == "left as the user chose (MALLOC_TRIM_THRESHOLD_=131072)"


@pytest.mark.parametrize(("env", "expected"), [
    ({}, None),
    ({"MALLOC_MMAP_THRESHOLD_": " 65536 "}, "MALLOC_MMAP_THRESHOLD_=65536"),
    ({"MALLOC_TOP_PAD_": ""}, None),  # blank: not a choice
    ({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"}, "GLIBC_TUNABLES=glibc.malloc.trim_threshold=0"),
    ({"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2"}, None),
    ({"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"},
     "LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"),
    ({"LD_PRELOAD": "/opt/lib/libtcmalloc_minimal.so.4"}, "LD_PRELOAD=/opt/lib/libtcmalloc_minimal.so.4"),
    ({"LD_PRELOAD": "/opt/lib/libfaketime.so"}, None),
])
def test_allocator_choice_names_what_the_user_set(env: dict[str, str], expected: str | None) -> None:
    assert allocator_choice(env) == expected


def test_ddl_malloc_takes_keep_or_system_and_refuses_the_rest() -> None:
    assert Config.from_env({}).malloc == "keep"
    assert Config.from_env({"DDL_MALLOC": "System"}).malloc == "system"
    with pytest.raises(SettingError, match="DDL_MALLOC='jemalloc' is not one of keep, system"):
        Config.from_env({"DDL_MALLOC": "jemalloc"})


def test_policy_says_what_init_would_do_without_doing_it() -> None:
    assert allocator.policy("system", None, apply=False) == "the C library's own (DDL_MALLOC=system)"
    assert allocator.policy("keep", "LD_PRELOAD=libjemalloc.so", apply=False) == \
        "left as the user chose (LD_PRELOAD=libjemalloc.so)"
    version = allocator.glibc_version()
    dry = allocator.policy("keep", None, apply=False)
    if version is None:
        assert dry == "the C library's own (not glibc)"
    else:
        assert dry == f"glibc {version}: trim threshold 1024 MiB, mmap threshold 256 MiB at ddl.init (DDL_MALLOC=keep)"


def test_doctor_prints_the_allocator_line_and_refuses_a_bad_setting() -> None:
    run = [sys.executable, "-m", "ddl.tools.cli", "doctor"]
    ok = subprocess.run(run, capture_output=True, text=True, timeout=60, env={**os.environ, "DDL_MALLOC": "system"})
    assert "allocator      the C library's own (DDL_MALLOC=system)" in ok.stdout, ok.stdout + ok.stderr
    bad = subprocess.run(run, capture_output=True, text=True, timeout=60, env={**os.environ, "DDL_MALLOC": "tcmalloc"})
    assert bad.returncode == 1
    assert "problem:       DDL_MALLOC='tcmalloc' is not one of keep, system" in bad.stdout, bad.stdout + bad.stderr
