"""GPU backends: ``cupy`` (CUDA C kernels of ``kernels/``, NVRTC) and ``numba``
(Numba-CUDA kernels)."""
