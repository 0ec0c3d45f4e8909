"""A/B comparison of ``python -m dyadic.bench gpu`` result files.

    python -m dyadic.bench compare OLD.json NEW.json [OLD2.json NEW2.json ...] [--tolerance 0.05]

Files alternate old, new (runs made alternately, so that drift of the machine affects both
sides alike).  A cell is one (metric, B, case); its value on each side is the median over
that side's runs of the numeric values (a run where the cell is missing or holds a text, an
error or "not held", does not count; "k/n" says how many of the n runs counted).  Printed: a
Markdown table per timed metric (B, case, old, new, new/old, pairs), "SLOWER" where new/old
exceeds 1 + tolerance, and the line "N cells slower than tolerance (M slower in every pair
of runs)"; rows of ``gpu.py --kernels`` add a table per kernel ("kernel_us NAME").
"pairs" is k/n: of the n alternated pairs (old run i, new run i) where both
have the cell, k have new above old times 1 + tolerance.  A cell slower by its medians but
not in every pair is within the spread between runs (host timings on a shared machine
move by more than 5% from run to run).  The exit status is 0 whatever the timings; it is
not a test.

An A/B of an older commit REV against this tree, each installed in its own folder (a
source checkout on PYTHONPATH would take its ``dyadic.backends`` from elsewhere), the same
gpu.py file timing both:

    git archive REV | (mkdir -p /tmp/ab/src && tar -x -C /tmp/ab/src)
    pip install --no-deps --no-build-isolation --target /tmp/ab/old /tmp/ab/src
    pip install --no-deps --no-build-isolation --target /tmp/ab/new .
    for i in 1 2 3; do
        PYTHONPATH=/tmp/ab/old python dyadic/bench/gpu.py --label old$i --out /tmp/ab/res
        PYTHONPATH=/tmp/ab/new python dyadic/bench/gpu.py --label new$i --out /tmp/ab/res
    done
    python -m dyadic.bench compare $(for i in 1 2 3; do
        echo /tmp/ab/res/gpu-old$i.json /tmp/ab/res/gpu-new$i.json; done)
"""

import argparse
import json
import math
import statistics
import sys

KEYS = ("label", "B", "case")  # a row's identity, not a metric
UNTIMED = ("floor_us",)  # computed from the sizes: the same on both sides
COUNTS = "launches "  # prefix of per-kernel launch counts (gpu.py --kernels): not timed


def load(path):
    """{(B, case): {metric: value}} of one result file, in file order."""
    with open(path) as f:
        rows = json.load(f)
    return {(r["B"], r["case"]): {m: v for m, v in r.items() if m not in KEYS} for r in rows}


def _number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def side(runs, metric, cell):
    """(median or None, what to print) of a cell over one side's runs."""
    values = [run.get(cell, {}).get(metric) for run in runs]
    nums = [v for v in values if _number(v)]
    if not nums:
        text = next((str(v) for v in values if v is not None), "missing")
        return None, text[:60]
    med = statistics.median(nums)
    return med, f"{med:.1f}" + ("" if len(nums) == len(runs) else f" ({len(nums)}/{len(runs)})")


def compare(old_runs, new_runs, tolerance=0.05):
    """[{metric, B, case, old, new, ratio, slower}] over every timed cell of either side."""
    cells, metrics = {}, {}
    for run in old_runs + new_runs:
        for cell, values in run.items():
            cells.setdefault(cell, None)
            for m in values:
                if m not in UNTIMED and not m.startswith(COUNTS):
                    metrics.setdefault(m, None)
    out = []
    for m in metrics:
        for cell in cells:
            (a, a_txt), (b, b_txt) = side(old_runs, m, cell), side(new_runs, m, cell)
            ratio = b / a if a and b is not None else None
            out.append({"metric": m, "B": cell[0], "case": cell[1], "old": a_txt, "new": b_txt,
                        "ratio": ratio, "slower": ratio is not None and ratio > 1 + tolerance,
                        "pairs": pairs(old_runs, new_runs, m, cell, tolerance)})
    return out


def pairs(old_runs, new_runs, metric, cell, tolerance):
    """(k, n): of the n pairs (old_runs[i], new_runs[i]) with a number in the cell on both
    sides, the k where new exceeds old times 1 + tolerance."""
    k = n = 0
    for o, w in zip(old_runs, new_runs):
        a, b = o.get(cell, {}).get(metric), w.get(cell, {}).get(metric)
        if _number(a) and _number(b):
            n += 1
            k += b > a * (1 + tolerance)
    return k, n


def markdown(result, tolerance):
    lines = []
    for m in dict.fromkeys(r["metric"] for r in result):
        lines += ["", f"### {m} (median us; SLOWER: new/old > {1 + tolerance:.3g})", "",
                  "| B | case | old | new | new/old | pairs slower | |",
                  "|---|---|---|---|---|---|---|"]
        for r in (r for r in result if r["metric"] == m):
            ratio = "-" if r["ratio"] is None else f"{r['ratio']:.3f}"
            k, n = r["pairs"]
            lines.append(f"| {r['B']} | {r['case']} | {r['old']} | {r['new']} | {ratio} | "
                         f"{k}/{n} | {'SLOWER' if r['slower'] else ''} |")
    return "\n".join(lines)


def parse(argv=None):
    p = argparse.ArgumentParser(prog="python -m dyadic.bench compare", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", metavar="OLD.json NEW.json",
                   help="result files, alternately old and new")
    p.add_argument("--tolerance", type=float, default=0.05,
                   help="new/old above 1 + this is marked SLOWER (default 0.05)")
    a = p.parse_args(argv)
    if len(a.files) % 2:
        p.error(f"expected pairs of files (old, new), got {len(a.files)} files")
    return a


def main(argv=None):
    a = parse(argv)
    runs = [load(f) for f in a.files]
    result = compare(runs[0::2], runs[1::2], a.tolerance)
    print(f"old: {', '.join(a.files[0::2])}\nnew: {', '.join(a.files[1::2])}")
    print(markdown(result, a.tolerance))
    n = sum(r["slower"] for r in result)
    every = sum(r["slower"] and r["pairs"][0] == r["pairs"][1] for r in result)
    print(f"\n{n} cells slower than tolerance (new/old > {1 + a.tolerance:.3g}; {every} slower "
          f"in every pair of runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
