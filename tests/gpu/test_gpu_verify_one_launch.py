"""verify with check=False / True and no greedy request on the CUDA backend: one launch
(verify_one_launch, kernels/verify_one_launch.cuh) where its grid fits, in place of
verify_chain + verify_residual (backends/cuda/cupy/routes.py).

GPU tests (skip without CuPy + torch CUDA), at shapes the one launch serves: on valid
input it gives the accepted counts and tokens of the CPU backend and of the two launches
(the same call with greedy flags all False, which takes the two launches); on invalid
input the statuses of the two launches (the first invalid row in order, then a draft id
out of range, then the first draft with q(d) = 0), failing only those requests closed;
both check=True routes raise the same message.
"""

import numpy as np
import pytest

import dyadic
from dyadic import _status

from conftest import cuda_torch, random_target as _target


@pytest.fixture
def cb():
    cuda_torch()


def _verify(p, draft, q, keys, check=False, two=False):
    """Outputs (accepted, tokens, status) of backend "cuda": without greedy flags (one
    launch where its grid fits), or with ``two`` greedy flags all False (the two launches)."""
    import torch
    b = p.shape[0]
    g = torch.zeros(b, dtype=torch.bool, device="cuda") if two else None
    r = dyadic.verify(torch.from_numpy(p).cuda(), torch.from_numpy(draft).cuda(), q, keys,
                      greedy=g, backend="cuda", check=check)
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
def test_one_launch_parity(cb, v, b, k, qkind):
    rng = np.random.default_rng(v + 10 * b + 100 * k + len(qkind))
    p = _target(rng, b, k + 1, v)
    draft, q = _q(rng, p, qkind, k)
    keys = _keys(rng, b)
    one = _verify(p, draft, q, keys)
    two = _verify(p, draft, q, keys, two=True)
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
def test_one_launch_fails_closed_as_two_launches(cb, qkind):
    rng = np.random.default_rng(31 + len(qkind))
    p, draft, q, want = _broken(rng, qkind)
    keys = _keys(rng, p.shape[0])
    one = _verify(p, draft, q, keys)
    two = _verify(p, draft, q, keys, two=True)
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
def test_one_launch_check_true_raises_as_two_launches(cb):
    rng = np.random.default_rng(8)
    p, draft, q, _ = _broken(rng, "dense")
    keys = _keys(rng, p.shape[0])
    msgs = []
    for two in (False, True):
        with pytest.raises(ValueError) as e:
            _verify(p, draft, q, keys, check=True, two=two)
        msgs.append(str(e.value))
    assert msgs[0] == msgs[1]


@pytest.mark.gpu
@pytest.mark.parametrize("b, v", [(8, 129280), (16, 32000), (32, 4097)])
@pytest.mark.parametrize("qkind", ["dense", "sparse"])
def test_one_launch_parity_larger_batches(cb, b, v, qkind):
    """Larger batches that verify_one_launch still serves (verify_lazy's tiles, up to
    16384 ids at V = 129280), against the two launches and the CPU backend."""
    rng = np.random.default_rng(b + v)
    k = 5
    p = _target(rng, b, k + 1, v)
    draft, q = _q(rng, p, qkind, k)
    keys = _keys(rng, b)
    one = _verify(p, draft, q, keys)
    two = _verify(p, draft, q, keys, two=True)
    ref = dyadic.verify(p, draft, q, keys, backend="cpu")
    for a, c in zip(one, two):
        np.testing.assert_array_equal(a, c)
    np.testing.assert_array_equal(one[1], ref.tokens)


@pytest.mark.gpu
@pytest.mark.parametrize("v", [1, 111, 4097])
def test_one_launch_no_drafts(cb, v):
    """k = 0 (only the bonus row): verify_one_launch, the two launches and the CPU backend agree."""
    rng = np.random.default_rng(v)
    b = 3
    p = _target(rng, b, 1, v)
    draft = np.zeros((b, 0), np.int32)
    keys = _keys(rng, b)
    one = _verify(p, draft, None, keys)
    two = _verify(p, draft, None, keys, two=True)
    ref = dyadic.verify(p, draft, None, keys, backend="cpu")
    for a, c in zip(one, two):
        np.testing.assert_array_equal(a, c)
    np.testing.assert_array_equal(one[1], ref.tokens)
    np.testing.assert_array_equal(one[0], ref.accepted)
