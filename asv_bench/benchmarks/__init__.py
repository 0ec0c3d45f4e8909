"""asv benchmarks for dyadic: one file per primitive family.

Every benchmark class is parametrised over backend (cpu, cuda, numba; the
pure-Python reference is too slow), vocabulary and batch.  A backend that is
not available raises NotImplementedError in ``setup`` (asv records a skip).
``DYADIC_ASV_QUICK=1`` shrinks the grid to the smallest sizes (CI);
``DYADIC_ASV_BACKENDS=cpu,reference`` overrides the backend list.
"""
