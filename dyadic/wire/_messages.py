"""Wire v2 message classes (frozen).

Every message is an immutable value; arrays are private read-only NumPy
copies.  Building a message checks every field with the rules of
``_rules`` (ranges, dtypes, FP32 values, and for a ``Reply`` its whole q
payload) and raises the ``WireError`` subclass of the first broken rule,
naming the field (and the row or index).  ``decode`` builds every message
through these constructors, so a decoded message and a constructed one obey
the same rules; only the negotiated ``Limits`` (frame size, slots, depth,
support, dense width, vocabulary of a COMMIT token) are checked by ``decode``
(and by the sessions) rather than by the constructors.

Compatibility guarantee: the binary layout of wire version 2 (docs/wire.md)
never changes; a change is a new version number, negotiated explicitly in
HELLO, never an automatic upgrade.
"""

from dataclasses import dataclass

import numpy as np

from . import _errors as E
from . import _rules as R
from ._rules import (MAX_VOCAB, REPR_DENSE, REPR_NONE, REPR_SPARSE, TEXT_BYTES,  # noqa: F401
                     U16, U32, U64, U8)

WIRE_VERSION = 2
MAGIC = b"DYQW"

ROLE_DRAFTER = 1
ROLE_VERIFIER = 2
PRECISION_FP32_DYADIC24 = 1
DRAFT_NATIVE = 1
DRAFT_ADAPTED = 2

STATUS_OK = 0
STATUS_ABORTED = 1

COMMIT_FALLBACK = 1  # flag: the round was target-only (proposal discarded)

RESET_USER = 1
RESET_TIMEOUT = 2
RESET_CORRUPT = 3
RESET_RECONNECT = 4
RESET_PROTOCOL = 5


def _set(obj, name, value):
    object.__setattr__(obj, name, value)


def _uints(obj, spec):
    """Check and normalise integer fields: spec = ((name, label, lo, hi), ...)."""
    for name, label, lo, hi in spec:
        _set(obj, name, R.uint(label, getattr(obj, name), lo, hi))


def _spec(prefix, *fields):
    """((name, "prefix.name", lo, hi), ...) from (name, lo, hi) triples."""
    return tuple((name, f"{prefix}.{name}", lo, hi) for name, lo, hi in fields)


@dataclass(frozen=True)
class Hello:
    """Capabilities of one endpoint, exchanged before any sampled request.

    role : ROLE_DRAFTER (1) or ROLE_VERIFIER (2).
    vocab_size : global vocabulary V (ids are global int32 in [0, V)).
    dense_width : dense row width (>= V; entries >= V are zero padding), 0 = no dense rows.
    max_slots, max_depth : bounds on requests per STEP and fixed chain depth.
    max_support : largest sparse row (entries), 0 = no sparse rows.
    max_frame_bytes : largest frame either side may send (header included).
    q_semantic_id : e.g. "dyadic24-standard-v1".  verifier_id : e.g.
    "leviathan-standard-v2".  rng_abi : e.g. "philox4x32-10-dyadic-v1".
    id_map_hash : 32 bytes (hash of the global id map).
    draft_identity / draft_kind (native 1 / adapted 2), target_identity : text.
    precision : PRECISION_FP32_DYADIC24 (q values are FP32 c / 2**24).
    wire_version : always 2 (decode rejects anything else).

    Integer fields are ints (never bool or float) in their wire ranges:
    vocab_size [1, 2**24], max_slots [1, 65535], max_depth [1, 255],
    max_support [0, vocab_size], max_frame_bytes [64, 2**32 - 1].
    """

    role: int
    vocab_size: int
    dense_width: int
    max_slots: int
    max_depth: int
    max_support: int
    max_frame_bytes: int
    q_semantic_id: str
    verifier_id: str
    rng_abi: str
    id_map_hash: bytes
    draft_identity: str
    target_identity: str
    draft_kind: int = DRAFT_NATIVE
    precision: int = PRECISION_FP32_DYADIC24
    wire_version: int = WIRE_VERSION

    def __post_init__(self):
        version = R.uint("hello.wire_version", self.wire_version, 0, U16)
        if version != WIRE_VERSION:
            raise E.UnsupportedVersion("hello.wire_version",
                                       f"{version} != {WIRE_VERSION} (no auto-upgrade)")
        _set(self, "wire_version", version)
        for name, allowed in (("role", {ROLE_DRAFTER, ROLE_VERIFIER}),
                              ("precision", {PRECISION_FP32_DYADIC24}),
                              ("draft_kind", {DRAFT_NATIVE, DRAFT_ADAPTED})):
            _set(self, name, R.enum(f"hello.{name}", getattr(self, name), allowed))
        _uints(self, _HELLO_SIZES)
        if self.dense_width and self.dense_width < self.vocab_size:
            raise E.UnexpectedSize("hello.dense_width",
                                   f"{self.dense_width} < vocab_size {self.vocab_size}")
        _uints(self, _HELLO_BOUNDS)
        _set(self, "max_support", R.uint("hello.max_support", self.max_support, 0,
                                         self.vocab_size))
        if not self.dense_width and not self.max_support:
            raise E.NegotiationError("hello", "offers neither dense nor sparse rows")
        for name in ("q_semantic_id", "verifier_id", "rng_abi", "draft_identity",
                     "target_identity"):
            R.text(f"hello.{name}", getattr(self, name))
        R.fixed_bytes("hello.id_map_hash", self.id_map_hash, TEXT_BYTES)


@dataclass(frozen=True)
class StepSlot:
    """One request of a STEP: slot index, absolute position of the first draft
    token, request seed (RNG key) and the committed-prefix/state digest (32 bytes)."""

    slot: int
    anchor_position: int
    seed: int
    prefix_digest: bytes

    def __post_init__(self):
        _uints(self, _STEP_SLOT_INTS)
        R.fixed_bytes("step.prefix_digest", self.prefix_digest, 32)


@dataclass(frozen=True)
class Step:
    """Verifier -> drafter: propose ``depth`` tokens for every slot.

    The drafter draws position i of a slot with
    ``Keys(seed, generation, round, anchor_position + i)`` (PROPOSAL domain).
    ``attempt`` numbers retries of the same round (the drafter must answer a
    retry with the identical q and tokens).  ``top_k`` 0 = dense q.

    ``temperature`` must be exactly an FP32 value, finite, >= 0, sign bit clear
    (0.1 and -0.0 are refused, never rounded); it is stored as a Python float.
    ``slots``: 1..65535 StepSlot with distinct slot ids, each with
    ``anchor_position + depth <= 2**32 - 1`` (every position of the round fits u32).
    """

    session: int
    generation: int
    round: int
    attempt: int
    depth: int
    context_version: int
    top_k: int
    temperature: float
    slots: tuple

    def __post_init__(self):
        _uints(self, _STEP_INTS)
        _set(self, "temperature", R.fp32_nonneg("step.temperature", self.temperature))
        _set(self, "slots", R.items("step.slots", self.slots, StepSlot, lambda s: s.slot))
        last = U32 - self.depth
        for i, s in enumerate(self.slots):
            if s.anchor_position > last:
                raise E.LimitExceeded(f"step.slots[{i}].anchor_position",
                                      f"{s.anchor_position} + depth {self.depth} > {U32}: the "
                                      f"round's positions (drafts and bonus) must fit u32")


@dataclass(frozen=True, eq=False)
class Reply:
    """Drafter -> verifier: the sampled tokens and their q, for every slot and
    position of one STEP.  Row (s, i) is the q of position i of slot s,
    conditioned on that slot's committed prefix and its sampled tokens 0..i-1.

    slots : tuple of n_slots distinct u16 ints (same order as the STEP).
    sampled : int32 [n_slots, depth] global token ids in [0, vocab_size), depth 1..255.
    representation : uint8 [n_slots, depth] (1 dense, 2 sparse).
    n_entries : uint32 [n_slots, depth]; dense rows: the dense width (>= vocab_size,
        the same for every dense row), sparse rows: the number of nonzero entries.
    checksums : uint32 [n_slots, depth] probability checksums
        (sum over nonzero entries of count * (2 * id + 1), mod 2**32).
    values : float32 [sum(n_entries)] q values (exactly count / 2**24), rows
        concatenated in row order (float16 / float64 holding such values are
        accepted and stored as float32).
    ids : int32 [sum of sparse n_entries] strictly ascending global ids of
        sparse rows (any integer dtype whose values fit).
    vocab_size : V in [1, 2**24] (the negotiated one for a decoded reply).

    Construction checks every rule of a decoded REPLY (docs/wire.md, row
    rules) and raises the ``WireError`` subclass of the first broken one;
    integer arrays must fit their wire type exactly (never wrapped).  The
    arrays are stored as private read-only copies.  Build one with
    ``Reply.from_dyadic``; read q with ``to_dyadic``.  Equality compares
    every field (arrays by value).
    """

    session: int
    generation: int
    round: int
    attempt: int
    context_version: int
    slots: tuple
    sampled: np.ndarray
    representation: np.ndarray
    n_entries: np.ndarray
    checksums: np.ndarray
    values: np.ndarray
    ids: np.ndarray
    vocab_size: int

    def __post_init__(self):
        _uints(self, _REPLY_INTS)
        _set(self, "slots", R.slot_ids("reply.slots", self.slots))
        for name, label, dt, exc in _REPLY_ARRAYS:
            _set(self, name, R.int_array(label, getattr(self, name), dt, exc))
        _set(self, "values", R.float_array("reply.values", self.values))
        self._check_shapes()
        rep, n, sampled, checksums = (self.representation.ravel(), self.n_entries.ravel(),
                                      self.sampled.ravel(), self.checksums.ravel())
        values, ids = self.values, self.ids
        body = 32 + 16 * n.size + 4 * (values.size + ids.size)
        if body > U32:
            raise E.LimitExceeded("reply", f"body of {body} bytes does not fit the u32 body "
                                           f"length")
        if R.sparse_reply_valid(self.vocab_size, rep, n, sampled, checksums, values, ids):
            return
        R.reply_rows(rep, n)
        dw = R.reply_sizes(rep, n, self.vocab_size, values.size, ids.size)
        values = R.reply_q(self._where, self.vocab_size, rep, n, sampled, checksums, values,
                           ids, dw)
        values.flags.writeable = False
        _set(self, "values", values)

    def _where(self, r):
        """Row r located for error messages: "row r (slot s, position i)"."""
        depth = self.depth
        return f"row {r} (slot {self.slots[r // depth]}, position {r % depth})"

    def _check_shapes(self):
        shape = self.sampled.shape
        if len(shape) != 2 or shape[0] != len(self.slots) or not 1 <= shape[1] <= U8:
            raise E.UnexpectedSize("reply.sampled", f"shape {shape} must be (n_slots, depth) "
                                                    f"= ({len(self.slots)}, 1..{U8})")
        for name in ("representation", "n_entries", "checksums"):
            got = getattr(self, name).shape
            if got != shape:
                raise E.UnexpectedSize(f"reply.{name}", f"shape {got} must be {shape}")
        for name in ("values", "ids"):
            got = getattr(self, name).shape
            if len(got) != 1:
                raise E.UnexpectedSize(f"reply.{name}", f"shape {got} must be 1-D")

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        return all(_same(getattr(self, f), getattr(other, f)) for f in self.__dataclass_fields__)

    __hash__ = None

    @property
    def depth(self):
        return int(self.sampled.shape[1])

    @property
    def n_slots(self):
        return len(self.slots)

    @classmethod
    def from_dyadic(cls, q, sampled, *, session, generation, round, slots, attempt=0,
                    context_version=0, representation="auto", dense_width=None):
        """Reply from q (``dyadic.Dyadic``, batch shape (n_slots, depth)) and its
        sampled tokens (integer [n_slots, depth]); see ``_convert.reply_from_dyadic``."""
        from ._convert import reply_from_dyadic
        return reply_from_dyadic(cls, q, sampled, session=session, generation=generation,
                                 round=round, slots=slots, attempt=attempt,
                                 context_version=context_version,
                                 representation=representation, dense_width=dense_width)

    def to_dyadic(self, vocab_size=None, *, width=None):
        """q as a ``Dyadic`` of batch shape (n_slots, depth), policy "external",
        built by the validating public ``dyadic.Dyadic`` constructor.

        vocab_size : None or this reply's ``vocab_size`` (``ValueError`` otherwise).
        Sparse rows (all rows sparse): ids int32 / counts uint32 of width
        ``width`` (default: the largest row; at most vocab_size), padded with
        (-1, 0) at the end.  Any dense row: dense counts [n_slots, depth, vocab_size].
        """
        from ._convert import dyadic_from_reply
        return dyadic_from_reply(self, vocab_size, width)


_REPLY_INTS = _spec("reply", ("session", 0, U64), ("generation", 0, U32), ("round", 0, U32),
                    ("attempt", 0, U16), ("context_version", 0, U32),
                    ("vocab_size", 1, MAX_VOCAB))
# integer arrays: (field, error label, wire dtype, error class of a value that does not fit)
_REPLY_ARRAYS = (("sampled", "reply.sampled", np.int32, E.OutOfRangeId),
                 ("representation", "reply.representation", np.uint8, E.NonCanonicalEncoding),
                 ("n_entries", "reply.n_entries", np.uint32, E.LimitExceeded),
                 ("checksums", "reply.checksums", np.uint32, E.LimitExceeded),
                 ("ids", "reply.ids", np.int32, E.OutOfRangeId))


def _same(a, b):
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
                and a.shape == b.shape and a.tobytes() == b.tobytes())
    return a == b


@dataclass(frozen=True)
class Completion:
    """Drafter -> verifier, after a REPLY: the reply becomes consumable only if
    this matches it exactly (generation/round/attempt/context, slots and depth,
    the STEP it answers (CRC32 of that STEP's body), the reply frame's exact
    byte length and CRC32) and ``status`` is STATUS_OK."""

    session: int
    generation: int
    round: int
    attempt: int
    context_version: int
    n_slots: int
    depth: int
    reply_bytes: int
    reply_crc32: int
    step_digest: int
    status: int = STATUS_OK

    def __post_init__(self):
        _uints(self, _COMPLETION_INTS)
        _set(self, "status", R.enum("completion.status", self.status,
                                    {STATUS_OK, STATUS_ABORTED}))


@dataclass(frozen=True)
class CommitSlot:
    """accepted draft count, the correction/bonus token, the new committed
    position (absolute position after the committed tokens); ``fallback``:
    the proposal was discarded and ``token`` came from target-only sampling.
    ``token`` in [0, 2**31 - 1] (``OutOfRangeId``; decode also checks it
    against the negotiated vocabulary); ``fallback`` a bool."""

    slot: int
    accepted: int
    token: int
    new_position: int
    fallback: bool = False

    def __post_init__(self):
        _uints(self, _COMMIT_SLOT_INTS)
        _set(self, "token", R.token_id("commit.token", self.token))
        _set(self, "fallback", R.flag("commit.fallback", self.fallback))
        if self.fallback and self.accepted:
            raise E.NonCanonicalEncoding("commit.accepted",
                                         "a fallback round accepts no draft tokens")


@dataclass(frozen=True)
class Commit:
    """Verifier -> drafter: the outcome of a round for every slot (1..65535
    CommitSlot with distinct slot ids)."""

    session: int
    generation: int
    round: int
    slots: tuple

    def __post_init__(self):
        _uints(self, _COMMIT_INTS)
        _set(self, "slots", R.items("commit.slots", self.slots, CommitSlot, lambda s: s.slot))


@dataclass(frozen=True)
class Reset:
    """Either side: invalidate the generation, every in-flight probability
    slot and all speculative state; ``new_generation`` is the one to use next."""

    session: int
    new_generation: int
    reason: int = RESET_USER

    def __post_init__(self):
        _uints(self, _RESET_INTS)
        _set(self, "reason", R.enum("reset.reason", self.reason,
                                    {RESET_USER, RESET_TIMEOUT, RESET_CORRUPT, RESET_RECONNECT,
                                     RESET_PROTOCOL}))


# Integer fields of each message: (name, error label, lo, hi).
_HELLO_SIZES = _spec("hello", ("vocab_size", 1, MAX_VOCAB), ("dense_width", 0, U32))
_HELLO_BOUNDS = _spec("hello", ("max_slots", 1, U16), ("max_depth", 1, U8),
                      ("max_frame_bytes", 64, U32))
_STEP_SLOT_INTS = _spec("step", ("slot", 0, U16), ("anchor_position", 0, U32), ("seed", 0, U64))
_STEP_INTS = _spec("step", ("session", 0, U64), ("generation", 0, U32), ("round", 0, U32),
                   ("attempt", 0, U16), ("depth", 1, U8), ("context_version", 0, U32),
                   ("top_k", 0, U32))
_COMPLETION_INTS = _spec("completion", ("session", 0, U64), ("generation", 0, U32),
                         ("round", 0, U32), ("attempt", 0, U16), ("context_version", 0, U32),
                         ("n_slots", 1, U16), ("depth", 1, U8), ("reply_bytes", 0, U32),
                         ("reply_crc32", 0, U32), ("step_digest", 0, U32))
_COMMIT_SLOT_INTS = _spec("commit", ("slot", 0, U16), ("accepted", 0, U8),
                          ("new_position", 0, U32))
_COMMIT_INTS = _spec("commit", ("session", 0, U64), ("generation", 0, U32), ("round", 0, U32))
_RESET_INTS = _spec("reset", ("session", 0, U64), ("new_generation", 0, U32))
