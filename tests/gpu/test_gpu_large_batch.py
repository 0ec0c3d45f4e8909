"""backend="cuda" at batch sizes above the grid's 65535 blocks in y and z, and the
kernels' own checks of hostile ids.

GPU tests (skip without CuPy + torch CUDA):

- every primitive at B = 100001 rows (verify: B = 100001 with k = 1, B = 20001 with
  k = 5 and k = 8, up to B x (k + 1) = 180009 rows) on every launch route these shapes
  take (backends/cuda/cupy/routes.py; tests/gpu/test_cuda_routes.py holds the table)
  equals the CPU backend bit for bit at small vocabularies; one row past 65535 breaks a
  rule and gets its status there, the other rows are unchanged;
- hostile draft ids and sparse q rows, given to the backend object directly (the public
  constructors refuse them): the documented statuses (DRAFT_OUT_OF_RANGE, then
  Q_INVALID, then Q_ZERO_AT_DRAFT, after the target rows; greedy requests do not
  consult q), tokens -1 and accepted 0 for the failed requests, the CPU backend's
  results for the others; a sparse draw row breaking a Dyadic rule gives -1; shapes the
  kernels would index beyond raise ValueError, and so do key arrays they cannot read
  (ValueError / TypeError naming the field).
"""

import numpy as np
import pytest

import dyadic
from dyadic import _status

from conftest import cuda_torch, softmax_rows

TOTAL = 1 << 24
BIG = 100001  # rows: more than the 65535 blocks a grid has in y (and in z)
BAD_ROW = 99998  # a row past 65535 that breaks a rule

pytestmark = pytest.mark.gpu


@pytest.fixture
def cb():
    cuda_torch()


def _np(t):
    return t.cpu().numpy() if hasattr(t, "cpu") else np.asarray(t)


def _keys(rng, b):
    return dyadic.Keys(seed=rng.integers(0, 2**63, size=b, dtype=np.uint64), generation=3,
                       round=rng.integers(0, 2**31, size=b),
                       position=rng.integers(0, 2**30, size=b))


_CACHE = {}


def _once(key, make):
    if key not in _CACHE:
        _CACHE[key] = make()
    return _CACHE[key]


# ------------------------------------------------------------ allocate / propose
ALLOC_ROUTES = {  # name: top_k (the kernels at this batch)
    "dense": None,                                           # dense_*
    "top32": 32,                                             # topk_onepass_wide
    "top64": 64,                                             # topk_select (radix select)
}


def _alloc_inputs(v):
    def make():
        rng = np.random.default_rng(v)
        w = rng.random((BIG, v), dtype=np.float32)
        w[rng.random((BIG, v)) < 0.2] = 0
        w[:, 0] += np.float32(1e-3)  # no all-zero row
        return w
    return _once(("alloc", v), make)


@pytest.mark.parametrize("route", list(ALLOC_ROUTES))
@pytest.mark.parametrize("v", [100, 97])
def test_allocate_large_batch(cb, route, v):
    import torch
    top_k = ALLOC_ROUTES[route]
    w = _alloc_inputs(v)
    want = _once(("alloc_cpu", v, top_k), lambda: dyadic.allocate(w, top_k=top_k,
                                                                   backend="cpu"))
    bad = w.copy()
    bad[BAD_ROW, 3] = np.nan
    st = torch.empty(BIG, dtype=torch.int32, device="cuda")
    got = dyadic.allocate(torch.from_numpy(bad).cuda(), top_k=top_k, backend="cuda",
                          check=False, out={"status": st})
    status = _np(st)
    assert status[BAD_ROW] == _status.X_NAN
    assert not np.delete(status, BAD_ROW).any()
    counts = _np(got.counts)
    assert not counts[BAD_ROW].any()
    keep = np.arange(BIG) != BAD_ROW
    np.testing.assert_array_equal(counts[keep], np.asarray(want.counts)[keep])
    if top_k:
        ids = _np(got.ids)
        assert (ids[BAD_ROW] == -1).all()
        np.testing.assert_array_equal(ids[keep], np.asarray(want.ids)[keep])


PROPOSE_ROUTES = {  # name: (top_k, logits dtype, with bias, V) (the kernels at this batch)
    "top32-bf16": (32, "bfloat16", False, 128),   # topk_onepass_packed32k
    "top32-bf16-v100": (32, "bfloat16", False, 100),  # topk_onepass_wide (V % 8 != 0)
    "top32-f32": (32, "float32", False, 128),     # topk_onepass_wide, 16-byte loads
    "top32-f32-bias": (32, "float32", True, 128),  # topk_onepass (a bias on logits)
    "top64": (64, "float32", False, 128),         # topk_select
    "dense": (None, "float32", False, 128),       # dense_* + draw_rows
    "dense-bf16": (None, "bfloat16", False, 128),
}


def _propose_inputs(v):
    def make():
        rng = np.random.default_rng(100 + v)
        x = (rng.standard_normal((BIG, v)) * 3).astype(np.float32)
        temp = np.full(BIG, 0.7)
        temp[rng.random(BIG) < 0.1] = 0.0  # greedy rows: the argmax, no draw
        bias = (rng.standard_normal(v) * 0.5).astype(np.float32)
        return x, temp, bias, _keys(rng, BIG)
    return _once(("propose", v), make)


@pytest.mark.parametrize("route", list(PROPOSE_ROUTES))
def test_propose_large_batch(cb, route):
    import torch
    top_k, dtype, with_bias, v = PROPOSE_ROUTES[route]
    x, temp, bias, keys = _propose_inputs(v)
    xt = torch.from_numpy(x).to(getattr(torch, dtype))
    xc = xt.float().numpy()  # the values the GPU reads (16-bit logits widen exactly)
    b = bias if with_bias else None
    tok_c, q_c = dyadic.propose(xc, keys, temperature=temp, bias=b, top_k=top_k,
                                backend="cpu")
    xd = xt.cuda()
    xd[BAD_ROW, 5] = float("nan")
    st = torch.empty(BIG, dtype=torch.int32, device="cuda")
    tok, q = dyadic.propose(xd, keys, temperature=temp, bias=b, top_k=top_k, backend="cuda",
                            check=False, out={"status": st})
    status, tok = _np(st), _np(tok)
    assert status[BAD_ROW] == _status.X_NAN and tok[BAD_ROW] == -1
    assert not np.delete(status, BAD_ROW).any()
    keep = np.arange(BIG) != BAD_ROW
    np.testing.assert_array_equal(tok[keep], np.asarray(tok_c)[keep])
    np.testing.assert_array_equal(_np(q.counts)[keep], np.asarray(q_c.counts)[keep])
    if top_k:
        np.testing.assert_array_equal(_np(q.ids)[keep], np.asarray(q_c.ids)[keep])


# --------------------------------------------------------------------------- draw
@pytest.mark.parametrize("top_k", [None, 32])
def test_draw_large_batch(cb, top_k):
    import torch
    w = _alloc_inputs(100)
    q_c = _once(("alloc_cpu", 100, top_k), lambda: dyadic.allocate(w, top_k=top_k,
                                                                    backend="cpu"))
    keys = _keys(np.random.default_rng(5), BIG)
    want = np.asarray(dyadic.draw(q_c, keys, backend="cpu"))
    q = dyadic.Dyadic(torch.from_numpy(np.array(q_c.counts)).cuda(),
                      None if q_c.ids is None else torch.from_numpy(np.array(q_c.ids)).cuda(),
                      vocab_size=100)
    got = _np(dyadic.draw(q, keys, backend="cuda", check=False))
    np.testing.assert_array_equal(got, want)


# ------------------------------------------------------------------------- verify
VERIFY_ROUTES = {  # name: (check, greedy flags)
    "false": (False, False),     # verify_one_launch (k + 1 <= 8), else the two launches
    "checked": (True, False),
    "greedy": (False, True),     # verify_chain + verify_residual
    "lazy": ("lazy", False),     # verify_lazy_r64 (its grid exceeds one wave)
}


def _verify_inputs(b, k, qkind, v=64):
    def make():
        rng = np.random.default_rng(b + 10 * k + len(qkind))
        p = softmax_rows(rng.standard_normal((b, k + 1, v)) * 2)
        if qkind == "point":
            draft, q = rng.integers(0, v, size=(b, k)).astype(np.int32), None
        else:
            noisy = np.maximum(p[:, :k].reshape(b * k, v), 1e-30) * np.exp(
                rng.standard_normal((b * k, v)) * 0.5)
            qa = dyadic.allocate(noisy.astype(np.float32),
                                 top_k=None if qkind == "dense" else 32, backend="cpu")
            draft = np.asarray(dyadic.draw(qa, dyadic.Keys(seed=11, position=np.arange(b * k)),
                                           backend="cpu")).reshape(b, k).astype(np.int32)
            q = dyadic.Dyadic(np.asarray(qa.counts).reshape(b, k, -1),
                              None if qa.ids is None else np.asarray(qa.ids).reshape(b, k, -1),
                              vocab_size=v)
        greedy = rng.random(b) < 0.25
        keys = _keys(rng, b)
        return p, draft, q, greedy, keys
    return _once(("verify", b, k, qkind), make)


def _verify_cpu(b, k, qkind, greedy):
    def make():
        p, draft, q, g, keys = _verify_inputs(b, k, qkind)
        r = dyadic.verify(p, draft, q, keys, greedy=g if greedy else None, backend="cpu")
        return np.asarray(r.accepted), np.asarray(r.tokens)
    return _once(("verify_cpu", b, k, qkind, greedy), make)


def _device_q(q):
    import torch
    if q is None:
        return None
    return dyadic.Dyadic(torch.from_numpy(np.array(q.counts)).cuda(),
                         None if q.ids is None else torch.from_numpy(np.array(q.ids)).cuda(),
                         vocab_size=q.vocab_size)


@pytest.mark.parametrize("route", list(VERIFY_ROUTES))
@pytest.mark.parametrize("qkind", ["dense", "sparse", "point"])
@pytest.mark.parametrize("b, k", [(BIG, 1), (20001, 5), (20001, 8)])
def test_verify_large_batch(cb, route, qkind, b, k):
    import torch
    check, greedy = VERIFY_ROUTES[route]
    p, draft, q, g, keys = _verify_inputs(b, k, qkind)
    acc_c, tok_c = _verify_cpu(b, k, qkind, greedy)
    pt, qd = torch.from_numpy(p).cuda(), _device_q(q)
    gd = torch.from_numpy(g).cuda() if greedy else None
    dt = torch.from_numpy(draft).cuda()
    if check is True:
        r = dyadic.verify(pt, dt, qd, keys, greedy=gd, backend="cuda")
        np.testing.assert_array_equal(_np(r.accepted), acc_c)
        np.testing.assert_array_equal(_np(r.tokens), tok_c)
        return
    bad = BAD_ROW % b if b > 65535 else b - 2  # a row past 65535 (rows b x (k + 1))
    dt[bad, k - 1] = p.shape[-1]  # a draft id at V
    r = dyadic.verify(pt, dt, qd, keys, greedy=gd, backend="cuda", check=check)
    status, acc, tok = _np(r.status), _np(r.accepted), _np(r.tokens)
    assert status[bad] == _status.DRAFT_OUT_OF_RANGE
    assert acc[bad] == 0 and (tok[bad] == -1).all()
    keep = np.arange(b) != bad
    assert not status[keep].any()
    np.testing.assert_array_equal(acc[keep], acc_c[keep])
    np.testing.assert_array_equal(tok[keep], tok_c[keep])


# ------------------------------------------------------------------ hostile ids
V, K, W = 64, 3, 8


def _hostile_base(b=24, seed=3, k=K):
    """b valid requests: target [b, k+1, V], drafts, a sparse q of width W (ids, counts)."""
    rng = np.random.default_rng(seed)
    p = softmax_rows(rng.standard_normal((b, k + 1, V)) * 2)
    noisy = np.maximum(p[:, :k].reshape(b * k, V), 1e-30) * np.exp(
        rng.standard_normal((b * k, V)) * 0.5)
    qa = dyadic.allocate(noisy.astype(np.float32), top_k=W, backend="cpu")
    draft = np.asarray(dyadic.draw(qa, dyadic.Keys(seed=7, position=np.arange(b * k)),
                                   backend="cpu")).reshape(b, k).astype(np.int32)
    counts = np.asarray(qa.counts).reshape(b, k, W).copy()
    ids = np.asarray(qa.ids).reshape(b, k, W).copy()
    seed_ = rng.integers(0, 2**63, size=b, dtype=np.uint64)
    pos = rng.integers(0, 2**30, size=b).astype(np.int32)
    return p, draft, counts, ids, seed_, pos


def _hostile_sparse(greedy_rows, b=24, k=K):
    """Requests with hostile drafts / sparse q rows and the status each must get.  With
    ``greedy_rows``, requests 20-21 are greedy (q not consulted)."""
    p, draft, counts, ids, seed, pos = _hostile_base(b, k=k)
    b = p.shape[0]
    want = [_status.OK] * b
    greedy = np.zeros(b, bool)

    def support_miss(r, i):  # an id of [0, V) outside row (r, i)'s support
        return next(t for t in range(V) if t not in set(ids[r, i].tolist()))

    draft[1, 2] = V; want[1] = _status.DRAFT_OUT_OF_RANGE
    draft[2, 0] = -5; want[2] = _status.DRAFT_OUT_OF_RANGE
    draft[3, 1] = (1 << 31) - 1; want[3] = _status.DRAFT_OUT_OF_RANGE
    draft[4, 2] = -(1 << 31); want[4] = _status.DRAFT_OUT_OF_RANGE
    # q rows breaking a rule (request 5..12), at a draft other than the one tested first
    n5 = int((ids[5, 1] >= 0).sum())
    ids[5, 1, n5 - 1] = V; want[5] = _status.Q_INVALID            # an id at V
    ids[6, 2, 0], ids[6, 2, 1] = ids[6, 2, 1], ids[6, 2, 0]       # not ascending
    want[6] = _status.Q_INVALID
    ids[7, 1, 0] = -1; want[7] = _status.Q_INVALID                # padding, then valid ids
    counts[8, 2, 0] -= 1; want[8] = _status.Q_INVALID             # the sum 2**24 - 1
    ids[9, 1, 0] = -2; want[9] = _status.Q_INVALID                # an id below the padding
    ids[10, 2, 0] = (1 << 31) - 1; want[10] = _status.Q_INVALID   # a huge id
    # a count above 2**24 with the row's u32 sum wrapping to 2**24
    counts[11, 1, 0] = (int(counts[11, 1, 0]) + (1 << 32) - TOTAL) & 0xFFFFFFFF
    counts[11, 1, 1] = (int(counts[11, 1, 1]) + TOTAL) & 0xFFFFFFFF
    want[11] = _status.Q_INVALID
    # padding with a count (request 12, row 1: its last entry made padding of count 1,
    # the rest of its count moved to entry 0, so that the row still sums to 2**24)
    n12 = int((ids[12, 1] >= 0).sum())
    counts[12, 1, 0] += counts[12, 1, n12 - 1] - 1
    ids[12, 1, n12 - 1], counts[12, 1, n12 - 1] = -1, 1
    want[12] = _status.Q_INVALID
    # precedence: draft out of range before a bad q row; target rows before both; a bad q
    # row before q(d) = 0
    draft[13, 2] = V; ids[13, 1, 0] = V; want[13] = _status.DRAFT_OUT_OF_RANGE
    p[14, 0, draft[14, 0]] = np.nan; draft[14, 2] = V; want[14] = _status.TARGET_INVALID_VALUE
    draft[15, 0] = support_miss(15, 0); ids[15, 2, 0] = -2; want[15] = _status.Q_INVALID
    draft[16, 0] = support_miss(16, 0); want[16] = _status.Q_ZERO_AT_DRAFT
    # a duplicated id (request 17)
    if ids[17, 0, 1] >= 0:
        ids[17, 0, 1] = ids[17, 0, 0]
        want[17] = _status.Q_INVALID
    if greedy_rows:
        greedy[20] = greedy[21] = True
        ids[20, 1, 0] = V  # q is not consulted: OK
        draft[21, 1] = V; want[21] = _status.DRAFT_OUT_OF_RANGE
    return p, draft, counts, ids, seed, pos, greedy, want


def _cpu_good(p, draft, counts, ids, seed, pos, greedy, good, clean_ids=None,
              clean_counts=None):
    """The CPU backend on the requests ``good`` (valid inputs: ``clean_*`` where a greedy
    request's q was broken)."""
    ids = ids if clean_ids is None else clean_ids
    counts = counts if clean_counts is None else clean_counts
    q = dyadic.Dyadic(counts[good], ids[good], vocab_size=V)
    r = dyadic.verify(p[good], draft[good], q, dyadic.Keys(seed=seed[good], generation=2,
                                                            round=1, position=pos[good]),
                      greedy=greedy[good], backend="cpu")
    return np.asarray(r.accepted), np.asarray(r.tokens)


def _dev_keys(torch, seed, pos):
    b = len(seed)
    return (torch.from_numpy(seed.view(np.int64)).cuda(),
            torch.full((b,), 2, dtype=torch.int32, device="cuda"),
            torch.full((b,), 1, dtype=torch.int32, device="cuda"),
            torch.from_numpy(pos).cuda())


def _outs(torch, b, k):
    return (torch.full((b,), 7, dtype=torch.int32, device="cuda"),
            torch.full((b, k + 1), 7, dtype=torch.int32, device="cuda"),
            torch.full((b,), 7, dtype=torch.int32, device="cuda"))


HOSTILE_ROUTES = {  # name: (backend method, draft depth k, batch)
    "plain": ("verify_plain", K, 24),        # verify_one_launch
    "plain-two": ("verify_plain", 8, 24),    # verify_chain + verify_residual (k + 1 > 8)
    "full": ("verify", K, 24),               # verify_chain + verify_residual (greedy flags)
    "lazy": ("verify_lazy", K, 24),          # verify_lazy
    "lazy-r64": ("verify_lazy", K, 400),     # verify_lazy_r64 (400 blocks > 3 per SM)
}


def _run_backend(cb, method, p, draft, qc, qi, greedy, seed, pos):
    import torch
    from dyadic import _backend
    be = _backend.get("cuda")
    b, k = draft.shape
    dev = lambda a: None if a is None else torch.from_numpy(np.ascontiguousarray(a)).cuda()  # noqa: E731
    a, tk, st = _outs(torch, b, k)
    keys = _dev_keys(torch, seed, pos)
    ins = (dev(p), dev(draft), dev(qc), dev(qi))
    if method == "verify_lazy":
        be.verify_lazy(*ins, *keys, a, tk, st)
    else:
        getattr(be, method)(*ins, dev(greedy.astype(np.uint8)), *keys, a, tk, st)
    return _np(a), _np(tk), _np(st)


@pytest.mark.parametrize("route", list(HOSTILE_ROUTES))
def test_hostile_sparse_q_and_drafts(cb, route):
    method, k, b = HOSTILE_ROUTES[route]
    greedy_rows = method == "verify"
    _, _, clean_counts, clean_ids, _, _ = _hostile_base(b, k=k)
    p, draft, counts, ids, seed, pos, greedy, want = _hostile_sparse(greedy_rows, b, k)
    acc, tok, st = _run_backend(cb, method, p, draft, counts, ids, greedy, seed, pos)
    assert st.tolist() == want
    bad = np.array(want) != 0
    assert (acc[bad] == 0).all() and (tok[bad] == -1).all()
    good = ~bad
    acc_c, tok_c = _cpu_good(p, draft, counts, ids, seed, pos, greedy, good,
                             clean_ids=np.where(greedy[:, None, None], clean_ids, ids),
                             clean_counts=np.where(greedy[:, None, None], clean_counts, counts))
    np.testing.assert_array_equal(acc[good], acc_c)
    np.testing.assert_array_equal(tok[good], tok_c)


@pytest.mark.parametrize("route", list(HOSTILE_ROUTES))
@pytest.mark.parametrize("qkind", ["dense", "point"])
def test_hostile_drafts_dense_and_point_q(cb, route, qkind):
    """Draft ids outside [0, V) with a dense or point-mass q: DRAFT_OUT_OF_RANGE before any
    read at the id; a dense count above 2**24 at a draft: Q_INVALID; q(d) = 0: Q_ZERO_AT_DRAFT."""
    method, k, b = HOSTILE_ROUTES[route]
    p, draft, counts, ids, seed, pos = _hostile_base(b=8 if b == 24 else b, seed=9, k=k)
    b = p.shape[0]
    dense = np.zeros((b, k, V), np.uint32)
    for r in range(b):
        for i in range(k):
            valid = ids[r, i] >= 0
            dense[r, i, ids[r, i][valid]] = counts[r, i][valid]
    want = [_status.OK] * b
    draft[1, 1] = V; want[1] = _status.DRAFT_OUT_OF_RANGE
    draft[2, 0] = -1; want[2] = _status.DRAFT_OUT_OF_RANGE
    draft[3, 2] = (1 << 31) - 1; want[3] = _status.DRAFT_OUT_OF_RANGE
    clean = dense.copy()
    if qkind == "dense":
        dense[4, 0, draft[4, 0]] = TOTAL + 1; want[4] = _status.Q_INVALID
        draft[5, 0] = int(np.flatnonzero(dense[5, 0] == 0)[0]); want[5] = _status.Q_ZERO_AT_DRAFT
    qc = dense if qkind == "dense" else None
    greedy = np.zeros(b, bool)
    if method == "verify":
        greedy[6] = True
        draft[6, 0] = V; want[6] = _status.DRAFT_OUT_OF_RANGE
    acc, tok, st = _run_backend(cb, method, p, draft, qc, None, greedy, seed, pos)
    assert st.tolist() == want
    bad = np.array(want) != 0
    assert (acc[bad] == 0).all() and (tok[bad] == -1).all()
    good = ~bad
    q = None if qkind == "point" else dyadic.Dyadic(clean[good], None, vocab_size=V)
    r = dyadic.verify(p[good], draft[good], q, dyadic.Keys(seed=seed[good], generation=2,
                                                            round=1, position=pos[good]),
                      greedy=greedy[good], backend="cpu")
    np.testing.assert_array_equal(acc[good], np.asarray(r.accepted))
    np.testing.assert_array_equal(tok[good], np.asarray(r.tokens))


def test_hostile_sparse_draw_rows(cb):
    """A sparse draw row breaking a Dyadic rule over [0, 2**24) gives -1; a dense row whose
    counts sum below the ticket gives -1; valid rows equal the CPU backend."""
    import torch
    from dyadic import _backend
    rng = np.random.default_rng(4)
    b, w = 16, 40  # more than 32 entries: the multi-level search
    x = rng.random((b, 200), dtype=np.float32)
    qa = dyadic.allocate(x, top_k=w, backend="cpu")
    counts, ids = np.asarray(qa.counts).copy(), np.asarray(qa.ids).copy()
    seed = rng.integers(0, 2**63, size=b, dtype=np.uint64)
    pos = rng.integers(0, 2**30, size=b).astype(np.int32)
    keys = dyadic.Keys(seed=seed, generation=2, round=1, position=pos)
    want = np.asarray(dyadic.draw(dyadic.Dyadic(counts, ids, vocab_size=200), keys,
                                  backend="cpu")).copy()
    ids[1, 3] = 1 << 24                                  # an id outside [0, 2**24)
    ids[2, 4], ids[2, 5] = ids[2, 5], ids[2, 4]          # not ascending
    ids[3, 0] = -1                                       # padding before valid ids
    counts[4, 0] -= 1                                    # the sum 2**24 - 1
    ids[5, 7] = -3                                       # an id below the padding
    counts[6, 0] = (int(counts[6, 0]) + (1 << 32) - TOTAL) & 0xFFFFFFFF  # u32 sum wraps
    counts[6, 1] = (int(counts[6, 1]) + TOTAL) & 0xFFFFFFFF
    ids[7, 2] = ids[7, 1]                                # a duplicate
    ids[8, :] = -1                                       # all padding (counts kept)
    for r in range(1, 9):
        want[r] = -1
    be = _backend.get("cuda")
    tokens = torch.full((b,), 7, dtype=torch.int32, device="cuda")
    be.draw(torch.from_numpy(counts).cuda(), torch.from_numpy(ids).cuda(),
            *_dev_keys(torch, seed, pos), tokens)
    np.testing.assert_array_equal(_np(tokens), want)
    # dense rows: a row of zero counts, a row summing to 1 (below almost every ticket)
    dq = dyadic.allocate(x, backend="cpu")
    dc = np.asarray(dq.counts).copy()
    want = np.asarray(dyadic.draw(dq, keys, backend="cpu")).copy()
    dc[0] = 0
    dc[1] = 0
    dc[1, 0] = 1
    want[0] = -1
    tok = torch.full((b,), 7, dtype=torch.int32, device="cuda")
    be.draw(torch.from_numpy(dc).cuda(), None, *_dev_keys(torch, seed, pos), tok)
    got = _np(tok)
    assert got[0] == -1 and got[1] in (-1, 0)
    np.testing.assert_array_equal(got[2:], want[2:])


def test_shapes_the_kernels_would_index_beyond_raise(cb):
    import torch
    from dyadic import _backend
    be = _backend.get("cuda")
    p, draft, counts, ids, seed, pos = _hostile_base(b=4)
    dev = lambda a: torch.from_numpy(np.ascontiguousarray(a)).cuda()  # noqa: E731
    keys = _dev_keys(torch, seed, pos)
    g = dev(np.zeros(4, np.uint8))

    def run(t=p, d=draft, qc=counts, qi=ids, keys=keys):
        a, tk, st = _outs(torch, 4, K)
        be.verify(dev(t), dev(d), None if qc is None else dev(qc),
                  None if qi is None else dev(qi), g, *keys, a, tk, st)

    run()  # valid
    dense = np.zeros((4, K, V - 1), np.uint32)
    with pytest.raises(ValueError, match="dense"):
        run(qc=dense, qi=None)
    with pytest.raises(ValueError, match="q_ids"):
        run(qi=ids[:, :, :4])
    with pytest.raises(ValueError, match="draft"):
        run(d=draft[:, :2])
    with pytest.raises(ValueError, match="keys.seed: length 2 does not match the batch 4"):
        run(keys=(keys[0][:2],) + keys[1:])


def test_key_arrays_the_kernels_cannot_read_raise(cb):
    """The backend called directly refuses key tensors that are not 1 or B integers of 4
    or 8 bytes on the GPU, naming the field; a strided one is read as its values."""
    import torch
    from dyadic import _backend
    be = _backend.get("cuda")
    b = 4
    q = dyadic.allocate(np.random.default_rng(3).random((b, 50), dtype=np.float32),
                        backend="cpu")
    counts = torch.from_numpy(np.asarray(q.counts).copy()).cuda()
    seed, pos = np.arange(b, dtype=np.uint64) + 9, np.arange(b, dtype=np.int32) + 2
    good = _dev_keys(torch, seed, pos)

    def draw(j, field):
        keys = list(good)
        keys[j] = field
        tokens = torch.full((b,), 7, dtype=torch.int32, device="cuda")
        be.draw(counts, None, *keys, tokens)
        return _np(tokens)

    want = draw(0, good[0])
    np.testing.assert_array_equal(want, np.asarray(dyadic.draw(q, dyadic.Keys(
        seed=seed, generation=2, round=1, position=pos), backend="cpu")))
    dev = {"device": "cuda"}
    with pytest.raises(TypeError, match="keys.seed: dtype float32 is not supported"):
        draw(0, torch.zeros(b, dtype=torch.float32, **dev))
    with pytest.raises(TypeError, match="keys.generation: dtype int16 is not supported"):
        draw(1, torch.zeros(b, dtype=torch.int16, **dev))
    with pytest.raises(ValueError, match="keys.round: length 3 does not match the batch 4"):
        draw(2, torch.ones(3, dtype=torch.int32, **dev))
    with pytest.raises(TypeError, match="keys.position: a cpu tensor"):
        draw(3, torch.from_numpy(pos))
    strided = torch.from_numpy(np.repeat(pos, 2)).cuda()[::2]
    assert not strided.is_contiguous()
    np.testing.assert_array_equal(draw(3, strided), want)
