"""verify(logits=True) on backend="numba" == the reference (and the CPU backend), bit for bit.

Without a GPU, tests/conftest.py runs numba on the CUDA simulator: small sizes,
adversarial rows (ties, -inf, gaps past the exponential's cutoff, subnormals),
per-request parameters with greedy requests mixed in, bad requests failing closed.
On a GPU the same bodies run on the device, plus a larger size.
"""

import numpy as np
import pytest

from test_numba_sim import NUMBA, WHY

import dyadic
from dyadic import _status

pytestmark = pytest.mark.skipif(NUMBA is None, reason=str(WHY))


def _simulator():
    from numba import config
    return bool(getattr(config, "ENABLE_CUDASIM", 0))


def rows(rng, n, v):
    out = []
    for i in range(n):
        kind = i % 6
        if kind == 0:
            x = rng.standard_normal(v) * 3
        elif kind == 1:
            x = np.round(rng.standard_normal(v) * 2)
        elif kind == 2:
            x = rng.standard_normal(v) * 3
            x[rng.random(v) < 0.5] = -np.inf
        elif kind == 3:
            x = rng.standard_normal(v) * 40
        elif kind == 4:
            x = np.frombuffer(rng.integers(0, 0x00800000, v, dtype=np.uint32).tobytes(),
                              np.float32).astype(np.float64)
        else:
            x = np.zeros(v)
        if np.isneginf(x).all():
            x[0] = 0.0
        out.append(x)
    return np.array(out, np.float32)


def case(rng, b, k, v, qkind):
    target = rows(rng, b * (k + 1), v).reshape(b, k + 1, v)
    rng.shuffle(target.reshape(-1, v))
    if qkind == "point":
        q = None
        draft = rng.integers(0, v, size=(b, k)).astype(np.int32)
        am = np.argmax(target[:, :k], axis=2)
        draft = np.where(rng.random((b, k)) < 0.5, am, draft).astype(np.int32)
    else:
        x = (rng.standard_normal((b, k, v)) * 2).astype(np.float32)
        q = dyadic.allocate(x, logits=True, top_k=3 if qkind == "sparse" else None,
                            backend="reference")
        dense = np.asarray(q.to_dense().counts)
        draft = np.zeros((b, k), np.int32)
        for r in range(b):
            for i in range(k):
                draft[r, i] = rng.choice(np.flatnonzero(dense[r, i]))
    keys = dyadic.Keys(seed=rng.integers(0, 2**64, size=b, dtype=np.uint64),
                       generation=3, round=rng.integers(0, 2**32, size=b, dtype=np.uint64)
                       .astype(np.uint32), position=np.arange(b, dtype=np.uint32) * 5)
    params = dict(temperature=rng.choice([0.0, 0.4, 1.0, 2.0], size=b),
                  top_k=rng.choice([0, 1, 2, v + 1], size=b),
                  top_p=rng.choice([1.0, 0.9, 0.4, 1e-3], size=b),
                  min_p=rng.choice([0.0, 0.1, 0.6, 1.0], size=b))
    return target, draft, q, keys, params


def same(target, draft, q, keys, params, other="reference"):
    got = dyadic.verify(target, draft, q, keys, backend="numba", check=False, logits=True,
                        **params)
    want = dyadic.verify(target, draft, q, keys, backend=other, check=False, logits=True,
                         **params)
    np.testing.assert_array_equal(got.status, want.status)
    np.testing.assert_array_equal(got.accepted, want.accepted)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    return got


@pytest.mark.parametrize("qkind", ["dense", "sparse", "point"])
def test_numba_equals_reference(qkind):
    rng = np.random.default_rng(len(qkind))
    target, draft, q, keys, params = case(rng, 8, 2, 13, qkind)
    got = same(target, draft, q, keys, params)
    assert (got.status == 0).all()


def test_numba_bad_requests_fail_closed():
    rng = np.random.default_rng(4)
    target, draft, q, keys, params = case(rng, 8, 1, 7, "dense")
    params["temperature"] = np.array([1.0, -1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.5])
    params["top_k"] = np.array([0, 0, -1, 0, 0, 0, 0, 0])
    params["top_p"] = np.array([1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    params["min_p"] = np.array([0.0, 0.0, 0.0, 0.0, 1.5, 0.0, 0.0, 0.0])
    target[5, 0, 1] = np.nan
    target[6, 1] = -np.inf
    draft[0, 0] = 7
    got = same(target, draft, q, keys, params)
    assert got.status.tolist() == [
        _status.DRAFT_OUT_OF_RANGE, _status.TEMPERATURE_INVALID, _status.TOP_K_INVALID,
        _status.TOP_P_INVALID, _status.MIN_P_INVALID, _status.TARGET_INVALID_VALUE,
        _status.TARGET_ZERO_MASS, 0]
    assert (got.tokens[:7] == -1).all()


def test_numba_ties_at_the_boundaries():
    row = np.array([0.0, 2.0, 2.0, 1.0, 2.0, 2.0, -np.inf, 1.0], np.float32)
    b = 8
    target = np.tile(row, (b, 2, 1))
    draft = np.full((b, 1), 5, np.int32)
    keys = dyadic.Keys(seed=np.arange(b, dtype=np.uint64) + 1)
    params = dict(top_k=np.array([1, 2, 3, 5, 0, 0, 0, 2]),
                  top_p=np.array([1, 1, 1, 1, 0.25, 0.26, 0.75, 0.6], np.float32))
    same(target, draft, None, keys, params)


@pytest.mark.skipif("_simulator()", reason="a larger size runs on a GPU only")
@pytest.mark.gpu
def test_numba_gpu_larger():
    rng = np.random.default_rng(12)
    target, draft, q, keys, params = case(rng, 16, 3, 4099, "sparse")
    same(target, draft, q, keys, params, other="cpu")


COMPILED = r'''
import sys
import numpy as np
sys.path.insert(0, REPO)
import numba
import numba.cuda
from numba.core.registry import CPUDispatcher
_cuda_jit = numba.cuda.jit
def _jit_on_cpu(*args, **kwargs):
    """cuda.jit(device=True) -> numba.njit (as tests/gpu/test_numba_compiled_core.py)."""
    if not args and kwargs == {"device": True}:
        return numba.njit
    return _cuda_jit(*args, **kwargs)
numba.cuda.jit = _jit_on_cpu
from backends.cuda.numba import logits as L
from dyadic.reference import target_logits

assert isinstance(L.processed_row, CPUDispatcher), "switch not active"
rng = np.random.default_rng(5)
fails = 0
for trial in range(60):
    v = int(rng.integers(1, 40))
    x = rng.standard_normal(v) * [3, 40, 0.01][trial % 3]
    if trial % 4 == 1:
        x = np.round(x)
    if trial % 5 == 2:
        x[rng.random(v) < 0.4] = -np.inf
        x[0] = 0.0
    xf = np.asarray(x, np.float32).reshape(1, 1, v)
    t = float(rng.choice([0.3, 1.0, 2.5]))
    top_k = int(rng.choice([0, 1, 3, v + 2]))
    pb = target_logits.param_bits(float(rng.choice([1.0, 0.9, 0.5, 1e-3])))
    mb = target_logits.param_bits(float(rng.choice([0.0, 0.05, 0.5, 1.0])))
    P = np.zeros((1, v), np.uint64)
    KEY = np.zeros((1, v), np.uint64)
    ID = np.zeros((1, v), np.int32)
    IDX = np.zeros((1, v), np.int32)
    hist = np.zeros(256, np.uint64)
    st, total, arg = L.processed_row(xf, 0, 0, v, t, np.int64(top_k), np.uint64(pb),
                                     np.uint64(mb), P, KEY, ID, IDX, hist, 0,
                                     np.zeros((1, v), np.float32), False, 0)
    want = target_logits.weights_row(xf[0, 0].tolist(), t, top_k, pb, mb)
    got = (st, [int(p) for p in P[0]], int(total), arg)
    if got != want:
        fails += 1
        print("MISMATCH", x.tolist(), t, top_k, pb, mb, got, want)
    ok = L.params_status(t, np.int64(top_k), np.uint64(pb), np.uint64(mb))
    assert ok == target_logits.params_status(t, top_k, pb, mb)
    # allocate with filters: dense and sparse, both policies
    from dyadic.reference import allocation
    for width, policy in ((0, 0), (0, 1), (max(1, min(top_k, v)), 0), (max(1, min(top_k, v)), 1)):
        kf = top_k if not width else max(1, top_k)
        counts = np.zeros((1, width or v), np.uint32)
        ids = np.zeros((1, max(width, 1)), np.int32)
        tokens = np.zeros(1, np.int32)
        z64, z32 = np.zeros(1, np.uint64), np.zeros(1, np.uint32)
        st = L.filtered_row(xf, np.zeros((1, v), np.float32), False, np.array([t]),
                            np.array([kf], np.int64), np.array([pb], np.uint32),
                            np.array([mb], np.uint32), policy, width, 0, z64, z32, z32, z32,
                            tokens, counts, ids, P, KEY, ID, IDX, hist, 0, 0)
        wst, row = allocation.allocate_filtered_row(
            xf[0, 0].tolist(), None, t, min(kf, width) if width else kf, not width,
            ["standard", "floor-first"][policy], pb, mb)
        if width:
            got_row = [(int(i), int(c)) for i, c in zip(ids[0], counts[0]) if i >= 0]
        else:
            got_row = [int(c) for c in counts[0]]
        if (st, got_row if st == 0 else None) != (wst, row):
            fails += 1
            print("ALLOC MISMATCH", x.tolist(), t, kf, width, policy, st, got_row, wst, row)
print("FAILS", fails)
'''


def test_compiled_processed_row_equals_reference():
    """The logits device functions compiled by numba (cuda.jit(device=True) standing for
    numba.njit in a fresh interpreter: numba's typing, not the simulator's Python) ==
    the reference on adversarial rows."""
    import os
    import subprocess
    import sys
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ)
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    r = subprocess.run([sys.executable, "-c", f"REPO = {repo!r}\n" + COMPILED], env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "FAILS 0" in r.stdout, r.stdout[-3000:]


@pytest.mark.parametrize("top_k", [None, 3, np.array([1, 2, 4, 4, 3, 1])])
@pytest.mark.parametrize("policy", ["standard", "floor-first"])
def test_numba_filtered_allocate_and_propose(top_k, policy):
    rng = np.random.default_rng(21)
    b, v = 6, 11
    x = rows(rng, b, v)
    bias = (rng.standard_normal(v) * 0.3).astype(np.float32)
    kw = dict(top_k=top_k, policy=policy, check=False,
              top_p=rng.choice([1.0, 0.8, 0.3], size=b), min_p=rng.choice([0.0, 0.1], size=b))
    for backend_kw in (dict(temperature=rng.choice([0.5, 1.0, 2.0], size=b)), dict(bias=bias)):
        got = dyadic.allocate(x, logits=True, backend="numba", **kw, **backend_kw)
        want = dyadic.allocate(x, logits=True, backend="reference", **kw, **backend_kw)
        np.testing.assert_array_equal(got.counts, want.counts)
        if want.ids is not None:
            np.testing.assert_array_equal(got.ids, want.ids)
    keys = dyadic.Keys(seed=rng.integers(0, 2**63, size=b), position=3)
    temp = np.array([1.0, 0.0, 0.7, 1.0, 0.0, 1.5])
    t1, q1 = dyadic.propose(x, keys, backend="numba", temperature=temp, **kw)
    t2, q2 = dyadic.propose(x, keys, backend="reference", temperature=temp, **kw)
    np.testing.assert_array_equal(t1, t2)
    np.testing.assert_array_equal(q1.counts, q2.counts)


def test_numba_filtered_fail_closed():
    rng = np.random.default_rng(22)
    x = rows(rng, 4, 6)
    x[3, 2] = np.nan
    out_n = {"status": np.zeros(4, np.int32)}
    out_r = {"status": np.zeros(4, np.int32)}
    kw = dict(top_k=np.array([2, -1, 3, 3]), top_p=np.array([1.0, 1.0, 2.0, 1.0]), check=False)
    qn = dyadic.allocate(x, logits=True, backend="numba", out=out_n, **kw)
    qr = dyadic.allocate(x, logits=True, backend="reference", out=out_r, **kw)
    assert out_n["status"].tolist() == out_r["status"].tolist() == [
        0, _status.TOP_K_INVALID, _status.TOP_P_INVALID, _status.X_NAN]
    np.testing.assert_array_equal(qn.counts, qr.counts)
    np.testing.assert_array_equal(qn.ids, qr.ids)


def test_numba_num_drafts():
    rng = np.random.default_rng(33)
    target, draft, q, keys, params = case(rng, 6, 2, 9, "sparse")
    n = np.array([0, 2, 1, -1, 3, 2], np.int32)
    target[0, 1:] = np.nan
    target[2, 2] = np.nan
    params["num_drafts"] = n
    got = same(target, draft, q, keys, params)
    assert got.status.tolist()[3:5] == [_status.NUM_DRAFTS_INVALID] * 2
