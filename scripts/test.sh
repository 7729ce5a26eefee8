#!/usr/bin/env bash
# The test command: sets up .venv itself, then lint, type check and the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh
.venv/bin/ruff check core adapters tests examples
.venv/bin/mypy -p ddl
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
