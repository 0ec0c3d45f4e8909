"""verify with ragged drafts (``num_drafts``) on the host backends.

A request with n_b of its k drafts gives the tokens, accepted count and status of the
same request verified alone with k = n_b and the same keys (bits; tokens padded with
-1), whatever its padding holds (NaN target rows, draft ids outside [0, V), q rows
breaking every Dyadic rule), greedy requests included, with check=True, False and
"lazy".  A count outside [0, k] raises with check=True and fails that request closed
(NUM_DRAFTS_INVALID, outputs -1) with check=False; no other request changes.  The
numba backend (CUDA simulator without a GPU) is compared with the CPU backend.
"""

import os

import numpy as np
import pytest

import dyadic
from dyadic import Keys, _spec, _status
from dyadic._types import trusted_dyadic

from conftest import random_target

B, K, V = 7, 3, 23
N = np.array([0, 3, 1, 2, 3, 0, 1], dtype=np.int32)
GREEDY = np.array([False, True, False, True, False, True, False])
_SIM = "NUMBA_ENABLE_CUDASIM" in os.environ


def _keys(rows=None):
    seed = np.arange(100, 100 + B, dtype=np.uint64)
    pos = np.arange(B, dtype=np.uint32) * 5 + 3
    if rows is not None:
        seed, pos = seed[rows], pos[rows]
    return Keys(seed=seed, generation=2, round=7, position=pos)


def _case(rng, qkind):
    """(target, draft, q counts, q ids) of a valid padded batch, every row used."""
    p = random_target(rng, B, K + 1, V)
    if qkind == "none":
        return p, rng.integers(0, V, (B, K)).astype(np.int32), None, None
    q = dyadic.allocate(rng.standard_normal((B, K, V)).astype(np.float32), logits=True,
                        top_k=6 if qkind == "sparse" else None)
    counts = np.array(q.counts)
    ids = None if q.ids is None else np.array(q.ids)
    if ids is not None:
        draft = ids[:, :, 0].copy()
    else:
        draft = np.argmax(counts, axis=2).astype(np.int32)  # q(d) > 0
    return p, draft, counts, ids


def _spoil(p, draft, counts, ids, n):
    """The padding beyond each request's count made hostile."""
    p, draft = p.copy(), draft.copy()
    counts = None if counts is None else counts.copy()
    ids = None if ids is None else ids.copy()
    for b in range(B):
        p[b, n[b] + 1:] = np.nan
        draft[b, n[b]:] = np.where(np.arange(n[b], K) % 2, V + 9, -5)
        if counts is not None:
            counts[b, n[b]:] = _spec.TOTAL + 3
        if ids is not None:
            ids[b, n[b]:] = V + 1
    return p, draft, counts, ids


def _q(counts, ids):
    return None if counts is None else trusted_dyadic(counts, ids, V, "standard",
                                                      readonly=False)


def _alone(backend, p, draft, counts, ids, b, n, greedy):
    q = None if counts is None or n == 0 else _q(counts[b:b + 1, :n].copy(),
                                                 None if ids is None else ids[b:b + 1, :n].copy())
    return dyadic.verify(p[b:b + 1, :n + 1].copy(), draft[b:b + 1, :n].copy(), q,
                         _keys([b]), greedy=None if greedy is None else greedy[b:b + 1],
                         backend=backend, check=False)


HOST = ["cpu", "reference"]


@pytest.mark.parametrize("backend", HOST)
@pytest.mark.parametrize("qkind", ["sparse", "dense", "none"])
@pytest.mark.parametrize("check", [True, False, "lazy"])
@pytest.mark.parametrize("greedy", [None, GREEDY])
def test_ragged_rows_equal_each_row_alone(backend, qkind, check, greedy, rng):
    p, draft, counts, ids = _case(rng, qkind)
    hp, hd, hc, hi = _spoil(p, draft, counts, ids, N)
    got = dyadic.verify(hp, hd, _q(hc, hi), _keys(), greedy=greedy, backend=backend,
                        check=check, num_drafts=N)
    if check is not True:
        assert got.status.tolist() == [0] * B
    for b in range(B):
        n = int(N[b])
        one = _alone(backend, p, draft, counts, ids, b, n, greedy)
        assert one.status[0] == 0
        assert got.accepted[b] == one.accepted[0] <= n
        np.testing.assert_array_equal(got.tokens[b, :n + 1], one.tokens[0])
        assert (got.tokens[b, n + 1:] == -1).all()


@pytest.mark.parametrize("backend", HOST)
def test_full_counts_equal_the_padded_call(backend, rng):
    p, draft, counts, ids = _case(rng, "sparse")
    full = np.full(B, K, dtype=np.int64)
    a = dyadic.verify(p, draft, _q(counts, ids), _keys(), backend=backend)
    b = dyadic.verify(p, draft, _q(counts, ids), _keys(), backend=backend, num_drafts=full)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.accepted, b.accepted)


@pytest.mark.parametrize("backend", HOST)
def test_torch_cpu_inputs(backend, rng):
    torch = pytest.importorskip("torch")
    p, draft, counts, ids = _case(rng, "sparse")
    want = dyadic.verify(p, draft, _q(counts, ids), _keys(), backend=backend, num_drafts=N)
    got = dyadic.verify(torch.from_numpy(p), torch.from_numpy(draft), _q(counts, ids), _keys(),
                        backend=backend, num_drafts=torch.from_numpy(N.astype(np.int64)))
    np.testing.assert_array_equal(got.tokens.numpy(), want.tokens)


@pytest.mark.parametrize("backend", HOST)
@pytest.mark.parametrize("bad", [-1, K + 1, 2**40])
def test_count_outside_zero_k(backend, bad, rng):
    p, draft, counts, ids = _case(rng, "sparse")
    n = N.astype(np.int64)
    n[4] = bad
    with pytest.raises(ValueError, match=r"num_drafts: row 4: the number of drafts must be in "
                                         rf"\[0, k\] = \[0, {K}\]"):
        dyadic.verify(p, draft, _q(counts, ids), _keys(), backend=backend, num_drafts=n)
    good = dyadic.verify(p, draft, _q(counts, ids), _keys(), backend=backend, check=False,
                         num_drafts=N)
    for check in (False, "lazy"):
        got = dyadic.verify(p, draft, _q(counts, ids), _keys(), backend=backend, check=check,
                            num_drafts=n)
        assert got.status.tolist() == [_status.NUM_DRAFTS_INVALID if r == 4 else 0
                                       for r in range(B)]
        assert got.accepted[4] == 0 and (got.tokens[4] == -1).all()
        keep = [r for r in range(B) if r != 4]
        np.testing.assert_array_equal(got.tokens[keep], good.tokens[keep])
        np.testing.assert_array_equal(got.accepted[keep], good.accepted[keep])


def test_count_beyond_int32_fails_closed_instead_of_wrapping(rng):
    p, draft, counts, ids = _case(rng, "sparse")
    n = N.astype(np.int64)
    n[2] = (1 << 32) + 1  # wraps to 1 in int32
    got = dyadic.verify(p, draft, _q(counts, ids), _keys(), check=False, num_drafts=n)
    assert got.status[2] == _status.NUM_DRAFTS_INVALID


@pytest.mark.parametrize("backend", HOST)
def test_structural_errors_name_num_drafts(backend, rng):
    p, draft, counts, ids = _case(rng, "sparse")
    q = _q(counts, ids)
    with pytest.raises(TypeError, match="num_drafts: dtype float32 is not an integer dtype"):
        dyadic.verify(p, draft, q, _keys(), backend=backend, num_drafts=N.astype(np.float32))
    with pytest.raises(TypeError, match="num_drafts: dtype bool is not an integer dtype"):
        dyadic.verify(p, draft, q, _keys(), backend=backend, num_drafts=N > 0)
    with pytest.raises(ValueError, match=r"num_drafts: shape \(6,\) must be \(B,\) = \(7,\)"):
        dyadic.verify(p, draft, q, _keys(), backend=backend, num_drafts=N[:6])
    with pytest.raises(TypeError, match="num_drafts: expected an integer array"):
        dyadic.verify(p, draft, q, _keys(), backend=backend, num_drafts=3)


@pytest.mark.parametrize("backend", HOST)
def test_check_true_validates_only_the_rows_used(backend, rng):
    p, draft, counts, ids = _case(rng, "sparse")
    hp, hd, hc, hi = _spoil(p, draft, counts, ids, N)
    dyadic.verify(hp, hd, _q(hc, hi), _keys(), backend=backend, num_drafts=N)  # no raise
    bad = hp.copy()
    bad[3, N[3], 2] = np.nan  # row 3's bonus row is used
    with pytest.raises(ValueError, match=rf"target: row 3: .*\[status "
                                         rf"{_status.TARGET_INVALID_VALUE}\]"):
        dyadic.verify(bad, hd, _q(hc, hi), _keys(), backend=backend, num_drafts=N)
    bad_d = hd.copy()
    bad_d[2, 0] = V  # row 2 verifies one draft
    with pytest.raises(ValueError, match=rf"draft: row 2: token ids must be in \[0, {V}\)"):
        dyadic.verify(hp, bad_d, _q(hc, hi), _keys(), backend=backend, num_drafts=N)
    got = dyadic.verify(hp, bad_d, _q(hc, hi), _keys(), backend=backend, check=False,
                        num_drafts=N)
    assert got.status[2] == _status.DRAFT_OUT_OF_RANGE


@pytest.mark.skipif("numba" not in dyadic.available_backends(), reason="numba unavailable")
@pytest.mark.parametrize("qkind", ["sparse"] if _SIM else ["sparse", "dense", "none"])
def test_numba_equals_cpu(qkind, rng):
    p, draft, counts, ids = _case(rng, qkind)
    hp, hd, hc, hi = _spoil(p, draft, counts, ids, N)
    n = N.astype(np.int64)
    n[5] = K + 2  # fails closed
    want = dyadic.verify(hp, hd, _q(hc, hi), _keys(), greedy=GREEDY, backend="cpu",
                         check=False, num_drafts=n)
    got = dyadic.verify(hp, hd, _q(hc, hi), _keys(), greedy=GREEDY, backend="numba",
                        check=False, num_drafts=n)
    assert want.status[5] == _status.NUM_DRAFTS_INVALID
    np.testing.assert_array_equal(got.status, want.status)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_array_equal(got.accepted, want.accepted)
