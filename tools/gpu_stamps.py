"""In-kernel %globaltimer stamps of the fused propose and lazy verify kernels.

Run on the GPU with DYADIC_CUDA_PROF=1 (the module is then built with -DDC_PROF):

    DYADIC_CUDA_PROF=1 python tools/gpu_stamps.py [propose] [verify]

propose (pk_topk2 / pk_topk3, top-32 bf16): row 0's stamps in ns from the start of its
block 0: tile phase (1 maxima, 2 K-th largest, 3 survivors compacted, 4 candidates
written), last block (16 start, 17-19 the same steps over the candidates, 21 merge
done, 22 tail done; pk_topk4*'s last block, pp_last: 17 the tiles' runs and bad
elements loaded (issued), 21 the runs merged) and the one-warp tail's clock64 cycles from its start (1 positions in
id order, 2 weights and their sum, 3 floors, 4 remainders ranked, 5 counts written, 6
drawn).

verify (dc_vfused / dc_vfused_r64, k = 5, dense q, check="lazy"): request 0's stamps in
ns from the earliest block start: tile 0 (0 start, 1 tests done, 2 tiles done, 3 counter
taken), the latest arrival at the counter (arr), the last block (its start, 8 counter
taken, 16 end) and its steps in clock64 cycles from the counter (1 row totals, 2 walk,
3 setup, 4 list, 5 dirty chunks, 6 tile found, 7 chunk found, 8 id picked, 9 end).
Medians over 5 calls after a warm-up, B = 1, 4, 64.
"""
import os
import sys

import numpy as np
import torch

import dyadic
from dyadic.backends.cuda import cupy_backend as cb

assert os.environ.get("DYADIC_CUDA_PROF") == "1", "set DYADIC_CUDA_PROF=1"
V, K = 129280, 5
WHAT = sys.argv[1:] or ["propose", "verify"]


def prof():
    import cupy
    return cupy.ndarray((96,), dtype=cupy.uint64, memptr=cb.module().get_global("dc_prof"))


def keys(B):
    z = lambda: torch.zeros(B, dtype=torch.int32, device="cuda")  # noqa: E731
    return dyadic.Keys(seed=torch.arange(B, dtype=torch.int64, device="cuda"),
                       generation=z(), round=z(), position=z())


def stamps(call, reps=6):
    rows = []
    for _ in range(reps):
        p = prof()
        p.fill(0)
        p[62] = np.uint64(2**64 - 1)
        call()
        torch.cuda.synchronize()
        rows.append(p.get().astype(np.int64))
    return np.median(np.array(rows[1:]), axis=0)


def propose(B):
    x = (3 * torch.randn(B, V, device="cuda")).to(torch.bfloat16)
    kb = keys(B)
    a = stamps(lambda: dyadic.propose(x, kb, top_k=32, temperature=0.7, backend="cuda",
                                      check=False))
    r = a[:32] - a[0]
    print(f"propose B={B}: tile " + " ".join(f"{i}:{r[i]:.0f}" for i in (1, 2, 3, 4))
          + " | last " + " ".join(f"{i}:{r[i]:.0f}" for i in (16, 17, 18, 19, 21))
          + f" 22:{r[22]:.0f} | tail cycles " + " ".join(f"{i}:{a[64 + i]:.0f}" for i in range(1, 7)),
          flush=True)


def verify(B):
    g = torch.Generator(device="cuda").manual_seed(B)
    z = torch.randn(B, V, device="cuda", generator=g)
    p = torch.softmax(3 * torch.randn(B, K + 1, V, device="cuda", generator=g), -1)
    qd = torch.softmax(3 * z[:, None, :].expand(B, K, V)
                       + 0.5 * torch.randn(B, K, V, device="cuda", generator=g), -1)
    q = dyadic.allocate(qd, backend="cuda")
    draft = torch.multinomial(qd.reshape(-1, V), 1, generator=g).reshape(B, K).int()
    kb = keys(B)
    res = {}

    def call():
        res["v"] = dyadic.verify(p, draft, q, kb, backend="cuda", check="lazy")
    a = stamps(call)
    r = a[32:64] - a[62]
    acc = res["v"].accepted[0].item()
    print(f"verify B={B} (request 0 accepted {acc}): tile0 "
          + " ".join(f"{i}:{r[i]:.0f}" for i in (0, 1, 2, 3)) + f" arr:{a[63] - a[62]:.0f}"
          + f" | last start:{r[17]:.0f} 8:{r[8]:.0f} 16:{r[16]:.0f} | last cycles "
          + " ".join(f"{i}:{a[80 + i]:.0f}" for i in range(1, 10)), flush=True)


for B in (1, 4, 64):
    for w in WHAT:
        {"propose": propose, "verify": verify}[w](B)
