"""The public primitives: validate, dispatch to a backend, raise for bad rows."""

import sys

import numpy as np

from . import _arrays, _backend, _status, _validate
from ._types import Dyadic, Keys, Verdict, trusted_dyadic, verify_q


def _on_device(backend, x):
    """GPU hook: GPU arrays with backend "cuda"/"numba" take dyadic/_device.py.

    ``check`` and ``out`` (all primitives) apply to that path: see its docstring.
    """
    if type(x) is _TENSOR[0]:  # torch.Tensor (exact type): the eager hot path
        return backend in _backend.GPU_BACKENDS and x.is_cuda
    if _TENSOR[0] is _NoTensor and "torch" in sys.modules:
        _TENSOR[0] = sys.modules["torch"].Tensor
    return backend in _backend.GPU_BACKENDS and _arrays.is_gpu_array(x)


class _NoTensor:
    pass


_TENSOR = [_NoTensor]  # torch.Tensor once torch is imported (never imported here)
_DEVICE = []  # [dyadic._device] once a GPU array was seen


def _gpu():
    """dyadic._device (imported on first use: it needs torch)."""
    if not _DEVICE:
        from . import _device as mod
        _DEVICE.append(mod)
    return _DEVICE[0]


def _host_outputs(out, specs, kind):
    """The outputs of a host call: [(NumPy array the backend writes, the object returned)]
    per (name, shape, dtype) spec (None gives (None, None)).

    ``out``: None or a dict of preallocated NumPy arrays / torch CPU tensors, each with
    exactly the spec's shape and dtype, C-contiguous and writeable; the results are
    written into them and they are returned.  Unknown names raise ValueError.
    """
    if out is not None:
        if not isinstance(out, dict):
            raise TypeError(f"out: expected a dict of preallocated outputs, got "
                            f"{type(out).__name__}")
        names = {spec[0] for spec in specs if spec is not None}
        unknown = sorted(set(out) - names)
        if unknown:
            raise ValueError(f"out: unknown output(s) {unknown}; this call writes "
                             f"{sorted(names)}")
    got = []
    for spec in specs:
        if spec is None:
            got.append((None, None))
            continue
        name, shape, dtype = spec
        given = None if out is None else out.get(name)
        if given is None:
            a = np.empty(shape, dtype=dtype)
            got.append((a, _arrays.output(a, kind)))
            continue
        got.append((_arrays.out_view(given, f"out[{name!r}]", shape, dtype), given))
    return got


def _dyadic(counts, ids, batch_shape, v, policy, out):
    """The Dyadic over a host call's counts / ids.  Arrays dyadic allocated are made
    read-only; the caller's ``out=`` buffers stay writeable (they are shared, to be
    reused by the next call)."""
    shape = tuple(batch_shape) + (counts.shape[-1],)
    if tuple(counts.shape) != shape:
        counts = counts.reshape(shape)
        ids = None if ids is None else ids.reshape(shape)
    for name, a in (("counts", counts), ("ids", ids)):
        if isinstance(a, np.ndarray) and (out is None or out.get(name) is None):
            a.flags.writeable = False
    return trusted_dyadic(counts, ids, v, policy, readonly=False)


def allocate(x, *, logits=False, temperature=1.0, bias=None, top_k=None, policy="standard",
             backend="cpu", check=True, out=None, top_p=None, min_p=None):
    """Integer ticket counts c_v >= 0 with sum exactly 2**24 per row.

    Parameters
    ----------
    x : float32 / float16 / bfloat16 array [..., V] (NumPy or torch CPU)
        Non-negative weights (any scale; ``logits=False``) or logits
        (``logits=True``; -inf masks a token).
    logits : bool
        Interpret ``x`` as logits: weights are exp((x + bias) / temperature)
        through the integer exponential of docs/semantics.md.
    temperature : float or float array [B]
        > 0 and finite; logits only.
    bias : float32 array [V] or [..., V], optional
        Additive logit bias (logits only); -inf masks.
    top_k : int or integer array [B], optional
        Select the global support first (largest effective value first, ties
        to the lowest id), normalise within it, allocate on it, drop zero
        counts.  The result is sparse with width min(top_k, V); an array gives
        each row its own top_k (each >= 1; width min(max(top_k), V), rows with
        fewer entries padded).
    policy : {"standard", "floor-first"}
        ``dyadic24-standard-v1`` (floor + largest remainders, ties lowest id)
        or ``dyadic24-floor-first-v1`` (floor, remaining tickets to the
        largest-value token).
    backend : str
        "cpu", "reference", "cuda" or "numba".
    check : bool
        True (default): a row that breaks a data rule raises ValueError naming
        the row, the rule and its status code.  False: that row fails closed
        (outputs -1, counts 0) with its status code in ``out["status"]``;
        every other row is computed as without it; nothing raises for data
        (shape, dtype and argument errors still raise).
    out : dict, optional
        Preallocated outputs by name (``counts`` [B, W], ``ids`` [B, W] when
        sparse, ``status`` int32 [B]; B the flattened batch), each exactly the
        shape and dtype returned; NumPy arrays or torch CPU tensors on the host, device
        tensors on a GPU backend.  They are written and returned.
    top_p, min_p : float or float array [B], optional
        Logits only: the filters of ``verify(..., logits=True)``
        (docs/semantics.md section 2 "Target logits"): min-p, then top-k, then
        top-p on the ranking by z = (x + bias) / temperature, on the integer
        weights; the allocation runs on the kept tokens (the support is the
        filtered prefix; with top_k the sparse width stays min(top_k, V)).
        top_p in (0, 1] (1: off), min_p in [0, 1] (0: off), both converted to
        float32.  Backends "cpu", "reference" and "numba" (host arrays), and
        "cuda" on GPU arrays with ``top_k`` given (a width of at most 1024; top_p /
        min_p may be device tensors, a per-row top_k is read on the host).

    Returns
    -------
    Dyadic with counts uint32 [..., W] (and ids int32 [..., W] when sparse),
    outputs of the same kind (NumPy / torch) as ``x``.

    Raises ValueError naming the row and rule for NaN, +inf, negative
    weights and zero effective mass; TypeError for unsupported dtypes.

    Compatibility guarantee: counts are a pure function of the input bits,
    the arguments and the semantic id: identical on every backend and
    platform.

    Examples
    --------
    >>> import numpy as np, dyadic
    >>> q = dyadic.allocate(np.array([[0.5, 0.25, 0.25]], dtype=np.float32))
    >>> q.counts.tolist()
    [[8388608, 4194304, 4194304]]
    """
    if check is not True and check is not False:
        check = _validate.check_mode(check)
    filtered = (top_p is not None or min_p is not None
                or (top_k is not None and type(top_k) is not int and _per_row(top_k)))
    if _on_device(backend, x):  # GPU path (dyadic/_device.py)
        if filtered:
            return _gpu().filtered(x, None, propose=False, logits=logits,
                                   temperature=temperature, bias=bias, top_k=top_k,
                                   top_p=top_p, min_p=min_p, policy=policy, backend=backend,
                                   check=check, out=out)
        return _gpu().allocate(x, logits=logits, temperature=temperature, bias=bias,
                               top_k=top_k, policy=policy, backend=backend, check=check, out=out)
    code = _validate.policy(policy)
    be = _backend.get(backend)
    kind = _arrays.kind_of(x)
    x2, b2, batch_shape = _validate.logits_and_bias(x, bias)
    batch, v = x2.shape
    if logits:
        temp = _validate.temperature(temperature, batch, allow_zero=False)
    else:
        if bias is not None or not (np.ndim(temperature) == 0 and temperature == 1.0):
            raise ValueError("temperature/bias: apply only to logits (logits=True); "
                             "weights are used as given")
        if filtered:
            raise ValueError("top_p/min_p/per-row top_k: apply only to logits (logits=True)")
        temp = np.ones(batch, dtype=np.float64)
    if filtered:
        width, filt = _filter_params(be, top_k, top_p, min_p, batch, v, check)
    else:
        width = _validate.top_k(top_k, v)
    (counts, counts_r), (ids, ids_r), (status, _) = _host_outputs(out, (
        ("counts", (batch, width or v), np.uint32),
        ("ids", (batch, width), np.int32) if width else None,
        ("status", (batch,), np.int32)), kind)
    status[...] = 0
    if batch and filtered:
        be.allocate_filtered(x2, b2, temp, *filt, code, width or 0, counts, ids, status)
    elif batch:
        be.allocate(x2, b2, temp, bool(logits), code, width or 0, counts, ids, status)
    if status.any():
        if check:
            _status.raise_for_status(status, _status.row_label(batch_shape))
    return _dyadic(counts_r, ids_r, batch_shape, v, policy, out)


def _per_row(top_k):
    """Whether ``top_k`` is a per-row array (NumPy array, list, tuple, torch tensor).
    allocate / propose take the filtered route for one, or for top_p / min_p given; they
    test those and a Python int / None top_k inline before calling this."""
    return isinstance(top_k, (np.ndarray, list, tuple)) or _arrays.is_torch(top_k)


def _filter_params(be, top_k, top_p, min_p, batch, v, check):
    """(width, (top_k int64 [B], top_p float32 [B], min_p float32 [B])) of a filtered
    allocate / propose call on backend ``be``."""
    if not be.has_logits_filters:
        raise _backend.BackendUnavailable(
            f"backend {be.name!r} does not implement top_p / min_p / per-row top_k in "
            f"allocate and propose; use backend 'cpu', 'reference' or 'numba'")
    width, tk = _validate.top_k_rows(top_k, v, batch, check=check is True)
    _, _, tp, mp = _validate.logits_target_params(1.0, None, top_p, min_p, batch,
                                                  check=check is True)
    return width, (tk, tp, mp)


def _keys_for(keys, batch, extra=0):
    if not isinstance(keys, Keys):
        raise TypeError(f"keys: expected dyadic.Keys, got {type(keys).__name__}")
    return keys.broadcast(batch, position_extra=extra)


def draw(q, keys, *, backend="cpu", check=True, out=None):
    """Draw one token per row of ``q``.

    r = (word 0 of Philox(counter(PROPOSAL, position, draw index 0))) >> 8 is a
    uniform 24-bit integer; the token is the first id whose cumulative count
    is strictly greater than r.

    Parameters
    ----------
    q : Dyadic, batch shape (B,) (or any shape; rows are flattened in C order)
    keys : Keys broadcast over the B rows.
    check : bool
        Accepted for symmetry (a Dyadic is valid by construction); a row that
        is not a valid Dyadic row anyway draws -1.
    out : dict, optional
        ``{"tokens": int32 [B]}`` preallocated, written and returned.

    Returns int32 tokens of shape ``q.batch_shape``.
    """
    if check is not True and check is not False:
        check = _validate.check_mode(check)
    if not isinstance(q, Dyadic):
        raise TypeError(f"q: expected a dyadic.Dyadic, got {type(q).__name__}")
    if _on_device(backend, q.counts):  # GPU path (dyadic/_device.py)
        return _gpu().draw(q, keys, backend=backend, check=check, out=out)
    be = _backend.get(backend)
    counts, ids = q._numpy()
    batch = int(np.prod(q.batch_shape, dtype=np.int64))
    k = _keys_for(keys, batch)
    ((tokens, tokens_r),) = _host_outputs(out, (("tokens", (batch,), np.int32),),
                                          _arrays.kind_of(q.counts))
    c2 = np.ascontiguousarray(counts.reshape(batch, q.width))
    i2 = None if ids is None else np.ascontiguousarray(ids.reshape(batch, q.width))
    if batch:
        be.draw(c2, i2, *k, tokens)
    return tokens_r if len(q.batch_shape) == 1 else tokens_r.reshape(q.batch_shape)


def propose(logits, keys, *, temperature=1.0, bias=None, top_k=32, policy="standard",
            backend="cpu", check=True, out=None, top_p=None, min_p=None):
    """Allocate q from logits and draw a token from it, in one call.

    Parameters
    ----------
    logits : float32 / float16 / bfloat16 [B, V]
    keys : Keys over B rows; the draw uses the PROPOSAL domain at
        ``keys.position``.
    temperature : float or float array [B]
        >= 0; a row with temperature 0 returns its argmax of x + bias (ties:
        lowest id) with q the point mass on it, and consumes no randomness.
    bias, top_k, policy : as in ``allocate`` (top_k=None gives dense q; an
        integer array [B] gives each row its own top_k).
    top_p, min_p : float or float array [B], optional
        As in ``allocate``: q is allocated on the tokens kept by min-p, top-k and
        top-p (the support is the filtered prefix of the ranking by z; the sparse
        width stays min(top_k, V)).  Temperature-0 rows check them but return
        the argmax.
    check : bool
        True (default): a row that breaks a data rule raises ValueError naming
        the row, the rule and its status code.  False: that row fails closed
        (outputs -1, counts 0) with its status code in ``out["status"]``;
        every other row is computed as without it; nothing raises for data
        (shape, dtype and argument errors still raise).
    out : dict, optional
        Preallocated outputs by name (``tokens`` int32 [B], ``counts``,
        ``ids``, ``status`` int32 [B]), each exactly the shape and dtype
        returned; NumPy arrays or torch CPU tensors on the host, device
        tensors on a GPU backend.  They are written and returned.

    Returns
    -------
    (tokens int32 [B], q Dyadic [B])
    """
    if check is not True and check is not False:
        check = _validate.check_mode(check)
    filtered = (top_p is not None or min_p is not None
                or (top_k is not None and type(top_k) is not int and _per_row(top_k)))
    if _on_device(backend, logits):  # GPU path (dyadic/_device.py)
        if filtered:
            return _gpu().filtered(logits, keys, propose=True, logits=True,
                                   temperature=temperature, bias=bias, top_k=top_k,
                                   top_p=top_p, min_p=min_p, policy=policy, backend=backend,
                                   check=check, out=out)
        return _gpu().propose(logits, keys, temperature=temperature, bias=bias, top_k=top_k,
                              policy=policy, backend=backend, check=check, out=out)
    code = _validate.policy(policy)
    be = _backend.get(backend)
    kind = _arrays.kind_of(logits)
    x2, b2, batch_shape = _validate.logits_and_bias(logits, bias, "logits")
    if len(batch_shape) != 1:
        raise ValueError(f"logits: expected shape [B, V], got {tuple(batch_shape) + (x2.shape[1],)}")
    batch, v = x2.shape
    temp = _validate.temperature(temperature, batch, allow_zero=True)
    if filtered:
        width, filt = _filter_params(be, top_k, top_p, min_p, batch, v, check)
    else:
        width = _validate.top_k(top_k, v)
    k = _keys_for(keys, batch)
    (tokens, tokens_r), (counts, counts_r), (ids, ids_r), (status, _) = _host_outputs(out, (
        ("tokens", (batch,), np.int32),
        ("counts", (batch, width or v), np.uint32),
        ("ids", (batch, width), np.int32) if width else None,
        ("status", (batch,), np.int32)), kind)
    status[...] = 0
    if batch and filtered:
        be.propose_filtered(x2, b2, temp, *filt, code, width or 0, *k, tokens, counts, ids,
                            status)
    elif batch:
        be.propose(x2, b2, temp, code, width or 0, *k, tokens, counts, ids, status)
    if status.any():
        if check:
            _status.raise_for_status(status, lambda r: r)
    return tokens_r, _dyadic(counts_r, ids_r, batch_shape, v, policy, out)


def verify(target, draft, q, keys, *, greedy=None, backend="cpu", check=True, out=None,
           num_drafts=None, logits=False, temperature=1.0, top_k=None, top_p=None,
           min_p=None):
    """Standard speculative verification of a fixed-depth draft chain.

    Leviathan et al. 2023, algorithm 1, in exact integers: draft d_i is
    accepted with probability min(1, p_i(d_i) / q_i(d_i)) (domain ACCEPTANCE
    at position + i); at the first rejection a token is drawn from
    max(p_i - q_i, 0) over the full vocabulary (domain CORRECTION at
    position + i); when all k are accepted a bonus token is drawn from p_k
    (domain CORRECTION at position + k).

    Parameters
    ----------
    target : float32 [B, k+1, V], or logits [B, k+1, V] with ``logits=True``
        Target probabilities after the target's own processing (T=1,
        top_p=1); each row must sum to 1 within 2**-10.  With ``logits=True``:
        the target's logits, float32 / float16 / bfloat16 (NumPy float32 /
        float16 or torch tensors; widened exactly to float32), processed per
        request into an exact integer distribution (below).
    draft : integer [B, k]
        The proposed tokens.
    q : Dyadic with batch shape (B, k), dense or sparse, or None
        The q each draft token was sampled from.  None means point-mass q (a
        greedy draft): never a silent default.
    keys : Keys over B rows; ``position`` is that of draft[:, 0].
    greedy : bool [B], optional
        Rows verified against the target argmax (ties: lowest id): accept
        while d_i == argmax p_i, then emit argmax; no randomness.
    check : True, False or "lazy"
        True (default): the first request that breaks a rule raises
        ValueError naming the row, the rule and its status code.  False: that
        request fails closed (accepted 0, tokens -1) with its code in
        ``Verdict.status``; the other requests are computed as without it; a
        draft id outside [0, V) is such a data error (DRAFT_OUT_OF_RANGE).
        "lazy" (GPU arrays on backend "cuda") reads and validates only the
        target data the decisions need (dyadic/_device.py); elsewhere it
        validates everything, as False.  Results on valid input are identical
        in every mode.
    out : dict, optional
        Preallocated ``accepted`` int32 [B], ``tokens`` int32 [B, k+1],
        ``status`` int32 [B], written and returned.
    num_drafts : integer array [B], optional
        Ragged draft lengths: request b verifies only ``draft[b, :n_b]``,
        ``0 <= n_b <= k`` (NumPy or torch CPU; on the GPU path a device
        tensor, read by the kernels without a copy or a synchronisation
        when ``check`` is False or "lazy").  Target rows ``0..n_b`` are used
        (row n_b gives the bonus); target rows beyond, q rows and draft
        entries from n_b on are padding: never read nor validated (they may
        hold anything).  ``n_b = 0`` draws the bonus from target row 0 at
        ``keys.position``.  A request gives the tokens, accepted count and
        status of the same request verified alone with k = n_b (bit for
        bit), its tokens padded with -1 to k+1.  ``check=True`` raises
        ValueError for a count outside [0, k]; with ``check=False`` /
        "lazy" such a request fails closed with status NUM_DRAFTS_INVALID.
        None: every request has k drafts.  ``dyadic.ragged`` maps vLLM-style
        flat arrays to and from this padded layout.
    logits : bool
        ``target`` holds logits.  Each target row becomes the processed target
        of docs/semantics.md section 2 "Target logits": ``z = float64(x) /
        float64(temperature)``, integer weights ``W_v`` by the fixed-point
        exponential of ``allocate(logits=True)`` (``W(zmax) = 2**39``; -inf
        masks a token), then the filters min-p, top-k, top-p (in this order) on
        the ranking by z (descending, ties to the lowest id); ``p(v) = P_v / T``
        with ``P_v = W_v * 2**s`` on the kept tokens (``T`` in [2**62, 2**63]).
        Verification is section 5 with these P and T.  With ``num_drafts``
        only target rows ``0..n_b`` are processed and validated.  NaN or +inf
        in a row (after the division) is TARGET_INVALID_VALUE; a row of only
        -inf is TARGET_ZERO_MASS.
    temperature : float or float array [B]
        ``logits=True`` only.  Finite and >= 0; 0 verifies the request greedily
        on the argmax of its logits (float value, ties to the lowest id), as
        ``greedy``: no randomness, q not consulted.
    top_k : int or integer array [B], optional
        ``logits=True`` only.  >= 0; keep the first ``top_k`` ranked tokens
        surviving min-p (None / 0: off).
    top_p : float or float array [B], optional
        ``logits=True`` only.  In (0, 1], converted to float32; with
        ``u = ceil(top_p * 2**24)`` keep the shortest ranked prefix of the
        survivors whose weight reaches ``ceil(u * Ts / 2**24)``, ``Ts`` their
        total weight (None / 1: off).
    min_p : float or float array [B], optional
        ``logits=True`` only.  In [0, 1], converted to float32; with
        ``mp = ceil(min_p * 2**24)`` keep the tokens with ``W_v * 2**24 >=
        mp * 2**39`` (None / 0: off).

        With ``check=True`` a parameter out of range raises ValueError naming
        it and the row; with ``check=False`` (or "lazy") that request fails
        closed with status TEMPERATURE_INVALID, TOP_K_INVALID, TOP_P_INVALID or
        MIN_P_INVALID.

    Returns
    -------
    Verdict(accepted int32 [B], tokens int32 [B, k+1], status int32 [B] or None
    with check=True).

    Compatibility guarantee: accepted counts and tokens are a pure function of
    the input bits, the arguments and the key fields, identical on every
    backend that implements the call (``logits=True``: ``cpu``, ``reference``,
    ``numba``).

    Examples
    --------
    >>> import numpy as np, dyadic
    >>> logits = np.array([[[2.0, 1.0, -np.inf]]], dtype=np.float32)  # B=1, k=0
    >>> v = dyadic.verify(logits, np.zeros((1, 0), np.int32), None, dyadic.Keys(seed=1),
    ...                   logits=True, temperature=0.0)
    >>> v.tokens.tolist()
    [[0]]
    """
    if check is not True and check is not False:
        check = _validate.check_mode(check, lazy=True)
    if logits is not True and logits is not False:
        raise TypeError(f"logits: expected True or False, got {logits!r}")
    if not logits and not ((temperature is None or (type(temperature) is float
                                                    and temperature == 1.0)
                            or (np.ndim(temperature) == 0 and temperature == 1.0))
                           and top_k is None and top_p is None and min_p is None):
        raise ValueError("temperature/top_k/top_p/min_p: apply only to target logits "
                         "(logits=True); target probabilities are used as given")
    if _on_device(backend, target):  # GPU path (dyadic/_device.py)
        if logits:
            return _gpu().verify(target, draft, q, keys, greedy=greedy, backend=backend,
                                 check=check, out=out, num_drafts=num_drafts, logits=True,
                                 params=(1.0 if temperature is None else temperature, top_k,
                                         top_p, min_p))
        return _gpu().verify(target, draft, q, keys, greedy=greedy, backend=backend,
                             check=check, out=out, num_drafts=num_drafts)
    be = _backend.get(backend)
    if logits and not be.has_logits_verify:
        raise _backend.BackendUnavailable(
            f"backend {backend!r} does not implement verify with logits=True; use "
            f"backend 'cpu', 'reference' or 'numba'")
    kind = _arrays.kind_of(target)
    t, d, g, batch, k, v = _validate.verify_inputs(
        target, draft, greedy, check=check is True and num_drafts is None, logits=logits)
    nd = None
    if num_drafts is not None:  # ragged: only draft[b, :n_b] is verified (and checked)
        nd = _validate.num_drafts(num_drafts, batch, k, check=check is True)
        if check is True:
            _validate.ragged_drafts(nd, d, v)
    if logits:
        params = _validate.logits_target_params(temperature, top_k, top_p, min_p, batch,
                                                check=check is True)
    verify_q(q, batch, k, v)
    keys_b = _keys_for(keys, batch, extra=k)
    qc = qi = None
    if q is not None:
        qc, qi = q._numpy()
        qc = np.ascontiguousarray(qc)
        qi = None if qi is None else np.ascontiguousarray(qi)
    (accepted, accepted_r), (tokens, tokens_r), (status, status_r) = _host_outputs(out, (
        ("accepted", (batch,), np.int32), ("tokens", (batch, k + 1), np.int32),
        ("status", (batch,), np.int32)), kind)
    status[...] = 0
    if batch and logits:
        be.verify_logits(t, d, qc, qi, g, *params, *keys_b, accepted, tokens, status,
                         num_drafts=nd)
    elif batch:
        be.verify(t, d, qc, qi, g, *keys_b, accepted, tokens, status, num_drafts=nd)
    if status.any():
        if check is True:
            _status.raise_for_status(status)
    return Verdict(accepted_r, tokens_r, None if check is True else status_r)


def philox4x32(counter, key, rounds=10, *, backend="cpu"):
    """The raw Philox4x32 generator (Random123 constants).

    counter : uint32 array [..., 4]; key : uint32 array [..., 2] (broadcast).
    Returns uint32 [..., 4].  ``philox4x32([0]*4, [0]*2)`` is
    ``[0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]`` (Random123 kat_vectors).
    """
    be = _backend.get(backend)
    c = np.asarray(counter)
    k = np.asarray(key)
    for name, a, n in (("counter", c, 4), ("key", k, 2)):
        if a.dtype.kind not in "iu" or a.shape[-1:] != (n,):
            raise ValueError(f"{name}: expected an integer array [..., {n}], got {a.dtype} {a.shape}")
        if a.size and (a.min() < 0 or a.max() > 0xFFFFFFFF):
            raise ValueError(f"{name}: words must be in [0, 2**32)")
    if isinstance(rounds, bool) or not isinstance(rounds, (int, np.integer)) or not 0 <= rounds <= 16:
        raise ValueError(f"rounds: expected an int in [0, 16], got {rounds!r}")
    shape = np.broadcast_shapes(c.shape[:-1], k.shape[:-1])
    c2 = np.ascontiguousarray(np.broadcast_to(c, shape + (4,)).reshape(-1, 4).astype(np.uint32))
    k2 = np.ascontiguousarray(np.broadcast_to(k, shape + (2,)).reshape(-1, 2).astype(np.uint32))
    out = np.empty_like(c2)
    if c2.shape[0]:
        be.philox4x32(c2, k2, int(rounds), out)
    return out.reshape(shape + (4,))


def available_backends():
    """Names of the backends that load and can run here (always 'reference')."""
    return _backend.available()
