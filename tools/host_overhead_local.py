"""Host (Python) overhead of eager backend="cuda" calls, measured WITHOUT a GPU.

The CUDA parts are faked so that only dyadic's own Python work is timed:

- a fake ``cupy`` module in ``sys.modules`` (device 0, the default stream, RawModule /
  get_function returning objects whose ``.kernel.ptr`` is a nonzero int, ``cupy.zeros``
  scratch buffers with fixed fake addresses);
- a fake driver in ``launch._STATE["lib"]``: ``cuLaunchKernel`` is a Python no-op
  returning 0 (in --trace mode it records the kernel, grid, block, stream and every
  8-byte parameter word);
- torch CPU tensors pass as CUDA tensors: ``torch.Tensor.is_cuda = True``,
  ``get_device() -> 0``, ``torch._C._cuda_getCurrentRawStream(dev) -> 0``,
  ``torch.cuda.current_device() -> 0``.  Tensor methods (data_ptr, dim, ...) are the
  real C methods of CPU tensors.

These are local fake-launch numbers: the driver call (several microseconds per launch
on a GPU host) and CUDA tensor attribute costs are not included; compare before/after only.

python tools/host_overhead_local.py                  # timings of this tree
python tools/host_overhead_local.py --compare REV    # side by side with git REV (worktree)
python tools/host_overhead_local.py --trace          # JSON trace of launches / errors
python tools/host_overhead_local.py --compare REV --trace-diff   # traces must be equal
python tools/host_overhead_local.py --profile propose_b1          # cProfile of one case
"""
import argparse
import ctypes
import importlib.abc
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import time
import types


def _trusted_dy(counts, ids=None, *, vocab_size, policy="standard", trusted=True):
    """A Dyadic over arrays taken as they are (timing inputs; zero rows are never read
    as a distribution)."""
    from dyadic._types import trusted_dyadic
    return trusted_dyadic(counts, ids, vocab_size, policy)


HERE = os.path.dirname(os.path.abspath(__file__))
V = 129280
K = 5


# ----------------------------------------------------------------- import a given tree
class _TreeFinder(importlib.abc.MetaPathFinder):
    """Import package ``name`` from ROOT/dyadic and ``name.backends`` from ROOT/backends
    (dyadic's hot-path modules import each other relatively: two trees can live in one
    process under two names)."""

    def __init__(self, root, name="dyadic"):
        self.map = {name: os.path.join(root, "dyadic"),
                    name + ".backends": os.path.join(root, "backends")}

    def find_spec(self, fullname, path=None, target=None):
        d = self.map.get(fullname)
        if d is None:
            return None
        return importlib.util.spec_from_file_location(
            fullname, os.path.join(d, "__init__.py"), submodule_search_locations=[d])


# ------------------------------------------------------------------------- the fakes
class _Mem:
    ptr = 0


class FakeND:
    """cupy.ndarray stand-in: scratch buffers at fixed fake device addresses."""
    _next = [0x7E0000000000]

    def __init__(self, n, dtype=None):
        self.nbytes = 8 * int(n)
        self.data = _Mem()
        self.data.ptr = FakeND._next[0]
        FakeND._next[0] += (self.nbytes + 0xFFFF) & ~0xFFFF


class _Host(FakeND):
    """cupy.asarray of a NumPy array: the host buffer's address stands for the device's."""

    def __init__(self, a):
        import numpy as np
        self.a = np.ascontiguousarray(a)
        self.nbytes = self.a.nbytes
        self.data = _Mem()
        self.data.ptr = self.a.ctypes.data

    def get(self):
        return self.a.copy()


class _Stream:
    ptr = 0

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return None


class _Func:
    def __init__(self, name, handle):
        self.name = name
        self.kernel = types.SimpleNamespace(ptr=handle)

    def __call__(self, *a, **k):
        raise AssertionError("the CuPy launch path should not run in this harness")


HANDLES = {}  # handle -> kernel name


class _RawModule:
    def __init__(self, code=None, options=()):
        pass

    def compile(self):
        pass

    def get_function(self, name):
        h = 0x1000 + 0x10 * (len(HANDLES) + 1)
        HANDLES[h] = name
        return _Func(name, h)


def fake_cupy():
    cp = types.ModuleType("cupy")
    cp.ndarray = FakeND
    cp.uint64 = "uint64"
    cp.zeros = lambda n, dtype=None: FakeND(n, dtype)
    cp.RawModule = _RawModule
    cp.asarray = _Host
    stream = _Stream()
    rt = types.SimpleNamespace(
        getDevice=int,  # C callable returning 0 (the real one is C too)
        getDeviceCount=lambda: 1, setDevice=lambda d: None,
        getDeviceProperties=lambda d: {"multiProcessorCount": 132},
        memsetAsync=lambda *a: None)
    cp.cuda = types.SimpleNamespace(
        runtime=rt, get_current_stream=lambda: stream, ExternalStream=lambda h: _Stream(),
        Device=lambda d: _Stream())
    return cp


def _param_kinds(root):
    """For every __global__ kernel (parsed from the sources), one bool per parameter:
    whether it is a pointer (its words are addresses, named in traces, not compared)."""
    out = {}
    d = os.path.join(root, "backends", "cuda")
    pat = re.compile(r"__global__\s+void\s+(?:__\w+__\([^)]*\)\s*)*(\w+)\s*\(([^)]*)\)")
    for fn in os.listdir(d):
        if fn.endswith((".cu", ".cuh")):
            with open(os.path.join(d, fn)) as f:
                for m in pat.finditer(f.read()):
                    out[m.group(1)] = tuple("*" in a for a in m.group(2).split(",") if a.strip())
    return out


_KINDS = {}  # kernel -> pointer flags of its parameters (trace mode)


class FakeDriver:
    """cuLaunchKernel: returns 0; in trace mode records every launch."""

    def __init__(self, trace=None, kinds=None):
        self.trace = trace
        self.kinds = kinds or {}  # kernel -> pointer flags of its parameters
        if trace is None:
            self.cuLaunchKernel = lambda *a: 0

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        name = HANDLES[f.value]
        n = len(self.kinds[name])
        pp = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
        words = []
        for i in range(n):  # the slots are consecutive 8-byte words; stop where they end
            if pp[i] != pp[0] + 8 * i:  # (a kernel source edited to more parameters)
                words.append("end of slots")
                break
            words.append(ctypes.c_uint64.from_address(pp[i]).value)
        self.trace.append({"kernel": name, "grid": [int(gx), int(gy), int(gz)],
                           "block": [int(bx), int(by), int(bz)], "smem": smem,
                           "stream": getattr(stream, "value", stream) or 0, "words": words})
        return 0


def install(root, trace=None, name="dyadic"):
    """Fakes in place, dyadic imported from ``root`` as package ``name``; returns
    (dyadic, torch)."""
    sys.meta_path.insert(0, _TreeFinder(root, name))
    if "cupy" not in sys.modules:
        sys.modules["cupy"] = fake_cupy()
    import torch
    torch.Tensor.is_cuda = True  # CPU tensors pass the CUDA checks
    torch.Tensor.get_device = int  # t.get_device() -> 0 (a type: not bound as a method)
    torch._C._cuda_getCurrentRawStream = (0).__mul__  # (dev) -> 0: the default stream
    torch.cuda.current_device = int
    torch.cuda.is_current_stream_capturing = bool  # () -> False
    dyadic = importlib.import_module(name)
    if name != "dyadic":  # the backend registry names modules absolutely: this tree's
        reg = importlib.import_module(name + "._backend")
        reg._REGISTRY = {k: (m.replace("dyadic.", name + ".", 1), *rest)
                         for k, (m, *rest) in reg._REGISTRY.items()}
    cupy_backend = importlib.import_module(name + ".backends.cuda.cupy_backend")
    launch = importlib.import_module(name + ".backends.cuda.launch")
    assert cupy_backend.__file__.startswith(root), cupy_backend.__file__
    cupy_backend._launch_setup()
    if trace is not None:
        _KINDS.update(_param_kinds(root))
    launch.set_driver(FakeDriver(trace, _KINDS if trace is not None else None))
    launch.MODE = "driver"
    # the first torch input dyadic sees is classified by its device (cpu here); later
    # ones by exact type and is_cuda: show it one host tensor first (reference backend)
    dyadic.allocate(torch.ones(1, 2), backend="reference")
    return dyadic, torch


# ---------------------------------------------------------------------------- cases
def make_inputs(torch, dyadic, B, seed=0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(B, V, generator=g)
    d = {"logits": (3 * z).to(torch.bfloat16), "logits32": 3 * z,
         "probs": torch.softmax(3 * z, -1),
         "keys": dyadic.Keys(seed=torch.randint(0, 2**62, (B,), generator=g),
                             generation=torch.randint(0, 2**30, (B,), generator=g).int(),
                             round=torch.randint(0, 2**30, (B,), generator=g).int(),
                             position=torch.randint(0, 2**30, (B,), generator=g).int()),
         "p": torch.softmax(torch.randn(B, K + 1, V, generator=g), -1),
         "draft": torch.randint(0, V, (B, K), generator=g, dtype=torch.int32)}
    e = lambda *s, dt=torch.int32: torch.zeros(*s, dtype=dt)  # noqa: E731
    from dyadic._types import trusted_dyadic as td  # zero rows: timing only, never read
    d["qdy"] = td(e(B, K, V, dt=torch.uint32), None, V, "standard")
    d["qsp"] = td(e(B, K, 32, dt=torch.uint32), e(B, K, 32), V, "standard")
    d["q1"] = td(e(B, 32, dt=torch.uint32), e(B, 32), V, "standard")
    d["pout"] = {"tokens": e(B), "counts": e(B, 32, dt=torch.uint32), "ids": e(B, 32),
                 "status": e(B)}
    d["vout"] = {"accepted": e(B), "tokens": e(B, K + 1), "status": e(B)}
    d["aout"] = {"counts": e(B, 32, dt=torch.uint32), "ids": e(B, 32), "status": e(B)}
    d["dense_out"] = {"counts": e(B, V, dt=torch.uint32), "status": e(B)}
    d["host_keys"] = dyadic.Keys(seed=7, position=3)
    d["greedy"] = torch.zeros(B, dtype=torch.bool)
    d["dout"] = {"tokens": e(B)}
    return d


def timed_cases(dyadic, d):
    """The eager hot path (check=False / "lazy", device keys, out=)."""
    return {
        "propose_top32_bf16": lambda: dyadic.propose(
            d["logits"], d["keys"], top_k=32, temperature=0.7, backend="cuda", check=False,
            out=d["pout"]),
        "verify_false_dense": lambda: dyadic.verify(
            d["p"], d["draft"], d["qdy"], d["keys"], backend="cuda", check=False,
            out=d["vout"]),
        "verify_lazy_dense": lambda: dyadic.verify(
            d["p"], d["draft"], d["qdy"], d["keys"], backend="cuda", check="lazy",
            out=d["vout"]),
        "allocate_top32": lambda: dyadic.allocate(
            d["probs"], top_k=32, backend="cuda", check=False, out=d["aout"]),
        "allocate_dense": lambda: dyadic.allocate(
            d["probs"], backend="cuda", check=False, out=d["dense_out"]),
        "draw_sparse": lambda: dyadic.draw(d["q1"], d["keys"], backend="cuda", check=False,
                                           out=d["dout"]),
        # calls the fast path declines: the full path (host keys uploaded; greedy flags)
        "propose_host_keys": lambda: dyadic.propose(
            d["logits"], d["host_keys"], top_k=32, temperature=0.7, backend="cuda",
            check=False, out=d["pout"]),
        "verify_greedy": lambda: dyadic.verify(
            d["p"], d["draft"], d["qdy"], d["keys"], greedy=d["greedy"], backend="cuda",
            check=False, out=d["vout"]),
    }


def run_timings(trees, torch, reps, batches, block=50):
    """Host time per call of every case in every tree (``{label: dyadic module}``, all in
    this process).  Cases and trees take turns in blocks of ``block`` calls, so that a
    slow spell of the machine (a shared VM) hits all of them alike.  Returns
    {case: {label: (median per call, fastest block's mean per call)}} in us."""
    fns = {}
    for B in batches:
        for label, dyadic in trees.items():
            d = make_inputs(torch, dyadic, B)
            for name, fn in timed_cases(dyadic, d).items():
                fns[(f"{name} B={B}", label)] = fn
    for fn in fns.values():
        for _ in range(200):
            fn()
    pc = time.perf_counter
    ts = {key: [] for key in fns}
    blocks = {key: [] for key in fns}
    for _ in range(max(1, reps // block)):
        for key, fn in fns.items():
            t = ts[key]
            b0 = pc()
            for _ in range(block):
                t0 = pc()
                fn()
                t.append(pc() - t0)
            blocks[key].append((pc() - b0) / block)
    out = {}
    for (case, label), t in ts.items():
        out.setdefault(case, {})[label] = (statistics.median(t) * 1e6,
                                           min(blocks[(case, label)]) * 1e6)
    return out


# ---------------------------------------------------------------------------- trace
def trace_cases(dyadic, torch):
    """Valid and invalid calls (structural rules) whose launches / errors are compared."""
    B = 4
    d = make_inputs(torch, dyadic, B, seed=1)
    Keys = dyadic.Keys
    kd = d["keys"]
    i32 = lambda *s: torch.zeros(*s, dtype=torch.int32)  # noqa: E731
    cases = {}

    def P(name, x=None, keys=None, **kw):
        kw.setdefault("backend", "cuda")
        cases["propose:" + name] = lambda: dyadic.propose(
            d["logits"] if x is None else x, kd if keys is None else keys, **kw)

    def Vf(name, target=None, draft=None, q="dense", keys=None, **kw):
        kw.setdefault("backend", "cuda")
        qq = {"dense": d["qdy"], "sparse": d["qsp"], None: None}.get(q, q) \
            if isinstance(q, (str, type(None))) else q
        cases["verify:" + name] = lambda: dyadic.verify(
            d["p"] if target is None else target, d["draft"] if draft is None else draft, qq,
            kd if keys is None else keys, **kw)

    def A(name, x=None, **kw):
        kw.setdefault("backend", "cuda")
        cases["allocate:" + name] = lambda: dyadic.allocate(d["probs"] if x is None else x, **kw)

    def D(name, q=None, keys=None, **kw):
        kw.setdefault("backend", "cuda")
        cases["draw:" + name] = lambda: dyadic.draw(d["q1"] if q is None else q,
                                                    kd if keys is None else keys, **kw)

    po, vo, ao = d["pout"], d["vout"], d["aout"]
    g8 = torch.Generator().manual_seed(8)
    k8 = {"p": torch.softmax(torch.randn(B, 9, V, generator=g8), -1),
          "draft": torch.randint(0, V, (B, 8), generator=g8, dtype=torch.int32), None: None,
          "dense": _trusted_dy(torch.zeros(B, 8, V, dtype=torch.uint32), None, vocab_size=V,
                                 trusted=True),
          "sparse": _trusted_dy(torch.zeros(B, 8, 32, dtype=torch.uint32), i32(B, 8, 32),
                                  vocab_size=V, trusted=True)}
    for chk in (False, True):
        P(f"top32 bf16 out chk={chk}", top_k=32, temperature=0.7, check=chk, out=po)
        P(f"top32 f32 chk={chk}", x=d["logits32"], top_k=32, check=chk)
        P(f"top64 chk={chk}", top_k=64, check=chk)
        P(f"dense chk={chk}", top_k=None, check=chk)
        P(f"bias1 chk={chk}", top_k=32, bias=torch.zeros(V), check=chk)
        P(f"biasB bf16 chk={chk}", top_k=32, bias=torch.zeros(B, V, dtype=torch.bfloat16),
          check=chk)
        P(f"temp tensor chk={chk}", top_k=32, temperature=torch.full((B,), 0.5), check=chk)
        P(f"temp 0 chk={chk}", top_k=32, temperature=0, check=chk)
        P(f"floor-first chk={chk}", top_k=32, policy="floor-first", check=chk, out=po)
        P(f"host keys chk={chk}", keys=Keys(seed=7, position=3), top_k=32, check=chk, out=po)
        P(f"keys len1 chk={chk}", keys=Keys(seed=torch.tensor([5]), generation=i32(1),
                                           round=i32(B), position=i32(B)), check=chk, out=po)
        P(f"keys u32/i64 chk={chk}", keys=Keys(seed=torch.zeros(B, dtype=torch.uint64),
                                               generation=torch.zeros(B, dtype=torch.int64),
                                               round=torch.zeros(B, dtype=torch.uint32),
                                               position=i32(B)), check=chk, out=po)
        P(f"keys mixed chk={chk}", keys=Keys(seed=torch.zeros(B, dtype=torch.int64),
                                             generation=0, round=i32(B), position=3),
          check=chk, out=po)
        P(f"keys 2d chk={chk}", keys=Keys(seed=torch.zeros(B, 1, dtype=torch.int64)),
          check=chk, out=po)
        P(f"keys noncontig chk={chk}", keys=Keys(seed=torch.zeros(B, 2, dtype=torch.int64)[:, 0]),
          check=chk, out=po)
        P(f"keys i16 chk={chk}", keys=Keys(seed=torch.zeros(B, dtype=torch.int16)), check=chk,
          out=po)
        P(f"keys float chk={chk}", keys=Keys(seed=torch.zeros(B)), check=chk, out=po)
        P(f"keys len3 chk={chk}", keys=Keys(seed=torch.zeros(3, dtype=torch.int64)), check=chk,
          out=po)
        P(f"keys notkeys chk={chk}", keys=(1, 2), check=chk, out=po)
        P(f"out bad shape chk={chk}", top_k=16, check=chk, out=po)
        P(f"out bad dtype chk={chk}", top_k=32, check=chk,
          out=dict(po, counts=i32(B, 32)))
        P(f"out partial chk={chk}", top_k=32, check=chk, out={"status": i32(B)})
        P(f"x 3d chk={chk}", x=d["logits"].reshape(2, 2, V), check=chk)
        P(f"x f64 chk={chk}", x=d["logits"].double(), check=chk)
        P(f"x noncontig chk={chk}", x=d["logits32"].t().contiguous().t(), check=chk)
        P(f"x scalar chk={chk}", x=torch.tensor(1.0), check=chk)
        P(f"x V0 chk={chk}", x=torch.zeros(B, 0), check=chk)
        P(f"topk 0 chk={chk}", top_k=0, check=chk)
        P(f"topk bool chk={chk}", top_k=True, check=chk)
        P(f"topk float chk={chk}", top_k=3.0, check=chk)
        P(f"topk big chk={chk}", x=d["logits"][:, :20].contiguous(), top_k=32, check=chk)
        P(f"policy bad chk={chk}", policy="nope", check=chk)
        P(f"temp neg chk={chk}", temperature=-1.0, check=chk)
        P(f"temp nan chk={chk}", temperature=float("nan"), check=chk)
        P(f"temp tensor bad shape chk={chk}", temperature=torch.ones(3), check=chk)
        P(f"temp list chk={chk}", temperature=[0.5] * B, check=chk)
        P(f"bias bad chk={chk}", bias=torch.zeros(V + 1), check=chk)
        P(f"bias bad2 chk={chk}", bias=torch.zeros(3, V), check=chk)
        P(f"backend bad chk={chk}", backend="nope", check=chk)
        for q in ("dense", "sparse", None):
            Vf(f"q={q} out chk={chk}", q=q, check=chk, out=vo)
            Vf(f"q={q} lazy", q=q, check="lazy", out=vo)
            # k + 1 = 9 > 8: check=False takes dc_v1 + dc_v2, not dc_vone
            Vf(f"k=8 q={q} chk={chk}", target=k8["p"], draft=k8["draft"], q=k8[q], check=chk)
            Vf(f"k=8 q={q} lazy", target=k8["p"], draft=k8["draft"], q=k8[q], check="lazy")
        Vf(f"greedy chk={chk}", greedy=torch.zeros(B, dtype=torch.bool), check=chk)
        Vf(f"greedy lazy chk={chk}", greedy=torch.zeros(B, dtype=torch.bool), check="lazy")
        Vf(f"greedy bad dtype chk={chk}", greedy=i32(B), check=chk)
        Vf(f"greedy bad shape chk={chk}", greedy=torch.zeros(3, dtype=torch.bool), check=chk)
        Vf(f"draft i64 chk={chk}", draft=d["draft"].long(), check=chk)
        Vf(f"draft float chk={chk}", draft=d["draft"].float(), check=chk)
        Vf(f"draft shape chk={chk}", draft=d["draft"][:, :3], check=chk)
        Vf(f"draft noncontig chk={chk}", draft=d["draft"].t().contiguous().t(), check=chk)
        Vf(f"draft oob chk={chk}", draft=torch.full((B, K), V, dtype=torch.int32), check=chk)
        Vf(f"target bf16 chk={chk}", target=d["p"].bfloat16(), check=chk)
        Vf(f"target 2d chk={chk}", target=d["p"][:, 0], check=chk)
        Vf(f"target k1=0 chk={chk}", target=d["p"][:, :0], draft=i32(B, 0), check=chk)
        Vf(f"target noncontig chk={chk}", target=d["p"].transpose(0, 1).contiguous()
           .transpose(0, 1), check=chk)
        Vf(f"k=64 chk={chk}", target=torch.zeros(1, 65, 8), draft=i32(1, 64), q=None,
           keys=Keys(1), check=chk)
        Vf(f"q wrong vocab chk={chk}", q=_trusted_dy(torch.zeros(B, K, 8, dtype=torch.uint32),
                                                       None, vocab_size=8, trusted=True),
           check=chk)
        Vf(f"q wrong batch chk={chk}", q=_trusted_dy(torch.zeros(B, 3, V, dtype=torch.uint32),
                                                       None, vocab_size=V, trusted=True),
           check=chk)
        Vf(f"q not dyadic chk={chk}", q=torch.zeros(B, K, V), check=chk)
        Vf(f"q i32 counts chk={chk}", q=_trusted_dy(i32(B, K, V), None, vocab_size=V,
                                                      trusted=True), check=chk)
        Vf(f"host keys chk={chk}", keys=Keys(seed=3, position=2**32 - 3), check=chk)
        Vf(f"keys len1 chk={chk}", keys=Keys(seed=torch.tensor([5]), position=i32(1)),
           check=chk, out=vo)
        Vf(f"out bad chk={chk}", check=chk, out=dict(vo, tokens=i32(B, K)))
        Vf(f"keys float chk={chk}", keys=Keys(seed=torch.zeros(B)), check=chk)
        A(f"top32 out chk={chk}", top_k=32, check=chk, out=ao)
        A(f"dense chk={chk}", check=chk)
        A(f"logits top32 chk={chk}", x=d["logits"], logits=True, top_k=32, temperature=0.5,
          check=chk)
        A(f"logits top100 chk={chk}", x=d["logits"], logits=True, top_k=100, check=chk)
        A(f"3d chk={chk}", x=d["probs"].reshape(2, 2, V), top_k=32, check=chk)
        A(f"temp w/o logits chk={chk}", temperature=0.5, check=chk)
        A(f"bias w/o logits chk={chk}", bias=torch.zeros(V), check=chk)
        A(f"temp0 logits chk={chk}", x=d["logits"], logits=True, temperature=0.0, check=chk)
        A(f"f64 chk={chk}", x=d["probs"].double(), check=chk)
        A(f"out bad chk={chk}", top_k=32, check=chk, out=dict(ao, ids=i32(B, 31)))
        D(f"sparse out chk={chk}", check=chk, out=d["dout"])
        D(f"dense chk={chk}", q=_trusted_dy(torch.zeros(B, 64, dtype=torch.uint32), None, vocab_size=64,
                                              trusted=True), check=chk)
        D(f"host keys chk={chk}", keys=Keys(seed=1, position=5), check=chk)
        D(f"keys float chk={chk}", keys=Keys(seed=torch.zeros(B)), check=chk)
        D(f"not dyadic chk={chk}", q=torch.zeros(B, 3), check=chk)
    Vf("check bad", check="yes")
    # NumPy inputs with backend="cuda": the host path uploads them (_Call)
    npd = {key: d[key].float().numpy() for key in ("logits", "probs", "p")}
    P("numpy", x=npd["logits"], keys=Keys(7, position=3), top_k=32)
    P("numpy dense", x=npd["logits"], keys=Keys(7, position=3), top_k=None)
    A("numpy", x=npd["probs"], top_k=32)
    Vf("numpy", target=npd["p"], draft=d["draft"].numpy(), q=None, keys=Keys(1))
    return d, cases


def _describe(x, names):
    """A result as plain data: tensors by (name if an input/output given, shape, dtype)."""
    import torch
    if isinstance(x, torch.Tensor):
        return ["tensor", names.get(id(x), "new"), list(x.shape), str(x.dtype)]
    if isinstance(x, (tuple, list)):
        return [_describe(a, names) for a in x]
    if x is None or isinstance(x, (int, float, str)):
        return x
    slots = getattr(type(x), "__slots__", None) or getattr(x, "__dataclass_fields__", None)
    if slots:
        return [type(x).__name__] + [_describe(getattr(x, s, None), names) for s in slots]
    return type(x).__name__


def recording_empty(torch, made):
    """``torch.empty`` for trace mode: zero-filled (deterministic status words), and the
    data pointer of each tensor appended to ``made``, so that launches can name the
    outputs a call allocated (by order) whatever the addresses look like."""
    zeros = torch.zeros

    def empty(*a, **k):
        t = zeros(*a, **k)
        made.append(t.data_ptr())
        return t

    return empty


def run_trace(dyadic, torch, trace, made):
    d, cases = trace_cases(dyadic, torch)
    names = {}
    for key in ("pout", "vout", "aout", "dout"):
        for k, t in d[key].items():
            names[id(t)] = f"{key}.{k}"
    ptrs = {}
    for key, val in d.items():
        ts = val.values() if isinstance(val, dict) else [val]
        for t in ts:
            if isinstance(t, torch.Tensor) and t.numel():
                ptrs[t.data_ptr()] = key
    for f in ("seed", "generation", "round", "position"):
        ptrs[getattr(d["keys"], f).data_ptr()] = "keys." + f
    out = {}
    for name, fn in cases.items():
        for rep in range(2):  # the second call takes the cached (hot) paths
            del trace[:]
            del made[:]
            try:
                res = ["ok", _describe(fn(), names)]
            except Exception as e:  # noqa: BLE001 - compared as text
                res = ["raise", type(e).__name__, str(e)]
            new = {p: f"new{j}" for j, p in enumerate(made)}
            for ln in trace:  # outputs this call allocated, by allocation order
                ln["words"] = [new.get(x, x) if isinstance(x, int) else x for x in ln["words"]]
            out[f"{name} #{rep}"] = {"result": res, "launches": list(trace)}
    # pointer parameters (by the kernel's signature, whatever the addresses look like):
    # known tensors by name, every other nonzero one by order of appearance within its
    # call (internal buffers are made in an order the trees may not share)
    for rec in out.values():
        anon = {}
        for ln in rec["launches"]:
            w, kinds = ln["words"], _KINDS[ln["kernel"]]
            for i, x in enumerate(w):
                if isinstance(x, int) and x and i < len(kinds) and kinds[i]:
                    w[i] = ptrs.get(x) or anon.setdefault(x, f"ptr{len(anon)}")
    return out


# ----------------------------------------------------------------------------- main
def child(args):
    root = os.path.abspath(args.root)
    trace = [] if args.trace else None
    dyadic, torch = install(root, trace)
    if args.trace:
        made = []
        torch.empty = recording_empty(torch, made)
        json.dump(run_trace(dyadic, torch, trace, made), sys.stdout, indent=0, sort_keys=True)
        return
    if args.profile:
        import cProfile
        import pstats
        name, _, b = args.profile.rpartition("_b")
        d = make_inputs(torch, dyadic, int(b))
        fn = timed_cases(dyadic, d)[name]
        for _ in range(200):
            fn()
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(1000):
            fn()
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(30)
        return
    print_timings(run_timings({"this tree": dyadic}, torch, args.reps, args.batch), args.reps)


def print_timings(res, reps):
    labels = list(next(iter(res.values())))
    print("local fake-launch host time per call, us: median of %d calls "
          "[fastest 50-call block's mean]" % reps)
    print("%-26s" % "case" + "".join("%24s" % lab for lab in labels)
          + ("   ratio of medians" if len(labels) == 2 else ""))
    for case, row in res.items():
        vals = [row[lab] for lab in labels]
        print("%-26s" % case + "".join("%14.2f [%6.2f]" % v for v in vals)
              + ("   %.2fx" % (vals[0][0] / vals[1][0]) if len(vals) == 2 else ""))


def _worktree(rev):
    repo = os.path.dirname(HERE)
    sha = subprocess.check_output(["git", "-C", repo, "rev-parse", rev], text=True).strip()
    path = f"/tmp/dyadic-hol-{sha[:12]}"
    if not os.path.isdir(path):
        subprocess.check_call(["git", "-C", repo, "worktree", "add", "--detach", path, sha],
                              stdout=subprocess.DEVNULL)
    return path, sha[:12]


def _run_child(root, extra):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--root", root] + extra
    return subprocess.check_output(cmd, text=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.dirname(HERE), help="tree to import dyadic from")
    ap.add_argument("--compare", metavar="REV", help="also time git REV (worktree), side by side")
    ap.add_argument("--reps", type=int, default=3000)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--trace", action="store_true")
    ap.add_argument("--trace-diff", action="store_true")
    ap.add_argument("--profile", metavar="CASE_bN")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child or args.profile or (args.trace and not args.compare) or not args.compare:
        return child(args)
    trees = [("this tree", os.path.abspath(args.root))]
    if args.compare:
        path, sha = _worktree(args.compare)
        trees.insert(0, (sha, path))
    if args.trace_diff:
        outs = [json.loads(_run_child(p, ["--trace"])) for _, p in trees]
        a, b = outs[0], outs[-1]
        bad = [k for k in a if a[k] != b.get(k)] + [k for k in b if k not in a]
        for k in bad[:20]:
            print("DIFF", k, json.dumps(a.get(k))[:600], "\n   vs", json.dumps(b.get(k))[:600])
        nl = sum(len(r["launches"]) for r in b.values())
        nr = sum(r["result"][0] == "raise" for r in b.values())
        print(f"trace: {len(b)} calls ({nr} raised, {nl} launches); {len(bad)} differ")
        return 1 if bad else 0
    mods = {}
    for i, (label, path) in enumerate(trees):
        mods[label], torch = install(path, None, "dyadic" if i == len(trees) - 1 else "dyadic_base")
    print_timings(run_timings(mods, torch, args.reps, args.batch), args.reps)


if __name__ == "__main__":
    sys.exit(main())
