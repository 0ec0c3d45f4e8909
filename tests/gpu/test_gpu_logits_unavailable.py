"""The sampling-parameter primitives where a backend has no kernels for them: refused
with BackendUnavailable, never a silent fallback.  verify(logits=True) on GPU tensors
runs on backends "cuda" (tests/gpu/test_gpu_verify_logits.py) and "numba"
(tests/gpu/test_numba_device_logits.py); allocate / propose with top_p, min_p or a
per-row top_k on GPU tensors run on "cuda" (tests/gpu/test_gpu_filtered_alloc.py) and
on "numba", and are refused on "cuda" with a bias and without top_k (a dense support).
Runs where a GPU is present; skips otherwise."""

import numpy as np
import pytest

import dyadic
from dyadic._backend import BackendUnavailable

from conftest import _load

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def torch_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return torch


def _backend(name):
    be, why = _load(name)
    if be is None:
        pytest.skip(why)
    return be


def _inputs(b=2, k=2, v=50):
    rng = np.random.default_rng(0)
    target = rng.standard_normal((b, k + 1, v)).astype(np.float32)
    draft = rng.integers(0, v, size=(b, k)).astype(np.int32)
    return target, draft, dyadic.Keys(seed=np.arange(b))


def test_cuda_backend_host_arrays():
    """Host arrays on backend "cuda" take the backend's host entry point: its verify from
    logits where it declares one (has_logits_verify), the cpu backend's bits; else
    refused, naming the backends that have it."""
    be = _backend("cuda")
    target, draft, keys = _inputs()
    kw = dict(logits=True, temperature=np.array([0.7, 0.0]), top_p=0.9, check=False)
    if not be.has_logits_verify:
        with pytest.raises(BackendUnavailable, match="'cpu', 'reference' or 'numba'"):
            dyadic.verify(target, draft, None, keys, backend="cuda", **kw)
        return
    got = dyadic.verify(target, draft, None, keys, backend="cuda", **kw)
    want = dyadic.verify(target, draft, None, keys, backend="cpu", **kw)
    for name in ("accepted", "tokens", "status"):
        np.testing.assert_array_equal(np.asarray(getattr(got, name)),
                                      np.asarray(getattr(want, name)))


def test_cuda_dense_filtered_with_bias_on_device_tensors(torch_cuda):
    _backend("cuda")
    target, _, keys = _inputs()
    x = torch_cuda.as_tensor(target[:, 0], device="cuda").contiguous()
    bias = torch_cuda.zeros(x.shape[-1], device="cuda")
    with pytest.raises(BackendUnavailable, match="with bias and without top_k"):
        dyadic.allocate(x, logits=True, min_p=0.1, bias=bias, backend="cuda")
    with pytest.raises(BackendUnavailable, match="with bias and without top_k"):
        dyadic.propose(x, keys, top_k=None, top_p=0.9, bias=bias, backend="cuda")
