#!/usr/bin/env bash
# Creates .venv beside the checkout (if missing) and installs ddl into it, editable, with
# the extras named in $DDL_EXTRAS (default: test,torch,tensorflow,caffe,docs), pinned by
# scripts/constraints.txt. Strict editable mode lets mypy follow the core/ and adapters/
# package mapping, but it must be re-run when files are added: the install is repeated
# whenever the list of package files, the project metadata or the extras change (a stamp
# in .venv records what was installed), and skipped otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
extras=${DDL_EXTRAS:-test,torch,tensorflow,caffe,docs}
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
  .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
fi
stamp=$( { echo "$extras"; cat pyproject.toml setup.py scripts/constraints.txt tools/bench/pyproject.toml; \
           find core adapters tools/bench/ddl_bench -name '*.py' -o -name 'py.typed' | LC_ALL=C sort; } | sha256sum | cut -d' ' -f1)
if [ "$(cat .venv/.ddl-install 2>/dev/null)" != "$stamp" ]; then
  # PYTHONWARNINGS: setuptools frames a banner about strict editable installs on every run.
  PYTHONWARNINGS=ignore .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[$extras]" \
    -c scripts/constraints.txt \
    --config-settings editable_mode=strict 2>&1 | grep -v '^WARNING: Location' || true
  .venv/bin/python -c "import ddl, mpi4py" || { echo "setup-env: ddl did not install into .venv" >&2; exit 1; }
  # The benchmarks are tooling outside the ddl wheel (tools/bench): `ddl bench torch|tensorflow`.
  PYTHONWARNINGS=ignore .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps -e tools/bench \
    --config-settings editable_mode=strict 2>&1 | grep -v '^WARNING: Location' || true
  .venv/bin/python -c "import ddl_bench" || { echo "setup-env: ddl-bench did not install into .venv" >&2; exit 1; }
  echo "$stamp" > .venv/.ddl-install
fi
# ddl.tensorflow's optional status op (Horovod's error classes in TF graphs) is built on
# request only; the suite tests it, so build it here where a C++ compiler exists.
if [[ ",$extras," == *",tensorflow,"* ]] && command -v c++ >/dev/null 2>&1; then
  TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python -W ignore -m ddl.tensorflow.status_op >/dev/null 2>&1 \
    || echo "setup-env: ddl.tensorflow's status op did not build; graph-mode errors stay UnknownError" >&2
fi
