#!/usr/bin/env bash
# The main job: sets up .venv itself (with only what the demo needs: the torch extra), then
# trains a CNN on the bundled digits data on 2 ranks. Extra arguments go to the example
# (e.g. --epochs 3). DDL_EXTRAS=... installs other extras beside it.
set -euo pipefail
cd "$(dirname "$0")/.."
DDL_EXTRAS=${DDL_EXTRAS:-torch} bash scripts/setup-env.sh
echo "demo: ddlrun -np 2 python examples/torch_digits.py $*" >&2
exec .venv/bin/ddlrun -np 2 .venv/bin/python examples/torch_digits.py "$@"
