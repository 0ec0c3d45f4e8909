"""GPU backends: ``cupy_backend`` (NVRTC raw kernels) and ``numba_backend``."""
