#!/usr/bin/env bash
# Opt-in cluster tests (not part of scripts/test.sh): installs Debian's slurm-wlm, munge and
# Open MPI when missing (root; apt), then runs the tests marked slurm, openmpi and install:
# an emulated 2-node Slurm cluster, mpi4py built against Open MPI in .venv-openmpi, and a
# fresh-venv install of each example's extra. Extra arguments go to pytest (e.g. -m slurm).
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
command -v slurmd >/dev/null || need+=(slurm-wlm)
command -v munged >/dev/null || [ -x /usr/sbin/munged ] || need+=(munge)
command -v mpicc >/dev/null || need+=(openmpi-bin libopenmpi-dev)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "test-cluster: needs ${need[*]}; run as root (apt-get install) or install them first" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
bash scripts/setup-env.sh
if [ $# -eq 0 ]; then set -- -m "slurm or openmpi or install"; fi
.venv/bin/python -m pytest -q -p no:cacheprovider -s tests/tier2/test_slurm.py tests/tier2/test_openmpi.py \
  tests/tier2/test_install.py "$@"
