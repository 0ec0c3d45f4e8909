"""CUDA-graph replay timings of backend="cuda" vs plain PyTorch (H200 targets: docs/performance.md).

python tools/gpu_bench.py [--out DIR] [--batch 1,4,16,64]
    -> prints a Markdown table, writes gpu_bench.json
Inputs p = softmax(3z), V = 129280.  Two medians per graph (200 replays each):
- ``name``: per-replay CUDA-event time, the start event recorded on an idle queue, so the
  interval includes the host's submission of the replay (a one-kernel graph measures
  several microseconds this way: see the ``trivial_kernel`` column);
- ``name@dev``: device time, the queue held by a sleep kernel while the host enqueues
  the start event and the replay (``dyadic.bench.timing.held_event_times``).
The plain-PyTorch pipelines are timed the same two ways in the same run.
"""
import argparse
import contextlib
import json
import os
import statistics
import time

import numpy as np
import torch

import dyadic
from dyadic.bench.timing import capture_graph, held_event_times

V = 129280
K = 5  # draft tokens per request in the verify cases


def graph_time(fn, reps=200):
    """(per-replay median, device median, held) in us of fn captured in a CUDA graph."""
    replay = capture_graph(fn)
    for _ in range(10):
        replay()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for a, b in ev:
        a.record(); replay(); b.record()
    torch.cuda.synchronize()
    per_replay = statistics.median(a.elapsed_time(b) * 1e3 for a, b in ev)
    h = held_event_times(replay, reps)
    return per_replay, statistics.median(h["times"]) * 1e6, h["held"]


def put_host(r, name, fn):
    """r["eager_host_" + name + "_us"] = eager_host(fn); errors as text."""
    try:
        r["eager_host_" + name + "_us"] = round(eager_host(fn), 1)
    except Exception as e:  # noqa: BLE001
        r["eager_host_" + name + "_us"] = f"error: {type(e).__name__}: {e}"[:120]


def put(r, name, fn):
    """r[name] = per-replay median, r[name@dev] = device median (us); errors as text."""
    try:
        rep, dev, held = graph_time(fn)
        r[name] = round(rep, 1)
        r[name + "@dev"] = round(dev, 1) if held else f"{dev:.1f} (not held)"
    except Exception as e:  # noqa: BLE001
        r[name] = f"error: {type(e).__name__}: {e}"[:120]


@contextlib.contextmanager
def switched(module, sets):
    """The module's attributes set to ``sets`` (the backend's A/B switches) and its launch
    plans cleared, for the block; restored (plans cleared again) after it."""
    prev = {attr: getattr(module, attr) for attr in sets}
    for attr, val in sets.items():
        setattr(module, attr, val)
    module._PLANS.clear()
    try:
        yield
    finally:
        for attr, val in prev.items():
            setattr(module, attr, val)
        module._PLANS.clear()


def eager_host(fn, reps=300):
    """Host time of one eager call, launch queue idle (synchronised before, untimed)."""
    for _ in range(20):
        fn()
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter(); fn(); ts.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(ts)


def cases(B, g, dev="cuda"):
    """The benchmark's inputs at batch B (generator g) as zero-argument calls, in table order:
    propose top-32 bf16 (T = 0.7), verify k=5 with dense / top-32 q (check=False and
    "lazy"), dense allocate fp32, and the plain-PyTorch pipelines (``torch_*``).  Outputs
    are preallocated (``out=``), so each call can be captured in a CUDA graph."""
    z = torch.randn(B, V, device=dev, generator=g)
    logits = (3 * z).to(torch.bfloat16)
    seed = torch.arange(B, dtype=torch.int64, device=dev)
    i32 = lambda: torch.zeros(B, dtype=torch.int32, device=dev)
    keys = dyadic.Keys(seed=seed, generation=i32(), round=i32(), position=i32())
    out = {"tokens": torch.empty(B, dtype=torch.int32, device=dev),
           "counts": torch.empty(B, 32, dtype=torch.uint32, device=dev),
           "ids": torch.empty(B, 32, dtype=torch.int32, device=dev),
           "status": torch.empty(B, dtype=torch.int32, device=dev)}
    prop = lambda: dyadic.propose(logits, keys, top_k=32, temperature=0.7, backend="cuda",
                                  check=False, out=out)

    def torch_prop():
        v, i = torch.topk(logits, 32, dim=-1)
        pr = torch.softmax(v.float() / 0.7, -1)
        j = torch.multinomial(pr, 1)
        return i.gather(-1, j)
    k = K
    p = torch.softmax(3 * torch.randn(B, k + 1, V, device=dev, generator=g), -1)
    qd = torch.softmax(3 * z[:, None, :].expand(B, k, V) + 0.5 * torch.randn(B, k, V, device=dev, generator=g), -1)
    qdy = dyadic.allocate(qd, backend="cuda")
    qsp = dyadic.allocate(qd, top_k=32, backend="cuda")
    draft = torch.multinomial(qd.reshape(-1, V), 1, generator=g).reshape(B, k).to(torch.int32)
    dsp = torch.gather(qsp.ids, -1, torch.zeros(B, k, 1, dtype=torch.int64, device=dev)).reshape(B, k)
    vout = {"accepted": torch.empty(B, dtype=torch.int32, device=dev),
            "tokens": torch.empty(B, k + 1, dtype=torch.int32, device=dev),
            "status": torch.empty(B, dtype=torch.int32, device=dev)}
    ver = lambda: dyadic.verify(p, draft, qdy, keys, backend="cuda", check=False, out=vout)
    ver_sp = lambda: dyadic.verify(p, dsp, qsp, keys, backend="cuda", check=False, out=vout)

    def torch_ver():
        pd = p[:, :k].gather(-1, draft[..., None].long())[..., 0]
        qq = qd.gather(-1, draft[..., None].long())[..., 0]
        u = torch.rand(B, k, device=dev)
        acc = (u * qq < pd).int().cumprod(-1).sum(-1)
        res = torch.clamp(p[:, :k] - qd, min=0)
        e = torch.empty_like(res).exponential_()
        return acc, (res / e).argmax(-1)
    cnt = torch.empty(B, V, dtype=torch.uint32, device=dev)
    st = torch.empty(B, dtype=torch.int32, device=dev)
    pr32 = torch.softmax(3 * z, -1)
    alloc = lambda: dyadic.allocate(pr32, backend="cuda", check=False,
                                    out={"counts": cnt, "status": st})
    ver_lazy = lambda: dyadic.verify(p, draft, qdy, keys, backend="cuda", check="lazy", out=vout)
    ver_sp_lazy = lambda: dyadic.verify(p, dsp, qsp, keys, backend="cuda", check="lazy",
                                        out=vout)
    aout = {"counts": torch.empty(B, 32, dtype=torch.uint32, device=dev),
            "ids": torch.empty(B, 32, dtype=torch.int32, device=dev),
            "status": torch.empty(B, dtype=torch.int32, device=dev)}
    alloc_top = lambda: dyadic.allocate(pr32, top_k=32, backend="cuda", check=False, out=aout)
    q32 = dyadic.allocate(pr32, top_k=32, backend="cuda")
    dout = {"tokens": torch.empty(B, dtype=torch.int32, device=dev)}
    draw = lambda: dyadic.draw(q32, keys, backend="cuda", check=False, out=dout)
    return {"propose_top32_bf16": prop, "torch_top32_proposal": torch_prop,
            "verify_k5_dense": ver, "verify_k5_top32": ver_sp,
            "verify_k5_dense_lazy": ver_lazy, "verify_k5_top32_lazy": ver_sp_lazy,
            "torch_verify_k5_dense": torch_ver, "allocate_dense_f32": alloc,
            "allocate_top32_f32": alloc_top, "draw_top32": draw}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--batch", default="1,4,16,64")
    a = ap.parse_args()
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    rows = []
    for B in (int(b) for b in a.batch.split(",")):
        cs = cases(B, g, dev)
        prop, ver, ver_lazy = cs["propose_top32_bf16"], cs["verify_k5_dense"], cs["verify_k5_dense_lazy"]
        ver_sp_lazy, alloc = cs["verify_k5_top32_lazy"], cs["allocate_dense_f32"]
        k = K
        r = {"B": B}
        x1 = torch.zeros(1, device=dev)
        put(r, "trivial_kernel", lambda: x1.add_(1))
        for name, fn in cs.items():
            put(r, name, fn)
        # A/B in the same run: the alternative paths of each primitive (module switches)
        from dyadic.backends.cuda import cupy_backend as _cb
        for name, sets, fn in (("allocate_dense_f32_MB", {"_DENSE_MODE": "mb"}, alloc),
                               ("propose_top32_bf16_PK2", {"_PK_MODE": "2"}, prop),
                               ("propose_top32_bf16_PK3", {"_PK_MODE": "3"}, prop),
                               ("verify_k5_dense_lazy_V2", {"_LAZY_MODE": "2"}, ver_lazy),
                               ("verify_k5_top32_lazy_V2", {"_LAZY_MODE": "2"}, ver_sp_lazy),
                               ("verify_k5_dense_V12", {"_VONE_MODE": "0"}, ver),
                               ("verify_k5_top32_V12", {"_VONE_MODE": "0"}, cs["verify_k5_top32"])):
            if all(hasattr(_cb, attr) for attr in sets):
                with switched(_cb, sets):
                    put(r, name, fn)
        r["verify_floor_us"] = round(B * (k + 1) * V * 4 / 4.2e12 * 1e6, 1)
        r["alloc_floor_us"] = round(B * V * 8 / 4.2e12 * 1e6, 1)
        put_host(r, "propose", prop)
        put_host(r, "verify", ver)
        if hasattr(_cb, "_VONE_MODE"):  # the same call on the two launches (dc_v1 + dc_v2)
            with switched(_cb, {"_VONE_MODE": "0"}):
                put_host(r, "verify_V12", ver)
        put_host(r, "verify_lazy", ver_lazy)
        put_host(r, "allocate_dense", alloc)
        put_host(r, "allocate_top32", cs["allocate_top32_f32"])
        put_host(r, "draw", cs["draw_top32"])
        if B == 1:  # where the host time of an eager propose goes
            import cProfile
            import io
            import pstats
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(200):
                prop()
            pr.disable()
            torch.cuda.synchronize()
            buf = io.StringIO()
            pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(18)
            os.makedirs(a.out, exist_ok=True)
            with open(os.path.join(a.out, "profile_propose.txt"), "w") as f:
                f.write(buf.getvalue())
        rows.append(r)
        print(json.dumps(r), flush=True)
    from dyadic.backends.cuda import cupy_backend
    print("launch mode:", cupy_backend.launch_mode(), "| DYADIC_CUDA_TOPK =",
          os.environ.get("DYADIC_CUDA_TOPK", "(default)"), "| dense:", cupy_backend._DENSE_MODE,
          "| pk mode:", getattr(cupy_backend, "_PK_MODE", None), flush=True)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "gpu_bench.json"), "w") as f:
        json.dump(rows, f, indent=1)
    cols = list(rows[0])
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r[c]) for c in cols) + " |")


if __name__ == "__main__":
    main()
