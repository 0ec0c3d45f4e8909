#!/usr/bin/env bash
# The GPU parity suite + GPU benchmark in one command (run on the GPU machine).
#   tools/gpu_suite.sh [quick|full]     logs to $OUT/log.txt (default OUT=./gpu-out)
# quick: build + parity tests; full: + tools/gpu_bench.py (graph replay, eager host
# overhead, profile) + python -m dyadic.bench on the GPU backends.
# Each stage has its own timeout (env: CUDA_T, LAZY2_T, NUMBA_T, FUZZ_T, GB_T, KT_T, HOST_T, BENCH_T) so one
# run fits a device lease; the stage order puts the cuda parity and the graph
# benchmark first.
set -o pipefail
MODE=${1:-full}
# STAGES: which stages run, in this order (default below; cudaradix / gbradix: the parity
# tests and gpu_bench with dc_topk's radix select, CuPy launches and split verify, on request)
# lazy2: the lazy verify tests on the two-launch kernels (dc_vlazy2 + dc_vres2, taken for
# vocabularies above 128 x 32768 ids), forced with DYADIC_CUDA_LAZY=2
STAGES=${STAGES:-"build cuda lazy2 numba fuzz gb ktimes host bench"}
has() { case " $STAGES " in *" $1 "*) return 0;; esac; return 1; }
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
LOG="$OUT/log.txt"
T0=$(date +%s)
stamp() { echo "== $1 (t=$(( $(date +%s) - T0 ))s)"; }
{
  stamp "probe $(date -u +%FT%TZ)"
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
  if has build; then stamp build
  python3 -m pip install -q -e . --no-build-isolation --no-deps 2>&1 | tail -3
  fi
  if has gb && [ "$MODE" = full ]; then
    stamp "gpu_bench (graph replay)"
    timeout ${GB_T:-90} python3 tools/gpu_bench.py --out "$OUT" 2>&1 | tail -30
    echo "gpu_bench exit: $?"
  fi
  if has cuda; then stamp "cuda parity"
  python3 -c "from dyadic.backends.cuda import cupy_backend as c; print('launch mode:', c.launch_mode())" 2>&1 | tail -2
  timeout ${CUDA_T:-480} python3 -m pytest -q -rs --maxfail=${MAXFAIL:-20} -p no:cacheprovider \
      tests/gpu/test_gpu_parity.py tests/gpu/test_gpu_topk_small_k.py tests/gpu/test_gpu_topk_16bit_logits.py tests/gpu/test_gpu_verify_lazy.py tests/gpu/test_gpu_verify_one_launch.py \
      tests/gpu/test_gpu_dense_alloc.py tests/gpu/test_gpu_streams.py tests/gpu/test_gpu_bench_timing.py tests/gpu/test_gpu_large_batch.py \
      tests/gpu/test_launch_pack.py tests/gpu/test_fast_path.py tests/cpu/test_fail_closed_rows.py \
      tests/cpu/test_memory_safety.py tests/cpu/test_dyadic_ownership.py tests/cpu/test_trusted_results.py \
      tests/cpu/test_import_light.py 2>&1 | tail -${TAIL:-40}
  echo "cuda parity exit: $?"
  fi
  if has lazy2; then stamp "lazy verify, two launches (DYADIC_CUDA_LAZY=2)"
  DYADIC_CUDA_LAZY=2 timeout ${LAZY2_T:-120} python3 -m pytest -q -rs --maxfail=${MAXFAIL:-20} \
      -p no:cacheprovider tests/gpu/test_gpu_verify_lazy.py 2>&1 | tail -${TAIL:-10}
  echo "lazy2 exit: $?"
  fi
  if has cudaradix; then stamp "cuda parity, radix top-k + CuPy launch path (DYADIC_CUDA_TOPK=radix DYADIC_CUDA_LAUNCH=cupy DYADIC_CUDA_VERIFY=split)"
  DYADIC_CUDA_TOPK=radix DYADIC_CUDA_LAUNCH=cupy DYADIC_CUDA_VERIFY=split timeout ${CUDA_T:-170} python3 -m pytest -q -rs --maxfail=${MAXFAIL:-20} \
      -p no:cacheprovider tests/gpu/test_gpu_parity.py -k "propose or allocate or half or graph or verify" 2>&1 | tail -${TAIL:-40}
  echo "cuda radix parity exit: $?"
  fi
  if has ktimes && [ "$MODE" = full ]; then
    stamp "device time per kernel (torch.profiler)"
    timeout ${KT_T:-60} python3 tools/gpu_kernel_times.py --out "$OUT" --batch ${KT_BATCH:-1,64} 2>&1 | tail -${KT_TAIL:-40}
    echo "kernel times exit: $?"
  fi
  if has gbradix && [ "$MODE" = full ]; then
    stamp "gpu_bench, DYADIC_CUDA_TOPK=radix DYADIC_CUDA_LAUNCH=cupy DYADIC_CUDA_VERIFY=split"
    DYADIC_CUDA_TOPK=radix DYADIC_CUDA_LAUNCH=cupy DYADIC_CUDA_VERIFY=split timeout ${GB_T:-90} python3 tools/gpu_bench.py --out "$OUT/radix" 2>&1 | tail -8
    echo "gpu_bench radix exit: $?"
  fi
  if has numba; then stamp "numba parity"
  timeout ${NUMBA_T:-90} python3 -m pytest -q -rs --maxfail=${MAXFAIL:-20} -p no:cacheprovider \
      tests/gpu/test_gpu_parity_numba.py tests/gpu/test_numba_compiled_core.py tests/gpu/test_numba_bounds.py 2>&1 | tail -${TAIL:-25}
  echo "numba parity exit: $?"
  fi
  if has fuzz; then stamp "fuzz cpu,cuda,numba"
  timeout ${FUZZ_T:-150} python3 -m dyadic.fuzz --backends cpu,cuda,numba --cases ${FUZZ_CASES:-300} \
      --seed ${FUZZ_SEED:-7} --out "$OUT/fuzz" 2>&1 | tail -12
  echo "fuzz exit: $?"
  fi
  if has host && [ "$MODE" = full ]; then stamp "host overhead (eager, check=False)"
  timeout ${HOST_T:-90} python3 tools/host_overhead.py --reps ${HOST_REPS:-1000} --out "$OUT" 2>&1 | tail -16
  echo "host overhead exit: $?"
  fi
  if has bench && [ "$MODE" = full ]; then
    stamp "dyadic.bench"
    timeout ${BENCH_T:-50} python3 -m dyadic.bench --no-cpu --vocab 129280 --batch 1,4,64 --repeats ${BENCH_REPEATS:-20} \
        --backends ${BENCH_BACKENDS:-cuda,numba} --out "${BENCH_OUT:-/tmp/dyadic-bench}" --no-plot 2>&1 | tail -40
    echo "bench exit: $?"
  fi
  stamp done
} 2>&1 | tee "$LOG"
