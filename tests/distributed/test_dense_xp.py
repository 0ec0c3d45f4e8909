"""The dense sharded propose's array code (dyadic/distributed/_core.py, written once over an
array module ``xp``) against plain references, for NumPy (host shards) and CuPy (CUDA
shards; skips without the cuda backend): the exact float32 -> binary64 conversion, the
merge of the top-1 candidates, the floors, the radix histograms and digits, the
first-exceeding search, the one-column additions, and the whole allocation and draw of
one shard (a single rank, collectives replayed by a stand-in that checks every
collective against the declared plan) against the unsharded ``dyadic.propose``.
"""

import numpy as np
import pytest

import dyadic
from dyadic import _backend, _spec, _status

torch = pytest.importorskip("torch", reason="torch is an optional dependency of "
                            "dyadic.distributed")

from dyadic.distributed import _comm, _core  # noqa: E402

TOTAL = _spec.TOTAL
U64, I64 = np.uint64, np.int64


@pytest.fixture(params=["numpy", pytest.param("cupy", marks=pytest.mark.gpu)])
def xk(request):
    """(xp, the shard kernels on xp arrays, host -> xp, xp -> host)."""
    if request.param == "numpy":
        try:
            sk = _core._host_kernels()
        except _backend.BackendUnavailable as exc:
            pytest.skip(f"cpu backend unavailable: {exc}")
        return np, sk, np.asarray, np.asarray
    from conftest import _load
    be, why = _load("cuda")
    if be is None:
        pytest.skip(why)
    import cupy as cp

    from dyadic.backends.cuda.cupy import shard
    return cp, shard, lambda a: cp.asarray(np.ascontiguousarray(a)), cp.asnumpy


def test_f32_bits_to_f64(xk):
    xp, _, up, down = xk
    rng = np.random.default_rng(1)
    bits = rng.integers(-2**31, 2**31, 200_000, dtype=np.int64).astype(np.int32)
    special = np.array([0, 0x80000000, 1, 0x807FFFFF, 0x007FFFFF, 0x00800000, 0x7F7FFFFF,
                        0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFFFFFFF],
                       dtype=np.uint32).view(np.int32)
    sub = (rng.integers(1, 2**23, 5000).astype(np.uint32)
           | (rng.integers(0, 2, 5000).astype(np.uint32) << 31)).view(np.int32)
    for b in (bits, special, sub, bits.reshape(400, 500)[:, ::7]):
        with np.errstate(invalid="ignore"):
            want = np.ascontiguousarray(b).view(np.float32).astype(np.float64)
        got = down(_core._f32_bits_to_f64(xp, up(b)))
        np.testing.assert_array_equal(got.view(np.uint64), want.view(np.uint64))


def _payload(rng, shards, batch, has_bias):
    ncol = 3 if has_bias else 2
    g = np.zeros((shards, batch, 1 + ncol), np.int32)
    z = rng.choice(np.array([-np.inf, -0.0, 0.0, 1.5, -2.0, 3.0, 1e-45], np.float32),
                   size=(shards, batch))
    g[:, :, 1] = z.view(np.int32)
    if has_bias:
        g[:, :, 2] = rng.choice(np.array([0.0, -0.0, 1.5, -np.inf], np.float32),
                                size=(shards, batch)).view(np.int32)
    ids = np.arange(shards * batch).reshape(batch, shards).T * 7 + 3
    ids[rng.random((shards, batch)) < 0.2] = -1  # empty shards
    g[:, :, ncol] = ids
    st = np.zeros((shards, batch), np.int32)
    st[rng.random((shards, batch)) < 0.1] = _status.X_NAN
    g[:, :, 0] = st
    return g


def _merge_reference(g, t_eff, has_bias):
    """The per-row rule: first non-zero status, else the candidates sorted by (-z, id)."""
    ncol = 3 if has_bias else 2
    out = []
    for r in range(g.shape[1]):
        st = next((int(s) for s in g[:, r, 0] if s), 0)
        keep = g[:, r, ncol] >= 0
        z = g[:, r, 1][keep].view(np.float32).astype(np.float64)
        if has_bias:
            z = z + g[:, r, 2][keep].view(np.float32).astype(np.float64)
        z = z / t_eff[r]
        ids = g[:, r, ncol][keep].astype(np.int64)
        o = np.lexsort((ids, -z))
        if not st and (z.size == 0 or z[o[0]] == -np.inf):
            st = _status.X_ZERO_MASS
        out.append((st, None if st else z[o[0]], None if st else ids[o[0]]))
    return out


@pytest.mark.parametrize("has_bias", [False, True])
def test_merge_top1(xk, has_bias):
    xp, _, up, down = xk
    rng = np.random.default_rng(2 + has_bias)
    for shards in (1, 2, 3, 5):
        g = _payload(rng, shards, 64, has_bias)
        t_eff = rng.choice([1.0, 0.7, 1e-300, 3.0], size=64)
        zmax, arg, status = (down(a) for a in _core._merge_top1(xp, up(g), up(t_eff), has_bias))
        for r, (st, z, i) in enumerate(_merge_reference(g, t_eff, has_bias)):
            assert status[r] == st, (shards, r)
            if not st:
                assert arg[r] == i and zmax[r].tobytes() == np.float64(z).tobytes(), (shards, r)


def test_floors(xk):
    xp, _, up, down = xk
    rng = np.random.default_rng(3)
    w = rng.integers(0, 2**39 + 1, (6, 1000), dtype=np.uint64)
    w[2] = 0
    w[4, :3] = 2**39
    live = np.array([1, 1, 0, 1, 1, 0], bool)
    s_tot = w.sum(axis=1, dtype=np.uint64) + U64(12345)  # any S >= 1
    base, rem = (down(a) for a in _core._floors(xp, up(w.copy()), s_tot, live))
    for r in range(6):
        for j in range(0, 1000, 37):
            want = divmod(int(w[r, j]) << 24, int(s_tot[r])) if live[r] else (0, 0)
            assert (int(base[r, j]), int(rem[r, j])) == want


@pytest.mark.parametrize("whole_rows", [False, True])
def test_digit_hist(xk, whole_rows):
    xp, _, up, down = xk
    rng = np.random.default_rng(4 + whole_rows)
    rem = rng.integers(0, 2**63, (5, 3000), dtype=np.uint64)
    rem[1, ::3] = rem[1, 0]  # repeated values
    sel = (rng.random((5, 1)) < 0.7) if whole_rows else (rng.random((5, 3000)) < 0.3)
    for shift in (0, 8, 48, 56):
        got = down(_core._digit_hist(xp, up(rem), shift, up(sel)))
        assert got.dtype == np.int64
        for r in range(5):
            vals = rem[r][np.broadcast_to(sel, rem.shape)[r]]
            want = np.bincount(((vals >> U64(shift)) & U64(0xFF)).astype(np.intp),
                               minlength=256)
            np.testing.assert_array_equal(got[r], want)


def test_radix_digit(xk):
    xp, _, up, down = xk
    rng = np.random.default_rng(5)
    hist = rng.integers(0, 4, (40, 256)).astype(np.int64)
    hist[3] = 0
    hist[4, 255] = 9
    total = hist.sum(axis=1)
    need = np.minimum(rng.integers(0, 600, 40), total).astype(np.int64)
    need[5] = 0
    prefix = rng.integers(0, 2**40, 40, dtype=np.uint64) << U64(16)
    for d in (0, 1, 7):
        n2, p2 = (down(a) for a in _core._radix_digit(xp, up(hist), up(need), up(prefix), d))
        for r in range(40):  # the sequential rule: scan digits from 255 down
            nd, p, acc = int(need[r]), int(prefix[r]), 0
            if nd:
                for t in range(255, -1, -1):
                    if acc + int(hist[r, t]) >= nd:
                        nd -= acc
                        p |= t << (8 * d)
                        break
                    acc += int(hist[r, t])
            assert (int(n2[r]), int(p2[r])) == (nd, p), (d, r)


@pytest.mark.parametrize("n", [1, 255, 256, 257, 1000])
def test_first_over(xk, n):
    xp, _, up, down = xk
    rng = np.random.default_rng(n)
    for v in (rng.integers(0, 50, (9, n)).astype(np.uint32), rng.random((9, n)) < 0.1):
        run = np.cumsum(v.astype(np.int64), axis=1)
        target = np.concatenate([[-1, 0, run[2, -1], run[3, -1] + 5],
                                 rng.integers(0, run[4:, -1] + 2)]).astype(np.int64)
        got = down(_core._first_over(xp, up(v), up(target)))
        want = [np.searchsorted(run[r], target[r], side="right") for r in range(9)]
        np.testing.assert_array_equal(got, want)
    assert down(_core._first_over(xp, up(np.zeros((3, 0), np.uint32)),
                                  up(np.zeros(3, np.int64)))).tolist() == [0, 0, 0]


def test_add_at(xk):
    xp, _, up, down = xk
    c = np.arange(24, dtype=np.uint64).reshape(4, 6)
    col = np.array([0, 5, -1, 6], np.int64)
    got = down(_core._add_at(xp, up(c.copy()), up(col), up(np.full(4, 100, np.uint64))))
    want = c.copy()
    want[0, 0] += 100
    want[1, 5] += 100
    np.testing.assert_array_equal(got, want)


class _OneRank:
    """The collectives of one rank alone (world 1), each checked against the declared plan
    as Comm does; records (plan, bytes) of every collective."""

    rank = 0

    def __init__(self, plan):
        self._plan, self.log = plan, []

    def plan(self, plan):
        self._plan = plan

    def _data(self, plan, arr, then):
        assert plan == self._plan, f"collective {plan} where {self._plan} was planned"
        self.log.append((plan, arr.nbytes))
        self._plan = then
        return arr

    def all_reduce(self, arr, op="sum", then=None):
        return self._data(_comm.reduce_plan(arr.shape, op, arr.dtype), arr.copy(), then)

    def all_gather(self, arr, then=None):
        return self._data(_comm.gather_plan(arr.shape, arr.dtype), arr, then)[None]


def _one_shard(xk, x, bias, temp, policy, keys):
    """_propose_dense on the whole vocabulary as one shard: (tokens, counts, collectives)."""
    xp, sk, up, down = xk
    batch, v = x.shape
    greedy = temp == 0
    t_eff = np.where(greedy, 1.0, temp)
    code = _spec.POLICY_CODES[policy]
    b2 = None if bias is None else up(bias.reshape(-1, v))
    ncol = 2 if bias is None else 3
    payload = up(np.zeros((batch, 1 + ncol), np.int32))
    sk.topk(up(x), b2, up(t_eff), up(greedy.astype(np.uint8)), 1, 0, v, payload)
    closing = _comm.close_plan(batch)
    after = closing if greedy.all() else _comm.reduce_plan((batch, 2), "sum")
    comm = _OneRank(after)
    kb = tuple(up(a) for a in keys.broadcast(batch))
    tokens, counts = _core._propose_dense(comm, xp, sk, up(x), b2, up(t_eff), greedy, code, kb,
                                          0, [0], payload[None], closing)
    assert comm._plan == closing
    return down(tokens), down(counts), comm.log


@pytest.mark.parametrize("policy", ["standard", "floor-first"])
def test_one_shard_equals_unsharded(xk, policy):
    """One rank holding the whole vocabulary: the unsharded propose's tokens and counts."""
    rng = np.random.default_rng(6 + len(policy))
    for v, batch in ((1, 2), (7, 3), (300, 5), (5000, 4)):
        x = rng.normal(0, 3, (batch, v)).astype(np.float32)
        x[0, : v // 2] = -np.inf
        if v > 2:
            x[-1] = np.round(x[-1])  # ties
        bias = rng.normal(0, 1, v).astype(np.float32) if v % 2 else None
        temp = rng.choice([0.0, 0.7, 1.0, 30.0], size=batch)
        keys = dyadic.Keys(seed=int(rng.integers(0, 2**63)), position=rng.integers(0, 99, batch))
        tokens, counts, log = _one_shard(xk, x, bias, temp, policy, keys)
        want_t, want_q = dyadic.propose(x, keys, temperature=temp, bias=bias, top_k=None,
                                        policy=policy, backend="cpu")
        np.testing.assert_array_equal(tokens, np.asarray(want_t))
        np.testing.assert_array_equal(counts, np.asarray(want_q.counts))
        if not (temp == 0).all():
            assert len(log) >= 5  # weights, floors (+ histograms), ties, count sums, token
    bad = np.zeros((2, 9), np.float32)
    bad[1, 4] = np.nan
    with pytest.raises(ValueError) as got:
        _one_shard(xk, bad, None, np.ones(2), policy, dyadic.Keys(seed=1))
    with pytest.raises(ValueError) as want:
        dyadic.propose(bad, dyadic.Keys(seed=1), top_k=None, policy=policy, backend="cpu")
    assert str(got.value) == str(want.value)
