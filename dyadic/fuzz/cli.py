"""``python -m dyadic.fuzz``: the cross-backend bit-for-bit fuzz command.

Exit codes: 0 every case agreed on every backend; 1 a mismatch (a shrunk
reproducer was written); 2 usage error, or a named backend is not available
here (pass ``--skip-missing`` to report and skip it instead).
"""

import argparse
import os
import sys
import time
from collections import Counter, defaultdict

from .. import _backend
from .case import ALL_PRIMITIVES, PRIMITIVES
from .compare import Skip, check, differences
from .generators import generate
from .reproducer import load, save
from .shrink import shrink

ORACLE = "reference"


def _parser():
    p = argparse.ArgumentParser(
        prog="python -m dyadic.fuzz",
        description="Generate random and adversarial cases for every primitive and compare "
                    "every output bit for bit across backends and dyadic.reference.")
    p.add_argument("--backends", default="available",
                   help="comma-separated backends to compare with the reference "
                        "(cpu, numba, cuda), or 'available' (default: every backend that "
                        "loads here)")
    p.add_argument("--cases", type=int, default=200, help="number of cases (default 200)")
    p.add_argument("--seed", type=int, default=0, help="case stream seed (default 0)")
    p.add_argument("--primitives", default=",".join(PRIMITIVES),
                   help=f"comma-separated subset of {','.join(ALL_PRIMITIVES)} (default: "
                   f"{','.join(PRIMITIVES)}; verify_logits and propose_filtered take device "
                   f"arrays on cuda and numba)")
    p.add_argument("--out", default="fuzz-failures",
                   help="directory for reproducers (default ./fuzz-failures)")
    p.add_argument("--skip-missing", action="store_true",
                   help="skip named backends that are not available instead of exiting 2")
    p.add_argument("--no-reference", action="store_true",
                   help="do not run dyadic.reference; the first backend is the oracle")
    p.add_argument("--keep-going", action="store_true",
                   help="continue after a mismatch (one reproducer per failing case)")
    p.add_argument("--max-shrink", type=int, default=200,
                   help="most candidate cases tried while shrinking (default 200)")
    p.add_argument("--replay", metavar="PATH", help="run one reproducer (.npz) and compare")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    return p


def _available(name):
    try:
        be = _backend.get(name)
    except Exception as exc:  # noqa: BLE001 - the reason is reported
        return f"{exc}"
    if not getattr(be, "usable", lambda: True)():
        return "loaded but has no device here"
    return None


def resolve_backends(spec, skip_missing, no_reference, out=None):
    """The backends to run, oracle first; raises SystemExit(2) for unknown / missing ones."""
    out = out or sys.stderr
    known = _backend.names()
    if spec == "available":
        names = [n for n in known if n != ORACLE and _available(n) is None]
        explicit = False
    else:
        names = [n.strip() for n in spec.split(",") if n.strip()]
        explicit = True
    unknown = [n for n in names if n not in known]
    if unknown:
        print(f"error: unknown backend(s) {unknown}; expected some of {sorted(known)}", file=out)
        raise SystemExit(2)
    chosen = []
    for n in names:
        why = _available(n)
        if why is None:
            chosen.append(n)
        elif explicit and not skip_missing:
            print(f"error: backend {n!r} is not available here: {why}\n"
                  f"       (pass --skip-missing to skip it)", file=out)
            raise SystemExit(2)
        else:
            print(f"note: backend {n!r} not available, skipped: {why}", file=out)
    if not no_reference and ORACLE not in chosen:
        chosen.insert(0, ORACLE)
    elif ORACLE in chosen:
        chosen.remove(ORACLE)
        chosen.insert(0, ORACLE)
    if not chosen:
        print("error: no backend to run", file=out)
        raise SystemExit(2)
    if len(chosen) == 1:
        print(f"note: only {chosen[0]!r} runs: outputs are computed but not compared", file=out)
    return chosen


class Progress:
    """A plain-text progress bar on stderr (a line per 10% when not a terminal)."""

    def __init__(self, total, quiet, stream=None):
        stream = stream or sys.stderr
        self.total, self.quiet, self.stream = total, quiet, stream
        self.tty = hasattr(stream, "isatty") and stream.isatty()
        self.t0 = time.perf_counter()
        self.step = max(1, total // 10)

    def update(self, done, failures, what=""):
        if self.quiet:
            return
        if not self.tty and done % self.step and done != self.total:
            return
        width = 30
        fill = int(width * done / max(1, self.total))
        line = (f"[{'#' * fill}{'.' * (width - fill)}] {done}/{self.total} cases "
                f"{time.perf_counter() - self.t0:6.1f}s  mismatches {failures}  {what}")
        if self.tty:
            self.stream.write("\r" + line[:110].ljust(110))
            if done == self.total:
                self.stream.write("\n")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def _summary(stats, seconds, backends, out):
    cols = ("primitive", "cases", "agreed", "same error", "mismatch", "skipped")
    rows = []
    for prim in ALL_PRIMITIVES:
        s = stats.get(prim)
        if s:
            rows.append((prim, s["cases"], s["agreed"], s["raised"], s["mismatch"], s["skipped"]))
    tot = Counter()
    for s in stats.values():
        tot.update(s)
    rows.append(("total", tot["cases"], tot["agreed"], tot["raised"], tot["mismatch"],
                 tot["skipped"]))
    w = [max(len(str(r[i])) for r in rows + [cols]) for i in range(len(cols))]
    line = "  ".join(str(c).rjust(w[i]) if i else str(c).ljust(w[i]) for i, c in enumerate(cols))
    print(line, file=out)
    print("-" * len(line), file=out)
    for r in rows:
        print("  ".join(str(c).rjust(w[i]) if i else str(c).ljust(w[i])
                        for i, c in enumerate(r)), file=out)
    print("time per backend: " + ", ".join(f"{b} {seconds[b]:.2f}s" for b in backends), file=out)


def run_fuzz(args, out=None):
    out = out or sys.stdout
    backends = resolve_backends(args.backends, args.skip_missing, args.no_reference)
    prims = tuple(p.strip() for p in args.primitives.split(",") if p.strip())
    bad = [p for p in prims if p not in ALL_PRIMITIVES]
    if bad or not prims:
        print(f"error: unknown primitive(s) {bad}; expected some of {list(ALL_PRIMITIVES)}",
              file=sys.stderr)
        return 2
    print(f"dyadic.fuzz: seed {args.seed}, {args.cases} cases, backends {','.join(backends)} "
          f"(oracle {backends[0]})", file=out)
    stats = defaultdict(Counter)
    seconds = Counter()
    failures = []
    progress = Progress(args.cases, args.quiet)
    for i in range(args.cases):
        case = generate(args.seed, i, prims)
        st = stats[case.primitive]
        st["cases"] += 1
        try:
            outcomes, diffs = check(case, backends)
        except Skip as exc:
            st["skipped"] += 1
            progress.update(i + 1, len(failures), f"skip: {exc}")
            continue
        for b, o in outcomes.items():
            seconds[b] += o.seconds
        if diffs:
            st["mismatch"] += 1
            failures.append(_report(case, backends, diffs, args, out))
            if not args.keep_going:
                progress.update(i + 1, len(failures))
                break
        elif outcomes[backends[0]].error:
            st["raised"] += 1
        else:
            st["agreed"] += 1
        progress.update(i + 1, len(failures), case.primitive)
    _summary(stats, seconds, backends, out)
    if failures:
        print(f"FAILED: {len(failures)} mismatching case(s); replay with:", file=out)
        for cmd in failures:
            print(f"  {cmd}", file=out)
        return 1
    print("OK: every output bit-identical, every invalid case raised the same error", file=out)
    return 0


def _still_fails(backends):
    def fails(case):
        try:
            return bool(check(case, backends)[1])
        except Skip:
            return False
    return fails


def _report(case, backends, diffs, args, out):
    print(f"\nMISMATCH in case {case.index} (seed {case.seed}): {case.describe()}", file=out)
    for b, d in diffs.items():
        for line in d[:5]:
            print(f"  {backends[0]} vs {b}: {line}", file=out)
    small, tries = shrink(case, _still_fails(backends), budget=args.max_shrink)
    _, small_diffs = check(small, backends)
    print(f"  shrunk in {tries} tries to: {small.describe()}", file=out)
    path = os.path.join(args.out, f"fuzz-seed{case.seed}-case{case.index}-{case.primitive}.npz")
    cmd = save(small, path, backends, small_diffs)
    print(f"  reproducer: {path}\n  replay: {cmd}", file=out)
    return cmd


def run_replay(args, out=None):
    out = out or sys.stdout
    case, meta = load(args.replay)
    spec = args.backends if args.backends != "available" else ",".join(
        b for b in meta["backends"] if b != ORACLE)
    backends = resolve_backends(spec, args.skip_missing, args.no_reference)
    print(f"replay {args.replay}: {case.describe()}", file=out)
    try:
        outcomes, diffs = check(case, backends)
    except Skip as exc:
        print(f"cannot run here: {exc}", file=out)
        return 2
    for b, o in outcomes.items():
        print(f"  {b}: {o!r}", file=out)
        if o.outputs:
            for name, a in sorted(o.outputs.items()):
                if a is not None:
                    print(f"    {name} = {a.tolist()!r}"[:400], file=out)
    for b, d in diffs.items():
        for line in d:
            print(f"  DIFF {backends[0]} vs {b}: {line}", file=out)
    if diffs:
        print("MISMATCH reproduced", file=out)
        return 1
    print("no mismatch: every backend agrees on this case", file=out)
    return 0


def main(argv=None):
    args = _parser().parse_args(argv)
    if args.cases < 0:
        print("error: --cases must be >= 0", file=sys.stderr)
        return 2
    try:
        if args.replay:
            return run_replay(args)
        return run_fuzz(args)
    except SystemExit as exc:
        return int(exc.code or 0)


__all__ = ["main", "differences"]
