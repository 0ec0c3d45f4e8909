"""Wire v2 message classes (frozen).

Every message is an immutable value; arrays are NumPy, read-only.  Building a
message checks the scalar fields (ranges, text fields) and raises the
``WireError`` subclass of the broken rule, so a decoded message and a
constructed one obey the same rules.  The q payload of a ``Reply`` is checked
in full by ``decode`` (and by ``Reply.from_dyadic``, valid by construction).

Compatibility guarantee: the binary layout of wire version 2 (docs/wire.md)
never changes; a change is a new version number, negotiated explicitly in
HELLO, never an automatic upgrade.
"""

from dataclasses import dataclass, field

import numpy as np

from . import _errors as E

WIRE_VERSION = 2
MAGIC = b"DYQW"
TEXT_BYTES = 32

ROLE_DRAFTER = 1
ROLE_VERIFIER = 2
PRECISION_FP32_DYADIC24 = 1
DRAFT_NATIVE = 1
DRAFT_ADAPTED = 2

REPR_NONE = 0
REPR_DENSE = 1
REPR_SPARSE = 2

STATUS_OK = 0
STATUS_ABORTED = 1

COMMIT_FALLBACK = 1  # flag: the round was target-only (proposal discarded)

RESET_USER = 1
RESET_TIMEOUT = 2
RESET_CORRUPT = 3
RESET_RECONNECT = 4
RESET_PROTOCOL = 5

U16 = (1 << 16) - 1
U32 = (1 << 32) - 1
U64 = (1 << 64) - 1


def _int(name, value, lo, hi):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise E.NonCanonicalEncoding(name, f"expected an int, got {type(value).__name__}")
    v = int(value)
    if not lo <= v <= hi:
        raise E.LimitExceeded(name, f"value {v} out of range [{lo}, {hi}]")
    return v


def _enum(name, value, allowed):
    if value not in allowed:
        raise E.NonCanonicalEncoding(name, f"value {value!r} is not one of {sorted(allowed)}")


def check_text(name, value):
    """A text field: 1..32 printable ASCII characters."""
    if not isinstance(value, str):
        raise E.NonCanonicalEncoding(name, f"expected str, got {type(value).__name__}")
    if not 1 <= len(value) <= TEXT_BYTES or not all(0x20 <= ord(c) <= 0x7E for c in value):
        raise E.NonCanonicalEncoding(name, f"text must be 1..{TEXT_BYTES} printable ASCII "
                                           f"characters, got {value!r}")


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
    "leviathan-standard-v1".  rng_abi : e.g. "philox4x32-10-dyadic-v1".
    id_map_hash : 32 bytes (hash of the global id map).
    draft_identity / draft_kind (native 1 / adapted 2), target_identity : text.
    precision : PRECISION_FP32_DYADIC24 (q values are FP32 c / 2**24).
    wire_version : always 2 (decode rejects anything else).
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
        if self.wire_version != WIRE_VERSION:
            raise E.UnsupportedVersion("hello.wire_version",
                                       f"{self.wire_version} != {WIRE_VERSION} (no auto-upgrade)")
        _enum("hello.role", self.role, {ROLE_DRAFTER, ROLE_VERIFIER})
        _enum("hello.precision", self.precision, {PRECISION_FP32_DYADIC24})
        _enum("hello.draft_kind", self.draft_kind, {DRAFT_NATIVE, DRAFT_ADAPTED})
        _int("hello.vocab_size", self.vocab_size, 1, 1 << 24)
        _int("hello.dense_width", self.dense_width, 0, U32)
        if self.dense_width and self.dense_width < self.vocab_size:
            raise E.UnexpectedSize("hello.dense_width",
                                   f"{self.dense_width} < vocab_size {self.vocab_size}")
        _int("hello.max_slots", self.max_slots, 1, U16)
        _int("hello.max_depth", self.max_depth, 1, 255)
        _int("hello.max_support", self.max_support, 0, self.vocab_size)
        _int("hello.max_frame_bytes", self.max_frame_bytes, 64, U32)
        if not self.dense_width and not self.max_support:
            raise E.NegotiationError("hello", "offers neither dense nor sparse rows")
        for name in ("q_semantic_id", "verifier_id", "rng_abi", "draft_identity",
                     "target_identity"):
            check_text(f"hello.{name}", getattr(self, name))
        if not isinstance(self.id_map_hash, bytes) or len(self.id_map_hash) != TEXT_BYTES:
            raise E.UnexpectedSize("hello.id_map_hash", f"expected {TEXT_BYTES} bytes")


@dataclass(frozen=True)
class StepSlot:
    """One request of a STEP: slot index, absolute position of the first draft
    token, request seed (RNG key) and the committed-prefix/state digest (32 bytes)."""

    slot: int
    anchor_position: int
    seed: int
    prefix_digest: bytes

    def __post_init__(self):
        _int("step.slot", self.slot, 0, U16)
        _int("step.anchor_position", self.anchor_position, 0, U32)
        _int("step.seed", self.seed, 0, U64)
        if not isinstance(self.prefix_digest, bytes) or len(self.prefix_digest) != 32:
            raise E.UnexpectedSize("step.prefix_digest", "expected 32 bytes")


@dataclass(frozen=True)
class Step:
    """Verifier -> drafter: propose ``depth`` tokens for every slot.

    The drafter draws position i of a slot with
    ``Keys(seed, generation, round, anchor_position + i)`` (PROPOSAL domain).
    ``attempt`` numbers retries of the same round (the drafter must answer a
    retry with the identical q and tokens).  ``top_k`` 0 = dense q.
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
        _int("step.session", self.session, 0, U64)
        _int("step.generation", self.generation, 0, U32)
        _int("step.round", self.round, 0, U32)
        _int("step.attempt", self.attempt, 0, U16)
        _int("step.depth", self.depth, 1, 255)
        _int("step.context_version", self.context_version, 0, U32)
        _int("step.top_k", self.top_k, 0, U32)
        t = float(self.temperature)
        if not (t == t and 0.0 <= t < float("inf")) or np.float32(t) != t:
            raise E.NonCanonicalEncoding("step.temperature",
                                         f"{t!r} must be a finite FP32 value >= 0")
        object.__setattr__(self, "slots", tuple(self.slots))
        if not 1 <= len(self.slots) <= U16:
            raise E.UnexpectedSize("step.slots", f"count {len(self.slots)} not in [1, 65535]")
        seen = set()
        for s in self.slots:
            if not isinstance(s, StepSlot):
                raise E.NonCanonicalEncoding("step.slots", "entries must be StepSlot")
            if s.slot in seen:
                raise E.NonCanonicalEncoding("step.slots", f"slot {s.slot} listed twice")
            seen.add(s.slot)


@dataclass(frozen=True, eq=False)
class Reply:
    """Drafter -> verifier: the sampled tokens and their q, for every slot and
    position of one STEP.  Row (s, i) is the q of position i of slot s,
    conditioned on that slot's committed prefix and its sampled tokens 0..i-1.

    slots : tuple of n_slots ints (same order as the STEP).
    sampled : int32 [n_slots, depth] global token ids.
    representation : uint8 [n_slots, depth] (1 dense, 2 sparse).
    n_entries : uint32 [n_slots, depth]; dense rows: dense_width, sparse rows:
        the number of nonzero entries.
    checksums : uint32 [n_slots, depth] probability checksums
        (sum over nonzero entries of count * (2 * id + 1), mod 2**32).
    values : float32 [sum(n_entries)] q values (exactly count / 2**24), rows
        concatenated in row order.
    ids : int32 [sum of sparse n_entries] ascending global ids of sparse rows.

    Build one with ``Reply.from_dyadic``; read q with ``to_dyadic``.
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
    vocab_size: int = field(default=0)

    def __post_init__(self):
        for name, lo, hi in (("session", 0, U64), ("generation", 0, U32), ("round", 0, U32),
                             ("attempt", 0, U16), ("context_version", 0, U32)):
            _int(f"reply.{name}", getattr(self, name), lo, hi)
        object.__setattr__(self, "slots", tuple(int(s) for s in self.slots))
        for name, dt in (("sampled", np.int32), ("representation", np.uint8),
                         ("n_entries", np.uint32), ("checksums", np.uint32),
                         ("values", np.float32), ("ids", np.int32)):
            a = np.ascontiguousarray(getattr(self, name), dtype=dt)
            a.flags.writeable = False
            object.__setattr__(self, name, a)
        shape = self.sampled.shape
        if len(shape) != 2 or shape[0] != len(self.slots) or not 1 <= shape[1] <= 255:
            raise E.UnexpectedSize("reply.sampled", f"shape {shape} must be (n_slots, depth)")
        for name in ("representation", "n_entries", "checksums"):
            if getattr(self, name).shape != shape:
                raise E.UnexpectedSize(f"reply.{name}", f"shape must be {shape}")

    @classmethod
    def _trusted(cls, **fields):
        """Internal: a Reply from arrays ``decode`` has already validated."""
        self = object.__new__(cls)
        for k, v in fields.items():
            object.__setattr__(self, k, v)
        return self

    @property
    def depth(self):
        return int(self.sampled.shape[1])

    @property
    def n_slots(self):
        return len(self.slots)

    @classmethod
    def from_dyadic(cls, q, sampled, *, session, generation, round, slots, attempt=0,
                    context_version=0, representation="auto", dense_width=None):
        from ._convert import reply_from_dyadic
        return reply_from_dyadic(cls, q, sampled, session=session, generation=generation,
                                 round=round, slots=slots, attempt=attempt,
                                 context_version=context_version,
                                 representation=representation, dense_width=dense_width)

    def to_dyadic(self, vocab_size=None, *, width=None):
        """q as a ``Dyadic`` of batch shape (n_slots, depth), policy "external".

        Sparse rows (all rows sparse): ids int32 / counts uint32 of width
        ``width`` (default: the largest row), padded with (-1, 0) at the end.
        Any dense row: dense counts [n_slots, depth, vocab_size].
        """
        from ._convert import dyadic_from_reply
        return dyadic_from_reply(self, vocab_size or self.vocab_size, width)


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
        for name, lo, hi in (("session", 0, U64), ("generation", 0, U32), ("round", 0, U32),
                             ("attempt", 0, U16), ("context_version", 0, U32),
                             ("n_slots", 1, U16), ("depth", 1, 255), ("reply_bytes", 0, U32),
                             ("reply_crc32", 0, U32), ("step_digest", 0, U32)):
            _int(f"completion.{name}", getattr(self, name), lo, hi)
        _enum("completion.status", self.status, {STATUS_OK, STATUS_ABORTED})


@dataclass(frozen=True)
class CommitSlot:
    """accepted draft count, the correction/bonus token, the new committed
    position (absolute position after the committed tokens); ``fallback``:
    the proposal was discarded and ``token`` came from target-only sampling."""

    slot: int
    accepted: int
    token: int
    new_position: int
    fallback: bool = False

    def __post_init__(self):
        _int("commit.slot", self.slot, 0, U16)
        _int("commit.accepted", self.accepted, 0, 255)
        _int("commit.token", self.token, 0, (1 << 31) - 1)
        _int("commit.new_position", self.new_position, 0, U32)
        if self.fallback and self.accepted:
            raise E.NonCanonicalEncoding("commit.accepted",
                                         "a fallback round accepts no draft tokens")


@dataclass(frozen=True)
class Commit:
    """Verifier -> drafter: the outcome of a round for every slot."""

    session: int
    generation: int
    round: int
    slots: tuple

    def __post_init__(self):
        _int("commit.session", self.session, 0, U64)
        _int("commit.generation", self.generation, 0, U32)
        _int("commit.round", self.round, 0, U32)
        object.__setattr__(self, "slots", tuple(self.slots))
        if not 1 <= len(self.slots) <= U16:
            raise E.UnexpectedSize("commit.slots", f"count {len(self.slots)} not in [1, 65535]")
        if not all(isinstance(s, CommitSlot) for s in self.slots):
            raise E.NonCanonicalEncoding("commit.slots", "entries must be CommitSlot")


@dataclass(frozen=True)
class Reset:
    """Either side: invalidate the generation, every in-flight probability
    slot and all speculative state; ``new_generation`` is the one to use next."""

    session: int
    new_generation: int
    reason: int = RESET_USER

    def __post_init__(self):
        _int("reset.session", self.session, 0, U64)
        _int("reset.new_generation", self.new_generation, 0, U32)
        _enum("reset.reason", self.reason, {RESET_USER, RESET_TIMEOUT, RESET_CORRUPT,
                                            RESET_RECONNECT, RESET_PROTOCOL})
