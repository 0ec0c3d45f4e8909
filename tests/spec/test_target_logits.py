"""verify(logits=True): the processed target is exact, and verification preserves it.

Proofs in fractions: ``first_token_distribution_logits`` (the law of the first
emitted token, computed from the decision procedure) equals the documented
processed target ``logits_target_distribution`` for each sampling parameter alone
and combined; the rules of docs/semantics.md "Target logits" are checked on hand
cases (ties at the top-k / top-p boundary, the min-p threshold, -inf masking).
"""

from fractions import Fraction
import math

import numpy as np
import pytest

import dyadic
from dyadic import _spec, _status
from dyadic.reference import distribution, fixedpoint, target_logits

TOTAL = _spec.TOTAL
WMAX = 1 << 39
INF = float("inf")


def f32(values):
    return [float(x) for x in np.asarray(values, dtype=np.float32)]


def weights(xs, temperature=1.0):
    st, w, _, _ = fixedpoint.logits_row_weights(xs, None, temperature)
    assert st == 0
    return w


def q_rows(rng, v):
    """Draft distributions: random dense, one with zeros, a point mass, uniform."""
    qs = []
    c = dyadic.allocate(rng.standard_normal((1, v)).astype(np.float32), logits=True,
                        backend="reference").counts[0].tolist()
    qs.append(c)
    if v > 2:
        z = rng.standard_normal(v).astype(np.float32)
        z[rng.choice(v, size=v // 2, replace=False)] = -np.inf
        qs.append(dyadic.allocate(z[None], logits=True, backend="reference").counts[0].tolist())
    point = [0] * v
    point[int(rng.integers(v))] = TOTAL
    qs.append(point)
    if TOTAL % v == 0:
        qs.append([TOTAL // v] * v)
    return qs


PARAMS = [
    dict(),
    dict(temperature=0.7),
    dict(temperature=2.5),
    dict(top_k=1),
    dict(top_k=3),
    dict(top_p=0.5),
    dict(top_p=0.9),
    dict(top_p=1e-6),
    dict(min_p=0.1),
    dict(min_p=0.5),
    dict(min_p=1.0),
    dict(temperature=0.6, top_k=4, top_p=0.8, min_p=0.05),
    dict(temperature=1.7, top_k=2, top_p=0.95),
    dict(temperature=0.3, min_p=0.2, top_p=0.7),
    dict(temperature=0.0),
    dict(temperature=0.0, top_k=2, top_p=0.3, min_p=0.5),
    dict(greedy=True, temperature=0.8),
]


def _param_id(p):
    return ",".join(f"{k}={v}" for k, v in p.items()) or "default"


@pytest.mark.parametrize("params", PARAMS, ids=_param_id)
@pytest.mark.parametrize("v", [1, 2, 5, 9])
def test_first_token_law_is_the_processed_target(params, v):
    rng = np.random.default_rng(v * 7919 + len(params))
    for trial in range(3):
        xs = rng.standard_normal(v) * 3
        if trial == 1 and v > 2:
            xs[rng.choice(v, size=v // 3, replace=False)] = -np.inf
        if trial == 2:
            xs = np.round(xs)  # ties in z
        xs = f32(xs)
        want = target_logits.target_distribution(xs, **params)
        assert sum(want) == 1
        for q in q_rows(rng, v):
            got = distribution.first_token_distribution_logits(xs, q, **params)
            assert got == want, (xs, q)


def test_greedy_target_is_point_mass_at_first_argmax():
    xs = f32([1.0, 3.0, -INF, 3.0, 0.0])
    want = [0, 1, 0, 0, 0]
    assert target_logits.target_distribution(xs, temperature=0.0) == want
    assert target_logits.target_distribution(xs, greedy=True, top_k=1) == want


def test_plain_temperature_is_the_allocate_weights():
    rng = np.random.default_rng(3)
    xs = f32(rng.standard_normal(11) * 4)
    for t in (0.25, 1.0, 3.0):
        w = weights(xs, t)
        assert max(w) == WMAX
        assert target_logits.target_distribution(xs, temperature=t) == [
            Fraction(x, sum(w)) for x in w]


def test_minus_inf_masks_and_positive_inf_nan_are_invalid():
    xs = f32([0.0, -INF, 1.0, -INF])
    p = target_logits.target_distribution(xs)
    assert p[1] == p[3] == 0 and p[0] > 0 and p[2] > p[0]
    for bad in (f32([0.0, INF]), f32([0.0, float("nan")])):
        st, *_ = target_logits.target_row(bad, False, 1.0, 0, target_logits.param_bits(1.0), 0)
        assert st == _status.TARGET_INVALID_VALUE
        st, *_ = target_logits.target_row(bad, False, 0.0, 0, target_logits.param_bits(1.0), 0)
        assert st == _status.TARGET_INVALID_VALUE
    for t in (1.0, 0.0):
        st, *_ = target_logits.target_row(f32([-INF, -INF]), False, t, 0,
                                          target_logits.param_bits(1.0), 0)
        assert st == _status.TARGET_ZERO_MASS
    # overflow of x / temperature to +inf is +inf in z
    st, *_ = target_logits.target_row(f32([3e38, 0.0]), False, 1e-300, 0,
                                      target_logits.param_bits(1.0), 0)
    assert st == _status.TARGET_INVALID_VALUE


def test_top_k_ties_go_to_the_lowest_ids():
    xs = f32([1.0, 3.0, 3.0, 3.0, 2.0])
    p = target_logits.target_distribution(xs, top_k=2)
    assert p == [0, Fraction(1, 2), Fraction(1, 2), 0, 0]
    p = target_logits.target_distribution(xs, top_k=4)
    w = weights(xs)
    assert p == [0] + [Fraction(w[i], 3 * WMAX + w[4]) for i in (1, 2, 3, 4)]
    # top_k above the number of tokens keeps all of them
    assert target_logits.target_distribution(xs, top_k=99) == target_logits.target_distribution(xs)


def test_top_p_is_the_shortest_prefix_reaching_need_ties_lowest_id():
    xs = f32([-INF, 5.0, 5.0, 5.0, 5.0])  # four tokens of weight 2**39, one masked
    w = weights(xs)
    ts = sum(w)
    for top_p, kept in ((0.5, [1, 2]), (0.25, [1]), (0.26, [1, 2]), (0.75, [1, 2, 3]),
                        (0.999, [1, 2, 3, 4]), (1.0, [1, 2, 3, 4])):
        u = target_logits.f32_ceil24(target_logits.param_bits(top_p))
        need = -((-u * ts) // TOTAL)
        # the rule, stated independently: the shortest ranked prefix reaching need
        order = [1, 2, 3, 4, 0]
        cum, want = 0, []
        for tok in order:
            want.append(tok)
            cum += w[tok]
            if cum >= need:
                break
        assert sorted(want) == kept, top_p
        p = target_logits.target_distribution(xs, top_p=top_p)
        assert [i for i, x in enumerate(p) if x] == kept
    # a tiny fifth token raises Ts just above 4 * 2**39: 0.5 then needs a third token
    xs = f32([0.0, 5.0, 5.0, 5.0, 5.0])
    p = target_logits.target_distribution(xs, top_p=0.5)
    assert [i for i, x in enumerate(p) if x] == [1, 2, 3]
    assert [i for i, x in enumerate(target_logits.target_distribution(xs, top_p=1.0)) if x] == [
        0, 1, 2, 3, 4]


def test_top_p_after_top_k_and_min_p_uses_the_survivors_total():
    xs = f32([4.0, 3.0, 2.0, 1.0, 0.0])
    w = weights(xs)
    # min-p 0.2 drops tokens below 0.2 * 2**39 (exp(-2) < 0.2 < exp(-1)): keeps 0, 1
    assert w[1] * TOTAL >= target_logits.f32_ceil24(target_logits.param_bits(0.2)) * WMAX
    assert w[2] * TOTAL < target_logits.f32_ceil24(target_logits.param_bits(0.2)) * WMAX
    kept = target_logits.target_distribution(xs, min_p=0.2)
    assert [i for i, x in enumerate(kept) if x] == [0, 1]
    # top_k=3 then top_p 0.9 of the three survivors' total
    ts = w[0] + w[1] + w[2]
    need = -((-target_logits.f32_ceil24(target_logits.param_bits(0.9)) * ts) // TOTAL)
    kept = [0, 1] if w[0] + w[1] >= need else [0, 1, 2]
    p = target_logits.target_distribution(xs, top_k=3, top_p=0.9)
    assert [i for i, x in enumerate(p) if x] == kept
    assert p[0] == Fraction(w[0], sum(w[i] for i in kept))


def test_min_p_threshold_is_inclusive_and_exact():
    # a token exactly at the threshold: W * 2**24 == mp * 2**39
    xs = f32([0.0, -math.log(2.0)])
    w = weights(xs)
    mp = (w[1] * TOTAL) // WMAX  # the largest mp that keeps w[1]
    bits = target_logits.param_bits(mp / TOTAL)
    assert target_logits.f32_ceil24(bits) == mp
    assert target_logits.target_distribution(xs, min_p=mp / TOTAL)[1] > 0
    assert target_logits.target_distribution(xs, min_p=(mp + 1) / TOTAL)[1] == 0
    # min_p = 1 keeps exactly the tokens at the maximum
    xs = f32([2.0, 2.0, 1.999])
    assert target_logits.target_distribution(xs, min_p=1.0) == [Fraction(1, 2), Fraction(1, 2), 0]


@pytest.mark.parametrize("value", [0.0, 1e-45, 2 ** -24, 0.1, 1 / 3, 0.5, 0.9999999, 1.0])
def test_f32_ceil24_is_exact(value):
    bits = target_logits.param_bits(value)
    f = Fraction(float(np.float32(value)))
    assert target_logits.f32_ceil24(bits) == math.ceil(f * TOTAL)


def test_params_status():
    one = target_logits.param_bits(1.0)
    ok = target_logits.params_status
    assert ok(1.0, 0, one, 0) == 0
    assert ok(0.0, 0, one, 0) == 0 and ok(-0.0, 0, one, 0x80000000) == 0
    for t in (-1e-300, INF, float("nan")):
        assert ok(t, 0, one, 0) == _status.TEMPERATURE_INVALID
    assert ok(1.0, -1, one, 0) == _status.TOP_K_INVALID
    for bits in (0, 0x80000000, target_logits.param_bits(1.0000001), 0x7FC00000,
                 target_logits.param_bits(-0.5)):
        assert ok(1.0, 0, bits, 0) == _status.TOP_P_INVALID
        if bits not in (0, 0x80000000):
            assert ok(1.0, 0, one, bits) == _status.MIN_P_INVALID


def _verify_ref(target, draft, keys, q=None, **kw):
    return dyadic.verify(target, draft, q, keys, backend="reference", check=False, logits=True,
                         **kw)


def test_per_row_parameters_equal_rows_verified_alone():
    rng = np.random.default_rng(11)
    b, k, v = 6, 2, 7
    target = (rng.standard_normal((b, k + 1, v)) * 2).astype(np.float32)
    target[2, :, 3] = -np.inf
    target[4] = np.round(target[4])
    draft = rng.integers(0, v, size=(b, k)).astype(np.int32)
    temp = np.array([1.0, 0.0, 0.7, 1.3, 0.0, 0.5])
    top_k = np.array([0, 2, 3, 0, 1, 2])
    top_p = np.array([1.0, 0.5, 0.8, 0.6, 1.0, 0.9], dtype=np.float32)
    min_p = np.array([0.0, 0.3, 0.05, 0.0, 0.2, 0.1], dtype=np.float32)
    keys = dyadic.Keys(seed=np.arange(b, dtype=np.uint64) + 5, generation=1, round=2,
                       position=np.arange(b, dtype=np.uint32) * 3)
    got = _verify_ref(target, draft, keys, temperature=temp, top_k=top_k, top_p=top_p,
                      min_p=min_p)
    assert (got.status == 0).all()
    for r in range(b):
        one = _verify_ref(target[r:r + 1], draft[r:r + 1],
                          dyadic.Keys(seed=r + 5, generation=1, round=2, position=r * 3),
                          temperature=float(temp[r]), top_k=int(top_k[r]),
                          top_p=float(top_p[r]), min_p=float(min_p[r]))
        assert one.accepted[0] == got.accepted[r]
        assert one.tokens[0].tolist() == got.tokens[r].tolist()
    # temperature-0 rows are greedy: accept while d == argmax of the logits
    for r in (1, 4):
        arg = [int(np.argmax(target[r, i])) for i in range(k + 1)]
        acc = 0
        while acc < k and draft[r, acc] == arg[acc]:
            acc += 1
        assert got.accepted[r] == acc
        assert got.tokens[r, acc] == arg[acc]


def test_bad_parameters_fail_closed_rows_alone():
    rng = np.random.default_rng(5)
    b, v = 5, 6
    target = rng.standard_normal((b, 2, v)).astype(np.float32)
    draft = rng.integers(0, v, size=(b, 1)).astype(np.int32)
    keys = dyadic.Keys(seed=np.arange(b, dtype=np.uint64))
    temp = np.array([1.0, -1.0, 1.0, 1.0, 1.0])
    top_k = np.array([0, 0, -3, 0, 0])
    top_p = np.array([1.0, 1.0, 1.0, 1.5, 1.0])
    min_p = np.array([0.0, 0.0, 0.0, 0.0, 2.0])
    got = _verify_ref(target, draft, keys, temperature=temp, top_k=top_k, top_p=top_p,
                      min_p=min_p)
    assert got.status.tolist() == [0, _status.TEMPERATURE_INVALID, _status.TOP_K_INVALID,
                                   _status.TOP_P_INVALID, _status.MIN_P_INVALID]
    assert (got.tokens[1:] == -1).all() and (got.accepted[1:] == 0).all()
    alone = _verify_ref(target[:1], draft[:1], dyadic.Keys(seed=0))
    assert alone.tokens[0].tolist() == got.tokens[0].tolist()


def test_processed_target_is_the_kept_weights_scaled_into_the_acceptance_band():
    """P = W * 2**s on the kept tokens with T in [2**62, 2**63]: p(v) is that of the
    weights, and the acceptance draw uniform_below_63(T) succeeds with probability
    >= 1/2 per attempt."""
    rng = np.random.default_rng(17)
    one = target_logits.param_bits(1.0)
    for v, top_k, top_p in ((1, 0, 1.0), (3, 1, 1.0), (50, 0, 1e-6), (50, 7, 0.9), (2000, 0, 1.0)):
        xs = f32(rng.standard_normal(v))
        pb = target_logits.param_bits(top_p)
        st, w, tw, arg = target_logits.weights_row(xs, 1.0, top_k, pb, 0)
        st2, p, t, arg2 = target_logits.processed_row(xs, 1.0, top_k, pb, 0)
        assert st == st2 == 0 and arg == arg2
        assert 1 << 62 <= t <= 1 << 63
        s = (t // tw).bit_length() - 1
        assert t == tw << s and p == [x << s for x in w]
    xs = f32(np.zeros(4))
    assert target_logits.processed_row(xs, 1.0, 0, one, 0)[2] == 1 << 62


def test_num_drafts_cuts_the_request_and_never_reads_beyond():
    """verify(logits=True, num_drafts=n): a request gives the result of the same request
    verified alone at depth n; target rows beyond n may hold anything (NaN, +inf, all
    -inf), draft ids and q rows from n on likewise."""
    rng = np.random.default_rng(23)
    b, k, v = 5, 3, 9
    target = (rng.standard_normal((b, k + 1, v)) * 2).astype(np.float32)
    draft = rng.integers(0, v, size=(b, k)).astype(np.int32)
    n = np.array([0, 1, 3, 2, 0], np.int32)
    for r in range(b):
        target[r, n[r] + 1:] = np.nan
        draft[r, n[r]:] = -7
    keys = dyadic.Keys(seed=np.arange(b, dtype=np.uint64) + 3, position=9)
    params = dict(temperature=np.array([1.0, 0.0, 0.7, 1.2, 0.0]), top_k=2, top_p=0.9,
                  min_p=np.array([0.0, 0.1, 0.0, 0.2, 0.0]))
    got = dyadic.verify(target, draft, None, keys, backend="reference", logits=True,
                        num_drafts=n, **params)
    for r in range(b):
        m = int(n[r])
        alone = dyadic.verify(target[r:r + 1, :m + 1], draft[r:r + 1, :m], None,
                              dyadic.Keys(seed=r + 3, position=9), backend="reference",
                              logits=True, temperature=float(params["temperature"][r]),
                              top_k=2, top_p=0.9, min_p=float(params["min_p"][r]))
        assert got.accepted[r] == alone.accepted[0]
        assert got.tokens[r].tolist() == alone.tokens[0].tolist() + [-1] * (k - m)
    bad = dyadic.verify(target, draft, None, keys, backend="reference", logits=True,
                        num_drafts=np.array([0, 4, -1, 2, 0], np.int32), check=False, **params)
    assert bad.status.tolist()[1:3] == [_status.NUM_DRAFTS_INVALID] * 2
    with pytest.raises(ValueError, match="num_drafts: row 1"):
        dyadic.verify(target, draft, None, keys, backend="reference", logits=True,
                      num_drafts=np.array([0, 4, 1, 2, 0], np.int32), **params)
