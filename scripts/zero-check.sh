#!/usr/bin/env bash
# Sharded optimizer state (ZeRO-1) on a quiet machine, in one run: the CUDA checks (sharded
# training and checkpoints on GPU tensors, when a GPU is there), the torch equivalence worker
# at 2 and 4 ranks, then the two measurements with their load averages:
#   ddl bench torch --memory --ranks 1,2,4                       (state bytes, peak RSS per rank)
#   ddl bench torch --zero --optimizer adam -np 2,4 --models mlp  (sharded / unsharded step time)
# Everything lands in --out DIR (logs, memory.json, torch.json). It runs from a checkout with
# ddl installed (.venv), or, like scripts/gpu-check.sh, on a machine without the install (the
# device tool's): carry .gpu-wheels (bash scripts/gpu-check.sh --prepare) and it puts ddl on
# the path from this checkout.
set -uo pipefail
cd "$(dirname "$0")/.."
out=zero-check
[ "${1:-}" = "--out" ] && out="$2"
mkdir -p "$out"
python=${PYTHON:-python3}
if [ -x .venv/bin/python ]; then
  python=.venv/bin/python
else
  tree=$(mktemp -d)
  cp -r core "$tree/ddl" && cp -r adapters/torch "$tree/ddl/torch"
  site=$(mktemp -d)
  "$python" -m pip install -q --no-index --no-deps --no-compile --target "$site" .gpu-wheels/*.whl \
    || { echo "zero-check: carry .gpu-wheels (bash scripts/gpu-check.sh --prepare)" >&2; exit 1; }
  export PYTHONPATH="$tree:$site:$(pwd):$(pwd)/tools/bench" PATH="$site/bin:$PATH"
fi
export PYTHONUNBUFFERED=1
status=0
uptime | tee "$out/uptime.log"
if "$python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  "$python" -m ddl.launcher.cli -np 2 "$python" tests/gpu/worker_cuda.py "$out/cuda-checks.json" 2>&1 \
    | tee "$out/cuda.log" || status=1
fi
for np in 2 4; do
  "$python" -m ddl.launcher.cli -np "$np" "$python" tests/tier2/workers/worker_zero.py 2>&1 \
    | grep -E "^(ZERO|PASS)|Error" | sort -u | tee "$out/equivalence-np$np.log" || status=1
done
uptime | tee -a "$out/uptime.log"
"$python" -m ddl_bench.torch_memory --ranks 1,2,4 --out "$out" 2>&1 | tee "$out/memory.log" || status=1
uptime | tee -a "$out/uptime.log"
"$python" -m ddl_bench.torch_training -np 2,4 --models mlp --zero --optimizer adam --out "$out" 2>&1 \
  | tee "$out/speed.log" || status=1
uptime | tee -a "$out/uptime.log"
exit "$status"
