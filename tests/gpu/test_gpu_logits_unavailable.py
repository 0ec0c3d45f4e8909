"""The sampling-parameter primitives (verify(logits=True), allocate / propose with
top_p, min_p or a per-row top_k) on GPU arrays and on backend="cuda": refused with
BackendUnavailable naming the backends that have them, never a silent fallback.
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


def _inputs(b=2, k=2, v=50):
    rng = np.random.default_rng(0)
    target = rng.standard_normal((b, k + 1, v)).astype(np.float32)
    draft = rng.integers(0, v, size=(b, k)).astype(np.int32)
    return target, draft, dyadic.Keys(seed=np.arange(b))


def test_cuda_backend_host_arrays():
    be, why = _load("cuda")
    if be is None:
        pytest.skip(why)
    target, draft, keys = _inputs()
    with pytest.raises(BackendUnavailable, match="'cpu', 'reference' or 'numba'"):
        dyadic.verify(target, draft, None, keys, logits=True, temperature=0.7, backend="cuda")


@pytest.mark.parametrize("backend", ["cuda", "numba"])
def test_device_tensors(torch_cuda, backend):
    be, why = _load(backend)
    if be is None:
        pytest.skip(why)
    target, draft, keys = _inputs()
    t = torch_cuda.as_tensor(target, device="cuda")
    d = torch_cuda.as_tensor(draft, device="cuda")
    with pytest.raises(BackendUnavailable, match="GPU arrays"):
        dyadic.verify(t, d, None, keys, logits=True, temperature=0.7, backend=backend)
    x = t[:, 0].contiguous()
    with pytest.raises(BackendUnavailable, match="GPU arrays"):
        dyadic.propose(x, keys, top_p=0.9, backend=backend)
    with pytest.raises(BackendUnavailable, match="GPU arrays"):
        dyadic.allocate(x, logits=True, min_p=0.1, backend=backend)
