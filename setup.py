"""Build: the Cython CPU backend and the package layout.

``backends/`` installs as ``dyadic.backends`` (``backends/cpu`` ->
``dyadic.backends.cpu``, ``backends/cuda`` -> ``dyadic.backends.cuda``); the
shared integer-core headers in ``backends/include`` ship as package data so
the CUDA backend can hand them to NVRTC at run time.
"""

import numpy
from Cython.Build import cythonize
from setuptools import Extension, find_packages, setup

# Exactness: no fast-math, no FMA contraction (docs/semantics.md).
CFLAGS = ["-O3", "-fno-fast-math", "-ffp-contract=off", "-fno-strict-aliasing"]

extensions = [
    Extension(
        "dyadic.backends.cpu._kernels",
        ["backends/cpu/_kernels.pyx"],
        include_dirs=["backends/include", numpy.get_include()],
        extra_compile_args=CFLAGS,
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    ),
    Extension(
        "dyadic.backends.cpu._shard",
        ["backends/cpu/_shard.pyx"],
        include_dirs=["backends/include", numpy.get_include()],
        extra_compile_args=CFLAGS,
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    ),
]

setup(
    packages=find_packages(include=["dyadic", "dyadic.*"])
    + ["dyadic.backends", "dyadic.backends.cpu", "dyadic.backends.cuda",
       "dyadic.backends.cuda.cupy", "dyadic.backends.cuda.numba"],
    package_dir={"dyadic.backends": "backends"},
    package_data={"dyadic.backends": ["include/*.h"], "dyadic.backends.cpu": ["*.pyx", "*.pxd"],
                  "dyadic.backends.cuda": ["kernels/*.cu", "kernels/*.cuh"]},
    ext_modules=cythonize(extensions, language_level=3,
                          compiler_directives={"boundscheck": False, "wraparound": False,
                                               "cdivision": True, "initializedcheck": False}),
    zip_safe=False,
)
