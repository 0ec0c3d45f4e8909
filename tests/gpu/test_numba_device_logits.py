"""Backend "numba" with torch CUDA tensors: allocate / propose with top_p, min_p or a
per-row top_k (sparse and dense supports) and verify(logits=True), == backend "cpu" on
the same values copied to the host, bit for bit: tokens, counts, ids, accepted and
(check=False) statuses.  Float32, float16 and bfloat16 logits (16-bit ones widened
exactly), parameters as scalars, host arrays or CUDA tensors, T = 0 rows, bias, both
policies, bad parameters failing closed.  Skips without a GPU."""

import numpy as np
import pytest

import dyadic

from conftest import cuda_torch
from test_gpu_filtered_alloc import _logits

pytestmark = pytest.mark.gpu

DTYPES = ["float32", "float16", "bfloat16"]


@pytest.fixture(scope="module")
def torch():
    torch = cuda_torch("numba")
    from numba import config
    if getattr(config, "ENABLE_CUDASIM", 0):
        pytest.skip("numba runs on the CUDA simulator: no CUDA tensors")
    return torch


def _dev(torch, a, dtype=None):
    t = torch.from_numpy(np.ascontiguousarray(a)).to("cuda")
    return t if dtype is None else t.to(getattr(torch, dtype))


def _np(a):
    return a.cpu().numpy() if hasattr(a, "cpu") else np.asarray(a)


def _filtered(primitive, x, keys, backend, kw, status):
    out = {"status": status}
    if primitive == "propose":
        tok, q = dyadic.propose(x, keys, backend=backend, check=False, out=out, **kw)
        res = {"tokens": _np(tok)}
    else:
        q = dyadic.allocate(x, logits=True, backend=backend, check=False, out=out, **kw)
        res = {}
    res.update(counts=_np(q.counts), status=_np(out["status"]))
    if q.ids is not None:
        res["ids"] = _np(q.ids)
    return res


CASES = [
    # (top_k, top_p, min_p, temperature)
    (None, 0.9, None, 0.8),
    (None, None, 0.05, [0.7, 0.0, 1.0, 2.0, 0.0, 0.5]),
    (12, 0.5, 0.02, 0.7),
    ("rows", "rows", "rows", [1.0, 0.8, 0.0, 1.2, 0.6, 1.0]),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("where", ["host", "device"])
@pytest.mark.parametrize("primitive", ["propose", "allocate"])
def test_filtered_matches_cpu(torch, dtype, case, where, primitive):
    rng = np.random.default_rng(100 * case + len(dtype))
    b, v = 6, 300
    xd = _dev(torch, _logits(rng, b, v), dtype)
    xh = xd.float().cpu().numpy()
    top_k, top_p, min_p, temp = CASES[case]
    if top_k == "rows":
        top_k = rng.integers(1, 40, b)
        top_p = rng.uniform(0.05, 1.0, b).astype(np.float32)
        min_p = rng.uniform(0.0, 0.3, b).astype(np.float32)
    if primitive == "allocate" and np.any(np.asarray(temp) == 0):
        temp = np.where(np.asarray(temp) == 0, 0.9, temp)
    temp = temp if np.ndim(temp) == 0 else np.asarray(temp, np.float64)
    keys = dyadic.Keys(seed=rng.integers(0, 2**62, b), position=rng.integers(0, 2**30, b))
    kw = dict(top_k=top_k, top_p=top_p, min_p=min_p, temperature=temp,
              policy="floor-first" if case % 2 else "standard")
    dkw = {n: (_dev(torch, a) if where == "device" and np.ndim(a) else a)
           for n, a in kw.items()}
    want = _filtered(primitive, xh, keys, "cpu", kw, np.empty(b, np.int32))
    got = _filtered(primitive, xd, keys, "numba", dkw,
                    torch.empty(b, dtype=torch.int32, device="cuda"))
    assert sorted(got) == sorted(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_filtered_bias_and_bad_parameters(torch):
    """A bias row per request; rows with top_k < 1, top_p outside (0, 1], min_p outside
    [0, 1] fail closed with cpu's status, every other row exact."""
    rng = np.random.default_rng(3)
    b, v = 6, 200
    x = _logits(rng, b, v)
    bias = rng.standard_normal((b, v)).astype(np.float32)
    kw = dict(top_k=np.array([8, 0, 8, 8, -3, 8]),
              top_p=np.array([0.9, 0.9, 0.0, 1.5, 0.9, 0.7], np.float32),
              min_p=np.array([0.0, 0.0, 0.0, 0.0, 2.0, 0.1], np.float32),
              temperature=np.array([1.0, 0.0, 0.8, 0.0, 1.0, 1.0]), bias=bias)
    keys = dyadic.Keys(seed=np.arange(b), position=11)
    want = _filtered("propose", x, keys, "cpu", kw, np.empty(b, np.int32))
    dkw = {n: _dev(torch, a) for n, a in kw.items()}
    got = _filtered("propose", _dev(torch, x), keys, "numba", dkw,
                    torch.empty(b, dtype=torch.int32, device="cuda"))
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    assert (want["status"][1:5] != 0).all() and want["status"][5] == 0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("qkind", ["dense", "sparse", "point"])
def test_verify_logits_matches_cpu(torch, dtype, qkind):
    rng = np.random.default_rng(len(dtype) + 10 * len(qkind))
    b, k, v = 6, 3, 257
    target = (3 * rng.standard_normal((b, k + 1, v))).astype(np.float32)
    target[1, 2] = np.round(target[1, 2])
    target[2, 1] = -np.inf
    td = _dev(torch, target, dtype)
    th = td.float().cpu().numpy()
    if qkind == "point":
        q = None
        draft = th[:, :k].argmax(-1).astype(np.int32)
        draft[::2, 0] = rng.integers(0, v, (b + 1) // 2)
    else:
        q = dyadic.allocate((2 * rng.standard_normal((b, k, v))).astype(np.float32),
                            logits=True, top_k=7 if qkind == "sparse" else None)
        draft = np.zeros((b, k), np.int32)
        dense = np.asarray(q.to_dense().counts)
        for r in range(b):
            for i in range(k):
                draft[r, i] = rng.choice(np.flatnonzero(dense[r, i]))
    keys = dyadic.Keys(seed=rng.integers(0, 2**62, b), position=rng.integers(0, 2**30, b))
    params = dict(temperature=np.array([0.8, 0.0, 1.0, 1.5, 0.6, 1.0]),
                  top_k=np.array([0, 5, 0, 20, 0, 1]),
                  top_p=np.array([0.9, 1.0, 0.5, 1.0, 0.95, 1.0], np.float32),
                  min_p=np.array([0.0, 0.0, 0.1, 0.0, 0.02, 0.0], np.float32))
    nd = np.array([3, 0, 2, 3, 1, 3], np.int32)
    want = dyadic.verify(th, draft, q, keys, backend="cpu", check=False, logits=True,
                         num_drafts=nd, **params)
    qd = None if q is None else dyadic.Dyadic(
        _dev(torch, np.asarray(q.counts)),
        None if q.ids is None else _dev(torch, np.asarray(q.ids)), vocab_size=q.vocab_size,
        policy=q.policy)
    got = dyadic.verify(td, _dev(torch, draft), qd, keys, backend="numba", check=False,
                        logits=True, num_drafts=_dev(torch, nd),
                        **{n: _dev(torch, a) for n, a in params.items()})
    for name in ("status", "accepted", "tokens"):
        np.testing.assert_array_equal(_np(getattr(got, name)), getattr(want, name),
                                      err_msg=name)
