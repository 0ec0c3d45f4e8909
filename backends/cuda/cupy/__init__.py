"""backend="cuda": CUDA C kernels (``backends/cuda/kernels``) compiled at first use by
NVRTC through CuPy, launched through the CUDA driver.

- ``backend.py``: CupyBackend, the backend interface (dyadic._backend.Backend);
- ``routes.py``: which kernels serve a call, and their tiles (pure functions);
- ``plans.py``: the launch plans, one cache for every launch;
- ``args.py``: device pointers, key fields, dtype codes, verify's shape rules;
- ``runtime.py``: the compiled module, kernels, scratch buffers, streams;
- ``launch.py``: ``cuLaunchKernel`` via ctypes (CuPy's launch as the fallback).

Every decision in the kernels is integer arithmetic from the shared core
``backends/include/dyadic_core.h`` (the CPU backend's source), compiled with
``--fmad=false``; CuPy adds ``-ftz=true`` to every NVRTC compile, so the kernels use no
float32 arithmetic, comparison or f32 -> f64 conversion (``dc_f2d`` widens by bits).
docs/architecture.md maps primitives to kernels and files.
"""

from .backend import CupyBackend

__all__ = ["CupyBackend"]
