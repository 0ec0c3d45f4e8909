"""Shared fixtures: the backends are discovered once and handed to tests.

A backend that cannot load here is a skip with its reason, never a silent pass.
"""

import os
import shutil
import time

# Decided here, before any test module can import numba: without a GPU the
# Numba backend runs on the CUDA simulator (CI exercises its kernels' parallel
# structure on small sizes; tests/gpu/test_numba_sim.py).
if not (os.path.exists("/dev/nvidia0") or shutil.which("nvidia-smi")):
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import numpy as np
import pytest

import dyadic
from dyadic import _backend

# Small hypothesis budget in CI; DYADIC_HYPOTHESIS_EXAMPLES raises it locally.
try:
    from hypothesis import settings

    settings.register_profile("dyadic", max_examples=int(os.environ.get(
        "DYADIC_HYPOTHESIS_EXAMPLES", "40")), deadline=None)
    settings.load_profile("dyadic")
except ImportError:  # pragma: no cover
    pass


def _load(name):
    try:
        be = _backend.get(name)
    except Exception as exc:  # noqa: BLE001 - the reason becomes the skip message
        return None, f"backend {name!r} unavailable: {exc}"
    if not getattr(be, "usable", lambda: True)():
        return None, f"backend {name!r} loaded but has no device here"
    return be, None


def cuda_torch(backend="cuda"):
    """torch, where ``backend`` loads and torch has a CUDA device; else the test skips
    with the reason."""
    be, why = _load(backend)
    if be is None:
        pytest.skip(why)
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    return torch


@pytest.fixture(params=["cpu", "numba", "cuda"])
def fast_backend(request):
    """Every non-reference backend; skips (with the reason) where unavailable."""
    be, why = _load(request.param)
    if be is None:
        pytest.skip(why)
    return request.param


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


def softmax_rows(z):
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


def random_target(rng, b, k1, v):
    """Target rows p = softmax(3 z), z standard normal: float32 [b, k1, v]."""
    return softmax_rows(rng.standard_normal((b, k1, v)) * 3)


@pytest.fixture
def make_target():
    return softmax_rows


__all__ = ["dyadic"]


# tests/integrations: the trained tiny model pair, once per session (skips where
# transformers is missing).  Weights come from dyadic.integrations.tiny_models' cache
# ($DYADIC_CACHE_DIR, else the user cache directory); the first run trains them
# (TEST_RECIPE, well under a minute on 2 CPU cores) and later runs load them.
@pytest.fixture(scope="session")
def tiny_pair():
    """(target, draft) of TEST_RECIPE; torch runs on one thread meanwhile (models this
    small are fastest there, and a 2-core machine shared with other work stalls torch's
    thread pool), restored at the end of the session."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from dyadic.integrations import tiny_models

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    start = time.perf_counter()
    target, draft = tiny_models.load_pair(tiny_models.TEST_RECIPE)
    print(f"\ntiny model pair ready in {time.perf_counter() - start:.1f} s")
    yield target, draft
    torch.set_num_threads(threads)
