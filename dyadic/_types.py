"""Keys, Dyadic and Verdict: the values the API takes and returns."""

from dataclasses import dataclass

import numpy as np

from . import _arrays, _spec, _validate

_KEY_FIELDS = (
    ("seed", _spec.SEED_MAX, np.uint64),
    ("generation", _spec.GENERATION_MAX, np.uint32),
    ("round", _spec.ROUND_MAX, np.uint32),
    ("position", _spec.POSITION_MAX, np.uint32),
)


class Keys:
    """The RNG key fields of a batch of requests.

    Parameters
    ----------
    seed : int or 1-D integer array, in [0, 2**64)
        The request's seed (Philox key).
    generation : int or 1-D integer array, in [0, 2**32)
        Bumped by a reset/reconnect; invalidates every earlier draw.
    round : int or 1-D integer array, in [0, 2**32)
        Speculation round within the generation.
    position : int or 1-D integer array, in [0, 2**32)
        Absolute position of the token being proposed (for ``verify``: of
        the first draft token; draft ``i`` is at ``position + i``).

    Each field broadcasts over the batch.  Values out of range raise
    ``ValueError`` naming the field and the row.  Every draw is a pure
    function of these fields, a domain and a draw index (docs/semantics.md).
    """

    __slots__ = ("seed", "generation", "round", "position")

    def __init__(self, seed, generation=0, round=0, position=0):
        for name, value in zip(self.__slots__, (seed, generation, round, position)):
            object.__setattr__(self, name, value)

    def __setattr__(self, name, value):
        raise AttributeError("Keys is immutable")

    def __repr__(self):
        return (f"Keys(seed={self.seed!r}, generation={self.generation!r}, "
                f"round={self.round!r}, position={self.position!r})")

    def broadcast(self, batch, *, position_extra=0):
        """Validated fields as arrays of length ``batch`` (uint64 seed, uint32 others).

        ``position_extra``: the largest offset added to ``position`` by the
        caller (``k`` for verify), which must also stay in range.
        """
        s, g, r, p = self.seed, self.generation, self.round, self.position
        if (type(s) is int and type(g) is int and type(r) is int and type(p) is int
                and 0 <= s <= _spec.SEED_MAX and 0 <= g <= _spec.GENERATION_MAX
                and 0 <= r <= _spec.ROUND_MAX and 0 <= p <= _spec.POSITION_MAX - position_extra
                and batch <= 64):
            # fast path: valid Python ints, small batch (same arrays as below)
            return (np.array([s] * batch, dtype=np.uint64), np.array([g] * batch, dtype=np.uint32),
                    np.array([r] * batch, dtype=np.uint32), np.array([p] * batch, dtype=np.uint32))
        out = []
        for (name, hi, dtype), value in zip(_KEY_FIELDS, (self.seed, self.generation,
                                                          self.round, self.position)):
            if name == "position":
                hi -= position_extra
            out.append(_key_field(value, name, hi, dtype, batch))
        return tuple(out)


def _key_field(value, name, hi, dtype, batch):
    label = f"keys.{name}"
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{label}: expected an integer, got bool")
    if isinstance(value, (int, np.integer)):
        v = int(value)
        if not 0 <= v <= hi:
            raise ValueError(f"{label}: value {v} out of range [0, {hi}]")
        return np.full(batch, v, dtype=dtype)
    arr = _arrays.int_to_numpy(value, label)
    if arr.ndim != 1:
        raise ValueError(f"{label}: expected an int or a 1-D array, got shape {arr.shape}")
    if arr.shape[0] not in (1, batch):
        raise ValueError(f"{label}: length {arr.shape[0]} does not match the batch {batch}")
    neg = arr < 0 if arr.dtype.kind == "i" else np.zeros(arr.shape, dtype=bool)
    bad = np.flatnonzero(neg | (arr.astype(np.uint64) > np.uint64(hi)))
    if bad.size:
        r = int(bad[0])
        raise ValueError(f"{label}: row {r}: value {int(arr[r])} out of range [0, {hi}]")
    return np.ascontiguousarray(np.broadcast_to(arr.astype(dtype), (batch,)))


class Dyadic:
    """A batch of dyadic categorical distributions q(v) = counts / 2**24.

    Parameters
    ----------
    counts : uint32 array [..., W] (NumPy, torch, CuPy)
        Ticket counts; every row sums to exactly ``TOTAL = 2**24``.
    ids : int32 array [..., W] or None
        Sparse support: valid ids strictly ascending in [0, vocab_size), then
        padding entries (id -1, count 0) at the end of the row.  None means
        dense (W == vocab_size, ``counts[..., v]`` is token v).
    vocab_size : int
        V in [1, 2**24]; required for sparse rows, defaults to W for dense rows.
    policy : str
        "standard", "floor-first", or "external" (counts from elsewhere, e.g.
        the wire); ``semantic_id`` names it.

    The constructor copies ``counts`` and ``ids`` (a device array is copied on
    its device) and validates the copy, so the caller's arrays are never
    modified and a later change to them cannot reach a kernel.  Every rule
    broken raises ``ValueError`` / ``TypeError`` naming the argument, the row
    and the rule.  The stored NumPy arrays are read-only.  Results of
    ``allocate``, ``propose``, ``stack``, indexing and ``to_dense`` are built
    by dyadic from validated data.  Writing into ``counts`` / ``ids`` in
    place is not supported; the kernels fail such rows closed (status
    ``Q_INVALID``) where the rule broken is decidable from the row.

    Compatibility guarantee: for a given input, policy and semantic id, the
    counts are identical on every backend, platform and version of dyadic that
    carries that semantic id.
    """

    __slots__ = ("_counts", "_ids", "_vocab_size", "_policy")

    def __init__(self, counts, ids=None, *, vocab_size=None, policy="standard"):
        counts, ids, vocab_size = _validate.dyadic_parts(counts, ids, vocab_size, policy)
        _set_fields(self, counts, ids, vocab_size, policy)

    def __setattr__(self, name, value):
        raise AttributeError("Dyadic is immutable")

    @property
    def counts(self):
        """uint32 [..., W] ticket counts (read-only)."""
        return self._counts

    @property
    def ids(self):
        """int32 [..., W] sparse ids with -1 padding, or None when dense."""
        return self._ids

    @property
    def vocab_size(self):
        return self._vocab_size

    @property
    def policy(self):
        return self._policy

    @property
    def semantic_id(self):
        """``dyadic24-standard-v1``, ``dyadic24-floor-first-v1`` or ``dyadic24-external``."""
        return _spec.SEMANTIC_IDS.get(self._policy, "dyadic24-external")

    @property
    def is_sparse(self):
        return self._ids is not None

    @property
    def batch_shape(self):
        return tuple(self._counts.shape[:-1])

    @property
    def width(self):
        return int(self._counts.shape[-1])

    def __repr__(self):
        kind = f"sparse width {self.width}" if self.is_sparse else "dense"
        return (f"Dyadic(batch_shape={self.batch_shape}, vocab_size={self.vocab_size}, "
                f"{kind}, {self.semantic_id})")

    def _numpy(self, host_copy=False):
        c = _arrays.int_to_numpy(self._counts, "q.counts", host_copy=host_copy)
        i = None if self._ids is None else _arrays.int_to_numpy(self._ids, "q.ids",
                                                                  host_copy=host_copy)
        return c, i

    def to_dense(self):
        """The same distribution with dense counts [..., V] (uint32)."""
        if not self.is_sparse:
            return self
        counts, ids = self._numpy(host_copy=True)
        rows = counts.reshape(-1, self.width)
        rid = ids.reshape(-1, self.width)
        dense = np.zeros((rows.shape[0], self.vocab_size), dtype=np.uint32)
        r, j = np.nonzero(rid >= 0)
        dense[r, rid[r, j]] = rows[r, j]
        dense = dense.reshape(self.batch_shape + (self.vocab_size,))
        _validate.dyadic_rows(dense, None, self.vocab_size)  # the dense form obeys every rule
        return trusted_dyadic(_arrays.like(dense, self._counts), None, self.vocab_size,
                              self._policy)

    def probs(self):
        """float32 values counts / 2**24 (exact), aligned with ``counts``.

        Same array kind and device as ``counts`` (device arrays go through a
        host copy)."""
        counts, _ = self._numpy(host_copy=True)
        out = (counts.astype(np.float32) * np.float32(1.0 / _spec.TOTAL)).astype(np.float32)
        return _arrays.like(out, self._counts)

    def __getitem__(self, index):
        """Rows of the batch, selected by any NumPy index over the batch axes.

        The index applies to ``batch_shape`` only (an Ellipsis or a slice
        never reaches the vocabulary axis); the result is a new Dyadic with
        its own copy of the selected rows.  Indexing a Dyadic with an empty
        batch shape raises IndexError.
        """
        if not self.batch_shape:
            raise IndexError("Dyadic: a single distribution (batch shape ()) has no batch "
                             "axis to index (the vocabulary axis is not indexable)")
        rows = np.arange(int(np.prod(self.batch_shape, dtype=np.int64)), dtype=np.int64)
        try:
            picked = rows.reshape(self.batch_shape)[index]
        except IndexError as exc:
            raise IndexError(f"Dyadic: index {index!r} does not fit the batch shape "
                             f"{self.batch_shape} ({exc}); the vocabulary axis is not "
                             f"indexable") from None
        picked = np.asarray(picked)
        width = self.width
        c = _arrays.take_rows(self._counts, picked.reshape(-1), width, picked.shape)
        i = None if self._ids is None else _arrays.take_rows(self._ids, picked.reshape(-1),
                                                             width, picked.shape)
        return trusted_dyadic(c, i, self._vocab_size, self._policy)


def _set_fields(d, counts, ids, vocab_size, policy):
    for a in (counts, ids):
        if isinstance(a, np.ndarray):
            a.flags.writeable = False
    object.__setattr__(d, "_counts", counts)
    object.__setattr__(d, "_ids", ids)
    object.__setattr__(d, "_vocab_size", vocab_size)
    object.__setattr__(d, "_policy", policy)


def verify_q(q, b, k, v):
    """verify's q: a Dyadic over (B, k) rows of the target's vocabulary, or None."""
    if q is None:
        return
    if not isinstance(q, Dyadic):
        raise TypeError(f"q: expected a dyadic.Dyadic or None (point-mass q), got "
                        f"{type(q).__name__}")
    if q.batch_shape != (b, k):
        raise ValueError(f"q: batch shape {q.batch_shape} must be (B, k) = {(b, k)}")
    if q.vocab_size != v:
        raise ValueError(f"q: vocab_size {q.vocab_size} does not match target's {v}")


def stack(qs, axis=0):
    """Stack Dyadic batches along a new batch axis (e.g. the k positions of a chain).

    All inputs must share vocab_size, policy, sparseness, width and array kind.
    ``axis`` counts batch axes only (the vocabulary axis stays last).
    """
    qs = list(qs)
    if not qs or not all(isinstance(q, Dyadic) for q in qs):
        raise TypeError("qs: expected a non-empty sequence of dyadic.Dyadic")
    first = qs[0]
    for i, q in enumerate(qs):
        same = (q.vocab_size, q.policy, q.is_sparse, q.width, q.batch_shape,
                _arrays.kind_of(q.counts))
        want = (first.vocab_size, first.policy, first.is_sparse, first.width, first.batch_shape,
                _arrays.kind_of(first.counts))
        if same != want:
            raise ValueError(f"qs: entry {i} differs from entry 0 in vocab_size, policy, "
                             f"sparseness, width, batch shape or array kind")
    nd = len(first.batch_shape) + 1
    if not -nd <= axis < nd:
        raise ValueError(f"axis: {axis} out of range for {nd} batch axes")
    axis %= nd
    parts = [q._numpy(host_copy=True) for q in qs]
    counts = np.stack([c for c, _ in parts], axis=axis)
    ids = None if not first.is_sparse else np.stack([i for _, i in parts], axis=axis)
    _validate.dyadic_rows(counts, ids, first.vocab_size)  # the stacked copy obeys every rule
    orig = first.counts
    return trusted_dyadic(_arrays.like(counts, orig),
                          None if ids is None else _arrays.like(ids, orig),
                          first.vocab_size, first.policy)


@dataclass(frozen=True)
class Verdict:
    """Result of ``verify``.

    accepted : int32 [B]
        Number of accepted draft tokens per request (0..k).
    tokens : int32 [B, k+1]
        The accepted drafts, then the correction (on rejection) or bonus (all
        accepted) token, then -1.
    status : int32 [B] or None
        Per-row status codes with ``check=False`` / ``"lazy"`` (every backend; 0 =
        OK, ``dyadic._status``); None with ``check=True``, where a bad row raises.
    """

    accepted: object
    tokens: object
    status: object = None


# Results made by dyadic itself (its kernels' outputs, copies of validated rows): the
# same objects the constructors give, built without their per-call validation.  Never
# called on data a caller handed in.
_NEW = object.__new__
_DY_SET = (Dyadic._counts.__set__, Dyadic._ids.__set__, Dyadic._vocab_size.__set__,
           Dyadic._policy.__set__)


def trusted_dyadic(counts, ids, vocab_size, policy, readonly=True):
    """A Dyadic over arrays dyadic made and validated (``vocab_size`` an int); NumPy
    arrays are made read-only unless ``readonly`` is False (the caller decides)."""
    if readonly and type(counts) is np.ndarray:
        counts.flags.writeable = False
        if ids is not None:
            ids.flags.writeable = False
    d = _NEW(Dyadic)
    sc, si, sv, sp = _DY_SET
    sc(d, counts)
    si(d, ids)
    sv(d, vocab_size)
    sp(d, policy)
    return d


def trusted_verdict(accepted, tokens, status):
    """``Verdict(accepted, tokens, status)`` without the frozen dataclass's __init__."""
    v = _NEW(Verdict)
    d = v.__dict__
    d["accepted"] = accepted
    d["tokens"] = tokens
    d["status"] = status
    return v
