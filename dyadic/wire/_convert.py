"""Exact conversions between ``dyadic.Dyadic`` and the REPLY payload.

FP32 carries every c / 2**24 (0 <= c <= 2**24) exactly, so
``reply.to_dyadic(width=q.width)`` returns the very counts and ids of ``q``
(sparse rows keep only their nonzero entries on the wire; padding (-1, 0)
is restored at the end of each row).  Both directions go through validating
constructors: ``Reply(...)`` checks the payload, and ``to_dyadic`` builds the
``Dyadic`` with the public ``dyadic.Dyadic(counts, ids, vocab_size=..., policy=...)``,
which refuses counts not summing to 2**24 and ids out of range, not ascending
or padded in the middle.
"""

import numpy as np

from .. import _spec
from .._types import Dyadic
from ._rules import REPR_DENSE, REPR_SPARSE, U32

_SCALE = np.float32(1.0 / _spec.TOTAL)


def _int_arg(name, value, lo, hi):
    """An int argument (not bool) in [lo, hi]: TypeError / ValueError naming it."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if not lo <= int(value) <= hi:
        raise ValueError(f"{name}: {int(value)} not in [{lo}, {hi}]")
    return int(value)


def reply_from_dyadic(cls, q, sampled, *, session, generation, round, slots, attempt,
                      context_version, representation, dense_width):
    """Reply from q (Dyadic, batch shape (n_slots, depth)) and sampled (integer [n_slots, depth]).

    representation: "auto" (q's own), "sparse" (nonzero entries of each row)
    or "dense" (V counts, zero padding up to ``dense_width``, an int in
    [V, 2**32 - 1], default V).  Arguments of the wrong kind raise
    TypeError / ValueError; the Reply constructor then checks every field
    (``WireError``), ``sampled`` included (never cast or wrapped here)."""
    if not isinstance(q, Dyadic):
        raise TypeError(f"q: expected dyadic.Dyadic, got {type(q).__name__}")
    if len(q.batch_shape) != 2:
        raise ValueError(f"q: batch shape {q.batch_shape} must be (n_slots, depth)")
    n_slots, depth = q.batch_shape
    tok = np.asarray(sampled)
    if tok.shape != (n_slots, depth):
        raise ValueError(f"sampled: shape {tok.shape} must be {(n_slots, depth)}")
    if representation == "auto":
        representation = "sparse" if q.is_sparse else "dense"
    if representation not in ("sparse", "dense"):
        raise ValueError(f"representation: {representation!r} not 'auto', 'sparse' or 'dense'")
    v = q.vocab_size
    if representation == "sparse":
        vals_c, id_for_chk, n, rep, out_ids = _sparse_payload(q)
    else:
        dw = v if dense_width is None else _int_arg("dense_width", dense_width, v, U32)
        vals_c, id_for_chk, n, rep, out_ids = _dense_payload(q, dw)
    n_rows = n_slots * depth
    starts = np.zeros(n_rows, dtype=np.int64)
    np.cumsum(n[:-1].astype(np.int64), out=starts[1:])
    c64 = vals_c.astype(np.uint64)
    chk = (np.add.reduceat(c64 * (2 * id_for_chk.astype(np.uint64) + 1), starts)
           & U32).astype(np.uint32)
    values = vals_c.astype(np.float32) * _SCALE
    shape = (n_slots, depth)
    return cls(session=session, generation=generation, round=round, attempt=attempt,
               context_version=context_version, slots=slots, sampled=tok,
               representation=rep.reshape(shape), n_entries=n.reshape(shape),
               checksums=chk.reshape(shape), values=values, ids=out_ids, vocab_size=v)


def _sparse_payload(q):
    """Nonzero entries of every row: (counts, ids, n per row, representation, wire ids)."""
    counts, ids = q._numpy()
    n_rows = int(np.prod(q.batch_shape))
    c2 = counts.reshape(n_rows, q.width)
    if ids is None:
        i2 = np.broadcast_to(np.arange(q.vocab_size, dtype=np.int32), c2.shape)
    else:
        i2 = ids.reshape(n_rows, q.width)
    keep = c2 != 0                      # drops padding (count 0) and zero counts
    flat_ids = i2[keep].astype(np.int32)
    n = keep.sum(axis=1).astype(np.uint32)
    return c2[keep], flat_ids, n, np.full(n_rows, REPR_SPARSE, dtype=np.uint8), flat_ids


def _dense_payload(q, dw):
    """Dense rows of width dw (zero padding beyond V): (counts, ids, n, representation, [])."""
    v = q.vocab_size
    n_rows = int(np.prod(q.batch_shape))
    dense = q.to_dense()._numpy()[0].reshape(n_rows, v)
    if dw > v:
        dense = np.concatenate([dense, np.zeros((n_rows, dw - v), dtype=np.uint32)], axis=1)
    return (dense.ravel(), np.tile(np.arange(dw, dtype=np.int32), n_rows),
            np.full(n_rows, dw, dtype=np.uint32), np.full(n_rows, REPR_DENSE, dtype=np.uint8),
            np.empty(0, dtype=np.int32))


def dyadic_from_reply(reply, vocab_size=None, width=None):
    """Dyadic [n_slots, depth] (policy "external") from a Reply, through the
    validating public ``Dyadic`` constructor.

    vocab_size : None or ``reply.vocab_size`` (ValueError otherwise).
    width : sparse width, None (the widest row) or an int in [widest row, V].
    All rows sparse: sparse counts/ids padded with (-1, 0); otherwise dense."""
    v = reply.vocab_size
    if vocab_size is not None and _int_arg("vocab_size", vocab_size, 1, _spec.MAX_VOCAB) != v:
        raise ValueError(f"vocab_size: {vocab_size} != the reply's vocab_size {v}")
    n_slots, depth = reply.sampled.shape
    n_rows = n_slots * depth
    n = reply.n_entries.ravel().astype(np.int64)
    sparse = reply.representation.ravel() == REPR_SPARSE
    counts_flat = (reply.values.astype(np.float64) * _spec.TOTAL).astype(np.uint32)
    starts = np.zeros(n_rows, dtype=np.int64)
    np.cumsum(n[:-1], out=starts[1:])
    row = np.repeat(np.arange(n_rows), n)
    if sparse.all():
        w = int(n.max())
        if width is not None:
            w = _int_arg("width", width, w, v)
        col = np.arange(counts_flat.size, dtype=np.int64) - np.repeat(starts, n)
        counts = np.zeros((n_rows, w), dtype=np.uint32)
        ids = np.full((n_rows, w), _spec.PAD_ID, dtype=np.int32)
        counts[row, col] = counts_flat
        ids[row, col] = reply.ids
        return Dyadic(counts.reshape(n_slots, depth, w), ids.reshape(n_slots, depth, w),
                      vocab_size=v, policy="external")
    entry_ids = np.arange(counts_flat.size, dtype=np.int64) - np.repeat(starts, n)
    entry_ids[np.repeat(sparse, n)] = reply.ids          # dense rows: the column is the id
    inside = entry_ids < v                                # dense padding beyond V is zero
    dense = np.zeros((n_rows, v), dtype=np.uint32)
    dense[row[inside], entry_ids[inside]] = counts_flat[inside]
    return Dyadic(dense.reshape(n_slots, depth, v), None, vocab_size=v, policy="external")
