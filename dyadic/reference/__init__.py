"""The exact pure-Python specification of dyadic (backend-free).

Array-level functions mirror the public API and run on the reference
backend; the row-level modules are the specification itself:

- ``philox``: Philox4x32-10, key/counter layout, ``uniform_below``.
- ``fixedpoint``: the documented float -> integer input conversions and the
  integer exponential.
- ``allocation``: floor + largest remainders / floor-first, top-k support.
- ``sampling``: draws, acceptance, residual, verification of one request.
- ``target_logits``: the processed target of ``verify(..., logits=True)``
  (temperature, min-p, top-k, top-p on exact integer weights).
- ``distribution``: exact output distributions (fractions) for the proofs.
"""

from . import allocation, distribution, fixedpoint, philox, sampling, target_logits


def allocate(x, **kwargs):
    """``dyadic.allocate`` on the reference backend."""
    from .._api import allocate as _allocate
    return _allocate(x, **kwargs, backend="reference")


def draw(q, keys):
    from .._api import draw as _draw
    return _draw(q, keys, backend="reference")


def propose(logits, keys, **kwargs):
    from .._api import propose as _propose
    return _propose(logits, keys, **kwargs, backend="reference")


def verify(target, draft, q, keys, **kwargs):
    from .._api import verify as _verify
    return _verify(target, draft, q, keys, **kwargs, backend="reference")


def philox4x32(counter, key, rounds=10):
    from .._api import philox4x32 as _philox
    return _philox(counter, key, rounds, backend="reference")


first_token_distribution = distribution.first_token_distribution
target_distribution = distribution.target_distribution
first_token_distribution_logits = distribution.first_token_distribution_logits
logits_target_distribution = target_logits.target_distribution
bonus_distribution = distribution.bonus_distribution
ragged_first_token_distribution = distribution.ragged_first_token_distribution

__all__ = ["allocate", "draw", "propose", "verify", "philox4x32", "first_token_distribution",
           "target_distribution", "first_token_distribution_logits", "logits_target_distribution",
           "bonus_distribution", "ragged_first_token_distribution",
           "allocation", "distribution", "fixedpoint", "philox",
           "sampling", "target_logits"]
