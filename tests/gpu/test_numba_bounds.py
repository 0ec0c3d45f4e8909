"""backend="numba" called directly with hostile arrays (no Python-side validation).

The kernels check every id they address memory with and fail the row closed
with a status code: a draft id outside [0, V) is DRAFT_OUT_OF_RANGE (13), a
sparse q row breaking a Dyadic rule is Q_INVALID (14), checked in the order of
``dyadic.reference.sampling.verify_row`` (target rows, draft ids, q rows,
q(d) > 0); a bad sparse row of ``draw`` gives token -1.  The other rows of the
batch equal the CPU backend, bit for bit (the CPU backend is run on those rows
only, with the same arguments: rows are independent).

The kernels stride over rows, so the grid does not limit the batch:
``backends/cuda/numba/backend.py``'s ``MAX_BLOCKS`` caps the number of blocks and the results must not
change.  ``test_gpu_large_batch`` (GPU only) runs every primitive at
B x k = 100001 rows, above the 65535 blocks a y or z grid dimension holds.
"""

import numpy as np
import pytest

from dyadic import _backend, _spec, _status
from test_numba_sim import NUMBA, WHY

pytestmark = pytest.mark.skipif(NUMBA is None, reason=str(WHY))

TOTAL = _spec.TOTAL
PAD = _spec.PAD_ID
T_BAD, T_SUM = _status.TARGET_INVALID_VALUE, _status.TARGET_SUM
Q_ZERO, OOR, Q_INV = _status.Q_ZERO_AT_DRAFT, _status.DRAFT_OUT_OF_RANGE, _status.Q_INVALID


def _simulator():
    from numba import config
    return bool(getattr(config, "ENABLE_CUDASIM", 0))


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    """4 threads per block under the simulator (it runs one Python thread per CUDA
    thread); rows wider than the block still stride over threads."""
    if _simulator():
        from dyadic.backends.cuda.numba import backend as numba_backend
        monkeypatch.setattr(numba_backend, "THREADS_PER_BLOCK", 4)


def cpu():
    be, why = _load_cpu()
    if be is None:
        pytest.skip(why)
    return be


def _load_cpu():
    try:
        be = _backend.get("cpu")
    except Exception as exc:  # noqa: BLE001 - the reason becomes the skip message
        return None, f"backend 'cpu' unavailable: {exc}"
    return be, None


def softmax(z):
    z = np.asarray(z, np.float64)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


def keys(rng, b):
    return (rng.integers(0, 2 ** 64, size=b, dtype=np.uint64),
            rng.integers(0, 2 ** 32, size=b, dtype=np.uint64).astype(np.uint32),
            rng.integers(0, 5, size=b).astype(np.uint32),
            rng.integers(0, 1000, size=b).astype(np.uint32))


def sparse_q(rng, rows, v, w):
    """Valid sparse rows (top-w allocation on the CPU): counts uint32, ids int32 [rows, w]."""
    x = (rng.normal(size=(rows, v)) * 2).astype(np.float32)
    counts = np.zeros((rows, w), np.uint32)
    ids = np.zeros((rows, w), np.int32)
    st = np.zeros(rows, np.int32)
    cpu().allocate(x, None, np.ones(rows), True, 0, w, counts, ids, st)
    assert (st == 0).all()
    return counts, ids


def run_verify(be, target, draft, qc, qi, greedy, k4):
    b, k1 = target.shape[:2]
    outs = [np.full(b, 7, np.int32), np.full((b, k1), 7, np.int32), np.full(b, 7, np.int32)]
    be.verify(target, draft, qc, qi, greedy, *k4, *outs)
    return outs


def check_verify(target, draft, qc, qi, greedy, k4, expect):
    """numba on the whole batch; rows with an expected code fail closed with it, the
    others (expected None) equal the CPU backend on those rows."""
    acc, tok, st = run_verify(NUMBA, target, draft, qc, qi, greedy, k4)
    bad = np.array([e is not None for e in expect])
    assert st[bad].tolist() == [e for e in expect if e is not None]
    assert (acc[bad] == 0).all() and (tok[bad] == -1).all()
    good = np.flatnonzero(~bad)
    sub = lambda a: None if a is None else np.ascontiguousarray(a[good])  # noqa: E731
    want = run_verify(cpu(), sub(target), sub(draft), sub(qc), sub(qi), sub(greedy),
                      [sub(f) for f in k4])
    for got, ref in zip((acc, tok, st), want):
        np.testing.assert_array_equal(got[good], ref)
    return acc, tok, st


def test_verify_sparse_hostile_rows():
    """Draft ids -1, V, 2**31-1; q ids V, -2, duplicated, descending, padding in
    the middle or with a count; counts not summing to 2**24; the order of the
    checks; greedy requests.  One batch: the good rows equal the CPU backend."""
    rng = np.random.default_rng(3)
    v, k, w = 24, 2, 6
    cases = []  # (name, modifier(target, draft, qc, qi, greedy), expected status or None)

    def case(expect, name=None):
        def deco(fn):
            cases.append((name or fn.__name__, fn, expect))
            return fn
        return deco

    none = lambda *a: None  # noqa: E731
    cases.append(("good", none, None))

    @case(OOR)
    def draft_minus_one(t, d, qc, qi, g):
        d[0] = -1

    @case(OOR)
    def draft_v(t, d, qc, qi, g):
        d[1] = v

    @case(OOR)
    def draft_int32_max(t, d, qc, qi, g):
        d[0] = 2 ** 31 - 1

    cases.append(("good", none, None))

    @case(Q_INV)
    def q_id_v(t, d, qc, qi, g):
        qi[1, -1] = v  # still ascending

    @case(Q_INV)
    def q_id_minus_two(t, d, qc, qi, g):
        qi[1, 0] = -2

    @case(Q_INV)
    def q_id_duplicate(t, d, qc, qi, g):
        qi[1, 2] = qi[1, 1]

    @case(Q_INV)
    def q_ids_descending(t, d, qc, qi, g):
        qi[1, [1, 2]] = qi[1, [2, 1]]
        qc[1, [1, 2]] = qc[1, [2, 1]]

    @case(Q_INV)
    def q_padding_in_the_middle(t, d, qc, qi, g):
        qc[1, 1] += qc[1, 2]
        qc[1, 2] = 0
        qi[1, 2] = PAD

    @case(Q_INV)
    def q_padding_with_a_count(t, d, qc, qi, g):
        qi[1, -1] = PAD  # its count stays: the counts still sum to 2**24

    @case(Q_INV)
    def q_sum_off_by_one(t, d, qc, qi, g):
        qc[0, 0] += 1

    @case(Q_INV)
    def q_count_above_total(t, d, qc, qi, g):
        qc[0, 0] = 2 ** 32 - 1

    @case(Q_INV)
    def q_all_padding(t, d, qc, qi, g):
        qi[1] = PAD
        qc[1] = 0

    @case(Q_ZERO)
    def q_zero_at_draft(t, d, qc, qi, g):
        d[1] = np.setdiff1d(np.arange(v), qi[1])[0]

    # order: target rows, then draft ids, then every q row, then q(d) > 0
    @case(OOR)
    def order_draft_before_q(t, d, qc, qi, g):
        qi[0, 0] = v + 5
        d[1] = v

    @case(Q_INV)
    def order_q_rows_before_q_at_draft(t, d, qc, qi, g):
        d[0] = np.setdiff1d(np.arange(v), qi[0])[0]  # q_0(d_0) = 0 ...
        qi[1, 0] = -2                                 # ... but q row 1 is invalid

    @case(T_BAD)
    def order_target_before_draft(t, d, qc, qi, g):
        t[2, 3] = np.nan
        d[0] = -1

    @case(T_SUM)
    def order_target_sum_before_q(t, d, qc, qi, g):
        t[1] *= 0.5
        qi[0, 0] = v

    cases.append(("good", none, None))

    @case(OOR)
    def greedy_draft_out_of_range(t, d, qc, qi, g):
        g[0] = 1
        d[1] = v

    @case(None)
    def greedy_does_not_read_q(t, d, qc, qi, g):
        g[0] = 1
        qi[1, -1] = v
        qc[0, 0] += 1

    @case(None)
    def greedy_good(t, d, qc, qi, g):
        g[0] = 1

    b = len(cases)
    target = softmax(rng.normal(size=(b, k + 1, v)) * 2)
    qc, qi = sparse_q(rng, b * k, v, w)
    qc, qi = qc.reshape(b, k, w), qi.reshape(b, k, w)
    pick = rng.integers(0, 2, size=(b, k))  # drafts in the support: q(d) > 0
    draft = np.take_along_axis(qi, pick[..., None], axis=2)[..., 0].astype(np.int32)
    greedy = np.zeros(b, np.uint8)
    for r, (_, fn, _) in enumerate(cases):
        fn(target[r], draft[r], qc[r], qi[r], greedy[r:r + 1])
    acc, tok, st = check_verify(target, draft, qc, qi, greedy, keys(rng, b),
                                [e for _, _, e in cases])
    good = [r for r, (_, _, e) in enumerate(cases) if e is None]
    assert (st[good] == 0).all()
    assert (acc[good] < k).any(), "no good row was rejected: the residual is not exercised"


def test_verify_dense_and_point_mass_hostile_rows():
    """Dense q: a count above 2**24 at a draft and, for a row that the residual
    reads in full (a rejection), counts not summing to 2**24 are Q_INVALID;
    greedy requests do not read q.  Point-mass q: draft ids are checked."""
    rng = np.random.default_rng(4)
    v, k = 20, 2
    b = 8
    target = softmax(rng.normal(size=(b, k + 1, v)) * 2)
    draft = rng.integers(0, v, size=(b, k)).astype(np.int32)
    qc = rng.multinomial(TOTAL - 1, np.full(v, 1.0 / v), size=(b, k)).astype(np.uint32)
    qc[np.arange(b)[:, None], np.arange(k), draft] += 1  # q(d) > 0, rows summing to 2**24
    greedy = np.zeros(b, np.uint8)

    def reject_at_0(r):
        """p_0(d_0) = 0 (the rest renormalised): the draft is rejected at row 0."""
        row = target[r, 0].astype(np.float64)
        row[draft[r, 0]] = 0.0
        target[r, 0] = (row / row.sum()).astype(np.float32)

    expect = [None] * b
    # 1: the count at a draft above 2**24
    qc[1, 1, draft[1, 1]] = TOTAL + 1
    expect[1] = Q_INV
    # 2: row 0 sums to 2**24 + 1 and the residual reads it
    reject_at_0(2)
    qc[2, 0, (draft[2, 0] + 1) % v] += 1
    expect[2] = Q_INV
    # 3: row 1 sums to 2**24 - 1, but the request stops at row 0: never read in full
    reject_at_0(3)
    qc[3, 1, (draft[3, 1] + 1) % v] -= 1
    # 4: greedy: q is not read
    greedy[4] = 1
    qc[4, 0, draft[4, 0]] = 2 ** 32 - 1
    # 5: draft out of range before the q rules
    draft[5, 0] = 2 ** 31 - 1
    qc[5, 1, draft[5, 1]] = TOTAL + 1
    expect[5] = OOR
    # 6: a good row rejected at row 0 (the residual on a dense row)
    reject_at_0(6)
    k4 = keys(rng, b)
    acc, tok, st = check_verify(target, draft, qc, None, greedy, k4, expect)
    assert st[[0, 3, 4, 6, 7]].tolist() == [0] * 5
    assert acc[3] == 0 and acc[6] == 0

    # point-mass q (q_counts None): only the draft ids can be out of range
    pm_draft = draft[[0, 5, 6, 7]].copy()
    pm_draft[2, 1] = -1
    check_verify(target[[0, 5, 6, 7]], pm_draft, None, None, np.array([0, 0, 0, 1], np.uint8),
                 [f[[0, 5, 6, 7]] for f in k4], [None, OOR, OOR, None])


def test_draw_hostile_sparse_rows():
    """A sparse row with an id outside [0, 2**24), padding before a valid id or
    with a count, ids not strictly ascending, or counts not summing to 2**24
    gives -1; never an id read from it.  The other rows equal the CPU backend."""
    rng = np.random.default_rng(5)
    v, w = 30, 5
    mods = [
        None,
        lambda c, i: i.__setitem__(-1, TOTAL),         # id 2**24
        lambda c, i: i.__setitem__(0, -2),
        lambda c, i: i.__setitem__(2, i[1]),           # duplicate
        lambda c, i: i.__setitem__(slice(0, 2), i[1::-1].copy()),  # descending
        None,
        lambda c, i: (i.__setitem__(1, PAD), c.__setitem__(0, c[0] + c[1]),
                      c.__setitem__(1, 0)),            # padding in the middle
        lambda c, i: i.__setitem__(-1, PAD),           # padding with a count
        lambda c, i: c.__setitem__(0, c[0] + 1),       # sum 2**24 + 1
        lambda c, i: c.__setitem__(0, 2 ** 32 - 1),    # a count above 2**24
        lambda c, i: (i.__setitem__(slice(None), PAD), c.__setitem__(slice(None), 0)),
        None,
        lambda c, i: (i.__setitem__(slice(None), np.arange(TOTAL - w, TOTAL)),),  # ids < 2**24
    ]
    b = len(mods)
    counts, ids = sparse_q(rng, b, v, w)
    for r, m in enumerate(mods):
        if m is not None:
            m(counts[r], ids[r])
    k4 = keys(rng, b)
    tok = np.full(b, 7, np.int32)
    NUMBA.draw(counts, ids, *k4, tok)
    good = [r for r, m in enumerate(mods) if m is None] + [b - 1]
    bad = [r for r in range(b) if r not in good]
    assert tok[bad].tolist() == [-1] * len(bad)
    want = np.full(len(good), 7, np.int32)
    cpu().draw(counts[good], ids[good], *[f[good] for f in k4], want)
    np.testing.assert_array_equal(tok[good], want)
    assert TOTAL - w <= tok[b - 1] < TOTAL


def test_failed_allocate_rows_are_cleared():
    """A failed allocate / propose row: its status, counts 0, ids -1, token -1; the
    other rows equal the CPU backend."""
    rng = np.random.default_rng(6)
    b, v, w = 4, 20, 4
    x = rng.normal(size=(b, v)).astype(np.float32)
    x[1, 3] = np.nan
    x[2, :] = -np.inf
    k4 = keys(rng, b)
    temp = np.array([1.0, 1.0, 0.0, 0.7])
    res = []
    for be in (NUMBA, cpu()):
        outs = [np.full(b, 7, np.int32), np.full((b, w), 7, np.uint32),
                np.full((b, w), 7, np.int32), np.full(b, 7, np.int32)]
        be.propose(x, None, temp, 0, w, *k4, *outs)
        res.append(outs)
    tok, counts, ids, st = res[0]
    assert st.tolist() == [0, _status.X_NAN, _status.X_ZERO_MASS, 0]
    assert (tok[1:3] == -1).all() and (counts[1:3] == 0).all() and (ids[1:3] == PAD).all()
    for got, want in zip(res[0], res[1]):
        np.testing.assert_array_equal(got[[0, 3]], want[[0, 3]])


def _all_primitives(rng, b, v, w, k):
    """Outputs of every numba primitive on valid inputs of b rows (allocate: sparse,
    floor-first; propose: dense; draw: both; verify: b // k requests of depth k,
    sparse q, every other one greedy), next to the CPU backend's."""
    x = (rng.normal(size=(b, v)) * 2).astype(np.float32)
    temp = rng.choice([0.0, 0.7, 1.0], size=b)
    k4 = keys(rng, b)
    nreq = b // k
    target = softmax(rng.normal(size=(nreq, k + 1, v)) * 2)
    qc, qi = (a.reshape(nreq, k, w) for a in sparse_q(rng, nreq * k, v, w))
    pick = rng.integers(0, 2, size=(nreq, k))
    draft = np.take_along_axis(qi, pick[..., None], axis=2)[..., 0].astype(np.int32)
    greedy = (np.arange(nreq) % 2).astype(np.uint8)
    kv = [f[:nreq] for f in k4]
    out = {}
    for name, be in (("numba", NUMBA), ("cpu", cpu())):
        r = {}
        c, ids, st = np.zeros((b, w), np.uint32), np.zeros((b, w), np.int32), np.zeros(b, np.int32)
        be.allocate(x, None, np.ones(b), True, 1, w, c, ids, st)
        r["allocate"] = (c, ids, st)
        tok = np.zeros(b, np.int32)
        be.draw(c, ids, *k4, tok)
        r["draw sparse"] = (tok,)
        c, st = np.zeros((b, v), np.uint32), np.zeros(b, np.int32)
        tok = np.zeros(b, np.int32)
        be.propose(x, None, temp, 0, 0, *k4, tok, c, None, st)
        r["propose"] = (tok, c, st)
        tok = np.zeros(b, np.int32)
        be.draw(c, None, *k4, tok)
        r["draw dense"] = (tok,)
        r["verify"] = tuple(run_verify(be, target, draft, qc, qi, greedy, kv))
        out[name] = r
    return out


def assert_all_equal(out):
    for key, got in out["numba"].items():
        for a, e in zip(got, out["cpu"][key]):
            if a is None:
                assert e is None
            else:
                np.testing.assert_array_equal(a, e, err_msg=key)


def _numba_backend_module():
    from dyadic.backends.cuda.numba import backend as numba_backend
    return numba_backend


def test_grid_does_not_limit_rows(monkeypatch):
    """Fewer blocks than rows (at most 2 blocks, 5 rows): every primitive still
    covers every row, with the CPU backend's results."""
    monkeypatch.setattr(_numba_backend_module(), "MAX_BLOCKS", 2)
    rng = np.random.default_rng(7)
    out = _all_primitives(rng, 5, 9, 3, 1)
    assert (out["numba"]["verify"][0] < 1).any()  # a rejection: the residual ran
    assert_all_equal(out)


@pytest.mark.gpu
@pytest.mark.skipif(NUMBA is not None and _simulator(),
                    reason="numba runs the CUDA simulator here (no GPU)")
@pytest.mark.parametrize("blocks", [None, 131072])
def test_gpu_large_batch(monkeypatch, blocks):
    """Every primitive at B x k = 100001 rows (allocate, propose, draw: B = 100001;
    verify: 100001 requests of depth 1) == the CPU backend: rows on the grid's x
    dimension (131072 blocks) or strided over the default grid."""
    if blocks:
        monkeypatch.setattr(_numba_backend_module(), "MAX_BLOCKS", blocks)
    rng = np.random.default_rng(8)
    n = 100001
    out = _all_primitives(rng, n, 16, 4, 1)
    assert_all_equal(out)
    c = rng.integers(0, 2 ** 32, size=(n, 4), dtype=np.uint64).astype(np.uint32)
    kk = rng.integers(0, 2 ** 32, size=(n, 2), dtype=np.uint64).astype(np.uint32)
    got, want = np.zeros((n, 4), np.uint32), np.zeros((n, 4), np.uint32)
    NUMBA.philox4x32(c, kk, 10, got)
    cpu().philox4x32(c, kk, 10, want)
    np.testing.assert_array_equal(got, want)
