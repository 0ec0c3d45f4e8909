"""The GPU path of the public API: device arrays in, device arrays out.

Used by ``dyadic._api`` when an input is a GPU array (torch CUDA tensor, CuPy
array, ``__cuda_array_interface__``) and the backend is "cuda" or "numba".
Outputs are torch tensors (CuPy arrays for CuPy inputs) on the input's
device, written on the caller's current stream (torch's current stream).

Validation modes
----------------
``check=True`` (default): every rule of the CPU path, the same exception
types and messages; the call synchronises to read the per-row status.
``check=False``: never synchronises; a row that breaks a data rule fails
closed (tokens / ids -1, counts 0, accepted 0) and its code (``dyadic._status``)
is written to the per-row status array, which is returned as
``Verdict.status`` (verify) or written into ``out["status"]`` (propose,
allocate).  Structural rules (shapes, dtypes) raise in both modes.

``check="lazy"`` (verify only): like ``check=False``, but a request's target
rows are read and validated only where its decisions need them: the value
p_i(d_i) of each tested draft, the full row whose exact sum a decision needs
(an acceptance test whose uniform falls within the row-sum tolerance of the
threshold), and the residual / bonus row.  For valid inputs the results are
bit-identical to ``check=True`` / ``False`` on every backend.  For invalid
inputs a request fails closed when a rule breaks on data it read; data it did
not read (rows after the first rejection, the other entries of an accepted
row) is not examined.  Backends without a lazy kernel (numba) validate
everything, as with ``check=False``.

``out=``: a dict of preallocated outputs (``tokens``, ``counts``, ``ids``,
``status`` for propose/allocate; ``accepted``, ``tokens``, ``status`` for
verify).  With ``check=False``, device keys and ``out=``, propose and verify
launch only kernels: they can be captured in a ``torch.cuda.CUDAGraph`` and
replayed with new inputs and keys (the key fields are read from device
memory).  Warm up once before capturing (compilation and scratch buffers).
"""

import sys

import numpy as np

from . import _arrays, _backend, _spec, _status, _validate
from ._api import _row_label
from ._types import Dyadic, Keys, Verdict

GPU_BACKENDS = _backend.GPU_BACKENDS


def _torch():
    import torch
    return torch


def _as_torch(a):
    """A torch CUDA view of a device array (zero-copy) and its original kind."""
    torch = _torch()
    if isinstance(a, torch.Tensor):
        return a, "torch"
    return torch.as_tensor(a, device="cuda"), "cupy"


def _back(t, kind):
    if kind == "cupy":
        import cupy
        return cupy.asarray(t)
    return t


class _Stream:
    """Runs the backend on torch's current stream (CuPy's stream for the cuda backend).

    The CuPy ExternalStream of each torch stream handle is cached, and the
    CuPy device context is entered only when the tensor's device is not the
    current one: the eager path costs a few microseconds, not an object
    construction per call."""

    def __init__(self, backend, device):
        self.backend, self.device = backend, device
        self.ctx = None
        self.dctx = None

    def __enter__(self):
        if self.backend == "cuda":
            torch = _torch()
            from .backends.cuda import cupy_backend
            dev = self.device.index if self.device.index is not None else torch.cuda.current_device()
            if dev != cupy_backend._device_id():
                import cupy
                self.dctx = cupy.cuda.Device(dev)
                self.dctx.__enter__()
            self.ctx = cupy_backend.external_stream(torch.cuda.current_stream(self.device).cuda_stream)
            self.ctx.__enter__()
        return self

    def __exit__(self, *exc):
        if self.ctx is not None:
            self.ctx.__exit__(*exc)
        if self.dctx is not None:
            self.dctx.__exit__(*exc)


def _float_dtype(t, name):
    if _arrays.dtype_name(t) not in ("float32", "float16", "bfloat16"):
        raise _arrays.unsupported_float(name, t)


def _temperature(temperature, batch, device, allow_zero, check):
    torch = _torch()
    if isinstance(temperature, torch.Tensor) and temperature.device.type == "cuda":
        t = temperature.to(torch.float64).reshape(-1)
        if t.shape[0] not in (1, batch):
            raise ValueError(f"temperature: expected a scalar or shape ({batch},), got "
                             f"{tuple(temperature.shape)}")
        if check:
            _validate.temperature(t.cpu().numpy(), batch, allow_zero=allow_zero)
        return t.expand(batch).contiguous()
    if type(temperature) is float or type(temperature) is int:
        # a validated Python scalar seen before: the cached device copy (no validation,
        # no copy: the eager hot path, and graph capture works)
        t = _TEMP_CACHE.get((device, batch, float(temperature), allow_zero))
        if t is not None:
            return t
    host = _validate.temperature(temperature, batch, allow_zero=allow_zero)
    if np.ndim(temperature) == 0:  # cached per value: no copy, so graph capture works
        key = (device, batch, float(host[0]) if batch else 0.0, allow_zero)
        t = _TEMP_CACHE.get(key)
        if t is None:
            t = torch.from_numpy(host.copy()).to(device)
            _TEMP_CACHE[key] = t
        return t
    return torch.from_numpy(host.copy()).to(device)


_TEMP_CACHE = {}
_ZEROS_U8 = {}


def _keys(keys, batch, device, check, extra=0):
    """Key fields as device arrays (int64 seed / int32 others, or as given)."""
    torch = _torch()
    if not isinstance(keys, Keys):
        raise TypeError(f"keys: expected dyadic.Keys, got {type(keys).__name__}")
    fields = (keys.seed, keys.generation, keys.round, keys.position)
    _key_dtypes()
    on_dev = [isinstance(f, torch.Tensor) and f.device.type == "cuda" for f in fields]
    if not any(on_dev):
        host = keys.broadcast(batch, position_extra=extra)
        return tuple(host)  # NumPy: the backend uploads them in one copy
    if not check and all(on_dev):
        # hot path: 1-D contiguous integer device fields of length B or 1 pass as they are
        for f in fields:
            if (f.dim() != 1 or f.shape[0] not in (1, batch) or not f.is_contiguous()
                    or f.dtype not in _KEY_DTYPES):
                break
        else:
            return fields
    if check:
        host = Keys(*[f.cpu() if d else f for f, d in zip(fields, on_dev)])
        host.broadcast(batch, position_extra=extra)
    out = []
    for f, d, (name, _, dtype) in zip(fields, on_dev, (("seed", 0, torch.int64),
                                                      ("generation", 0, torch.int32),
                                                      ("round", 0, torch.int32),
                                                      ("position", 0, torch.int32))):
        if not d:
            f = torch.as_tensor(np.broadcast_to(np.asarray(f), (batch,)).astype(
                np.uint64 if name == "seed" else np.uint32).view(
                np.int64 if name == "seed" else np.int32)).to(device)
        f = f.reshape(-1)
        if f.shape[0] not in (1, batch):
            raise ValueError(f"keys.{name}: length {f.shape[0]} does not match the batch {batch}")
        if f.element_size() not in (4, 8) or f.is_floating_point():
            raise TypeError(f"keys.{name}: device keys need 32- or 64-bit integers")
        out.append(f.contiguous())
    return tuple(out)


_KEY_DTYPES = ()


def _key_dtypes():
    global _KEY_DTYPES
    if not _KEY_DTYPES:
        torch = _torch()
        _KEY_DTYPES = (torch.int64, torch.int32, torch.uint32, torch.uint64)
    return _KEY_DTYPES


def _get_out(out, name, shape, dtype, device):
    torch = _torch()
    if out is not None and out.get(name) is not None:
        t = out[name]
        if tuple(t.shape) != tuple(shape) or t.dtype != dtype:
            raise ValueError(f"out[{name!r}]: expected {dtype} {tuple(shape)}, got "
                             f"{t.dtype} {tuple(t.shape)}")
        return t
    return torch.empty(shape, dtype=dtype, device=device)


def _x_bias(x, bias, name, be):
    """x as a [B, V] torch view and bias as [1 or B, V]; float16/bfloat16 are
    widened to float32 (exact) for backends that read float32 only (numba)."""
    x, kind = _as_torch(x)
    _float_dtype(x, name)
    if x.dtype != _torch().float32 and not getattr(be, "reads_half_precision", False):
        x = x.float()
    if x.dim() < 1:
        raise ValueError(f"{name}: expected shape [..., V], got a scalar")
    batch_shape, v = tuple(x.shape[:-1]), int(x.shape[-1])
    _validate.vocab(v, name)
    x2 = x.reshape(-1, v).contiguous()
    b2 = None
    if bias is not None:
        torch = _torch()
        if not isinstance(bias, torch.Tensor):
            bias = torch.as_tensor(np.asarray(bias))
        bias = bias.to(x.device)
        _float_dtype(bias, "bias")
        if bias.dtype != torch.float32 and not getattr(be, "reads_half_precision", False):
            bias = bias.float()
        if tuple(bias.shape[-1:]) != (v,):
            raise ValueError(f"bias: last dimension {tuple(bias.shape[-1:])} does not match "
                             f"the vocabulary {v}")
        if bias.dim() == 1:
            b2 = bias.reshape(1, v).contiguous()
        elif tuple(bias.shape) == tuple(x.shape):
            b2 = bias.reshape(-1, v).contiguous()
        else:
            raise ValueError(f"bias: shape {tuple(bias.shape)} must be ({v},) or equal to "
                             f"{name}'s {tuple(x.shape)}")
    return x2, b2, batch_shape, v, kind


def _finish(status, check, label=None):
    if check:
        _status.raise_for_status(status.cpu().numpy(), label)


def allocate(x, *, logits, temperature, bias, top_k, policy, backend, check=True, out=None):
    torch = _torch()
    code = _validate.policy(policy)
    be = _backend.get(backend)
    x2, b2, batch_shape, v, kind = _x_bias(x, bias, "x", be)
    batch = x2.shape[0]
    if logits:
        temp = _temperature(temperature, batch, x2.device, False, check)
    else:
        if bias is not None or not (np.ndim(temperature) == 0 and temperature == 1.0):
            raise ValueError("temperature/bias: apply only to logits (logits=True); "
                             "weights are used as given")
        temp = torch.ones(batch, dtype=torch.float64, device=x2.device)
    width = _validate.top_k(top_k, v)
    counts = _get_out(out, "counts", (batch, width or v), torch.uint32, x2.device)
    ids = _get_out(out, "ids", (batch, width), torch.int32, x2.device) if width else None
    status = _get_out(out, "status", (batch,), torch.int32, x2.device)
    if batch:
        with _Stream(backend, x2.device):
            be.allocate(x2, b2, temp, bool(logits), code, width or 0, counts, ids, status)
    _finish(status, check, _row_label(batch_shape))
    shape = batch_shape + (counts.shape[-1],)
    return Dyadic(_back(counts.reshape(shape), kind),
                  None if ids is None else _back(ids.reshape(shape), kind),
                  vocab_size=v, policy=policy, _trusted=True)


def propose(logits, keys, *, temperature, bias, top_k, policy, backend, check=True, out=None):
    torch = _torch()
    code = _validate.policy(policy)
    be = _backend.get(backend)
    x2, b2, batch_shape, v, kind = _x_bias(logits, bias, "logits", be)
    if len(batch_shape) != 1:
        raise ValueError(f"logits: expected shape [B, V], got {batch_shape + (v,)}")
    batch = x2.shape[0]
    dev = x2.device
    temp = _temperature(temperature, batch, dev, True, check)
    width = _validate.top_k(top_k, v)
    k = _keys(keys, batch, dev, check)
    tokens = _get_out(out, "tokens", (batch,), torch.int32, dev)
    counts = _get_out(out, "counts", (batch, width or v), torch.uint32, dev)
    ids = _get_out(out, "ids", (batch, width), torch.int32, dev) if width else None
    status = _get_out(out, "status", (batch,), torch.int32, dev)
    if batch:
        with _Stream(backend, dev):
            be.propose(x2, b2, temp, code, width or 0, *k, tokens, counts, ids, status)
    _finish(status, check)
    q = Dyadic(_back(counts, kind), None if ids is None else _back(ids, kind), vocab_size=v,
               policy=policy, _trusted=True)
    return _back(tokens, kind), q


def draw(q, keys, *, backend, check=True, out=None):
    torch = _torch()
    be = _backend.get(backend)
    counts, _ = _as_torch(q.counts)
    ids = None if q.ids is None else _as_torch(q.ids)[0]
    kind = "torch" if isinstance(q.counts, torch.Tensor) else "cupy"
    batch = int(np.prod(q.batch_shape, dtype=np.int64))
    c2 = counts.reshape(batch, q.width).contiguous()
    i2 = None if ids is None else ids.reshape(batch, q.width).contiguous()
    k = _keys(keys, batch, c2.device, check)
    tokens = _get_out(out, "tokens", (batch,), torch.int32, c2.device)
    if batch:
        with _Stream(backend, c2.device):
            be.draw(c2, i2, *k, tokens)
    return _back(tokens.reshape(q.batch_shape), kind)


def verify(target, draft, q, keys, *, greedy, backend, check=True, out=None):
    torch = _torch()
    lazy = isinstance(check, str)
    if lazy and check != "lazy":
        raise ValueError(f"check: expected True, False or 'lazy', got {check!r}")
    if lazy:
        check = False
    be = _backend.get(backend)
    t, kind = _as_torch(target)
    if t.dtype != torch.float32:
        raise TypeError(f"target: dtype {_arrays.dtype_name(t)}; expected float32 probabilities")
    if t.dim() != 3:
        raise ValueError(f"target: expected shape [B, k+1, V], got {tuple(t.shape)}")
    b, k1, v = (int(s) for s in t.shape)
    _validate.vocab(v, "target")
    if k1 < 1:
        raise ValueError("target: needs k+1 >= 1 rows per request")
    dev = t.device
    t = t.contiguous()
    d, _ = _as_torch(draft) if not isinstance(draft, np.ndarray) else (torch.as_tensor(draft), "")
    d = d.to(dev)
    if d.is_floating_point():
        raise TypeError(f"draft: dtype {_arrays.dtype_name(d)} is not an integer dtype")
    if tuple(d.shape) != (b, k1 - 1):
        raise ValueError(f"draft: shape {tuple(d.shape)} must be (B, k) = {(b, k1 - 1)} to "
                         f"match target")
    if check and d.numel():
        dn = d.cpu().numpy()
        bad = np.flatnonzero(((dn < 0) | (dn >= v)).any(axis=1))
        if bad.size:
            raise ValueError(f"draft: row {int(bad[0])}: token ids must be in [0, {v})")
    d = d.to(torch.int32).contiguous()
    qc = qi = None
    _validate.verify_q(q, b, k1 - 1, v)
    if q is not None:
        qc = torch.as_tensor(q.counts, device=dev).contiguous()
        qi = None if q.ids is None else torch.as_tensor(q.ids, device=dev).contiguous()
    if greedy is None:  # cached zeros per (device, B): no allocation or memset per call
        g = _ZEROS_U8.get((dev, b))
        if g is None:
            g = torch.zeros(b, dtype=torch.uint8, device=dev)
            _ZEROS_U8[(dev, b)] = g
    else:
        g = torch.as_tensor(greedy, device=dev)
        if g.dtype != torch.bool:
            raise TypeError(f"greedy: dtype {_arrays.dtype_name(g)} is not bool")
        if tuple(g.shape) != (b,):
            raise ValueError(f"greedy: shape {tuple(g.shape)} must be (B,) = ({b},)")
        g = g.to(torch.uint8)
    keys_b = _keys(keys, b, dev, check, extra=k1 - 1)
    accepted = _get_out(out, "accepted", (b,), torch.int32, dev)
    tokens = _get_out(out, "tokens", (b, k1), torch.int32, dev)
    status = _get_out(out, "status", (b,), torch.int32, dev)
    if b:
        with _Stream(backend, dev):
            if lazy and greedy is None and hasattr(be, "verify_lazy"):
                be.verify_lazy(t, d, qc, qi, *keys_b, accepted, tokens, status)
            else:
                be.verify(t, d, qc, qi, g, *keys_b, accepted, tokens, status)
    _finish(status, check)
    return Verdict(_back(accepted, kind), _back(tokens, kind),
                   None if check else _back(status, kind))


__all__ = ["allocate", "draw", "propose", "verify", "GPU_BACKENDS"]
_ = (sys, _spec)
