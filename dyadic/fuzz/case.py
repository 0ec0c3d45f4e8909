"""A fuzz case: one primitive call described by plain arrays and JSON scalars.

A ``Case`` is self-contained: ``arrays`` holds every input (bfloat16 stored as
its uint16 bit pattern, ``params["dtype"] == "bfloat16"``), ``params`` holds
the scalars (JSON-able).  ``build`` turns it into a zero-argument call of the
public API for one backend; the call returns a dict of NumPy outputs.
"""

import json
import sys
from dataclasses import dataclass, field

import numpy as np

from .. import _backend
from .._backend import GPU_BACKENDS

PRIMITIVES = ("allocate", "propose", "draw", "verify", "philox")
#: Opt-in (``--primitives``): verify(logits=True) and propose / allocate with top_p /
#: min_p / per-row top_k, on the backends that implement them (inputs on the device
#: where the backend takes them there: cuda).
OPTIONAL_PRIMITIVES = ("verify_logits", "propose_filtered")
ALL_PRIMITIVES = PRIMITIVES + OPTIONAL_PRIMITIVES


@dataclass
class Case:
    primitive: str
    arrays: dict
    params: dict
    label: str = ""
    index: int = -1
    seed: int = 0
    extra: dict = field(default_factory=dict)

    def describe(self):
        shapes = ", ".join(f"{k}{list(v.shape)}" for k, v in sorted(self.arrays.items()))
        p = json.dumps(self.params, sort_keys=True)
        return f"{self.primitive} [{self.label}] {shapes} {p}"

    def size(self):
        return sum(int(a.size) for a in self.arrays.values())


def _torch():
    return sys.modules.get("torch") or _import_torch()


def _import_torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def _device_for(backend):
    """'cuda' when the backend is a GPU backend and torch sees a GPU, else None.

    Without a GPU (e.g. the Numba CUDA simulator) host arrays are passed as they are.
    """
    if backend not in GPU_BACKENDS:
        return None
    torch = _import_torch()
    if torch is not None and torch.cuda.is_available():
        return "cuda"
    return None


def float_input(a, dtype, backend):
    """The float input as the dtype it stands for (torch for bfloat16 / on GPU)."""
    dev = _device_for(backend)
    if dtype == "bfloat16":
        torch = _torch()
        if torch is None:
            raise _NeedsTorch("bfloat16 inputs need torch")
        t = torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
        return t.to(dev) if dev else t
    return _to_dev(a, dev)


def _to_dev(a, dev):
    if dev is None or a is None:
        return a
    return _torch().from_numpy(np.ascontiguousarray(a)).to(dev)


def any_input(a, backend):
    return _to_dev(a, _device_for(backend))


class _NeedsTorch(Exception):
    pass


def to_numpy(x):
    """Any output (NumPy, torch, cupy) as a NumPy array."""
    if x is None:
        return None
    if hasattr(x, "detach"):
        return x.detach().cpu().numpy()
    if hasattr(x, "get") and hasattr(x, "__cuda_array_interface__"):
        return x.get()
    return np.asarray(x)


def _keys(case, backend):
    import dyadic

    a = case.arrays
    return dyadic.Keys(seed=any_input(a["seed"], backend),
                       generation=any_input(a["generation"], backend),
                       round=any_input(a["round"], backend),
                       position=any_input(a["position"], backend))


def _temperature(case, backend):
    if "temperature" in case.arrays:
        return any_input(case.arrays["temperature"], backend)
    return case.params.get("temperature", 1.0)


def _bias(case, backend):
    b = case.arrays.get("bias")
    return None if b is None else float_input(b, case.params.get("bias_dtype", "float32"), backend)


def _dyadic_q(case, backend, prefix="q_"):
    import dyadic

    counts = case.arrays.get(prefix + "counts")
    if counts is None:
        return None
    ids = case.arrays.get(prefix + "ids")
    return dyadic.Dyadic(any_input(counts, backend), any_input(ids, backend),
                         vocab_size=case.params["vocab"], policy="external")


def build(case, backend):
    """A zero-argument callable running ``case`` on ``backend`` -> dict of NumPy outputs."""
    import dyadic

    a, p = case.arrays, case.params
    if case.primitive == "allocate":
        def call():
            q = dyadic.allocate(float_input(a["x"], p["dtype"], backend), logits=p["logits"],
                                temperature=_temperature(case, backend),
                                bias=_bias(case, backend), top_k=p["top_k"],
                                policy=p["policy"], backend=backend)
            return {"counts": to_numpy(q.counts), "ids": to_numpy(q.ids)}
    elif case.primitive == "propose":
        def call():
            tok, q = dyadic.propose(float_input(a["x"], p["dtype"], backend), _keys(case, backend),
                                    temperature=_temperature(case, backend),
                                    bias=_bias(case, backend), top_k=p["top_k"],
                                    policy=p["policy"], backend=backend)
            return {"tokens": to_numpy(tok), "counts": to_numpy(q.counts),
                    "ids": to_numpy(q.ids)}
    elif case.primitive == "draw":
        def call():
            tok = dyadic.draw(_dyadic_q(case, backend), _keys(case, backend), backend=backend)
            return {"tokens": to_numpy(tok)}
    elif case.primitive == "verify":
        def call():
            g, n = a.get("greedy"), a.get("num_drafts")
            v = dyadic.verify(any_input(a["target"], backend), any_input(a["draft"], backend),
                              _dyadic_q(case, backend), _keys(case, backend),
                              greedy=None if g is None else any_input(g.astype(bool), backend),
                              backend=backend,
                              **({} if n is None else {"num_drafts": any_input(n, backend)}))
            return {"accepted": to_numpy(v.accepted), "tokens": to_numpy(v.tokens),
                    "status": to_numpy(v.status)}
    elif case.primitive == "verify_logits":
        # inputs on the device where the backend verifies logits on GPU arrays (cuda,
        # numba), host arrays otherwise
        at = backend if _backend.get(backend).device_logits_verify else "cpu"

        def call():
            g, n = a.get("greedy"), a.get("num_drafts")
            opt = {} if n is None else {"num_drafts": any_input(n, at)}
            for name in ("top_k", "top_p", "min_p"):
                if name in a:
                    opt[name] = any_input(a[name], at)
            v = dyadic.verify(float_input(a["target"], p["dtype"], at),
                              any_input(a["draft"], at), _dyadic_q(case, at),
                              _keys(case, at),
                              greedy=None if g is None else any_input(g.astype(bool), at),
                              logits=True, temperature=any_input(a["temperature"], at),
                              backend=backend, **opt)
            return {"accepted": to_numpy(v.accepted), "tokens": to_numpy(v.tokens),
                    "status": to_numpy(v.status)}
    elif case.primitive == "propose_filtered":
        at = backend if _backend.get(backend).device_logits_filters else "cpu"

        def call():
            opt = {n: p[n] for n in ("top_k", "top_p", "min_p") if n in p}
            opt.update({n: any_input(a[n], at) for n in ("top_k", "top_p", "min_p") if n in a})
            x = float_input(a["x"], p["dtype"], at)
            kw = dict(temperature=any_input(a["temperature"], at), bias=_bias(case, at),
                      policy=p["policy"], backend=backend, **opt)
            if p["propose"]:
                tok, q = dyadic.propose(x, _keys(case, at), **kw)
                out = {"tokens": to_numpy(tok)}
            else:
                q = dyadic.allocate(x, logits=True, **kw)
                out = {}
            out.update(counts=to_numpy(q.counts), ids=to_numpy(q.ids))
            return out
    elif case.primitive == "philox":
        def call():
            out = dyadic.philox4x32(a["counter"], a["key"], p["rounds"], backend=backend)
            return {"out": to_numpy(out)}
    else:
        raise ValueError(f"unknown primitive {case.primitive!r}")
    return call
