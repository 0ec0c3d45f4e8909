"""dyadic.wire under hostile input: nothing of a refused frame is retained, every
message constructor applies the decoder's rules, and every conversion to a
Dyadic goes through the validating public constructor."""

import gc
import struct
import tracemalloc

import numpy as np
import pytest

import dyadic
from dyadic import wire as w
from dyadic.wire import _codec, _rules

T = 1 << 24
V = 16
LIM = w.Limits(vocab_size=V, max_support=8, dense_width=20, max_slots=4, max_depth=5)
BACKENDS = [b for b in ("cpu", "reference") if b in dyadic.available_backends()]


def raises(exc, fn, *a, **kw):
    with pytest.raises(exc) as info:
        fn(*a, **kw)
    assert type(info.value) is exc, repr(info.value)
    return info.value


def sparse_fields(ns, *, vocab=V, slots=None, depth=None, stride=1, session=1):
    """Valid Reply fields: row r has ns[r] entries, ids 0, stride, 2*stride, ...,
    counts 2**24 // n (the remainder on the first entry), sampled = first id."""
    ns = np.asarray(ns, np.int64)
    depth = depth or len(ns)
    slots = tuple(range(len(ns) // depth)) if slots is None else slots
    starts = np.concatenate([[0], np.cumsum(ns)[:-1]])
    col = np.arange(ns.sum()) - np.repeat(starts, ns)
    counts = np.repeat(T // ns, ns)
    counts[starts] += T - (T // ns) * ns
    ids = (col * stride).astype(np.int32)
    chk = np.add.reduceat(counts.astype(np.uint64) * (2 * ids.astype(np.uint64) + 1),
                          starts) & 0xFFFFFFFF
    shape = (len(slots), depth)
    return dict(session=session, generation=0, round=0, attempt=0, context_version=0,
                slots=slots, sampled=np.zeros(shape, np.int32),
                representation=np.full(shape, w.REPR_SPARSE, np.uint8),
                n_entries=ns.astype(np.uint32).reshape(shape),
                checksums=chk.astype(np.uint32).reshape(shape),
                values=(counts / T).astype(np.float32), ids=ids, vocab_size=vocab)


def reframe(frame, *patches):
    """``frame`` with each (body offset, struct format, value) of ``patches``
    packed into its body, both CRCs recomputed (the change reaches the rules)."""
    _, _, mtype, session, _, _, _, _ = _codec.HEADER.unpack_from(frame)
    body = bytearray(frame[32:])
    for offset, fmt, value in patches:
        struct.pack_into(fmt, body, offset, value)
    return w.frame(mtype, session, bytes(body))


# ----------------------------------------------------------------------------- retained memory

BIG_V = 1 << 20
BIG_LIM = w.Limits(vocab_size=BIG_V, max_support=1 << 15, max_slots=4, max_depth=4,
                   max_frame_bytes=1 << 23)


_BIG_ROWS = 16
_BIG = w.encode(w.Reply(**sparse_fields(np.full(_BIG_ROWS, 250_000 // _BIG_ROWS),
                                        vocab=BIG_V, depth=4, stride=7)))


def _big_refused_frames(count):
    """``count`` frames of 2 MB made from one valid frame, each with its own row
    layout (entries moved from row 1 to row 0: sizes stay consistent) and its
    last sparse id set to vocab_size (out of range)."""
    n = 250_000 // _BIG_ROWS
    for i in range(count):
        yield reframe(_BIG, (32 + 8, "<I", n + i + 1), (32 + 16 + 8, "<I", n - i - 1),
                      (len(_BIG) - 32 - 4, "<i", BIG_V))


def _traced(fn):
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = fn()
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    return grown, kept


def test_refused_frames_leave_nothing_behind():
    """100 refused 2 MB frames with distinct layouts, their errors all kept:
    the receiver's memory grows by less than 1 MB and the layout cache not at all."""
    cached = len(_rules.LAYOUTS)
    frames = _big_refused_frames(100)
    assert len(_BIG) > 2_000_000

    def run():
        errors = []
        for frame in frames:
            try:
                w.decode(frame, limits=BIG_LIM)
            except w.OutOfRangeId as err:
                errors.append(err)
            del frame
        return errors

    grown, errors = _traced(run)
    assert len(errors) == 100 and errors[0].field == "reply.ids"
    assert grown < 1 << 20, grown
    assert len(_rules.LAYOUTS) == cached


def _big_hello(role):
    return w.Hello(role=role, vocab_size=BIG_V, dense_width=0, max_slots=4, max_depth=4,
                   max_support=1 << 15, max_frame_bytes=1 << 23,
                   q_semantic_id="dyadic24-standard-v1", verifier_id="leviathan-standard-v2",
                   rng_abi="philox4x32-10-dyadic-v1", id_map_hash=b"\x01" * 32,
                   draft_identity="d", target_identity="t")


def test_discarded_rounds_keep_nothing_of_the_frame():
    """A verifier that keeps every Discarded (its error included) keeps nothing of
    the refused frames: the errors carry no traceback."""
    vs = w.VerifierSession(_big_hello(w.ROLE_VERIFIER), session=1)
    vs.on_hello(_big_hello(w.ROLE_DRAFTER))
    slots = [w.StepSlot(s, 0, s, b"\0" * 32) for s in range(4)]
    frames = _big_refused_frames(30)

    def run():
        kept = []
        for frame in frames:
            vs.begin_round(slots, depth=4, top_k=1 << 15)
            kept.append(vs.on_frame(frame))
            del frame
            vs.reset(w.RESET_CORRUPT)
        return kept

    grown, kept = _traced(run)
    assert all(isinstance(d, w.Discarded) and d.error.rule == "out-of-range-id" for d in kept)
    assert all(d.error.__traceback__ is None for d in kept)
    assert grown < 1 << 20, grown


def test_layout_cache_is_bounded():
    """Valid replies of many layouts: the cache stays within its entry and byte bounds
    and holds no frame buffer (descriptors are O(rows))."""
    lim = w.Limits(vocab_size=1000, max_support=200, max_slots=64, max_depth=16,
                   max_frame_bytes=1 << 22)
    for i in range(3 * _rules.LAYOUTS.MAX_ENTRIES):
        ns = [1 + (i + r) % 7 for r in range(1 + i % 12)]
        w.decode(w.encode(w.Reply(**sparse_fields(ns, vocab=1000))), limits=lim)
    assert len(_rules.LAYOUTS) <= _rules.LAYOUTS.MAX_ENTRIES
    assert _rules.LAYOUTS.nbytes() <= _rules.LAYOUTS.MAX_BYTES
    for lay, _ in _rules.LAYOUTS._d.values():
        assert all(not isinstance(a, np.ndarray) or a.base is None or
                   not isinstance(a.base, (bytes, memoryview)) for a in lay)


# ----------------------------------------------------------------------------- constructors

def hello_kw(**kw):
    d = dict(role=w.ROLE_DRAFTER, vocab_size=V, dense_width=20, max_slots=4, max_depth=5,
             max_support=8, max_frame_bytes=1 << 20, q_semantic_id="dyadic24-standard-v1",
             verifier_id="leviathan-standard-v2", rng_abi="philox4x32-10-dyadic-v1",
             id_map_hash=b"\x11" * 32, draft_identity="draft-toy", target_identity="tgt-toy")
    d.update(kw)
    return d


def step_kw(**kw):
    d = dict(session=9, generation=1, round=2, attempt=0, depth=3, context_version=3, top_k=8,
             temperature=0.5, slots=(w.StepSlot(0, 10, 7, b"\1" * 32),
                                     w.StepSlot(3, 11, 8, b"\2" * 32)))
    d.update(kw)
    return d


def completion_kw(**kw):
    d = dict(session=9, generation=1, round=2, attempt=0, context_version=3, n_slots=2,
             depth=3, reply_bytes=100, reply_crc32=5, step_digest=6)
    d.update(kw)
    return d


def commit_kw(**kw):
    d = dict(session=9, generation=1, round=2,
             slots=(w.CommitSlot(0, 2, 5, 13), w.CommitSlot(3, 0, 4, 12, fallback=True)))
    d.update(kw)
    return d


def reply_kw(**kw):
    d = sparse_fields([3, 2])
    d.update(kw)
    return d


BAD_FIELDS = [
    # (class, kwargs builder, field, bad value, error class, field named)
    (w.Hello, hello_kw, "role", 3, w.NonCanonicalEncoding, "hello.role"),
    (w.Hello, hello_kw, "role", True, w.NonCanonicalEncoding, "hello.role"),
    (w.Hello, hello_kw, "role", 1.0, w.NonCanonicalEncoding, "hello.role"),
    (w.Hello, hello_kw, "wire_version", 2.0, w.NonCanonicalEncoding, "hello.wire_version"),
    (w.Hello, hello_kw, "vocab_size", 0, w.LimitExceeded, "hello.vocab_size"),
    (w.Hello, hello_kw, "vocab_size", 2.5, w.NonCanonicalEncoding, "hello.vocab_size"),
    (w.Hello, hello_kw, "max_depth", 300, w.LimitExceeded, "hello.max_depth"),
    (w.Hello, hello_kw, "max_slots", 1 << 16, w.LimitExceeded, "hello.max_slots"),
    (w.Hello, hello_kw, "max_support", V + 1, w.LimitExceeded, "hello.max_support"),
    (w.Hello, hello_kw, "dense_width", V - 1, w.UnexpectedSize, "hello.dense_width"),
    (w.Hello, hello_kw, "max_frame_bytes", 1 << 40, w.LimitExceeded, "hello.max_frame_bytes"),
    (w.Hello, hello_kw, "rng_abi", "x" * 33, w.NonCanonicalEncoding, "hello.rng_abi"),
    (w.Hello, hello_kw, "id_map_hash", bytearray(32), w.UnexpectedSize, "hello.id_map_hash"),
    (w.Step, step_kw, "temperature", 0.1, w.NonCanonicalEncoding, "step.temperature"),
    (w.Step, step_kw, "temperature", 0.7, w.NonCanonicalEncoding, "step.temperature"),
    (w.Step, step_kw, "temperature", -0.0, w.NonCanonicalEncoding, "step.temperature"),
    (w.Step, step_kw, "temperature", float("nan"), w.NonCanonicalEncoding, "step.temperature"),
    (w.Step, step_kw, "temperature", 1e39, w.NonCanonicalEncoding, "step.temperature"),
    (w.Step, step_kw, "temperature", "0.5", w.NonCanonicalEncoding, "step.temperature"),
    (w.Step, step_kw, "temperature", 2 ** 60 + 1, w.NonCanonicalEncoding, "step.temperature"),
    (w.Step, step_kw, "depth", 0, w.LimitExceeded, "step.depth"),
    (w.Step, step_kw, "depth", 256, w.LimitExceeded, "step.depth"),
    (w.Step, step_kw, "attempt", -1, w.LimitExceeded, "step.attempt"),
    (w.Step, step_kw, "session", 1 << 64, w.LimitExceeded, "step.session"),
    (w.Step, step_kw, "top_k", np.float64(4), w.NonCanonicalEncoding, "step.top_k"),
    (w.Step, step_kw, "slots", (), w.UnexpectedSize, "step.slots"),
    (w.Step, step_kw, "slots", "ab", w.NonCanonicalEncoding, "step.slots"),
    (w.Step, step_kw, "slots", (w.StepSlot(1, 0, 0, b"\0" * 32),) * 2,
     w.NonCanonicalEncoding, "step.slots[1]"),
    (w.Step, step_kw, "slots", (w.StepSlot(1, (1 << 32) - 2, 0, b"\0" * 32),),
     w.LimitExceeded, "step.slots[0].anchor_position"),
    (w.Completion, completion_kw, "n_slots", 0, w.LimitExceeded, "completion.n_slots"),
    (w.Completion, completion_kw, "status", 7, w.NonCanonicalEncoding, "completion.status"),
    (w.Completion, completion_kw, "reply_crc32", 1 << 32, w.LimitExceeded,
     "completion.reply_crc32"),
    (w.Commit, commit_kw, "round", -1, w.LimitExceeded, "commit.round"),
    (w.Commit, commit_kw, "slots", (w.CommitSlot(1, 0, 1, 1),) * 2, w.NonCanonicalEncoding,
     "commit.slots[1]"),
    (w.Commit, commit_kw, "slots", [(1, 0, 1, 1)], w.NonCanonicalEncoding, "commit.slots[0]"),
    (w.Reset, lambda **kw: dict(dict(session=1, new_generation=2), **kw), "reason", 0,
     w.NonCanonicalEncoding, "reset.reason"),
    (w.Reply, reply_kw, "slots", (70000,), w.LimitExceeded, "reply.slots[0]"),
    (w.Reply, reply_kw, "slots", (0.0,), w.NonCanonicalEncoding, "reply.slots[0]"),
    (w.Reply, reply_kw, "slots", (0, 0), w.NonCanonicalEncoding, "reply.slots[1]"),
    (w.Reply, reply_kw, "vocab_size", 0, w.LimitExceeded, "reply.vocab_size"),
    (w.Reply, reply_kw, "sampled", np.array([[2 ** 40, 0]]), w.OutOfRangeId, "reply.sampled"),
    (w.Reply, reply_kw, "sampled", [[2 ** 70, 0]], w.OutOfRangeId, "reply.sampled"),
    (w.Reply, reply_kw, "sampled", np.array([[0.0, 0.0]]), w.NonCanonicalEncoding,
     "reply.sampled"),
    (w.Reply, reply_kw, "sampled", np.array([[True, False]]), w.NonCanonicalEncoding,
     "reply.sampled"),
    (w.Reply, reply_kw, "sampled", np.array([[V, 0]], np.int32), w.OutOfRangeId,
     "reply.rows[0].sampled"),
    (w.Reply, reply_kw, "sampled", np.array([[3, 0]], np.int32), w.ZeroQAtProposedToken,
     "reply.rows[0].sampled"),
    (w.Reply, reply_kw, "sampled", np.zeros(2, np.int32), w.UnexpectedSize, "reply.sampled"),
    (w.Reply, reply_kw, "ids", np.array([0, 1, 2, 2 ** 32, 1], np.int64), w.OutOfRangeId,
     "reply.ids"),
    (w.Reply, reply_kw, "ids", np.array([0, 1, V + 5, 0, 1], np.int32), w.OutOfRangeId,
     "reply.ids"),
    (w.Reply, reply_kw, "ids", np.array([0, 2, 1, 0, 1], np.int32), w.UnsortedSupport,
     "reply.ids"),
    (w.Reply, reply_kw, "ids", np.array([0, -1, 2, 0, 1], np.int32), w.PaddedId, "reply.ids"),
    (w.Reply, reply_kw, "representation", np.array([[w.REPR_SPARSE, 300]]),
     w.NonCanonicalEncoding, "reply.representation"),
    (w.Reply, reply_kw, "representation", np.array([[w.REPR_SPARSE, 0]], np.uint8),
     w.MissingQ, "reply.rows[1].representation"),
    (w.Reply, reply_kw, "n_entries", np.array([[3, -2]]), w.LimitExceeded, "reply.n_entries"),
    (w.Reply, reply_kw, "n_entries", np.array([[3, 3]], np.uint32), w.UnexpectedSize,
     "reply.total_entries"),
    (w.Reply, reply_kw, "checksums", np.array([[0, 1 << 33]]), w.LimitExceeded,
     "reply.checksums"),
    (w.Reply, reply_kw, "values", np.array([0.5, 0.25, 0.25 + 2 ** -40, 0.5, 0.5]),
     w.NonDyadicValue, "reply.values"),
    (w.Reply, reply_kw, "values", np.array([1, 0, 0, 1, 0]), w.NonCanonicalEncoding,
     "reply.values"),
    (w.Reply, reply_kw, "values", np.array([0.5, 0.25, 0.25, 0.5, -0.0], np.float32),
     w.NegativeValue, "reply.values"),
]


@pytest.mark.parametrize("cls,kw,name,value,exc,label", BAD_FIELDS,
                         ids=[f"{c.__name__}.{n}={v!r}"[:60] for c, _, n, v, _, _ in BAD_FIELDS])
def test_constructor_refuses_bad_field(cls, kw, name, value, exc, label):
    cls(**kw())                                   # the unmodified fields are valid
    e = raises(exc, cls, **kw(**{name: value}))
    assert e.field == label, (e.field, label)
    assert str(e).startswith(f"{exc.rule}: {label}: ")


@pytest.mark.parametrize("cls,kw,name,value,exc", [
    (w.CommitSlot, lambda **k: dict(dict(slot=0, accepted=0, token=1, new_position=1), **k),
     "token", -1, w.OutOfRangeId),
    (w.CommitSlot, lambda **k: dict(dict(slot=0, accepted=0, token=1, new_position=1), **k),
     "fallback", "yes", w.NonCanonicalEncoding),
    (w.CommitSlot, lambda **k: dict(dict(slot=0, accepted=0, token=1, new_position=1), **k),
     "accepted", 256, w.LimitExceeded),
    (w.StepSlot, lambda **k: dict(dict(slot=0, anchor_position=0, seed=1,
                                       prefix_digest=b"\0" * 32), **k),
     "seed", -1, w.LimitExceeded),
    (w.StepSlot, lambda **k: dict(dict(slot=0, anchor_position=0, seed=1,
                                       prefix_digest=b"\0" * 32), **k),
     "prefix_digest", b"\0" * 31, w.UnexpectedSize),
])
def test_slot_records_refuse_bad_field(cls, kw, name, value, exc):
    cls(**kw())
    e = raises(exc, cls, **kw(**{name: value}))
    assert name in e.field


def test_limits_refuse_bad_bounds():
    for kw, exc in ((dict(max_depth=256), w.LimitExceeded), (dict(max_slots=0), w.LimitExceeded),
                    (dict(vocab_size=0), w.LimitExceeded),
                    (dict(vocab_size=8, dense_width=4), w.UnexpectedSize),
                    (dict(max_support=1.5), w.NonCanonicalEncoding)):
        e = raises(exc, w.Limits, **kw)
        assert e.field.startswith("limits.")
    with pytest.raises(TypeError, match="limits"):
        w.decode(b"", limits={"vocab_size": 3})


# The same value inside a frame: the decoder refuses it with the same rule.
# (message, body offset, struct format, value, error class)
_FRAMED = [
    (w.Hello(**hello_kw()), 2, "<B", 3, w.NonCanonicalEncoding),           # role
    (w.Hello(**hello_kw()), 8, "<I", 0, w.LimitExceeded),                  # vocab_size
    (w.Hello(**hello_kw()), 12, "<I", V - 1, w.UnexpectedSize),            # dense_width
    (w.Hello(**hello_kw()), 18, "<H", 300, w.LimitExceeded),               # max_depth
    (w.Hello(**hello_kw()), 20, "<I", V + 1, w.LimitExceeded),             # max_support
    (w.Step(**step_kw()), 24, "<f", -0.0, w.NonCanonicalEncoding),         # temperature
    (w.Step(**step_kw()), 24, "<f", float("inf"), w.NonCanonicalEncoding),
    (w.Step(**step_kw()), 10, "<H", 0, w.LimitExceeded),                   # depth
    (w.Step(**step_kw()), 32 + 48, "<H", 0, w.NonCanonicalEncoding),       # slot 3 -> 0: twice
    (w.Step(**step_kw()), 32 + 4, "<I", (1 << 32) - 2, w.LimitExceeded),   # anchor + depth
    (w.Completion(**completion_kw()), 14, "<H", 7, w.NonCanonicalEncoding),  # status
    (w.Completion(**completion_kw()), 12, "<H", 0, w.LimitExceeded),       # n_slots
    (w.Commit(**commit_kw()), 16 + 4, "<i", -1, w.OutOfRangeId),           # token
    (w.Commit(**commit_kw()), 16 + 16, "<H", 0, w.NonCanonicalEncoding),   # slot 3 -> 0: twice
    (w.Commit(**commit_kw()), 16 + 3, "<B", 1, w.NonCanonicalEncoding),   # fallback, accepted
    (w.Reset(session=1, new_generation=2), 4, "<I", 0, w.NonCanonicalEncoding),  # reason
    (w.Reply(**reply_kw()), 32 + 4, "<i", V, w.OutOfRangeId),              # row 0 sampled
    (w.Reply(**reply_kw()), 32 + 16 + 4, "<i", 2, w.ZeroQAtProposedToken),  # row 1 sampled
    (w.Reply(**reply_kw()), 32 + 32 + 20 + 8, "<i", V + 5, w.OutOfRangeId),  # ids[2]
    (w.Reply(**reply_kw()), 32 + 32 + 8, "<f", 0.25 + 2 ** -25, w.NonDyadicValue),  # values[2]
    (w.Reply(**reply_kw()), 32 + 32 + 8, "<f", -0.25, w.NegativeValue),
]


@pytest.mark.parametrize("msg,offset,fmt,value,exc", _FRAMED,
                         ids=[f"{type(m).__name__}@{o}={v!r}" for m, o, _, v, _ in _FRAMED])
def test_decoder_refuses_the_same_value_with_the_same_rule(msg, offset, fmt, value, exc):
    frame = w.encode(msg)
    assert w.decode(frame, limits=LIM) == msg
    raises(exc, w.decode, reframe(frame, (offset, fmt, value)), limits=LIM)


def test_reply_arrays_are_private_copies():
    f = reply_kw()
    ids = f["ids"].copy()
    r = w.Reply(**{**f, "ids": ids})
    ids[0] = V + 5                      # the caller's array changes after construction
    assert r.ids[0] == 0 and not r.ids.flags.writeable and ids.flags.writeable
    assert w.decode(w.encode(r), limits=LIM) == r


def test_bad_sparse_id_never_reaches_a_kernel():
    bad = np.array([0, 1, V + 5, 0, 1], np.int32)
    raises(w.OutOfRangeId, w.Reply, **reply_kw(ids=bad))
    # A Reply whose ids were altered behind the constructor's back: to_dyadic
    # goes through dyadic.Dyadic(...), which refuses them before any draw.
    r = w.Reply(**reply_kw())
    for ids in (bad, np.array([0, 2, 1, 0, 1], np.int32), np.array([0, -1, 2, 0, 1], np.int32)):
        object.__setattr__(r, "ids", ids)           # out of range, not ascending, padding
        with pytest.raises(ValueError, match="ids"):
            r.to_dyadic()
    object.__setattr__(r, "ids", np.array([0, 1, 2, 0, 1], np.int32))
    object.__setattr__(r, "values", np.array([0.5, 0.25, 0.125, 0.5, 0.5], np.float32))
    with pytest.raises(ValueError, match="counts"):
        r.to_dyadic()


def test_to_dyadic_arguments():
    r = w.Reply(**reply_kw())
    assert r.to_dyadic().ids.shape == (1, 2, 3)
    assert r.to_dyadic(V, width=V).width == V
    for kw, exc in ((dict(vocab_size=V + 1), ValueError), (dict(width=2), ValueError),
                    (dict(width=V + 1), ValueError), (dict(width=3.0), TypeError)):
        with pytest.raises(exc):
            r.to_dyadic(**kw)


def test_session_checks_messages_handed_in_directly():
    """on_message applies the agreement's limits as decode does, so a constructed
    Reply of another vocabulary or too wide never becomes a Proposal."""
    hv = w.Hello(**hello_kw(role=w.ROLE_VERIFIER, dense_width=0, max_support=4))
    vs = w.VerifierSession(hv, session=1)
    vs.on_hello(w.Hello(**hello_kw(dense_width=0, max_support=4)))
    step = vs.begin_round([w.StepSlot(0, 0, 1, b"\0" * 32)], depth=2, top_k=4)
    wide = w.Reply(**sparse_fields([5, 2], vocab=V))
    d = vs.on_message(wide)
    assert isinstance(d, w.Discarded) and d.error.rule == "limit-exceeded"
    vs.retry()
    other = w.Reply(**{**sparse_fields([3, 2], vocab=V + 1), "attempt": 1})
    d = vs.on_message(other)
    assert d.error.rule == "identity-mismatch" and d.error.field == "reply.vocab_size"
    vs.reset(w.RESET_USER)
    with pytest.raises(w.NonCanonicalEncoding, match="step.temperature"):
        vs.begin_round(step.slots, depth=2, top_k=4, temperature=0.7)
    with pytest.raises(w.OutOfRangeId):
        w.prefix_digest(np.array([1, 2 ** 40]))


def test_from_dyadic_never_casts_sampled():
    q = w.Reply(**reply_kw()).to_dyadic()
    for sampled, exc in ((np.array([[2 ** 32, 0]]), w.OutOfRangeId),
                         (np.array([[0.0, 0.0]]), w.NonCanonicalEncoding)):
        raises(exc, w.Reply.from_dyadic, q, sampled, session=1, generation=0, round=0,
               slots=(0,))
    with pytest.raises(TypeError, match="dense_width"):
        w.Reply.from_dyadic(q, np.zeros((1, 2), np.int32), session=1, generation=0, round=0,
                            slots=(0,), representation="dense", dense_width=20.0)


# ----------------------------------------------------------------------------- properties

hyp = pytest.importorskip("hypothesis")
from hypothesis import given, settings, strategies as st  # noqa: E402

_ANY_INT = st.one_of(st.integers(-3, 300), st.integers(-2 ** 70, 2 ** 70), st.booleans(),
                     st.floats(allow_nan=True), st.just(None), st.text(max_size=2))


@st.composite
def reply_args(draw):
    """Reply fields that are valid, then changed in up to two places at random."""
    vocab = draw(st.integers(1, 24))
    n_slots, depth = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    dense_width = vocab + draw(st.sampled_from([0, 0, 2]))
    reps, ns, vals, ids, sampled = [], [], [], [], []
    for _ in range(n_slots * depth):
        dense = draw(st.booleans())
        support = sorted(draw(st.sets(st.integers(0, vocab - 1), min_size=1,
                                      max_size=min(vocab, 6))))
        cuts = sorted(draw(st.lists(st.integers(1, T - 1), min_size=len(support) - 1,
                                    max_size=len(support) - 1, unique=True)))
        counts = np.diff([0] + cuts + [T])
        sampled.append(draw(st.sampled_from(support)))
        if dense:
            row = np.zeros(dense_width, np.int64)
            row[support] = counts
            reps.append(w.REPR_DENSE)
            ns.append(dense_width)
            vals.append(row)
        else:
            reps.append(w.REPR_SPARSE)
            ns.append(len(support))
            vals.append(counts)
            ids.append(support)
    flat_counts = np.concatenate(vals)
    flat_ids = np.concatenate([np.asarray(i, np.int32) for i in ids]) if ids else \
        np.zeros(0, np.int32)
    chk = []
    for rep, c, row_ids in zip(reps, vals, iter_ids(reps, ids, dense_width)):
        chk.append(int((np.asarray(c, np.uint64) * (2 * np.asarray(row_ids, np.uint64) + 1))
                       .sum() & 0xFFFFFFFF))
    shape = (n_slots, depth)
    f = dict(session=draw(st.integers(0, 5)), generation=draw(st.integers(0, 5)), round=0,
             attempt=0, context_version=0, slots=tuple(range(n_slots)),
             sampled=np.asarray(sampled, np.int32).reshape(shape),
             representation=np.asarray(reps, np.uint8).reshape(shape),
             n_entries=np.asarray(ns, np.uint32).reshape(shape),
             checksums=np.asarray(chk, np.uint32).reshape(shape),
             values=(flat_counts / T).astype(np.float32), ids=flat_ids, vocab_size=vocab)
    for _ in range(draw(st.integers(0, 2))):
        name = draw(st.sampled_from(sorted(f)))
        f[name] = draw(_mutation(f[name]))
    return f, dense_width


def iter_ids(reps, ids, dense_width):
    k = iter(ids)
    for rep in reps:
        yield next(k) if rep == w.REPR_SPARSE else range(dense_width)


def _mutation(value):
    if isinstance(value, np.ndarray) and value.size:
        return st.one_of(
            st.tuples(st.integers(0, value.size - 1), st.integers(-2 ** 33, 2 ** 33))
            .map(lambda p: _set_flat(value, *p)),
            st.tuples(st.integers(0, value.size - 1), st.floats(allow_nan=True, width=32))
            .map(lambda p: _set_flat(value.astype(np.float64), *p)),
            st.sampled_from([np.float64, np.int64, np.uint8, np.bool_, np.float16])
            .map(lambda dt: _astype(value, dt)),
            st.just(value.reshape(-1)), st.just(value.tolist()))
    return _ANY_INT


def _astype(a, dtype):
    with np.errstate(all="ignore"):
        return a.astype(dtype)


def _set_flat(a, i, v):
    out = a.astype(np.float64 if isinstance(v, float) else np.int64)
    out.flat[i] = v
    return out


def _construct(f):
    """The encoded Reply of fields f, or the class and text of the error refusing them."""
    try:
        return w.encode(w.Reply(**f))
    except (w.WireError, ValueError, TypeError) as e:
        return type(e), str(e)


@settings(max_examples=150, deadline=None)
@given(reply_args(), st.integers(0, 2 ** 64 - 1))
def test_reply_property(args, seed):
    """Any fields: construction refuses them, or encode -> decode gives an equal
    Reply, and to_dyadic gives a Dyadic drawn alike by the cpu and reference backends."""
    f, dense_width = args
    outcome = _construct(f)
    orig = _rules.sparse_reply_valid
    _rules.sparse_reply_valid = lambda *a: False          # the ordered checks alone agree
    try:
        assert _construct(f) == outcome
    finally:
        _rules.sparse_reply_valid = orig
    if not isinstance(outcome, bytes):
        return
    r = w.Reply(**f)
    dense = (r.representation == w.REPR_DENSE).any()
    lim = w.Limits(vocab_size=r.vocab_size, max_support=r.vocab_size, max_slots=3,
                   max_depth=3, dense_width=dense_width if dense else 0,
                   max_frame_bytes=1 << 20)
    back = w.decode(w.encode(r), limits=lim)
    assert back == r and w.encode(back) == w.encode(r)
    try:
        q = r.to_dyadic()
    except (ValueError, TypeError):
        return
    keys = dyadic.Keys(seed=seed, position=np.arange(r.sampled.size, dtype=np.uint32))
    draws = [dyadic.draw(q, keys, backend=b) for b in BACKENDS]
    assert all(np.array_equal(d, draws[0]) for d in draws)
    assert draws[0].shape == r.sampled.shape


_SCALAR_MESSAGES = [(w.Hello, hello_kw), (w.Step, step_kw), (w.Completion, completion_kw),
                    (w.Commit, commit_kw),
                    (w.Reset, lambda **kw: dict(dict(session=1, new_generation=2), **kw))]


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(_SCALAR_MESSAGES), st.data())
def test_scalar_message_property(message, data):
    """Any field values: construction refuses them, or the message round-trips."""
    cls, kw = message
    fields = kw()
    for name in data.draw(st.lists(st.sampled_from(sorted(fields)), max_size=2)):
        fields[name] = data.draw(st.one_of(_ANY_INT, st.floats(0, 4, width=32),
                                           st.floats(0, 4)))
    try:
        m = cls(**fields)
    except (w.WireError, ValueError, TypeError):
        return
    lim = w.Limits(vocab_size=V, max_support=8, dense_width=20, max_slots=65535,
                   max_depth=255)
    try:
        back = w.decode(w.encode(m), limits=lim)
    except (w.LimitExceeded, w.OutOfRangeId):
        return                                  # a negotiated limit, not a message rule
    assert back == m and w.encode(back) == w.encode(m)
