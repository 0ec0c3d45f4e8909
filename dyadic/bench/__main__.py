"""Side-by-side benchmark: ``python -m dyadic.bench``.

Runs dyadic's backends and the pipelines users would write instead (plain
NumPy, plain PyTorch on the CPU; plain PyTorch eager and CUDA-graph replayed
on the GPU) on the same inputs in one process, and prints one table: median
time, min-max spread, the ratio to the plain-PyTorch pipeline and, on the
GPU, the ratio to the memory floor (bytes read once / copy bandwidth measured
in the same run).  Writes JSON, a Markdown table and a PNG plot.

    python -m dyadic.bench [--primitives propose,verify] [--vocab 32000,129280] [--batch 1,4,64]

Subcommands (each has its own --help):

    python -m dyadic.bench gpu [--batch 1,4,16,64] [--vocab 129280] [--k 5] [--reps N]
                               [--out DIR] [--label NAME]
        backend="cuda" calls and plain-PyTorch pipelines on the GPU: CUDA-graph replay
        device time and eager host time per call (dyadic/bench/gpu.py); writes
        DIR/gpu-NAME.json.
    python -m dyadic.bench compare OLD.json NEW.json [OLD2.json NEW2.json ...] [--tolerance 0.05]
        A/B of gpu result files: per-cell medians over runs, new/old ratios, cells slower
        than the tolerance marked (dyadic/bench/compare.py).
    python -m dyadic.bench kernel-ab OLD_TREE [--batch 1,4,16,64] [--cases NAMES] [--rounds 2]
        another source tree's CUDA kernels against this tree's in one process, under this
        tree's plans and inputs, per kernel, outputs checked identical
        (dyadic/bench/kernel_ab.py).
    python -m dyadic.bench timeline [--batch 1,4,16,64] [--cases NAMES] [--calls 60]
        each kernel's pass and last-block tail in a call, from %globaltimer stamps of an
        instrumented copy of this tree's kernels (dyadic/bench/timeline.py).
"""

import argparse
import sys

from .run import PRIMITIVES, main_run


def _ints(s):
    return [int(x) for x in s.split(",") if x]


def _names(s):
    return [x.strip() for x in s.split(",") if x.strip()]


def parse(argv=None):
    p = argparse.ArgumentParser(prog="python -m dyadic.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--primitives", type=_names, default=list(PRIMITIVES),
                   help=f"comma-separated subset of {','.join(PRIMITIVES)},philox")
    p.add_argument("--vocab", type=_ints, default=[32000, 129280])
    p.add_argument("--batch", type=_ints, default=[1, 4, 64])
    p.add_argument("--k", type=int, default=5, help="draft depth for verify (default 5)")
    p.add_argument("--top-k", type=int, default=32, help="proposal top-k width (default 32)")
    p.add_argument("--backends", type=_names, default=None,
                   help="dyadic backends (default: every available one except reference)")
    p.add_argument("--repeats", type=int, default=20, help="timed calls per measurement")
    p.add_argument("--no-cpu", dest="cpu", action="store_false",
                   help="skip the CPU measurements (GPU machine)")
    p.add_argument("--torch-threads", type=int, default=1,
                   help="torch intra-op threads on the CPU (default 1: dyadic-cpu is "
                        "single-threaded; 0 keeps torch's default)")
    p.add_argument("--out", default="bench-results", help="output directory")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    return p.parse_args(argv)


def main(argv=None):
    """The side-by-side run, or the subcommand named by the first argument."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["gpu"]:
        from . import gpu  # imports torch
        return gpu.main(argv[1:])
    if argv[:1] == ["compare"]:
        from . import compare
        return compare.main(argv[1:])
    if argv[:1] == ["kernel-ab"]:
        from . import kernel_ab  # imports torch
        return kernel_ab.main(argv[1:])
    if argv[:1] == ["timeline"]:
        from . import timeline  # imports torch
        return timeline.main(argv[1:])
    return main_run(parse(argv))


if __name__ == "__main__":
    sys.exit(main())
