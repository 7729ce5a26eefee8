#!/usr/bin/env bash
# The main job: sets up .venv itself, then trains a CNN on the bundled digits data on 2 ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh
.venv/bin/ddlrun -np 2 .venv/bin/python examples/torch_digits.py "$@"
