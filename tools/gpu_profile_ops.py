"""Eager calls of each backend="cuda" op, for ncu (tools/gpu_profile.sh).

python tools/gpu_profile_ops.py [ops...]   ops: propose1 propose4 propose64 verify1
verify64 verify64sp alloc64 floor (default: all).  Each op runs 3 times after a
warm-up call; `floor` times one trivial kernel in graph replay (the replay floor).
"""
import statistics
import sys

import torch

import dyadic
from dyadic.bench.timing import capture_graph

V = 129280
dev = "cuda"
g = torch.Generator(device=dev).manual_seed(0)


def keys(B):
    i32 = lambda: torch.zeros(B, dtype=torch.int32, device=dev)
    return dyadic.Keys(seed=torch.arange(B, dtype=torch.int64, device=dev), generation=i32(),
                       round=i32(), position=i32())


def propose(B):
    logits = (3 * torch.randn(B, V, device=dev, generator=g)).to(torch.bfloat16)
    out = {"tokens": torch.empty(B, dtype=torch.int32, device=dev),
           "counts": torch.empty(B, 32, dtype=torch.uint32, device=dev),
           "ids": torch.empty(B, 32, dtype=torch.int32, device=dev),
           "status": torch.empty(B, dtype=torch.int32, device=dev)}
    k = keys(B)
    return lambda: dyadic.propose(logits, k, top_k=32, temperature=0.7, backend="cuda",
                                  check=False, out=out)


def verify(B, sparse=False, lazy=False):
    k = 5
    z = torch.randn(B, V, device=dev, generator=g)
    p = torch.softmax(3 * torch.randn(B, k + 1, V, device=dev, generator=g), -1)
    qd = torch.softmax(3 * z[:, None, :].expand(B, k, V)
                       + 0.5 * torch.randn(B, k, V, device=dev, generator=g), -1)
    q = dyadic.allocate(qd, top_k=32 if sparse else None, backend="cuda")
    draft = torch.multinomial(qd.reshape(-1, V), 1).reshape(B, k).to(torch.int32)
    if sparse:
        draft = q.ids[..., 0].to(torch.int32).contiguous()
    vout = {"accepted": torch.empty(B, dtype=torch.int32, device=dev),
            "tokens": torch.empty(B, k + 1, dtype=torch.int32, device=dev),
            "status": torch.empty(B, dtype=torch.int32, device=dev)}
    kk = keys(B)
    return lambda: dyadic.verify(p, draft, q, kk, backend="cuda",
                                 check="lazy" if lazy else False, out=vout)


def alloc(B):
    pr = torch.softmax(3 * torch.randn(B, V, device=dev, generator=g), -1)
    cnt = torch.empty(B, V, dtype=torch.uint32, device=dev)
    st = torch.empty(B, dtype=torch.int32, device=dev)
    return lambda: dyadic.allocate(pr, backend="cuda", check=False,
                                   out={"counts": cnt, "status": st})


def replay_floor():
    x = torch.zeros(1, device=dev)
    replay = capture_graph(lambda: x.add_(1))
    ts = []
    for _ in range(300):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); replay(); b.record(); b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    print(f"graph replay floor (one trivial kernel): {statistics.median(ts):.1f} us", flush=True)


OPS = {"propose1": lambda: propose(1), "propose4": lambda: propose(4),
       "propose64": lambda: propose(64), "verify1": lambda: verify(1),
       "verify64": lambda: verify(64), "verify64sp": lambda: verify(64, True),
       "lazy1": lambda: verify(1, lazy=True), "lazy64": lambda: verify(64, lazy=True),
       "alloc64": lambda: alloc(64)}

if __name__ == "__main__":
    names = sys.argv[1:] or list(OPS) + ["floor"]
    for n in names:
        if n == "floor":
            replay_floor()
            continue
        try:
            fn = OPS[n]()
            fn()
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_push(n)
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_pop()
            print("ran", n, flush=True)
        except Exception as e:  # noqa: BLE001 - report and go on
            print("failed", n, type(e).__name__, str(e)[:200], flush=True)
