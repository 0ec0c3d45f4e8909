"""dyadic: exact, reproducible sampling primitives for speculative decoding.

q(v) = counts[v] / 2**24 exactly; every draw is a pure function of
(seed, generation, round, position, domain, draw index); every backend gives
the same bits.  See docs/semantics.md for the contract.

``import dyadic`` imports NumPy only: no backend, no torch, cupy or numba.
"""

from ._spec import TOTAL
from ._types import Dyadic, Keys, Verdict, stack
from ._api import allocate, available_backends, draw, philox4x32, propose, verify
from . import ragged, reference

__version__ = "0.1.0"

__all__ = ["TOTAL", "Dyadic", "Keys", "Verdict", "allocate", "available_backends", "draw",
           "philox4x32", "propose", "ragged", "verify", "reference", "stack", "__version__"]
