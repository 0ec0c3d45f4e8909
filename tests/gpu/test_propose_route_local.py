"""Which top-k kernel an eager backend="cuda" propose launches, without a GPU.

Runs in a subprocess under tools/host_overhead_local.py's fakes (a fake CuPy with
132 SMs and a fake driver that records launches; CPU torch tensors pass as CUDA
tensors).  The GPU tests (tests/gpu/test_gpu_topk_16bit_logits.py) check the kernels' results;
this checks the host's choice where CI can run it:

- bfloat16 / float16 logits without bias on 16-byte loads take pk_topk4 / 4w / 4x at
  every batch: the smallest tile (8192 / 16384 / 32768 ids) whose grid fits one wave
  of two blocks per SM, else the largest; DYADIC_CUDA_PK4 forces one or turns them off;
- float32 logits keep pk_topk2 at B = 1 and pk_topk3 above; bias keeps pk_topk2;
  unaligned 16-bit rows keep pk_topk3;
- a repeated call (the fast path) launches the same kernel with the same grid.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytest.importorskip("torch")

_SCRIPT = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, "tools")
    import host_overhead_local as h
    trace = []
    import os
    dyadic, torch = h.install(os.getcwd(), trace)
    from dyadic.backends.cuda import cupy_backend as cb
    V = 129280
    out = {}

    def launch(name, x, pk4=-1, bias=None):
        cb._PK4 = pk4
        cb._PLANS.clear()
        B = x.shape[0]
        keys = dyadic.Keys(seed=torch.arange(B), position=0)
        got = []
        for _ in range(2):  # the second call takes the fast path (where it applies)
            n = len(trace)
            dyadic.propose(x, keys, top_k=32, temperature=0.7, bias=bias, backend="cuda",
                           check=False)
            got.append([(t["kernel"], t["grid"][:2]) for t in trace[n:]])
        out[name] = got

    for B in (1, 4, 16, 32, 64):
        launch(f"bf16 {B}", torch.zeros(B, V, dtype=torch.bfloat16))
    launch("f16 64", torch.zeros(64, V, dtype=torch.float16))
    for pk4 in (0, 1, 2, 3):
        launch(f"bf16 64 pk4={pk4}", torch.zeros(64, V, dtype=torch.bfloat16), pk4)
    launch("bf16 1 pk4=0", torch.zeros(1, V, dtype=torch.bfloat16), 0)
    launch("f32 1", torch.zeros(1, V))
    launch("f32 64", torch.zeros(64, V))
    launch("bf16 4 bias", torch.zeros(4, V, dtype=torch.bfloat16), bias=torch.zeros(V))
    flat = torch.zeros(4 * V + 1, dtype=torch.bfloat16)
    launch("bf16 4 unaligned", flat[1:].view(4, V))
    print(json.dumps(out))
""")

EXPECT = {
    "bf16 1": ("pk_topk4", [16, 1]),
    "bf16 4": ("pk_topk4", [16, 4]),
    "bf16 16": ("pk_topk4", [16, 16]),  # 256 blocks <= 2 x 132
    "bf16 32": ("pk_topk4w", [8, 32]),
    "bf16 64": ("pk_topk4x", [4, 64]),
    "f16 64": ("pk_topk4x", [4, 64]),
    "bf16 64 pk4=0": ("pk_topk3", [16, 64]),
    "bf16 64 pk4=1": ("pk_topk4", [16, 64]),
    "bf16 64 pk4=2": ("pk_topk4w", [8, 64]),
    "bf16 64 pk4=3": ("pk_topk4x", [4, 64]),
    "bf16 1 pk4=0": ("pk_topk2", [32, 1]),
    "f32 1": ("pk_topk2", [32, 1]),
    "f32 64": ("pk_topk3", [16, 64]),
    "bf16 4 bias": ("pk_topk2", [32, 4]),
    "bf16 4 unaligned": ("pk_topk3", [16, 4]),
}


def test_propose_kernel_route():
    r = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(got) == set(EXPECT)
    for name, (kernel, grid) in EXPECT.items():
        first, second = got[name]
        assert first == [[kernel, grid]], (name, first)
        assert second == first, (name, second)
