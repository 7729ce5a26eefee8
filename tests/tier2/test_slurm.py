"""Slurm on an emulated 2-node cluster (real slurmctld/slurmd/munged in namespaces; root only).

Opt-in: ``bash scripts/test-cluster.sh`` (installs slurm-wlm and munge) or ``pytest -m slurm``.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from emulation.slurm_cluster import SlurmCluster, missing_tools

ROOT = Path(__file__).resolve().parents[2]
WORKERS = Path(__file__).parent / "workers"
DDLRUN = str(Path(sys.executable).parent / "ddlrun")
# Emulated nodes share one kernel: without this UCX moves rank-to-rank traffic through
# shared memory and the veths between "hosts" carry almost nothing.
TCP = {"UCX_TLS": "tcp", "MPIR_CVAR_ENABLE_HEAVY_YIELD": "1"}
pytestmark = [pytest.mark.slurm, pytest.mark.mpi]


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Iterator[SlurmCluster]:
    if "slurm" not in (request.config.option.markexpr or ""):
        pytest.skip("opt-in (a few minutes of 4-rank jobs): bash scripts/test-cluster.sh or pytest -m slurm")
    if os.geteuid() != 0:
        pytest.skip("the Slurm emulation needs root (network, UTS and mount namespaces)")
    if missing_tools():
        pytest.skip(f"needs slurm-wlm and munge (missing: {', '.join(missing_tools())}); "
                    "run scripts/test-cluster.sh, which installs them")
    workdir = Path(f"/var/tmp/ddls-{os.getpid()}")
    try:
        with SlurmCluster(workdir) as emulated:
            yield emulated
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def ranks(stdout: str) -> list[str]:
    return sorted(re.findall(r"RANK \d .*?host=\S+", stdout))


def test_ddlrun_in_an_allocation_takes_hosts_and_ranks_from_it(cluster: SlurmCluster) -> None:
    done = cluster.on_node("h1", ["salloc", "-N", "2", "--ntasks-per-node=2", DDLRUN, "--verbose", "python",
                                  str(WORKERS / "worker_topology.py")], env=TCP, timeout=120, cwd=str(ROOT))
    print(done.stdout, done.stderr)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = ranks(done.stdout)
    assert len(lines) == 4, done.stdout
    assert all("dims=2x2" in line and "local=" in line and "/2 cross=" in line for line in lines), lines
    assert sorted(line.rsplit("host=", 1)[1] for line in lines) == ["h1", "h1", "h2", "h2"]
    assert "hosts h1:2,h2:2 from Slurm job" in done.stderr and "-np 4: every slot" in done.stderr


def test_torch_digits_in_an_allocation_runs_2x2_over_the_link(cluster: SlurmCluster) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    before = cluster.veth_bytes("h2")
    done = cluster.on_node("h1", ["salloc", "-N", "2", "--ntasks-per-node=2", DDLRUN, "--verbose", "python",
                                  "examples/torch_digits.py"], env=TCP, timeout=600, cwd=str(ROOT))
    crossed = cluster.veth_bytes("h2") - before
    print(done.stdout, done.stderr, f"h2 link bytes: {crossed}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ddl: 4 ranks on 2 host(s), topology 2x2" in done.stderr
    found = re.search(r"final test accuracy (\d\.\d+)", done.stdout)
    assert found and float(found.group(1)) >= 0.95, done.stdout
    assert crossed > 5_000_000, f"only {crossed} bytes crossed h2's link: traffic bypassed the network"


def test_plain_srun_with_pmi2_connects_the_ranks(cluster: SlurmCluster) -> None:
    done = cluster.on_node("h1", ["srun", "-N", "2", "-n", "4", "--mpi=pmi2", sys.executable,
                                  str(WORKERS / "worker_topology.py")], env=TCP, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = ranks(done.stdout)
    assert len(lines) == 4 and all("dims=2x2" in line for line in lines), done.stdout


def test_srun_without_pmi_is_refused_not_trained_four_times(cluster: SlurmCluster) -> None:
    done = cluster.on_node("h1", ["srun", "-N", "2", "-n", "4", "--mpi=none", sys.executable, "-c",
                                  "import ddl; ddl.init(); print('TRAINED ALONE')"], env=TCP, timeout=120)
    assert done.returncode != 0
    assert "TRAINED ALONE" not in done.stdout
    assert done.stderr.count("WorldMismatchError: srun started 4 processes") == 4, done.stderr[-3000:]
    assert "--mpi=pmi2" in done.stderr


def test_srun_with_an_mpi_that_cannot_load_exits_nonzero_before_training(cluster: SlurmCluster) -> None:
    start = time.monotonic()
    done = cluster.on_node("h1", ["srun", "-N", "2", "-n", "4", "--mpi=pmi2", sys.executable, "-c",
                                  "import ddl; ddl.init(); print('TRAINED ALONE')"],
                           env={**TCP, "MPI4PY_LIBMPI": "/nonexistent/libmpi.so.12"}, timeout=120)
    took = time.monotonic() - start
    assert done.returncode != 0 and "TRAINED ALONE" not in done.stdout, done.stdout + done.stderr[-3000:]
    assert done.stderr.count("WorldMismatchError: the launcher started 4 processes") == 4, done.stderr[-3000:]
    assert "cannot load MPI library" in done.stderr and "pip install mpich" in done.stderr, done.stderr[-3000:]
    assert took < 10, f"took {took:.1f} s"


def test_documented_sbatch_script_runs(cluster: SlurmCluster, tmp_path: Path) -> None:
    script = ROOT / "examples" / "slurm" / "digits.sbatch"
    guide = ROOT / "docs" / "guides" / "clusters.md"
    assert script.read_text().strip() in guide.read_text(), "the sbatch script in docs/guides/clusters.md differs"
    out = cluster.workdir / "sbatch.out"
    done = cluster.on_node("h1", ["sbatch", "--wait", f"--output={out}", str(script), "--epochs", "2"],
                           env=TCP, timeout=600, cwd=str(ROOT))
    text = out.read_text() if out.exists() else ""
    assert done.returncode == 0, done.stderr + text[-3000:]
    assert "ddl: 4 ranks on 2 host(s), topology 2x2" in text, text[-3000:]
    assert "final test accuracy" in text


def test_a_batch_scripts_own_python_may_run_alone(cluster: SlurmCluster) -> None:
    # The batch step has SLURM_NTASKS=4 and SLURM_PROCID=0 but is one process: not refused.
    script = cluster.workdir / "alone.sbatch"
    script.write_text(f"#!/bin/bash\n#SBATCH -N 2\n#SBATCH --ntasks-per-node=2\n"
                      f"{sys.executable} -c 'import ddl; ddl.init(); print(\"ALONE\", ddl.size())'\n")
    out = cluster.workdir / "alone.out"
    done = cluster.on_node("h1", ["sbatch", "--wait", f"--output={out}", str(script)], timeout=120)
    text = out.read_text() if out.exists() else ""
    assert done.returncode == 0 and "ALONE 1" in text, done.stderr + text


def test_a_rank_failing_before_init_in_an_allocation_ends_the_job_at_once(cluster: SlurmCluster) -> None:
    # ddlrun's keepers run on the nodes (hydra starts them through srun) and reach ddlrun on h1.
    done = cluster.on_node("h1", ["salloc", "-N", "2", "--ntasks-per-node=1", DDLRUN, sys.executable,
                                  str(WORKERS / "worker_failfast.py"), "before-init"], env=TCP, timeout=120,
                           cwd=str(ROOT))
    ended = time.time()
    assert done.returncode == 1, done.stderr[-3000:]
    report = [x for x in done.stderr.splitlines() if x.startswith("ddlrun: ")]
    assert report and report[0] == "ddlrun: rank 1 (host h2) exited with status 1 before ddl.init", report
    marks = [float(t) for t in re.findall(r"T0 (\d+\.\d{3})", done.stdout)]
    assert marks and ended - marks[0] < 5.0, (marks, ended)
