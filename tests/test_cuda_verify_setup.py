"""backends/cuda/cupy_backend._verify_setup without a GPU: the depth limit of the cuda
verify kernels is refused with its message before anything touches the device."""

import numpy as np
import pytest

from dyadic.backends.cuda import cupy_backend


@pytest.mark.parametrize("lazy_or_full", ["verify", "verify_lazy"])
def test_too_deep_draft_is_refused(lazy_or_full):
    k = cupy_backend._MAX_K_VERIFY + 1
    target = np.zeros((2, k + 1, 8), dtype=np.float32)
    draft = np.zeros((2, k), dtype=np.int32)
    be = cupy_backend.CupyBackend()
    args = (target, draft, None, None) + (() if lazy_or_full == "verify_lazy" else (None,))
    with pytest.raises(ValueError, match=rf"draft: backend 'cuda' verifies at most "
                                         rf"{cupy_backend._MAX_K_VERIFY} draft tokens per "
                                         rf"request, got k={k}"):
        getattr(be, lazy_or_full)(*args, 0, 0, 0, 0, None, None, None)


def test_deepest_draft_passes_the_limit():
    """k = the limit is not refused by the limit (without a device it fails later)."""
    k = cupy_backend._MAX_K_VERIFY
    target = np.zeros((1, k + 1, 8), dtype=np.float32)
    try:
        cupy_backend._verify_setup(target, None, 0, 0, 0, 0, (), ())
    except Exception as exc:  # noqa: BLE001 - no CuPy / no GPU here: any error but the limit
        assert "verifies at most" not in str(exc)
