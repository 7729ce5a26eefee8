#!/usr/bin/env bash
# Creates .venv beside the checkout (if missing) and installs ddl into it, editable, with
# the extras named in $DDL_EXTRAS (default: test,torch,tensorflow,caffe,docs), pinned by scripts/constraints.txt. Strict editable mode lets mypy follow
# the core/ and adapters/ package mapping; it is re-run every time so new files appear.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[${DDL_EXTRAS:-test,torch,tensorflow,caffe,docs}]" \
  -c scripts/constraints.txt \
  --config-settings editable_mode=strict 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -c "import ddl, mpi4py" || { echo "setup-env: ddl did not install into .venv" >&2; exit 1; }
