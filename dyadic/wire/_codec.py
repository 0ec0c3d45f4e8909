"""encode / decode for wire v2 (layout: docs/wire.md).

``decode`` is strict and total: for any ``bytes``-like input it returns a
valid message or raises a ``WireError`` subclass; it never reads past the
buffer and never allocates from an unchecked length (every count is compared
with the negotiated ``Limits`` and with the bytes actually present before an
array is viewed).
"""

import struct
import zlib
from dataclasses import dataclass

import numpy as np

from . import _errors as E
from ._messages import (MAGIC, TEXT_BYTES, U32, WIRE_VERSION, REPR_DENSE, REPR_NONE,
                        REPR_SPARSE, Commit, CommitSlot, Completion, Hello, Reply, Reset,
                        Step, StepSlot, COMMIT_FALLBACK)

TOTAL = 1 << 24

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

    ``Agreement.limits`` gives the negotiated values.
    """

    max_frame_bytes: int = 1 << 24
    max_slots: int = 64
    max_depth: int = 16
    max_support: int = 1024
    vocab_size: int = None
    dense_width: int = 0


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


_TABLES = {}


def _reply_body(m):
    n_slots, depth = m.sampled.shape
    n_rows = n_slots * depth
    st = _TABLES.get(n_rows)
    if st is None:
        st = _TABLES[n_rows] = struct.Struct("<" + "HBBiII" * n_rows)
    slots = m.slots
    flat = []
    for r, row in enumerate(zip(m.representation.ravel().tolist(), m.sampled.ravel().tolist(),
                                m.n_entries.ravel().tolist(), m.checksums.ravel().tolist())):
        flat += (slots[r // depth], r % depth) + row
    head = REPLY.pack(m.generation, m.round, m.attempt, depth, n_slots, 0, m.context_version,
                      m.values.size, m.ids.size, 0)
    return b"".join((head, st.pack(*flat), m.values.astype("<f4", copy=False).tobytes(),
                     m.ids.astype("<i4", copy=False).tobytes()))


# ----------------------------------------------------------------------------- decode

def decode(data, *, limits=DEFAULT_LIMITS):
    """Decode one frame (the whole of ``data``) into a message.

    ``data``: bytes, bytearray or memoryview holding exactly one frame.
    ``limits``: the negotiated ``Limits`` (``Agreement.limits``).  Raises a
    ``WireError`` subclass naming the field and rule; nothing else.
    """
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


def _counts(n_slots, depth, limits, name):
    if not 1 <= n_slots <= limits.max_slots:
        raise E.LimitExceeded(f"{name}.n_slots", f"{n_slots} not in [1, {limits.max_slots}]")
    if not 1 <= depth <= limits.max_depth:
        raise E.LimitExceeded(f"{name}.depth", f"{depth} not in [1, {limits.max_depth}]")


def _d_step(body, session, limits):
    if body.nbytes < STEP.size:
        raise E.UnexpectedSize("step.body", f"{body.nbytes} bytes < fixed part {STEP.size}")
    gen, rnd, attempt, depth, n_slots, r1, ctx, top_k, temp, r2 = STEP.unpack_from(body, 0)
    if r1 or r2:
        raise E.NonCanonicalEncoding("step.reserved", "must be zero")
    _counts(n_slots, depth, limits, "step")
    if body.nbytes != STEP.size + n_slots * STEP_SLOT.size:
        raise E.UnexpectedSize("step.body", f"{body.nbytes} bytes != {STEP.size} + {n_slots} "
                                            f"x {STEP_SLOT.size}")
    if top_k > limits.max_support:
        raise E.LimitExceeded("step.top_k", f"{top_k} > max_support {limits.max_support}")
    if top_k == 0 and not limits.dense_width and limits.vocab_size is not None:
        raise E.LimitExceeded("step.top_k", "dense q (top_k 0) was not negotiated")
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
    _counts(n_slots, depth, limits, "completion")
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
    vocab = limits.vocab_size
    for i in range(n_slots):
        slot, acc, flags, tok, pos, r = COMMIT_SLOT.unpack_from(body, COMMIT.size + i * 16)
        if r or flags & ~COMMIT_FALLBACK:
            raise E.NonCanonicalEncoding(f"commit.slots[{i}].flags", "reserved bits not zero")
        if acc > limits.max_depth:
            raise E.LimitExceeded(f"commit.slots[{i}].accepted",
                                  f"{acc} > max_depth {limits.max_depth}")
        if tok < 0 or (vocab is not None and tok >= vocab):
            raise E.OutOfRangeId(f"commit.slots[{i}].token", f"{tok} not in [0, {vocab})")
        slots.append(CommitSlot(slot, acc, tok, pos, bool(flags & COMMIT_FALLBACK)))
    return Commit(session=session, generation=gen, round=rnd, slots=tuple(slots))


def _d_reset(body, session, limits):
    gen, reason, r = _fixed(body, RESET, "reset")
    if r:
        raise E.NonCanonicalEncoding("reset.reserved", "must be zero")
    return Reset(session=session, new_generation=gen, reason=reason)


def _where(rows, starts, flat_index):
    r = int(np.searchsorted(starts, flat_index, side="right") - 1)
    return f"row {r} (slot {int(rows['slot'][r])}, position {int(rows['position'][r])})"


def _d_reply(body, session, limits):
    vocab = limits.vocab_size
    if vocab is None:
        raise E.NegotiationError("reply", "REPLY before HELLO negotiation (vocab_size unknown)")
    if body.nbytes < REPLY.size:
        raise E.UnexpectedSize("reply.body", f"{body.nbytes} bytes < fixed part {REPLY.size}")
    gen, rnd, attempt, depth, n_slots, r1, ctx, n_vals, n_ids, r2 = REPLY.unpack_from(body, 0)
    if r1 or r2:
        raise E.NonCanonicalEncoding("reply.reserved", "must be zero")
    _counts(n_slots, depth, limits, "reply")
    n_rows = n_slots * depth
    table_end = REPLY.size + 16 * n_rows
    if body.nbytes < table_end:
        raise E.UnexpectedSize("reply.rows", f"body {body.nbytes} bytes < row table end "
                                             f"{table_end}")
    rows = np.frombuffer(body, dtype=ROW_DTYPE, count=n_rows, offset=REPLY.size)
    fast = _fast_sparse(body, session, rows, gen, rnd, attempt, depth, n_slots, ctx, n_vals,
                        n_ids, table_end, limits)
    if fast is not None:
        return fast
    # Slow path: checks every rule in the documented order and raises the first.
    rep = rows["repr"]
    n = rows["n"].astype(np.int64)
    sparse = rep == REPR_SPARSE
    dense = rep == REPR_DENSE
    if not (sparse | dense).all():
        r = int(np.flatnonzero(~(sparse | dense))[0])
        if rep[r] == REPR_NONE:
            raise E.MissingQ(f"reply.rows[{r}].representation", "no q for this position")
        raise E.NonCanonicalEncoding(f"reply.rows[{r}].representation",
                                     f"unknown representation {int(rep[r])}")
    if not (n > 0).all():
        r = int(np.flatnonzero(n == 0)[0])
        raise E.MissingQ(f"reply.rows[{r}].n_entries", "zero entries: no q for this position")
    dw = limits.dense_width
    if dense.any():
        if not dw:
            r = int(np.flatnonzero(dense)[0])
            raise E.LimitExceeded(f"reply.rows[{r}].representation", "dense q not negotiated")
        bad = dense & (n != dw)
        if bad.any():
            r = int(np.flatnonzero(bad)[0])
            raise E.UnexpectedSize(f"reply.rows[{r}].n_entries",
                                   f"dense row has {int(n[r])} entries != dense_width {dw}")
    bad = sparse & (n > limits.max_support)
    if bad.any():
        r = int(np.flatnonzero(bad)[0])
        raise E.LimitExceeded(f"reply.rows[{r}].n_entries",
                              f"{int(n[r])} > max_support {limits.max_support}")
    if int(n.sum()) != n_vals or int(n[sparse].sum()) != n_ids:
        raise E.UnexpectedSize("reply.total_entries", f"header says {n_vals} values / {n_ids} "
                                                      f"ids; rows say {int(n.sum())} / "
                                                      f"{int(n[sparse].sum())}")
    expect = table_end + 4 * n_vals + 4 * n_ids
    if body.nbytes != expect:
        raise E.UnexpectedSize("reply.body", f"{body.nbytes} bytes != {expect} implied by "
                                             f"the row table")
    pos = rows["position"]
    slot = rows["slot"]
    if depth > 1 or n_slots > 1:
        want = np.tile(np.arange(depth, dtype=np.uint8), n_slots)
        if not np.array_equal(pos, want):
            raise E.NonCanonicalEncoding("reply.rows.position",
                                         "rows must be slot-major with positions 0..depth-1")
        s2 = slot.reshape(n_slots, depth)
        if not (s2 == s2[:, :1]).all():
            raise E.NonCanonicalEncoding("reply.rows.slot", "a slot's rows must be contiguous")
        if np.unique(s2[:, 0]).size != n_slots:
            raise E.NonCanonicalEncoding("reply.rows.slot", "a slot appears twice")
    elif pos[0] != 0:
        raise E.NonCanonicalEncoding("reply.rows.position", "first position must be 0")

    bits = np.frombuffer(body, dtype="<u4", count=n_vals, offset=table_end)
    ids = np.frombuffer(body, dtype="<i4", count=n_ids, offset=table_end + 4 * n_vals)
    starts = np.zeros(n_rows, dtype=np.int64)
    np.cumsum(n[:-1], out=starts[1:])
    all_sparse = bool(sparse.all())
    # --- sparse ids
    if n_ids:
        if (ids < 0).any() or (ids >= vocab).any():
            j = int(np.flatnonzero((ids < 0) | (ids >= vocab))[0])
            if ids[j] == -1:
                raise E.PaddedId("reply.ids", f"sparse id {j} is padding (-1): rows list only "
                                              f"their nonzero entries")
            raise E.OutOfRangeId("reply.ids", f"sparse id {j} = {int(ids[j])} not in "
                                              f"[0, {vocab})")
    if all_sparse:
        id_flat = ids
    elif not sparse.any():
        id_flat = np.tile(np.arange(dw, dtype=np.int32), n_rows)
    else:
        parts, k = [], 0
        for r in range(n_rows):
            if sparse[r]:
                parts.append(ids[k:k + n[r]])
                k += int(n[r])
            else:
                parts.append(np.arange(dw, dtype=np.int32))
        id_flat = np.concatenate(parts)
    if n_vals > n_rows:
        d = np.diff(id_flat.astype(np.int64))
        same_row = np.ones(n_vals - 1, dtype=bool)
        same_row[starts[1:] - 1] = False
        dup = same_row & (d == 0)
        if dup.any():
            j = int(np.flatnonzero(dup)[0]) + 1
            raise E.DuplicateSparseId("reply.ids", f"{_where(rows, starts, j)}: id "
                                                   f"{int(id_flat[j])} repeated")
        uns = same_row & (d < 0)
        if uns.any():
            j = int(np.flatnonzero(uns)[0]) + 1
            raise E.UnsortedSupport("reply.ids", f"{_where(rows, starts, j)}: ids must be "
                                                 f"strictly ascending")
    # --- values
    nonfinite = (bits & 0x7F800000) == 0x7F800000
    if nonfinite.any():
        j = int(np.flatnonzero(nonfinite)[0])
        raise E.NonFiniteValue("reply.values", f"{_where(rows, starts, j)}: entry {j} is not "
                                               f"finite")
    if (bits >> 31).any():
        j = int(np.flatnonzero(bits >> 31)[0])
        raise E.NegativeValue("reply.values", f"{_where(rows, starts, j)}: entry {j} has its "
                                              f"sign bit set")
    scaled = bits.view("<f4").astype(np.float64) * TOTAL
    # Range check before the cast: a huge finite value (up to FP32 max * 2**24) would
    # overflow uint64 and emit a RuntimeWarning. ~(<=) also catches NaN (already
    # rejected above by its bits); such entries cast as 0 and are flagged through `over`.
    over = ~(scaled <= TOTAL)
    counts = np.where(over, 0.0, scaled).astype(np.uint64)
    bad = (counts != scaled) | over
    if bad.any():
        j = int(np.flatnonzero(bad)[0])
        raise E.NonDyadicValue("reply.values", f"{_where(rows, starts, j)}: entry {j} "
                                               f"{float(scaled[j]) / TOTAL!r} is not c / 2**24")
    zero = counts == 0
    if all_sparse:
        if zero.any():
            j = int(np.flatnonzero(zero)[0])
            raise E.NonCanonicalSupport("reply.values", f"{_where(rows, starts, j)}: sparse "
                                                        f"entry {j} is zero")
    else:
        zbad = zero & np.repeat(sparse, n)
        if zbad.any():
            j = int(np.flatnonzero(zbad)[0])
            raise E.NonCanonicalSupport("reply.values", f"{_where(rows, starts, j)}: sparse "
                                                        f"entry {j} is zero")
        if dw > vocab:
            padbad = (id_flat >= vocab) & ~zero
            if padbad.any():
                j = int(np.flatnonzero(padbad)[0])
                raise E.PaddedId("reply.values", f"{_where(rows, starts, j)}: dense padding "
                                                 f"beyond vocabulary {vocab} must be zero")
    sums = np.add.reduceat(counts, starts)
    if (sums != TOTAL).any():
        r = int(np.flatnonzero(sums != TOTAL)[0])
        raise E.WrongTotalMass(f"reply.rows[{r}].values", f"counts sum to {int(sums[r])} != "
                                                          f"2**24")
    sampled = rows["sampled"]
    if (sampled < 0).any() or (sampled >= vocab).any():
        r = int(np.flatnonzero((sampled < 0) | (sampled >= vocab))[0])
        raise E.OutOfRangeId(f"reply.rows[{r}].sampled", f"{int(sampled[r])} not in [0, {vocab})")
    row_of = np.repeat(np.arange(n_rows, dtype=np.int64), n)
    key = (row_of << 32) | id_flat.astype(np.int64)
    want = (np.arange(n_rows, dtype=np.int64) << 32) | sampled.astype(np.int64)
    at = np.minimum(np.searchsorted(key, want), n_vals - 1)
    hit = key[at] == want
    if not hit.all():
        r = int(np.flatnonzero(~hit)[0])
        raise E.ZeroQAtProposedToken(f"reply.rows[{r}].sampled",
                                     f"token {int(sampled[r])} has q = 0")
    if zero[at].any():
        r = int(np.flatnonzero(zero[at])[0])
        raise E.ZeroQAtProposedToken(f"reply.rows[{r}].sampled",
                                     f"token {int(sampled[r])} has q = 0")
    chk = np.add.reduceat(counts * (2 * id_flat.astype(np.uint64) + 1), starts) & U32
    if (chk != rows["checksum"]).any():
        r = int(np.flatnonzero(chk != rows["checksum"])[0])
        raise E.ProbabilityChecksumMismatch(f"reply.rows[{r}].checksum",
                                            "probability checksum does not match q")
    return Reply(session=session, generation=gen, round=rnd, attempt=attempt,
                 context_version=ctx, slots=tuple(int(s) for s in slot[::depth]),
                 sampled=sampled.reshape(n_slots, depth),
                 representation=rep.reshape(n_slots, depth),
                 n_entries=rows["n"].reshape(n_slots, depth),
                 checksums=rows["checksum"].reshape(n_slots, depth),
                 values=bits.view("<f4"), ids=ids, vocab_size=vocab)


_LO, _SPAN = 0x33800000, 0x3F800000 - 0x33800000   # FP32 bits of 2**-24 and of 1.0
_F24 = np.float32(TOTAL)
_POS = {}


_ROW = struct.Struct("<HBBiII")
_LAYOUT = {}


def _layout(ns):
    """Cached per row-size pattern: starts, row-boundary indices, per-entry row
    base (row << 24) and the expected row-sum bytes."""
    lay = _LAYOUT.get(ns)
    if lay is None:
        if len(_LAYOUT) > 256:
            _LAYOUT.clear()
        n = np.asarray(ns, dtype=np.intp)
        starts = np.zeros(n.size, dtype=np.intp)
        np.cumsum(n[:-1], out=starts[1:])
        base = np.arange(n.size, dtype=np.int64) << 24
        lay = _LAYOUT[ns] = (starts, starts[1:] - 1, np.repeat(base, n), base,
                             np.full(n.size, TOTAL, dtype=np.uint64).tobytes())
    return lay


def _fast_sparse(body, session, rows, gen, rnd, attempt, depth, n_slots, ctx, n_vals, n_ids,
                 table_end, limits):
    """All-sparse, fully valid replies with few vectorised operations; None means
    "not provably valid here": the ordered slow path then finds the broken rule."""
    max_support = limits.max_support
    ns = []
    slots = []
    sampled = []
    r = 0
    for slot, pos, rep, smp, n, _ in _ROW.iter_unpack(body[REPLY.size:table_end]):
        if rep != REPR_SPARSE or not 1 <= n <= max_support or pos != r % depth:
            return None
        if pos == 0:
            slots.append(slot)
        elif slot != slots[-1]:
            return None
        ns.append(n)
        sampled.append(smp)
        r += 1
    total = sum(ns)
    if total != n_vals or total != n_ids or body.nbytes != table_end + 8 * total or \
            len(set(slots)) != n_slots:
        return None
    vocab = limits.vocab_size
    if min(sampled) < 0 or max(sampled) >= vocab:
        return None
    ns = tuple(ns)
    starts, bounds, rowbase, base, sums_ok = _layout(ns)
    bits = np.frombuffer(body, dtype="<u4", count=total, offset=table_end)
    if int((bits - np.uint32(_LO)).max()) > _SPAN:      # every value in [2**-24, 1]
        return None
    vals = bits.view("<f4")
    scaled = vals * _F24                               # exact (power-of-two scale)
    counts = scaled.astype(np.uint32)
    if (scaled - counts.astype(np.float32)).any():     # dyadic: c / 2**24, c integer
        return None
    if np.add.reduceat(counts, starts, dtype=np.uint64).tobytes() != sums_ok:
        return None
    ids = np.frombuffer(body, dtype="<i4", count=total, offset=table_end + 4 * total)
    uids = ids.view("<u4")
    if int(uids.max()) >= vocab:
        return None
    if total > 1:
        d = ids[1:] - ids[:-1]
        d[bounds] = 1
        if d.min() <= 0:                               # strictly ascending in each row
            return None
    keyed = rowbase + ids
    want = base + rows["sampled"]
    at = np.searchsorted(keyed, want)
    np.minimum(at, total - 1, out=at)
    if keyed[at].tobytes() != want.tobytes():          # q(sampled) > 0
        return None
    chk = np.add.reduceat(counts * (uids + uids + np.uint32(1)), starts, dtype=np.uint32)
    if chk.tobytes() != rows["checksum"].tobytes():
        return None
    shape = (n_slots, depth)
    return Reply._trusted(session=session, generation=gen, round=rnd, attempt=attempt,
                          context_version=ctx, slots=tuple(slots),
                          sampled=rows["sampled"].reshape(shape),
                          representation=rows["repr"].reshape(shape),
                          n_entries=rows["n"].reshape(shape),
                          checksums=rows["checksum"].reshape(shape), values=vals, ids=ids,
                          vocab_size=vocab)


def probability_checksum(counts, ids):
    """sum(count * (2 * id + 1)) mod 2**32 over one row's entries (representation-free)."""
    c = np.asarray(counts, dtype=np.uint64)
    i = np.asarray(ids, dtype=np.uint64)
    return int((c * (2 * i + 1)).sum() & U32)


_DECODERS = {T_HELLO: _d_hello, T_STEP: _d_step, T_REPLY: _d_reply,
             T_COMPLETION: _d_completion, T_COMMIT: _d_commit, T_RESET: _d_reset}
