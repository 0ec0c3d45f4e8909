"""Exact conversions between ``dyadic.Dyadic`` and the REPLY payload.

FP32 carries every c / 2**24 (0 <= c <= 2**24) exactly, so
``reply.to_dyadic(width=q.width)`` returns the very counts and ids of ``q``
(sparse rows keep only their nonzero entries on the wire; padding (-1, 0)
is restored at the end of each row).
"""

import numpy as np

from .. import _spec
from .._types import Dyadic
from . import _errors as E
from ._messages import REPR_DENSE, REPR_SPARSE, U32

_SCALE = np.float32(1.0 / _spec.TOTAL)


def reply_from_dyadic(cls, q, sampled, *, session, generation, round, slots, attempt,
                      context_version, representation, dense_width):
    """Reply from q (Dyadic, batch shape (n_slots, depth)) and sampled int32 [n_slots, depth].

    representation: "auto" (q's own), "sparse" (nonzero entries of each row)
    or "dense" (V counts, zero padding up to ``dense_width``)."""
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
    counts, ids = q._numpy()
    v = q.vocab_size
    n_rows = n_slots * depth
    c2 = counts.reshape(n_rows, q.width)
    if representation == "sparse":
        if ids is None:
            i2 = np.broadcast_to(np.arange(v, dtype=np.int32), c2.shape)
        else:
            i2 = ids.reshape(n_rows, q.width)
        keep = c2 != 0                      # drops padding (count 0) and zero counts
        vals_c = c2[keep]                   # row-major: rows concatenated in order
        flat_ids = i2[keep].astype(np.int32)
        n = keep.sum(axis=1).astype(np.uint32)
        rep = np.full(n_rows, REPR_SPARSE, dtype=np.uint8)
        id_for_chk = flat_ids
        out_ids = flat_ids
    else:
        dw = dense_width or v
        if dw < v:
            raise ValueError(f"dense_width: {dw} < vocab_size {v}")
        dense = q.to_dense()._numpy()[0].reshape(n_rows, v)
        if dw > v:
            dense = np.concatenate([dense, np.zeros((n_rows, dw - v), dtype=np.uint32)], axis=1)
        vals_c = dense.ravel()
        n = np.full(n_rows, dw, dtype=np.uint32)
        rep = np.full(n_rows, REPR_DENSE, dtype=np.uint8)
        id_for_chk = np.tile(np.arange(dw, dtype=np.int32), n_rows)
        out_ids = np.empty(0, dtype=np.int32)
    starts = np.zeros(n_rows, dtype=np.int64)
    np.cumsum(n[:-1].astype(np.int64), out=starts[1:])
    c64 = vals_c.astype(np.uint64)
    chk = (np.add.reduceat(c64 * (2 * id_for_chk.astype(np.uint64) + 1), starts)
           & U32).astype(np.uint32)
    values = vals_c.astype(np.float32) * _SCALE
    return cls(session=session, generation=generation, round=round, attempt=attempt,
               context_version=context_version, slots=tuple(slots),
               sampled=tok.astype(np.int32), representation=rep.reshape(n_slots, depth),
               n_entries=n.reshape(n_slots, depth), checksums=chk.reshape(n_slots, depth),
               values=values, ids=out_ids, vocab_size=v)


def dyadic_from_reply(reply, vocab_size, width=None):
    """Dyadic [n_slots, depth] from a (decoded, hence validated) reply."""
    if not vocab_size:
        raise E.NegotiationError("reply.vocab_size", "unknown vocabulary size")
    n_slots, depth = reply.sampled.shape
    n_rows = n_slots * depth
    n = reply.n_entries.ravel().astype(np.int64)
    rep = reply.representation.ravel()
    counts_flat = (reply.values.astype(np.float64) * _spec.TOTAL).astype(np.uint32)
    starts = np.zeros(n_rows, dtype=np.int64)
    np.cumsum(n[:-1], out=starts[1:])
    if (rep == REPR_SPARSE).all():
        w = int(n.max())
        if width is not None:
            if width < w:
                raise ValueError(f"width: {width} < widest row {w}")
            w = int(width)
        col = np.arange(n_rows * 0 + counts_flat.size, dtype=np.int64) - np.repeat(starts, n)
        row = np.repeat(np.arange(n_rows), n)
        counts = np.zeros((n_rows, w), dtype=np.uint32)
        ids = np.full((n_rows, w), _spec.PAD_ID, dtype=np.int32)
        counts[row, col] = counts_flat
        ids[row, col] = reply.ids
        return Dyadic(counts.reshape(n_slots, depth, w), ids.reshape(n_slots, depth, w),
                      vocab_size=vocab_size, policy="external", _trusted=True)
    dense = np.zeros((n_rows, vocab_size), dtype=np.uint32)
    k = 0
    for r in range(n_rows):
        seg = counts_flat[starts[r]:starts[r] + n[r]]
        if rep[r] == REPR_SPARSE:
            dense[r, reply.ids[k:k + n[r]]] = seg
            k += int(n[r])
        else:
            dense[r] = seg[:vocab_size]
    return Dyadic(dense.reshape(n_slots, depth, vocab_size), None, vocab_size=vocab_size,
                  policy="external", _trusted=True)
