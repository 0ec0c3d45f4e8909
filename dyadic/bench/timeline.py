"""Where a call's device time goes, kernel by kernel: each kernel's pass and last-block tail.

    python -m dyadic.bench timeline [--batch 1,4,16,64] [--cases NAMES] [--calls 60]
                                    [--vocab 129280] [--k 5] [--out DIR]

The kernels of this tree are compiled once more, instrumented: thread 0 of every block
stamps the GPU's ``%globaltimer`` (nanoseconds, one clock for every SM) into a device
array when the block starts (the earliest kept), when it reaches ``dc_elect_last`` (the
latest kept: the row's blocks are done with their pass), when it is elected the last
block of its row (the latest kept), when it passes a phase mark ``DY_TL_MARK(m)``,
m = 0..7, in the kernel's body or a function it calls (the latest kept; the marks are
nothing in the normal build, common.cuh) and when it returns (the latest kept).  For each
batch size and case of ``python -m dyadic.bench gpu`` (``--cases`` picks them as there;
default the verify-from-logits case), the instrumented launchers replace this tree's,
the case's dyadic calls run one at a time (a cold case's rotated input sets in turn),
the stamps are reset before each call and read after it, and the medians over
``--calls`` calls are printed per kernel, in launch order, in microseconds:

    start  from the call's first kernel start to this kernel's first block start
    gap    from the previous kernel's end to this kernel's start (the launch gap)
    pass   from its start to the last block of any row reaching its election
    wait   from there to the last election (the fence and the atomic ticket)
    tail   from the last election to the kernel's end (the elected blocks' work)
    total  from its start to its end

    marks  "m: t" for each mark every call passed, t from the kernel's start
    a block  the mean over the call's blocks of each block's own times from its start:
           its life (to its return), to its election and to each mark; where the
           kernel's pass goes (a block waiting on memory, its steps before and after
           the tile) where the latest stamps show only the last block

A kernel without an election has only start, gap, total and its marks; a kernel launched more
than once in one call spans its first start to its last end.  The stamps cost a few
atomics per block, so totals read a little above ``gpu --kernels``; compare timelines
with each other, not with that table.  Eager calls, so the gaps are eager launch gaps
(a CUDA graph shortens them).  Writes DIR/timeline.json.  Exits 2 when it cannot run
(no CUDA GPU, or dyadic modules loaded from outside the imported package).
"""

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile

import numpy as np

from . import kernel_ab

ARRAY = "dy_timeline"
_ELECT = re.compile(r"(template\s*<[^<>]*>\s*)?DC_FN\s+bool\s+dc_elect_last\s*\(")
_STAMPS = r"""
/* dyadic.bench timeline: per kernel [first start, last pass end, last election, last end,
 * the last passes of marks 0..7] (%globaltimer ns), then the sums over its blocks [blocks,
 * their lives, their times to the election, blocks reaching it, their times to marks 0..7,
 * blocks passing each].  dy_tl_t0: the block's start, dy_tl_k: its kernel's row, which
 * thread 0 writes and reads alone (in shared memory: the kernels hold no register for
 * them; an election or mark in a function a kernel calls stamps that kernel's row) */
__device__ unsigned long long dy_timeline[DY_TL_KERNELS][DY_TL_COLS];
__shared__ unsigned long long dy_tl_t0;
__shared__ int dy_tl_k;
__device__ __forceinline__ unsigned long long dy_tl_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
/* thread 0: now is t; the block's time to it into column sum, one more block into n */
__device__ __forceinline__ void dy_tl_span(int k, int sum, int n, unsigned long long t) {
  atomicAdd(&dy_timeline[k][sum], t - dy_tl_t0);
  atomicAdd(&dy_timeline[k][n], 1ull);
}
struct DyTlEnd {
  int k;
  __device__ ~DyTlEnd() {
    if (threadIdx.x == 0) {
      const unsigned long long t = dy_tl_now();
      atomicMax(&dy_timeline[k][3], t);
      dy_tl_span(k, DY_TL_LIFE, DY_TL_BLOCKS, t);
    }
  }
};
#define DY_TL_BEGIN(K) DyTlEnd dy_tl_end{K}; \
  if (threadIdx.x == 0) { dy_tl_k = K; dy_tl_t0 = dy_tl_now(); \
    atomicMin(&dy_timeline[K][0], dy_tl_t0); }
__device__ __forceinline__ int dy_tl_pass(int k) {
  if (threadIdx.x == 0) {
    const unsigned long long t = dy_tl_now();
    atomicMax(&dy_timeline[k][1], t);
    dy_tl_span(k, DY_TL_ARRIVE, DY_TL_ARRIVED, t);
  }
  return 0;
}
__device__ __forceinline__ bool dy_tl_elect(int k, bool last) {
  if (last && threadIdx.x == 0) atomicMax(&dy_timeline[k][2], dy_tl_now());
  return last;
}
#define DY_TL_MARK(m) do { if (threadIdx.x == 0) { \
  const unsigned long long dy_tl_t = dy_tl_now(); \
  atomicMax(&dy_timeline[dy_tl_k][4 + (m)], dy_tl_t); \
  dy_tl_span(dy_tl_k, DY_TL_TO_MARK + (m), DY_TL_PASSED + (m), dy_tl_t); } } while (0)
"""
MARKS = 8  # DY_TL_MARK(0..7)
# the per-block sums after the 4 + MARKS stamps (_STAMPS): blocks, the sum of their lives,
# the sum of their times to the election and how many reached it, the sums of their times
# to each mark, then how many passed each
BLOCKS = 4 + MARKS
LIFE, ARRIVE, ARRIVED, TO_MARK = BLOCKS + 1, BLOCKS + 2, BLOCKS + 3, BLOCKS + 4
PASSED = TO_MARK + MARKS
COLS = PASSED + MARKS
_COLUMNS = "".join(f"#define DY_TL_{n} {v}\n" for n, v in (
    ("COLS", COLS), ("BLOCKS", BLOCKS), ("LIFE", LIFE), ("ARRIVE", ARRIVE),
    ("ARRIVED", ARRIVED), ("TO_MARK", TO_MARK), ("PASSED", PASSED)))


def _blank_comments(text):
    """``text`` with its comments replaced by spaces (offsets and lines kept)."""
    return kernel_ab._COMMENT.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), text)


_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def module_files(kernel_dir):
    """The files of ``kernel_dir`` that make the module (runtime.compile_module):
    kernels.cu and the files of the folder it includes, directly or through another of
    them, sorted.  Other sources there (shard.cu: its own module) are not part of it."""
    seen, todo = set(), ["kernels.cu"]
    while todo:
        name = todo.pop()
        path = os.path.join(kernel_dir, name)
        if name in seen or not os.path.isfile(path):
            continue
        seen.add(name)
        with open(path) as f:
            todo.extend(_INCLUDE.findall(_blank_comments(f.read())))
    return sorted(seen)


def instrument(kernel_dir, dst):
    """Copies the kernel folder ``kernel_dir`` to ``dst`` (which must not exist) with every
    ``extern "C" __global__`` kernel of the module (``module_files``) stamping the
    timeline (DY_TL_BEGIN first in its body) and ``dc_elect_last`` (common.cuh) stamping
    its pass end and election.  Returns the
    kernel names in the order of their rows of ``dy_timeline`` (declared first in
    kernels.cu).  ValueError when the folder has no kernels.cu, no kernel or no
    ``dc_elect_last`` definition in common.cuh."""
    if not os.path.isfile(os.path.join(kernel_dir, "kernels.cu")):
        raise ValueError(f"timeline: no kernels.cu in {kernel_dir!r}")
    shutil.copytree(kernel_dir, dst)
    names = []
    edits = {}
    for fname in module_files(dst):
        path = os.path.join(dst, fname)
        with open(path) as f:
            text = f.read()
        bare = _blank_comments(text)
        cuts = []
        for name, _, j in kernel_ab.kernel_heads(bare):
            brace = bare.find("{", j)
            if brace < 0 or bare[j:brace].strip():
                continue  # a declaration, not a definition
            cuts.append((brace + 1, f" DY_TL_BEGIN({len(names)})"))
            names.append(name)
        if cuts:
            edits[path] = (text, cuts)
    if not names:
        raise ValueError(f"timeline: no extern \"C\" __global__ kernel in {kernel_dir!r}")
    for path, (text, cuts) in edits.items():
        for at, ins in reversed(cuts):
            text = text[:at] + ins + text[at:]
        with open(path, "w") as f:
            f.write(text)
    common = os.path.join(dst, "common.cuh")
    text = open(common).read() if os.path.isfile(common) else ""
    m = _ELECT.search(_blank_comments(text))
    if not m:
        raise ValueError(f"timeline: no dc_elect_last definition in {common!r}")
    end = text.find("\n}\n", m.end())
    if end < 0:
        raise ValueError(f"timeline: dc_elect_last's body in {common!r} does not end "
                         "with a closing brace on its own line")
    end += 3
    fn = text[m.start():end].replace("dc_elect_last(", "dc_elect_last_impl(", 1)
    macro = ("#define dc_elect_last(...) (dy_tl_pass(dy_tl_k), "
             "dy_tl_elect(dy_tl_k, dc_elect_last_impl(__VA_ARGS__)))\n")
    with open(common, "w") as f:
        f.write(text[:m.start()] + fn + macro + text[end:])
    main = os.path.join(dst, "kernels.cu")  # the stamps before every include
    with open(main) as f:
        text = f.read()
    with open(main, "w") as f:
        f.write(f"#define DY_TL_KERNELS {len(names)}\n" + _COLUMNS + _STAMPS + text)
    return names


def summarise(stamps, names):
    """Per-kernel medians (us) over calls from ``stamps``, a list of one uint64 array
    [len(names), COLS] per call (instrument's layout): rows {"kernel", "start",
    "gap", "pass", "wait", "tail", "total", "marks", "block"} in launch order, None where
    a kernel has no election (and "gap" of the first); "marks" {m: time from the kernel's
    start} of the marks passed in every call; "block" the mean over a call's blocks of
    each block's own times from its start: {"life": to its end, "pass": to its election
    (None without one), "marks": {m: to mark m}}, each a median over the calls, the marks
    those passed in every call.  A kernel counts when it ran in every call; each call's
    times are from its first kernel start."""
    never = np.iinfo(np.uint64).max
    ran = [i for i in range(len(names)) if all(s[i][0] != never for s in stamps)]
    t0 = [min(int(s[i][0]) for i in ran) for s in stamps] if ran else []

    def rel(i, col):  # stamp col of kernel i in each call, ns from the call's t0
        return [int(s[i][col]) - t for s, t in zip(stamps, t0)]

    def med(values):
        return round(statistics.median(values) / 1000, 2)

    rows = []
    for i in ran:
        st, en = rel(i, 0), rel(i, 3)
        row = {"kernel": names[i], "start": med(st), "gap": None, "pass": None,
               "wait": None, "tail": None, "total": med([e - b for b, e in zip(st, en)])}
        if all(s[i][1] and s[i][2] for s in stamps):
            pa, el = rel(i, 1), rel(i, 2)
            row["pass"] = med([p - b for b, p in zip(st, pa)])
            row["wait"] = med([e - p for p, e in zip(pa, el)])
            row["tail"] = med([e - x for x, e in zip(el, en)])
        row["marks"] = {m: med([x - b for b, x in zip(st, rel(i, 4 + m))])
                        for m in range(MARKS) if all(s[i][4 + m] for s in stamps)}

        def mean(total, n):  # a call's mean over the blocks counted in column n, or None
            if not all(s[i][n] for s in stamps):
                return None
            return med([int(s[i][total]) / int(s[i][n]) for s in stamps])
        row["block"] = {"life": mean(LIFE, BLOCKS), "pass": mean(ARRIVE, ARRIVED),
                        "marks": {m: v for m in range(MARKS)
                                  if (v := mean(TO_MARK + m, PASSED + m)) is not None}}
        rows.append((row, st, en))
    rows.sort(key=lambda r: r[0]["start"])
    for (_, _, prev_end), (row, st, _) in zip(rows, rows[1:]):
        row["gap"] = med([b - e for b, e in zip(st, prev_end)])
    return [r for r, _, _ in rows]


def markdown(rows):
    """The rows of ``summarise`` as a Markdown table (the last column: a block's mean
    life, time to its election and to each mark)."""
    cols = ("start", "gap", "pass", "wait", "tail", "total")
    lines = ["| kernel | " + " | ".join(cols) + " | marks | a block: life / pass / marks |",
             "|---" + "|---:" * len(cols) + "|---|---|"]
    for r in rows:
        marks = ", ".join(f"{m}: {t:.2f}" for m, t in sorted(r["marks"].items()))
        blk = r["block"]
        own = " / ".join("-" if blk[c] is None else f"{blk[c]:.2f}" for c in ("life", "pass"))
        own += "".join(f", {m}: {t:.2f}" for m, t in sorted(blk["marks"].items()))
        lines.append(f"| `{r['kernel']}` | " + " | ".join(
            "-" if r[c] is None else f"{r[c]:.2f}" for c in cols)
            + f" | {marks or '-'} | {own} |")
    return "\n".join(lines)


def parse(argv=None):
    from . import gpu
    p = argparse.ArgumentParser(prog="python -m dyadic.bench timeline", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=gpu._ints, default=[1, 4, 16, 64])
    p.add_argument("--vocab", type=int, default=gpu.V)
    p.add_argument("--k", type=int, default=gpu.K, help="draft depth for verify")
    p.add_argument("--cases", default="=verify_k5_logits_dense_lazy_close_cold",
                   help="comma-separated substrings or =NAME entries, as gpu's --cases "
                   "(default: the verify-from-logits case)")
    p.add_argument("--calls", type=int, default=60, help="calls timed per case (default 60)")
    p.add_argument("--out", default="bench-out", help="output directory")
    a = p.parse_args(argv)
    if a.calls < 1:
        p.error("--calls must be at least 1")
    return a


def calls_of(fn):
    """The one-call steps of a gpu case's invocation ``fn``: fn.step(j) for j < fn.calls
    when it has them, else [fn] for a one-call invocation; None otherwise."""
    n = getattr(fn, "calls", 1)
    step = getattr(fn, "step", None)
    if step is not None:
        return [lambda j=j: step(j) for j in range(n)]
    return [fn] if n == 1 else None


def main(argv=None):
    a = parse(argv)
    import torch
    from . import gpu
    why = gpu.cannot_run("timeline")
    if why:
        print(why, file=sys.stderr)
        return 2
    from dyadic.backends.cuda.cupy import runtime
    import cupy
    work = tempfile.mkdtemp(prefix="dyadic-timeline-")
    try:
        kdir = os.path.join(work, "kernels")
        names = instrument(runtime.KERNEL_DIR, kdir)
        mod = runtime.compile_module(kdir, runtime.include_dir())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    stamps = cupy.ndarray((len(names), COLS), cupy.uint64, mod.get_global(ARRAY))
    own = {n: runtime.kernel(n) for n in names}
    timed = {n: runtime.launcher(mod, n) for n in names}

    results = []
    for B in a.batch:
        inp = gpu.Inputs(B, a.vocab, a.k)
        for case in gpu.cases(inp):
            if not any(gpu.selects(c, case.name) for c in a.cases.split(",")):
                continue
            fn = case.make()
            steps = calls_of(fn)
            if steps is None:
                print(f"B={B} {case.name}: its invocation makes {fn.calls} calls and has no "
                      "step of one call; not timed", file=sys.stderr)
                continue
            runtime.replace_kernels(timed)
            try:
                fn()  # plans, compiles and first-touch allocations outside the timing
                per_call = []
                for j in range(a.calls):
                    stamps[:, 0] = np.uint64(np.iinfo(np.uint64).max)
                    stamps[:, 1:] = np.uint64(0)
                    cupy.cuda.Device().synchronize()
                    steps[j % len(steps)]()
                    cupy.cuda.Device().synchronize()  # every stream of the device
                    per_call.append(stamps.get())
            finally:
                runtime.replace_kernels(own)
            rows = summarise(per_call, names)
            results.append({"B": B, "case": case.name, "calls": a.calls, "kernels": rows})
            print(f"\nB={B} {case.name} ({a.calls} calls, medians, us)\n" + markdown(rows),
                  flush=True)
        del inp
        torch.cuda.empty_cache()
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "timeline.json")
    with open(path, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "vocab": a.vocab, "k": a.k,
                   "results": results}, f, indent=1)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
