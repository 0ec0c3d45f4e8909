"""backend="numba" on a real GPU == the CPU backend (or the reference), bit for bit.

The bodies are those of tests/gpu/test_numba_sim.py at the issue's sizes
(V up to 129280, B up to 64).  Skips with the reason where there is no GPU or
where numba runs the simulator.  The comparison backend is "cpu" where the
compiled extension loads, else "reference" (then only the sizes the pure-Python
reference finishes in reasonable time).
"""

import numpy as np
import pytest

from test_numba_sim import (NUMBA, WHY, adversarial_logits, adversarial_probs, chain_case,
                            check_allocate, check_draw, check_propose, check_verify,
                            host_backend, keys_for)


def _reason():
    if NUMBA is None:
        return str(WHY)
    from numba import config
    if getattr(config, "ENABLE_CUDASIM", 0):
        return "numba runs the CUDA simulator here (no GPU): see tests/gpu/test_numba_sim.py"
    return None


REASON = _reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=str(REASON))]
OTHER = host_backend() if REASON is None else "reference"


def _size_ok(b, v):
    if OTHER == "reference" and b * v > 100_000:
        pytest.skip("the CPU backend is not built here; the pure-Python reference is too "
                    f"slow for B={b}, V={v}")


def test_gpu_philox_many():
    import dyadic
    rng = np.random.default_rng(1)
    c = rng.integers(0, 2 ** 32, size=(100_000, 4), dtype=np.uint64)
    k = rng.integers(0, 2 ** 32, size=(100_000, 2), dtype=np.uint64)
    a = dyadic.philox4x32(c, k, backend="numba")
    b = dyadic.philox4x32(c[:2000], k[:2000], backend="reference")
    np.testing.assert_array_equal(a[:2000], b)


@pytest.mark.parametrize("v", [111, 4097, 32000, 129280])
@pytest.mark.parametrize("top_k", [None, 1, 32, 256])
@pytest.mark.parametrize("policy", ["standard", "floor-first"])
def test_gpu_allocate_logits(v, top_k, policy):
    rng = np.random.default_rng(v + (top_k or 0))
    x = adversarial_logits(rng, v)
    _size_ok(x.shape[0], v)
    temp = rng.choice([0.5, 1.0, 1.7], size=x.shape[0])
    check_allocate(x, OTHER, logits=True, temperature=temp, top_k=top_k, policy=policy)


@pytest.mark.parametrize("v", [111, 4097, 129280])
@pytest.mark.parametrize("top_k", [None, 32])
def test_gpu_allocate_probs(v, top_k):
    rng = np.random.default_rng(7 * v)
    x = adversarial_probs(rng, v)
    _size_ok(x.shape[0], v)
    check_allocate(x, OTHER, top_k=top_k)


@pytest.mark.parametrize("b", [1, 3, 64])
@pytest.mark.parametrize("v", [2, 111, 32000, 129280])
@pytest.mark.parametrize("top_k", [None, 1, 32, 256])
def test_gpu_propose_and_draw(b, v, top_k):
    _size_ok(b, v)
    rng = np.random.default_rng(b * 1000 + v)
    x = (rng.normal(size=(b, v)) * 3).astype(np.float32)
    temp = rng.choice([0.0, 0.7, 1.0], size=b)
    keys = keys_for(rng, b)
    res = check_propose(x, keys, OTHER, temperature=temp, top_k=top_k)
    from dyadic._types import Dyadic
    check_draw(Dyadic(res[2], res[3], vocab_size=v), keys, OTHER)


@pytest.mark.parametrize("b", [1, 3, 64])
@pytest.mark.parametrize("v", [111, 4097, 129280])
@pytest.mark.parametrize("k", [1, 5, 8])
@pytest.mark.parametrize("qkind", ["dense", "sparse", "none"])
def test_gpu_verify(b, v, k, qkind):
    _size_ok(b * (k + 1), v)
    rng = np.random.default_rng(b + v + k)
    target, draft, q = chain_case(rng, b, k, v, top_k=32, sparse_q=qkind == "sparse")
    if qkind == "none":
        q = None
        draft = np.argmax(target[:, :k], axis=-1).astype(np.int32)
    check_verify(target, draft, q, keys_for(rng, b), other=OTHER)
    greedy = rng.random(b) < 0.5
    check_verify(target, draft, q, keys_for(rng, b), greedy=greedy, other=OTHER)


def test_gpu_device_arrays_in_and_out():
    """Device arrays (__cuda_array_interface__) in and out give the NumPy path's results."""
    from numba import cuda

    from dyadic import _backend
    be = _backend.get("numba")
    rng = np.random.default_rng(5)
    b, v, top_k = 3, 4097, 32
    x = (rng.normal(size=(b, v)) * 2).astype(np.float32)
    temp = np.array([1.0, 0.0, 0.6])
    keys = keys_for(rng, b).broadcast(b)
    host = [np.zeros(b, np.int32), np.zeros((b, top_k), np.uint32),
            np.zeros((b, top_k), np.int32), np.zeros(b, np.int32)]
    be.propose(x, None, temp, 0, top_k, *keys, *host)
    dev = [cuda.device_array(h.shape, h.dtype) for h in host]
    be.propose(cuda.to_device(x), None, cuda.to_device(temp), 0, top_k,
               *(cuda.to_device(a) for a in keys), *dev)
    for h, d in zip(host, dev):
        np.testing.assert_array_equal(h, d.copy_to_host())


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("top_k", [None, 32])
def test_gpu_torch_device_path(dtype, top_k):
    """torch CUDA tensors through the public API (dyadic/_device.py): half-precision
    logits are widened exactly for numba; outputs stay on the device."""
    import dyadic
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    rng = np.random.default_rng(33)
    b, v, k = 3, 32000, 5
    x = torch.from_numpy((rng.normal(size=(b, v)) * 3).astype(np.float32)).to(getattr(torch, dtype))
    keys = dyadic.Keys(seed=rng.integers(0, 2**63, size=b), position=17)
    t1, q1 = dyadic.propose(x.cuda(), keys, top_k=top_k, backend="numba")
    t2, q2 = dyadic.propose(x, keys, top_k=top_k, backend=OTHER)
    assert t1.is_cuda and q1.counts.is_cuda
    np.testing.assert_array_equal(t1.cpu().numpy(), t2.numpy())
    np.testing.assert_array_equal(q1.counts.cpu().numpy(), q2.counts.numpy())
    z = rng.normal(size=(b, k + 1, v)) * 3
    p = np.exp(z - z.max(-1, keepdims=True))
    p = (p / p.sum(-1, keepdims=True)).astype(np.float32)
    draft = rng.integers(0, v, size=(b, k)).astype(np.int32)
    r1 = dyadic.verify(torch.from_numpy(p).cuda(), torch.from_numpy(draft).cuda(), None, keys,
                       backend="numba")
    r2 = dyadic.verify(p, draft, None, keys, backend=OTHER)
    np.testing.assert_array_equal(r1.tokens.cpu().numpy(), r2.tokens)


@pytest.mark.parametrize("policy", ["standard", "floor-first"])
def test_gpu_bias_sum_is_binary64(policy):
    """x + bias must be formed in binary64: -40 + 3.833676 rounds differently in
    binary32 (found by `python -m dyadic.fuzz --seed 7` on the H200: compiled
    numba typed float(float32) as float32, which the simulator does not)."""
    import dyadic
    rng = np.random.default_rng(5)
    x = np.full((4, 31), -40.0, np.float32)
    bias = rng.normal(0, 2, size=(4, 31)).astype(np.float32)
    for kw in (dict(top_k=7), dict(top_k=None)):
        a = dyadic.allocate(x, logits=True, bias=bias, temperature=0.25, policy=policy,
                            backend="numba", **kw)
        b = dyadic.allocate(x, logits=True, bias=bias, temperature=0.25, policy=policy,
                            backend=OTHER, **kw)
        np.testing.assert_array_equal(np.asarray(a.counts), np.asarray(b.counts))
