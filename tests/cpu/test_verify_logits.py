"""verify(logits=True) on the CPU backend: the same bits as the reference on random and
adversarial rows (ties, -inf, gaps past the exponential's cutoff, float16 / bfloat16
inputs, per-request parameters, greedy requests mixed in), errors naming the argument
and the row, and requests failing closed with their status while the others are
unchanged."""

import numpy as np
import pytest

import dyadic
from dyadic import _backend, _status

cpu = pytest.importorskip("dyadic.backends.cpu.backend").CpuBackend()
ref = _backend.get("reference")


def keys_for(rng, b):
    return dyadic.Keys(seed=rng.integers(0, 2**64, size=b, dtype=np.uint64),
                       generation=rng.integers(0, 2**32, size=b, dtype=np.uint64).astype(np.uint32),
                       round=rng.integers(0, 2**32, size=b, dtype=np.uint64).astype(np.uint32),
                       position=rng.integers(0, 2**31, size=b, dtype=np.uint64).astype(np.uint32))


def logits_rows(rng, n, v):
    """n adversarial logits rows of width v (float32)."""
    kinds = []
    for i in range(n):
        kind = i % 9
        if kind == 0:
            x = rng.standard_normal(v) * 3
        elif kind == 1:
            x = np.round(rng.standard_normal(v) * 2)  # ties in z
        elif kind == 2:
            x = rng.standard_normal(v) * 3
            x[rng.random(v) < 0.5] = -np.inf
            x[rng.integers(v)] = 1.0
        elif kind == 3:
            x = np.zeros(v)  # every token at the maximum
        elif kind == 4:
            x = rng.standard_normal(v) * 40  # gaps past 32: W = 0 inside the ranking
        elif kind == 5:
            x = np.full(v, -3e38)
            x[rng.integers(v)] = 3e38  # huge gaps
        elif kind == 6:
            x = rng.integers(-2, 3, v) * 0.5
            x[::3] = -np.inf
        elif kind == 7:
            x = np.frombuffer(rng.integers(0, 0x00800000, v, dtype=np.uint32).tobytes(),
                              np.float32).astype(np.float64)  # subnormals
        else:
            x = np.sort(rng.standard_normal(v))[::-1] * 5  # descending: a long ranking
        if np.isneginf(x).all():
            x[rng.integers(v)] = 0.0
        kinds.append(x)
    return np.array(kinds, np.float32)


def params_for(rng, b, v):
    return dict(
        temperature=rng.choice([0.0, 0.3, 1.0, 2.7, 1e-3], size=b),
        top_k=rng.choice([0, 1, 2, 5, v, v + 7], size=b),
        top_p=rng.choice([1.0, 0.95, 0.5, 1e-3, 0.3], size=b),
        min_p=rng.choice([0.0, 0.05, 0.5, 1.0, 1e-6], size=b))


def q_and_draft(rng, b, k, v, kind):
    """(q, draft) with q(d) > 0: dense, sparse (top-4) or None (point mass)."""
    if kind == "point":
        return None, rng.integers(0, v, size=(b, k)).astype(np.int32)
    x = (rng.standard_normal((b, k, v)) * 2).astype(np.float32)
    q = dyadic.allocate(x, logits=True, top_k=4 if kind == "sparse" else None)
    dense = q.to_dense().counts
    draft = np.zeros((b, k), np.int32)
    for r in range(b):
        for i in range(k):
            support = np.flatnonzero(np.asarray(dense[r, i]))
            draft[r, i] = rng.choice(support)
    return q, draft


def both(target, draft, q, keys, **kw):
    kw.setdefault("check", False)
    a = dyadic.verify(target, draft, q, keys, backend="cpu", logits=True, **kw)
    r = dyadic.verify(target, draft, q, keys, backend="reference", logits=True, **kw)
    np.testing.assert_array_equal(a.status, r.status)
    np.testing.assert_array_equal(a.accepted, r.accepted)
    np.testing.assert_array_equal(a.tokens, r.tokens)
    return a


@pytest.mark.parametrize("qkind", ["dense", "sparse", "point"])
@pytest.mark.parametrize("v", [1, 3, 17, 111])
def test_cpu_equals_reference_random_and_adversarial(qkind, v):
    rng = np.random.default_rng(v * 31 + len(qkind))
    b, k = 18, 3
    target = logits_rows(rng, b * (k + 1), v).reshape(b, k + 1, v)
    rng.shuffle(target.reshape(-1, v))
    q, draft = q_and_draft(rng, b, k, v, qkind)
    keys = keys_for(rng, b)
    got = both(target, draft, q, keys, **params_for(rng, b, v))
    assert (got.status == 0).all()
    assert (got.tokens >= 0).sum() == (got.accepted + 1).sum()


@pytest.mark.parametrize("params", [dict(), dict(temperature=0.5), dict(top_k=3),
                                    dict(top_p=0.6), dict(min_p=0.2), dict(temperature=0.0),
                                    dict(temperature=0.8, top_k=5, top_p=0.9, min_p=0.01)])
def test_cpu_equals_reference_scalar_parameters(params):
    rng = np.random.default_rng(len(params) * 7 + 1)
    b, k, v = 12, 2, 40
    target = logits_rows(rng, b * (k + 1), v).reshape(b, k + 1, v)
    q, draft = q_and_draft(rng, b, k, v, "dense")
    # draft = target argmax on half the positions: acceptances and bonuses
    am = np.argmax(np.where(np.isnan(target), -np.inf, target), axis=2)[:, :k]
    draft = np.where(rng.random((b, k)) < 0.5, am, draft).astype(np.int32)
    q = None if params.get("temperature") == 0.0 else q
    if q is None:
        got = both(target, draft, None, keys_for(rng, b), **params)
    else:
        got = both(target, draft, q, keys_for(rng, b), **params)
    assert (got.status[got.status != 0] == _status.Q_ZERO_AT_DRAFT).all()


def test_half_precision_inputs_widen_exactly():
    rng = np.random.default_rng(2)
    b, k, v = 6, 2, 33
    x16 = (rng.standard_normal((b, k + 1, v)) * 4).astype(np.float16)
    x16[0, 0, :5] = -np.inf
    x16[1] = np.round(x16[1])
    q, draft = q_and_draft(rng, b, k, v, "sparse")
    keys = keys_for(rng, b)
    p = dict(temperature=np.array([1.0, 0.7, 0.0, 1.5, 0.4, 1.0]), top_k=3, top_p=0.8)
    a = both(x16, draft, q, keys, **p)
    b32 = both(x16.astype(np.float32), draft, q, keys, **p)
    np.testing.assert_array_equal(a.tokens, b32.tokens)
    torch = pytest.importorskip("torch")
    xb = torch.from_numpy(x16.astype(np.float32)).to(torch.bfloat16)
    wide = xb.to(torch.float32).numpy()
    c = both(xb, torch.from_numpy(draft), q, keys, **p)
    d = both(wide, draft, q, keys, **p)
    np.testing.assert_array_equal(np.asarray(c.tokens), d.tokens)


def test_ties_at_the_top_k_and_top_p_boundary():
    v = 8
    row = np.array([0.0, 2.0, 2.0, 1.0, 2.0, 2.0, -np.inf, 1.0], np.float32)
    target = np.tile(row, (12, 2, 1))
    rng = np.random.default_rng(4)
    draft = np.full((12, 1), 5, np.int32)  # the last of the tied maxima
    keys = keys_for(rng, 12)
    top_k = np.array([1, 2, 3, 4, 5, 0, 0, 0, 0, 0, 2, 4])
    top_p = np.array([1, 1, 1, 1, 1, 0.25, 0.26, 0.5, 0.75, 0.2, 0.6, 0.6], np.float32)
    got = both(target, draft, None, keys, top_k=top_k, top_p=top_p)
    # ids 1, 2, 4, 5 tie at the maximum: top_k <= 3 and small top_p never keep id 5
    from dyadic.reference import target_logits
    for r in range(12):
        p = target_logits.target_distribution(row.tolist(), top_k=int(top_k[r]),
                                              top_p=float(top_p[r]))
        if p[5] == 0:  # q is the point mass at 5: rejected, the correction is a kept token
            assert got.accepted[r] == 0 and p[got.tokens[r, 0]] > 0
        assert row[6] == -np.inf and got.tokens[r, 0] != 6


def test_errors_name_the_argument_row_and_rule():
    rng = np.random.default_rng(1)
    target = rng.standard_normal((3, 2, 5)).astype(np.float32)
    draft = np.zeros((3, 1), np.int32)
    keys = dyadic.Keys(seed=1)
    cases = [
        (dict(temperature=[1.0, -0.5, 1.0]), r"temperature: row 1: value -0.5 must be finite"),
        (dict(temperature=float("nan")), r"temperature: row 0: value nan must be finite"),
        (dict(temperature=[1.0, 1.0, float("inf")]), r"temperature: row 2:"),
        (dict(top_k=[0, 0, -2]), r"top_k: row 2: value -2 must be >= 0"),
        (dict(top_p=[1.0, 0.0, 1.0]), r"top_p: row 1: value 0.0 must be in \(0, 1\]"),
        (dict(top_p=1.5), r"top_p: row 0: value 1.5"),
        (dict(top_p=1e-60), r"top_p: row 0: .*non-zero as a float32"),
        (dict(min_p=[0.0, 0.0, 1.01]), r"min_p: row 2: value 1.01 must be in \[0, 1\]"),
        (dict(min_p=-0.1), r"min_p: row 0:"),
    ]
    for kw, msg in cases:
        for backend in ("cpu", "reference"):
            with pytest.raises(ValueError, match=msg):
                dyadic.verify(target, draft, None, keys, backend=backend, logits=True, **kw)
    with pytest.raises(ValueError, match=r"temperature: expected a scalar or shape \(3,\)"):
        dyadic.verify(target, draft, None, keys, logits=True, temperature=[1.0, 1.0])
    with pytest.raises(TypeError, match="top_k: expected an integer"):
        dyadic.verify(target, draft, None, keys, logits=True, top_k=2.0)
    with pytest.raises(TypeError, match="top_k: expected a number or a 1-D array, got bool"):
        dyadic.verify(target, draft, None, keys, logits=True, top_k=True)
    with pytest.raises(ValueError, match="apply only to target logits"):
        dyadic.verify(np.full((3, 2, 5), 0.2, np.float32), draft, None, keys, top_p=0.5)
    with pytest.raises(TypeError, match="target: dtype float64"):
        dyadic.verify(target.astype(np.float64), draft, None, keys, logits=True)
    bad = target.copy()
    bad[1, 1, 3] = np.nan
    with pytest.raises(ValueError, match=r"target: row 1: .*\[status 10\]"):
        dyadic.verify(bad, draft, None, keys, logits=True)
    bad = target.copy()
    bad[2, 0] = -np.inf
    with pytest.raises(ValueError, match=r"target: row 2: every target logit is -inf"):
        dyadic.verify(bad, draft, None, keys, logits=True)


def test_bad_requests_fail_closed_and_others_unchanged():
    rng = np.random.default_rng(9)
    b, k, v = 10, 2, 9
    target = (rng.standard_normal((b, k + 1, v)) * 2).astype(np.float32)
    q, draft = q_and_draft(rng, b, k, v, "dense")
    keys = keys_for(rng, b)
    temp = np.array([1.0, -1.0, np.nan, 1.0, 1.0, 1.0, 1.0, 0.5, 1.0, 1.0])
    top_k = np.array([0, 0, 0, -1, 0, 0, 0, 3, 0, 0])
    top_p = np.array([1.0, 1.0, 1.0, 1.0, 2.0, 0.0, 1.0, 0.5, 1.0, 1.0])
    min_p = np.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, np.nan, 0.1, 0.0, 0.0])
    target[8, 1, 2] = np.inf
    target[9, 2] = -np.inf
    draft[0, 0] = v  # out of range
    got = both(target, draft, q, keys, temperature=temp, top_k=top_k, top_p=top_p,
               min_p=min_p)
    assert got.status.tolist() == [
        _status.DRAFT_OUT_OF_RANGE, _status.TEMPERATURE_INVALID, _status.TEMPERATURE_INVALID,
        _status.TOP_K_INVALID, _status.TOP_P_INVALID, _status.TOP_P_INVALID,
        _status.MIN_P_INVALID, 0, _status.TARGET_INVALID_VALUE, _status.TARGET_ZERO_MASS]
    bad = got.status != 0
    assert (got.tokens[bad] == -1).all() and (got.accepted[bad] == 0).all()
    one_q = dyadic.Dyadic(q.counts[7:8], vocab_size=v)
    one_keys = dyadic.Keys(seed=keys.seed[7], generation=keys.generation[7],
                           round=keys.round[7], position=keys.position[7])
    alone = both(target[7:8], draft[7:8], one_q, one_keys, temperature=0.5, top_k=3,
                 top_p=0.5, min_p=0.1)
    assert alone.tokens[0].tolist() == got.tokens[7].tolist()


@pytest.mark.parametrize("be", [cpu, ref], ids=["cpu", "reference"])
def test_kernel_fails_closed_on_raw_bad_parameters(be):
    """The kernels do not rely on Python's validation: raw parameter values out of range
    (a float32 top_p of 2.0, negative zero top_p, top_k of -5 or far above V) give a
    status and -1, never an out-of-bounds read."""
    rng = np.random.default_rng(3)
    b, v = 6, 5
    target = rng.standard_normal((b, 2, v)).astype(np.float32)
    draft = np.zeros((b, 1), np.int32)
    temp = np.array([1.0, 1.0, 1.0, 1.0, -0.0, 1.0])
    top_k = np.array([-5, 2**62, 0, 0, 0, 0], np.int64)
    top_p = np.array([1.0, 1.0, 2.0, -0.0, 1.0, 1.0], np.float32)
    min_p = np.array([0.0, 0.0, 0.0, 0.0, 0.0, -1e-45], np.float32)
    accepted = np.zeros(b, np.int32)
    tokens = np.zeros((b, 2), np.int32)
    status = np.zeros(b, np.int32)
    keys = (np.arange(b, dtype=np.uint64), np.zeros(b, np.uint32), np.zeros(b, np.uint32),
            np.zeros(b, np.uint32))
    be.verify_logits(target, draft, None, None, np.zeros(b, np.uint8), temp, top_k, top_p,
                     min_p, *keys, accepted, tokens, status)
    assert status.tolist() == [_status.TOP_K_INVALID, 0, _status.TOP_P_INVALID,
                               _status.TOP_P_INVALID, 0, _status.MIN_P_INVALID]
    assert (tokens[[0, 2, 3, 5]] == -1).all()
    assert tokens[4, 0] == int(np.argmax(target[4, 0]))  # -0.0 is temperature 0: greedy


def test_kernel_shapes_are_structural_errors():
    b, v = 2, 4
    target = np.zeros((b, 1, v), np.float32)
    args = dict(temperature=np.ones(b), top_k=np.zeros(b, np.int64),
                top_p=np.ones(b, np.float32), min_p=np.zeros(b, np.float32))
    keys = (np.zeros(b, np.uint64), np.zeros(b, np.uint32), np.zeros(b, np.uint32),
            np.zeros(b, np.uint32))
    for name in args:
        bad = dict(args)
        bad[name] = args[name][:1]
        for be in (cpu, ref):
            with pytest.raises(ValueError, match=name):
                be.verify_logits(target, np.zeros((b, 0), np.int32), None, None,
                                 np.zeros(b, np.uint8), *bad.values(), *keys,
                                 np.zeros(b, np.int32), np.zeros((b, 1), np.int32),
                                 np.zeros(b, np.int32))


def test_wide_vocabulary_and_large_total():
    """Every token at the maximum: T = V * 2**39; the bonus is uniform over the kept ids."""
    rng = np.random.default_rng(8)
    b, v = 4, 5000
    target = np.zeros((b, 1, v), np.float32)
    target[1, 0, ::2] = -np.inf
    got = both(target, np.zeros((b, 0), np.int32), None, keys_for(rng, b),
               top_k=np.array([0, 0, 700, 0]), top_p=np.array([1.0, 0.5, 0.3, 1e-4]))
    assert (got.status == 0).all()
    assert got.tokens[1, 0] % 2 == 1
    assert got.tokens[2, 0] < 700


from hypothesis import given, strategies as st  # noqa: E402


@given(st.integers(1, 5), st.integers(0, 3), st.integers(1, 24), st.integers(0, 2**32 - 1),
       st.sampled_from(["dense", "sparse", "point"]))
def test_random_requests_cpu_equals_reference(b, k, v, seed, qkind):
    rng = np.random.default_rng(seed)
    target = logits_rows(rng, b * (k + 1), v).reshape(b, k + 1, v)
    rng.shuffle(target.reshape(-1, v))
    q, draft = q_and_draft(rng, b, k, v, qkind)
    greedy = rng.random(b) < 0.2
    both(target, draft, q, keys_for(rng, b), greedy=greedy, **params_for(rng, b, v))


def test_torch_parameters():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(6)
    b, k, v = 5, 1, 12
    target = logits_rows(rng, b * (k + 1), v).reshape(b, k + 1, v)
    draft = rng.integers(0, v, size=(b, k)).astype(np.int32)
    keys = keys_for(rng, b)
    p = params_for(rng, b, v)
    tp = dict(temperature=torch.tensor(p["temperature"], dtype=torch.float32),
              top_k=torch.tensor(p["top_k"]), top_p=torch.tensor(p["top_p"]).to(torch.bfloat16),
              min_p=torch.tensor(p["min_p"], dtype=torch.float16))
    got = both(torch.from_numpy(target), torch.from_numpy(draft), None, keys, **tp)
    want = both(target, draft, None, keys,
                temperature=tp["temperature"].double().numpy(), top_k=p["top_k"],
                top_p=tp["top_p"].float().numpy(), min_p=tp["min_p"].float().numpy())
    np.testing.assert_array_equal(np.asarray(got.tokens), want.tokens)


@pytest.mark.parametrize("qkind", ["dense", "sparse", "point"])
def test_num_drafts_cpu_equals_reference(qkind):
    rng = np.random.default_rng(31 + len(qkind))
    b, k, v = 9, 3, 15
    target = logits_rows(rng, b * (k + 1), v).reshape(b, k + 1, v)
    q, draft = q_and_draft(rng, b, k, v, qkind)
    n = rng.integers(0, k + 1, size=b).astype(np.int32)
    n[0], n[1] = -1, k + 1  # fail closed: NUM_DRAFTS_INVALID
    for r in range(b):
        target[r, max(n[r], 0) + 1:] = np.nan  # never read
    got = both(target, draft, q, keys_for(rng, b), num_drafts=n, **params_for(rng, b, v))
    assert got.status[:2].tolist() == [_status.NUM_DRAFTS_INVALID] * 2
    assert (got.status[2:] == 0).all()
    assert ((got.tokens >= 0).sum(axis=1)[2:] == got.accepted[2:] + 1).all()
