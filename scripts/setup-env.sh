#!/usr/bin/env bash
# Creates .venv beside the checkout (if missing) and installs ddl into it, editable, with
# the extras named in $DDL_EXTRAS (default: test,torch,tensorflow,caffe,docs), pinned by
# scripts/constraints.txt. Strict editable mode lets mypy follow the core/ and adapters/
# package mapping, but it must be re-run when files are added: the install is repeated
# whenever the list of package files or the project metadata change, or an extra is asked
# for that is not installed yet (a stamp in .venv records what was installed), and skipped
# otherwise (a warm run takes well under a second). It says what it does as it goes.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
extras=${DDL_EXTRAS:-test,torch,tensorflow,caffe,docs}
say() { echo "setup-env: $*" >&2; }
# While a long step runs, say every 15 s that it still does (pip is silent while it unpacks torch).
beat() { ( n=0; while sleep 1; do n=$((n + 1)); [ $((n % 15)) -ne 0 ] || say "... $1 ($n s so far)"; done ) &
         beating=$!; }
beating=""
unbeat() { [ -n "$beating" ] || return 0; kill "$beating" 2>/dev/null || true; wait "$beating" 2>/dev/null || true; beating=""; }
trap unbeat EXIT
if [ ! -x .venv/bin/python ]; then
  say "creating .venv with $("$python" --version 2>&1), and updating its pip"
  beat "creating .venv"
  "$python" -m venv .venv
  .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
  unbeat
fi
files=$( { cat pyproject.toml setup.py scripts/constraints.txt tools/bench/pyproject.toml; \
           find core adapters tools/bench/ddl_bench -name '*.py' -o -name 'py.typed' | LC_ALL=C sort; } \
         | sha256sum | cut -d' ' -f1)
# The stamp: line 1 the files' digest, line 2 the extras installed with them (comma-separated).
installed_files=$(sed -n 1p .venv/.ddl-install 2>/dev/null || true)
installed_extras=$(sed -n 2p .venv/.ddl-install 2>/dev/null || true)
missing=""
for extra in ${extras//,/ }; do
  [[ ",$installed_extras," == *",$extra,"* ]] || missing="$missing $extra"
done
if [ "$installed_files" != "$files" ] || [ -n "$missing" ]; then
  # What pip installs stays installed: the extras of an earlier install still count.
  wanted=$( { [ "$installed_files" = "$files" ] && echo "$installed_extras"; echo "$extras"; } \
            | tr ',' '\n' | grep -v '^$' | LC_ALL=C sort -u | paste -sd, -)
  if [ -z "$installed_files" ]; then
    say "installing ddl with the extras $extras into .venv (a few minutes on a fresh machine; pip's steps follow)"
  else
    say "installing ddl again (package files changed, or extras asked for:${missing:- none}): $extras"
  fi
  # PYTHONWARNINGS: setuptools frames a banner about strict editable installs on every run.
  # pip's own lines, cut to the steps that show progress (the rest is in pip's log).
  beat "pip is still installing"
  PYTHONWARNINGS=ignore .venv/bin/python -m pip install --disable-pip-version-check --progress-bar off \
    -e ".[$extras]" -c scripts/constraints.txt --config-settings editable_mode=strict 2>&1 \
    | grep --line-buffered -E '^(Collecting|Downloading|Installing collected|Successfully installed|ERROR|error)' \
    | sed -u 's/^/  pip: /' >&2 || true
  unbeat
  .venv/bin/python -c "import ddl, mpi4py" || { say "ddl did not install into .venv (see pip's errors above)"; exit 1; }
  # The benchmarks are tooling outside the ddl wheel (tools/bench): `ddl bench allreduce|startup|rehearsal|torch|tensorflow`.
  PYTHONWARNINGS=ignore .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps -e tools/bench \
    --config-settings editable_mode=strict 2>&1 | grep -v '^WARNING: Location' || true
  .venv/bin/python -c "import ddl_bench" || { say "ddl-bench (tools/bench) did not install into .venv"; exit 1; }
  if [ "$installed_files" = "$files" ]; then extras_now=$wanted; else extras_now=$extras; fi
  printf '%s\n%s\n' "$files" "$extras_now" > .venv/.ddl-install
  say "installed"
fi
# ddl.tensorflow's optional status op (Horovod's error classes in TF graphs) is built on
# request only; the suite tests it, so build it here where a C++ compiler exists. Once
# built for this install it is not looked at again (that would import TensorFlow, ~9 s).
if [[ ",$extras," == *",tensorflow,"* ]] && command -v c++ >/dev/null 2>&1; then
  built=$(sed -n 2p .venv/.ddl-status-op 2>/dev/null || true)
  if [ "$(sed -n 1p .venv/.ddl-status-op 2>/dev/null || true)" != "$files" ] || [ ! -f "$built" ]; then
    say "building ddl.tensorflow's status op (imports TensorFlow once)"
    beat "building the status op"
    if built=$(TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python -W ignore -m ddl.tensorflow.status_op 2>/dev/null | tail -1) \
        && [ -f "$built" ]; then
      printf '%s\n%s\n' "$files" "$built" > .venv/.ddl-status-op
    else
      say "ddl.tensorflow's status op did not build; graph-mode errors stay UnknownError"
    fi
    unbeat
  fi
fi
# Byte-compile ddl once here: where PYTHONDONTWRITEBYTECODE is set (as on some CI images),
# every rank, launcher and worker would otherwise compile ddl's ~40k lines at start, about
# a second each (3.6 s against 2.6 s to import ddl.torch on 2 cores). Up to date: a no-op.
.venv/bin/python -m compileall -q -j 0 build/__editable__.* tools/bench/build/__editable__.* >/dev/null \
  || say "byte-compiling ddl failed; it still runs, each process compiling it at start"
