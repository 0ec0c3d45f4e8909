"""Run cases of ``python -m dyadic.bench gpu`` a few times, nothing else: the program a
profiler (gpu_suite.sh's ``ncu`` stage) wraps.

    python tools/run_case.py --batch 1,64 --cases =verify_k5_logits_dense_lazy_close_cold \
                             [--warm 2] [--calls 1]

Per batch size and case: ``--warm`` calls (a cold case's one-call steps in turn,
timeline.calls_of), then a CUDA sync and an NVTX range "timed" around ``--calls`` calls
(profile with ``--nvtx --nvtx-include timed/``), then a sync."""

import argparse
import sys

import torch

from dyadic.bench import gpu, timeline


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--batch", default="64")
    p.add_argument("--cases", default="=verify_k5_logits_dense_lazy_close_cold")
    p.add_argument("--warm", type=int, default=2)
    p.add_argument("--calls", type=int, default=1)
    a = p.parse_args(argv)
    why = gpu.cannot_run("run_case")
    if why:
        print(why, file=sys.stderr)
        return 2
    ran = 0
    for B in (int(b) for b in a.batch.split(",")):
        inp = gpu.Inputs(B)
        for case in gpu.cases(inp):
            if not any(gpu.selects(c, case.name) for c in a.cases.split(",")):
                continue
            fn = case.make()
            steps = timeline.calls_of(fn) or [fn]  # [fn]: several calls, no steps
            for j in range(a.warm):
                steps[j % len(steps)]()
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_push("timed")
            for j in range(a.calls):
                steps[(a.warm + j) % len(steps)]()
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_pop()
            print(f"B={B} {case.name}: {a.calls} calls", flush=True)
            ran += 1
        del inp
    return 0 if ran else 1


if __name__ == "__main__":
    sys.exit(main())
