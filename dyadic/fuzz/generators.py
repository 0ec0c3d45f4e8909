"""Random and adversarial cases; case ``i`` of seed ``s`` is a pure function of (s, i).

Vocabulary sizes are weighted towards small, odd values so the pure-Python
reference stays fast; a few cases per hundred use 4097..129280 with one row.
About one case in eight is invalid on purpose (NaN, +inf, negative weights,
zero mass, bad temperature, top_k 0, unknown policy, bad target sums,
q(d) = 0, out-of-range keys or draft ids, bad Philox rounds, wrong dtypes):
every backend must then raise the same exception with the same message.
"""

import numpy as np

from .. import _spec
from .case import ALL_PRIMITIVES, Case

U32 = 0xFFFFFFFF
U64 = (1 << 64) - 1
# primitive mix: the reference cost of verify and propose dominates
_WEIGHTS = {"allocate": 0.25, "propose": 0.25, "draw": 0.15, "verify": 0.25, "philox": 0.10,
            "verify_logits": 0.25, "propose_filtered": 0.25}
_SMALL_VOCABS = (1, 2, 3, 5, 7, 8, 13, 31, 32, 33, 64, 111, 127, 255, 257)
_LARGE_VOCABS = (4097, 32000, 65537, 129280)


def generate(seed, index, primitives=None):
    """Case ``index`` of the stream ``seed`` (independent of every other case)."""
    rng = np.random.default_rng([int(seed) & U64, int(index), 0x5EED])
    from .case import PRIMITIVES
    primitives = PRIMITIVES if primitives is None else primitives
    prims = [p for p in ALL_PRIMITIVES if p in primitives]
    w = np.array([_WEIGHTS[p] for p in prims])
    prim = prims[int(rng.choice(len(prims), p=w / w.sum()))]
    invalid = rng.random() < 0.125
    case = _GEN[prim](rng, invalid)
    case.index, case.seed = int(index), int(seed)
    if invalid:
        case.label = "invalid:" + case.label
    return case


# ---------------------------------------------------------------- sizes

def _vocab(rng, large_ok=True):
    r = rng.random()
    if r < 0.55:
        return int(rng.choice(_SMALL_VOCABS))
    if r < 0.93 or not large_ok:
        return int(np.exp(rng.uniform(0, np.log(1500))))
    if r < 0.97:
        return int(rng.integers(1500, 5000)) | 1
    return int(rng.choice(_LARGE_VOCABS))


def _batch(rng, vocab):
    if vocab > 3000:
        return 1
    return int(rng.choice([1, 1, 2, 3, 4, 5, 9]))


def _keys(rng, b, k=0):
    """Key arrays (length b, or 1 to exercise broadcasting), incl. extreme values."""
    n = 1 if rng.random() < 0.2 else b
    out = {}
    kind = rng.random()
    out["seed"] = rng.integers(0, U64, size=n, dtype=np.uint64, endpoint=True)
    if kind < 0.15:
        out["seed"][:] = U64
    elif kind < 0.25:
        out["seed"][:] = 0
    for name in ("generation", "round"):
        v = rng.integers(0, U32, size=n, dtype=np.uint64, endpoint=True)
        if rng.random() < 0.15:
            v[:] = U32
        out[name] = v.astype(np.uint32)
    hi = _spec.POSITION_MAX - k
    pos = rng.integers(0, hi, size=n, dtype=np.uint64, endpoint=True)
    if rng.random() < 0.2:
        pos[:] = hi - rng.integers(0, 3, size=n, dtype=np.uint64).clip(0, hi)
    out["position"] = pos.astype(np.uint32)
    return out


# ---------------------------------------------------------------- floats

def _bf16_bits(x32):
    """float32 -> bfloat16 bit patterns (truncation: exact, deterministic)."""
    return (np.ascontiguousarray(x32, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)


def _encode(x32, dtype):
    if dtype == "bfloat16":
        return _bf16_bits(x32)
    with np.errstate(over="ignore"):
        return x32.astype(np.float16 if dtype == "float16" else np.float32)


def _float_dtype(rng):
    return str(rng.choice(["float32", "float32", "float32", "float16", "bfloat16"]))


def _logits(rng, shape):
    kind = str(rng.choice(["normal", "normal", "ties", "huge", "masked", "onehot", "flat",
                           "wide"]))
    if kind == "normal":
        x = rng.standard_normal(shape) * float(rng.choice([0.1, 1.0, 3.0, 10.0]))
    elif kind == "ties":
        x = rng.integers(-2, 3, size=shape).astype(np.float64)
    elif kind == "huge":
        x = rng.standard_normal(shape) * 1e4 + float(rng.choice([0.0, 1e30, -1e30, 3e38]))
    elif kind == "masked":
        x = rng.standard_normal(shape) * 2.0
        x[rng.random(shape) < 0.7] = -np.inf
        x[..., 0] = rng.standard_normal(shape[:-1])  # keep one finite value per row
    elif kind == "onehot":
        x = np.full(shape, -40.0)
        x[..., rng.integers(0, shape[-1])] = 5.0
    elif kind == "flat":
        x = np.zeros(shape)
    else:  # values just inside / outside the exp cutoff
        x = -rng.uniform(0, 2 * _spec.EXP_CUTOFF, size=shape)
    return x.astype(np.float32), kind


def _weights(rng, shape):
    kind = str(rng.choice(["uniform", "sparse", "tiny", "subnormal", "huge", "ties",
                           "onehot", "mixed"]))
    if kind == "uniform":
        x = rng.random(shape)
    elif kind == "sparse":
        x = rng.random(shape) * (rng.random(shape) < 0.1)
        x[..., -1] += 1e-3
    elif kind == "tiny":
        x = rng.random(shape) * 1e-38
    elif kind == "subnormal":
        x = rng.integers(0, 50, size=shape) * 1.4e-45
        x[..., 0] = 1.4e-45
    elif kind == "huge":
        x = rng.random(shape) * 3.4e38
    elif kind == "ties":
        x = rng.integers(0, 3, size=shape).astype(np.float64)
        x[..., 0] = 1.0
    elif kind == "onehot":
        x = np.zeros(shape)
        x[..., rng.integers(0, shape[-1])] = float(rng.choice([1.0, 1e-30, 7.0]))
    else:
        x = np.exp(rng.standard_normal(shape) * 20)
        x[rng.random(shape) < 0.3] = 0.0
        x[..., 0] += 1e-20
    with np.errstate(over="ignore"):
        return x.astype(np.float32), kind


def _top_k(rng, v):
    r = rng.random()
    if r < 0.35:
        return None
    if r < 0.5:
        return 1
    if r < 0.7:
        return 32
    return int(rng.integers(1, v + 4))


def _temperature(rng, b, allow_zero):
    r = rng.random()
    if r < 0.4:
        return {"temperature": 1.0}, None
    if r < 0.6:
        return {"temperature": float(rng.choice([0.7, 1e-3, 100.0, 0.25]))}, None
    t = np.exp(rng.normal(0, 1.5, size=b))
    if allow_zero:
        t[rng.random(b) < 0.4] = 0.0
    return {}, t.astype(np.float64)


def _break_floats(rng, x, logits):
    """Make one row invalid; returns the rule's name."""
    row = tuple(rng.integers(0, s) for s in x.shape[:-1])
    choices = ["nan", "posinf", "zero_mass"] + ([] if logits else ["negative"])
    what = str(rng.choice(choices))
    col = int(rng.integers(0, x.shape[-1]))
    if what == "nan":
        x[row + (col,)] = np.nan
    elif what == "posinf":
        x[row + (col,)] = np.inf
    elif what == "negative":
        x[row + (col,)] = -1.0 if rng.random() < 0.5 else -np.inf
    else:
        x[row] = -np.inf if logits else 0.0
    return what


# ---------------------------------------------------------------- primitives

def _alloc_like(rng, invalid, propose):
    v = _vocab(rng)
    b = _batch(rng, v)
    logits = True if propose else bool(rng.random() < 0.5)
    x, kind = _logits(rng, (b, v)) if logits else _weights(rng, (b, v))
    params = {"logits": logits, "top_k": _top_k(rng, v),
              "policy": "standard" if rng.random() < 0.7 else "floor-first"}
    arrays = {}
    if logits:
        tp, ta = _temperature(rng, b, allow_zero=propose)
        params.update(tp)
        if ta is not None:
            arrays["temperature"] = ta
        r = rng.random()
        if r < 0.3:
            bias = (rng.standard_normal(v if r < 0.15 else (b, v)) * 2).astype(np.float32)
            bias[rng.random(bias.shape) < 0.1] = -np.inf
            bias.reshape(-1)[0] = 0.0
            arrays["bias"] = bias
    label = kind
    if invalid:
        r = rng.random()
        if r < 0.5:
            label = _break_floats(rng, x, logits)
        elif r < 0.6:
            params["top_k"] = int(rng.choice([0, -1]))
            label = "top_k"
        elif r < 0.7:
            params["policy"] = "bogus"
            label = "policy"
        elif r < 0.8 and logits:
            params["temperature"] = float(rng.choice([-1.0, np.inf, 0.0]) if not propose
                                          else rng.choice([-1.0, np.inf]))
            arrays.pop("temperature", None)
            label = "temperature"
        elif r < 0.9:
            params["dtype"] = "float64"
            label = "dtype"
        else:
            label = _break_floats(rng, x, logits)
    dtype = params.get("dtype") or _float_dtype(rng)
    params["dtype"] = dtype
    arrays["x"] = x.astype(np.float64) if dtype == "float64" else _encode(x, dtype)
    if "bias" in arrays:
        params["bias_dtype"] = "float32"
    if propose:
        arrays.update(_keys(rng, b))
        if invalid and rng.random() < 0.15:
            arrays["position"] = np.array([_spec.POSITION_MAX], dtype=np.uint64) + 1
            label = "keys"
    return Case("propose" if propose else "allocate", arrays, params, label)


def gen_allocate(rng, invalid):
    return _alloc_like(rng, invalid, propose=False)


def gen_propose(rng, invalid):
    return _alloc_like(rng, invalid, propose=True)


def _counts_row(rng, support):
    """uint32 counts over ``support`` entries summing to exactly 2**24 (all > 0 or some 0)."""
    kind = rng.random()
    if kind < 0.15 or support == 1:
        c = np.zeros(support, dtype=np.int64)
        c[rng.integers(0, support)] = _spec.TOTAL
        return c
    w = rng.random(support) ** float(rng.choice([1.0, 4.0, 20.0]))
    if kind < 0.3:
        w[rng.random(support) < 0.5] = 0.0
        w[rng.integers(0, support)] += 0.1
    c = np.floor(w / w.sum() * _spec.TOTAL).astype(np.int64)
    c[int(np.argmax(w))] += _spec.TOTAL - int(c.sum())
    return c


def _dyadic_rows(rng, rows, v, sparse):
    """(counts uint32 [rows, W], ids int32 [rows, W] or None)."""
    if not sparse:
        return np.stack([_counts_row(rng, v) for _ in range(rows)]).astype(np.uint32), None
    width = int(rng.integers(1, min(v, 40) + 1))
    counts = np.zeros((rows, width), dtype=np.uint32)
    ids = np.full((rows, width), _spec.PAD_ID, dtype=np.int32)
    for r in range(rows):
        s = int(rng.integers(1, width + 1))
        sel = np.sort(rng.choice(v, size=s, replace=False))
        c = _counts_row(rng, s)
        keep = c > 0
        sel, c = sel[keep], c[keep]
        ids[r, :sel.size] = sel
        counts[r, :sel.size] = c
    return counts, ids


def gen_draw(rng, invalid):
    v = _vocab(rng)
    b = _batch(rng, v)
    sparse = bool(rng.random() < 0.5)
    counts, ids = _dyadic_rows(rng, b, v, sparse)
    arrays = {"q_counts": counts}
    if ids is not None:
        arrays["q_ids"] = ids
    arrays.update(_keys(rng, b))
    label = "sparse" if sparse else "dense"
    if invalid:
        r = rng.random()
        if r < 0.5:
            counts[0, 0] += 1  # sum != 2**24
            label = "counts_sum"
        elif r < 0.75 and ids is not None:
            ids[0, 0] = v  # id out of range
            label = "ids"
        else:
            arrays["seed"] = np.array([-1], dtype=np.int64)
            label = "keys"
    return Case("draw", arrays, {"vocab": v}, label)


def _target(rng, b, k1, v):
    kind = str(rng.choice(["softmax", "softmax", "onehot", "uniform", "tiny", "zeros"]))
    if kind == "softmax":
        z = rng.standard_normal((b, k1, v)) * float(rng.choice([1.0, 3.0, 8.0]))
        e = np.exp(z - z.max(axis=-1, keepdims=True))
        p = e / e.sum(axis=-1, keepdims=True)
    elif kind == "onehot":
        p = np.zeros((b, k1, v))
        idx = rng.integers(0, v, size=(b, k1))
        np.put_along_axis(p, idx[..., None], 1.0, axis=-1)
    elif kind == "uniform":
        p = np.full((b, k1, v), 1.0 / v)
    elif kind == "tiny":
        p = np.zeros((b, k1, v))
        p[...] = rng.integers(0, 2, size=(b, k1, v)) * 1e-44
        idx = rng.integers(0, v, size=(b, k1))
        np.put_along_axis(p, idx[..., None], 1.0, axis=-1)
    else:  # many exact zeros
        p = rng.random((b, k1, v)) * (rng.random((b, k1, v)) < 0.2)
        p[..., 0] += 1e-3
        p = p / p.sum(axis=-1, keepdims=True)
    return p.astype(np.float32), kind


def _ragged(rng, arrays, b, k, v):
    """num_drafts in [0, k] per request, the padding beyond each count of half the
    requests made hostile (NaN target rows, draft ids outside [0, V); q stays a valid
    Dyadic: the fuzzer builds it with the constructor): never read, so no backend may
    look at it.  One count in ten is outside [0, k] (NUM_DRAFTS_INVALID)."""
    n = rng.integers(0, k + 1, size=b).astype(np.int32)
    bad = rng.random(b) < 0.1
    n[bad] = np.where(rng.random(int(bad.sum())) < 0.5, -1, k + 1)
    arrays["num_drafts"] = n
    target, draft = arrays["target"], arrays["draft"]
    for r in range(b):
        m = int(min(max(n[r], 0), k))
        if rng.random() < 0.5:
            target[r, m + 1:] = np.nan
            draft[r, m:] = v + 3


def _q_and_drafts(rng, arrays, counts, ids, b, k):
    """Store the q rows ``counts`` / ``ids`` [b * k, W] as ``arrays["q_counts"]`` /
    ``["q_ids"]`` [b, k, W] and return drafts int32 [b, k], each sampled where its
    row's count is > 0."""
    w = counts.shape[-1]
    arrays["q_counts"] = counts.reshape(b, k, w)
    if ids is not None:
        arrays["q_ids"] = ids.reshape(b, k, w)
    draft = np.empty(b * k, dtype=np.int32)
    for r in range(b * k):
        j = int(rng.choice(np.flatnonzero(counts[r] > 0)))
        draft[r] = j if ids is None else ids[r, j]
    return draft.reshape(b, k)


def gen_verify(rng, invalid):
    v = _vocab(rng, large_ok=rng.random() < 0.3)
    if v > 5000:
        v = 4097
    b = _batch(rng, v)
    k = int(rng.choice([1, 2, 3, 5, 5, 8])) if v <= 3000 else 1
    target, kind = _target(rng, b, k + 1, v)
    qmode = str(rng.choice(["dense", "sparse", "point", "near_p"]))
    arrays = {"target": target}
    if qmode == "point":
        draft = rng.integers(0, v, size=(b, k)).astype(np.int32)
        if rng.random() < 0.5:  # greedy drafts: the target's argmax
            draft = np.argmax(target[:, :k], axis=-1).astype(np.int32)
    else:
        if qmode == "near_p":
            rows = []
            for r in target[:, :k].reshape(-1, v):
                w = r.astype(np.float64) + rng.random(v) * 0.5 / v
                c = np.floor(w / w.sum() * _spec.TOTAL).astype(np.int64)
                c[int(np.argmax(w))] += _spec.TOTAL - int(c.sum())
                rows.append(c)
            counts, ids = np.stack(rows).astype(np.uint32), None
        else:
            counts, ids = _dyadic_rows(rng, b * k, v, qmode == "sparse")
        draft = _q_and_drafts(rng, arrays, counts, ids, b, k)
    arrays["draft"] = draft
    if rng.random() < 0.4:
        arrays["greedy"] = (rng.random(b) < 0.5).astype(np.uint8)
    arrays.update(_keys(rng, b, k))
    label = f"{kind}/{qmode}"
    if rng.random() < 0.3:
        label += "/ragged"
        _ragged(rng, arrays, b, k, v)
    if invalid:
        r = rng.random()
        bb, ii = int(rng.integers(0, b)), int(rng.integers(0, k + 1))
        if r < 0.2:
            target[bb, ii, int(rng.integers(0, v))] = np.nan
            label = "target_nan"
        elif r < 0.4:
            target[bb, ii] *= np.float32(0.99)
            label = "target_sum"
        elif r < 0.55 and "q_counts" in arrays and "q_ids" not in arrays:
            c = arrays["q_counts"]
            zero = np.flatnonzero(c[bb, 0] == 0)
            if zero.size:
                draft[bb, 0] = int(zero[0])
                label = "q_zero_at_draft"
            else:
                draft[bb, 0] = v
                label = "draft_range"
        elif r < 0.7:
            draft[bb, 0] = -1 if rng.random() < 0.5 else v
            label = "draft_range"
        elif r < 0.85:
            arrays["position"] = np.array([_spec.POSITION_MAX - k + 1], dtype=np.uint64)
            label = "keys_position"
        else:
            arrays["target"] = target.astype(np.float16)
            label = "target_dtype"
    q_vocab = v
    return Case("verify", arrays, {"vocab": q_vocab}, label)


def gen_verify_logits(rng, invalid):
    """verify(logits=True): target logits [B, k+1, V] of any float dtype (ties, -inf
    masks, huge values), per-request temperature (0: greedy request), top_k, top_p,
    min_p (scalars or arrays, off or on), q dense / sparse / point mass, drafts from q;
    ragged counts sometimes.  Invalid: NaN / +inf logits, a row of -inf, out-of-range
    parameters, draft ids outside [0, V)."""
    v = int(rng.choice(_SMALL_VOCABS[1:]))
    b = int(rng.integers(1, 5))
    k = int(rng.choice([0, 1, 2, 3]))
    x, kind = _logits(rng, (b, k + 1, v))
    dtype = _float_dtype(rng)
    arrays = {"target": _encode(x, dtype)}
    temp = rng.choice([0.0, 0.5, 0.7, 1.0, 1.7], size=b)
    arrays["temperature"] = temp.astype(np.float64)
    if rng.random() < 0.5:
        arrays["top_k"] = rng.choice([0, 1, 2, 5, v, v + 3], size=b).astype(np.int64)
    if rng.random() < 0.5:
        arrays["top_p"] = rng.choice([1.0, 0.95, 0.5, 0.1, 1e-7], size=b).astype(np.float32)
    if rng.random() < 0.4:
        arrays["min_p"] = rng.choice([0.0, 0.05, 0.3, 1.0], size=b).astype(np.float32)
    qmode = str(rng.choice(["dense", "sparse", "point"]))
    if qmode == "point" or k == 0:
        draft = rng.integers(0, v, size=(b, k)).astype(np.int32)
    else:
        counts, ids = _dyadic_rows(rng, b * k, v, qmode == "sparse")
        draft = _q_and_drafts(rng, arrays, counts, ids, b, k)
    arrays["draft"] = draft
    if rng.random() < 0.3:
        arrays["greedy"] = (rng.random(b) < 0.5).astype(np.uint8)
    arrays.update(_keys(rng, b, k))
    label = f"{kind}/{qmode}/{dtype}"
    if k and rng.random() < 0.3:
        label += "/ragged"
        n = rng.integers(0, k + 1, size=b).astype(np.int32)
        arrays["num_drafts"] = n
        for r in range(b):  # padding beyond the count: never read
            if rng.random() < 0.5:
                arrays["draft"][r, int(n[r]):] = v + 3
    if invalid:
        r = rng.random()
        bb = int(rng.integers(0, b))
        t = x.copy()
        if r < 0.3:
            t[bb, 0, int(rng.integers(0, v))] = np.nan if r < 0.15 else np.inf
            label = "target_value"
        elif r < 0.45:
            t[bb, 0] = -np.inf
            label = "target_zero_mass"
        elif r < 0.6:
            arrays["temperature"][bb] = -1.0
            label = "temperature"
        elif r < 0.75:
            arrays["top_p"] = np.ones(b, np.float32)
            arrays["top_p"][bb] = 1.5
            label = "top_p"
        elif r < 0.85:
            arrays["min_p"] = np.zeros(b, np.float32)
            arrays["min_p"][bb] = -0.5
            label = "min_p"
        elif k:
            arrays["draft"][bb, 0] = v
            label = "draft_range"
        arrays["target"] = _encode(t, dtype)
    return Case("verify_logits", arrays, {"vocab": v, "dtype": dtype}, label)


def gen_propose_filtered(rng, invalid):
    """propose / allocate(logits=True) with top_p / min_p / top_k per row (a top-k
    support of width at most 1024, or a dense support without bias: every backend's
    filtered routes): logits of any float dtype (ties, -inf masks, huge values), per-row
    temperature (propose: 0 rows), top_k an int, per row or None, top_p / min_p scalars
    or per row, bias sometimes.  Invalid: a row's top_k < 1, top_p outside (0, 1], min_p
    outside [0, 1], NaN / +inf logits."""
    v = _vocab(rng, large_ok=False)
    b = _batch(rng, v)
    propose = bool(rng.random() < 0.6)
    x, kind = _logits(rng, (b, v))
    dtype = _float_dtype(rng)
    params = {"propose": propose, "dtype": dtype,
              "policy": "standard" if rng.random() < 0.7 else "floor-first"}
    arrays = {}
    t = np.exp(rng.normal(0, 1.2, size=b))
    if propose:
        t[rng.random(b) < 0.3] = 0.0
    arrays["temperature"] = t.astype(np.float64)
    if rng.random() < 0.5:
        params["top_k"] = int(rng.choice([1, 2, 5, 32, 33, min(v + 3, 1024)]))
    else:
        arrays["top_k"] = rng.integers(1, min(v + 3, 1024) + 1, size=b).astype(np.int64)
    r = rng.random()
    if r < 0.4:
        params["top_p"] = float(rng.choice([1.0, 0.95, 0.5, 0.1, 1e-7]))
    elif r < 0.8:
        arrays["top_p"] = rng.choice([1.0, 0.95, 0.5, 0.1, 1e-7], size=b).astype(np.float32)
    r = rng.random()
    if r < 0.3:
        params["min_p"] = float(rng.choice([0.0, 0.05, 0.3, 1.0]))
    elif r < 0.6:
        arrays["min_p"] = rng.choice([0.0, 0.05, 0.3, 1.0], size=b).astype(np.float32)
    if "top_p" not in params and "top_p" not in arrays and "min_p" not in params \
            and "min_p" not in arrays and "top_k" in params:
        params["top_p"] = 0.9  # a filtered call
    if rng.random() < 0.2:
        arrays["bias"] = (rng.standard_normal(v) * 2).astype(np.float32)
        params["bias_dtype"] = "float32"
    label = f"{kind}/{dtype}"
    if invalid:
        r = rng.random()
        bb = int(rng.integers(0, b))
        if r < 0.3:
            arrays["top_k"] = np.full(b, min(v, 4), np.int64)
            arrays["top_k"][bb] = 0
            params.pop("top_k", None)
            label = "top_k"
        elif r < 0.55:
            arrays["top_p"] = np.ones(b, np.float32)
            arrays["top_p"][bb] = 1.5 if r < 0.45 else 0.0
            params.pop("top_p", None)
            label = "top_p"
        elif r < 0.75:
            arrays["min_p"] = np.zeros(b, np.float32)
            arrays["min_p"][bb] = -0.5
            params.pop("min_p", None)
            label = "min_p"
        else:
            label = _break_floats(rng, x, True)
    if label != "top_k" and rng.random() < 0.25:  # a dense support, no bias
        params["top_k"] = None
        arrays.pop("top_k", None)
        arrays.pop("bias", None)
        params.pop("bias_dtype", None)
        if not any(n in params or n in arrays for n in ("top_p", "min_p")):
            params["top_p"] = 0.9  # a filtered call
    arrays["x"] = _encode(x, dtype)
    if propose:
        arrays.update(_keys(rng, b))
    return Case("propose_filtered", arrays, params, label)


def gen_philox(rng, invalid):
    n = int(rng.integers(1, 40))
    counter = rng.integers(0, U32, size=(n, 4), dtype=np.uint64, endpoint=True)
    if rng.random() < 0.3:
        counter[:, rng.integers(0, 4)] = U32
    key = rng.integers(0, U32, size=(n, 2) if rng.random() < 0.5 else (2,), dtype=np.uint64,
                       endpoint=True)
    rounds = 10 if rng.random() < 0.6 else int(rng.integers(0, 17))
    label = "random"
    if invalid:
        r = rng.random()
        if r < 0.4:
            rounds = int(rng.choice([17, -1]))
            label = "rounds"
        elif r < 0.7:
            counter = counter.astype(np.int64)
            counter[0, 0] = -1
            label = "counter_negative"
        else:
            counter = counter[:, :3]
            label = "counter_shape"
    return Case("philox", {"counter": counter, "key": key}, {"rounds": rounds}, label)


_GEN = {"allocate": gen_allocate, "propose": gen_propose, "draw": gen_draw,
        "verify": gen_verify, "philox": gen_philox, "verify_logits": gen_verify_logits,
        "propose_filtered": gen_propose_filtered}
