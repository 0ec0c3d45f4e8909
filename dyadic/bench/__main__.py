"""python -m dyadic.bench [--primitives propose,verify] [--vocab 32000,129280] [--batch 1,4,64]"""

import argparse
import sys

from .run import PRIMITIVES, main_run


def _ints(s):
    return [int(x) for x in s.split(",") if x]


def _names(s):
    return [x.strip() for x in s.split(",") if x.strip()]


def parse(argv=None):
    p = argparse.ArgumentParser(prog="python -m dyadic.bench", description=__doc__)
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


if __name__ == "__main__":
    sys.exit(main_run(parse()))
