"""The CPU backend equals the reference bit for bit (kernels and public API)."""

import numpy as np
import pytest
from hypothesis import given, strategies as st

import dyadic
from dyadic import _backend, _spec

cpu = pytest.importorskip("dyadic.backends.cpu.backend").CpuBackend()
ref = _backend.get("reference")

POLICIES = (0, 1)


def keys_arrays(rng, b):
    return (rng.integers(0, 2**64, size=b, dtype=np.uint64),
            rng.integers(0, 2**32, size=b, dtype=np.uint64).astype(np.uint32),
            rng.integers(0, 2**32, size=b, dtype=np.uint64).astype(np.uint32),
            rng.integers(0, 2**32 - 64, size=b, dtype=np.uint64).astype(np.uint32))


def run_allocate(be, x, bias, temp, logits, policy, top_k):
    b, v = x.shape
    w = min(top_k, v) if top_k else 0
    counts = np.full((b, w or v), 7, np.uint32)
    ids = np.full((b, w), 9, np.int32) if w else None
    status = np.zeros(b, np.int32)
    be.allocate(x, bias, temp, logits, policy, w, counts, ids, status)
    ok = status == 0
    return status, counts[ok], None if ids is None else ids[ok]


def same_allocate(x, bias=None, temp=None, logits=False, policy=0, top_k=0):
    x = np.ascontiguousarray(x, np.float32)
    if temp is None:
        temp = np.ones(x.shape[0])
    temp = np.ascontiguousarray(temp, np.float64)
    a = run_allocate(cpu, x, bias, temp, logits, policy, top_k)
    r = run_allocate(ref, x, bias, temp, logits, policy, top_k)
    np.testing.assert_array_equal(a[0], r[0])
    np.testing.assert_array_equal(a[1], r[1])
    if a[2] is not None:
        np.testing.assert_array_equal(a[2], r[2])
    return a


# ---------------------------------------------------------------- inputs

def adversarial_rows(rng, v):
    rows = [rng.random(v), np.zeros(v), np.full(v, 0.25), rng.integers(0, 3, v) * 1.0,
            rng.random(v) ** 20, np.exp(rng.normal(0, 20, v))]
    rows[1][v // 2] = 1e-45  # one subnormal
    sub = np.frombuffer(rng.integers(1, 0x800000, v, dtype=np.uint32).tobytes(), np.float32)
    rows.append(sub.astype(np.float64))
    big = np.full(v, 3e38)
    big[::2] = 1e-38
    rows.append(big)
    return np.array(rows, np.float32)


def logit_rows(rng, v):
    rows = [rng.normal(0, 3, v), np.zeros(v), rng.integers(-2, 2, v) * 1.0,
            rng.normal(0, 40, v), np.full(v, -np.inf)]
    rows[4][v - 1] = 0.0
    r = rng.normal(0, 1, v)
    r[rng.random(v) < 0.5] = -np.inf
    rows.append(r)
    h = rng.choice([3e38, -3e38, 0.0], v)
    rows.append(h)
    rows.append(np.where(rng.random(v) < 0.5, -0.0, 0.0))
    return np.array(rows, np.float32)


@pytest.mark.parametrize("v", [1, 2, 111])
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("top_k", [0, 1, 5, 200])
def test_allocate_weights(v, policy, top_k):
    rng = np.random.default_rng(v * 7 + policy + top_k)
    same_allocate(adversarial_rows(rng, v), policy=policy, top_k=top_k)


@pytest.mark.parametrize("v", [1, 2, 111])
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("top_k", [0, 1, 7, 200])
def test_allocate_logits(v, policy, top_k):
    rng = np.random.default_rng(v * 11 + policy + top_k)
    x = logit_rows(rng, v)
    b = x.shape[0]
    for temp in (np.ones(b), np.full(b, 0.7), np.full(b, 1e-30), np.full(b, 1e30),
                 rng.uniform(0.05, 3, b)):
        same_allocate(x, temp=temp, logits=True, policy=policy, top_k=top_k)
    bias = np.ascontiguousarray(rng.normal(0, 2, (1, v)).astype(np.float32))
    bias[0, ::3] = -np.inf
    same_allocate(x, bias=bias, temp=np.full(b, 0.9), logits=True, policy=policy, top_k=top_k)
    bias_b = np.ascontiguousarray(rng.normal(0, 1, (b, v)).astype(np.float32))
    same_allocate(x, bias=bias_b, logits=True, policy=policy, top_k=top_k)


def test_allocate_bad_rows_status():
    v = 9
    x = np.ones((6, v), np.float32)
    x[0, 3], x[0, 5] = np.inf, np.nan
    x[1, 2] = np.nan
    x[2, 4] = -1.0
    x[3] = 0.0
    x[4, 1] = -np.inf
    x[5, 0] = -0.0
    for logits in (False, True):
        st_, _, _ = same_allocate(x, logits=logits)
        if not logits:
            assert st_.tolist() == [2, 1, 3, 4, 3, 0]
    xl = np.full((3, v), -np.inf, np.float32)
    xl[1, 2] = np.inf
    xl[2, 3] = np.nan
    same_allocate(xl, logits=True, top_k=3)
    same_allocate(xl, logits=True)
    # -inf + +inf bias is NaN
    bias = np.zeros((1, v), np.float32)
    bias[0, 0] = np.inf
    same_allocate(np.full((1, v), -np.inf, np.float32), bias=bias, logits=True)


@given(st.integers(1, 40), st.integers(0, 41), st.sampled_from(POLICIES),
       st.integers(0, 2**32 - 1), st.booleans())
def test_allocate_hypothesis(v, top_k, policy, seed, logits):
    rng = np.random.default_rng(seed)
    kind = rng.integers(0, 4)
    if kind == 0:
        x = rng.random((3, v)) ** rng.integers(1, 30)
    elif kind == 1:
        x = rng.integers(0, 4, (3, v)).astype(np.float64)
    elif kind == 2:
        x = rng.normal(0, 10, (3, v))
    else:  # random float32 bit patterns; NaNs among them make NumPy's cast warn
        with np.errstate(invalid="ignore"):
            x = np.frombuffer(rng.integers(0, 2**32, (3, v), dtype=np.uint64).astype(np.uint32)
                              .tobytes(), np.float32).reshape(3, v).astype(np.float64)
    temp = rng.choice([1.0, 0.5, 1e-3, 7.0, 1e-300], 3)
    same_allocate(x.astype(np.float32), temp=temp if logits else None, logits=logits,
                  policy=policy, top_k=top_k)


def test_allocate_large_vocab():
    rng = np.random.default_rng(3)
    v = 129280
    z = rng.normal(0, 4, (1, v))
    p = np.exp(z - z.max())
    same_allocate((p / p.sum()).astype(np.float32), policy=0)
    same_allocate(z.astype(np.float32), logits=True, policy=0, top_k=32)


# ---------------------------------------------------------------- philox, draw, propose

def test_philox_matches():
    rng = np.random.default_rng(1)
    c = rng.integers(0, 2**32, (200, 4), dtype=np.uint64).astype(np.uint32)
    k = rng.integers(0, 2**32, (200, 2), dtype=np.uint64).astype(np.uint32)
    for rounds in (0, 1, 7, 10, 16):
        a, r = np.empty_like(c), np.empty_like(c)
        cpu.philox4x32(c, k, rounds, a)
        ref.philox4x32(c, k, rounds, r)
        np.testing.assert_array_equal(a, r)


def test_propose_kernel_needs_one_key_per_row():
    """The CPU kernel reads the key arrays by raw pointer: short ones are refused."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 20)).astype(np.float32)
    seed, gen, rnd, pos = keys_arrays(rng, 3)
    with pytest.raises(ValueError, match=r"propose: seed, generation, round, position and "
                                         r"tokens need 3 entries \(one per row\)"):
        cpu.propose(x, None, np.ones(3), 0, 4, seed[:2], gen, rnd, pos, np.zeros(3, np.int32),
                    np.zeros((3, 4), np.uint32), np.zeros((3, 4), np.int32),
                    np.zeros(3, np.int32))


@pytest.mark.parametrize("top_k", [0, 3, 32])
@pytest.mark.parametrize("v", [1, 2, 111])
def test_draw_and_propose(v, top_k):
    rng = np.random.default_rng(v + top_k)
    x = logit_rows(rng, v)
    b = x.shape[0]
    temp = rng.choice([0.0, 1.0, 0.3, 2.0], b)
    temp[0] = 0.0
    keys = keys_arrays(rng, b)
    w = min(top_k, v) if top_k else 0
    outs = []
    for be in (cpu, ref):
        counts = np.zeros((b, w or v), np.uint32)
        ids = np.full((b, w), -1, np.int32) if w else None
        tokens = np.zeros(b, np.int32)
        status = np.zeros(b, np.int32)
        be.propose(x, None, temp, 0, w, *keys, tokens, counts, ids, status)
        ok = status == 0
        outs.append((status, tokens, counts[ok], None if ids is None else ids[ok]))
    for a, r in zip(*outs):
        if a is not None:
            np.testing.assert_array_equal(a, r)
    # draw from the produced q
    status, _, counts, ids = outs[0]
    ok = status == 0
    sub = tuple(np.ascontiguousarray(k[ok]) for k in keys)
    ta, tr = np.zeros(ok.sum(), np.int32), np.zeros(ok.sum(), np.int32)
    cpu.draw(counts, ids, *sub, ta)
    ref.draw(counts, ids, *sub, tr)
    np.testing.assert_array_equal(ta, tr)


def test_propose_api_and_errors():
    rng = np.random.default_rng(5)
    x = rng.normal(0, 2, (5, 111)).astype(np.float32)
    keys = dyadic.Keys(seed=123, generation=1, round=2, position=np.arange(5))
    for top_k in (None, 8):
        t1, q1 = dyadic.propose(x, keys, top_k=top_k, temperature=[0, 1, 0.5, 0, 2])
        t2, q2 = dyadic.propose(x, keys, top_k=top_k, temperature=[0, 1, 0.5, 0, 2],
                                backend="reference")
        np.testing.assert_array_equal(t1, t2)
        np.testing.assert_array_equal(q1.counts, q2.counts)
    for bad in (np.nan, np.inf):
        xb = x.copy()
        xb[3, 7] = bad
        msgs = []
        for be in ("cpu", "reference"):
            with pytest.raises(ValueError) as e:
                dyadic.propose(xb, keys, backend=be)
            msgs.append(str(e.value))
        assert msgs[0] == msgs[1]


@pytest.mark.parametrize("bad", [np.nan, np.inf, -1.0, "zero"])
def test_allocate_error_messages(bad):
    x = np.ones((3, 11), np.float32)
    if bad == "zero":
        x[2] = 0
    else:
        x[2, 4] = bad
    msgs = []
    for be in ("cpu", "reference"):
        with pytest.raises(ValueError) as e:
            dyadic.allocate(x, backend=be)
        msgs.append(str(e.value))
    assert msgs[0] == msgs[1]


# ---------------------------------------------------------------- verify

def softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).astype(np.float32)


def run_verify(be, target, draft, qc, qi, greedy, keys):
    b, k1, _ = target.shape
    acc = np.zeros(b, np.int32)
    tok = np.zeros((b, k1), np.int32)
    status = np.zeros(b, np.int32)
    be.verify(target, draft, qc, qi, greedy, *keys, acc, tok, status)
    return status, acc, tok


def same_verify(target, draft, qc, qi, greedy, keys):
    a = run_verify(cpu, target, draft, qc, qi, greedy, keys)
    r = run_verify(ref, target, draft, qc, qi, greedy, keys)
    for x, y in zip(a, r):
        np.testing.assert_array_equal(x, y)
    return a


@pytest.mark.parametrize("v", [1, 2, 111])
@pytest.mark.parametrize("k", [0, 1, 4])
@pytest.mark.parametrize("qkind", ["dense", "sparse", "none"])
def test_verify(v, k, qkind):
    rng = np.random.default_rng(v * 31 + k)
    b = 12
    target = softmax(rng.normal(0, 2, (b, k + 1, v)))
    target[0] = 0.0
    target[0, :, 0] = 1.0  # point masses
    target[1, :, :] = np.float32(1.0 / v)  # ties
    keys = keys_arrays(rng, b)
    greedy = (rng.random(b) < 0.25).astype(np.uint8)
    # q from the draft side: allocate on other logits
    xq = rng.normal(0, 2, (b * k, v)).astype(np.float32)
    w = min(5, v)
    if qkind == "none":
        qc = qi = None
        draft = rng.integers(0, v, (b, k)).astype(np.int32)
    else:
        top = 0 if qkind == "dense" else w
        counts = np.zeros((b * k, top or v), np.uint32)
        ids = np.zeros((b * k, top), np.int32) if top else None
        status = np.zeros(b * k, np.int32)
        cpu.allocate(xq, None, np.ones(b * k), True, 0, top, counts, ids, status)
        assert not status.any()
        qc = counts.reshape(b, k, counts.shape[1])
        qi = None if ids is None else ids.reshape(b, k, ids.shape[1])
        # draft tokens drawn from q (so q(d) > 0), except one row with q(d) = 0
        draft = np.zeros((b, k), np.int32)
        for i in range(b):
            for j in range(k):
                c = qc[i, j].astype(np.int64)
                pick = rng.choice(np.flatnonzero(c))
                draft[i, j] = pick if qi is None else qi[i, j, pick]
        if k and v > w and qkind == "sparse":
            missing = sorted(set(range(v)) - set(qi[2, 0].tolist()))
            draft[2, 0] = missing[0]
    same_verify(np.ascontiguousarray(target), np.ascontiguousarray(draft), qc, qi, greedy, keys)


def test_verify_invalid_targets():
    rng = np.random.default_rng(9)
    b, k, v = 6, 2, 20
    target = softmax(rng.normal(0, 1, (b, k + 1, v)))
    target[0, 1, 3] = np.nan
    target[1, 0, 2] = -0.5
    target[2, 2, 0] += 0.01
    target[3, 0, 5] = 1.5
    target[4, 1, :] = 0.0
    target[5, 0, 0] = -0.0
    keys = keys_arrays(rng, b)
    draft = rng.integers(0, v, (b, k)).astype(np.int32)
    st_, _, _ = same_verify(target, draft, None, None, np.zeros(b, np.uint8), keys)
    assert st_[:5].tolist() == [10, 10, 11, 10, 11]
    msgs = []
    for be in ("cpu", "reference"):
        with pytest.raises(ValueError) as e:
            dyadic.verify(target, draft, None, dyadic.Keys(seed=1, position=0), backend=be)
        msgs.append(str(e.value))
    assert msgs[0] == msgs[1]


def test_verify_large_vocab():
    rng = np.random.default_rng(4)
    b, k, v = 2, 1, 129280
    target = softmax(rng.normal(0, 3, (b, k + 1, v)))
    draft = np.argsort(target[:, 0, :], axis=-1)[:, :1].astype(np.int32)  # unlikely tokens
    same_verify(target, draft, None, None, np.zeros(b, np.uint8), keys_arrays(rng, b))


@given(st.integers(1, 30), st.integers(0, 3), st.integers(0, 2**32 - 1),
       st.sampled_from(["dense", "sparse", "none"]))
def test_verify_hypothesis(v, k, seed, qkind):
    rng = np.random.default_rng(seed)
    b = 4
    z = rng.normal(0, rng.choice([0.1, 2.0, 30.0]), (b, k + 1, v))
    z[rng.random(z.shape) < 0.3] = -np.inf
    z[..., 0] = np.maximum(z[..., 0], 0.0)
    target = softmax(z)
    keys = keys_arrays(rng, b)
    greedy = (rng.random(b) < 0.3).astype(np.uint8)
    if qkind == "none":
        qc = qi = None
        draft = rng.integers(0, v, (b, k)).astype(np.int32)
    else:
        w = 0 if qkind == "dense" else int(rng.integers(1, v + 1))
        counts = np.zeros((b * k, w or v), np.uint32)
        ids = np.zeros((b * k, w), np.int32) if w else None
        status = np.zeros(b * k, np.int32)
        xq = rng.normal(0, 3, (b * k, v)).astype(np.float32)
        cpu.allocate(xq, None, np.ones(b * k), True, int(rng.integers(0, 2)), w, counts, ids,
                     status)
        qc = counts.reshape(b, k, counts.shape[1])
        qi = None if ids is None else ids.reshape(b, k, ids.shape[1])
        draft = rng.integers(0, v, (b, k)).astype(np.int32)  # q(d) = 0 happens: a status
    same_verify(np.ascontiguousarray(target), draft, qc, qi, greedy, keys)
