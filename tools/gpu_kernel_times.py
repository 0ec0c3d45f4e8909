"""Device time per kernel of each backend="cuda" call in gpu_bench.py (torch.profiler).

python tools/gpu_kernel_times.py [--out DIR] [--batch 1,64] [--calls 30]
    -> prints one JSON line per batch and a Markdown table, writes gpu_kernel_times.json

For each dyadic case of ``gpu_bench.cases`` (the same inputs, the same seeded generator),
``--calls`` eager calls run under ``torch.profiler`` (CUDA activity: CUPTI sees the
kernels CuPy / the driver launch), each behind a ``torch.cuda._sleep`` so the host's
launches are queued before the kernels run.  Reported per kernel: the median device
duration (us) and the launches per call.  The graph-replay total of the call comes from
gpu_bench.py; the sum of the medians here leaves out the gaps between kernels.  Use it
to see which launch of a multi-launch call (dense allocate: da2_max, da2_sum, da2_floor,
da2_mark) takes the time before changing one.
"""
import argparse
import json
import os
import statistics

import torch
from torch.profiler import ProfilerActivity, profile

from gpu_bench import cases


def kernel_times(fn, calls=30, sleep_cycles=200_000):
    """{kernel name: (median device us, launches per call)} over ``calls`` eager calls."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            torch.cuda._sleep(sleep_cycles)
            fn()
        torch.cuda.synchronize()
    per = {}
    for e in prof.events():
        if e.device_type.name == "CUDA" and "spin_kernel" not in e.name:  # not _sleep's
            per.setdefault(e.name, []).append(e.device_time_total)
    return {n: (round(statistics.median(v), 1), round(len(v) / calls, 2))
            for n, v in sorted(per.items())}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--batch", default="1,64")
    ap.add_argument("--calls", type=int, default=30)
    a = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for B in (int(b) for b in a.batch.split(",")):
        r = {"B": B}
        for name, fn in cases(B, g).items():
            if not name.startswith("torch_"):
                r[name] = kernel_times(fn, a.calls)
        rows.append(r)
        print(json.dumps(r), flush=True)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "gpu_kernel_times.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print("| B | call | kernel | device us (median) | launches per call |")
    print("|---|---|---|---:|---:|")
    for r in rows:
        for name, ks in r.items():
            if name == "B":
                continue
            for kn, (us, per_call) in ks.items():
                print(f"| {r['B']} | {name} | {kn} | {us} | {per_call} |")


if __name__ == "__main__":
    main()
