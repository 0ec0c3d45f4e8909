"""In-kernel %globaltimer stamps of pk_topk2 / pk_topk3 (run with DYADIC_CUDA_PROF=1 on the GPU).

Prints, for propose top-32 bf16 at B = 1, 4, 64, the stamps of row 0 in ns
relative to the start of its block 0: tile phase (1 maxima, 2 K-th largest,
3 survivors compacted, 4 candidates written) and last block (16 start, 17-19
the same steps over the candidates, 21 merge done, 22 tail done).
"""
import os

import numpy as np
import torch

import dyadic
from dyadic.backends.cuda import cupy_backend as cb

assert os.environ.get("DYADIC_CUDA_PROF") == "1", "set DYADIC_CUDA_PROF=1"
V = 129280
for B in (1, 4, 64):
    x = (3 * torch.randn(B, V, device="cuda")).to(torch.bfloat16)
    keys = dyadic.Keys(seed=torch.arange(B, dtype=torch.int64, device="cuda"),
                       generation=torch.zeros(B, dtype=torch.int32, device="cuda"),
                       round=torch.zeros(B, dtype=torch.int32, device="cuda"),
                       position=torch.zeros(B, dtype=torch.int32, device="cuda"))
    rows = []
    for rep in range(6):
        dyadic.propose(x, keys, top_k=32, temperature=0.7, backend="cuda", check=False)
        torch.cuda.synchronize()
        ptr = cb.module().get_global("dc_prof")
        import cupy
        a = cupy.ndarray((32,), dtype=cupy.uint64, memptr=ptr).get().astype(np.int64)
        rows.append(a - a[0])
    r = np.median(np.array(rows[1:]), axis=0)
    print(f"B={B}: tile " + " ".join(f"{i}:{r[i]:.0f}" for i in (1, 2, 3, 4))
          + " | last " + " ".join(f"{i}:{r[i]:.0f}" for i in (16, 17, 18, 19, 21, 22)), flush=True)
