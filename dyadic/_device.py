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

import numpy as np

from . import _arrays, _backend, _gpu_arrays as _ga, _status, _validate
from ._types import Dyadic, Verdict, trusted_dyadic, verify_q

GPU_BACKENDS = _backend.GPU_BACKENDS

# Host overhead: the eager hot path (check=False, device keys, out=)
# does only per-call work: dtype checks against cached dtype objects, no reshape of an
# already [B, V] contiguous tensor, the raw stream handle from torch (no Stream object),
# and CuPy's stream context only where CuPy's current stream is not already torch's.
# A propose / allocate / draw / verify whose configuration already ran here (check=False /
# "lazy", torch tensors) is served by dyadic/_fast.py: the same launches from a cached
# launcher.
_FAST = None  # dyadic._fast, once a check=False call was made


def _fast():
    global _FAST
    if _FAST is None:
        from . import _fast as fast
        _FAST = fast
    return _FAST

def allocate(x, *, logits, temperature, bias, top_k, policy, backend, check=True, out=None):
    torch = _ga._TORCH or _ga._torch()
    fkey = None
    if not check and bias is None and type(x) is torch.Tensor:  # repeat calls: _fast
        fkey = (_FAST or _fast()).allocate_key(x, logits, temperature, top_k, policy, backend)
        if fkey is not None:
            r = _FAST.allocate(fkey, x, out)
            if r is not None:
                return r
    code = _validate.policy(policy)
    be = _backend.get(backend)
    x2, b2, batch_shape, v, kind = _ga._x_bias(x, bias, "x", be)
    batch = x2.shape[0]
    dev = x2.device
    if logits:
        temp = _ga._temperature(temperature, batch, dev, False, check)
    else:
        if bias is not None or not (np.ndim(temperature) == 0 and temperature == 1.0):
            raise ValueError("temperature/bias: apply only to logits (logits=True); "
                             "weights are used as given")
        temp = _ga._ONES_F64.get((dev, batch))  # read only by the backend: cached per (device, B)
        if temp is None:
            temp = torch.ones(batch, dtype=torch.float64, device=dev)
            if not torch.cuda.is_current_stream_capturing():  # filled only at replay there
                _ga._ONES_F64[(dev, batch)] = temp
    width = _validate.top_k(top_k, v)
    specs = (("counts", (batch, width or v), torch.uint32),
             ("ids", (batch, width), torch.int32) if width else None,
             ("status", (batch,), torch.int32))
    counts, ids, status = _ga._outputs(out, dev, specs)
    if batch:
        tok = _ga._enter(backend, dev)
        try:
            be.allocate(x2, b2, temp, bool(logits), code, width or 0, counts, ids, status)
            if fkey is not None and x2 is x:  # in x's device context
                _FAST.remember_allocate(fkey, be, backend, batch, v, x.dtype, width or 0,
                                        policy, code, logits, specs, temp)
        finally:
            if tok is not None:
                _ga._leave(tok)
    if check:
        _ga._finish(status, check, _status.row_label(batch_shape))
    if len(batch_shape) != 1:  # a batch of one dimension: the outputs themselves
        shape = batch_shape + (counts.shape[-1],)
        counts, ids = counts.reshape(shape), None if ids is None else ids.reshape(shape)
    return trusted_dyadic(_ga._back(counts, kind), None if ids is None else _ga._back(ids, kind), v,
                          policy)


def propose(logits, keys, *, temperature, bias, top_k, policy, backend, check=True, out=None):
    torch = _ga._TORCH or _ga._torch()
    fkey = None
    if not check and bias is None and type(logits) is torch.Tensor:  # repeat calls: _fast
        fkey = (_FAST or _fast()).propose_key(logits, temperature, top_k, policy, backend)
        if fkey is not None:
            r = _FAST.propose(fkey, logits, keys, out)
            if r is not None:
                return r
    code = _validate.policy(policy)
    be = _backend.get(backend)
    x2, b2, batch_shape, v, kind = _ga._x_bias(logits, bias, "logits", be)
    if len(batch_shape) != 1:
        raise ValueError(f"logits: expected shape [B, V], got {batch_shape + (v,)}")
    batch = batch_shape[0]
    dev = x2.device
    temp = _ga._temperature(temperature, batch, dev, True, check)
    width = _validate.top_k(top_k, v)
    k = _ga._keys(keys, batch, dev, check)
    specs = (("tokens", (batch,), torch.int32), ("counts", (batch, width or v), torch.uint32),
             ("ids", (batch, width), torch.int32) if width else None,
             ("status", (batch,), torch.int32))
    tokens, counts, ids, status = _ga._outputs(out, dev, specs)
    if batch:
        tok = _ga._enter(backend, dev)
        try:
            be.propose(x2, b2, temp, code, width or 0, *k, tokens, counts, ids, status)
            if fkey is not None and width and x2 is logits:  # in x's device context
                _FAST.remember_propose(fkey, be, backend, batch, v, logits.dtype, width,
                                       policy, code, specs, temp)
        finally:
            if tok is not None:
                _ga._leave(tok)
    if check:
        _ga._finish(status, check)
    if kind == "torch":
        q = trusted_dyadic(counts, ids, v, policy)
        return tokens, q
    q = trusted_dyadic(_ga._back(counts, kind), None if ids is None else _ga._back(ids, kind), v,
                       policy)
    return _ga._back(tokens, kind), q


def draw(q, keys, *, backend, check=True, out=None):
    torch = _ga._TORCH or _ga._torch()
    fkey = None
    if not check:  # repeat calls: _fast
        fkey = (_FAST or _fast()).draw_key(q, backend)
        if fkey is not None:
            r = _FAST.draw(fkey, q, keys, out)
            if r is not None:
                return r
    be = _backend.get(backend)
    counts, _ = _ga._as_torch(q.counts)
    ids = None if q.ids is None else _ga._as_torch(q.ids)[0]
    kind = "torch" if isinstance(q.counts, torch.Tensor) else "cupy"
    batch_shape = q.batch_shape
    batch = math.prod(batch_shape)
    c2 = counts.reshape(batch, q.width).contiguous()
    i2 = None if ids is None else ids.reshape(batch, q.width).contiguous()
    dev = c2.device
    k = _ga._keys(keys, batch, dev, check)
    specs = (("tokens", (batch,), torch.int32),)
    (tokens,) = _ga._outputs(out, dev, specs)
    if batch:
        tok = _ga._enter(backend, dev)
        try:
            be.draw(c2, i2, *k, tokens)
            if (fkey is not None and c2.data_ptr() == counts.data_ptr()
                    and (ids is None or i2.data_ptr() == ids.data_ptr())):  # same arrays
                _FAST.remember_draw(fkey, be, backend, tuple(c2.shape), ids is not None, specs)
        finally:
            if tok is not None:
                _ga._leave(tok)
    # a batch of one dimension returns ``out["tokens"]`` itself (as propose and verify do)
    return _ga._back(tokens if len(batch_shape) == 1 else tokens.reshape(batch_shape), kind)

def verify(target, draft, q, keys, *, greedy, backend, check=True, out=None):
    torch = _ga._TORCH or _ga._torch()
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
        t, kind = _ga._as_torch(target)
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
    if _ga._on(draft, didx, torch) and draft.dtype == torch.int32:
        d = draft  # d.to(dev), d.to(int32).contiguous() below would return it unchanged
        if d.shape != (b, k1 - 1):  # torch.Size == tuple: the same test as tuple(d.shape)
            raise ValueError(f"draft: shape {tuple(d.shape)} must be (B, k) = {(b, k1 - 1)} to "
                             f"match target")
        if check and d.numel():
            _ga._check_draft(d, v)
    else:
        d, _ = _ga._as_torch(draft) if not isinstance(draft, np.ndarray) else (_ga._host_tensor(draft), "")
        d = d.to(dev)
        if d.is_floating_point():
            raise TypeError(f"draft: dtype {_arrays.dtype_name(d)} is not an integer dtype")
        if tuple(d.shape) != (b, k1 - 1):
            raise ValueError(f"draft: shape {tuple(d.shape)} must be (B, k) = {(b, k1 - 1)} to "
                             f"match target")
        if check and d.numel():
            _ga._check_draft(d, v)
        d = d.to(torch.int32).contiguous()
    qc = qi = None
    if q is not None:
        # q's fields read directly (the public properties cost a Python call each); a q
        # that is not a Dyadic raises in verify_q before they are read
        if type(q) is not Dyadic or q._vocab_size != v or q._counts.shape[:-1] != (b, k1 - 1):
            verify_q(q, b, k1 - 1, v)  # raises for the rule q breaks
        qc = q._counts
        if not _ga._on(qc, didx, torch):
            qc = _ga._host_tensor(qc, dev).contiguous()
        qi = q._ids
        if qi is not None and not _ga._on(qi, didx, torch):
            qi = _ga._host_tensor(qi, dev).contiguous()
    if greedy is None:  # cached zeros per (device, B): no allocation or memset per call
        g = _ga._ZEROS_U8.get((dev, b))
        if g is None:
            g = torch.zeros(b, dtype=torch.uint8, device=dev)
            if not torch.cuda.is_current_stream_capturing():  # zeroed only at replay there
                _ga._ZEROS_U8[(dev, b)] = g
    else:
        g = _ga._host_tensor(greedy, dev)
        if g.dtype != torch.bool:
            raise TypeError(f"greedy: dtype {_arrays.dtype_name(g)} is not bool")
        if tuple(g.shape) != (b,):
            raise ValueError(f"greedy: shape {tuple(g.shape)} must be (B,) = ({b},)")
        # the kernels read one byte per request and test it against 0: a bool tensor's
        # bytes as they are (no conversion, no launch)
        g = g.contiguous().view(torch.uint8)
    keys_b = _ga._keys(keys, b, dev, check, extra=k1 - 1)
    specs = (("accepted", (b,), torch.int32), ("tokens", (b, k1), torch.int32),
             ("status", (b,), torch.int32))
    accepted, tokens, status = _ga._outputs(out, dev, specs)
    if b:
        tok = _ga._enter(backend, dev)
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
                _ga._leave(tok)
    if check:
        _ga._finish(status, check)
    if kind == "torch":
        return Verdict(accepted, tokens, None if check else status)
    return Verdict(_ga._back(accepted, kind), _ga._back(tokens, kind),
                   None if check else _ga._back(status, kind))


__all__ = ["allocate", "draw", "propose", "verify", "GPU_BACKENDS"]
