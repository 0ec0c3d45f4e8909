"""encode / decode for wire v2 (layout: docs/wire.md).

``decode`` is strict and total: for any ``bytes``-like input it returns a
valid message or raises a ``WireError`` subclass; it never reads past the
buffer and never allocates from an unchecked length (every count is compared
with the negotiated ``Limits`` and with the bytes actually present before an
array is viewed).  It checks the frame-level rules (header, sizes, limits,
row order) itself and builds the message through its validating constructor
(``_messages``, rules in ``_rules``), so a frame and a constructed message
are refused by the same rule.  A refused frame leaves nothing behind: no
cache entry, and the raised error keeps no reference to the frame's bytes
or to arrays derived from them.
"""

import struct
import traceback
import zlib
from dataclasses import dataclass

import numpy as np

from . import _errors as E
from . import _rules as R
from ._messages import (MAGIC, TEXT_BYTES, U8, U16, U32, U64, WIRE_VERSION, REPR_DENSE,
                        Commit, CommitSlot, Completion, Hello, Reply, Reset, Step, StepSlot,
                        COMMIT_FALLBACK)


T_HELLO, T_STEP, T_REPLY, T_COMPLETION, T_COMMIT, T_RESET = 1, 2, 3, 4, 5, 6
TYPE_NAMES = {T_HELLO: "HELLO", T_STEP: "STEP", T_REPLY: "REPLY", T_COMPLETION: "COMPLETION",
              T_COMMIT: "COMMIT", T_RESET: "RESET"}

HEADER = struct.Struct("<4sHHQIIII")          # 32 bytes
HELLO = struct.Struct("<HBBBBHIIHHIII32s32s32s32s32s32s")  # 224 bytes
STEP = struct.Struct("<IIHHHHIIfI")            # 32 bytes
STEP_SLOT = struct.Struct("<HHIQ32s")          # 48 bytes
REPLY = struct.Struct("<IIHHHHIIII")           # 32 bytes
ROW_DTYPE = np.dtype([("slot", "<u2"), ("position", "u1"), ("repr", "u1"),
                      ("sampled", "<i4"), ("n", "<u4"), ("checksum", "<u4")])  # 16 bytes
COMPLETION = struct.Struct("<IIHHHHIIII")      # 32 bytes
COMMIT = struct.Struct("<IIHHI")               # 16 bytes
COMMIT_SLOT = struct.Struct("<HBBiII")         # 16 bytes
RESET = struct.Struct("<IIQ")                  # 16 bytes

assert HEADER.size == 32 and HELLO.size == 224 and STEP.size == 32 and STEP_SLOT.size == 48
assert REPLY.size == 32 and ROW_DTYPE.itemsize == 16 and COMPLETION.size == 32
assert COMMIT.size == 16 and COMMIT_SLOT.size == 16 and RESET.size == 16


@dataclass(frozen=True)
class Limits:
    """Bounds ``decode`` enforces before touching variable-length data.

    max_frame_bytes : whole frame, header included.
    max_slots, max_depth : STEP/REPLY/COMMIT counts.
    max_support : largest sparse row; 0 = sparse rows not allowed.
    vocab_size : V; None before negotiation (a REPLY is then refused).
    dense_width : dense row width; 0 = dense rows not allowed.

    ``Agreement.limits`` gives the negotiated values.  Each field must fit the
    wire field it bounds (``WireError`` naming it otherwise): max_frame_bytes
    >= 32, max_slots in [1, 65535], max_depth in [1, 255], max_support in
    [0, 2**24], vocab_size None or in [1, 2**24], dense_width 0 or in
    [vocab_size, 2**32 - 1].
    """

    max_frame_bytes: int = 1 << 24
    max_slots: int = 64
    max_depth: int = 16
    max_support: int = 1024
    vocab_size: int = None
    dense_width: int = 0

    def __post_init__(self):
        for name, lo, hi in (("max_frame_bytes", HEADER.size, U64), ("max_slots", 1, U16),
                             ("max_depth", 1, U8), ("max_support", 0, R.MAX_VOCAB),
                             ("dense_width", 0, U32)):
            object.__setattr__(self, name, R.uint(f"limits.{name}", getattr(self, name),
                                                  lo, hi))
        if self.vocab_size is not None:
            v = R.uint("limits.vocab_size", self.vocab_size, 1, R.MAX_VOCAB)
            object.__setattr__(self, "vocab_size", v)
            if self.dense_width and self.dense_width < v:
                raise E.UnexpectedSize("limits.dense_width",
                                       f"{self.dense_width} < vocab_size {v}")


DEFAULT_LIMITS = Limits()


def _text(value):
    return value.encode("ascii").ljust(TEXT_BYTES, b"\0")


def frame(mtype, session, body):
    """Header + body for a raw body (public for tests and tools)."""
    head = HEADER.pack(MAGIC, WIRE_VERSION, mtype, session, len(body),
                       zlib.crc32(body), 0, 0)
    return head[:28] + struct.pack("<I", zlib.crc32(head[:28])) + body


def encode(message):
    """The frame (bytes) of a message: 32-byte header + body, little-endian."""
    m = message
    if isinstance(m, Reply):
        return frame(T_REPLY, m.session, _reply_body(m))
    if isinstance(m, Completion):
        body = COMPLETION.pack(m.generation, m.round, m.attempt, m.depth, m.n_slots, m.status,
                               m.context_version, m.reply_bytes, m.reply_crc32, m.step_digest)
        return frame(T_COMPLETION, m.session, body)
    if isinstance(m, Step):
        return frame(T_STEP, m.session, step_body(m))
    if isinstance(m, Commit):
        parts = [COMMIT.pack(m.generation, m.round, len(m.slots), 0, 0)]
        parts += [COMMIT_SLOT.pack(s.slot, s.accepted, COMMIT_FALLBACK if s.fallback else 0,
                                   s.token, s.new_position, 0) for s in m.slots]
        return frame(T_COMMIT, m.session, b"".join(parts))
    if isinstance(m, Reset):
        return frame(T_RESET, m.session, RESET.pack(m.new_generation, m.reason, 0))
    if isinstance(m, Hello):
        body = HELLO.pack(m.wire_version, m.role, m.precision, m.draft_kind, 0, 0, m.vocab_size,
                          m.dense_width, m.max_slots, m.max_depth, m.max_support,
                          m.max_frame_bytes, 0, _text(m.q_semantic_id), _text(m.verifier_id),
                          _text(m.rng_abi), m.id_map_hash, _text(m.draft_identity),
                          _text(m.target_identity))
        return frame(T_HELLO, 0, body)
    raise TypeError(f"encode: not a wire message: {type(m).__name__}")


def step_body(m):
    parts = [STEP.pack(m.generation, m.round, m.attempt, m.depth, len(m.slots), 0,
                       m.context_version, m.top_k, m.temperature, 0)]
    parts += [STEP_SLOT.pack(s.slot, 0, s.anchor_position, s.seed, s.prefix_digest)
              for s in m.slots]
    return b"".join(parts)


def step_digest(step):
    """CRC32 of the STEP body: the COMPLETION's ``step_digest``."""
    return zlib.crc32(step_body(step))


_POSITIONS = np.arange(U8 + 1, dtype=np.uint8)


def _reply_body(m):
    """REPLY body of a (validated) Reply: fixed part, row table, values, ids."""
    n_slots, depth = m.sampled.shape
    rows = np.empty(n_slots * depth, dtype=ROW_DTYPE)
    rows["slot"] = np.repeat(np.asarray(m.slots, dtype=np.uint16), depth)
    rows["position"] = np.tile(_POSITIONS[:depth], n_slots)
    rows["repr"] = m.representation.ravel()
    rows["sampled"] = m.sampled.ravel()
    rows["n"] = m.n_entries.ravel()
    rows["checksum"] = m.checksums.ravel()
    head = REPLY.pack(m.generation, m.round, m.attempt, depth, n_slots, 0, m.context_version,
                      m.values.size, m.ids.size, 0)
    return b"".join((head, rows.tobytes(), m.values.astype("<f4", copy=False).tobytes(),
                     m.ids.astype("<i4", copy=False).tobytes()))


# ----------------------------------------------------------------------------- limits

def count_limits(n_slots, depth, limits, name):
    """1 <= n_slots <= max_slots and 1 <= depth <= max_depth (``LimitExceeded``)."""
    if not 1 <= n_slots <= limits.max_slots:
        raise E.LimitExceeded(f"{name}.n_slots", f"{n_slots} not in [1, {limits.max_slots}]")
    if not 1 <= depth <= limits.max_depth:
        raise E.LimitExceeded(f"{name}.depth", f"{depth} not in [1, {limits.max_depth}]")


def top_k_limit(top_k, limits):
    """A STEP's top_k: <= max_support; 0 (dense) only where dense rows were negotiated."""
    if top_k > limits.max_support:
        raise E.LimitExceeded("step.top_k", f"{top_k} > max_support {limits.max_support}")
    if top_k == 0 and not limits.dense_width and limits.vocab_size is not None:
        raise E.LimitExceeded("step.top_k", "dense q (top_k 0) was not negotiated")


def row_limits(rep, n, limits, name="reply.rows"):
    """Reply rows against the agreement: dense rows only where negotiated and
    exactly dense_width wide; sparse rows at most max_support entries.
    ``rep`` uint8, ``n`` uint32: 1-D arrays over the rows (representations valid)."""
    if REPR_DENSE in rep.tobytes():
        dense = rep == REPR_DENSE
        dw = limits.dense_width
        if not dw:
            r = int(np.flatnonzero(dense)[0])
            raise E.LimitExceeded(f"{name}[{r}].representation", "dense q not negotiated")
        bad = dense & (n != dw)
        if bad.any():
            r = int(np.flatnonzero(bad)[0])
            raise E.UnexpectedSize(f"{name}[{r}].n_entries",
                                   f"dense row has {int(n[r])} entries != dense_width {dw}")
        n = np.where(dense, 0, n)
    if int(n.max()) > limits.max_support:
        r = int(np.flatnonzero(n > limits.max_support)[0])
        raise E.LimitExceeded(f"{name}[{r}].n_entries",
                              f"{int(n[r])} > max_support {limits.max_support}")


def token_limit(token, limits, name):
    """A committed token id in [0, vocab_size) (``OutOfRangeId``)."""
    vocab = limits.vocab_size
    if token < 0 or (vocab is not None and token >= vocab):
        raise E.OutOfRangeId(name, f"{token} not in [0, {vocab})")


def check_limits(message, limits):
    """The negotiated bounds of a message that did not come through ``decode``
    (which checks them on the frame, before any variable-length read).

    Reply: vocab_size equal to the agreement's, slots/depth, row widths, frame
    size.  Step: slots/depth, top_k.  Completion: slots/depth.  Commit: slots,
    accepted counts, tokens.  Raises the same ``WireError`` as ``decode``."""
    if isinstance(message, Reply):
        if limits.vocab_size is None:
            raise E.NegotiationError("reply", "REPLY before HELLO negotiation")
        if message.vocab_size != limits.vocab_size:
            raise E.IdentityMismatch("reply.vocab_size", f"{message.vocab_size} != "
                                                         f"negotiated {limits.vocab_size}")
        count_limits(message.n_slots, message.depth, limits, "reply")
        row_limits(message.representation.ravel(), message.n_entries.ravel(), limits)
        size = (HEADER.size + REPLY.size + ROW_DTYPE.itemsize * message.sampled.size
                + 4 * (message.values.size + message.ids.size))
        if size > limits.max_frame_bytes:
            raise E.LimitExceeded("reply", f"frame of {size} bytes > max_frame_bytes "
                                           f"{limits.max_frame_bytes}")
    elif isinstance(message, Step):
        count_limits(len(message.slots), message.depth, limits, "step")
        top_k_limit(message.top_k, limits)
    elif isinstance(message, Completion):
        count_limits(message.n_slots, message.depth, limits, "completion")
    elif isinstance(message, Commit):
        _commit_limits(message.slots, limits)


def _commit_limits(slots, limits):
    if len(slots) > limits.max_slots:
        raise E.LimitExceeded("commit.n_slots", f"{len(slots)} not in [1, {limits.max_slots}]")
    for i, s in enumerate(slots):
        if s.accepted > limits.max_depth:
            raise E.LimitExceeded(f"commit.slots[{i}].accepted",
                                  f"{s.accepted} > max_depth {limits.max_depth}")
        token_limit(s.token, limits, f"commit.slots[{i}].token")


# ----------------------------------------------------------------------------- decode

def decode(data, *, limits=DEFAULT_LIMITS):
    """Decode one frame (the whole of ``data``) into a message.

    ``data``: bytes, bytearray or memoryview holding exactly one frame.
    ``limits``: the negotiated ``Limits`` (``Agreement.limits``; anything else
    is a ``TypeError``).  For any ``data``, raises a ``WireError`` subclass
    naming the field and rule, and nothing else.  The raised error's
    traceback keeps no local variables of the decoder (frames cleared), so
    holding the error does not hold the frame or arrays derived from it.
    """
    if not isinstance(limits, Limits):
        raise TypeError(f"limits: expected wire.Limits, got {type(limits).__name__}")
    try:
        return _decode(data, limits)
    except E.WireError as err:
        del data
        _drop_locals(err)
        raise


def _drop_locals(err):
    """Clear the finished frames of an error's traceback (and of its context)."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        traceback.clear_frames(err.__traceback__)
        err = err.__context__


def _decode(data, limits):
    try:
        if not isinstance(data, bytes):
            data = bytes(memoryview(data).cast("B"))  # a private, immutable copy
        buf = memoryview(data)
    except (TypeError, ValueError) as exc:
        raise E.NonCanonicalEncoding("frame", f"not a bytes-like object: {exc}") from None
    n = buf.nbytes
    if n < HEADER.size:
        raise E.TruncatedFrame("header", f"{n} bytes < header size {HEADER.size}")
    magic, version, mtype, session, body_len, body_crc, reserved, head_crc = \
        HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        raise E.BadMagic("header.magic", f"{bytes(magic)!r} != {MAGIC!r}")
    if zlib.crc32(buf[:28]) != head_crc:
        raise E.ChecksumMismatch("header.header_crc32", "header CRC32 does not match")
    if version != WIRE_VERSION:
        raise E.UnsupportedVersion("header.version",
                                   f"{version} != {WIRE_VERSION} (no auto-upgrade)")
    if reserved:
        raise E.NonCanonicalEncoding("header.reserved", "must be zero")
    if mtype not in TYPE_NAMES:
        raise E.UnknownMessageType("header.type", f"unknown message type {mtype}")
    if body_len > limits.max_frame_bytes - HEADER.size:
        raise E.LimitExceeded("header.body_length",
                              f"{body_len} + {HEADER.size} > max_frame_bytes "
                              f"{limits.max_frame_bytes}")
    if n < HEADER.size + body_len:
        raise E.TruncatedFrame("body", f"{n - HEADER.size} bytes < declared {body_len}")
    if n > HEADER.size + body_len:
        raise E.UnexpectedSize("frame", f"{n - HEADER.size - body_len} trailing bytes after "
                                        f"the declared body")
    body = buf[HEADER.size:]
    if zlib.crc32(body) != body_crc:
        raise E.ChecksumMismatch("header.body_crc32", "body CRC32 does not match")
    return _DECODERS[mtype](body, session, limits)


def _fixed(body, st, name):
    if body.nbytes != st.size:
        raise E.UnexpectedSize(f"{name}.body", f"{body.nbytes} bytes != {st.size}")
    return st.unpack_from(body, 0)


def _untext(raw, name):
    raw = bytes(raw)
    end = raw.find(b"\0")
    if end < 0:
        end = len(raw)
    if end == 0 or raw[end:].strip(b"\0") or any(not 0x20 <= c <= 0x7E for c in raw[:end]):
        raise E.NonCanonicalEncoding(name, "text field must be 1..32 printable ASCII bytes, "
                                           "NUL-padded")
    return raw[:end].decode("ascii")


def _d_hello(body, session, limits):
    (ver, role, prec, kind, r1, r2, vocab, dense_width, max_slots, max_depth, max_support,
     max_frame, r3, sem, ver_id, rng, idmap, draft, target) = _fixed(body, HELLO, "hello")
    if session:
        raise E.NonCanonicalEncoding("hello.session", "must be 0 in HELLO")
    if r1 or r2 or r3:
        raise E.NonCanonicalEncoding("hello.reserved", "must be zero")
    return Hello(role=role, vocab_size=vocab, dense_width=dense_width, max_slots=max_slots,
                 max_depth=max_depth, max_support=max_support, max_frame_bytes=max_frame,
                 q_semantic_id=_untext(sem, "hello.q_semantic_id"),
                 verifier_id=_untext(ver_id, "hello.verifier_id"),
                 rng_abi=_untext(rng, "hello.rng_abi"), id_map_hash=bytes(idmap),
                 draft_identity=_untext(draft, "hello.draft_identity"),
                 target_identity=_untext(target, "hello.target_identity"),
                 draft_kind=kind, precision=prec, wire_version=ver)


def _d_step(body, session, limits):
    if body.nbytes < STEP.size:
        raise E.UnexpectedSize("step.body", f"{body.nbytes} bytes < fixed part {STEP.size}")
    gen, rnd, attempt, depth, n_slots, r1, ctx, top_k, temp, r2 = STEP.unpack_from(body, 0)
    if r1 or r2:
        raise E.NonCanonicalEncoding("step.reserved", "must be zero")
    count_limits(n_slots, depth, limits, "step")
    if body.nbytes != STEP.size + n_slots * STEP_SLOT.size:
        raise E.UnexpectedSize("step.body", f"{body.nbytes} bytes != {STEP.size} + {n_slots} "
                                            f"x {STEP_SLOT.size}")
    top_k_limit(top_k, limits)
    slots = []
    for i in range(n_slots):
        slot, r, anchor, seed, digest = STEP_SLOT.unpack_from(body, STEP.size + i * STEP_SLOT.size)
        if r:
            raise E.NonCanonicalEncoding(f"step.slots[{i}].reserved", "must be zero")
        slots.append(StepSlot(slot, anchor, seed, bytes(digest)))
    return Step(session=session, generation=gen, round=rnd, attempt=attempt, depth=depth,
                context_version=ctx, top_k=top_k, temperature=temp, slots=tuple(slots))


def _d_completion(body, session, limits):
    gen, rnd, attempt, depth, n_slots, status, ctx, nbytes, crc, digest = \
        _fixed(body, COMPLETION, "completion")
    count_limits(n_slots, depth, limits, "completion")
    return Completion(session=session, generation=gen, round=rnd, attempt=attempt,
                      context_version=ctx, n_slots=n_slots, depth=depth, reply_bytes=nbytes,
                      reply_crc32=crc, step_digest=digest, status=status)


def _d_commit(body, session, limits):
    if body.nbytes < COMMIT.size:
        raise E.UnexpectedSize("commit.body", f"{body.nbytes} bytes < fixed part {COMMIT.size}")
    gen, rnd, n_slots, r1, r2 = COMMIT.unpack_from(body, 0)
    if r1 or r2:
        raise E.NonCanonicalEncoding("commit.reserved", "must be zero")
    if not 1 <= n_slots <= limits.max_slots:
        raise E.LimitExceeded("commit.n_slots", f"{n_slots} not in [1, {limits.max_slots}]")
    if body.nbytes != COMMIT.size + n_slots * COMMIT_SLOT.size:
        raise E.UnexpectedSize("commit.body", f"{body.nbytes} bytes != {COMMIT.size} + "
                                              f"{n_slots} x {COMMIT_SLOT.size}")
    slots = []
    for i in range(n_slots):
        slot, acc, flags, tok, pos, r = COMMIT_SLOT.unpack_from(body, COMMIT.size + i * 16)
        if r or flags & ~COMMIT_FALLBACK:
            raise E.NonCanonicalEncoding(f"commit.slots[{i}].flags", "reserved bits not zero")
        if acc > limits.max_depth:
            raise E.LimitExceeded(f"commit.slots[{i}].accepted",
                                  f"{acc} > max_depth {limits.max_depth}")
        token_limit(tok, limits, f"commit.slots[{i}].token")
        slots.append(CommitSlot(slot, acc, tok, pos, bool(flags & COMMIT_FALLBACK)))
    return Commit(session=session, generation=gen, round=rnd, slots=tuple(slots))


def _d_reset(body, session, limits):
    gen, reason, r = _fixed(body, RESET, "reset")
    if r:
        raise E.NonCanonicalEncoding("reset.reserved", "must be zero")
    return Reset(session=session, new_generation=gen, reason=reason)


def _d_reply(body, session, limits):
    """Frame-level REPLY rules (sizes, limits, row order), then the Reply
    constructor checks the q payload (the same rules as for a built Reply)."""
    vocab = limits.vocab_size
    if vocab is None:
        raise E.NegotiationError("reply", "REPLY before HELLO negotiation (vocab_size unknown)")
    if body.nbytes < REPLY.size:
        raise E.UnexpectedSize("reply.body", f"{body.nbytes} bytes < fixed part {REPLY.size}")
    gen, rnd, attempt, depth, n_slots, r1, ctx, n_vals, n_ids, r2 = REPLY.unpack_from(body, 0)
    if r1 or r2:
        raise E.NonCanonicalEncoding("reply.reserved", "must be zero")
    count_limits(n_slots, depth, limits, "reply")
    n_rows = n_slots * depth
    table_end = REPLY.size + ROW_DTYPE.itemsize * n_rows
    if body.nbytes < table_end:
        raise E.UnexpectedSize("reply.rows", f"body {body.nbytes} bytes < row table end "
                                             f"{table_end}")
    rows = np.frombuffer(body, dtype=ROW_DTYPE, count=n_rows, offset=REPLY.size)
    rep, n = rows["repr"], rows["n"]
    R.reply_rows(rep, n)
    row_limits(rep, n, limits)
    expect = table_end + 4 * n_vals + 4 * n_ids
    if body.nbytes != expect:
        raise E.UnexpectedSize("reply.body", f"{body.nbytes} bytes != {expect} implied by "
                                             f"the row table")
    slots = _row_order(rows["slot"], rows["position"], n_slots, depth)
    shape = (n_slots, depth)
    return Reply(session=session, generation=gen, round=rnd, attempt=attempt,
                 context_version=ctx, slots=slots, sampled=rows["sampled"].reshape(shape),
                 representation=rep.reshape(shape), n_entries=n.reshape(shape),
                 checksums=rows["checksum"].reshape(shape),
                 values=np.frombuffer(body, dtype="<f4", count=n_vals, offset=table_end),
                 ids=np.frombuffer(body, dtype="<i4", count=n_ids,
                                   offset=table_end + 4 * n_vals),
                 vocab_size=vocab)


def _row_order(slot, pos, n_slots, depth):
    """Rows slot-major, positions 0..depth-1 in each slot (``NonCanonicalEncoding``);
    returns the slot ids (their uniqueness is a Reply rule)."""
    if pos.tobytes() != _POSITIONS[:depth].tobytes() * n_slots:
        raise E.NonCanonicalEncoding("reply.rows.position",
                                     "rows must be slot-major with positions 0..depth-1")
    first = slot[::depth]
    if depth > 1 and np.repeat(first, depth).tobytes() != slot.tobytes():
        raise E.NonCanonicalEncoding("reply.rows.slot", "a slot's rows must be contiguous")
    return tuple(first.tolist())


def probability_checksum(counts, ids):
    """sum(count * (2 * id + 1)) mod 2**32 over one row's entries (representation-free)."""
    c = np.asarray(counts, dtype=np.uint64)
    i = np.asarray(ids, dtype=np.uint64)
    return int((c * (2 * i + 1)).sum() & U32)


_DECODERS = {T_HELLO: _d_hello, T_STEP: _d_step, T_REPLY: _d_reply,
             T_COMPLETION: _d_completion, T_COMMIT: _d_commit, T_RESET: _d_reset}
