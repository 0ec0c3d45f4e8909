"""allocate / propose with top_p, min_p and per-row top_k: the CPU backend equals the
reference bit for bit; the support is the kept set of verify(logits=True)'s filters;
the filters switched off give the unfiltered results; bad rows fail closed."""

import numpy as np
import pytest

import dyadic
from dyadic import _spec, _status
from dyadic.reference import allocation, fixedpoint, target_logits

pytest.importorskip("dyadic.backends.cpu.backend")


def logits(rng, b, v):
    x = rng.standard_normal((b, v)) * 3
    x[1 % b] = np.round(x[1 % b])
    if b > 2:
        x[2, rng.random(v) < 0.5] = -np.inf
        x[2, 0] = 1.0
    if b > 3:
        x[3] = 0.0
    return x.astype(np.float32)


def same_alloc(x, **kw):
    kw.setdefault("check", False)
    a = dyadic.allocate(x, logits=True, backend="cpu", **kw)
    r = dyadic.allocate(x, logits=True, backend="reference", **kw)
    np.testing.assert_array_equal(a.counts, r.counts)
    if r.ids is not None:
        np.testing.assert_array_equal(a.ids, r.ids)
    return r


def same_propose(x, keys, **kw):
    kw.setdefault("check", False)
    ta, qa = dyadic.propose(x, keys, backend="cpu", **kw)
    tr, qr = dyadic.propose(x, keys, backend="reference", **kw)
    np.testing.assert_array_equal(ta, tr)
    np.testing.assert_array_equal(qa.counts, qr.counts)
    if qr.ids is not None:
        np.testing.assert_array_equal(qa.ids, qr.ids)
    return tr, qr


@pytest.mark.parametrize("v", [1, 5, 37, 300])
@pytest.mark.parametrize("top_k", [None, 1, 4, 1000])
@pytest.mark.parametrize("policy", ["standard", "floor-first"])
def test_cpu_equals_reference(v, top_k, policy):
    rng = np.random.default_rng(v + (top_k or 0))
    b = 8
    x = logits(rng, b, v)
    bias = (rng.standard_normal(v) * 0.5).astype(np.float32)
    bias[rng.integers(v)] = -np.inf
    top_p = rng.choice([1.0, 0.9, 0.5, 1e-3], size=b)
    min_p = rng.choice([0.0, 0.05, 0.5, 1.0], size=b)
    temp = rng.choice([0.5, 1.0, 2.0], size=b)
    if v == 1:
        bias[:] = 0.0
    same_alloc(x, top_k=top_k, top_p=top_p, min_p=min_p, temperature=temp, policy=policy)
    same_alloc(x, top_k=top_k, top_p=0.7, bias=bias, policy=policy)
    keys = dyadic.Keys(seed=rng.integers(0, 2**63, size=b), position=7)
    same_propose(x, keys, top_k=top_k, top_p=top_p, min_p=min_p,
                 temperature=np.where(rng.random(b) < 0.3, 0.0, temp), policy=policy)


def test_per_row_top_k():
    rng = np.random.default_rng(3)
    x = logits(rng, 6, 20)
    k = np.array([1, 2, 5, 6, 3, 7])
    q = same_alloc(x, top_k=k, min_p=0.0)
    assert q.counts.shape == (6, 7)
    for r in range(6):
        one = dyadic.allocate(x[r:r + 1], logits=True, top_k=int(k[r]))
        n = int(min(k[r], 7))
        np.testing.assert_array_equal(q.counts[r, :n], one.counts[0, :n])
        np.testing.assert_array_equal(q.ids[r, :n], one.ids[0, :n])
        assert (q.ids[r, n:] == -1).all()
    keys = dyadic.Keys(seed=np.arange(6, dtype=np.uint64))
    same_propose(x, keys, top_k=k, temperature=np.array([1.0, 0.0, 1.0, 0.5, 0.0, 2.0]))


@pytest.mark.parametrize("top_k", [None, 3, 50])
def test_filters_off_give_the_unfiltered_allocation(top_k):
    rng = np.random.default_rng(5)
    x = logits(rng, 6, 40)
    plain = dyadic.allocate(x, logits=True, top_k=top_k, temperature=0.8)
    for kw in (dict(top_p=1.0), dict(min_p=0.0), dict(top_p=1.0, min_p=0.0)):
        for backend in ("cpu", "reference"):
            q = dyadic.allocate(x, logits=True, top_k=top_k, temperature=0.8, backend=backend,
                                **kw)
            np.testing.assert_array_equal(q.counts, plain.counts)
            if top_k:
                np.testing.assert_array_equal(q.ids, plain.ids)


def test_support_is_the_kept_set():
    """q(v) > 0 only on the tokens verify(logits=True) keeps, and the counts are the
    allocation of their integer weights."""
    rng = np.random.default_rng(8)
    x = logits(rng, 5, 30)
    for kw in (dict(top_p=0.8), dict(min_p=0.2), dict(top_k=4, top_p=0.6, min_p=0.01)):
        q = dyadic.allocate(x, logits=True, temperature=1.3, **kw).to_dense()
        for r in range(5):
            row = x[r].tolist()
            pb = target_logits.param_bits(kw.get("top_p", 1.0))
            mb = target_logits.param_bits(kw.get("min_p", 0.0))
            st, p, total, arg = target_logits.weights_row(row, 1.3, kw.get("top_k", 0), pb, mb)
            assert st == 0
            kept = [v for v, w in enumerate(p) if w]
            _, want = allocation.allocate_weights(p, kept, _spec.POLICY_STANDARD, arg)
            got = np.asarray(q.counts[r])
            assert set(np.flatnonzero(got)) <= set(kept)
            assert [int(got[v]) for v in kept] == [want[v] for v in kept]


def test_errors_and_fail_closed():
    rng = np.random.default_rng(2)
    x = logits(rng, 4, 9)
    with pytest.raises(ValueError, match=r"top_p: row 2: value 1.5"):
        dyadic.allocate(x, logits=True, top_p=[1.0, 1.0, 1.5, 1.0])
    with pytest.raises(ValueError, match=r"min_p: row 0: value -0.5"):
        dyadic.propose(x, dyadic.Keys(seed=1), min_p=-0.5)
    with pytest.raises(ValueError, match=r"top_k: row 1: value 0 must be >= 1"):
        dyadic.allocate(x, logits=True, top_k=np.array([2, 0, 1, 1]))
    with pytest.raises(ValueError, match="apply only to logits"):
        dyadic.allocate(np.abs(x), top_p=0.5)
    bad = x.copy()
    bad[3, 1] = np.nan
    for backend in ("cpu", "reference"):
        q_st = {}
        out = {"status": np.zeros(4, np.int32)}
        dyadic.allocate(bad, logits=True, top_k=np.array([2, -1, 3, 3]),
                        top_p=np.array([1.0, 1.0, 2.0, 1.0]), backend=backend, check=False,
                        out=out)
        q_st[backend] = out["status"].tolist()
        assert q_st[backend] == [0, _status.TOP_K_INVALID, _status.TOP_P_INVALID,
                                 _status.X_NAN]
    tok_out = {"status": np.zeros(4, np.int32)}
    toks, q = dyadic.propose(bad, dyadic.Keys(seed=3), top_k=3, min_p=[0.0, 2.0, 0.0, 0.0],
                             temperature=[1.0, 0.0, 1.0, 1.0], check=False, out=tok_out)
    assert tok_out["status"].tolist() == [0, _status.MIN_P_INVALID, 0, _status.X_NAN]
    assert toks[1] == -1 and (q.ids[1] == -1).all() and (q.counts[1] == 0).all()


def test_kernel_guards_raw_top_k():
    """A sparse call's kernel keeps at most the width whatever top_k says (a larger top_k
    keeps width tokens; below 1 fails closed): no write past the row."""
    from dyadic import _backend
    rng = np.random.default_rng(4)
    x = np.ascontiguousarray(np.tile(logits(rng, 1, 12), (3, 1)))
    for name in ("cpu", "reference"):
        be = _backend.get(name)
        counts = np.full((3, 2), 7, np.uint32)
        ids = np.full((3, 2), 7, np.int32)
        status = np.zeros(3, np.int32)
        be.allocate_filtered(x, None, np.ones(3), np.array([50, 0, 2], np.int64),
                             np.ones(3, np.float32), np.zeros(3, np.float32), 0, 2, counts, ids,
                             status)
        assert status.tolist() == [0, _status.TOP_K_INVALID, 0]
        np.testing.assert_array_equal(counts[0], counts[2])
        assert counts[0].sum() == _spec.TOTAL and (counts[1] == 0).all()
