"""A/B of another source tree's CUDA kernels against this tree's, in one process.

    python -m dyadic.bench kernel-ab OLD_TREE [--batch 1,4,16,64] [--cases NAMES]
                                    [--rounds 2] [--reps 5] [--out DIR] [--tolerance 0.05]

OLD_TREE is a source tree of dyadic (``git archive REV`` unpacked, say).  Its kernel
module (``backends/cuda/kernels/kernels.cu`` with its ``backends/include``) is compiled
in this process with this tree's NVRTC options.  Then, for each batch size, case of
``python -m dyadic.bench gpu`` (``--cases`` picks them as there) and round, the case runs
on each side in turn, the order alternating between rounds: on the "old" side the
kernels the case launches come from the old module, on the "new" side from this
tree's, and everything else (the Python layer, routes, plans, launch words, inputs) is
this tree's on both.  Each side's device time per call and kernel comes from
``gpu.kernel_us`` (torch.profiler over ``--reps`` eager invocations, after one that is
not profiled), and the two sides' outputs must be identical.

The launch words are this tree's, so a kernel is swapped only when its parameter list
reads the same in both trees' sources; otherwise, and when the old tree lacks it, the
old side keeps this tree's kernel and the report names it.  The comparison is therefore
of kernel code alone: a change of routes, plans or launch shapes is compared over two
installed trees (``compare``, the ``ab`` stage of tools/gpu_suite.sh).  Unlike that stage
it installs neither tree and compiles one more module, in one process.

Writes DIR/gpu-oldI.json and DIR/gpu-newI.json for each round I (rows as gpu.py's, with
``kernel_us NAME``, ``launches NAME`` and their sum ``kernel_sum_us``), prints
``compare``'s tables over them and the kernels kept, and exits with status 1 when the
outputs of a case differ between the sides (2 when it cannot run).
"""

import argparse
import json
import os
import re
import sys

import numpy as np
import torch

from . import compare, gpu

_KERNEL = re.compile(r'extern\s+"C"\s+__global__\s+void\s+'
                     r'(?:__launch_bounds__\s*\([^()]*\)\s+)?(\w+)\s*\(')
_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)


def tree_dirs(root):
    """(kernel folder, include folder) of the source tree ``root``; ValueError when it
    has no backends/cuda/kernels/kernels.cu or no backends/include."""
    kdir = os.path.join(root, "backends", "cuda", "kernels")
    idir = os.path.join(root, "backends", "include")
    if not os.path.isfile(os.path.join(kdir, "kernels.cu")) or not os.path.isdir(idir):
        raise ValueError(f"kernel-ab: {root!r} is not a dyadic source tree (no "
                         "backends/cuda/kernels/kernels.cu and backends/include)")
    return kdir, idir


def kernel_heads(text):
    """(name, start, end) of each ``extern "C" __global__`` kernel head in ``text`` (its
    comments removed or blanked): the parameter list is text[start:end - 1], end just past
    its closing parenthesis."""
    for m in _KERNEL.finditer(text):
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"(": 1, ")": -1}.get(text[j], 0)
            j += 1
        yield m.group(1), m.end(), j


def signatures(kernel_dir):
    """{kernel name: its parameter list, comments removed and whitespace collapsed} of the
    ``extern "C" __global__`` kernels in the .cu / .cuh files of ``kernel_dir``."""
    out = {}
    for name in sorted(os.listdir(kernel_dir)):
        if not name.endswith((".cu", ".cuh")):
            continue
        with open(os.path.join(kernel_dir, name)) as f:
            text = _COMMENT.sub(" ", f.read())
        for name, start, end in kernel_heads(text):
            out[name] = " ".join(text[start:end - 1].split())
    return out


def swap_plan(names, old_sigs, new_sigs):
    """(the names to swap, {name: why kept}) for the dyadic kernels among ``names``: a
    kernel is swapped when both sources define it with the same parameter list."""
    swap, kept = [], {}
    for n in names:
        if n not in new_sigs:
            continue  # not one of this tree's kernels (a torch kernel, a copy)
        if n not in old_sigs:
            kept[n] = "not in the old tree"
        elif old_sigs[n] != new_sigs[n]:
            kept[n] = "its parameter list differs"
        else:
            swap.append(n)
    return swap, kept


def arrays(result):
    """The arrays of a call's result as NumPy arrays, in order: a torch tensor or NumPy
    array itself, the items of a tuple or list, a Verdict's accepted / tokens / status,
    a Dyadic's counts / ids (None and other values are passed over)."""
    if isinstance(result, torch.Tensor):
        return [result.detach().cpu().numpy()]
    if isinstance(result, np.ndarray):
        return [result]
    if isinstance(result, (tuple, list)):
        return [t for r in result for t in arrays(r)]
    for fields in (("accepted", "tokens", "status"), ("counts", "ids")):
        if all(hasattr(result, f) for f in fields):
            return [t for f in fields for t in arrays(getattr(result, f))]
    return []


def same_outputs(a, b):
    """Whether two results hold at least one array and the same arrays (shape, dtype and
    values)."""
    ta, tb = arrays(a), arrays(b)
    return bool(ta) and len(ta) == len(tb) and all(
        x.shape == y.shape and x.dtype == y.dtype and np.array_equal(x, y)
        for x, y in zip(ta, tb))


def with_sum(metrics):
    """``metrics`` (gpu.kernel_us's) plus ``kernel_sum_us``, the sum of its kernel times."""
    total = sum(v for k, v in metrics.items() if k.startswith("kernel_us "))
    return {**metrics, "kernel_sum_us": round(total, 2)}


def parse(argv=None):
    p = argparse.ArgumentParser(prog="python -m dyadic.bench kernel-ab", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("old", metavar="OLD_TREE", help="the source tree whose kernels are 'old'")
    p.add_argument("--batch", type=gpu._ints, default=[1, 4, 16, 64], help="batch sizes B")
    p.add_argument("--vocab", type=int, default=gpu.V,
                   help=f"vocabulary size V (default {gpu.V})")
    p.add_argument("--k", type=int, default=gpu.K, help=f"draft depth for verify (default {gpu.K})")
    p.add_argument("--cases", default="", help="as gpu.py's --cases (default: every case)")
    p.add_argument("--rounds", type=int, default=2, help="alternated rounds (default 2)")
    p.add_argument("--reps", type=int, default=5,
                   help="profiled eager invocations per side and round (default 5)")
    p.add_argument("--out", default=".", help="directory for the result files")
    p.add_argument("--tolerance", type=float, default=0.05,
                   help="new/old above 1 + this is marked SLOWER (default 0.05)")
    a = p.parse_args(argv)
    if a.rounds < 1 or a.reps < 1:
        p.error("--rounds and --reps must be at least 1")
    return a


def main(argv=None):
    a = parse(argv)
    try:
        kdir, idir = tree_dirs(a.old)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    why = gpu.cannot_run("kernel-ab")
    if why:
        print(why, file=sys.stderr)
        return 2
    from dyadic.backends.cuda.cupy import runtime

    old_mod = runtime.compile_module(kdir, idir)
    old_sigs, new_sigs = signatures(kdir), signatures(runtime.KERNEL_DIR)
    old_launchers, kept_all, differ = {}, {}, []
    runs = {side: [[] for _ in range(a.rounds)] for side in ("old", "new")}
    for B in a.batch:
        inp = gpu.Inputs(B, a.vocab, a.k)
        for case in gpu.cases(inp):
            if a.cases and not any(gpu.selects(c, case.name) for c in a.cases.split(",")):
                continue
            names = [k[len("kernel_us "):] for k in gpu.kernel_us(case.make(), 1)
                     if k.startswith("kernel_us ")]
            swap, kept = swap_plan(names, old_sigs, new_sigs)
            kept_all.update(kept)
            if not swap:  # the same code on both sides: nothing to compare
                print(f"B={B} {case.name}: no kernel of both trees, not compared",
                      file=sys.stderr)
                continue
            new_launchers = {n: runtime.kernel(n) for n in swap}
            for n in swap:
                if n not in old_launchers:
                    old_launchers[n] = runtime.launcher(old_mod, n)
            for r in range(a.rounds):
                results = {}
                for side in ("old", "new") if r % 2 == 0 else ("new", "old"):
                    launchers = old_launchers if side == "old" else new_launchers
                    runtime.replace_kernels({n: launchers[n] for n in swap})
                    try:
                        fn = case.make()
                        metrics = with_sum(gpu.kernel_us(fn, a.reps))
                        results[side] = fn()
                        torch.cuda.synchronize()
                    finally:
                        runtime.replace_kernels(new_launchers)
                    runs[side][r].append({"label": f"{side}{r + 1}", "B": B, "case": case.name,
                                          **metrics})
                if not same_outputs(results["old"], results["new"]):
                    differ.append(f"B={B} {case.name} (round {r + 1})")
                print(f"B={B} {case.name} round {r + 1}: " + " ".join(
                    f"{side} {runs[side][r][-1]['kernel_sum_us']} us" for side in ("old", "new")),
                    file=sys.stderr, flush=True)
        del inp
        torch.cuda.empty_cache()
    os.makedirs(a.out, exist_ok=True)
    files = {side: [] for side in runs}
    for side, rounds in runs.items():
        for r, rows in enumerate(rounds):
            path = os.path.join(a.out, f"gpu-{side}{r + 1}.json")
            with open(path, "w") as f:
                json.dump(rows, f, indent=1)
            files[side].append(path)
    result = compare.compare([compare.load(p) for p in files["old"]],
                             [compare.load(p) for p in files["new"]], a.tolerance)
    print(f"kernels of {os.path.abspath(a.old)} (old) against {runtime.KERNEL_DIR} (new), "
          f"{torch.cuda.get_device_name()}, V={a.vocab}, k={a.k}, {a.rounds} rounds of "
          f"{a.reps} invocations")
    print(compare.markdown(result, a.tolerance))
    for n, why in sorted(kept_all.items()):
        print(f"kept this tree's {n} on the old side: {why}")
    if differ:
        print("outputs differ between the sides: " + "; ".join(differ))
        return 1
    print("outputs identical on both sides in every case and round")
    return 0


if __name__ == "__main__":
    sys.exit(main())
