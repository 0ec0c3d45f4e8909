"""Kernels of the dyadic backends (installed as ``dyadic.backends``).

``cpu``: Cython over the shared integer-core header ``include/dyadic_core.h``.
``cuda``: CuPy raw kernels (same header, NVRTC) and Numba-CUDA kernels.
Nothing here is imported by ``import dyadic``; ``dyadic._backend`` loads a
backend on first use.
"""

import os

INCLUDE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "include")
