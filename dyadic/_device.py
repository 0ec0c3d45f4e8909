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
allocate).  Structural rules (shapes, dtypes) raise in both modes.  The
kernels check what they index with themselves, in the CPU backend's order per
request: the target rows, then the draft ids (an id outside [0, V):
DRAFT_OUT_OF_RANGE, greedy requests too; check=True raises the CPU path's
"token ids must be in [0, V)" first), then, for non-greedy requests, the q rows
(a sparse row breaking a Dyadic rule, a dense count above 2**24 at the draft:
Q_INVALID), then q(d) > 0 (Q_ZERO_AT_DRAFT).  Any batch size runs (rows beyond
the grid's 65535 y blocks go to its z dimension).

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

import math
import sys

import numpy as np

from . import _arrays, _backend, _spec, _status, _validate
from ._types import Dyadic, Keys, Verdict, trusted_dyadic, verify_q

GPU_BACKENDS = _backend.GPU_BACKENDS

# Host-overhead notes (issue 4): the eager hot path (check=False, device keys, out=)
# does only per-call work: dtype checks against cached dtype objects, no reshape of an
# already [B, V] contiguous tensor, the raw stream handle from torch (no Stream object),
# and CuPy's stream context only where CuPy's current stream is not already torch's.
# A propose / allocate / draw / verify whose configuration already ran here (check=False /
# "lazy", torch tensors) is served by dyadic/_fast.py: the same launches from a cached
# launcher.
_TORCH = None
_FLOATS = ()  # torch.float32 / float16 / bfloat16, once torch is imported
_RAW_STREAM = None  # torch._C._cuda_getCurrentRawStream (or None: current_stream())
_CB = None  # dyadic.backends.cuda.cupy_backend, once used


def _torch():
    global _TORCH, _FLOATS, _RAW_STREAM
    if _TORCH is None:
        import torch
        _FLOATS = (torch.float32, torch.float16, torch.bfloat16)
        _RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        _TORCH = torch
    return _TORCH


def _as_torch(a):
    """A torch CUDA view of a device array (zero-copy) and its original kind."""
    torch = _TORCH or _torch()
    if isinstance(a, torch.Tensor):
        return a, "torch"
    return torch.as_tensor(a, device="cuda"), "cupy"


def _host_tensor(a, device=None):
    """``torch.as_tensor(a, device=device)`` for host data, without torch's warning about
    non-writable NumPy arrays: a read-only array (a Dyadic's fields are read-only) is
    copied by ``torch.tensor`` instead of shared (nothing here writes to it; the copy to
    the device is made either way)."""
    torch = _TORCH or _torch()
    if isinstance(a, np.ndarray) and not a.flags.writeable:
        return torch.tensor(a, device=device)
    return torch.as_tensor(a, device=device)


def _back(t, kind):
    if kind == "cupy":
        import cupy
        return cupy.asarray(t)
    return t


_FAST = None  # dyadic._fast, once a check=False call was made


def _fast():
    global _FAST
    if _FAST is None:
        from . import _fast as fast
        _FAST = fast
    return _FAST


def _cupy_backend():
    global _CB
    if _CB is None:
        from .backends.cuda import cupy_backend
        _CB = cupy_backend
    return _CB


def _stream_handle(dev):
    """The raw handle of torch's current stream on device index ``dev``."""
    if _RAW_STREAM is not None:
        return _RAW_STREAM(dev)
    return _TORCH.cuda.current_stream(dev).cuda_stream


def _enter(backend, device):
    """Run the backend on torch's current stream of ``device``: for the cuda backend,
    CuPy's device and current stream are made torch's.  The CuPy device context is
    entered only when the tensor's device is not the current one, and the (cached)
    CuPy stream object (cupy_backend.external_stream) only when CuPy's current stream
    is not already that stream (the default stream of both, in plain eager use).
    Returns what ``_leave`` undoes."""
    if backend != "cuda":
        return None
    cb = _CB or _cupy_backend()
    torch = _TORCH or _torch()
    dev = device.index
    if dev is None:
        dev = torch.cuda.current_device()
    dctx = None
    if dev != cb._device_id():  # cupy.cuda.runtime.getDevice once cupy is loaded (no frame)
        import cupy
        dctx = cupy.cuda.Device(dev)
        dctx.__enter__()
    try:
        handle = _RAW_STREAM(dev) if _RAW_STREAM is not None else _stream_handle(dev)
        sctx = None
        if handle != cb._current_stream_ptr():
            sctx = cb.external_stream(handle)
            sctx.__enter__()
    except BaseException:
        if dctx is not None:
            dctx.__exit__(None, None, None)
        raise
    if dctx is None and sctx is None:
        return None
    return sctx, dctx


def _leave(token):
    sctx, dctx = token
    if sctx is not None:
        sctx.__exit__(None, None, None)
    if dctx is not None:
        dctx.__exit__(None, None, None)


def _float_dtype(t, name):
    if not _FLOATS:
        _torch()
    if t.dtype not in _FLOATS:
        raise _arrays.unsupported_float(name, t)


def _temperature(temperature, batch, device, allow_zero, check):
    torch = _TORCH or _torch()
    if type(temperature) is float or type(temperature) is int:
        # a validated Python scalar seen before: the cached device copy (no validation,
        # no copy: the eager hot path, and graph capture works)
        t = _TEMP_CACHE.get((device, batch, float(temperature), allow_zero))
        if t is not None:
            return t
    elif isinstance(temperature, torch.Tensor) and temperature.device.type == "cuda":
        t = temperature.to(torch.float64).reshape(-1)
        if t.shape[0] not in (1, batch):
            raise ValueError(f"temperature: expected a scalar or shape ({batch},), got "
                             f"{tuple(temperature.shape)}")
        if check:
            _validate.temperature(t.cpu().numpy(), batch, allow_zero=allow_zero)
        return t.expand(batch).contiguous()
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
_ONES_F64 = {}


def _keys(keys, batch, device, check, extra=0):
    """Key fields as device arrays (int64 seed / int32 others, or as given)."""
    torch = _TORCH or _torch()
    if not isinstance(keys, Keys):
        raise TypeError(f"keys: expected dyadic.Keys, got {type(keys).__name__}")
    fields = (keys.seed, keys.generation, keys.round, keys.position)
    kd = _KEY_DTYPES or _key_dtypes()
    if not check:
        # hot path: 1-D contiguous integer CUDA tensors of length B or 1 pass as they are
        # (a shape (B,) or (1,) is dim() == 1 and numel() in (1, B))
        tt, ks, full, one = torch.Tensor, _KEY_DTYPE_SET, (batch,), (1,)
        for f in fields:
            if (type(f) is not tt or not f.is_cuda or f.dtype not in ks
                    or ((s := f.shape) != full and s != one) or not f.is_contiguous()):
                break
        else:
            return fields
    on_dev = [isinstance(f, torch.Tensor) and f.device.type == "cuda" for f in fields]
    if not any(on_dev):
        host = keys.broadcast(batch, position_extra=extra)
        return tuple(host)  # NumPy: the backend uploads them in one copy
    if not check and all(on_dev):
        # 1-D contiguous integer device fields of length B or 1 pass as they are
        for f in fields:
            if (f.dim() != 1 or f.shape[0] not in (1, batch) or not f.is_contiguous()
                    or f.dtype not in kd):
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
_KEY_DTYPE_SET = frozenset()


def _key_dtypes():
    global _KEY_DTYPES, _KEY_DTYPE_SET
    if not _KEY_DTYPES:
        torch = _torch()
        _KEY_DTYPES = (torch.int64, torch.int32, torch.uint32, torch.uint64)
        _KEY_DTYPE_SET = frozenset(_KEY_DTYPES)
    return _KEY_DTYPES


def _outputs(out, device, specs):
    """The output tensors of ``specs``, one per (name, shape, dtype) (None gives None):
    ``out[name]`` where given, after its shape and dtype are checked, else a new empty
    tensor on ``device``.  One call for all outputs of a primitive (the hot path)."""
    got = []
    for spec in specs:
        t = None if spec is None or out is None else out.get(spec[0])
        if t is None:
            if spec is not None:
                t = (_TORCH or _torch()).empty(spec[1], dtype=spec[2], device=device)
        elif (t.shape != spec[1] and tuple(t.shape) != spec[1]) or t.dtype != spec[2]:
            name, shape, dtype = spec
            raise ValueError(f"out[{name!r}]: expected {dtype} {tuple(shape)}, got "
                             f"{t.dtype} {tuple(t.shape)}")
        got.append(t)
    return got


def _x_bias(x, bias, name, be):
    """x as a [B, V] torch view and bias as [1 or B, V]; float16/bfloat16 are
    widened to float32 (exact) for backends that read float32 only (numba)."""
    torch = _TORCH or _torch()
    if type(x) is not torch.Tensor:
        x, kind = _as_torch(x)
    else:
        kind = "torch"
    if x.dtype not in _FLOATS:  # _float_dtype(x, name) inline (the hot path)
        raise _arrays.unsupported_float(name, x)
    if x.dtype != torch.float32 and not be.reads_half_precision:
        x = x.float()
    nd = x.dim()
    if nd < 1:
        raise ValueError(f"{name}: expected shape [..., V], got a scalar")
    shape = x.shape
    batch_shape, v = tuple(shape[:-1]), int(shape[-1])
    _validate.vocab(v, name)
    # a contiguous [B, V] tensor is its own reshape(-1, V).contiguous() (same data, shape)
    x2 = x if nd == 2 and x.is_contiguous() else x.reshape(-1, v).contiguous()
    b2 = None
    if bias is not None:
        if not isinstance(bias, torch.Tensor):
            bias = _host_tensor(np.asarray(bias))
        bias = bias.to(x.device)
        _float_dtype(bias, "bias")
        if bias.dtype != torch.float32 and not be.reads_half_precision:
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
    torch = _TORCH or _torch()
    fkey = None
    if not check and bias is None and type(x) is torch.Tensor:  # repeat calls: _fast
        fkey = (_FAST or _fast()).allocate_key(x, logits, temperature, top_k, policy, backend)
        if fkey is not None:
            r = _FAST.allocate(fkey, x, out)
            if r is not None:
                return r
    code = _validate.policy(policy)
    be = _backend.get(backend)
    x2, b2, batch_shape, v, kind = _x_bias(x, bias, "x", be)
    batch = x2.shape[0]
    dev = x2.device
    if logits:
        temp = _temperature(temperature, batch, dev, False, check)
    else:
        if bias is not None or not (np.ndim(temperature) == 0 and temperature == 1.0):
            raise ValueError("temperature/bias: apply only to logits (logits=True); "
                             "weights are used as given")
        temp = _ONES_F64.get((dev, batch))  # read only by the backend: cached per (device, B)
        if temp is None:
            temp = torch.ones(batch, dtype=torch.float64, device=dev)
            if not torch.cuda.is_current_stream_capturing():  # filled only at replay there
                _ONES_F64[(dev, batch)] = temp
    width = _validate.top_k(top_k, v)
    specs = (("counts", (batch, width or v), torch.uint32),
             ("ids", (batch, width), torch.int32) if width else None,
             ("status", (batch,), torch.int32))
    counts, ids, status = _outputs(out, dev, specs)
    if batch:
        tok = _enter(backend, dev)
        try:
            be.allocate(x2, b2, temp, bool(logits), code, width or 0, counts, ids, status)
            if fkey is not None and x2 is x:  # in x's device context
                _FAST.remember_allocate(fkey, be, backend, batch, v, x.dtype, width or 0,
                                        policy, code, logits, specs, temp)
        finally:
            if tok is not None:
                _leave(tok)
    if check:
        _finish(status, check, _status.row_label(batch_shape))
    if len(batch_shape) != 1:  # a batch of one dimension: the outputs themselves
        shape = batch_shape + (counts.shape[-1],)
        counts, ids = counts.reshape(shape), None if ids is None else ids.reshape(shape)
    return trusted_dyadic(_back(counts, kind), None if ids is None else _back(ids, kind), v,
                          policy)


def propose(logits, keys, *, temperature, bias, top_k, policy, backend, check=True, out=None):
    torch = _TORCH or _torch()
    fkey = None
    if not check and bias is None and type(logits) is torch.Tensor:  # repeat calls: _fast
        fkey = (_FAST or _fast()).propose_key(logits, temperature, top_k, policy, backend)
        if fkey is not None:
            r = _FAST.propose(fkey, logits, keys, out)
            if r is not None:
                return r
    code = _validate.policy(policy)
    be = _backend.get(backend)
    x2, b2, batch_shape, v, kind = _x_bias(logits, bias, "logits", be)
    if len(batch_shape) != 1:
        raise ValueError(f"logits: expected shape [B, V], got {batch_shape + (v,)}")
    batch = batch_shape[0]
    dev = x2.device
    temp = _temperature(temperature, batch, dev, True, check)
    width = _validate.top_k(top_k, v)
    k = _keys(keys, batch, dev, check)
    specs = (("tokens", (batch,), torch.int32), ("counts", (batch, width or v), torch.uint32),
             ("ids", (batch, width), torch.int32) if width else None,
             ("status", (batch,), torch.int32))
    tokens, counts, ids, status = _outputs(out, dev, specs)
    if batch:
        tok = _enter(backend, dev)
        try:
            be.propose(x2, b2, temp, code, width or 0, *k, tokens, counts, ids, status)
            if fkey is not None and width and x2 is logits:  # in x's device context
                _FAST.remember_propose(fkey, be, backend, batch, v, logits.dtype, width,
                                       policy, code, specs, temp)
        finally:
            if tok is not None:
                _leave(tok)
    if check:
        _finish(status, check)
    if kind == "torch":
        q = trusted_dyadic(counts, ids, v, policy)
        return tokens, q
    q = trusted_dyadic(_back(counts, kind), None if ids is None else _back(ids, kind), v,
                       policy)
    return _back(tokens, kind), q


def draw(q, keys, *, backend, check=True, out=None):
    torch = _TORCH or _torch()
    fkey = None
    if not check:  # repeat calls: _fast
        fkey = (_FAST or _fast()).draw_key(q, backend)
        if fkey is not None:
            r = _FAST.draw(fkey, q, keys, out)
            if r is not None:
                return r
    be = _backend.get(backend)
    counts, _ = _as_torch(q.counts)
    ids = None if q.ids is None else _as_torch(q.ids)[0]
    kind = "torch" if isinstance(q.counts, torch.Tensor) else "cupy"
    batch_shape = q.batch_shape
    batch = math.prod(batch_shape)
    c2 = counts.reshape(batch, q.width).contiguous()
    i2 = None if ids is None else ids.reshape(batch, q.width).contiguous()
    dev = c2.device
    k = _keys(keys, batch, dev, check)
    specs = (("tokens", (batch,), torch.int32),)
    (tokens,) = _outputs(out, dev, specs)
    if batch:
        tok = _enter(backend, dev)
        try:
            be.draw(c2, i2, *k, tokens)
            if (fkey is not None and c2.data_ptr() == counts.data_ptr()
                    and (ids is None or i2.data_ptr() == ids.data_ptr())):  # same arrays
                _FAST.remember_draw(fkey, be, backend, tuple(c2.shape), ids is not None, specs)
        finally:
            if tok is not None:
                _leave(tok)
    # a batch of one dimension returns ``out["tokens"]`` itself (as propose and verify do)
    return _back(tokens if len(batch_shape) == 1 else tokens.reshape(batch_shape), kind)


def _on(t, dev_index, torch):
    """t is a contiguous torch tensor on CUDA device ``dev_index`` (as_tensor / to /
    contiguous would return it unchanged)."""
    return (type(t) is torch.Tensor and t.is_cuda and t.get_device() == dev_index
            and t.is_contiguous())


def verify(target, draft, q, keys, *, greedy, backend, check=True, out=None):
    torch = _TORCH or _torch()
    lazy = check == "lazy"  # any other string was refused by dyadic.verify
    if lazy:
        check = False
    fkey = None
    if (not check and type(target) is torch.Tensor
            and (greedy is None or type(greedy) is torch.Tensor)):  # repeat calls: _fast
        fkey = (_FAST or _fast()).verify_key(target, q, backend, lazy, greedy is not None)
        if fkey is not None:
            r = _FAST.verify(fkey, target, draft, q, keys, out, greedy)
            if r is not None:
                return r
    be = _backend.get(backend)
    if type(target) is torch.Tensor:
        t, kind = target, "torch"
    else:
        t, kind = _as_torch(target)
    if t.dtype != torch.float32:
        raise TypeError(f"target: dtype {_arrays.dtype_name(t)}; expected float32 probabilities")
    if t.dim() != 3:
        raise ValueError(f"target: expected shape [B, k+1, V], got {tuple(t.shape)}")
    b, k1, v = t.shape
    _validate.vocab(v, "target")
    if k1 < 1:
        raise ValueError("target: needs k+1 >= 1 rows per request")
    dev = t.device
    if not t.is_contiguous():
        t = t.contiguous()
    didx = t.get_device()
    if _on(draft, didx, torch) and draft.dtype == torch.int32:
        d = draft  # d.to(dev), d.to(int32).contiguous() below would return it unchanged
        if d.shape != (b, k1 - 1):  # torch.Size == tuple: the same test as tuple(d.shape)
            raise ValueError(f"draft: shape {tuple(d.shape)} must be (B, k) = {(b, k1 - 1)} to "
                             f"match target")
        if check and d.numel():
            _check_draft(d, v)
    else:
        d, _ = _as_torch(draft) if not isinstance(draft, np.ndarray) else (_host_tensor(draft), "")
        d = d.to(dev)
        if d.is_floating_point():
            raise TypeError(f"draft: dtype {_arrays.dtype_name(d)} is not an integer dtype")
        if tuple(d.shape) != (b, k1 - 1):
            raise ValueError(f"draft: shape {tuple(d.shape)} must be (B, k) = {(b, k1 - 1)} to "
                             f"match target")
        if check and d.numel():
            _check_draft(d, v)
        d = d.to(torch.int32).contiguous()
    qc = qi = None
    if q is not None:
        # q's fields read directly (the public properties cost a Python call each); a q
        # that is not a Dyadic raises in verify_q before they are read
        if type(q) is not Dyadic or q._vocab_size != v or q._counts.shape[:-1] != (b, k1 - 1):
            verify_q(q, b, k1 - 1, v)  # raises for the rule q breaks
        qc = q._counts
        if not _on(qc, didx, torch):
            qc = _host_tensor(qc, dev).contiguous()
        qi = q._ids
        if qi is not None and not _on(qi, didx, torch):
            qi = _host_tensor(qi, dev).contiguous()
    if greedy is None:  # cached zeros per (device, B): no allocation or memset per call
        g = _ZEROS_U8.get((dev, b))
        if g is None:
            g = torch.zeros(b, dtype=torch.uint8, device=dev)
            if not torch.cuda.is_current_stream_capturing():  # zeroed only at replay there
                _ZEROS_U8[(dev, b)] = g
    else:
        g = _host_tensor(greedy, dev)
        if g.dtype != torch.bool:
            raise TypeError(f"greedy: dtype {_arrays.dtype_name(g)} is not bool")
        if tuple(g.shape) != (b,):
            raise ValueError(f"greedy: shape {tuple(g.shape)} must be (B,) = ({b},)")
        # the kernels read one byte per request and test it against 0: a bool tensor's
        # bytes as they are (no conversion, no launch)
        g = g.contiguous().view(torch.uint8)
    keys_b = _keys(keys, b, dev, check, extra=k1 - 1)
    specs = (("accepted", (b,), torch.int32), ("tokens", (b, k1), torch.int32),
             ("status", (b,), torch.int32))
    accepted, tokens, status = _outputs(out, dev, specs)
    if b:
        tok = _enter(backend, dev)
        try:
            if lazy and greedy is None and be.has_lazy_verify:
                be.verify_lazy(t, d, qc, qi, *keys_b, accepted, tokens, status)
            elif greedy is None:  # no greedy request
                be.verify_plain(t, d, qc, qi, g, *keys_b, accepted, tokens, status)
            else:
                be.verify(t, d, qc, qi, g, *keys_b, accepted, tokens, status)
            if fkey is not None and t is target:  # in the target's device context
                _FAST.remember_verify(fkey, be, backend, b, k1, v, q,
                                      lazy and be.has_lazy_verify, specs,
                                      greedy is not None)
        finally:
            if tok is not None:
                _leave(tok)
    if check:
        _finish(status, check)
    if kind == "torch":
        return Verdict(accepted, tokens, None if check else status)
    return Verdict(_back(accepted, kind), _back(tokens, kind),
                   None if check else _back(status, kind))


def _check_draft(d, v):
    dn = d.cpu().numpy()
    bad = np.flatnonzero(((dn < 0) | (dn >= v)).any(axis=1))
    if bad.size:
        raise ValueError(f"draft: row {int(bad[0])}: token ids must be in [0, {v})")


__all__ = ["allocate", "draw", "propose", "verify", "GPU_BACKENDS"]
_ = (sys, _spec)
