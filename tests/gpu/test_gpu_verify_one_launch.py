"""verify with check=False / True and no greedy request on the CUDA backend: one launch
(dc_vone, verify_fused.cuh) for small grids in place of dc_v1 + dc_v2.

GPU tests (skip without CuPy + torch CUDA): on valid input dc_vone, the two launches and
the CPU backend give the same accepted counts and tokens; on invalid input dc_vone gives
the statuses of the two launches (the first invalid row in order, then a draft id out of
range, then the first draft with q(d) = 0) and fails only those requests closed, bit for bit with the two launches; both
check=True paths raise the same message; the host picks dc_vone where its grid fits one
wave (DYADIC_CUDA_VONE=1 forces it, =0 never).
"""

import numpy as np
import pytest

import dyadic
from dyadic import _status

from conftest import cuda_torch, random_target as _target


@pytest.fixture
def cb():
    cuda_torch()
    from dyadic.backends.cuda import cupy_backend
    cupy_backend._PLANS.clear()
    yield cupy_backend
    cupy_backend._PLANS.clear()


def _verify(cb, monkeypatch, mode, p, draft, q, keys, check=False):
    """Outputs (accepted, tokens, status) of backend "cuda" with DYADIC_CUDA_VONE=mode."""
    import torch
    monkeypatch.setattr(cb, "_VONE_MODE", mode)
    cb._PLANS.clear()
    r = dyadic.verify(torch.from_numpy(p).cuda(), torch.from_numpy(draft).cuda(), q, keys,
                      backend="cuda", check=check)
    st = np.zeros(p.shape[0], np.int32) if r.status is None else r.status.cpu().numpy()
    return r.accepted.cpu().numpy(), r.tokens.cpu().numpy(), st


def _q(rng, p, qkind, k, zero_frac=0.0):
    """Drafts and q for target p: dense / top-32 q from noisy log p (a fraction of zero
    weights when zero_frac), or None (point mass)."""
    b, _, v = p.shape
    if qkind == "point":
        return rng.integers(0, v, size=(b, k)).astype(np.int32), None
    w = np.maximum(p[:, :k].reshape(b * k, v), 1e-30) * np.exp(
        rng.standard_normal((b * k, v)) * 0.5).astype(np.float32)
    if zero_frac:
        w[rng.random(w.shape) < zero_frac] = 0
    q = dyadic.allocate(w.astype(np.float32), top_k=None if qkind == "dense" else 32,
                        backend="cpu")
    keys_q = dyadic.Keys(seed=11, position=np.arange(b * k))
    draft = np.asarray(dyadic.draw(q, keys_q, backend="cpu")).reshape(b, k).astype(np.int32)
    q = dyadic.Dyadic(np.asarray(q.counts).reshape(b, k, -1),
                      None if q.ids is None else np.asarray(q.ids).reshape(b, k, -1), vocab_size=v)
    return draft, q


def _keys(rng, b):
    return dyadic.Keys(seed=rng.integers(0, 2**63, size=b), generation=4, round=1,
                       position=rng.integers(0, 2**20, size=b))


@pytest.mark.gpu
@pytest.mark.parametrize("v", [1, 2, 111, 4097, 129280])
@pytest.mark.parametrize("b", [1, 3, 4])
@pytest.mark.parametrize("k", [1, 5, 7])
@pytest.mark.parametrize("qkind", ["dense", "sparse", "point"])
def test_one_launch_parity(cb, monkeypatch, v, b, k, qkind):
    rng = np.random.default_rng(v + 10 * b + 100 * k + len(qkind))
    p = _target(rng, b, k + 1, v)
    draft, q = _q(rng, p, qkind, k)
    keys = _keys(rng, b)
    one = _verify(cb, monkeypatch, "1", p, draft, q, keys)
    assert bool(cb._PLANS.get(("verify_one", cb._device_id(), b, k + 1, v)))
    two = _verify(cb, monkeypatch, "0", p, draft, q, keys)
    assert not cb._PLANS.get(("verify_one", cb._device_id(), b, k + 1, v))
    ref = dyadic.verify(p, draft, q, keys, backend="cpu")
    for a, c in zip(one, two):
        np.testing.assert_array_equal(a, c)
    np.testing.assert_array_equal(one[0], ref.accepted)
    np.testing.assert_array_equal(one[1], ref.tokens)
    np.testing.assert_array_equal(one[2], np.zeros(b, np.int32))


def _broken(rng, qkind, v=4097, k=5):
    """Eight requests, each with its own defect (expected status per request)."""
    b = 8
    p = _target(rng, b, k + 1, v)
    draft, q = _q(rng, p, qkind, k, zero_frac=0.3 if qkind == "dense" else 0.0)
    want = [_status.OK] * b
    # 1: NaN in row 0 away from the draft
    p[1, 0, (draft[1, 0] + 7) % v] = np.nan
    want[1] = _status.TARGET_INVALID_VALUE
    # 2: row 1's sum halved, row 3 has +inf: the first invalid row decides
    p[2, 1] *= 0.5
    p[2, 3, 5] = np.inf
    want[2] = _status.TARGET_SUM
    # 3: a draft id at V (after the first test, whatever it decides)
    draft[3, 2] = v
    want[3] = _status.DRAFT_OUT_OF_RANGE
    # 4: a draft where q is zero (dense: a zero count; sparse: outside the support)
    if q is not None:
        row = np.asarray(q.counts)[4, 1] if q.ids is None else None
        if row is not None:
            draft[4, 1] = int(np.flatnonzero(row == 0)[0])
        else:
            ids = set(np.asarray(q.ids)[4, 1].tolist())
            draft[4, 1] = next(i for i in range(v) if i not in ids)
        want[4] = _status.Q_ZERO_AT_DRAFT
    # 5: the bonus row (never read by a lazy chain that rejects early) has a negative value
    p[5, k, 3] = -p[5, k, 3]
    want[5] = _status.TARGET_INVALID_VALUE
    # 6: a row with a negative value and a draft out of range: rows first
    p[6, 2, 9] = -0.25
    draft[6, 0] = -1
    want[6] = _status.TARGET_INVALID_VALUE
    # 7: valid
    return p, draft, q, want


@pytest.mark.gpu
@pytest.mark.parametrize("qkind", ["dense", "sparse", "point"])
def test_one_launch_fails_closed_as_two_launches(cb, monkeypatch, qkind):
    rng = np.random.default_rng(31 + len(qkind))
    p, draft, q, want = _broken(rng, qkind)
    keys = _keys(rng, p.shape[0])
    one = _verify(cb, monkeypatch, "1", p, draft, q, keys)
    two = _verify(cb, monkeypatch, "0", p, draft, q, keys)
    for a, c in zip(one, two):
        np.testing.assert_array_equal(a, c)
    acc, tok, st = one
    assert st.tolist() == want
    bad = np.array(want) != 0
    assert (tok[bad] == -1).all() and (acc[bad] == 0).all()
    good = ~bad  # the valid requests alone give the same results
    ref = dyadic.verify(p[good], draft[good], None if q is None else dyadic.Dyadic(
        np.asarray(q.counts)[good], None if q.ids is None else np.asarray(q.ids)[good],
        vocab_size=p.shape[-1]), dyadic.Keys(seed=np.asarray(keys.seed)[good], generation=4,
                                             round=1, position=np.asarray(keys.position)[good]),
        backend="cpu")
    np.testing.assert_array_equal(acc[good], ref.accepted)
    np.testing.assert_array_equal(tok[good], ref.tokens)


@pytest.mark.gpu
def test_one_launch_check_true_raises_as_two_launches(cb, monkeypatch):
    rng = np.random.default_rng(8)
    p, draft, q, _ = _broken(rng, "dense")
    keys = _keys(rng, p.shape[0])
    msgs = []
    for mode in ("1", "0"):
        with pytest.raises(ValueError) as e:
            _verify(cb, monkeypatch, mode, p, draft, q, keys, check=True)
        msgs.append(str(e.value))
    assert msgs[0] == msgs[1]


@pytest.mark.gpu
@pytest.mark.parametrize("mode, taken", [("auto", True), ("0", False), ("1", True)])
def test_one_launch_route(cb, monkeypatch, mode, taken):
    """B = 1 at V = 129280 (the benchmark's small batch): dc_vone unless switched off;
    a greedy request keeps the two launches (dc_v1 decides greedy requests)."""
    import torch
    rng = np.random.default_rng(2)
    p = _target(rng, 1, 6, 129280)
    draft, q = _q(rng, p, "dense", 5)
    keys = _keys(rng, 1)
    _verify(cb, monkeypatch, mode, p, draft, q, keys)
    key = ("verify_one", cb._device_id(), 1, 6, 129280)
    assert bool(cb._PLANS.get(key)) == taken
    cb._PLANS.clear()
    dyadic.verify(torch.from_numpy(p).cuda(), torch.from_numpy(draft).cuda(), q, keys,
                  greedy=torch.ones(1, dtype=torch.bool, device="cuda"), backend="cuda",
                  check=False)
    assert key not in cb._PLANS


@pytest.mark.gpu
@pytest.mark.parametrize("b, v", [(8, 129280), (16, 32000), (32, 4097)])
@pytest.mark.parametrize("qkind", ["dense", "sparse"])
def test_one_launch_parity_larger_batches(cb, monkeypatch, b, v, qkind):
    """Larger batches that the automatic choice still gives dc_vone (tiles of up to
    16384 ids at V = 129280), against the two launches and the CPU backend."""
    rng = np.random.default_rng(b + v)
    k = 5
    p = _target(rng, b, k + 1, v)
    draft, q = _q(rng, p, qkind, k)
    keys = _keys(rng, b)
    one = _verify(cb, monkeypatch, "auto", p, draft, q, keys)
    assert cb._PLANS.get(("verify_one", cb._device_id(), b, k + 1, v))
    two = _verify(cb, monkeypatch, "0", p, draft, q, keys)
    ref = dyadic.verify(p, draft, q, keys, backend="cpu")
    for a, c in zip(one, two):
        np.testing.assert_array_equal(a, c)
    np.testing.assert_array_equal(one[1], ref.tokens)


@pytest.mark.gpu
@pytest.mark.parametrize("v", [1, 111, 4097])
def test_one_launch_no_drafts(cb, monkeypatch, v):
    """k = 0 (only the bonus row): dc_vone, the two launches and the CPU backend agree."""
    rng = np.random.default_rng(v)
    b = 3
    p = _target(rng, b, 1, v)
    draft = np.zeros((b, 0), np.int32)
    keys = _keys(rng, b)
    one = _verify(cb, monkeypatch, "1", p, draft, None, keys)
    two = _verify(cb, monkeypatch, "0", p, draft, None, keys)
    ref = dyadic.verify(p, draft, None, keys, backend="cpu")
    for a, c in zip(one, two):
        np.testing.assert_array_equal(a, c)
    np.testing.assert_array_equal(one[1], ref.tokens)
    np.testing.assert_array_equal(one[0], ref.accepted)
