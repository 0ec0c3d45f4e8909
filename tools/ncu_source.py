"""Where a kernel's warps stall, per source line: a summary of Nsight Compute's source
counters (the ``ncu`` stage of tools/gpu_suite.sh with ``NCU_SOURCE=1`` writes the CSV).

    ncu --section SourceCounters --import-source yes -o rep ...   (kernels built with
        DYADIC_CUDA_PROF=1, which adds -lineinfo)
    ncu -i rep.ncu-rep --page source --print-source cuda,sass --csv > src.csv
    python tools/ncu_source.py src.csv [--lines 30] [--instructions 20]

The CSV lists each source line followed by the SASS instructions attributed to it; an
instruction of inlined code can appear under several lines, so the instructions are
taken once each, by address, under the first line that lists them.  Prints the total
warp stall samples and executed warp instructions, the source lines with the most
samples (share of samples, of executed instructions, and the three largest stall
reasons), then the single instructions with the most samples.
"""

import argparse
import collections
import csv
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def number(text):
    try:
        return int(float(text))
    except ValueError:
        return 0


def read(path):
    """(instructions by address: (file, line, source text, sass, samples, executed,
    stall counts)), in address order."""
    header, where, seen = None, None, {}
    name = None
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if len(row) == 2:
                if row[0] == "File Path":
                    name = row[1].rsplit("/", 1)[-1]
                continue
            if len(row) < 4:
                continue
            if row[0] == "Line No":
                header = row
                stalls = [(i, k[len("stall_"):]) for i, k in enumerate(header)
                          if k.startswith("stall_") and "Not Issued" not in k]
                i_s, i_e = header.index(SAMPLES), header.index(EXECUTED)
                continue
            if header is None:
                continue
            if row[2] == "-":  # a source line
                where = (name, row[0], row[1].strip())
            elif row[2].startswith("0x"):
                addr = int(row[2], 16)
                if addr not in seen and where is not None:
                    seen[addr] = (where, row[3].strip(), number(row[i_s]), number(row[i_e]),
                                  {k: number(row[i]) for i, k in stalls})
    if header is None:
        raise SystemExit(f"{path}: no 'Line No' header: not ncu's --page source --csv output")
    return [seen[a] + (a,) for a in sorted(seen)]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("csv")
    p.add_argument("--lines", type=int, default=30)
    p.add_argument("--instructions", type=int, default=20)
    a = p.parse_args(argv)
    ins = read(a.csv)
    samples = sum(i[2] for i in ins) or 1
    executed = sum(i[3] for i in ins) or 1
    print(f"{len(ins)} instructions, {samples} stall samples, {executed} warp instructions executed")
    by_line = collections.OrderedDict()
    for where, _, s, e, st, _ in ins:
        acc = by_line.setdefault(where, [0, 0, collections.Counter()])
        acc[0] += s
        acc[1] += e
        acc[2].update(st)
    print("\n| samples | executed | file:line | stalls | source |\n|---:|---:|---|---|---|")
    for (name, line, text), (s, e, st) in sorted(by_line.items(), key=lambda kv: -kv[1][0])[:a.lines]:
        top = ", ".join(f"{k} {100 * v / max(s, 1):.0f}%" for k, v in st.most_common(3) if v)
        print(f"| {100 * s / samples:.1f}% | {100 * e / executed:.1f}% | {name}:{line} | {top} | "
              f"`{text[:70]}` |")
    base = ins[0][5] if ins else 0
    print("\n| samples | offset | instruction | stalls | file:line |\n|---:|---|---|---|---|")
    for where, sass, s, e, st, addr in sorted(ins, key=lambda i: -i[2])[:a.instructions]:
        top = ", ".join(f"{k} {v}" for k, v in collections.Counter(st).most_common(2) if v)
        print(f"| {100 * s / samples:.1f}% | {addr - base:#x} | `{sass[:50]}` | {top} | "
              f"{where[0]}:{where[1]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
