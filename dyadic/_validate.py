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
    if name not in _spec.POLICY_CODES:
        raise ValueError(f"policy: unknown policy {name!r}; expected one of "
                         f"{sorted(_spec.POLICY_CODES)}")
    return _spec.POLICY_CODES[name]


def vocab(v, name="x"):
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
    """Validate the parts of a user-constructed ``Dyadic``; returns them normalised."""
    if policy_name not in _spec.SEMANTIC_IDS and policy_name != "external":
        raise ValueError(f"policy: unknown policy {policy_name!r}; expected 'standard', "
                         f"'floor-first' or 'external'")
    keep = _arrays.is_torch(counts) or _arrays.is_gpu_array(counts)
    c = _arrays.int_to_numpy(counts, "counts", host_copy=True)
    if c.ndim < 1:
        raise ValueError("counts: expected shape [..., W]")
    if c.dtype != np.uint32:
        raise TypeError(f"counts: dtype {_arrays.dtype_name(c)}; expected uint32")
    width = c.shape[-1]
    rows = c.reshape(-1, width)
    if ids is None:
        if vocab_size is None:
            vocab_size = width
        if vocab_size != width:
            raise ValueError(f"counts: dense width {width} != vocab_size {vocab_size}")
        vocab(vocab_size, "vocab_size")
        i = None
    else:
        i = _arrays.int_to_numpy(ids, "ids", host_copy=True)
        if i.dtype != np.int32:
            raise TypeError(f"ids: dtype {_arrays.dtype_name(i)}; expected int32")
        if i.shape != c.shape:
            raise ValueError(f"ids: shape {i.shape} != counts shape {c.shape}")
        if vocab_size is None:
            raise ValueError("vocab_size: required for sparse rows")
        vocab(vocab_size, "vocab_size")
        irows = i.reshape(-1, width)
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
    # torch / device arrays are kept as given (validated through a host copy)
    return (counts if keep else c), (ids if i is None or keep else i), vocab_size


def _first_bad(mask, name, rule):
    bad = np.flatnonzero(mask)
    if bad.size:
        raise ValueError(f"{name}: row {int(bad[0])}: {rule}")


def verify_inputs(target, draft, q, greedy):
    """Shapes and dtypes of verify's inputs; returns NumPy views and sizes."""
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
    _first_bad(bad.any(axis=1) if d.size else np.zeros(b, bool), "draft",
               f"token ids must be in [0, {v})")
    verify_q(q, b, k1 - 1, v)
    if greedy is None:
        g = np.zeros(b, dtype=np.uint8)
    else:
        g = _arrays.bool_to_numpy(greedy, "greedy")
        if g.shape != (b,):
            raise ValueError(f"greedy: shape {g.shape} must be (B,) = ({b},)")
        g = g.astype(np.uint8)
    return np.ascontiguousarray(t), np.ascontiguousarray(d.astype(np.int32)), g, b, k1 - 1, v


def verify_q(q, b, k, v):
    """verify's q: a Dyadic over (B, k) rows of the target's vocabulary, or None."""
    from ._types import Dyadic

    if q is None:
        return
    if not isinstance(q, Dyadic):
        raise TypeError(f"q: expected a dyadic.Dyadic or None (point-mass q), got "
                        f"{type(q).__name__}")
    if q.batch_shape != (b, k):
        raise ValueError(f"q: batch shape {q.batch_shape} must be (B, k) = {(b, k)}")
    if q.vocab_size != v:
        raise ValueError(f"q: vocab_size {q.vocab_size} does not match target's {v}")


def _is_f32(x):
    if _arrays.is_torch(x):
        return str(x.dtype) == "torch.float32"
    return isinstance(x, np.ndarray) and x.dtype == np.float32


def target_dtype(x):
    """The target must be float32 (probabilities are not rounded by dyadic)."""
    if not _is_f32(x):
        dt = _arrays.dtype_name(x) if hasattr(x, "dtype") else type(x).__name__
        raise TypeError(f"target: dtype {dt}; expected float32 probabilities")
