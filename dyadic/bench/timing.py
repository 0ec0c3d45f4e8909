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


def held_event_times(fn, repeats, hold_us=None):
    """Per-call device seconds of ``fn`` with the launch queue held (CUDA events).

    ``cuda_event_times`` records the start event on an idle queue, so its interval also
    holds the host's time to submit ``fn`` (several microseconds for a one-kernel graph
    replay: more than some kernels take).  Here a sleep kernel
    (``torch.cuda._sleep``) runs first, longer than the host takes to enqueue the start
    event and ``fn``; the interval then measures the device alone: from the end of the
    sleep to the end of ``fn``'s last kernel, the device-side launch latency of ``fn``
    included.  ``hold_us``: the sleep (default: 100 us or 5x the host time of ``fn``,
    whichever is longer).  Returns the per-call seconds and the hold used, in a dict
    ``{"times": [...], "hold_us": float, "held": bool}``; ``held`` is False where the
    sleep may have been shorter than the host's enqueue time of a call (the interval then
    may include host time: report it as such)."""
    import torch

    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is None:
        return {"times": cuda_event_times(fn, repeats), "hold_us": 0.0, "held": False}
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    cycles_per_us = _sleep_rate(torch, sleep)
    host = []
    for _ in range(10):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        host.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    host_us = float(np.median(host)) * 1e6
    if hold_us is None:
        hold_us = max(100.0, 5.0 * host_us)
    cycles = int(hold_us * cycles_per_us)
    out = []
    late = 0
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        sleep(cycles)
        a.record()
        fn()
        b.record()
        if (time.perf_counter() - t0) * 1e6 > hold_us:
            late += 1  # the host enqueued fn after the sleep may have ended
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e-3)
    return {"times": out, "hold_us": hold_us, "held": late <= repeats // 10}


_SLEEP_RATE = []


def _sleep_rate(torch, sleep):
    """Cycles of ``torch.cuda._sleep`` per microsecond on this device (measured once)."""
    if not _SLEEP_RATE:
        n = 200_000
        ts = []
        for _ in range(5):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            sleep(n)
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b) * 1e3)
        _SLEEP_RATE.append(n / float(np.median(ts)))
    return _SLEEP_RATE[0]


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
