"""backend="numba": the kernels in Python for Numba-CUDA (``kernels.py``), the shared
integer core in Numba (``core.py``), the backend interface (``backend.py``)."""
