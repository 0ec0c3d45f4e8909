"""GPU timings of backend="cuda" calls and of the plain-PyTorch pipelines.

    python -m dyadic.bench gpu [--batch 1,4,16,64] [--vocab 129280] [--k 5] [--reps 200]
                               [--out DIR] [--label NAME] [--cases SUBSTR,...] [--kernels N]
    python path/to/dyadic/bench/gpu.py ...     (the same, run as a script)

For each batch size B and each case (a zero-argument call on inputs made beforehand,
outputs preallocated with ``out=``), two metrics, in microseconds:

- ``graph_dev_us``: device time of one CUDA-graph replay of the call: median over
  ``--reps`` replays, each started with the launch queue held by a sleep kernel while the
  host enqueues it (``dyadic.bench.timing.held_event_times``), so the interval covers the
  device alone.  Written as text "<us> (not held)" where the hold may have ended before the
  host enqueued the replay, and "n/a" for check=True calls (they synchronise: not
  capturable).
- ``eager_host_us``: host time of one eager call: ``time.perf_counter`` around the call,
  the launch queue idle (synchronised before each call, outside the timed region); median
  over ``--reps`` calls after 20 warm-up calls.  A check=True call waits for its kernels:
  its host time includes their device time.

and ``floor_us``: the bytes the call must read or write at least once / 4.2e12 B/s (the
H200's copy bandwidth), where that bound applies (None elsewhere).  With ``--kernels N``,
also per kernel: ``kernel_us NAME``, the device time of that kernel per call (the median
duration of its launches times its launches per call) over N eager invocations under
``torch.profiler`` (CUDA activity, after one unprofiled invocation), and ``launches NAME``,
its launches per call; ``python -m dyadic.bench compare`` then compares each kernel too.

Cases (``cases``; all dyadic calls backend="cuda", check=False unless named otherwise):
trivial_kernel (a one-element add: the cost of a launch alone); propose_top32_bf16 (T=0.7;
_top_p: with top_p 0.9 per row, a device tensor: the filtered route);
propose_dense_bf16 and propose_dense_bf16_floor_first (top_k=None, policy "standard" /
"floor-first"); allocate_dense_f32; allocate_top32_f32; draw_top32 (from a top-32 q);
verify_k5_dense / verify_k5_top32 (dense / top-32 q), each also _lazy (check="lazy") and
_checked (check=True); verify_k5_{dense,top32}[_lazy]_{close,indep}_cold (inputs
rotated over enough sets that the L2 cache does not hold them: ``verify_cold``; graph
replay only, time per call; ``_ragged``: request b verifies b mod (k + 1) drafts);
verify_k5_logits_{dense,top32}[_lazy]_close_cold and
verify_k5_logits_dense[_lazy]_close_cold_ragged (the same from target logits 3 z in
bfloat16, ``logits=True``, device tensors temperature 0.8 and top_p 0.9);
verify_k5_dense_greedy (every other request greedy=True); and the
plain-PyTorch pipelines torch_top32_proposal (topk, softmax, multinomial, gather) and
torch_verify_k5_dense (gather, ratio test, clamp(p - q, 0), exponential race).

Inputs (as the cases of ``cases``): z ~ N(0, 1) [B, V]; logits 3 z in bfloat16; target
p = softmax(3 N(0, 1)) [B, k+1, V]; draft q = softmax(3 z + 0.5 N(0, 1)) [B, k, V] as a
dense and a top-32 Dyadic, drafts sampled from q's counts (dense) or q's top id (top-32);
p32 = softmax(3 z) for allocate and draw; seeds 0..B-1, other key fields 0; each tensor
from its own seeded generator.

Writes ``DIR/gpu-NAME.json``: a list of rows ``{"label", "B", "case", "graph_dev_us",
"eager_host_us", "floor_us"}``, plus the per-kernel keys with ``--kernels`` (a value is a
number, None, or a text: "error: ...", "n/a: ...", "... (not held)"), and prints a
Markdown table (two with ``--kernels``).  A case that fails records its
error and the run goes on.  ``python -m dyadic.bench compare`` reads these files.

Only dyadic's public API, torch, NumPy and ``dyadic.bench.timing.capture_graph`` /
``held_event_times`` are used, so this file also times another checkout of dyadic with the
same API: run as a script with PYTHONPATH at that checkout installed in a folder (``pip
install --no-deps --no-build-isolation --target DIR CHECKOUT``).  A source checkout on
PYTHONPATH is not enough: its ``dyadic.backends`` (the repository's ``backends/``) would be
found elsewhere; a run whose dyadic modules do not all come from the imported package's
folder is refused.
"""

import argparse
import collections
import functools
import json
import os
import statistics
import sys
import time

if __name__ == "__main__":  # as a script: this folder's modules must not shadow others
    _HERE = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import torch  # noqa: E402

import dyadic  # noqa: E402
from dyadic.bench.timing import capture_graph, held_event_times  # noqa: E402

V, K, W, T = 129280, 5, 32, 0.7  # vocabulary, draft depth, top-k width, temperature
LOGITS_T, LOGITS_TOP_P = 0.8, 0.9  # the verify(logits=True) cases' sampling parameters
BANDWIDTH = 4.2e12  # B/s, for floor_us
L2_BYTES = 50 * 2**20  # the H200's L2 cache, for the cold (rotated-input) cases
METRICS = ("graph_dev_us", "eager_host_us", "floor_us")
POLICIES = ("standard", "floor-first")

Case = collections.namedtuple("Case", "name make nbytes graph calls eager",
                              defaults=(1, True))
Case.__doc__ = """name; make() -> the zero-argument call; nbytes: the bytes one call must
move at least once (None: no such bound); graph: whether it can be captured; calls: the
dyadic calls one invocation of the call makes (times are divided by it); eager: whether
eager host time is measured."""


class Inputs:
    """The tensors of the cases at batch B, each made on first use from its own seeded
    generator (a failing input fails only the cases that use it)."""

    def __init__(self, batch, vocab=V, k=K, device="cuda", backend="cuda", seed=0):
        self.B, self.V, self.k, self.device, self.backend = batch, vocab, k, device, backend
        self.seed = seed

    def randn(self, stream, *shape):
        g = torch.Generator(device=self.device).manual_seed(
            self.seed * 1_000_003 + self.B * 101 + stream)
        return torch.randn(*shape, device=self.device, generator=g)

    def empty(self, *shape, dtype=torch.int32):
        return torch.empty(*shape, dtype=dtype, device=self.device)

    @functools.cached_property
    def z(self):
        return self.randn(1, self.B, self.V)

    @functools.cached_property
    def logits(self):
        return (3 * self.z).to(torch.bfloat16)

    @functools.cached_property
    def p32(self):
        return torch.softmax(3 * self.z, -1)

    @functools.cached_property
    def keys(self):
        def zero():
            return torch.zeros(self.B, dtype=torch.int32, device=self.device)
        return dyadic.Keys(seed=torch.arange(self.B, dtype=torch.int64, device=self.device),
                           generation=zero(), round=zero(), position=zero())

    @functools.cached_property
    def p(self):
        return torch.softmax(3 * self.randn(2, self.B, self.k + 1, self.V), -1)

    @functools.cached_property
    def qd(self):
        zk = self.z[:, None, :].expand(self.B, self.k, self.V)
        return torch.softmax(3 * zk + 0.5 * self.randn(3, self.B, self.k, self.V), -1)

    @functools.cached_property
    def q_dense(self):
        return dyadic.allocate(self.qd, backend=self.backend)

    @functools.cached_property
    def q_top(self):
        return dyadic.allocate(self.qd, top_k=W, backend=self.backend)

    @functools.cached_property
    def q32(self):
        return dyadic.allocate(self.p32, top_k=W, backend=self.backend)

    @functools.cached_property
    def draft_dense(self):
        """Drafts sampled from q's counts (never a zero-count token)."""
        w = self.q_dense.counts.view(torch.int32).reshape(-1, self.V).float()
        g = torch.Generator(device=self.device).manual_seed(self.seed + 7)
        return torch.multinomial(w, 1, generator=g).reshape(self.B, self.k).to(torch.int32)

    @functools.cached_property
    def draft_top(self):
        return self.q_top.ids[..., 0].contiguous()

    @functools.cached_property
    def greedy(self):
        return torch.arange(self.B, device=self.device) % 2 == 0

    def verdict_out(self):
        return {"accepted": self.empty(self.B), "tokens": self.empty(self.B, self.k + 1),
                "status": self.empty(self.B)}


def cold_sets(per_set_bytes):
    """How many input sets a cold case rotates through: enough that the sets together
    are three times the L2 cache (so no call finds its inputs there), at least 2."""
    return max(2, min(64, -(-3 * L2_BYTES // per_set_bytes)))


def verify_cold(inp, workload, sparse, check, ragged=False, logits=False):
    """``make`` of a verify case on ``cold_sets`` input sets called one after another
    (one invocation = that many calls; the invocation's ``step(j)`` makes call j alone).
    workload "close": p = softmax(3 z), q = softmax(3 z + 0.5 noise); "indep": p = softmax(3 z1), q = softmax(3 z2); z ~ N(0, 1)
    per request and position; drafts drawn from q's counts (dense) or q's top id
    (top-32).  ragged: ``num_drafts`` = b mod (k + 1) for request b (a device array).
    logits: the target is the logits 3 z in bfloat16 instead of p, verified with
    ``logits=True`` and per-request device tensors temperature ``LOGITS_T`` (float64)
    and top_p ``LOGITS_TOP_P`` (float32), as an engine's captured graph holds them."""
    B, nv, k = inp.B, inp.V, inp.k
    per_set = B * nv * ((k + 1) * 2 + k * 4) if logits else B * (2 * k + 1) * nv * 4

    def make():
        calls = []
        for r in range(cold_sets(per_set)):
            s = Inputs(B, nv, k, inp.device, inp.backend, seed=inp.seed * 7919 + 17 + r)
            z = s.randn(11, B, k + 1, nv)
            target = (3 * z).to(torch.bfloat16) if logits else torch.softmax(3 * z, -1)
            zq = z[:, :k] if workload == "close" else s.randn(12, B, k, nv)
            s.qd = torch.softmax(3 * zq + 0.5 * s.randn(13, B, k, nv), -1)
            d, q = (s.draft_top, s.q_top) if sparse else (s.draft_dense, s.q_dense)
            del s.qd, z, zq
            calls.append((target, d, q, s.keys, s.verdict_out()))
        be = inp.backend
        nd = (torch.arange(B, device=inp.device, dtype=torch.int32) % (k + 1)) if ragged else None
        kw = {}
        if logits:
            kw = dict(logits=True, temperature=torch.full(
                (B,), LOGITS_T, dtype=torch.float64, device=inp.device), top_p=torch.full(
                (B,), LOGITS_TOP_P, dtype=torch.float32, device=inp.device))

        def step(j):  # the call on input set j alone
            target, d, q, keys, out = calls[j]
            return dyadic.verify(target, d, q, keys, backend=be, check=check, out=out,
                                 num_drafts=nd, **kw)

        def run():
            for j in range(len(calls)):
                v = step(j)
            return v
        run.calls = len(calls)
        run.step = step
        return run
    return make


def cases(inp):
    """The cases at ``inp``'s batch, in table order, as ``Case`` rows (nothing is built
    until ``make`` is called)."""
    B, nv, k, be, u32 = inp.B, inp.V, inp.k, inp.backend, torch.uint32
    target = B * (k + 1) * nv * 4

    def trivial():
        x = torch.zeros(1, device=inp.device)
        return lambda: x.add_(1)

    def propose(top_k, policy="standard", top_p=None):
        def make():
            w = min(top_k or nv, nv)
            out = {"tokens": inp.empty(B), "counts": inp.empty(B, w, dtype=u32),
                   "status": inp.empty(B)}
            if top_k:
                out["ids"] = inp.empty(B, w)
            x, keys = inp.logits, inp.keys
            kw = {} if top_p is None else {"top_p": torch.full(
                (B,), top_p, dtype=torch.float32, device=inp.device)}
            return lambda: dyadic.propose(x, keys, top_k=top_k, temperature=T, policy=policy,
                                          backend=be, check=False, out=out, **kw)
        return make

    def allocate(top_k):
        def make():
            w = min(top_k or nv, nv)
            out = {"counts": inp.empty(B, w, dtype=u32), "status": inp.empty(B)}
            if top_k:
                out["ids"] = inp.empty(B, w)
            x = inp.p32
            return lambda: dyadic.allocate(x, top_k=top_k, backend=be, check=False, out=out)
        return make

    def draw():
        out, q, keys = {"tokens": inp.empty(B)}, inp.q32, inp.keys
        return lambda: dyadic.draw(q, keys, backend=be, check=False, out=out)

    def verify(sparse, check, greedy=False):
        def make():
            p, keys, out = inp.p, inp.keys, inp.verdict_out()
            d, q = (inp.draft_top, inp.q_top) if sparse else (inp.draft_dense, inp.q_dense)
            g = inp.greedy if greedy else None
            return lambda: dyadic.verify(p, d, q, keys, greedy=g, backend=be, check=check,
                                         out=out)
        return make

    def torch_proposal():
        x = inp.logits

        def run():
            v, i = torch.topk(x, W, dim=-1)
            j = torch.multinomial(torch.softmax(v.float() / T, -1), 1)
            return i.gather(-1, j)
        return run

    def torch_verify():
        p, qd, d = inp.p, inp.qd, inp.draft_dense.long()[..., None]

        def run():
            pd = p[:, :k].gather(-1, d)[..., 0]
            qq = qd.gather(-1, d)[..., 0]
            acc = (torch.rand(B, k, device=p.device) * qq < pd).int().cumprod(-1).sum(-1)
            res = torch.clamp(p[:, :k] - qd, min=0)
            return acc, (res / torch.empty_like(res).exponential_()).argmax(-1)
        return run

    out = [Case("trivial_kernel", trivial, None, True),
           Case("propose_top32_bf16", propose(W), B * nv * 2, True),
           Case("propose_top32_bf16_top_p", propose(W, top_p=0.9), B * nv * 2, True)]
    out += [Case("propose_dense_bf16" + ("" if pol == "standard" else "_" + pol.replace("-", "_")),
                 propose(None, pol), B * nv * 6, True) for pol in POLICIES]
    out += [Case("propose_dense_bf16_top_p", propose(None, top_p=0.9), B * nv * 6, True)]
    out += [Case("allocate_dense_f32", allocate(None), B * nv * 8, True),
            Case("allocate_top32_f32", allocate(W), B * nv * 4, True),
            Case("draw_top32", draw, B * W * 8, True)]
    for sparse, q in ((False, "dense"), (True, "top32")):
        out += [Case(f"verify_k{k}_{q}", verify(sparse, False), target, True),
                Case(f"verify_k{k}_{q}_lazy", verify(sparse, "lazy"), None, True),
                Case(f"verify_k{k}_{q}_checked", verify(sparse, True), target, False)]
    for workload in ("close", "indep"):
        for sparse, q in ((False, "dense"), (True, "top32")):
            for check, tag in (("lazy", "_lazy"), (False, "")):
                out.append(Case(f"verify_k{k}_{q}{tag}_{workload}_cold",
                                verify_cold(inp, workload, sparse, check),
                                target if check is False else None, True, calls=None,
                                eager=False))
    for check, tag in (("lazy", "_lazy"), (False, "")):
        out.append(Case(f"verify_k{k}_dense{tag}_close_cold_ragged",
                        verify_cold(inp, "close", False, check, ragged=True), None, True,
                        calls=None, eager=False))
    for sparse, q in ((False, "dense"), (True, "top32")):
        for check, tag in (("lazy", "_lazy"), (False, "")):
            out.append(Case(f"verify_k{k}_logits_{q}{tag}_close_cold",
                            verify_cold(inp, "close", sparse, check, logits=True),
                            target // 2 if check is False else None, True, calls=None,
                            eager=False))
    for check, tag in (("lazy", "_lazy"), (False, "")):
        out.append(Case(f"verify_k{k}_logits_dense{tag}_close_cold_ragged",
                        verify_cold(inp, "close", False, check, ragged=True, logits=True),
                        None, True, calls=None, eager=False))
    out += [Case(f"verify_k{k}_dense_greedy", verify(False, False, greedy=True), target, True),
            Case("torch_top32_proposal", torch_proposal, B * nv * 2, True),
            Case(f"torch_verify_k{k}_dense", torch_verify, target, True)]
    return out


def graph_dev_us(fn, reps):
    """Median device time (us) of a CUDA-graph replay of ``fn``, the queue held, divided
    by ``fn.calls`` (the dyadic calls one invocation makes; 1 when absent)."""
    replay = capture_graph(fn)
    for _ in range(10):
        replay()
    h = held_event_times(replay, reps)
    us = statistics.median(h["times"]) * 1e6 / getattr(fn, "calls", 1)
    return round(us, 2) if h["held"] else f"{us:.1f} (not held)"


def eager_host_us(fn, reps, warmup=20):
    """Median host time (us) of one eager call of ``fn``, the launch queue idle."""
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize()  # untimed: each call finds the queue idle
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return round(statistics.median(ts) * 1e6, 2)


def kernel_metrics(events, calls):
    """``{"kernel_us NAME": us per call, "launches NAME": launches per call}`` of the CUDA
    events of a profile (objects with ``device_type``, ``name`` and ``device_time`` in us,
    as ``torch.profiler``'s) covering ``calls`` dyadic calls: per kernel, the median
    duration of its launches times its launches per call."""
    times = collections.defaultdict(list)
    for e in events:
        if e.device_type == torch.autograd.DeviceType.CUDA:
            times[e.name].append(e.device_time)
    out = {}
    for name, ts in sorted(times.items()):
        per_call = len(ts) / calls
        out[f"kernel_us {name}"] = round(statistics.median(ts) * per_call, 2)
        out[f"launches {name}"] = round(per_call, 3)
    return out


def kernel_us(fn, reps):
    """kernel_metrics of ``reps`` eager invocations of ``fn`` (``fn.calls`` dyadic calls
    each), after one that is not profiled."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    return kernel_metrics(prof.events(), reps * getattr(fn, "calls", 1))


def _error(e):
    return f"error: {type(e).__name__}: {e}"[:200]


def measure(case, B, reps, label, kernel_reps=0):
    """One row: the case's metrics (and, with ``kernel_reps``, its kernel_us over that
    many invocations), an error text in place of a value that failed."""
    row = {"label": label, "B": B, "case": case.name}
    try:
        fn = case.make()
    except Exception as e:  # noqa: BLE001 - recorded; the other cases still run
        row["graph_dev_us"] = row["eager_host_us"] = _error(e)
        if kernel_reps:
            row["kernel_us"] = _error(e)
    else:
        for metric, timer, ok in (("eager_host_us", eager_host_us, case.eager),
                                  ("graph_dev_us", graph_dev_us, case.graph)):
            if not ok:
                row[metric] = ("n/a: check=True synchronises" if metric == "graph_dev_us"
                               else "n/a: timed in graph replay only")
                continue
            try:
                row[metric] = timer(fn, reps)
            except Exception as e:  # noqa: BLE001
                row[metric] = _error(e)
        if kernel_reps:
            try:
                row.update(kernel_us(fn, kernel_reps))
            except Exception as e:  # noqa: BLE001
                row["kernel_us"] = _error(e)
    row["floor_us"] = None if case.nbytes is None else round(case.nbytes / BANDWIDTH * 1e6, 2)
    return row


def outside_modules():
    """``name: file`` of the loaded dyadic modules outside the folder that holds the
    imported dyadic package (a mixed install: e.g. old dyadic with new backends)."""
    top = os.path.dirname(os.path.dirname(os.path.realpath(dyadic.__file__))) + os.sep
    found = []
    for name, mod in list(sys.modules.items()):
        f = getattr(mod, "__file__", None)
        if name.startswith("dyadic.") and f and not os.path.realpath(f).startswith(top):
            found.append(f"{name}: {f}")
    return sorted(found)


def markdown(rows):
    """The rows as a Markdown table (one line per (B, case)), then, where rows have
    per-kernel times, a table of them (one line per (B, case, kernel))."""
    lines = ["| B | case | " + " | ".join(METRICS) + " |", "|---" * (2 + len(METRICS)) + "|"]
    for r in rows:
        cells = ["-" if r.get(m) is None else str(r[m]) for m in METRICS]
        lines.append(f"| {r['B']} | {r['case']} | " + " | ".join(cells) + " |")
    kern = [(r, m[len("kernel_us "):]) for r in rows for m in r if m.startswith("kernel_us ")]
    failed = [r for r in rows if "kernel_us" in r]
    if kern or failed:
        lines += ["", "| B | case | kernel | device us per call | launches per call |",
                  "|---|---|---|---|---|"]
        lines += [f"| {r['B']} | {r['case']} | {n} | {r['kernel_us ' + n]} | "
                  f"{r['launches ' + n]} |" for r, n in kern]
        lines += [f"| {r['B']} | {r['case']} | - | {r['kernel_us']} | - |" for r in failed]
    return "\n".join(lines)


def _ints(s):
    return [int(x) for x in s.split(",") if x.strip()]


def parse(argv=None):
    p = argparse.ArgumentParser(prog="python -m dyadic.bench gpu", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=_ints, default=[1, 4, 16, 64], help="batch sizes B")
    p.add_argument("--vocab", type=int, default=V, help=f"vocabulary size V (default {V})")
    p.add_argument("--k", type=int, default=K, help=f"draft depth for verify (default {K})")
    p.add_argument("--reps", type=int, default=200,
                   help="timed calls per metric, median taken (default 200)")
    p.add_argument("--out", default=".", help="directory for gpu-LABEL.json")
    p.add_argument("--label", default="run", help="names the run in its rows and file name")
    p.add_argument("--cases", default="", help="comma-separated substrings: only the cases "
                   "whose name contains one of them; an entry =NAME takes the case NAME "
                   "alone (default: every case)")
    p.add_argument("--kernels", type=int, default=0, metavar="N",
                   help="also time each kernel over N eager invocations under "
                   "torch.profiler (default 0: not timed)")
    return p.parse_args(argv)


def selects(entry, name):
    """Whether a --cases entry takes the case ``name``: "=NAME" exactly, else a substring."""
    if entry.startswith("="):
        return entry[1:] == name
    return bool(entry) and entry in name


def cannot_run(prog):
    """Why ``python -m dyadic.bench PROG`` cannot time this tree in this process (no CUDA
    GPU or no "cuda" backend; dyadic modules loaded from outside the imported package),
    or None."""
    if not torch.cuda.is_available() or "cuda" not in dyadic.available_backends():
        return f"dyadic.bench {prog}: needs a CUDA GPU and dyadic's \"cuda\" backend"
    mixed = outside_modules()  # the backends are loaded now
    if mixed:
        return (f"dyadic.bench {prog}: dyadic modules loaded from outside the imported "
                "dyadic package (install the tree to time, e.g. pip install --no-deps "
                "--target DIR):\n  " + "\n  ".join(mixed))
    return None


def main(argv=None):
    a = parse(argv)
    why = cannot_run("gpu")
    if why:
        print(why, file=sys.stderr)
        return 2
    rows = []
    for B in a.batch:
        inp = Inputs(B, a.vocab, a.k)
        for case in cases(inp):
            if a.cases and not any(selects(c, case.name) for c in a.cases.split(",")):
                continue
            rows.append(measure(case, B, a.reps, a.label, a.kernels))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        del inp
        torch.cuda.empty_cache()
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, f"gpu-{a.label}.json")
    with open(path, "w") as f:
        json.dump(rows, f, indent=1)
    print(f"dyadic {dyadic.__version__} from {os.path.dirname(dyadic.__file__)}, torch "
          f"{torch.__version__}, {torch.cuda.get_device_name()}, label {a.label!r}, "
          f"V={a.vocab}, k={a.k}, reps={a.reps}\n")
    print(markdown(rows))
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
