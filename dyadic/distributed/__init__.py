"""Vocabulary-sharded (tensor-parallel) propose / verify over torch.distributed.

Each rank passes its contiguous slice of the vocabulary; every rank gets what
the unsharded ``dyadic.propose`` / ``dyadic.verify`` return on the
concatenated vocabulary, bit for bit (docs/distributed.md).  A failed call
fails on every rank with the same error: ``ValueError`` / ``TypeError`` as
they were raised, anything else as ``DistributedError``.  Importing this
module imports torch; ``import dyadic`` does not.
"""

import torch  # noqa: F401  (optional dependency: fail here, not mid-call)
import torch.distributed  # noqa: F401

from . import _core
from ._comm import DistributedError
from ._core import DyadicShard, ExchangeStats, propose, verify


def __getattr__(name):
    if name == "last_exchange":
        return _core.last_exchange
    raise AttributeError(name)


__all__ = ["propose", "verify", "DyadicShard", "DistributedError", "ExchangeStats",
           "last_exchange"]
