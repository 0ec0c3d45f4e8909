"""Run the side-by-side benchmark: every implementation on the same inputs, one process."""

import datetime
import os
import platform
import sys
import time

import numpy as np

import dyadic

from . import report, timing
from .impls import GPU_BACKENDS, alternatives_for, dyadic_call
from .inputs import Inputs

PRIMITIVES = ("propose", "verify", "allocate", "draw")


def _gpu_available():
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _machine():
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    desc = f"{cpu}, {os.cpu_count()} CPUs"
    if _gpu_available():
        import torch

        desc += f", GPU {torch.cuda.get_device_name()}"
    return desc


def _versions():
    parts = [f"python {platform.python_version()}", f"numpy {np.__version__}"]
    try:
        import torch

        parts.append(f"torch {torch.__version__} ({torch.get_num_threads()} threads)")
    except ImportError:
        parts.append("torch not installed")
    return ", ".join(parts)


def _progress(msg, quiet):
    if not quiet:
        print(msg, file=sys.stderr, flush=True)


def measure(cfg, backends, quiet=False):
    """A list of result dicts and a list of notes."""
    results, notes = [], []
    gpu = _gpu_available()
    bandwidth = timing.copy_bandwidth() if gpu else None
    if bandwidth:
        notes.append(f"device copy bandwidth measured in this run: {bandwidth / 1e12:.2f} TB/s "
                     "(read + written)")
    cpu_backends = [b for b in backends if b not in GPU_BACKENDS]
    gpu_backends = [b for b in backends if b in GPU_BACKENDS] if gpu else []
    sizes = [(p, v, b) for p in cfg.primitives for v in cfg.vocab for b in cfg.batch]
    t_start = time.perf_counter()
    for n, (prim, v, b) in enumerate(sizes, 1):
        inp = Inputs(prim, b, v, cfg.k, cfg.top_k)
        group = []

        def add(impl, device, times, note=""):
            s = timing.summarise(times)
            r = dict(primitive=prim, device=device, vocab=v, batch=b, impl=impl, note=note, **s)
            group.append(r)
            _progress(f"[{n}/{len(sizes)} {time.perf_counter() - t_start:6.1f}s] {prim:8s} "
                      f"V={v:<6d} B={b:<3d} {impl:22s} {report.fmt_time(s['median_s'])}", quiet)

        if cfg.cpu:
            for be in cpu_backends:
                add(f"dyadic-{be}", "cpu", timing.cpu_times(dyadic_call(inp, be), cfg.repeats))
            for name, make in alternatives_for(prim, "cpu"):
                add(name, "cpu", timing.cpu_times(make(inp), cfg.repeats))
        if gpu:
            # plain pipelines first: a failed dyadic capture cannot disturb torch's generator
            for name, make in alternatives_for(prim, "cuda"):
                fn = make(inp)
                add(name, "cuda", timing.cuda_event_times(fn, cfg.repeats))
                try:
                    replay = timing.capture_graph(fn)
                except Exception as exc:  # noqa: BLE001
                    notes.append(f"{prim} {name}: graph capture failed ({exc})")
                else:
                    add("torch-graph", "cuda", timing.cuda_event_times(replay, cfg.repeats))
                    _add_held(add, "torch-graph-device", replay, cfg.repeats)
            for be in gpu_backends:
                call = dyadic_call(inp, be)
                add(f"dyadic-{be}-eager", "cuda", timing.cuda_event_times(call, cfg.repeats))
                if not getattr(dyadic._backend.get(be), "graph_capturable", False):
                    # a failed capture can leave torch's CUDA generator mid-capture
                    notes.append(f"{prim} dyadic-{be}: the backend does not support CUDA-graph "
                                 "capture; eager timing only")
                    continue
                try:
                    replay = timing.capture_graph(dyadic_call(inp, be, {"check": False}))
                except Exception as exc:  # noqa: BLE001 - reported, eager timing stands
                    notes.append(f"{prim} dyadic-{be}: CUDA-graph capture unavailable "
                                 f"({type(exc).__name__}: {str(exc)[:80]}); eager timing only")
                else:
                    add(f"dyadic-{be}-graph", "cuda",
                        timing.cuda_event_times(replay, cfg.repeats))
                    _add_held(add, f"dyadic-{be}-graph-device", replay, cfg.repeats)
        _ratios(group, inp, bandwidth)
        results += group
    return results, sorted(set(notes))


def _add_held(add, name, replay, repeats):
    """A graph's device time (the queue held while the host enqueues it; see
    ``timing.held_event_times``); skipped, not misreported, when the hold failed."""
    h = timing.held_event_times(replay, repeats)
    if h["held"]:
        add(name, "cuda", h["times"])


def _ratios(group, inp, bandwidth):
    for device in ("cpu", "cuda"):
        rows = [r for r in group if r["device"] == device]
        names = {r["impl"]: r for r in rows}
        base = next((names[n] for n in ("torch-graph", "torch", "torch-eager", "numpy")
                     if n in names), None)
        for r in rows:
            if base is not None and r is not base:
                r["ratio_to_baseline"] = r["median_s"] / base["median_s"]
                r["baseline"] = base["impl"]
            if device == "cuda" and bandwidth:
                floor = inp.bytes_read() / bandwidth
                r["floor_s"] = floor
                r["ratio_to_floor"] = r["median_s"] / floor


def main_run(cfg):
    if getattr(cfg, "torch_threads", 0):
        try:
            import torch

            torch.set_num_threads(cfg.torch_threads)
        except ImportError:
            pass
    backends = cfg.backends
    avail = dyadic.available_backends()
    if backends is None:
        backends = [b for b in avail if b != "reference"]
    missing = [b for b in backends if b not in avail]
    if missing:
        print(f"note: backends not available here, skipped: {missing}", file=sys.stderr)
        backends = [b for b in backends if b in avail]
    meta = {"date": datetime.date.today().isoformat(), "machine": _machine(),
            "versions": _versions(), "backends": backends,
            "config": {k: getattr(cfg, k) for k in ("primitives", "vocab", "batch", "k",
                                                     "top_k", "repeats")}}
    results, notes = measure(cfg, backends, cfg.quiet)
    meta["notes"] = notes
    print(f"\ndyadic side-by-side: {meta['date']}, {meta['machine']}\n{meta['versions']}")
    print(report.text_table(results))
    for n in notes:
        print(f"note: {n}")
    paths = report.write(results, meta, cfg.out, plot=not cfg.no_plot)
    print("wrote " + ", ".join(paths.values()))
    return 0
