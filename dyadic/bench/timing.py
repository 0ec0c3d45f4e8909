"""Timers: wall clock on the CPU, CUDA events (eager and CUDA-graph replay) on the GPU."""

import time

import numpy as np


def cpu_times(fn, repeats, budget_s=3.0):
    """Per-call seconds (after one warm-up call); stops early past ``budget_s``."""
    fn()
    out = []
    t_end = time.perf_counter() + budget_s
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
        if time.perf_counter() > t_end and len(out) >= 3:
            break
    return out


def cuda_event_times(fn, repeats):
    """Per-call device seconds of ``fn`` on the current stream (CUDA events)."""
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e-3)
    return out


def capture_graph(fn):
    """A replay function for ``fn`` captured in a torch.cuda.CUDAGraph (raises if it cannot)."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize()
    return g.replay


def copy_bandwidth(nbytes=1 << 30):
    """Device-to-device copy bandwidth in bytes/s (read + written), median of 20."""
    import torch

    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    times = cuda_event_times(lambda: dst.copy_(src), 20)
    del src, dst
    return 2 * nbytes / float(np.median(times))


def summarise(times):
    t = np.asarray(times)
    return {"median_s": float(np.median(t)), "min_s": float(t.min()), "max_s": float(t.max()),
            "n": int(t.size)}
