"""backend="cuda": verify(logits=True) and allocate / propose with top_p, min_p ==
the CPU backend, bit for bit, for host arrays and torch CUDA tensors (float32,
float16, bfloat16 logits; per-request parameters; greedy requests mixed in; bad
requests failing closed).  Runs where CuPy and a GPU are present; skips with the
reason otherwise."""

import numpy as np
import pytest

import dyadic

from conftest import _load, cuda_torch

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cuda():
    be, why = _load("cuda")
    if be is None:
        pytest.skip(why)
    return "cuda"


def _case(rng, b, k, v):
    target = (rng.standard_normal((b, k + 1, v)) * 3).astype(np.float32)
    target[0, :, : v // 2] = -np.inf
    target[1 % b] = np.round(target[1 % b])
    x = (rng.standard_normal((b, k, v)) * 2).astype(np.float32)
    q = dyadic.allocate(x, logits=True, top_k=32)
    dense = np.asarray(q.to_dense().counts)
    draft = np.zeros((b, k), np.int32)
    for r in range(b):
        for i in range(k):
            draft[r, i] = rng.choice(np.flatnonzero(dense[r, i]))
    keys = dyadic.Keys(seed=rng.integers(0, 2**63, size=b), generation=1, round=2,
                       position=np.arange(b, dtype=np.uint32))
    params = dict(temperature=rng.choice([0.0, 0.6, 1.0, 1.7], size=b),
                  top_k=rng.choice([0, 1, 20, 50], size=b),
                  top_p=rng.choice([1.0, 0.95, 0.5], size=b),
                  min_p=rng.choice([0.0, 0.05, 0.3], size=b))
    return target, draft, q, keys, params


def _same_verdict(a, b):
    for name in ("accepted", "tokens", "status"):
        x, y = getattr(a, name), getattr(b, name)
        np.testing.assert_array_equal(np.asarray(x.cpu() if hasattr(x, "cpu") else x),
                                      np.asarray(y))


@pytest.mark.parametrize("v", [111, 4099, 129280])
def test_verify_logits_host_arrays(cuda, v):
    rng = np.random.default_rng(v)
    target, draft, q, keys, params = _case(rng, 8, 3, v)
    got = dyadic.verify(target, draft, q, keys, backend=cuda, logits=True, check=False,
                        **params)
    want = dyadic.verify(target, draft, q, keys, backend="cpu", logits=True, check=False,
                         **params)
    _same_verdict(got, want)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_verify_logits_device_tensors(cuda, dtype):
    torch = cuda_torch()
    rng = np.random.default_rng(3)
    target, draft, q, keys, params = _case(rng, 6, 2, 32000)
    t = torch.from_numpy(target).to(getattr(torch, dtype))
    host = t.float().numpy()
    qd = dyadic.Dyadic(torch.from_numpy(np.asarray(q.counts)).cuda(),
                       torch.from_numpy(np.asarray(q.ids)).cuda(), vocab_size=32000)
    got = dyadic.verify(t.cuda(), torch.from_numpy(draft).cuda(), qd, keys, backend=cuda,
                        logits=True, check=False, **params)
    want = dyadic.verify(host, draft, q, keys, backend="cpu", logits=True, check=False,
                         **params)
    _same_verdict(got, want)


def test_verify_logits_fail_closed(cuda):
    rng = np.random.default_rng(4)
    target, draft, q, keys, params = _case(rng, 6, 1, 500)
    params["temperature"] = np.array([1.0, -1.0, 1.0, 1.0, 1.0, 1.0])
    params["top_p"] = np.array([1.0, 1.0, 2.0, 1.0, 1.0, 1.0])
    target[3, 1, 7] = np.nan
    target[4, 0] = -np.inf
    got = dyadic.verify(target, draft, q, keys, backend=cuda, logits=True, check=False,
                        **params)
    want = dyadic.verify(target, draft, q, keys, backend="cpu", logits=True, check=False,
                         **params)
    _same_verdict(got, want)


@pytest.mark.parametrize("top_k", [None, 32, np.array([1, 5, 32, 7, 2, 32])])
def test_filtered_allocate_and_propose(cuda, top_k):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((6, 4099)) * 3).astype(np.float32)
    kw = dict(top_k=top_k, top_p=rng.choice([1.0, 0.9, 0.4], size=6),
              min_p=rng.choice([0.0, 0.02], size=6), check=False)
    a = dyadic.allocate(x, logits=True, backend=cuda, **kw)
    b = dyadic.allocate(x, logits=True, backend="cpu", **kw)
    np.testing.assert_array_equal(np.asarray(a.counts), np.asarray(b.counts))
    keys = dyadic.Keys(seed=np.arange(6, dtype=np.uint64))
    ta, qa = dyadic.propose(x, keys, backend=cuda, temperature=[1.0, 0.0, 0.7, 1.0, 2.0, 1.0],
                            **kw)
    tb, qb = dyadic.propose(x, keys, backend="cpu", temperature=[1.0, 0.0, 0.7, 1.0, 2.0, 1.0],
                            **kw)
    np.testing.assert_array_equal(np.asarray(ta), np.asarray(tb))
    np.testing.assert_array_equal(np.asarray(qa.counts), np.asarray(qb.counts))
