#!/usr/bin/env bash
# Sharded propose/verify with NCCL on >= 2 GPUs, in one command:
# build, the NCCL parity tests (tests/distributed/test_distributed.py::test_nccl_parity)
# and the sharded benchmark against the unsharded single-GPU call.
#   tools/nccl_suite.sh          logs to $OUT/nccl-log.txt (default OUT=./gpu-out)
# NVLink multicast stays off (it can take the host's shared GPUs down).
set -o pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
{
  echo "== probe $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=index,name,driver_version --format=csv 2>&1
  nvidia-smi topo -m 2>&1 | head -8
  python3 -c "import torch; print('torch', torch.__version__, 'gpus', torch.cuda.device_count(), 'nccl', torch.cuda.nccl.version())"
  echo "== build"
  python3 -m pip install -q -e . --no-build-isolation --no-deps 2>&1 | tail -3
  echo "== NCCL parity (one process per GPU)"
  timeout ${PARITY_TIMEOUT:-420} python3 -m pytest -q -rs -p no:cacheprovider \
      "tests/distributed/test_distributed.py::test_nccl_parity" 2>&1 | tail -30
  echo "nccl parity exit: $?"
  echo "== sharded benchmark (NCCL) vs unsharded"
  ngpu=$(python3 -c "import torch; print(torch.cuda.device_count())")
  worlds=2; [ "$ngpu" -ge 4 ] && worlds="2 4"
  timeout ${BENCH_TIMEOUT:-240} python3 -m dyadic.distributed.bench --dist nccl --world $worlds \
      --vocab 129280 --batch ${BATCH:-8} --reps ${REPS:-10} 2>&1 | tail -30
  echo "bench exit: $?"
} 2>&1 | tee "$OUT/nccl-log.txt"
