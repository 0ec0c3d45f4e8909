"""dyadic's own calls, and the list of implementations to time for one size."""

import numpy as np

import dyadic

from . import alternatives
from .inputs import Inputs

GPU_BACKENDS = ("cuda", "numba")


def _dev(a, device, dtype=None):
    if device is None:
        return a
    import torch

    t = torch.from_numpy(np.ascontiguousarray(a)).to(device)
    return t if dtype is None else t.to(dtype)


def dyadic_call(inp: Inputs, backend, graph_kwargs=None):
    """A zero-argument dyadic call on ``backend`` (inputs moved to the GPU for GPU backends).

    ``graph_kwargs`` (e.g. ``{"check": False}``) are passed through: used for
    CUDA-graph capture once the GPU API accepts them.
    """
    dev = "cuda" if backend in GPU_BACKENDS else None
    kw = dict(graph_kwargs or {})
    keys = inp.keys()
    prim = inp.primitive
    if prim == "allocate":
        p = _dev(inp.p, dev)
        return lambda: dyadic.allocate(p, backend=backend, **kw)
    if prim == "propose":
        import sys

        torch = sys.modules.get("torch")
        z = _dev(inp.logits, dev, torch.bfloat16 if dev else None)
        return lambda: dyadic.propose(z, keys, temperature=inp.temperature, top_k=inp.top_k,
                                      backend=backend, **kw)
    if prim == "draw":
        q = inp.q
        if dev:
            q = dyadic.Dyadic(_dev(np.asarray(q.counts), dev), None, vocab_size=inp.vocab)
        return lambda: dyadic.draw(q, keys, backend=backend, **kw)
    if prim == "verify":
        p, d, q = _dev(inp.p, dev), _dev(inp.draft, dev), inp.q
        if dev:
            q = dyadic.Dyadic(_dev(np.asarray(q.counts), dev), None, vocab_size=inp.vocab)
        return lambda: dyadic.verify(p, d, q, keys, backend=backend, **kw)
    if prim == "philox":
        return lambda: dyadic.philox4x32(inp.counter, inp.key, backend=backend, **kw)
    raise ValueError(prim)


def alternatives_for(prim, device):
    """[(name, maker)] of the plain pipelines for ``prim`` on ``device`` ('cpu' / 'cuda')."""
    out = []
    if device == "cpu" and prim in alternatives.NUMPY:
        out.append(("numpy", alternatives.NUMPY[prim]))
    if prim in alternatives.TORCH:
        try:
            import torch  # noqa: F401
        except ImportError:
            return out
        out.append(("torch" if device == "cpu" else "torch-eager",
                    lambda inp, f=alternatives.TORCH[prim]: f(inp, device)))
    return out
