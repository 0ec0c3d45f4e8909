#!/usr/bin/env bash
# The GPU parity suite + GPU benchmark in one command (run on the GPU machine).
#   tools/gpu_suite.sh [quick|full]     logs to $OUT/log.txt (default OUT=./gpu-out)
# quick: build + parity tests; full: + python -m dyadic.bench on the GPU backends.
set -o pipefail
MODE=${1:-full}
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
LOG="$OUT/log.txt"
{
  echo "== probe $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv 2>&1
  python3 - <<'PY'
import sys, importlib
print("python", sys.version.split()[0])
for m in ("numpy", "torch", "cupy", "numba", "Cython"):
    try:
        print(m, importlib.import_module(m).__version__)
    except Exception as e:
        print(m, "missing:", e)
PY
  echo "== build"
  python3 -m pip install -q -e . --no-build-isolation --no-deps 2>&1 | tail -3
  echo "== parity tests"
  timeout ${PARITY_TIMEOUT:-400} python3 -m pytest -q -rs --maxfail=${MAXFAIL:-20} -p no:cacheprovider \
      tests/test_gpu_parity.py tests/test_import_light.py tests/test_gpu_parity_numba.py 2>&1 | tail -${TAIL:-80}
  echo "parity exit: $?"
  if [ "$MODE" = full ]; then
    echo "== benchmark"
    timeout ${BENCH_TIMEOUT:-300} python3 -m dyadic.bench --no-cpu --vocab 129280 --batch 1,4,64 \
        --backends ${BENCH_BACKENDS:-cuda} --out "$OUT/bench" --no-plot 2>&1 | tail -60
    echo "bench exit: $?"
    echo "== gpu_bench (graph replay)"
    timeout ${GB_TIMEOUT:-200} python3 tools/gpu_bench.py --out "$OUT" 2>&1 | tail -20
  fi
} 2>&1 | tee "$LOG"
