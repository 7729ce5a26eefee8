#!/usr/bin/env bash
# The main job: sets up .venv itself, then runs the distributed example under ddlrun.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh
.venv/bin/ddlrun -np 4 --topology 2x2 python examples/allreduce.py "$@"
