"""dyadic's own calls, and the list of implementations to time for one size."""

import numpy as np

import dyadic
from dyadic._backend import GPU_BACKENDS

from . import alternatives
from .inputs import Inputs


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
    if dev and graph_kwargs:
        # capturable call: key fields read from device memory, outputs preallocated
        # (a host-to-device copy or an allocation inside the capture would break it)
        keys = _device_keys(keys, inp.batch)
        kw["out"] = _outputs(inp)
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


def _device_keys(keys, batch):
    import torch

    def field(value, dtype):
        arr = np.broadcast_to(np.asarray(value).astype(dtype), (batch,))
        return torch.from_numpy(np.ascontiguousarray(arr)).to("cuda")
    return dyadic.Keys(seed=field(keys.seed, np.int64), generation=field(keys.generation, np.int32),
                       round=field(keys.round, np.int32), position=field(keys.position, np.int32))


def _outputs(inp):
    """Preallocated GPU outputs of one call (the ``out=`` dict of dyadic/_device.py)."""
    import torch

    b, v, k, w = inp.batch, inp.vocab, inp.k, inp.top_k

    def e(shape, dtype):
        return torch.empty(shape, dtype=dtype, device="cuda")
    status = e((b,), torch.int32)
    if inp.primitive == "propose":
        return {"tokens": e((b,), torch.int32), "counts": e((b, w), torch.uint32),
                "ids": e((b, w), torch.int32), "status": status}
    if inp.primitive == "allocate":
        return {"counts": e((b, v), torch.uint32), "status": status}
    if inp.primitive == "draw":
        return {"tokens": e((b,), torch.int32)}
    if inp.primitive == "verify":
        return {"accepted": e((b,), torch.int32), "tokens": e((b, k + 1), torch.int32),
                "status": status}
    return None


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
