"""The per-shard kernels of dyadic.distributed (backends/cpu/_shard.pyx over
backends/include/dyadic_shard.h) against the reference, bit for bit.

Each kernel is checked alone against a NumPy / pure-Python statement of what
it computes, and the kernels are composed in-process, shard by shard, the way
dyadic/distributed/_core.py composes them across ranks (the collectives
replaced by stacking the shards' arrays in id order), and compared with the
unsharded reference propose / verify.  Adversarial inputs: ties at the top-k
boundary across shards, -inf rows, NaN / +inf, empty shards and shards of
size 1, shards at the end of the vocabulary.  Hostile ids (draft ids and
candidate ids outside [0, V)) fail the row closed with a status code; bad
shapes and shards raise ValueError naming the argument.
"""

import numpy as np
import pytest

import dyadic
from dyadic import _backend, _spec, _status
from dyadic.reference import sampling

TOTAL = _spec.TOTAL

try:
    _backend.get("cpu")
    from dyadic.backends.cpu import _shard as sk
except _backend.BackendUnavailable as exc:  # pragma: no cover - the compiled backend is missing
    pytest.skip(f"cpu backend unavailable: {exc}", allow_module_level=True)


def _keys(b, seed=3, position=11, extra=0):
    return dyadic.Keys(seed=seed, generation=2, round=5, position=position).broadcast(
        b, position_extra=extra)


def _cuts(v, rng, kind):
    """Contiguous splits of [0, v): even, random (with empty shards), size-1 shards."""
    if kind == "even":
        return [0, v // 2, v]
    if kind == "random":
        return [0] + sorted(rng.integers(0, v + 1, 3).tolist()) + [v]
    if kind == "ones":  # shards of size 1 at both ends, an empty one in the middle
        return [0, 1, 1, v - 1, v]
    return [0, v]


def _logits(rng, b, v, kind):
    if kind == "ties":
        return rng.integers(-2, 2, (b, v)).astype(np.float32)
    x = rng.normal(0, 3, (b, v)).astype(np.float32)
    if kind == "neginf":
        x[0] = -np.inf
        x[1, : v - 2] = -np.inf
    return x


# ----------------------------------------------------------------------------- propose

def _expected_top(x, bias, t, k, offset):
    """(status, x bits, bias bits, global ids) of one shard row by the reference's order."""
    with np.errstate(all="ignore"):
        z = x.astype(np.float64)
        if bias is not None:
            z = z + bias.astype(np.float64)
        z = z / t
    bad = np.flatnonzero(np.isnan(z) | (z == np.inf))
    if bad.size:
        return (_status.X_NAN if np.isnan(z[bad[0]]) else _status.X_POSINF), [], [], []
    order = sorted(range(z.size), key=lambda i: (-z[i], i))[:k]
    order.sort()
    xb = x.view(np.int32)[order].tolist()
    bb = [] if bias is None else bias.view(np.int32)[order].tolist()
    return 0, xb, bb, [offset + i for i in order]


@pytest.mark.parametrize("kind", ["random", "ties", "neginf", "nan"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_topk_matches_reference_order(kind, with_bias):
    rng = np.random.default_rng(hash((kind, with_bias)) % 2**32)
    b, v, k = 4, 23, 5
    x = _logits(rng, b, v, "ties" if kind == "nan" else kind)
    if kind == "nan":
        x[2, 7] = np.nan
        x[3, 4] = np.inf
    bias = rng.integers(-1, 2, (b, v)).astype(np.float32) if with_bias else None
    temp = np.array([1.0, 0.5, 2.0, 1.0])
    greedy = np.array([0, 0, 0, 1], np.uint8)
    for lo, hi in ((0, v), (3, 9), (v - 1, v), (v - 4, v), (5, 5)):
        ncol = 3 if with_bias else 2
        pay = np.full((b, 1 + k * ncol), 7, np.int32)
        xs = np.ascontiguousarray(x[:, lo:hi])
        bs = None if bias is None else np.ascontiguousarray(bias[:, lo:hi])
        sk.topk(xs, bs, temp, greedy, k, lo, v, pay)
        for r in range(b):
            kk = 1 if greedy[r] else k
            st, xb, bb, ids = _expected_top(xs[r], None if bs is None else bs[r], temp[r], kk, lo)
            m = len(ids)
            assert pay[r, 0] == st
            assert pay[r, 1:1 + m].tolist() == xb
            assert (pay[r, 1 + m:1 + k] == -1).all()
            if with_bias:
                assert pay[r, 1 + k:1 + k + m].tolist() == bb
                assert (pay[r, 1 + k + m:1 + 2 * k] == -1).all()
            assert pay[r, 1 + (ncol - 1) * k:1 + (ncol - 1) * k + m].tolist() == ids
            assert (pay[r, 1 + (ncol - 1) * k + m:] == -1).all()


def _sharded_propose(x, bias, temp, width, policy, keys, cuts):
    b, v = x.shape
    greedy = (temp == 0).astype(np.uint8)
    t_eff = np.where(greedy, 1.0, temp)
    pays = []
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        ncol = 3 if bias is not None else 2
        pay = np.empty((b, 1 + width * ncol), np.int32)
        sk.topk(np.ascontiguousarray(x[:, lo:hi]),
                None if bias is None else np.ascontiguousarray(bias[:, lo:hi]),
                t_eff, greedy, width, lo, v, pay)
        pays.append(pay)
    g = np.ascontiguousarray(np.stack(pays))
    tokens = np.empty(b, np.int32)
    counts = np.empty((b, width), np.uint32)
    ids = np.empty((b, width), np.int32)
    st, ast = np.empty(b, np.int32), np.empty(b, np.int32)
    sk.merge(g, bias is not None, width, t_eff, greedy, _spec.POLICY_CODES[policy], v, width,
             *keys, tokens, counts, ids, st, ast)
    return tokens, counts, ids, np.where(st != 0, st, ast)


def _status_of(fn):
    try:
        return 0, fn()
    except ValueError as exc:
        return int(str(exc).rsplit("[status ", 1)[1].rstrip("]")), None


@pytest.mark.parametrize("kind", ["random", "ties", "neginf"])
@pytest.mark.parametrize("cut", ["even", "random", "ones", "one"])
@pytest.mark.parametrize("policy", ["standard", "floor-first"])
def test_topk_merge_equals_unsharded_reference(kind, cut, policy):
    rng = np.random.default_rng(hash((kind, cut, policy)) % 2**32)
    b, v = 5, 37
    x = _logits(rng, b, v, kind)
    bias = rng.integers(-1, 2, (1, v)).astype(np.float32) if kind == "ties" else None
    temp = np.array([1.0, 0.0, 0.7, 1.3, 0.0])
    keys = dyadic.Keys(seed=int(rng.integers(2**63)), position=4)
    for width in (1, 4, 9, v):
        cuts = _cuts(v, rng, cut)
        tok, cnt, ids, st = _sharded_propose(x, None if bias is None else np.repeat(bias, b, 0),
                                             temp, width, policy, keys.broadcast(b), cuts)
        for r in range(b):
            want_st, want = _status_of(lambda: dyadic.propose(
                x[r:r + 1], dyadic.Keys(seed=keys.seed, position=keys.position),
                temperature=float(temp[r]), bias=None if bias is None else bias[0],
                top_k=width, policy=policy, backend="reference"))
            assert st[r] == want_st, (width, cuts, r)
            if want_st:
                assert tok[r] == -1 and (cnt[r] == 0).all() and (ids[r] == -1).all()
                continue
            wt, wq = want
            assert tok[r] == int(np.asarray(wt)[0]), (width, cuts, r)
            assert cnt[r].tolist() == np.asarray(wq.counts)[0].tolist()
            assert ids[r].tolist() == np.asarray(wq.ids)[0].tolist()


def test_merge_fails_closed_on_hostile_candidates():
    v, k, b = 10, 3, 3
    g = np.full((2, b, 1 + 2 * k), -1, np.int32)
    g[..., 0] = 0  # payload status: ok
    one = np.float32(1.0).view(np.int32)
    g[0, 0, 1], g[0, 0, 1 + k] = one, 4
    g[1, 0, 1], g[1, 0, 1 + k] = one, v  # candidate id == V: out of range
    g[0, 1, 1], g[0, 1, 1 + k] = one, 2 ** 31 - 1
    # row 2: padding only
    keys = _keys(b)
    tokens = np.empty(b, np.int32)
    counts = np.empty((b, k), np.uint32)
    ids = np.empty((b, k), np.int32)
    st, ast = np.empty(b, np.int32), np.empty(b, np.int32)
    sk.merge(g, False, k, np.ones(b), np.zeros(b, np.uint8), 0, v, k, *keys, tokens, counts,
             ids, st, ast)
    assert st.tolist() == [_status.SHARD_INVALID, _status.SHARD_INVALID, _status.X_ZERO_MASS]
    assert (tokens == -1).all() and (counts == 0).all() and (ids == -1).all()


def test_merge_of_neg_inf_candidates_is_zero_mass():
    v, k = 6, 2
    g = np.full((1, 1, 1 + 2 * k), -1, np.int32)
    g[..., 0] = 0
    g[0, 0, 1:3] = np.float32(-np.inf).view(np.int32)
    g[0, 0, 3:5] = [0, 5]
    out = [np.empty(1, np.int32), np.empty((1, k), np.uint32), np.empty((1, k), np.int32),
           np.empty(1, np.int32), np.empty(1, np.int32)]
    sk.merge(g, False, k, np.ones(1), np.zeros(1, np.uint8), 0, v, k, *_keys(1), *out)
    assert out[3][0] == _status.X_ZERO_MASS and out[0][0] == -1


def test_shape_and_shard_errors_name_the_argument():
    x = np.zeros((2, 5), np.float32)
    pay = np.empty((2, 1 + 2 * 3), np.int32)
    ones, g0 = np.ones(2), np.zeros(2, np.uint8)
    with pytest.raises(ValueError, match="vocab_offset"):
        sk.topk(x, None, ones, g0, 3, 8, 10, pay)  # [8, 13) is not inside [0, 10)
    with pytest.raises(ValueError, match="vocab_offset"):
        sk.topk(x, None, ones, g0, 3, 0, 2**24 + 1, pay)
    with pytest.raises(ValueError, match="payload"):
        sk.topk(x, None, ones, g0, 2, 0, 10, pay)
    with pytest.raises(ValueError, match="temperature"):
        sk.topk(x, None, np.ones(3), g0, 3, 0, 10, pay)
    t = np.zeros((2, 3, 5), np.float32)
    f = np.empty((2, 3, 9), np.int64)
    with pytest.raises(ValueError, match="vocab_offset"):
        sk.target_summary(t, np.zeros((2, 2), np.int64), None, np.zeros(2, np.uint8), 6, 10, f,
                          np.empty(2, np.int32))
    with pytest.raises(ValueError, match="draft"):
        sk.target_summary(t, np.zeros((2, 3), np.int64), None, np.zeros(2, np.uint8), 0, 10, f,
                          np.empty(2, np.int32))


# ----------------------------------------------------------------------------- verify

def _target(rng, b, k1, v, sparse_top=None):
    w = np.exp(rng.normal(0, 2, (b, k1, v)))
    if sparse_top is not None:
        w[..., sparse_top:] = 0
    return (w / w.sum(-1, keepdims=True)).astype(np.float32)


def test_target_summary_matches_reference():
    rng = np.random.default_rng(7)
    b, k, v = 3, 2, 19
    t = _target(rng, b, k + 1, v)
    t[0, 1, 3] = np.nan
    t[1, 0, 5] = -0.0
    t[1, 2, 6] = 1.5
    t[2, 0, :] = 0.0
    draft = np.array([[3, 18], [0, 7], [12, 12]], np.int64)
    q = rng.integers(0, 2**20, (b, k, v)).astype(np.uint32)
    for lo, hi in ((0, v), (4, 13), (v - 1, v), (7, 7)):
        ts = np.ascontiguousarray(t[..., lo:hi])
        qs = np.ascontiguousarray(q[..., lo:hi])
        f = np.empty((b, k + 1, 9), np.int64)
        st = np.empty(b, np.int32)
        sk.target_summary(ts, draft, qs, np.array([1, 0, 1], np.uint8), lo, v, f, st)
        assert (st == 0).all()
        bits = ts.view(np.uint32)
        for r in range(b):
            for i in range(k + 1):
                row = bits[r, i].tolist()
                valid = [bb <= 0x3F800000 or bb == 0x80000000 for bb in row]
                p = [_pfix(bb) if ok else 0 for bb, ok in zip(row, valid)]
                mags = [bb & 0x7FFFFFFF for bb in row]
                want = [int(not all(valid)), sum(x >> 32 for x in p),
                        sum(x & 0xFFFFFFFF for x in p),
                        max(mags) if mags and r != 1 else -1,
                        lo + mags.index(max(mags)) if mags and r != 1 else -1, 0, 0, 0, 0]
                if i < k:
                    d = int(draft[r, i])
                    if lo <= d < hi:
                        want[5], want[6] = p[d - lo] >> 32, p[d - lo] & 0xFFFFFFFF
                        want[7] = int(qs[r, i, d - lo])
                    want[8] = int(qs[r, i].sum())
                assert f[r, i].tolist() == want, (lo, hi, r, i)


def test_target_summary_fails_closed_on_bad_draft():
    rng = np.random.default_rng(8)
    b, k, v = 3, 2, 9
    t = _target(rng, b, k + 1, v)
    draft = np.array([[1, 2], [v, 0], [-5, 1]], np.int64)
    f = np.empty((b, k + 1, 9), np.int64)
    st = np.empty(b, np.int32)
    sk.target_summary(t, draft, None, np.ones(b, np.uint8), 0, v, f, st)
    assert st.tolist() == [0, _status.DRAFT_OUT_OF_RANGE, _status.DRAFT_OUT_OF_RANGE]
    assert (f[1, 0] == 0).all() and (f[2, 0] == 0).all()
    good = np.empty((1, k + 1, 9), np.int64)
    sk.target_summary(t[:1], draft[:1], None, np.ones(1, np.uint8), 0, v, good,
                      np.empty(1, np.int32))
    assert (f[0] == good[0]).all()


def _pfix(bits):
    """P = floor(p 2**62) of one valid float32 probability (exact: a power-of-two scaling)."""
    return int(np.floor(float(np.array(bits, np.uint32).view(np.float32)) * 2.0**62))


def _residual_rows(bits_row, q_row, total, bonus):
    p = [_pfix(bb) if (bb <= 0x3F800000 or bb == 0x80000000) else 0 for bb in bits_row]
    return p if bonus else sampling.residual(p, total, q_row)


def test_residual_mass_and_find_match_reference():
    rng = np.random.default_rng(9)
    b, k, v = 4, 2, 17
    t = _target(rng, b, k + 1, v)
    q = rng.integers(0, 2**22, (b, k, v)).astype(np.uint32)
    total = rng.integers(2**61, 2**62, (b, k + 1), dtype=np.uint64)
    draw_at = np.array([0, 1, 2, -1], np.int32)
    lo, hi = 5, 14
    ts = np.ascontiguousarray(t[..., lo:hi])
    mass = np.empty((b, 3), np.int64)
    sk.residual_mass(ts, draw_at, q, lo, None, None, lo, total, mass)
    for r in range(b):
        j = int(draw_at[r])
        if j < 0:
            assert (mass[r] == 0).all()
            continue
        qrow = [0] * (hi - lo) if j == k else q[r, j, lo:hi].tolist()
        res = _residual_rows(ts.view(np.uint32)[r, j].tolist(), qrow, int(total[r, j]), j == k)
        want = [sum(x & 0xFFFFFFFF for x in res), sum((x >> 32) & 0xFFFFFFFF for x in res),
                sum(x >> 64 for x in res)]
        assert mass[r].tolist() == want
        s = sum(res)
        for x in (0, s // 3, s - 1, s):
            tok = np.empty(b, np.int64)
            one = np.full(b, -1, np.int32)
            one[r] = j
            sk.residual_find(ts, one, q, lo, None, None, lo, total,
                             np.full(b, x >> 64, np.uint64),
                             np.full(b, x & (2**64 - 1), np.uint64), tok)
            want_tok = -1 if x >= s else lo + sampling.first_exceeding(res, x)
            assert tok[r] == want_tok and (np.delete(tok, r) == -1).all()


def test_sparse_q_scatter_skips_foreign_and_padding_ids():
    rng = np.random.default_rng(10)
    b, k, v = 3, 1, 12
    t = _target(rng, b, k + 1, v)
    lo, hi = 4, 8
    ts = np.ascontiguousarray(t[..., lo:hi])
    # row 2: not ascending, a repeated id (the last count wins, as a dense scatter)
    qi = np.array([[[-1, 2, 5, 7, 11, 2**31 - 1]], [[-2**31, 4, 5, 6, 7, 8]],
                   [[7, 5, 5, 6, -1, 4]]], np.int32)
    qc = rng.integers(1, 2**20, qi.shape).astype(np.uint32)
    total = np.full((b, k + 1), 2**62, np.uint64)
    mass = np.empty((b, 3), np.int64)
    sk.residual_mass(ts, np.zeros(b, np.int32), None, 0, qc, qi, lo, total, mass)
    for r in range(b):
        dense = [0] * (hi - lo)
        for i, c in zip(qi[r, 0].tolist(), qc[r, 0].tolist()):
            if lo <= i < hi:
                dense[i - lo] = c
        res = _residual_rows(ts.view(np.uint32)[r, 0].tolist(), dense, 2**62, False)
        assert (int(mass[r, 0]) + (int(mass[r, 1]) << 32) + (int(mass[r, 2]) << 64)
                == sum(res))


def _sharded_verify(t, draft, q, keys, greedy, cuts):
    """The verify of dyadic/distributed/_core.py with every shard in this process."""
    b, k1, v = t.shape
    k = k1 - 1
    kb = keys.broadcast(b, position_extra=k)
    fs = []
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        f = np.empty((b, k1, 9), np.int64)
        st = np.empty(b, np.int32)
        sk.target_summary(np.ascontiguousarray(t[..., lo:hi]), draft, None,
                          greedy.astype(np.uint8), lo, v, f, st)
        assert (st == 0).all()
        fs.append(f)
    gf = np.ascontiguousarray(np.stack(fs))
    if q is None:
        cd = np.full((b, k), TOTAL, np.uint32)
        qargs = (None, 0, np.full((b, k, 1), TOTAL, np.uint32),
                 np.ascontiguousarray(draft[..., None], dtype=np.int32))
    else:
        qc = np.ascontiguousarray(np.asarray(q.counts), dtype=np.uint32)
        qi = np.ascontiguousarray(np.asarray(q.ids), dtype=np.int32)
        hit = qi == draft[..., None]
        at = np.take_along_axis(qc, hit.argmax(-1)[..., None], 2)[..., 0]
        cd = np.where(hit.any(-1), at, 0).astype(np.uint32)
        qargs = (None, 0, qc, qi)
    g8 = greedy.astype(np.uint8)
    total, pd = np.empty((b, k1), np.uint64), np.empty((b, k), np.uint64)
    best, status = np.empty((b, k1), np.int32), np.empty(b, np.int32)
    sk.verify_check(gf, cd, g8, total, pd, best, status)
    if status.any():
        return status, None, None
    acc, draw_at = np.empty(b, np.int32), np.empty(b, np.int32)
    tokens = np.empty((b, k1), np.int32)
    sk.verify_accept(draft, cd, total, pd, best, g8, *kb, acc, tokens, draw_at, status)
    if status.any():
        return status, None, None
    masses = []
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        m = np.empty((b, 3), np.int64)
        sk.residual_mass(np.ascontiguousarray(t[..., lo:hi]), draw_at, *qargs, lo, total, m)
        masses.append(m)
    owner = np.empty(b, np.int32)
    rel_hi, rel_lo = np.empty(b, np.uint64), np.empty(b, np.uint64)
    sk.correction_pick(np.ascontiguousarray(np.stack(masses)), draw_at, *kb, owner, rel_hi,
                       rel_lo, status)
    assert not status.any() and ((owner >= 0) == (draw_at >= 0)).all()
    for r in np.flatnonzero(draw_at >= 0):
        lo, hi = cuts[owner[r]], cuts[owner[r] + 1]
        one = np.full(b, -1, np.int32)
        one[r] = draw_at[r]
        tok = np.empty(b, np.int64)
        sk.residual_find(np.ascontiguousarray(t[..., lo:hi]), one, *qargs, lo, total,
                         rel_hi, rel_lo, tok)
        tokens[r, draw_at[r]] = tok[r]
    return status, acc, tokens


@pytest.mark.parametrize("cut", ["even", "random", "ones", "one"])
@pytest.mark.parametrize("qkind", ["sparse", "point"])
def test_verify_kernels_compose_to_unsharded_reference(cut, qkind):
    rng = np.random.default_rng(hash((cut, qkind)) % 2**32)
    b, k, v = 6, 3, 29
    t = _target(rng, b, k + 1, v, sparse_top=None)
    t[1] = _target(rng, 1, k + 1, v, sparse_top=1)[0]  # a point-mass target
    greedy = np.array([0, 0, 1, 0, 0, 1], bool)
    for trial in range(3):
        keys = dyadic.Keys(seed=int(rng.integers(2**63)), position=int(rng.integers(2**20)))
        dl = (np.log(np.maximum(t[:, :k], 1e-30)) + rng.normal(0, 1, (b, k, v))).astype(np.float32)
        toks, qq = dyadic.propose(dl.reshape(b * k, v), dyadic.Keys(seed=trial), top_k=5,
                                  backend="reference")
        draft = np.asarray(toks).reshape(b, k).astype(np.int64)
        q = None
        if qkind == "sparse":
            q = dyadic.Dyadic(np.asarray(qq.counts).reshape(b, k, -1),
                              np.asarray(qq.ids).reshape(b, k, -1), vocab_size=v)
        st, acc, tokens = _sharded_verify(t, draft, q, keys, greedy, _cuts(v, rng, cut))
        want = dyadic.verify(t, draft, q, keys, greedy=greedy, backend="reference")
        assert not st.any()
        assert acc.tolist() == np.asarray(want.accepted).tolist()
        assert tokens.tolist() == np.asarray(want.tokens).tolist()


def test_verify_check_reports_the_reference_status():
    rng = np.random.default_rng(12)
    b, k, v = 4, 2, 11
    t = _target(rng, b, k + 1, v)
    t[0, 2, 3] = np.inf
    t[1, 1] *= 2
    draft = np.zeros((b, k), np.int64)
    cd = np.full((b, k), TOTAL, np.uint32)
    cd[2, 1] = 0
    f = np.empty((b, k + 1, 9), np.int64)
    sk.target_summary(t, draft, None, np.zeros(b, np.uint8), 0, v, f, np.empty(b, np.int32))
    status = np.empty(b, np.int32)
    sk.verify_check(np.ascontiguousarray(f[None]), cd, np.zeros(b, np.uint8),
                    np.empty((b, k + 1), np.uint64), np.empty((b, k), np.uint64),
                    np.empty((b, k + 1), np.int32), status)
    assert status.tolist() == [_status.TARGET_INVALID_VALUE, _status.TARGET_SUM,
                               _status.Q_ZERO_AT_DRAFT, 0]


@pytest.mark.parametrize("bonus", [False, True])
def test_residual_find_over_many_blocks_matches_reference(bonus):
    """Shards of several blocks of 64 ids, sparse q: blocks without q, blocks with q, and
    draws at block boundaries."""
    rng = np.random.default_rng(13)
    b, k, v = 2, 1, 300
    t = _target(rng, b, k + 1, v)
    t[0, 0, 64:128] = 0.0  # a block of zero mass
    qi = np.array([[[3, 70, 131, 200, 263, 299]], [[-1, -1, 5, 6, 64, 65]]], np.int32)
    qc = rng.integers(1, 2**23, qi.shape).astype(np.uint32)
    total = np.full((b, k + 1), 2**62 + 12345, np.uint64)
    j = k if bonus else 0
    lo, hi = 7, 300
    ts = np.ascontiguousarray(t[..., lo:hi])
    for r in range(b):
        dense = [0] * (hi - lo)
        for i, c in zip(qi[r, 0].tolist(), qc[r, 0].tolist()):
            if lo <= i < hi:
                dense[i - lo] = c
        res = _residual_rows(ts.view(np.uint32)[r, j].tolist(), dense, int(total[r, j]), bonus)
        cum = np.cumsum(np.array(res, dtype=object))
        xs = [0, int(cum[63]) - 1, int(cum[63]), int(cum[64]), int(cum[130]), int(cum[-1]) - 1,
              int(cum[-1]), int(cum[-1]) // 2]
        for x in xs:
            one = np.full(b, -1, np.int32)
            one[r] = j
            tok = np.empty(b, np.int64)
            sk.residual_find(ts, one, None, 0, qc, qi, lo, total,
                             np.full(b, x >> 64, np.uint64),
                             np.full(b, x & (2**64 - 1), np.uint64), tok)
            want = -1 if x >= int(cum[-1]) else lo + sampling.first_exceeding(res, x)
            assert tok[r] == want, (r, x)
        mass = np.empty((b, 3), np.int64)
        one = np.full(b, -1, np.int32)
        one[r] = j
        sk.residual_mass(ts, one, None, 0, qc, qi, lo, total, mass)
        assert mass[r].tolist() == [sum(x & 0xFFFFFFFF for x in res),
                                    sum((x >> 32) & 0xFFFFFFFF for x in res),
                                    sum(x >> 64 for x in res)]


def test_correction_pick_matches_reference_draw():
    """X = philox.uniform_below(total) at position + j, then the first shard whose
    cumulative mass exceeds X; zero-mass shards are never picked; n = 0 is reported."""
    from dyadic.reference import philox
    rng = np.random.default_rng(14)
    s_, b = 4, 6
    mass = rng.integers(0, 2**40, (s_, b, 3)).astype(np.int64)
    mass[:, :, 2] = rng.integers(0, 2**20, (s_, b))
    mass[1] = 0  # a zero-mass shard
    mass[:, 5] = 0  # a request with no mass at all
    draw_at = np.array([0, 3, 1, -1, 2, 0], np.int32)
    kb = _keys(b, extra=3)
    owner = np.empty(b, np.int32)
    rel_hi, rel_lo, status = np.empty(b, np.uint64), np.empty(b, np.uint64), np.empty(b, np.int32)
    sk.correction_pick(np.ascontiguousarray(mass), draw_at, *kb, owner, rel_hi, rel_lo, status)
    assert not status.any()
    assert owner[3] == -1 and owner[5] == -2
    for r in (0, 1, 2, 4):
        per = [int(a) + (int(c) << 32) + (int(e) << 64) for a, c, e in mass[:, r].tolist()]
        key3 = (int(kb[0][r]), int(kb[1][r]), int(kb[2][r]))
        x, _ = philox.uniform_below(sum(per), key3, int(kb[3][r]) + int(draw_at[r]),
                                    _spec.DOMAIN_CORRECTION, 0)
        cum = np.cumsum(np.array(per, dtype=object))
        want = next(i for i in range(s_) if cum[i] > x)
        assert owner[r] == want and want != 1
        assert (int(rel_hi[r]) << 64) + int(rel_lo[r]) == x - (int(cum[want]) - per[want])


def test_proposal_tickets_match_reference():
    from dyadic.reference import philox
    kb = _keys(7, seed=99, position=2**20)
    out = np.empty(7, np.int64)
    sk.proposal_tickets(*kb, out)
    for r in range(7):
        key3 = (int(kb[0][r]), int(kb[1][r]), int(kb[2][r]))
        assert out[r] == philox.proposal_ticket(key3, int(kb[3][r]))


def test_topk_one_bias_row_for_every_request():
    """A bias [1, n] applies to every request, as a bias [B, n] of repeated rows."""
    rng = np.random.default_rng(15)
    b, v, k = 3, 150, 4
    x = rng.integers(-3, 3, (b, v)).astype(np.float32)
    bias = rng.integers(-1, 2, (1, v)).astype(np.float32)
    temp, g0 = np.array([1.0, 0.3, 1.0]), np.zeros(b, np.uint8)
    one, full = np.empty((b, 1 + 3 * k), np.int32), np.empty((b, 1 + 3 * k), np.int32)
    sk.topk(x, bias, temp, g0, k, 10, 200, one)
    sk.topk(x, np.repeat(bias, b, 0), temp, g0, k, 10, 200, full)
    assert (one == full).all()
    for r in range(b):
        st, xb, bb, ids = _expected_top(x[r], bias[0], temp[r], k, 10)
        assert one[r, 0] == st and one[r, 1 + 2 * k:].tolist() == ids


def test_dense_weights_match_reference():
    from dyadic.reference.fixedpoint import weight_from_gap
    rng = np.random.default_rng(16)
    b, n = 4, 70
    x = rng.normal(0, 8, (b, n)).astype(np.float32)
    x[1, :5] = -np.inf
    bias = rng.normal(0, 1, (1, n)).astype(np.float32)
    temp = np.array([1.0, 0.25, 3.0, 1.0])
    rows = np.array([1, 1, 1, 0], np.uint8)
    for bb in (None, bias):
        with np.errstate(all="ignore"):
            z = x.astype(np.float64)
            if bb is not None:
                z = z + bb.astype(np.float64)
            z = z / temp[:, None]
        zmax = z.max(axis=1)
        w = np.empty((b, n), np.uint64)
        sums = np.empty((b, 2), np.uint64)
        sk.dense_weights(x, bb, temp, zmax, rows, w, sums)
        for r in range(b):
            want = [weight_from_gap(float(zmax[r] - zz)) if rows[r] else 0 for zz in z[r]]
            assert w[r].tolist() == want
            assert sums[r].tolist() == [sum(v >> 32 for v in want),
                                        sum(v & 0xFFFFFFFF for v in want)]
