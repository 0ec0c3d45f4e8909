"""GPU array handling for the device path: torch / CuPy / ``__cuda_array_interface__``
views, the caller's stream and device context, device key fields, temperatures and
preallocated outputs.

Used by ``dyadic._device`` (every GPU call); it imports no backend's private names
(the cuda backend's device and stream queries are ``backends/cuda/cupy/runtime.py``'s
public functions).  torch is imported on first
use only.
"""

import numpy as np

from . import _arrays, _status, _validate
from ._types import Keys


_TORCH = None
_FLOATS = ()  # torch.float32 / float16 / bfloat16, once torch is imported
_RAW_STREAM = None  # torch._C._cuda_getCurrentRawStream (or None: current_stream())
_CB = None  # dyadic.backends.cuda.cupy.runtime, once used


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



def _cuda_runtime():
    global _CB
    if _CB is None:
        from .backends.cuda.cupy import runtime
        _CB = runtime
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
    CuPy stream object (runtime.external_stream) only when CuPy's current stream
    is not already that stream (the default stream of both, in plain eager use).
    Returns what ``_leave`` undoes."""
    if backend != "cuda":
        return None
    cb = _CB or _cuda_runtime()
    dev = device.index
    if dev is None:
        dev = (_TORCH or _torch()).cuda.current_device()
    dctx = None
    if dev != cb.device_id():  # cupy.cuda.runtime.getDevice once cupy is loaded (no frame)
        import cupy
        dctx = cupy.cuda.Device(dev)
        dctx.__enter__()
    try:
        handle = _RAW_STREAM(dev) if _RAW_STREAM is not None else _stream_handle(dev)
        sctx = None
        if handle != cb.current_stream_ptr():
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


def _keys(keys, batch, check, extra=0):
    """The four key fields of a call as its backend's runner takes them.

    CUDA tensors pass as they are: the backend checks their structure (4- or 8-byte
    integers, 1 or B entries) and reads them in place ("cuda": ``args.keys``; "numba":
    ``dyadic._backend.device_keys`` and the kernel methods).  Host fields (Python ints,
    NumPy arrays, CPU tensors) are validated and broadcast by ``Keys.broadcast`` into
    NumPy arrays of length ``batch`` (uint64 seed, uint32 others), which the backend
    uploads.  ``check`` True also validates the CUDA tensors' values, on a host copy.
    ``extra``: the largest offset the kernels add to ``position`` (verify's k)."""
    if not isinstance(keys, Keys):
        raise TypeError(f"keys: expected dyadic.Keys, got {type(keys).__name__}")
    tt = (_TORCH or _torch()).Tensor
    s, g, r, p = fields = (keys.seed, keys.generation, keys.round, keys.position)
    if (not check and type(s) is tt and type(g) is tt and type(r) is tt and type(p) is tt
            and s.is_cuda and g.is_cuda and r.is_cuda and p.is_cuda):
        return fields  # the hot path: device keys, checked by the backend
    on_dev = [isinstance(f, tt) and f.is_cuda for f in fields]
    if not any(on_dev):
        return keys.broadcast(batch, position_extra=extra)
    # the host fields validated (with ``check`` the device ones too, on a host copy)
    host = Keys(*[(f.cpu() if check else 0) if d else f for f, d in zip(fields, on_dev)])
    host = host.broadcast(batch, position_extra=extra)
    return tuple(f if d else h for f, h, d in zip(fields, host, on_dev))


def _outputs(out, device, specs):
    """The output tensors of ``specs``, one per (name, shape, dtype) (None gives None):
    ``out[name]`` where given, after its shape and dtype are checked, else a new empty
    tensor on ``device``.  One call for all outputs of a primitive (the hot path)."""
    got = []
    for spec in specs:
        if spec is None:
            got.append(None)
            continue
        name, shape, dtype = spec
        t = None if out is None else out.get(name)
        if t is None:
            t = (_TORCH or _torch()).empty(shape, dtype=dtype, device=device)
        elif (t.shape != shape and tuple(t.shape) != shape) or t.dtype != dtype:
            raise ValueError(f"out[{name!r}]: expected {dtype} {tuple(shape)}, got "
                             f"{t.dtype} {tuple(t.shape)}")
        got.append(t)
    return got


def _x_layout(x, name, be):
    """(batch shape, V, direct) of a torch input x [..., V]: its dtype is a supported
    float dtype, V a valid vocabulary; ``direct``: a contiguous x is its own [B, V]
    view for backend ``be`` (two dimensions, and a dtype the backend reads)."""
    torch = _TORCH or _torch()
    if x.dtype not in _FLOATS:
        raise _arrays.unsupported_float(name, x)
    nd = x.dim()
    if nd < 1:
        raise ValueError(f"{name}: expected shape [..., V], got a scalar")
    shape = x.shape
    batch_shape, v = tuple(shape[:-1]), int(shape[-1])
    _validate.vocab(v, name)
    return batch_shape, v, nd == 2 and (x.dtype == torch.float32 or be.reads_half_precision)


def _x_flat(x, v, be):
    """x as a contiguous [B, V] tensor; float16 / bfloat16 widened to float32 (exact) for
    backends that read float32 only (numba)."""
    if x.dtype != _TORCH.float32 and not be.reads_half_precision:
        x = x.float()
    return x.reshape(-1, v).contiguous()


def _bias(bias, x, v, be, name):
    """bias as a contiguous [1 or B, V] tensor on x's device: shape (V,) or x's shape."""
    torch = _TORCH or _torch()
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
        return bias.reshape(1, v).contiguous()
    if tuple(bias.shape) == tuple(x.shape):
        return bias.reshape(-1, v).contiguous()
    raise ValueError(f"bias: shape {tuple(bias.shape)} must be ({v},) or equal to "
                     f"{name}'s {tuple(x.shape)}")


def _draft(draft, bk, device, check, v):
    """draft as a contiguous int32 [B, k] tensor on ``device`` (checked against [0, V)
    before the conversion where ``check``)."""
    torch = _TORCH or _torch()
    if isinstance(draft, np.ndarray):
        d = _host_tensor(draft)
    else:
        d, _ = _as_torch(draft)
    d = d.to(device)
    if d.is_floating_point():
        raise TypeError(f"draft: dtype {_arrays.dtype_name(d)} is not an integer dtype")
    if tuple(d.shape) != bk:
        raise ValueError(f"draft: shape {tuple(d.shape)} must be (B, k) = {bk} to match "
                         f"target")
    if check and d.numel():
        _check_draft(d, v)
    return d.to(torch.int32).contiguous()


def _greedy(greedy, b, device, dev_index):
    """Greedy flags: a bool [B] array as a contiguous bool tensor on ``device`` (CUDA
    device ``dev_index``), whose bytes the kernels read (one per request, tested against
    0; no conversion, no launch); a contiguous tensor there is taken as it is."""
    torch = _TORCH or _torch()
    on = _on(greedy, dev_index, torch)  # as_tensor and contiguous would return it unchanged
    g = greedy if on else _host_tensor(greedy, device)
    if g.dtype != torch.bool:
        raise TypeError(f"greedy: dtype {_arrays.dtype_name(g)} is not bool")
    if g.shape != (b,):  # torch.Size == tuple
        raise ValueError(f"greedy: shape {tuple(g.shape)} must be (B,) = ({b},)")
    return g if on else g.contiguous()


def _finish(status, check, label=None):
    if check:
        _status.raise_for_status(status.cpu().numpy(), label)


def _on(t, dev_index, torch):
    """t is a contiguous torch tensor on CUDA device ``dev_index`` (as_tensor / to /
    contiguous would return it unchanged)."""
    return (type(t) is torch.Tensor and t.is_cuda and t.get_device() == dev_index
            and t.is_contiguous())


def _check_draft(d, v):
    dn = d.cpu().numpy()
    bad = np.flatnonzero(((dn < 0) | (dn >= v)).any(axis=1))
    if bad.size:
        raise ValueError(f"draft: row {int(bad[0])}: token ids must be in [0, {v})")



def _num_drafts(n, batch, k, device, check):
    """verify's ``num_drafts`` as a contiguous int32 [B] tensor on ``device``, and its
    validated host copy (``check``; else None).

    A contiguous int32 tensor on ``device`` is used as it is and, with ``check``
    False, never read on the host: the kernels bounds-check every count (status
    NUM_DRAFTS_INVALID), so a captured CUDA graph serves counts written in place.
    Other device tensors are converted on the device (a count that int32 cannot
    hold becomes -1, never another count); host arrays go through
    ``_validate.num_drafts``.  ``check`` True validates a host copy (ValueError naming
    the request and the rule)."""
    torch = _TORCH or _torch()
    if _arrays.is_gpu_array(n):
        t, _ = _as_torch(n)
        if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
            raise TypeError(f"num_drafts: dtype {_arrays.dtype_name(t)} is not an integer "
                            f"dtype")
        if tuple(t.shape) != (batch,):
            raise ValueError(f"num_drafts: shape {tuple(t.shape)} must be (B,) = ({batch},)")
        host = None
        if check:
            host = _validate.num_drafts(t.cpu().numpy(), batch, k, check=True)
        t = t.to(device)
        if t.dtype != torch.int32:
            t = torch.where((t < 0) | (t > 0x7FFFFFFF), torch.full_like(t, -1), t).to(
                torch.int32)
        return t.contiguous(), host
    host = _validate.num_drafts(n, batch, k, check=check)
    return _host_tensor(host, device).contiguous(), (host if check else None)


_PARAMS_CACHE = {}  # (device, batch, scalar parameters) -> the four device tensors


def _param_fill(value, idx, batch, device, dtype):
    """Parameter ``idx`` (temperature, top_k, top_p, min_p) given on the host beside
    device ones: a Python scalar or None becomes a device fill of its converted value
    (no host-to-device copy: capturable in a CUDA graph; cached outside capture), a host
    array is converted by ``_validate.logits_target_params`` and copied."""
    torch = _TORCH or _torch()
    one = [1.0, None, None, None]
    one[idx] = value if idx or value is not None else 1.0
    scalar = value is None or type(value) in (float, int)
    key = ("fill", device, batch, idx, type(value), value)
    if scalar:
        hit = _PARAMS_CACHE.get(key)
        if hit is not None:
            return hit
    host = _validate.logits_target_params(*one, batch, check=False)[idx]
    if not scalar:
        return torch.from_numpy(host.copy()).to(device)
    t = torch.full((batch,), host[0].item() if batch else 0, dtype=dtype, device=device)
    if not torch.cuda.is_current_stream_capturing():
        _PARAMS_CACHE[key] = t
    return t


def _filter_params(top_p, min_p, batch, device, check):
    """(top_p, min_p) of a filtered allocate / propose as float32 device tensors [B]:
    ``_logits_params``' third and fourth, with its rules.  With ``check`` False a float32
    CUDA tensor of shape (B,), contiguous and on ``device`` is taken as it is (what
    ``_logits_params`` would return for it), None beside it as its cached fill."""
    torch = _TORCH or _torch()
    if not check:
        ready = [v is None or (type(v) is torch.Tensor and v.dtype is torch.float32
                               and v.shape == (batch,) and v.device == device
                               and v.is_contiguous()) for v in (top_p, min_p)]
        if ready[0] and ready[1] and (top_p is not None or min_p is not None):
            return (top_p if top_p is not None else
                    _param_fill(None, 2, batch, device, torch.float32),
                    min_p if min_p is not None else
                    _param_fill(None, 3, batch, device, torch.float32))
    return _logits_params(1.0, None, top_p, min_p, batch, device, check)[2:]


def _logits_params(temperature, top_k, top_p, min_p, batch, device, check):
    """verify(logits=True)'s parameters as four contiguous device tensors [B]:
    temperature float64, top_k int64, top_p and min_p float32 (the kernels read the
    float32 bits; docs/semantics.md "Target logits").

    Python scalars (and None) are validated once and cached per value (no copy: the
    eager hot path, and graph capture works; beside device tensors they become device
    fills).  CUDA tensors (shape (B,) or (1,)) stay on
    the device with ``check`` False, never read on the host (the kernels check every
    value: TEMPERATURE_INVALID, TOP_K_INVALID, TOP_P_INVALID, MIN_P_INVALID), converted
    there when their dtype differs: a float64 top_p / min_p outside its range becomes NaN
    before the float32 rounding, as ``_validate.logits_target_params`` does on the host.
    ``check`` True validates a host copy (ValueError naming the argument, the row and
    the rule).  Host arrays go through ``_validate.logits_target_params``."""
    torch = _TORCH or _torch()
    vals = (temperature, top_k, top_p, min_p)
    scalar = all(v is None or type(v) in (float, int) for v in vals)
    if scalar:
        key = (device, batch, check) + tuple((type(v), v) for v in vals)
        hit = _PARAMS_CACHE.get(key)
        if hit is not None:
            return hit
    dev = [isinstance(v, torch.Tensor) and v.device.type == "cuda" for v in vals]
    if any(dev) and not check:
        out = []
        for v, d, (name, dtype) in zip(vals, dev, (("temperature", torch.float64),
                                                   ("top_k", torch.int64),
                                                   ("top_p", torch.float32),
                                                   ("min_p", torch.float32))):
            if not d:  # a host value among device ones
                out.append(_param_fill(v, len(out), batch, device, dtype))
                continue
            t = v.reshape(-1)
            if t.shape[0] not in (1, batch):
                raise ValueError(f"{name}: expected a scalar or shape ({batch},), got "
                                 f"{tuple(v.shape)}")
            if t.is_complex() or t.dtype == torch.bool:
                raise TypeError(f"{name}: dtype {_arrays.dtype_name(t)} is not supported")
            if name == "top_k" and t.is_floating_point():
                raise TypeError(f"top_k: dtype {_arrays.dtype_name(t)} is not an integer dtype")
            t = t.to(device)
            if t.dtype != dtype:
                if name in ("top_p", "min_p") and t.dtype != torch.float32:
                    raw = t.to(torch.float64)
                    f32 = raw.to(torch.float32)
                    ok = (raw >= 0) & (raw <= 1)
                    if name == "top_p":
                        ok = ok & (raw > 0) & (f32 > 0)
                    t = torch.where(ok, f32, torch.full_like(f32, float("nan")))
                else:
                    t = t.to(dtype)
            out.append(t.expand(batch).contiguous())
        return tuple(out)
    host = [v.cpu().numpy() if d else v for v, d in zip(vals, dev)]
    arrays = _validate.logits_target_params(*host, batch, check=check)
    out = tuple(torch.from_numpy(a.copy()).to(device) for a in arrays)
    if scalar:
        if len(_PARAMS_CACHE) > 256:
            _PARAMS_CACHE.clear()
        _PARAMS_CACHE[key] = out
    return out
