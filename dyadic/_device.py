"""The GPU path of the public API: device arrays in, device arrays out.

Used by ``dyadic._api`` when an input is a GPU array (torch CUDA tensor, CuPy
array, ``__cuda_array_interface__``) and the backend is "cuda" or "numba".
Outputs are torch tensors (CuPy arrays for CuPy inputs) on the input's
device, written on the caller's current stream (torch's current stream).

Every call goes through a call plan: the call's configuration (the primitive, the
backend, the input's shape, dtype and device, the scalar arguments, ``check``) is
validated once and keyed in ``_CALLS``; the plan holds the output specs, the cached
temperature tensor and the backend's runner (``Backend.alloc_runner`` and friends:
for backend "cuda" the kernels' launch plans).  Per call only what the key does not
fix is checked and converted: contiguity, keys, bias, per-row temperatures, draft, q,
greedy flags, ``out=``.

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
Q_INVALID), then q(d) > 0 (Q_ZERO_AT_DRAFT); with ``num_drafts`` first the request's
count in [0, k] (NUM_DRAFTS_INVALID), then the rules on its rows 0..n_b only.  A device
``num_drafts`` goes to the kernels as it is (int32) or converted on the device, never
read on the host with check=False / "lazy".  Any batch size runs (rows beyond
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
from ._types import Dyadic, Verdict, trusted_dyadic, trusted_verdict, verify_q

GPU_BACKENDS = _backend.GPU_BACKENDS

_CALLS = {}  # call configuration -> call plan
_MAX_CALLS = 512  # cleared when full (a plan is made again on the next call)
_ARRAY = object()  # key entry of a temperature given per row (converted per call)


def _plan(key, make, *args):
    """The call plan of ``key``, made by ``make(*args)`` (which validates the
    configuration and raises for it) on first use."""
    try:
        plan = _CALLS.get(key)
    except TypeError:  # an unhashable argument: validated (and refused) by make
        return make(*args)
    if plan is None:
        plan = make(*args)
        # a plan made during CUDA-graph capture holds tensors filled only at replay
        if _ga._TORCH.cuda.is_current_stream_capturing():
            return plan
        if len(_CALLS) >= _MAX_CALLS:
            _CALLS.clear()
        _CALLS[key] = plan
    return plan


def _scalar(temperature):
    """A Python float / int temperature as it is (a key entry), else _ARRAY (the entry
    points inline this test)."""
    tt = type(temperature)
    return temperature if tt is float or tt is int else _ARRAY


class _CallPlan:
    """What the call plans share: the backend's runner, made on first use.  A plan's
    ``__call__`` runs it inside ``_ga._enter(plan.backend, plan.dev)`` (the caller's
    stream and device), where ``plan.run or plan.runner()`` makes it on the first call:
    a backend's launch plans are per device."""

    __slots__ = ()

    def runner(self):
        run = self.run = self.make_run()
        return run


class _AllocPlan(_CallPlan):
    """allocate / propose of one configuration: x [..., V] (propose: [B, V]) of one
    dtype on one device, the scalar arguments, ``check``."""

    __slots__ = ("backend", "be", "dev", "batch_shape", "batch", "v", "code", "width",
                 "top_k", "policy", "logits", "propose", "temp", "allow_zero", "check",
                 "specs", "kind", "direct", "run", "has_bias", "x_dtype", "filtered")

    def __init__(self, xt, logits, temperature, bias, top_k, policy, backend, check, kind,
                 propose, filtered=False):
        torch = _ga._TORCH
        name = "logits" if propose else "x"
        self.code = _validate.policy(policy)
        self.be = be = _backend.get(backend)
        self.backend, self.kind, self.check, self.propose = backend, kind, check, propose
        self.filtered = filtered
        self.policy, self.logits, self.has_bias = policy, bool(logits), bias is not None
        batch_shape, v, self.direct = _ga._x_layout(xt, name, be)
        self.x_dtype = xt.dtype if be.reads_half_precision else torch.float32
        if propose and len(batch_shape) != 1:
            raise ValueError(f"logits: expected shape [B, V], got {batch_shape + (v,)}")
        if bias is not None:  # validated here for the error order; converted per call
            _ga._bias(bias, xt, v, be, name)
        self.batch_shape, self.v = batch_shape, v
        self.batch = batch = math.prod(batch_shape)
        self.dev = dev = xt.device
        self.allow_zero = propose
        self.temp = None  # the temperature tensor of a scalar temperature
        if logits:
            if _scalar(temperature) is not _ARRAY:
                self.temp = _ga._temperature(temperature, batch, dev, propose, check)
        else:
            if bias is not None or not (np.ndim(temperature) == 0 and temperature == 1.0):
                raise ValueError("temperature/bias: apply only to logits (logits=True); "
                                 "weights are used as given")
            self.temp = torch.ones(batch, dtype=torch.float64, device=dev)
        self.width = width = _validate.top_k(top_k, v)
        self.top_k = width or 0
        self.specs = ((("tokens", (batch,), torch.int32),) if propose else ()) + (
            ("counts", (batch, width or v), torch.uint32),
            ("ids", (batch, width), torch.int32) if width else None,
            ("status", (batch,), torch.int32))
        self.run = None

    def make_run(self):
        if self.filtered:
            return self.be.alloc_runner(self.batch, self.v, self.x_dtype, self.top_k,
                                        self.code, self.logits, self.propose, True)
        return self.be.alloc_runner(self.batch, self.v, self.x_dtype, self.top_k, self.code,
                                    self.logits, self.propose)

    def __call__(self, xt, temperature, bias, keys, out, filt=()):
        x2 = xt if self.direct and xt.is_contiguous() else _ga._x_flat(xt, self.v, self.be)
        temp = self.temp
        if temp is None:
            temp = _ga._temperature(temperature, self.batch, self.dev, self.allow_zero,
                                    self.check)
        b2 = None if bias is None else _ga._bias(bias, xt, self.v, self.be,
                                                "logits" if self.propose else "x")
        k = None
        if self.propose:
            k = _ga._keys(keys, self.batch, self.check)
            tokens, counts, ids, status = _ga._outputs(out, self.dev, self.specs)
        else:
            tokens = None
            counts, ids, status = _ga._outputs(out, self.dev, self.specs)
        if self.batch:
            tok = _ga._enter(self.backend, self.dev)
            try:
                (self.run or self.runner())(x2, b2, temp, k, tokens, counts, ids, status, *filt)
            finally:
                if tok is not None:
                    _ga._leave(tok)
        if self.check:
            _ga._finish(status, True, None if self.propose else
                        _status.row_label(self.batch_shape))
        kind = self.kind
        if not self.propose and len(self.batch_shape) != 1:
            shape = self.batch_shape + (counts.shape[-1],)
            counts, ids = counts.reshape(shape), None if ids is None else ids.reshape(shape)
        if kind == "torch":
            q = trusted_dyadic(counts, ids, self.v, self.policy)
        else:
            q = trusted_dyadic(_ga._back(counts, kind),
                               None if ids is None else _ga._back(ids, kind), self.v,
                               self.policy)
        if not self.propose:
            return q
        return (tokens if kind == "torch" else _ga._back(tokens, kind)), q


# The entry points build the configuration key inline and look it up before anything
# else (the eager hot path); ``_plan`` makes a missing plan, and handles a key that
# cannot be hashed.
def allocate(x, *, logits, temperature, bias, top_k, policy, backend, check=True, out=None):
    if type(x) is (_ga._TORCH or _ga._torch()).Tensor:
        xt, kind = x, "torch"
    else:
        xt, kind = _ga._as_torch(x)
    tt = type(temperature)
    key = ("allocate", backend, xt.shape, xt.dtype, xt.device, bool(logits),
           temperature if tt is float or tt is int else _ARRAY, bias is None, type(top_k),
           top_k, policy, check, kind)
    try:
        plan = _CALLS[key]
    except (KeyError, TypeError):
        plan = _plan(key, _AllocPlan, xt, logits, temperature, bias, top_k, policy, backend,
                     check, kind, False)
    return plan(xt, temperature, bias, None, out)


def propose(logits, keys, *, temperature, bias, top_k, policy, backend, check=True, out=None):
    if type(logits) is (_ga._TORCH or _ga._torch()).Tensor:
        xt, kind = logits, "torch"
    else:
        xt, kind = _ga._as_torch(logits)
    tt = type(temperature)
    key = ("propose", backend, xt.shape, xt.dtype, xt.device,
           temperature if tt is float or tt is int else _ARRAY, bias is None, type(top_k),
           top_k, policy, check, kind)
    try:
        plan = _CALLS[key]
    except (KeyError, TypeError):
        plan = _plan(key, _AllocPlan, xt, True, temperature, bias, top_k, policy, backend,
                     check, kind, True)
    return plan(xt, temperature, bias, keys, out)


def filtered(x, keys, *, propose, logits, temperature, bias, top_k, top_p, min_p, policy,
             backend, check=True, out=None):
    """allocate / propose with top_p, min_p or a per-row top_k (docs/semantics.md,
    "Filtered support") on device arrays, backends with ``device_logits_filters`` (cuda,
    numba: sparse and dense supports).  top_p / min_p: Python scalars, host arrays or
    CUDA tensors [B] (these stay on the device: the kernels check every value, as
    verify's parameters); a per-row top_k is read on the host (its largest entry is the
    output width), so with one the call copies it to the device (a CUDA tensor top_k:
    from it).  With an int or no top_k the configuration is looked up first (the eager
    hot path of the other entry points); its checks ran when its plan was made."""
    if type(x) is (_ga._TORCH or _ga._torch()).Tensor:
        xt, kind = x, "torch"
    else:
        xt, kind = _ga._as_torch(x)
    tt, kt = type(temperature), type(top_k)
    fixed_k = kt is int or top_k is None
    key = ("filtered", propose, logits, backend, xt.shape, xt.dtype, xt.device,
           temperature if tt is float or tt is int else _ARRAY, bias is None,
           top_k if fixed_k else _ARRAY, policy, check, kind)
    try:
        plan = _CALLS.get(key) if fixed_k else None
    except TypeError:  # an unhashable argument: refused by the checks below
        plan = None
    ftk = None
    if plan is None:
        plan, ftk = _filtered_plan(xt, kind, propose, logits, temperature, bias, top_k,
                                   policy, backend, check)
        if fixed_k and not _ga._TORCH.cuda.is_current_stream_capturing():
            try:
                _CALLS[key] = plan
            except TypeError:
                pass
    tp, mp = _ga._filter_params(top_p, min_p, plan.batch, plan.dev, check is True)
    return plan(xt, temperature, bias, keys if propose else None, out, (ftk, tp, mp))


def _filtered_plan(xt, kind, propose, logits, temperature, bias, top_k, policy, backend,
                   check):
    """The checks of a filtered call and its plan: (plan, per-row top_k as a device
    tensor or None)."""
    be = _backend.get(backend)
    if not be.device_logits_filters:
        raise _backend.BackendUnavailable(
            f"backend {backend!r}: allocate / propose with top_p, min_p or a per-row top_k "
            f"have no kernels for GPU arrays; use backend 'cuda' or 'numba', or host arrays with "
            f"backend 'cpu', 'reference' or 'numba'")
    _validate.policy(policy)
    batch_shape, v, _ = _ga._x_layout(xt, "logits" if propose else "x", be)
    if not logits:  # the CPU path's message
        raise ValueError("top_p/min_p/per-row top_k: apply only to logits (logits=True)")
    per_row = top_k is not None and not (type(top_k) is int or isinstance(top_k, np.integer))
    width, tk = _validate.top_k_rows(top_k, v, math.prod(batch_shape), check=check is True)
    tt = type(temperature)
    key = ("filtered", propose, backend, xt.shape, xt.dtype, xt.device,
           temperature if tt is float or tt is int else _ARRAY, bias is None, width, policy,
           check, kind)
    plan = _plan(key, _AllocPlan, xt, True, temperature, bias, width or None, policy,
                 backend, check, kind, propose, True)
    return plan, (_ga._host_tensor(tk, plan.dev) if per_row else None)


class _DrawPlan(_CallPlan):
    """draw of one configuration: q's counts of one shape, dtype and device, sparse or
    dense."""

    __slots__ = ("backend", "be", "dev", "batch_shape", "batch", "width", "check", "specs",
                 "kind", "run", "sparse")

    def __init__(self, counts, sparse, backend, check, kind, batch_shape, width):
        torch = _ga._TORCH
        self.be = _backend.get(backend)
        self.backend, self.check, self.kind, self.sparse = backend, check, kind, sparse
        self.batch_shape, self.width = batch_shape, width
        self.batch = batch = math.prod(batch_shape)
        self.dev = counts.device
        self.specs = (("tokens", (batch,), torch.int32),)
        self.run = None

    def make_run(self):
        return self.be.draw_runner(self.batch, self.width)

    def __call__(self, counts, ids, keys, out):
        batch, w = self.batch, self.width
        c2 = counts if counts.is_contiguous() and counts.dim() == 2 else (
            counts.reshape(batch, w).contiguous())
        i2 = None
        if ids is not None:
            i2 = ids if ids.is_contiguous() and ids.dim() == 2 else (
                ids.reshape(batch, w).contiguous())
        k = _ga._keys(keys, batch, self.check)
        (tokens,) = _ga._outputs(out, self.dev, self.specs)
        if batch:
            tok = _ga._enter(self.backend, self.dev)
            try:
                (self.run or self.runner())(c2, i2, k, tokens)
            finally:
                if tok is not None:
                    _ga._leave(tok)
        # a batch of one dimension returns ``out["tokens"]`` itself (as propose and verify)
        return _ga._back(tokens if len(self.batch_shape) == 1 else
                         tokens.reshape(self.batch_shape), self.kind)


def draw(q, keys, *, backend, check=True, out=None):
    torch = _ga._TORCH or _ga._torch()
    counts, ids = q._counts, q._ids  # q is a Dyadic (checked by dyadic.draw)
    kind = "torch"
    if type(counts) is not torch.Tensor:
        counts, kind = _ga._as_torch(counts)
        ids = None if ids is None else _ga._as_torch(ids)[0]
    elif ids is not None and type(ids) is not torch.Tensor:
        ids = _ga._as_torch(ids)[0]
    key = ("draw", backend, counts.shape, counts.dtype, counts.device, ids is None, check, kind)
    try:
        plan = _CALLS[key]
    except (KeyError, TypeError):
        plan = _plan(key, _DrawPlan, counts, ids is not None, backend, check, kind,
                     q.batch_shape, q.width)
    return plan(counts, ids, keys, out)


class _VerifyPlan(_CallPlan):
    """verify of one configuration: a target [B, k+1, V] on one device (float32
    probabilities, or with ``logits`` float32 / float16 / bfloat16 logits), q None or of
    one width and kind, greedy flags given or not, ``check``."""

    __slots__ = ("backend", "be", "dev", "didx", "b", "k", "v", "w", "check", "lazy",
                 "greedy", "specs", "kind", "run", "bk", "qshape", "zeros", "ragged", "logits",
                 "x_dtype", "top_k")

    def __init__(self, t, q_width, greedy, backend, check, lazy, kind, ragged=False,
                 logits=False, top_k=True):
        torch = _ga._TORCH
        self.be = _backend.get(backend)
        self.backend, self.check, self.lazy, self.kind = backend, check, lazy, kind
        # the target's dtype as the runner reads it: 16-bit logits widened to float32
        # (exact) for backends that read float32 only (numba), as ``_ga._x_flat``
        self.logits = logits
        self.top_k = top_k  # with logits: a top_k given (None: no row has a top-k cut)
        self.x_dtype = t.dtype if self.be.reads_half_precision else torch.float32
        if logits:
            if not self.be.device_logits_verify:
                raise _backend.BackendUnavailable(
                    f"verify(logits=True): backend {backend!r} has no kernels for it on GPU "
                    f"arrays; use backend 'cuda' or 'numba', or host arrays with backend 'cpu', "
                    f"'reference' or 'numba'")
            _ga._float_dtype(t, "target")
        elif t.dtype != torch.float32:
            raise TypeError(f"target: dtype {_arrays.dtype_name(t)}; expected float32 "
                            f"probabilities")
        if t.dim() != 3:
            raise ValueError(f"target: expected shape [B, k+1, V], got {tuple(t.shape)}")
        b, k1, v = t.shape
        _validate.vocab(v, "target")
        if k1 < 1:
            raise ValueError("target: needs k+1 >= 1 rows per request")
        self.b, self.k, self.v, self.w = b, k1 - 1, v, q_width
        self.bk = (b, k1 - 1)
        self.qshape = (b, k1 - 1, q_width)
        self.greedy = greedy
        self.ragged = ragged  # num_drafts given (int32 [B], converted per call)
        self.dev = dev = t.device
        self.didx = t.get_device()
        self.zeros = None
        if not greedy:  # the flags of no greedy request (read by some routes)
            self.zeros = torch.zeros(b, dtype=torch.uint8, device=dev)
        self.specs = (("accepted", (b,), torch.int32), ("tokens", (b, k1), torch.int32),
                      ("status", (b,), torch.int32))
        self.run = None

    def make_run(self):
        if self.logits:
            return self.be.verify_logits_runner(self.b, self.k + 1, self.v, self.w,
                                                self.x_dtype, top_k=self.top_k)
        if self.ragged:
            return self.be.verify_runner(self.b, self.k + 1, self.v, self.w, self.greedy,
                                         self.lazy and not self.greedy, ragged=True)
        return self.be.verify_runner(self.b, self.k + 1, self.v, self.w, self.greedy,
                                     self.lazy and not self.greedy)

    def __call__(self, t, draft, q, keys, out, greedy, num_drafts=None, params=None):
        torch = _ga._TORCH
        if t.dtype != self.x_dtype:
            t = t.float()
        if not t.is_contiguous():
            t = t.contiguous()
        b, v, didx, check = self.b, self.v, self.didx, self.check
        nd = None
        if self.ragged:  # validated first (check=True), the draft rule then on draft[b, :n_b]
            nd, nd_host = _ga._num_drafts(num_drafts, b, self.k, self.dev, check)
            if check:  # on the ids as given (before any int32 conversion)
                dh = _arrays.int_to_numpy(draft, "draft", host_copy=True)
                if dh.shape == self.bk:
                    _validate.ragged_drafts(nd_host, dh, v)
            check = False
        if _ga._on(draft, didx, torch) and draft.dtype == torch.int32:
            d = draft
            if d.shape != self.bk:  # torch.Size == tuple
                raise ValueError(f"draft: shape {tuple(d.shape)} must be (B, k) = {self.bk} "
                                 f"to match target")
            if check and d.numel():
                _ga._check_draft(d, v)
        else:
            d = _ga._draft(draft, self.bk, self.dev, check, v)
        if self.logits:  # (temperature, top_k, top_p, min_p) as four device tensors [B]
            params = _ga._logits_params(*params, b, self.dev, self.check)
        qc = qi = None
        if q is not None:
            # q's fields read directly (the public properties cost a Python call each); a q
            # that is not a Dyadic raises in verify_q before they are read
            # (the key fixed q's width: a q of this plan has counts [B, k, width])
            if type(q) is not Dyadic or q._vocab_size != v or q._counts.shape != self.qshape:
                verify_q(q, b, self.k, v)  # raises for the rule q breaks
            qc = q._counts
            if not _ga._on(qc, didx, torch):
                qc = _ga._host_tensor(qc, self.dev).contiguous()
            qi = q._ids
            if qi is not None and not _ga._on(qi, didx, torch):
                qi = _ga._host_tensor(qi, self.dev).contiguous()
        check = self.check
        g = self.zeros if greedy is None else _ga._greedy(greedy, b, self.dev, didx)
        keys_b = _ga._keys(keys, b, check, self.k)
        accepted, tokens, status = _ga._outputs(out, self.dev, self.specs)
        if b:
            tok = _ga._enter(self.backend, self.dev)
            try:
                run = self.run or self.runner()
                if self.logits:
                    run(t, d, qc, qi, g, params, keys_b, accepted, tokens, status, nd)
                elif nd is None:
                    run(t, d, qc, qi, g, keys_b, accepted, tokens, status)
                else:
                    run(t, d, qc, qi, g, keys_b, accepted, tokens, status, nd)
            finally:
                if tok is not None:
                    _ga._leave(tok)
        if check:
            _ga._finish(status, check)
        kind = self.kind
        if kind == "torch":
            return trusted_verdict(accepted, tokens, None if check else status)
        return Verdict(_ga._back(accepted, kind), _ga._back(tokens, kind),
                       None if check else _ga._back(status, kind))


def verify(target, draft, q, keys, *, greedy, backend, check=True, out=None, num_drafts=None,
           logits=False, params=None):
    """``params``: (temperature, top_k, top_p, min_p) as given to dyadic.verify (with
    ``logits``).  check="lazy" on logits targets validates every row it uses, as
    check=False (each row's processing reads all of it)."""
    # (any string other than "lazy" was refused by dyadic.verify)
    lazy = check is not True and check is not False and check == "lazy"
    if lazy:
        check = False
    if type(target) is (_ga._TORCH or _ga._torch()).Tensor:
        t, kind = target, "torch"
    else:
        t, kind = _ga._as_torch(target)
    if q is None:
        qk = qw = None
    elif type(q) is Dyadic:
        qw = q._counts.shape[-1]
        qk = (qw, q._ids is None)
    else:  # refused by verify_q in the call
        qk = qw = 0
    ragged = num_drafts is not None
    top_k = logits and params[1] is not None
    key = ("verify", backend, t.shape, t.dtype, t.device, qk, greedy is None, check, lazy,
           kind, ragged, logits, top_k)
    try:
        plan = _CALLS[key]
    except (KeyError, TypeError):
        plan = _plan(key, _VerifyPlan, t, qw or 0, greedy is not None, backend, check, lazy,
                     kind, ragged, logits, top_k)
    return plan(t, draft, q, keys, out, greedy, num_drafts, params)


__all__ = ["allocate", "draw", "propose", "verify", "GPU_BACKENDS"]
