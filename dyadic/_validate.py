"""Every structural input rule, one place, one error style.

Data rules that need a pass over the values (NaN, negative weights, target
sums, q(d) = 0) are checked inside the kernels and reported through status
codes (``_status``), so they cost no extra pass; the rules here are the ones
decidable from shapes, dtypes and small arrays.
"""

import numpy as np

from . import _arrays, _spec

_I64 = 1 << 63
_INF = float("inf")


def policy(name):
    if not isinstance(name, str):
        raise TypeError(f"policy: expected a str, got {type(name).__name__}")
    if name not in _spec.POLICY_CODES:
        raise ValueError(f"policy: unknown policy {name!r}; expected one of "
                         f"{sorted(_spec.POLICY_CODES)}")
    return _spec.POLICY_CODES[name]


def vocab(v, name="x"):
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{name}: vocabulary size must be an int, got {type(v).__name__} {v!r}")
    if not 1 <= v <= _spec.MAX_VOCAB:
        raise ValueError(f"{name}: vocabulary size {v} out of range [1, {_spec.MAX_VOCAB}]")


def top_k(k, v):
    """Validated top_k: None (dense) or the sparse width min(k, V)."""
    if k is None:
        return None
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"top_k: expected an int or None, got {type(k).__name__}")
    if k < 1:
        raise ValueError(f"top_k: must be >= 1 (or None for dense support), got {k}")
    return int(min(k, v))


def temperature(t, batch, *, allow_zero):
    """Temperatures as float64 [batch]; each finite and > 0 (or == 0 if allowed)."""
    if type(t) is float or (type(t) is int and -_I64 <= t < _I64):
        # fast path for a Python scalar: same values and messages as below
        f = float(t)
        if batch and not (f > 0.0 and f != _INF or (allow_zero and f == 0.0)):
            rule = ">= 0 (0 means greedy argmax)" if allow_zero else "> 0"
            raise ValueError(f"temperature: row 0: value {f!r} must be finite and {rule}")
        return np.array([f] * batch, dtype=np.float64) if batch <= 64 else np.full(batch, f)
    if _arrays.is_torch(t):
        t = t.detach().cpu().numpy()
    arr = np.asarray(t)
    if arr.dtype.kind not in "fiu":
        raise TypeError(f"temperature: expected a number or a 1-D float array, got {arr.dtype}")
    if arr.ndim > 1 or (arr.ndim == 1 and arr.shape[0] not in (1, batch)):
        raise ValueError(f"temperature: expected a scalar or shape ({batch},), got {arr.shape}")
    arr = np.ascontiguousarray(np.broadcast_to(arr.astype(np.float64), (batch,)))
    ok = np.isfinite(arr) & ((arr > 0) | (allow_zero & (arr == 0)))
    if not ok.all():
        r = int(np.flatnonzero(~ok)[0])
        rule = ">= 0 (0 means greedy argmax)" if allow_zero else "> 0"
        raise ValueError(f"temperature: row {r}: value {float(arr[r])!r} must be finite and {rule}")
    return arr


def logits_and_bias(x, bias, name="x"):
    """x as float32 [B, V] (with its batch shape) and bias as float32 [1 or B, V]."""
    xs = _arrays.float_to_numpy(x, name)
    if xs.ndim < 1:
        raise ValueError(f"{name}: expected shape [..., V], got a scalar")
    batch_shape, v = xs.shape[:-1], xs.shape[-1]
    vocab(v, name)
    x2 = np.ascontiguousarray(xs.reshape(-1, v))
    if bias is None:
        return x2, None, batch_shape
    b = _arrays.float_to_numpy(bias, "bias")
    if b.shape[-1:] != (v,):
        raise ValueError(f"bias: last dimension {b.shape[-1:]} does not match the vocabulary {v}")
    if b.ndim == 1:
        b2 = b.reshape(1, v)
    elif b.shape == xs.shape:
        b2 = b.reshape(-1, v)
    else:
        raise ValueError(f"bias: shape {b.shape} must be ({v},) or equal to {name}'s {xs.shape}")
    return x2, np.ascontiguousarray(b2), batch_shape


def dyadic_parts(counts, ids, vocab_size, policy_name):
    """Validate the parts of a user-constructed ``Dyadic``.

    Returns (counts, ids, vocab_size): private copies of the caller's arrays, of the
    same kind and device (the caller's arrays are never shared or modified), and the
    vocabulary size as an int.
    """
    dyadic_policy(policy_name)
    vocab_size = _int_arg(vocab_size, "vocab_size") if vocab_size is not None else None
    c_own, c = _arrays.owned_copy(counts, "counts")
    if c.ndim < 1:
        raise ValueError("counts: expected shape [..., W], got a scalar")
    if c.dtype != np.uint32:
        raise TypeError(f"counts: dtype {_arrays.dtype_name(c)}; expected uint32")
    width = c.shape[-1]
    if width < 1:
        raise ValueError(f"counts: width (last dimension) is 0; expected at least 1 entry "
                         f"per row, got shape {c.shape}")
    i_own = i = None
    if ids is None:
        if vocab_size is None:
            vocab_size = width
        vocab(vocab_size, "vocab_size")
        if vocab_size != width:
            raise ValueError(f"counts: dense width {width} != vocab_size {vocab_size}")
    else:
        if vocab_size is None:
            raise ValueError("vocab_size: required for sparse rows")
        vocab(vocab_size, "vocab_size")
        i_own, i = _arrays.owned_copy(ids, "ids")
        if i.dtype != np.int32:
            raise TypeError(f"ids: dtype {_arrays.dtype_name(i)}; expected int32")
        if i.shape != c.shape:
            raise ValueError(f"ids: shape {i.shape} != counts shape {c.shape}")
        if _arrays.kind_of(ids) != _arrays.kind_of(counts) or (
                _arrays.is_gpu_array(ids) != _arrays.is_gpu_array(counts)):
            raise TypeError("ids: must be the same kind of array (NumPy, torch, CuPy) on the "
                            "same device as counts")
    dyadic_rows(c, i, vocab_size)
    return c_own, i_own, vocab_size


def dyadic_rows(counts, ids, vocab_size):
    """Every row rule of a Dyadic on host arrays: uint32 counts [..., W] summing to
    2**24; sparse int32 ids [..., W] strictly ascending in [0, vocab_size), then -1
    padding with count 0.  Raises ValueError naming the argument, the row and the rule."""
    width = counts.shape[-1]
    rows = counts.reshape(-1, width)
    if ids is not None:
        irows = ids.reshape(-1, width)
        pad = irows == _spec.PAD_ID
        valid = ~pad
        bad = (irows < _spec.PAD_ID) | (irows >= vocab_size)
        _first_bad(bad.any(axis=1), "ids", f"ids must be in [0, {vocab_size}) or -1 (padding)")
        # padding only at the end: once a row pads, it pads to the end
        pad_then_valid = (np.cumsum(pad, axis=1) > 0) & valid
        _first_bad(pad_then_valid.any(axis=1), "ids", "padding (-1) must come after every valid id")
        _first_bad((pad & (rows != 0)).any(axis=1), "counts", "padding entries must have count 0")
        if width > 1:
            both = valid[:, 1:] & valid[:, :-1]
            order = both & (irows[:, 1:] <= irows[:, :-1])
            _first_bad(order.any(axis=1), "ids", "valid ids must be strictly ascending "
                                                 "(no duplicates)")
    sums = rows.astype(np.uint64).sum(axis=1)
    _first_bad(sums != _spec.TOTAL, "counts", "counts must sum to exactly 2**24")


def dyadic_policy(name):
    """A Dyadic's policy: a str, one of the allocation policies or "external"."""
    if not isinstance(name, str):
        raise TypeError(f"policy: expected a str, got {type(name).__name__}")
    if name not in _spec.SEMANTIC_IDS and name != "external":
        raise ValueError(f"policy: unknown policy {name!r}; expected 'standard', "
                         f"'floor-first' or 'external'")


def _int_arg(value, name):
    """An integer argument as a Python int (bool, float and str refused)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__} {value!r}")
    return int(value)


def check_mode(check, *, lazy=False):
    """``check``: True or False (or "lazy" where ``lazy``); returns it normalised."""
    if check is True or check is False:
        return check
    if isinstance(check, np.bool_):
        return bool(check)
    if lazy and isinstance(check, str) and check == "lazy":
        return check
    expected = "True, False or 'lazy'" if lazy else "True or False"
    raise ValueError(f"check: expected {expected}, got {check!r}")


def _first_bad(mask, name, rule):
    bad = np.flatnonzero(mask)
    if bad.size:
        raise ValueError(f"{name}: row {int(bad[0])}: {rule}")


def verify_inputs(target, draft, greedy, *, check=True, logits=False):
    """Shapes and dtypes of verify's target, draft and greedy flags; returns NumPy views
    and sizes (q is checked by ``_types.verify_q``).

    ``check`` True raises for a draft id outside [0, V); False leaves that rule to
    the kernel (status DRAFT_OUT_OF_RANGE for the request): an id that int32 cannot
    hold is passed as -1, never wrapped to another id.  ``logits``: the target is
    float32 / float16 / bfloat16 logits (``logits_target``), else float32
    probabilities."""
    if logits:
        t = logits_target(target)
    else:
        target_dtype(target)
        t = _arrays.float_to_numpy(target, "target")
    if t.ndim != 3:
        raise ValueError(f"target: expected shape [B, k+1, V], got {t.shape}")
    b, k1, v = t.shape
    vocab(v, "target")
    if k1 < 1:
        raise ValueError("target: needs k+1 >= 1 rows per request")
    d = _arrays.int_to_numpy(draft, "draft")
    if d.shape != (b, k1 - 1):
        raise ValueError(f"draft: shape {d.shape} must be (B, k) = {(b, k1 - 1)} to match target")
    bad = (d < 0) | (d >= v)
    if check:
        _first_bad(bad.any(axis=1) if d.size else np.zeros(b, bool), "draft",
                   f"token ids must be in [0, {v})")
    elif bad.any():
        d = np.where(bad, -1, d)
    if greedy is None:
        g = np.zeros(b, dtype=np.uint8)
    else:
        g = _arrays.bool_to_numpy(greedy, "greedy")
        if g.shape != (b,):
            raise ValueError(f"greedy: shape {g.shape} must be (B,) = ({b},)")
        g = g.astype(np.uint8)
    return np.ascontiguousarray(t), np.ascontiguousarray(d.astype(np.int32)), g, b, k1 - 1, v


def _is_f32(x):
    if _arrays.is_torch(x):
        return str(x.dtype) == "torch.float32"
    return isinstance(x, np.ndarray) and x.dtype == np.float32


def target_dtype(x):
    """The target must be float32 (probabilities are not rounded by dyadic)."""
    if not _is_f32(x):
        dt = _arrays.dtype_name(x) if hasattr(x, "dtype") else type(x).__name__
        raise TypeError(f"target: dtype {dt}; expected float32 probabilities")


def _param_array(value, name, batch, kinds):
    """A sampling parameter (Python scalar, NumPy array or torch tensor; shape () , (1,)
    or (batch,)) as a NumPy array of shape (batch,) in its own dtype."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected a number or a 1-D array, got bool")
    if _arrays.is_torch(value):
        _arrays._torch_device_type(value, name)
        value = value.detach().cpu()
        if value.is_floating_point():
            value = value.double()
        value = value.numpy()
    arr = np.asarray(value)
    if arr.dtype.kind not in kinds:
        want = "an integer" if kinds == "iu" else "a number"
        raise TypeError(f"{name}: expected {want} or a 1-D array of them, got dtype "
                        f"{arr.dtype}")
    if arr.ndim > 1 or (arr.ndim == 1 and arr.shape[0] not in (1, batch)):
        raise ValueError(f"{name}: expected a scalar or shape ({batch},), got {arr.shape}")
    return np.broadcast_to(arr, (batch,))


def _param_rows(ok, name, values, rule, check):
    """ValueError for the first row where ``ok`` is False (only when ``check``)."""
    if check and not ok.all():
        r = int(np.flatnonzero(~ok)[0])
        raise ValueError(f"{name}: row {r}: value {values[r].item()!r} {rule}")


def logits_target_params(temperature, top_k, top_p, min_p, batch, *, check=True):
    """The per-request sampling parameters of ``verify(..., logits=True)``.

    Each is a Python scalar or an array of shape (B,) (or (1,)); returns
    ``(temperature float64 [B], top_k int64 [B], top_p float32 [B], min_p float32 [B])``.
    ``top_k=None`` is 0 (off), ``top_p=None`` is 1 (off), ``min_p=None`` is 0 (off).
    top_p and min_p are converted to float32 (round to nearest even); the kernels
    read that float32 value exactly.  Rules (docs/semantics.md, "Target logits"):
    temperature finite and >= 0; top_k an integer >= 0; top_p in (0, 1] and
    non-zero as a float32; min_p in [0, 1].  ``check`` True raises ValueError
    naming the argument, the row and the rule; False passes the values on and the
    kernel fails such a request closed (a top_p / min_p outside its range, whose
    float32 rounding could land inside it, is passed as NaN)."""
    temp = _param_array(temperature, "temperature", batch, "fiu").astype(np.float64)
    ok = np.isfinite(temp) & (temp >= 0)
    _param_rows(ok, "temperature", temp, "must be finite and >= 0 (0 means greedy "
                                         "verification)", check)
    if top_k is None:
        tk = np.zeros(batch, dtype=np.int64)
    else:
        raw = _param_array(top_k, "top_k", batch, "iu")
        if raw.dtype.kind == "u" and raw.size and raw.max() > np.iinfo(np.int64).max:
            raise ValueError(f"top_k: value {int(raw.max())} does not fit int64")
        tk = raw.astype(np.int64)
        _param_rows(tk >= 0, "top_k", tk, "must be >= 0 (0: off)", check)
    out = []
    for name, value, default, lo_open in (("top_p", top_p, 1.0, True),
                                          ("min_p", min_p, 0.0, False)):
        if value is None:
            out.append(np.full(batch, default, dtype=np.float32))
            continue
        raw = _param_array(value, name, batch, "fiu").astype(np.float64)
        f32 = raw.astype(np.float32)
        if lo_open:
            ok = (raw > 0) & (raw <= 1) & (f32 > 0)
            rule = "must be in (0, 1] and non-zero as a float32 (1: off)"
        else:
            ok = (raw >= 0) & (raw <= 1)
            rule = "must be in [0, 1] (0: off)"
        _param_rows(ok, name, raw, rule, check)
        out.append(np.ascontiguousarray(np.where(ok, f32, np.float32(np.nan))))
    return (np.ascontiguousarray(temp), np.ascontiguousarray(tk), out[0], out[1])


def logits_target(target):
    """``verify(..., logits=True)``'s target: float32 / float16 / bfloat16 logits
    [B, k+1, V] (NumPy or torch CPU), as NumPy float32 (exact widening)."""
    return _arrays.float_to_numpy(target, "target")


def top_k_rows(k, v, batch, *, check=True):
    """``top_k`` of allocate / propose with top_p / min_p: None (dense), an int (every
    row) or an integer array [B] (one per row).  Returns ``(width, top_k int64 [B])``:
    width 0 for dense rows (top_k all 0: no top-k filter), else the sparse width
    ``min(max(top_k), V)``.  Each value must be >= 1 (``check`` True raises
    ValueError naming the row; False leaves it to the kernel: TOP_K_INVALID)."""
    if k is None:
        return 0, np.zeros(batch, dtype=np.int64)
    if isinstance(k, (int, np.integer)) and not isinstance(k, (bool, np.bool_)):
        return top_k(k, v), np.full(batch, int(k), dtype=np.int64)
    raw = _param_array(k, "top_k", batch, "iu")
    if raw.dtype.kind == "u" and raw.size and raw.max() > np.iinfo(np.int64).max:
        raise ValueError(f"top_k: value {int(raw.max())} does not fit int64")
    tk = np.ascontiguousarray(raw.astype(np.int64))
    _param_rows(tk >= 1, "top_k", tk, "must be >= 1 (the sparse width is the largest top_k)",
                check)
    width = int(min(max(int(tk.max()) if batch else 1, 1), v))
    return width, tk


def num_drafts(n, batch, k, *, check=True):
    """verify's ``num_drafts`` as int32 [B] (NumPy or a torch CPU tensor in).

    The dtype must be an integer dtype (TypeError) and the shape (B,)
    (ValueError).  ``check`` True raises ValueError for the first request with
    a count outside [0, k]; False leaves that rule to the kernels (status
    NUM_DRAFTS_INVALID for the request): a count that int32 cannot hold is
    passed as -1, never wrapped to another count."""
    a = _arrays.int_to_numpy(n, "num_drafts")
    if a.shape != (batch,):
        raise ValueError(f"num_drafts: shape {a.shape} must be (B,) = ({batch},)")
    bad = (a < 0) | (a > k)
    if check:
        _first_bad(bad, "num_drafts", f"the number of drafts must be in [0, k] = [0, {k}]")
    return np.ascontiguousarray(np.where((a < 0) | (a > 0x7FFFFFFF), -1, a).astype(np.int32))


def ragged_drafts(n, draft, v):
    """check=True's draft rule restricted to the drafts verified: ``draft[b, :n_b]`` in
    [0, V) (``n`` validated by ``num_drafts``; entries beyond n_b are padding, never
    read).  Raises the message of ``verify_inputs``."""
    used = np.arange(draft.shape[1])[None, :] < n[:, None]
    bad = ((draft < 0) | (draft >= v)) & used
    _first_bad(bad.any(axis=1) if draft.size else np.zeros(draft.shape[0], bool), "draft",
               f"token ids must be in [0, {v})")
