#!/usr/bin/env bash
# The test command: sets up .venv itself, then lint, type check, the docs site and the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh
.venv/bin/ruff check core adapters tests examples emulation scripts tools
.venv/bin/mypy -p ddl -p ddl_bench
# The documentation site, strict: a broken link or anchor, or a page missing from the nav, fails.
# No --quiet: it hides the warnings that strict mode counts, and the build passes. NO_MKDOCS_2_WARNING:
# Material prints a banner about its own future on every build.
site=$(mktemp -d)
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --site-dir "$site" || { rm -rf "$site"; exit 1; }
rm -rf "$site"
if [ "$#" -gt 0 ]; then
    exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
fi
# The whole suite: tier 1 (in-process, fake ranks) on two pytest-xdist workers; then the tests
# that start real ranks, in two lanes side by side: the timed ones one at a time (tests/conftest.py
# says which and why, and which others run with them so that both lanes end together), the rest beside them. Each lane has its own temporary folder.
rc=0
.venv/bin/python -m pytest -q -p no:cacheprovider -n 2 tests/tier1 || rc=$?
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
# A script's background job ignores SIGINT unless told otherwise. This one gets exactly one
# (its own session keeps a Ctrl-C from reaching it twice) from the trap below, so that on
# Ctrl-C or a CI timeout its fixtures take down what they built (namespaces, bridges, pods,
# ranks) before the script leaves; SIGTERM would end it with none of that undone.
(trap - INT; exec setsid .venv/bin/python -m pytest -q -p no:cacheprovider --ignore=tests/tier1 -m "timed or balance" \
    --basetemp="$scratch/timed") > "$scratch/timed.log" 2>&1 &
timed=$!
trap 'kill -INT "$timed" 2>/dev/null; wait "$timed" || true; cat "$scratch/timed.log"; exit 130' INT TERM
.venv/bin/python -m pytest -q -p no:cacheprovider --ignore=tests/tier1 -m "not timed and not balance" --basetemp="$scratch/rest" || rc=$?
wait "$timed" || rc=$?
echo "--- the timed lane (ran beside the lines above) ---"
cat "$scratch/timed.log"
exit "$rc"
