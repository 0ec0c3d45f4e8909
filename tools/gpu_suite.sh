#!/usr/bin/env bash
# The GPU parity suites and the GPU benchmark in one command (run on the GPU machine).
#   tools/gpu_suite.sh                  logs to $OUT/log.txt (default OUT=./gpu-out)
# STAGES picks the stages, in this order (default: build cuda numba integrations fuzz bench;
# trees, shard, ab, kab, timeline and ncu run only when named):
#   build   pip install -e . (the Cython backend)
#   cuda    the cuda parity tests (cuda == cpu bit for bit, lazy, large batches, hostile
#           ids, streams, graph capture) and the host-side tests that touch the device path,
#           in CUDA_JOBS (3) pytest processes side by side
#   numba   the numba parity tests
#   integrations  tests/integrations on the GPU (cuda / numba vs cpu with CUDA models;
#           the tiny models train there once, cached under /tmp/dyadic-model-cache)
#   fuzz    python -m dyadic.fuzz --backends cpu,cuda,numba --cases $FUZZ_CASES (400), then
#           the verify_logits and propose_filtered primitives on cpu,cuda
#   trees   other source trees in $TREES (e.g. `git archive` of experiment branches), each
#           installed into its own folder, tested side by side: pytest on $TREES_TESTS and
#           the fuzz of $TREES_FUZZ on cpu,cuda, each in a process of its own (set empty:
#           left out)
#   shard   the sharded (dyadic.distributed) device path: the CUDA shard kernels against
#           the CPU's (tests/gpu/test_gpu_shard_kernels.py), then gloo ranks on one GPU
#           with CUDA shards against the unsharded cpu / cuda calls and the host shards
#           (tests/distributed/test_distributed_cuda.py; the dense steps on CuPy,
#           tests/distributed/test_dense_xp.py), then the bench with CUDA
#           shards, device kernels and host kernels (SHARD_T per part)
#   bench   python -m dyadic.bench gpu (graph replay and eager host time) into $OUT; CASES
#           (comma-separated substrings, or =NAME for one case) picks cases; KERNELS=N adds
#           each kernel's device time over N eager invocations (torch.profiler)
#   ab      A/B: the checkout in $AB_OLD (a source tree, e.g. `git archive REV`) against this
#           tree, each installed into its own folder and its kernels compiled, side by side,
#           $AB_RUNS (2) alternating runs of dyadic/bench/gpu.py per side (each pinned to CPU
#           core $AB_CPU where set), then python -m dyadic.bench compare; AB_MID (up to 10
#           source trees, space-separated) adds sides between the two (mida, midb, ...),
#           each step old -> mida -> ... -> new compared as well; then, where AB_TESTS
#           (pytest files) or AB_FUZZ (fuzz primitives) are given, those on this tree's
#           install (its kernels already compiled), side by side: one call measures and
#           tests a tree
#   kab     python -m dyadic.bench kernel-ab $KAB_OLD: the kernels of the source tree KAB_OLD
#           against this tree's, alternating in one process under this tree's plans
#           (KAB_ROUNDS rounds of KAB_REPS profiled invocations; CASES and BATCH as bench)
#   ncu     Nsight Compute (SOL, occupancy, launch, warp states, memory) of the kernels
#           matching NCU_KERNELS (regex, default logits_) in one call of each NCU_CASES case
#           (tools/run_case.py; BATCH as bench, default 1,64) into $OUT/ncu.txt; NCU_SOURCE=1
#           adds the source counters, per source line in $OUT/ncu-source.md (tools/ncu_source.py)
#   timeline  python -m dyadic.bench timeline: each kernel's pass and last-block tail in a
#           call, from %globaltimer stamps of an instrumented copy of the kernels (TL_CASES,
#           default the verify-from-logits case; BATCH as bench)
# (The ab stage takes KERNELS too; each side's kernels compile in a process of their own,
# about 70 s, under AB_T, before any timed run.)
# Each stage has its own timeout (CUDA_T, NUMBA_T, INTEGRATIONS_T, FUZZ_T, BENCH_T, AB_T per run,
# KAB_T, TL_T) so one
# call fits a device lease; split the stages over calls where they do not.
set -o pipefail
STAGES=${STAGES:-"build cuda numba integrations fuzz bench"}
has() { case " $STAGES " in *" $1 "*) return 0;; esac; return 1; }
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
LOG="$OUT/log.txt"
T0=$(date +%s)
stamp() { echo "== $1 (t=$(( $(date +%s) - T0 ))s)"; }
# the source tree $2 installed into folder $1 (not editable: a tree of its own), pip's
# output in $1.install
install_into() {
  python3 -m pip install -q --no-deps --no-build-isolation --target "$1" "$2" > "$1.install" 2>&1
}
# the install in folder $1 of the source tree $2 tested, its output to stdout: pytest on the
# files $3 from a copy of the tree's tests (none: no pytest) and the fuzz of the primitives
# $4 on cpu,cuda (none: no fuzz), side by side, each in a process of its own
test_install() {
  rm -rf "$1-run" "$1.pytest" "$1.fuzz" && mkdir -p "$1-run"
  cp -r "$2/tests" "$2/pyproject.toml" "$1-run/"
  ( cd "$1-run" && export PYTHONPATH="$1"
    if [ -n "$3" ]; then
      ( timeout ${TREES_T:-420} python3 -m pytest -q -rs --maxfail=${MAXFAIL:-20} \
            -p no:cacheprovider $3 2>&1 | tail -${TAIL:-8}
        echo "pytest exit: $?" ) > "$1.pytest" &
    fi
    if [ -n "$4" ]; then
      ( timeout ${FUZZ_T:-150} python3 -m dyadic.fuzz --primitives $4 --backends cpu,cuda \
            --cases ${FUZZ_CASES:-400} --seed ${FUZZ_SEED:-7} 2>&1 | tail -2
        echo "fuzz exit: $?" ) > "$1.fuzz" &
    fi
    wait
    cat "$1.pytest" "$1.fuzz" 2>/dev/null )
}
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
  if has cuda; then stamp "cuda parity"
  python3 -c "from dyadic.backends.cuda.cupy import runtime; print('launch mode:', runtime.launch_mode())" 2>&1 | tail -2
  files=(tests/gpu/test_gpu_parity.py tests/gpu/test_gpu_topk_small_k.py
      tests/gpu/test_gpu_topk_16bit_logits.py tests/gpu/test_gpu_verify_lazy.py
      tests/gpu/test_gpu_verify_one_launch.py tests/gpu/test_gpu_dense_alloc.py
      tests/gpu/test_gpu_streams.py tests/gpu/test_gpu_bench_timing.py
      tests/gpu/test_gpu_large_batch.py tests/gpu/test_launch_pack.py
      tests/gpu/test_cuda_routes.py tests/gpu/test_device_host_tensor.py
      tests/gpu/test_gpu_ragged.py tests/gpu/test_gpu_logits_unavailable.py
      tests/gpu/test_gpu_verify_logits.py tests/gpu/test_gpu_filtered_alloc.py
      tests/bench/test_gpu_cases.py tests/cpu/test_fail_closed_rows.py
      tests/cpu/test_memory_safety.py tests/cpu/test_dyadic_ownership.py
      tests/cpu/test_trusted_results.py tests/cpu/test_import_light.py)
  # CUDA_JOBS pytest processes side by side on the one GPU, file i in process i mod
  # CUDA_JOBS (correctness tests only: no stage times anything while they run)
  jobs=${CUDA_JOBS:-3}
  parts=$(mktemp -d)
  for ((i = 0; i < jobs; i++)); do
    part=()
    for ((j = i; j < ${#files[@]}; j += jobs)); do part+=("${files[j]}"); done
    [ ${#part[@]} -eq 0 ] && continue
    echo "${part[*]}" > "$parts/$i.files"
    ( timeout ${CUDA_T:-480} python3 -m pytest -q -rs --maxfail=${MAXFAIL:-20} -p no:cacheprovider \
        "${part[@]}" > "$parts/$i.log" 2>&1; echo $? > "$parts/$i.rc" ) &
  done
  wait
  rc=0
  for f in "$parts"/*.files; do
    i=$(basename "$f" .files)
    echo "-- cuda part $i: $(cat "$f")"
    tail -${TAIL:-40} "$parts/$i.log"
    [ "$(cat "$parts/$i.rc")" != 0 ] && rc=$(cat "$parts/$i.rc")
  done
  rm -rf "$parts"
  echo "cuda parity exit: $rc"
  fi
  if has numba; then stamp "numba parity"
  timeout ${NUMBA_T:-90} python3 -m pytest -q -rs --maxfail=${MAXFAIL:-20} -p no:cacheprovider \
      tests/gpu/test_gpu_parity_numba.py tests/gpu/test_numba_compiled_core.py \
      tests/gpu/test_numba_bounds.py tests/gpu/test_numba_verify_logits.py \
      tests/gpu/test_numba_device_logits.py \
      2>&1 | tail -${TAIL:-25}
  echo "numba parity exit: $?"
  fi
  if has integrations; then stamp "integrations"
  DYADIC_CACHE_DIR=${DYADIC_CACHE_DIR:-/tmp/dyadic-model-cache} timeout ${INTEGRATIONS_T:-240} \
      python3 -m pytest -q -rs --maxfail=${MAXFAIL:-20} -p no:cacheprovider \
      tests/integrations 2>&1 | tail -${TAIL:-15}
  echo "integrations exit: $?"
  fi
  if has fuzz; then stamp "fuzz cpu,cuda,numba"
  timeout ${FUZZ_T:-150} python3 -m dyadic.fuzz --backends cpu,cuda,numba --cases ${FUZZ_CASES:-400} \
      --seed ${FUZZ_SEED:-7} --out "$OUT/fuzz" 2>&1 | tail -12
  echo "fuzz exit: $?"
  timeout ${FUZZ_T:-150} python3 -m dyadic.fuzz --primitives verify_logits --backends cpu,cuda \
      --cases ${FUZZ_CASES:-400} --seed ${FUZZ_SEED:-7} --out "$OUT/fuzz-logits" 2>&1 | tail -6
  echo "fuzz verify_logits exit: $?"
  timeout ${FUZZ_T:-150} python3 -m dyadic.fuzz --primitives propose_filtered --backends cpu,cuda \
      --cases ${FUZZ_CASES:-400} --seed ${FUZZ_SEED:-7} --out "$OUT/fuzz-filtered" 2>&1 | tail -6
  echo "fuzz propose_filtered exit: $?"
  fi
  if has trees; then stamp "trees: ${TREES:?TREES: source trees to test}"
  # each source tree (e.g. `git archive BRANCH` unpacked into a folder that travels with the
  # call) installed into its own folder, all side by side, then every tree at once
  # (test_install): pytest on $TREES_TESTS from a copy of the tree's tests, and its fuzz of
  # $TREES_FUZZ on cpu,cuda (correctness only: no stage times anything while they run)
  rm -rf /tmp/trees && mkdir -p /tmp/trees
  for t in $TREES; do
    n=$(basename "$t")
    ( install_into /tmp/trees/$n "$t" || echo "install failed" >> /tmp/trees/$n.install ) &
  done
  wait
  for t in $TREES; do
    n=$(basename "$t")
    test_install /tmp/trees/$n "$t" \
        "${TREES_TESTS-tests/gpu/test_gpu_verify_logits.py tests/gpu/test_gpu_filtered_alloc.py tests/gpu/test_cuda_routes.py}" \
        "${TREES_FUZZ-verify,verify_logits}" > /tmp/trees/$n.log 2>&1 &
  done
  wait
  for t in $TREES; do
    n=$(basename "$t"); echo "-- tree $n"; tail -2 /tmp/trees/$n.install; cat /tmp/trees/$n.log
  done
  fi
  if has shard; then stamp "shard kernels (cuda vs cpu)"
  timeout ${SHARD_T:-240} python3 -m pytest -q -rs -x -p no:cacheprovider \
      tests/gpu/test_gpu_shard_kernels.py tests/cpu/test_shard_kernels.py 2>&1 | tail -${TAIL:-25}
  echo "shard kernels exit: $?"
  stamp "sharded calls, gloo ranks with CUDA shards"
  timeout ${SHARD_T:-240} python3 -m pytest -q -rs -x -p no:cacheprovider \
      tests/distributed/test_distributed_cuda.py tests/distributed/test_dense_xp.py 2>&1 | tail -${TAIL:-25}
  echo "sharded cuda exit: $?"
  for hk in "" "--host-kernels"; do
    stamp "dyadic.distributed.bench gloo, CUDA shards $hk"
    timeout ${SHARD_T:-240} python3 -m dyadic.distributed.bench --dist gloo --shards cuda \
        --world 2 --vocab 129280 --batch 8 --reps ${SHARD_REPS:-10} $hk 2>&1 | tail -14
    echo "shard bench exit: $?"
  done
  fi
  if has bench; then stamp "dyadic.bench gpu"
  timeout ${BENCH_T:-180} python3 -m dyadic.bench gpu --batch ${BATCH:-1,4,16,64} \
      --reps ${REPS:-200} --out "$OUT" --label ${LABEL:-tree} --cases "${CASES:-}" \
      --kernels ${KERNELS:-0} 2>&1 | tail -${TAIL:-60}
  echo "bench exit: $?"
  fi
  if has ab; then stamp "A/B: ${AB_OLD:?AB_OLD: the old source tree} ${AB_MID:+$AB_MID }vs this tree"
  rm -rf /tmp/ab && mkdir -p /tmp/ab "$OUT/ab"
  # the sides: old ($AB_OLD), mida, midb, ... ($AB_MID), new (this tree)
  sides="old"; n=0
  install_into /tmp/ab/old "$AB_OLD" &  # the installs side by side
  for t in ${AB_MID:-}; do
    m=mid$(echo abcdefghij | cut -c$((n + 1))); n=$((n + 1)); sides="$sides $m"
    install_into /tmp/ab/$m "$t" &
  done
  sides="$sides new"
  install_into /tmp/ab/new . &
  wait
  for side in $sides; do tail -n 2 /tmp/ab/$side.install; done
  # each side's kernels compiled before the timed runs, side by side (CuPy's kernel cache
  # then serves every run)
  for side in $sides; do
    ( cd /tmp && PYTHONPATH=/tmp/ab/$side timeout ${AB_T:-150} python3 -c \
        "from dyadic.backends.cuda.cupy import runtime; runtime.module()" 2>&1 | tail -2 ) &
  done
  wait
  stamp "A/B: kernels compiled"
  for i in $(seq ${AB_RUNS:-2}); do
    for side in $sides; do
      stamp "A/B run $side$i"
      PYTHONPATH=/tmp/ab/$side timeout ${AB_T:-150} ${AB_CPU:+taskset -c $AB_CPU} python3 dyadic/bench/gpu.py \
          --label $side$i --out "$OUT/ab" --reps ${AB_REPS:-100} --batch ${BATCH:-1,4,16,64} \
          --cases "${CASES:-}" --kernels ${KERNELS:-0} \
          2>&1 | tail -3
      echo "A/B $side$i exit: $?"
    done
  done
  # the runs of sides $1 and $2, alternated
  ab_files() { for i in $(seq ${AB_RUNS:-2}); do echo "$OUT/ab/gpu-$1$i.json $OUT/ab/gpu-$2$i.json"; done; }
  python3 -m dyadic.bench compare $(ab_files old new) --tolerance ${AB_TOL:-0.05} 2>&1 \
      | tee "$OUT/ab-compare.md"
  prev=old
  for side in $sides; do  # with AB_MID: each step old -> mida -> ... -> new
    [ "$side" = old ] || [ -z "${AB_MID:-}" ] && continue
    echo "### A/B step: $prev -> $side"
    python3 -m dyadic.bench compare $(ab_files $prev $side) --tolerance ${AB_TOL:-0.05} 2>&1 \
        | tee "$OUT/ab-compare-$prev-$side.md"
    prev=$side
  done
  if [ -n "${AB_TESTS:-}${AB_FUZZ:-}" ]; then stamp "A/B: this tree's tests and fuzz"
  # after the timed runs, from the same install (its kernels already compiled)
  test_install /tmp/ab/new . "${AB_TESTS:-}" "${AB_FUZZ:-}"
  fi
  fi
  if has kab; then stamp "kernel A/B: ${KAB_OLD:?KAB_OLD: the old source tree} vs this tree"
  timeout ${KAB_T:-300} python3 -m dyadic.bench kernel-ab "$KAB_OLD" --batch ${BATCH:-1,4,16,64} \
      --cases "${CASES:-}" --rounds ${KAB_ROUNDS:-2} --reps ${KAB_REPS:-5} --out "$OUT/kab" \
      2>&1 | tee "$OUT/kab-compare.md" | tail -${TAIL:-60}
  echo "kernel A/B exit: $?"
  fi
  if has timeline; then stamp "timeline"
  timeout ${TL_T:-200} python3 -m dyadic.bench timeline --batch ${BATCH:-1,4,16,64} \
      --cases "${TL_CASES:-=verify_k5_logits_dense_lazy_close_cold}" --out "$OUT" \
      2>&1 | tee "$OUT/timeline.md" | tail -${TAIL:-60}
  echo "timeline exit: $?"
  fi
  if has ncu; then stamp "ncu"
  # Nsight Compute over the timed calls of tools/run_case.py (clocks left as they are);
  # NCU_SOURCE=1: also the source counters (kernels built with -lineinfo), summarised per
  # source line by tools/ncu_source.py into $OUT/ncu-source.md
  src=()
  [ -n "${NCU_SOURCE:-}" ] && src=(--section SourceCounters --import-source yes -o "$OUT/ncu")
  DYADIC_CUDA_PROF=${NCU_SOURCE:+1} timeout ${NCU_T:-300} ncu --clock-control none \
      --nvtx --nvtx-include "timed/" --kernel-name "regex:${NCU_KERNELS:-logits_}" \
      --section SpeedOfLight --section Occupancy --section LaunchStats \
      --section WarpStateStats --section MemoryWorkloadAnalysis "${src[@]}" \
      python3 tools/run_case.py --batch ${BATCH:-1,64} \
      --cases "${NCU_CASES:-=verify_k5_logits_dense_lazy_close_cold}" \
      > "$OUT/ncu.txt" 2>&1
  echo "ncu exit: $?"
  if [ -n "${NCU_SOURCE:-}" ]; then
    ncu -i "$OUT/ncu.ncu-rep" --page details >> "$OUT/ncu.txt" 2>&1
    ncu -i "$OUT/ncu.ncu-rep" --page source --print-source cuda,sass --csv > "$OUT/ncu-source.csv" 2>&1
    python3 tools/ncu_source.py "$OUT/ncu-source.csv" > "$OUT/ncu-source.md" 2>&1
    head -30 "$OUT/ncu-source.md"
    rm -f "$OUT/ncu.ncu-rep"
  fi
  grep -E "^  [a-z_]+|Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Compute \(SM\) Throughput|Warp Cycles Per Issued|Stall" "$OUT/ncu.txt" | tail -${TAIL:-200}
  fi
  stamp done
} 2>&1 | tee "$LOG"
