"""Kernels bounds-check every id they address memory with (no Python-side validation).

The backend objects are called directly with hostile arrays, as a caller
that skips validation would: draft ids and sparse q ids out of range,
broken sparse rows, counts that overflow a 32-bit sum, arrays of the wrong
shape.  A bad request fails closed (status code, outputs -1) and the other
rows are bit-identical to a batch without it; the CPU backend equals the
reference; a shape mismatch raises ValueError naming the array.  Each case
runs in a subprocess, so that an out-of-bounds access fails its test
instead of killing pytest.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

import dyadic
from dyadic import _backend, _spec, _status

TOTAL = _spec.TOTAL
BACKENDS = ("cpu", "reference")
V, K, B, W = 40, 3, 3, 8
BAD = 1  # the hostile request's row in the batch


def _be(name):
    return _backend.get(name)


def _keys(b, seed=5):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 2**64, size=b, dtype=np.uint64),
            np.full(b, 3, np.uint32), np.full(b, 4, np.uint32),
            rng.integers(0, 2**20, size=b, dtype=np.uint64).astype(np.uint32))


def _sub(a, rows):
    return None if a is None else np.ascontiguousarray(a[rows])


# ------------------------------------------------------------------ verify

def _verify_inputs(sparse, seed=0):
    """A valid batch: target [B, K+1, V], q (sparse width W, or dense), drafts with q(d) > 0."""
    rng = np.random.default_rng(seed)
    p = rng.random((B, K + 1, V)) + 0.05
    target = (p / p.sum(-1, keepdims=True)).astype(np.float32)
    qw = rng.random((B, K, V)).astype(np.float32) + np.float32(0.01)
    q = dyadic.allocate(qw, top_k=W) if sparse else dyadic.allocate(qw)
    qc = np.array(q.counts)
    qi = np.array(q.ids) if sparse else None
    if sparse:
        assert (qi >= 0).all()  # every entry valid: room for each mutation below
        draft = qi[:, :, 0].copy()
    else:
        draft = qc.argmax(-1).astype(np.int32)
    return target, np.ascontiguousarray(draft, np.int32), qc, qi


def _run_verify(name, target, draft, qc, qi, greedy, keys):
    b, k1, _ = target.shape
    acc = np.full(b, 77, np.int32)
    tok = np.full((b, k1), 77, np.int32)
    st = np.full(b, 77, np.int32)
    _be(name).verify(target, draft, qc, qi, greedy, *keys, acc, tok, st)
    return st, acc, tok


def _check_verify(target, draft, qc, qi, greedy, code, bad=BAD, backends=BACKENDS):
    """Request ``bad`` fails with ``code`` (outputs -1), the others equal the batch
    without it, and every backend gives the same arrays."""
    b = target.shape[0]
    keys = _keys(b)
    keep = [r for r in range(b) if r != bad]
    outs = []
    for name in backends:
        st, acc, tok = _run_verify(name, target, draft, qc, qi, greedy, keys)
        assert st[bad] == code, (name, int(st[bad]), code)
        assert acc[bad] == 0 and (tok[bad] == -1).all(), (name, acc[bad], tok[bad])
        base = _run_verify(name, _sub(target, keep), _sub(draft, keep), _sub(qc, keep),
                           _sub(qi, keep), _sub(greedy, keep), tuple(_sub(a, keep) for a in keys))
        for got, want in zip((st, acc, tok), base):
            np.testing.assert_array_equal(got[keep], want)
        assert (base[0] == 0).all()
        outs.append((st, acc, tok))
    for other in outs[1:]:
        for a, r in zip(outs[0], other):
            np.testing.assert_array_equal(a, r)
    return outs[0]


def _draft_case(value):
    for q_kind in ("sparse", "dense", "none"):
        target, draft, qc, qi = _verify_inputs(q_kind == "sparse")
        if q_kind == "none":
            qc = qi = None
        draft[BAD, 1] = value
        for greedy in (np.zeros(B, np.uint8), np.array([0, 1, 1], np.uint8)):
            _check_verify(target, draft, qc, qi, greedy, _status.DRAFT_OUT_OF_RANGE)
    # checked before the q rules: a broken q row too gives DRAFT_OUT_OF_RANGE
    target, draft, qc, qi = _verify_inputs(True)
    draft[BAD, 1] = value
    qi[BAD, 0, 0] = 10**6
    _check_verify(target, draft, qc, qi, np.zeros(B, np.uint8), _status.DRAFT_OUT_OF_RANGE)


def _sparse_mutation(qc, qi, name):
    """Break one rule of a sparse row in place (entry 0, the draft's, keeps its count)."""
    if name == "id_V":
        qi[-1] = V
    elif name == "id_2**24":
        qi[-1] = TOTAL
    elif name == "id_-2":
        qi[-1] = -2
    elif name == "duplicated":
        qi[2] = qi[1]
    elif name == "descending":
        qi[1], qi[2] = qi[2], qi[1]
    elif name == "padding_in_middle":
        qc[0] += qc[1]
        qi[1], qc[1] = -1, 0
    elif name == "padding_with_count":
        qi[-1] = -1
    elif name == "sum_0":
        qc[:] = 0
    elif name == "sum_2**24+1":
        qc[0] += 1
    elif name == "count_2**32-1":  # the row's sum wraps to 2**24 in 32 bits
        qc[2] = qc[2] + qc[1] + 1
        qc[1] = 2**32 - 1
        assert int(qc.sum(dtype=np.uint32)) == TOTAL
    else:
        raise AssertionError(name)


SPARSE_MUTATIONS = ("id_V", "id_2**24", "id_-2", "duplicated", "descending",
                    "padding_in_middle", "padding_with_count", "sum_0", "sum_2**24+1",
                    "count_2**32-1")


def _sparse_q_case(mutation):
    target, draft, qc, qi = _verify_inputs(True)
    for i in (0, K - 1):
        c, q = qc.copy(), qi.copy()
        _sparse_mutation(c[BAD, i], q[BAD, i], mutation)
        _check_verify(target, draft, c, q, np.zeros(B, np.uint8), _status.Q_INVALID)
    # every q row is checked before any decision: a rejection at step 0 (P(d_0) = 0)
    # does not hide a broken row at step K - 1
    t = target.copy()
    t[BAD, 0, draft[BAD, 0]] = 0
    t[BAD, 0] /= t[BAD, 0].sum()
    c, q = qc.copy(), qi.copy()
    _sparse_mutation(c[BAD, K - 1], q[BAD, K - 1], mutation)
    _check_verify(t, draft, c, q, np.zeros(B, np.uint8), _status.Q_INVALID)
    # a greedy request does not consult q: the same result as with the valid q
    g = np.array([0, 1, 0], np.uint8)
    keys = _keys(B)
    for name in BACKENDS:
        got = _run_verify(name, target, draft, c, q, g, keys)
        want = _run_verify(name, target, draft, qc, qi, g, keys)
        for a, r in zip(got, want):
            np.testing.assert_array_equal(a, r)


def _rejecting_dense():
    """Dense inputs where request BAD rejects its draft at step 0 (P(d_0) = 0)."""
    target, draft, qc, qi = _verify_inputs(False)
    target[BAD, 0, draft[BAD, 0]] = 0
    target[BAD, 0] /= target[BAD, 0].sum()
    other = (int(draft[BAD, 0]) + 1) % V
    return target, draft, qc, other


def case_dense_count_at_draft():
    target, draft, qc, _ = _verify_inputs(False)
    qc[BAD, 1, draft[BAD, 1]] = 2**32 - 1
    _check_verify(target, draft, qc, None, np.zeros(B, np.uint8), _status.Q_INVALID)
    qc[BAD, 1, draft[BAD, 1]] = TOTAL + 1
    _check_verify(target, draft, qc, None, np.zeros(B, np.uint8), _status.Q_INVALID)


def case_dense_residual_row():
    """The residual reads its dense q row in full: a count that overflows the
    threshold arithmetic (2**32 - 1), or a sum of 2**24 + 1, fails the request."""
    target, draft, qc, other = _rejecting_dense()
    c = qc.copy()
    c[BAD, 0, other] = 2**32 - 1
    _check_verify(target, draft, c, None, np.zeros(B, np.uint8), _status.Q_INVALID)
    c = qc.copy()
    c[BAD, 0, other] += 1
    _check_verify(target, draft, c, None, np.zeros(B, np.uint8), _status.Q_INVALID)
    # a dense row that no decision reads in full is checked only at its draft
    # (docs/semantics.md): the same result on every backend
    c = qc.copy()
    c[BAD, 2, (int(draft[BAD, 2]) + 1) % V] += 1
    keys = _keys(B)
    outs = [_run_verify(n, target, draft, c, None, np.zeros(B, np.uint8), keys) for n in BACKENDS]
    assert (outs[0][0] == 0).all() and outs[0][1][BAD] == 0
    for a, r in zip(*outs):
        np.testing.assert_array_equal(a, r)


def case_verify_shapes():
    """A shape the loops would index with is checked: ValueError naming the array."""
    target, draft, qc, qi = _verify_inputs(True)
    _, _, dense, _ = _verify_inputs(False)
    g = np.zeros(B, np.uint8)
    keys = _keys(B)

    def call(name, t=target, d=draft, c=qc, i=qi, gr=g, ks=keys, acc=None, tok=None, st=None):
        acc = np.zeros(B, np.int32) if acc is None else acc
        tok = np.zeros((B, K + 1), np.int32) if tok is None else tok
        st = np.zeros(B, np.int32) if st is None else st
        _be(name).verify(t, d, c, i, gr, *ks, acc, tok, st)

    bad_calls = {
        "q_counts: dense width": dict(c=np.ascontiguousarray(dense[:, :, :V - 1]), i=None),
        "q_counts: dense width ": dict(c=np.ascontiguousarray(
            np.concatenate([dense, np.zeros((B, K, 5), np.uint32)], -1)), i=None),
        "q_ids": dict(i=np.ascontiguousarray(qi[:, :, :W - 1])),
        "q_ids: given without": dict(c=None),
        "q_counts: shape": dict(c=np.ascontiguousarray(qc[:, :K - 1]),
                                i=np.ascontiguousarray(qi[:, :K - 1])),
        "draft": dict(d=np.ascontiguousarray(draft[:, :K - 1])),
        "greedy": dict(gr=g[:B - 1]),
        "seed": dict(ks=(keys[0][:B - 1],) + keys[1:]),
        "position": dict(ks=keys[:3] + (keys[3][:B - 1],)),
        "accepted": dict(acc=np.zeros(B - 1, np.int32)),
        "tokens": dict(tok=np.zeros((B, K), np.int32)),
        "status": dict(st=np.zeros(B - 1, np.int32)),
        "target": dict(t=np.zeros((B, 0, V), np.float32), d=np.zeros((B, 0), np.int32)),
    }
    for name in BACKENDS:
        call(name)  # the valid call runs
        for what, kw in bad_calls.items():
            with pytest.raises(ValueError, match=what.strip()):
                call(name, **kw)


def case_verify_vocab_2_24():
    """At V = 2**24 (CPU): draft id 2**24 and sparse id 2**24 are refused, 2**24 - 1 is fine."""
    v = TOTAL
    target = np.zeros((1, 2, v), np.float32)
    target[0, :, v - 1] = 1.0
    qc = np.zeros((1, 1, 4), np.uint32)
    qi = np.full((1, 1, 4), -1, np.int32)
    qc[0, 0, 0], qi[0, 0, 0] = TOTAL, v - 1
    keys = _keys(1)
    g = np.zeros(1, np.uint8)
    st, acc, tok = _run_verify("cpu", target, np.array([[v - 1]], np.int32), qc, qi, g, keys)
    assert st[0] == 0 and acc[0] == 1 and tok.tolist() == [[v - 1, v - 1]]
    st, acc, tok = _run_verify("cpu", target, np.array([[v]], np.int32), qc, qi, g, keys)
    assert st[0] == _status.DRAFT_OUT_OF_RANGE and acc[0] == 0 and (tok == -1).all()
    bad = qi.copy()
    bad[0, 0, 1], qc2 = v, qc.copy()
    qc2[0, 0, 0], qc2[0, 0, 1] = TOTAL - 1, 1
    st, acc, tok = _run_verify("cpu", target, np.array([[v - 1]], np.int32), qc2, bad, g, keys)
    assert st[0] == _status.Q_INVALID and acc[0] == 0 and (tok == -1).all()


# ------------------------------------------------------------------ draw

def _run_draw(name, counts, ids, keys):
    tok = np.full(counts.shape[0], 77, np.int32)
    _be(name).draw(counts, ids, *keys, tok)
    return tok


def case_draw_sparse():
    """A sparse row breaking a rule gives -1, never an id read from it; ids up to
    2**24 - 1 are fine (the draw does not know V)."""
    rng = np.random.default_rng(3)
    q = dyadic.allocate((rng.random((B, V)) + 0.01).astype(np.float32), top_k=W)
    qc, qi = np.array(q.counts), np.array(q.ids)
    keys = _keys(B)
    keep = [r for r in range(B) if r != BAD]
    for mutation in SPARSE_MUTATIONS:
        c, i = qc.copy(), qi.copy()
        _sparse_mutation(c[BAD], i[BAD], mutation)
        outs = []
        for name in BACKENDS:
            tok = _run_draw(name, c, i, keys)
            base = _run_draw(name, _sub(qc, keep), _sub(qi, keep),
                             tuple(_sub(a, keep) for a in keys))
            if mutation != "id_V":  # V < 2**24 is a valid id for the draw
                assert tok[BAD] == -1, (name, mutation, tok[BAD])
            np.testing.assert_array_equal(tok[keep], base)
            outs.append(tok)
        np.testing.assert_array_equal(*outs)
    c = np.zeros((1, 2), np.uint32)
    c[0] = [TOTAL // 2, TOTAL // 2]
    i = np.array([[TOTAL - 2, TOTAL - 1]], np.int32)
    toks = {int(_run_draw("cpu", c, i, _keys(1, s))[0]) for s in range(8)}
    assert toks == {TOTAL - 2, TOTAL - 1}
    for s in range(8):
        assert _run_draw("cpu", c, i, _keys(1, s))[0] == _run_draw("reference", c, i, _keys(1, s))[0]


def case_draw_dense_and_shapes():
    """Dense rows short of 2**24 give -1 when the ticket is beyond their mass
    (all backends); shape mismatches raise naming the array."""
    c = np.zeros((B, V), np.uint32)
    c[0, 3] = c[2, 5] = TOTAL
    keys = _keys(B)
    outs = [_run_draw(name, c, None, keys) for name in BACKENDS]
    for tok in outs:
        assert tok.tolist() == [3, -1, 5]
    ids = np.full((B, W), -1, np.int32)
    cs = np.zeros((B, W), np.uint32)
    ids[:, 0], cs[:, 0] = 7, TOTAL
    for name in BACKENDS:
        with pytest.raises(ValueError, match="ids"):
            _run_draw(name, cs, np.ascontiguousarray(ids[:, :W - 1]), keys)
        with pytest.raises(ValueError, match="seed"):
            _run_draw(name, cs, ids, (keys[0][:B - 1],) + keys[1:])
        with pytest.raises(ValueError, match="round"):
            _run_draw(name, cs, ids, keys[:2] + (keys[2][:B - 1],) + keys[3:])
        with pytest.raises(ValueError, match="tokens"):
            _be(name).draw(cs, ids, *keys, np.zeros(B - 1, np.int32))


# ------------------------------------------------------------------ allocate / propose

def _alloc_args(top_k, b=B, v=V):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((b, v)).astype(np.float32)
    counts = np.full((b, top_k or v), 0xABABABAB, np.uint32)
    ids = np.full((b, top_k), 0x5A5A5A5A, np.int32) if top_k else None
    return x, counts, ids, np.full(b, 77, np.int32)


def case_alloc_failed_rows():
    """A failed row gets counts 0, ids -1 (and token -1) on every backend."""
    for top_k in (0, W):
        for prim in ("allocate", "propose"):
            x, counts, ids, st = _alloc_args(top_k)
            x[BAD, 4] = np.nan
            outs = []
            for name in BACKENDS:
                c, i, s = counts.copy(), None if ids is None else ids.copy(), st.copy()
                tok = np.full(B, 77, np.int32)
                temp = np.full(B, 0.7)
                if prim == "allocate":
                    _be(name).allocate(x, None, temp, True, 0, top_k, c, i, s)
                else:
                    _be(name).propose(x, None, temp, 0, top_k, *_keys(B), tok, c, i, s)
                assert s.tolist() == [0, _status.X_NAN, 0], (name, prim, s)
                assert (c[BAD] == 0).all(), (name, prim, top_k)
                assert i is None or (i[BAD] == -1).all(), (name, prim, top_k)
                if prim == "propose":
                    assert tok[BAD] == -1
                outs.append((s, c, i, tok))
            for a, r in zip(*outs):
                if a is not None:
                    np.testing.assert_array_equal(a, r)


def case_alloc_shapes():
    """bias rows 1 or B of width V, counts/ids [B, W], W <= V, keys/tokens/status [B]."""
    for name in BACKENDS:
        be = _be(name)
        for top_k in (0, W):
            x, counts, ids, st = _alloc_args(top_k)
            temp = np.ones(B)
            bias1 = np.zeros((1, V), np.float32)

            def alloc(bias=bias1, c=counts, i=ids, s=st, t=temp, k=top_k, xx=x):
                be.allocate(xx, bias, t, True, 0, k, c, i, s)

            def propose(keys=None, tok=None, bias=bias1, c=counts, i=ids):
                keys = _keys(B) if keys is None else keys
                tok = np.zeros(B, np.int32) if tok is None else tok
                be.propose(x, bias, temp, 0, top_k, *keys, tok, c, i, st)

            alloc()
            alloc(bias=np.zeros((B, V), np.float32))
            propose()
            bad = [
                ("bias", dict(bias=np.zeros((2, V), np.float32))),
                ("bias", dict(bias=np.zeros((0, V), np.float32))),
                ("bias", dict(bias=np.zeros((1, V - 1), np.float32))),
                ("counts", dict(c=np.zeros((B, (top_k or V) - 1), np.uint32))),
                ("counts", dict(c=np.zeros((B - 1, top_k or V), np.uint32))),
                ("temperature", dict(t=np.ones(B - 1))),
                ("status", dict(s=np.zeros(B - 1, np.int32))),
                ("x", dict(xx=np.zeros((B, 0), np.float32), c=np.zeros((B, 0), np.uint32),
                           i=None if not top_k else np.zeros((B, 0), np.int32), k=0)),
            ]
            if top_k:
                bad += [
                    ("ids", dict(i=np.zeros((B, W - 1), np.int32))),
                    ("ids", dict(i=None)),
                    ("top_k", dict(k=V + 1, c=np.zeros((B, V + 1), np.uint32),
                                   i=np.zeros((B, V + 1), np.int32))),
                ]
            else:
                bad += [("ids", dict(i=np.zeros((B, V), np.int32)))]
            for what, kw in bad:
                with pytest.raises(ValueError, match=what):
                    alloc(**kw)
            keys = _keys(B)
            with pytest.raises(ValueError, match="seed"):
                propose(keys=(keys[0][:B - 1],) + keys[1:])
            with pytest.raises(ValueError, match="generation"):
                propose(keys=(keys[0], keys[1][:1]) + keys[2:])
            with pytest.raises(ValueError, match="tokens"):
                propose(tok=np.zeros(B - 1, np.int32))
            with pytest.raises(ValueError, match="bias"):
                propose(bias=np.zeros((2, V), np.float32))


# ------------------------------------------------------------------ cases

CASES = {f"draft_{v}": (lambda v=v: _draft_case(v)) for v in (-1, V, 2**31 - 1, -2**31)}
CASES.update({f"sparse_q_{m}": (lambda m=m: _sparse_q_case(m)) for m in SPARSE_MUTATIONS})
CASES.update({name[5:]: fn for name, fn in list(globals().items()) if name.startswith("case_")})

_HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_case(case):
    code = (f"import sys; sys.path.insert(0, {_HERE!r}); import test_kernel_bounds as m; "
            f"m.CASES[{case!r}]()")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, (f"case {case}: exit {r.returncode}\n{r.stdout[-3000:]}\n"
                               f"{r.stderr[-3000:]}")
