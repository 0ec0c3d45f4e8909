"""backend="numba" == backend="reference", bit for bit, under the CUDA simulator.

On a machine without a GPU tests/conftest.py turns on NUMBA_ENABLE_CUDASIM=1
before numba is imported, so CI runs the Numba kernels' parallel structure (block
reductions, radix selection, scans) on small sizes.  Where a GPU is present
the same bodies run on it (tests/gpu/test_gpu_parity_numba.py adds large sizes).

The ``check_*`` helpers are shared with tests/gpu/test_gpu_parity_numba.py.
"""

import os
import sys

import numpy as np
import pytest


# tests/conftest.py turns the simulator on (before anything imports numba)
# when no GPU is present.

import dyadic  # noqa: E402
from dyadic import _backend, _spec, _status  # noqa: E402
from dyadic._types import Dyadic  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_numba():
    """The numba backend object, or None with the reason."""
    try:
        import numba  # noqa: F401
        import numba_cuda  # noqa: F401
    except ImportError as exc:
        return None, f"numba / numba-cuda not installed ({exc}): pip install numba numba-cuda"
    try:
        be = _backend.get("numba")
    except RuntimeError:
        # not installed as dyadic.backends (source checkout): load from backends/
        if REPO not in sys.path:
            sys.path.insert(0, REPO)
        from backends.cuda.numba.backend import NumbaBackend
        be = _backend._LOADED["numba"] = NumbaBackend()
    if not be.usable():
        return None, "numba backend: no CUDA GPU and the simulator is off"
    return be, None


NUMBA, WHY = load_numba()
pytestmark = pytest.mark.skipif(NUMBA is None, reason=str(WHY))


# ---------------------------------------------------------------- comparison helpers


def outcome(fn, backend):
    """("ok", arrays...) or ("err", type name, message)."""
    try:
        out = fn(backend)
    except (ValueError, TypeError, RuntimeError) as exc:
        return ("err", type(exc).__name__, str(exc))
    if not isinstance(out, tuple):
        out = (out,)
    return ("ok",) + tuple(None if a is None else np.asarray(a) for a in out)


def assert_same(fn, other="reference"):
    a = outcome(fn, "numba")
    b = outcome(fn, other)
    assert a[0] == b[0], (a, b)
    if a[0] == "err":
        assert a[1:] == b[1:]
        return a
    for x, y in zip(a[1:], b[1:]):
        if x is None or y is None:
            assert x is None and y is None
        else:
            assert x.dtype == y.dtype and x.shape == y.shape
            np.testing.assert_array_equal(x, y)
    return a


def q_parts(q):
    return (q.counts, q.ids)


def check_allocate(x, other="reference", **kw):
    return assert_same(lambda be: q_parts(dyadic.allocate(x, backend=be, **kw)), other)


def check_propose(logits, keys, other="reference", **kw):
    def run(be):
        tok, q = dyadic.propose(logits, keys, backend=be, **kw)
        return (tok,) + q_parts(q)
    return assert_same(run, other)


def check_draw(q, keys, other="reference"):
    return assert_same(lambda be: dyadic.draw(q, keys, backend=be), other)


def check_verify(target, draft, q, keys, greedy=None, other="reference"):
    def run(be):
        v = dyadic.verify(target, draft, q, keys, greedy=greedy, backend=be)
        return (v.accepted, v.tokens)
    return assert_same(run, other)


def check_rows(method, args, outputs, other="reference"):
    """Kernel-interface call on both backends with preallocated outputs; every
    output must match (rows with a non-zero status only in status, tokens and
    accepted, since counts of failed rows are unspecified)."""
    results = []
    for name in ("numba", other):
        be = _backend.get(name)
        outs = [np.full_like(o, 7) if o is not None else None for o in outputs]
        getattr(be, method)(*args, *outs)
        results.append(outs)
    return results


def softmax(z, axis=-1):
    z = np.asarray(z, dtype=np.float64)
    z = z - z.max(axis=axis, keepdims=True)
    e = np.exp(z)
    return (e / e.sum(axis=axis, keepdims=True)).astype(np.float32)


# ---------------------------------------------------------------- case builders


def adversarial_logits(rng, v):
    """Rows that stress ties, masks, huge values, -0.0 and cut-off gaps."""
    rows = [
        rng.normal(size=v) * 3,                       # random
        np.zeros(v),                                  # all ties
        np.where(np.arange(v) % 3 == 0, -np.inf, rng.normal(size=v)),  # masked
        np.where(np.arange(v) % 2 == 0, -0.0, 0.0),   # signed zeros (ties)
        np.round(rng.normal(size=v) * 2) / 2,         # many ties
        rng.choice([3e38, -3e38, 0.0, 40.0, 1e-40], size=v),  # huge and far gaps
    ]
    x = np.array(rows, dtype=np.float32)
    x[-1, 0] = 3e38
    return x


def adversarial_probs(rng, v):
    rows = [
        rng.random(v),
        np.where(rng.random(v) < 0.7, 0.0, rng.random(v)),               # zeros
        rng.choice([1e-45, 3e-42, 1e-38, 0.0], size=v),                  # subnormals
        np.full(v, 0.25),                                                # equal
        rng.choice([1.0, 2.0 ** -40, 3e38], size=v),                     # wide range
    ]
    x = np.array(rows, dtype=np.float32)
    x[2, 0] = 1e-45
    x[4, 0] = 3e38
    return x


def chain_case(rng, b, k, v, top_k, noise=0.3, sparse_q=True):
    """target [b, k+1, v], draft [b, k], q (Dyadic [b, k]) with q close to p."""
    z = rng.normal(size=(b, k + 1, v)) * 2.5
    target = softmax(z)
    qz = (z[:, :k] + noise * rng.normal(size=(b, k, v))).astype(np.float32)
    be = "reference" if v <= 512 else host_backend()
    q = dyadic.allocate(qz.reshape(b * k, v), logits=True, top_k=top_k if sparse_q else None,
                        backend=be)
    draft = np.asarray(dyadic.draw(q, dyadic.Keys(seed=int(rng.integers(1 << 62))),
                                   backend=be)).reshape(b, k)
    ids = None if q.ids is None else np.asarray(q.ids).reshape(b, k, -1)
    qd = Dyadic(np.asarray(q.counts).reshape(b, k, -1), ids, vocab_size=v)
    return target, draft.astype(np.int32), qd


def host_backend():
    """The CPU backend where it loads (fast), else the reference."""
    try:
        be = _backend.get("cpu")
        return "cpu" if getattr(be, "usable", lambda: True)() else "reference"
    except Exception:  # noqa: BLE001
        return "reference"


def keys_for(rng, b, position=None):
    return dyadic.Keys(seed=rng.integers(0, 2 ** 64, size=b, dtype=np.uint64),
                       generation=rng.integers(0, 2 ** 32, size=b, dtype=np.uint64).astype(np.uint32),
                       round=rng.integers(0, 5, size=b).astype(np.uint32),
                       position=position if position is not None
                       else rng.integers(0, 1000, size=b).astype(np.uint32))


# ---------------------------------------------------------------- tests (small: simulator)


def test_philox_matches():
    rng = np.random.default_rng(1)
    c = rng.integers(0, 2 ** 32, size=(37, 4), dtype=np.uint64)
    k = rng.integers(0, 2 ** 32, size=(37, 2), dtype=np.uint64)
    c[0] = 0
    k[0] = 0
    c[1] = 0xFFFFFFFF
    k[1] = 0xFFFFFFFF
    for rounds in (0, 7, 10):
        assert_same(lambda be: dyadic.philox4x32(c, k, rounds, backend=be))
    out = dyadic.philox4x32([0, 0, 0, 0], [0, 0], backend="numba")
    assert out.tolist() == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]


@pytest.mark.parametrize("top_k", [None, 1, 32])
@pytest.mark.parametrize("policy", ["standard", "floor-first"])
def test_allocate_logits_adversarial(top_k, policy):
    rng = np.random.default_rng(10 + (top_k or 0))
    x = adversarial_logits(rng, 111)
    temp = np.array([1.0, 0.7, 1.0, 2.0, 0.5, 1.0])
    res = check_allocate(x, logits=True, temperature=temp, top_k=top_k, policy=policy)
    assert res[0] == "ok"


@pytest.mark.parametrize("top_k", [None, 32])
@pytest.mark.parametrize("policy", ["standard", "floor-first"])
def test_allocate_probs_adversarial(top_k, policy):
    rng = np.random.default_rng(20 + (top_k or 0))
    res = check_allocate(adversarial_probs(rng, 97), top_k=top_k, policy=policy)
    assert res[0] == "ok"


def test_allocate_bias_and_small_vocab():
    rng = np.random.default_rng(30)
    x = rng.normal(size=(2, 111)).astype(np.float32)
    bias = np.where(rng.random(111) < 0.2, -np.inf, rng.normal(size=111)).astype(np.float32)
    check_allocate(x, logits=True, bias=bias, top_k=32, temperature=0.9)
    check_allocate(x, logits=True, bias=np.stack([bias, -bias]).astype(np.float32))
    for v in (1, 2):
        xs = rng.normal(size=(3, v)).astype(np.float32)
        for top_k in (None, 1, 32):
            check_allocate(xs, logits=True, top_k=top_k)
            check_allocate(np.abs(xs), top_k=top_k, policy="floor-first")


def _row_status(method_rows, x, logits, top_k, policy=0):
    b, v = x.shape
    width = min(top_k, v) if top_k else v
    temp = np.full(b, 1.0)
    outs = [np.zeros((b, width), np.uint32), np.zeros((b, width), np.int32) if top_k else None,
            np.zeros(b, np.int32)]
    res = check_rows("allocate", (x, None, temp, logits, policy, top_k), outs)
    (c1, i1, s1), (c2, i2, s2) = res
    np.testing.assert_array_equal(s1, s2)
    ok = s1 == 0
    np.testing.assert_array_equal(c1[ok], c2[ok])
    if top_k:
        np.testing.assert_array_equal(i1[ok], i2[ok])
    return s1


def test_invalid_rows_same_status():
    v = 40
    good = np.linspace(-2, 2, v)
    rows = [good.copy() for _ in range(6)]
    rows[1][5] = np.nan
    rows[2][3] = np.inf
    rows[3][:] = -np.inf
    rows[4][7] = np.inf
    rows[4][2] = np.nan  # first bad element decides: NaN
    x = np.array(rows, dtype=np.float32)
    s = _row_status(None, x, True, 0)
    assert s.tolist() == [0, 1, 2, 4, 1, 0]
    s = _row_status(None, x, True, 8)
    assert s.tolist() == [0, 1, 2, 4, 1, 0]
    p = np.abs(x)
    p[3] = 0.0
    p[5][9] = -1.0
    p[0][4] = -0.0
    s = _row_status(None, p, False, 0)
    assert s.tolist() == [0, 1, 2, 4, 1, 3]
    # the public API raises the same error on both
    check_allocate(x, logits=True)
    check_allocate(p)


@pytest.mark.parametrize("top_k,policy", [(None, "standard"), (1, "floor-first"),
                                          (32, "standard"), (32, "floor-first")])
def test_propose_matches(top_k, policy):
    rng = np.random.default_rng(40 + (top_k or 0))
    x = adversarial_logits(rng, 111)[[0, 2, 4, 5]]
    temp = np.array([0.8, 0.0, 1.0, 0.0 if top_k == 32 else 1.5])
    keys = keys_for(rng, 4)
    res = check_propose(x, keys, temperature=temp, top_k=top_k, policy=policy)
    assert res[0] == "ok"
    tokens, counts, ids = res[1:]
    q = Dyadic(counts, ids, vocab_size=111)
    check_draw(q, keys)


def test_propose_invalid_rows():
    rng = np.random.default_rng(50)
    v = 33
    x = rng.normal(size=(4, v)).astype(np.float32)
    x[1, 4] = np.nan
    x[2, :] = -np.inf
    temp = np.array([1.0, 0.0, 0.0, 1.0])
    k = keys_for(rng, 4)
    b = 4
    args = (x, None, temp, 0, 8, *k.broadcast(b))
    outs = [np.zeros(b, np.int32), np.zeros((b, 8), np.uint32), np.zeros((b, 8), np.int32),
            np.zeros(b, np.int32)]
    (t1, c1, i1, s1), (t2, c2, i2, s2) = check_rows("propose", args, outs)
    np.testing.assert_array_equal(s1, s2)
    np.testing.assert_array_equal(t1, t2)
    assert s1.tolist() == [0, 1, 4, 0]
    ok = s1 == 0
    np.testing.assert_array_equal(c1[ok], c2[ok])
    np.testing.assert_array_equal(i1[ok], i2[ok])


@pytest.mark.parametrize("qkind", ["dense", "sparse", "none"])
def test_verify_matches(qkind):
    rng = np.random.default_rng({"dense": 60, "sparse": 61, "none": 62}[qkind])
    b, k, v = 3, 3, 111
    target, draft, q = chain_case(rng, b, k, v, top_k=32, sparse_q=qkind == "sparse")
    if qkind == "none":
        q = None
        draft = np.argmax(target[:, :k], axis=-1).astype(np.int32)
        draft[0, 1] = (draft[0, 1] + 1) % v
    res = check_verify(target, draft, q, keys_for(rng, b))
    assert res[0] == "ok"
    greedy = np.array([True, False, True])
    check_verify(target, draft, q, keys_for(rng, b), greedy=greedy)


def test_verify_adversarial():
    rng = np.random.default_rng(70)
    b, k, v = 4, 2, 64
    target, draft, q = chain_case(rng, b, k, v, top_k=None, sparse_q=False, noise=0.0)
    # exact ties in the target for greedy rows; vocab 1 and 2 chains
    target[0, 0] = 0.0
    target[0, 0, [5, 9]] = 0.5
    draft[0, 0] = 9
    check_verify(target, draft, q, keys_for(rng, b), greedy=np.array([1, 0, 1, 0], bool))
    for vv in (1, 2):
        t = softmax(rng.normal(size=(2, 3, vv)))
        d = rng.integers(0, vv, size=(2, 2)).astype(np.int32)
        check_verify(t, d, None, keys_for(rng, 2))


def test_verify_invalid_rows_same_status():
    rng = np.random.default_rng(80)
    b, k, v = 5, 2, 48
    target, draft, q = chain_case(rng, b, k, v, top_k=16)
    target[1, 2, 3] = np.nan             # invalid value (bonus row)
    target[2, 0] *= 0.5                  # sum far from 1
    target[3, 1, 0] = 1.5                # > 1 (after row 0 which is fine)
    qc, qi = np.asarray(q.counts).copy(), np.asarray(q.ids).copy()
    draft = draft.copy()
    draft[4, 1] = np.setdiff1d(np.arange(v), qi[4, 1])[0]  # q(d) = 0 at draft -> 12
    args = (target, draft, qc, qi, np.zeros(b, np.uint8),
            *keys_for(rng, b).broadcast(b, position_extra=k))
    outs = [np.zeros(b, np.int32), np.zeros((b, k + 1), np.int32), np.zeros(b, np.int32)]
    (a1, t1, s1), (a2, t2, s2) = check_rows("verify", args, outs)
    np.testing.assert_array_equal(s1, s2)
    np.testing.assert_array_equal(a1, a2)
    np.testing.assert_array_equal(t1, t2)
    assert s1.tolist() == [0, 10, 11, 10, 12]


def test_verify_draft_out_of_range_fails_closed():
    """Device path with check=False (kernel interface, no host validation): a draft id
    outside [0, V) fails its request with DRAFT_OUT_OF_RANGE before any read at it,
    greedy rows included; the other requests are unaffected."""
    rng = np.random.default_rng(81)
    b, k, v = 4, 2, 40
    target, draft, q = chain_case(rng, b, k, v, top_k=None, sparse_q=False)
    draft = draft.astype(np.int32).copy()
    draft[1, 1] = v
    draft[2, 0] = -1
    qc = np.asarray(q.counts).copy()
    keys = keys_for(rng, b).broadcast(b, position_extra=k)
    for greedy in (np.zeros(b, np.uint8), np.array([0, 1, 1, 0], np.uint8)):
        outs = [np.zeros(b, np.int32), np.zeros((b, k + 1), np.int32), np.zeros(b, np.int32)]
        NUMBA.verify(target, draft, qc, None, greedy, *keys, *outs)
        acc, tok, st = outs
        assert st.tolist()[1:3] == [_status.DRAFT_OUT_OF_RANGE] * 2
        assert (tok[1:3] == -1).all() and (acc[1:3] == 0).all()
        assert st[0] == 0 and st[3] == 0
        good = [0, 3]
        ref = dyadic.verify(target[good], draft[good], Dyadic(qc[good], None, vocab_size=v),
                            dyadic.Keys(*[np.asarray(f)[good] for f in keys]),
                            greedy=greedy[good].astype(bool), backend="reference")
        np.testing.assert_array_equal(tok[good], np.asarray(ref.tokens))
        np.testing.assert_array_equal(acc[good], np.asarray(ref.accepted))


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_random_sweep_slow(seed):
    rng = np.random.default_rng(1000 + seed)
    v = int(rng.choice([17, 111, 257]))
    b = 3
    x = (rng.normal(size=(b, v)) * rng.choice([0.5, 3, 30])).astype(np.float32)
    for top_k in (None, 1, 32):
        for policy in ("standard", "floor-first"):
            check_propose(x, keys_for(rng, b), top_k=top_k, policy=policy,
                          temperature=rng.choice([0.3, 1.0, 2.0], size=b))
    for qkind in ("dense", "sparse"):
        target, draft, q = chain_case(rng, b, 4, v, top_k=32, sparse_q=qkind == "sparse")
        check_verify(target, draft, q, keys_for(rng, b))
