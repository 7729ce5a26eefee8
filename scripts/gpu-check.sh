#!/usr/bin/env bash
# The whole GPU check in one run: ddl.torch on CUDA (tests, then a short benchmark), and a
# JSON report. Made for a GPU machine that cannot reach the network (the device tool's):
#
#   here, once:   bash scripts/gpu-check.sh --prepare
#                 (downloads, into .gpu-wheels/, the wheels that machine's python lacks:
#                  the pip MPICH and mpi4py for its Python 3.12)
#   there:        bash scripts/gpu-check.sh --out "$OUT"      (carry .gpu-wheels)
#
# It uses the interpreter that has a CUDA build of torch (PYTHON, else python3), puts ddl
# on its path from this checkout (no build step), and installs the carried wheels into a
# folder of its own. Without a CUDA device it writes a report that says so and exits 0,
# so it can be tried on any machine. TensorFlow is not checked: its GPU wheel is larger
# than what such a machine can be sent, and it is not on it.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
python=${PYTHON:-python3}
wheels=.gpu-wheels
out=gpu-check
mode=run
while [ $# -gt 0 ]; do
  case "$1" in
    --prepare) mode=prepare ;;
    --out) out="$2"; shift ;;
    *) echo "gpu-check: unknown argument $1; use --prepare, or --out DIR" >&2; exit 2 ;;
  esac
  shift
done

if [ "$mode" = prepare ]; then
  mkdir -p "$wheels"
  for spec in "mpich==4.3.1" "mpi4py==4.1.0"; do
    "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      -d "$wheels" "$spec" || { echo "gpu-check: could not download $spec" >&2; exit 1; }
  done
  ls -la "$wheels"
  echo "gpu-check: wheels ready in $wheels; carry it to the GPU machine and run: bash scripts/gpu-check.sh --out \$OUT"
  exit 0
fi

mkdir -p "$out"
report="$out/gpu-report.json"
if ! "$python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  reason=$("$python" -c "import torch; print('torch', torch.__version__, 'sees no CUDA device')" 2>/dev/null \
           || echo "no torch in $python")
  printf '{"skipped": true, "reason": "%s"}\n' "$reason" > "$report"
  echo "gpu-check: skipped: $reason (report: $report)"
  exit 0
fi

# ddl from this checkout, laid out as its import names (core/ is ddl, adapters/torch is ddl.torch, ...).
tree=$(mktemp -d)
cp -r core "$tree/ddl"
cp -r adapters/torch "$tree/ddl/torch"
cp -r adapters/tensorflow "$tree/ddl/tensorflow"
cp -r adapters/caffe_compat "$tree/ddl/caffe"
site=$(mktemp -d)
if ls "$wheels"/*.whl >/dev/null 2>&1; then
  "$python" -m pip install -q --no-index --no-deps --no-compile --target "$site" "$wheels"/*.whl \
    || { echo "gpu-check: the carried wheels did not install" >&2; exit 1; }
fi
export PYTHONPATH="$tree:$site:$root:$root/tools/bench${PYTHONPATH:+:$PYTHONPATH}" PATH="$site/bin:$PATH" PYTHONUNBUFFERED=1
"$python" -c "import ddl, mpi4py, torch; print('gpu-check: ddl', ddl.__version__, 'torch', torch.__version__, 'mpi4py', mpi4py.__version__, 'GPU', torch.cuda.get_device_name(0))" \
  || { echo "gpu-check: ddl or mpi4py does not import with $python" >&2; exit 1; }

status=0
"$python" -m pytest -q -p no:cacheprovider -rs tests/gpu tests/tier1/test_torch_adapter.py 2>&1 | tee "$out/tests.log" \
  || status=1
"$python" -m ddl.launcher.cli -np 2 "$python" tests/gpu/worker_cuda.py "$out/cuda-checks.json" 2>&1 | tee "$out/checks.log" \
  || status=1
"$python" -m ddl_bench.torch_training -np 1,2 --device cuda --models resnet50 --rounds 3 --steps 5 --out "$out" 2>&1 \
  | tee "$out/bench.log" || status=1

"$python" - "$out" "$status" <<'EOF'
import json, pathlib, sys
out, status = pathlib.Path(sys.argv[1]), int(sys.argv[2])
def read(name):
    path = out / name
    return json.loads(path.read_text()) if path.exists() else None
tests = (out / "tests.log").read_text().strip().splitlines()[-1:] if (out / "tests.log").exists() else []
report = {"skipped": False, "ok": status == 0, "tests": tests, "checks": read("cuda-checks.json"),
          "bench": read("torch.json")}
(out / "gpu-report.json").write_text(json.dumps(report, indent=1))
print(json.dumps({"ok": report["ok"], "tests": tests}, indent=1))
EOF
rm -rf "$tree" "$site"
exit "$status"
