"""dyadic.wire: every rejection rule, conversions, negotiation, sessions, sizes, fuzzing."""

import struct
import warnings
import zlib

import numpy as np
import pytest

import dyadic
from dyadic import wire as w
from dyadic.wire import _codec, _rules

BACKEND = "cpu" if "cpu" in dyadic.available_backends() else "reference"
V = 16
T = 1 << 24
LIM = w.Limits(vocab_size=V, max_support=8, dense_width=20, max_slots=4, max_depth=5)


def raises(exc, fn, *a, **kw):
    with pytest.raises(exc) as info:
        fn(*a, **kw)
    assert type(info.value) is exc, type(info.value)
    assert str(info.value).startswith(exc.rule + ": "), str(info.value)
    return info.value


def row(ids, counts, rep=w.REPR_SPARSE):
    return (np.asarray(ids, np.int32), np.asarray(counts, np.int64), rep)


def reply_fields(rows, sampled, *, depth=None, slots=(0,), chk=None, values=None, gen=0,
                 rnd=0, vocab=V):
    """Reply constructor arguments from rows (ids, counts, representation); a
    negative count becomes the value -1.0 (so the fields can break every rule)."""
    depth = depth or len(rows) // len(slots)
    vals, ids, reps, ns, chks = [], [], [], [], []
    for rid, c, rep in rows:
        v = np.where(c >= 0, c, 0).astype(np.float64) / T
        v = np.where(c < 0, -1.0, v)
        vals.append(v.astype(np.float32))
        if rep == w.REPR_SPARSE:
            ids.append(rid)
            eff = rid.astype(np.uint64)
        else:
            eff = np.arange(len(c), dtype=np.uint64)
        reps.append(rep)
        ns.append(len(c))
        chks.append(int((np.maximum(c, 0).astype(np.uint64) * (2 * eff + 1)).sum() & 0xFFFFFFFF))
    shape = (len(slots), depth)
    return dict(session=1, generation=gen, round=rnd, attempt=0, context_version=0,
                slots=slots, sampled=np.asarray(sampled, np.int32).reshape(shape),
                representation=np.asarray(reps, np.uint8).reshape(shape),
                n_entries=np.asarray(ns, np.uint32).reshape(shape),
                checksums=np.asarray(chk if chk is not None else chks,
                                     np.uint32).reshape(shape),
                values=np.concatenate(vals) if values is None else values,
                ids=np.concatenate(ids) if ids else np.zeros(0, np.int32), vocab_size=vocab)


def pack_reply(f):
    """The REPLY frame of raw Reply fields, packed without any check (the
    Reply constructor would refuse invalid fields; the decoder must too)."""
    n_slots, depth = f["sampled"].shape
    rows = np.zeros(n_slots * depth, _codec.ROW_DTYPE)
    rows["slot"] = np.repeat(np.asarray(f["slots"], np.uint16), depth)
    rows["position"] = np.tile(np.arange(depth, dtype=np.uint8), n_slots)
    rows["repr"] = f["representation"].ravel()
    rows["sampled"] = f["sampled"].ravel()
    rows["n"] = f["n_entries"].ravel()
    rows["checksum"] = f["checksums"].ravel()
    values = np.asarray(f["values"], "<f4")
    ids = np.asarray(f["ids"], "<i4")
    head = _codec.REPLY.pack(f["generation"], f["round"], f["attempt"], depth, n_slots, 0,
                             f["context_version"], values.size, ids.size, 0)
    return w.frame(w.T_REPLY, f["session"], head + rows.tobytes() + values.tobytes()
                   + ids.tobytes())


def mk_reply(rows, sampled, **kw):
    """A REPLY frame built without payload validation (so it can break every rule)."""
    return pack_reply(reply_fields(rows, sampled, **kw))


GOOD = [row([1, 5, 9], [T // 2, T // 4, T // 4])]


def dec(frame, limits=LIM):
    return w.decode(frame, limits=limits)


def test_good_reply_roundtrip():
    m = dec(mk_reply(GOOD, [5]))
    assert m.sampled.tolist() == [[5]]
    q = m.to_dyadic(V)
    assert q.counts.tolist() == [[[T // 2, T // 4, T // 4]]]
    assert q.ids.tolist() == [[[1, 5, 9]]]


# rules that depend on the negotiated limits (max_support 8, dense_width 20): decode only
_LIMIT_ONLY = {"LimitExceeded", "UnexpectedSize"}


@pytest.mark.parametrize("rows,sampled,exc", [
    ([row([1, 5, 5], [T // 2, T // 4, T // 4])], [1], w.DuplicateSparseId),
    ([row([1, 3, 3, 4], [T // 2, 0, 0, T // 2])], [1], w.DuplicateSparseId),  # duplicate zeros
    ([row([5, 1, 9], [T // 2, T // 4, T // 4])], [1], w.UnsortedSupport),
    ([row([1, 5, 9], [T // 2, 0, T // 2])], [1], w.NonCanonicalSupport),
    ([row([1, 5, 16], [T // 2, T // 4, T // 4])], [1], w.OutOfRangeId),
    ([row([1, 5, -1], [T // 2, T // 2, 0])], [1], w.PaddedId),
    ([row([1, 5, -7], [T // 2, T // 2, 0])], [1], w.OutOfRangeId),
    ([row([], [])], [1], w.MissingQ),
    ([row([1, 5, 9], [T // 2, T // 4, -1])], [1], w.NegativeValue),
    ([row([1, 5, 9], [T // 2, T // 4, T // 4 - 1])], [1], w.WrongTotalMass),
    ([row([1, 5, 9], [T // 2, T // 4, T // 4])], [2], w.ZeroQAtProposedToken),
    ([row([1, 5, 9], [T // 2, T // 4, T // 4])], [16], w.OutOfRangeId),
    ([row([1, 5, 9], [T // 2, T // 4, T // 4])], [-3], w.OutOfRangeId),
    ([row([0, 1, 2, 3, 4, 5, 6, 7, 8], [T // 16] * 8 + [T // 2])], [1], w.LimitExceeded),
    ([row(list(range(20)), [T // 16] * 15 + [T // 16 - 1] + [0] * 4, w.REPR_DENSE)], [1],
     w.WrongTotalMass),
    ([row(list(range(16)), [T // 16] * 16, w.REPR_DENSE)], [1], w.UnexpectedSize),
    ([row(list(range(20)), [T // 16] * 15 + [0, T // 16, 0, 0, 0], w.REPR_DENSE)], [1],
     w.PaddedId),
])
def test_reply_rules(rows, sampled, exc):
    """The decoder and the Reply constructor refuse the same fields with the same rule."""
    f = reply_fields(rows, sampled)
    e = raises(exc, dec, pack_reply(f))
    assert e.field
    if exc.__name__ in _LIMIT_ONLY:
        assert w.encode(w.Reply(**f)) == pack_reply(f)      # valid apart from the limits
    else:
        c = raises(exc, w.Reply, **f)
        assert (c.field, c.detail) == (e.field, e.detail)


def test_dense_padding_zero_ok_and_checksum():
    r = dec(mk_reply([row(list(range(20)), [T // 16] * 16 + [0] * 4, w.REPR_DENSE)], [3]))
    assert r.to_dyadic(V).counts.shape == (1, 1, V)
    raises(w.ProbabilityChecksumMismatch, dec, mk_reply(GOOD, [5], chk=[123]))
    raises(w.ProbabilityChecksumMismatch, w.Reply, **reply_fields(GOOD, [5], chk=[123]))


@pytest.mark.parametrize("value,exc", [
    (np.nan, w.NonFiniteValue), (np.inf, w.NonFiniteValue), (-np.inf, w.NonFiniteValue),
    (-0.0, w.NegativeValue), (-0.25, w.NegativeValue), (0.25 + 2.0 ** -25, w.NonDyadicValue),
    (2.0, w.NonDyadicValue), (2.0 ** -30, w.NonDyadicValue),
])
def test_value_rules(value, exc):
    vals = np.array([0.5, 0.25, value], np.float32)
    raises(exc, dec, mk_reply(GOOD, [5], values=vals))
    raises(exc, w.Reply, **reply_fields(GOOD, [5], values=vals))


@pytest.mark.parametrize("value,shown", [
    (1e30, "1.0000000150474662e+30"), (2.0 ** 40, "1099511627776.0"),
    (np.finfo(np.float32).max, "3.4028234663852886e+38"),
])
def test_huge_finite_value_is_non_dyadic_without_warning(value, shown):
    # value * 2**24 is past uint64: casting before the range check used to emit
    # "RuntimeWarning: invalid value encountered in cast" (an exception under -W error).
    vals = np.array([0.5, 0.25, value], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        e = raises(w.NonDyadicValue, dec, mk_reply(GOOD, [5], values=vals))
        c = raises(w.NonDyadicValue, w.Reply, **reply_fields(GOOD, [5], values=vals))
    assert e.field == c.field == "reply.values"
    assert e.detail == c.detail == f"row 0 (slot 0, position 0): entry 2 {shown} is not c / 2**24"


def test_total_mass_checked_in_uint64():
    # 257 entries of exactly 1.0: uint32 sum would wrap to 2**24; uint64 must not.
    n = 257
    lim = w.Limits(vocab_size=1000, max_support=300)
    f = reply_fields([row(list(range(n)), [T] * n)], [0], vocab=1000)
    raises(w.WrongTotalMass, w.decode, pack_reply(f), limits=lim)
    raises(w.WrongTotalMass, w.Reply, **f)


def test_representation_none_is_missing_q():
    f = {**reply_fields(GOOD, [5]), "representation": np.zeros((1, 1), np.uint8)}
    raises(w.MissingQ, dec, pack_reply(f))
    raises(w.MissingQ, w.Reply, **f)


def test_reply_needs_negotiated_vocab():
    raises(w.NegotiationError, w.decode, mk_reply(GOOD, [5]))


def _rehead(f, **kw):
    magic, ver, typ, ses, blen, bcrc, res, _ = _codec.HEADER.unpack_from(f)
    d = dict(magic=magic, ver=ver, typ=typ, ses=ses, blen=blen, bcrc=bcrc, res=res)
    d.update(kw)
    h = _codec.HEADER.pack(d["magic"], d["ver"], d["typ"], d["ses"], d["blen"], d["bcrc"],
                           d["res"], 0)[:28]
    return h + struct.pack("<I", zlib.crc32(h)) + f[32:]


def test_header_rules():
    f = mk_reply(GOOD, [5])
    raises(w.TruncatedFrame, w.decode, f[:10], limits=LIM)
    raises(w.TruncatedFrame, w.decode, f[:-1], limits=LIM)
    raises(w.UnexpectedSize, w.decode, f + b"\0", limits=LIM)
    raises(w.BadMagic, w.decode, b"XXXX" + f[4:], limits=LIM)
    raises(w.ChecksumMismatch, w.decode, f[:5] + b"\x07" + f[6:], limits=LIM)
    raises(w.ChecksumMismatch, w.decode, f[:-1] + bytes([f[-1] ^ 1]), limits=LIM)
    raises(w.UnsupportedVersion, w.decode, _rehead(f, ver=3), limits=LIM)
    raises(w.UnsupportedVersion, w.decode, _rehead(f, ver=1), limits=LIM)
    raises(w.UnknownMessageType, w.decode, _rehead(f, typ=9), limits=LIM)
    raises(w.NonCanonicalEncoding, w.decode, _rehead(f, res=1), limits=LIM)
    raises(w.LimitExceeded, w.decode, _rehead(f, blen=1 << 30), limits=LIM)
    raises(w.LimitExceeded, w.decode, f, limits=w.Limits(vocab_size=V, max_frame_bytes=64))


def _body_frame(typ, body, session=1):
    return w.frame(typ, session, body)


def test_reply_layout_rules():
    f = mk_reply(GOOD * 2, [5, 9], depth=2)
    body = bytearray(f[32:])
    # depth / slots beyond the negotiated bounds
    b = bytearray(body); struct.pack_into("<H", b, 10, 9)
    raises(w.LimitExceeded, w.decode, _body_frame(w.T_REPLY, bytes(b)), limits=LIM)
    b = bytearray(body); struct.pack_into("<H", b, 12, 5)
    raises(w.LimitExceeded, w.decode, _body_frame(w.T_REPLY, bytes(b)), limits=LIM)
    # header total entries disagree with the rows
    b = bytearray(body); struct.pack_into("<I", b, 20, 7)
    raises(w.UnexpectedSize, w.decode, _body_frame(w.T_REPLY, bytes(b)), limits=LIM)
    # reserved
    b = bytearray(body); struct.pack_into("<H", b, 14, 1)
    raises(w.NonCanonicalEncoding, w.decode, _body_frame(w.T_REPLY, bytes(b)), limits=LIM)
    # positions out of order (row 1 says position 0)
    b = bytearray(body); b[32 + 16 + 2] = 0
    raises(w.NonCanonicalEncoding, w.decode, _body_frame(w.T_REPLY, bytes(b)), limits=LIM)
    # unknown representation
    b = bytearray(body); b[32 + 3] = 7
    raises(w.NonCanonicalEncoding, w.decode, _body_frame(w.T_REPLY, bytes(b)), limits=LIM)
    # short body
    raises(w.UnexpectedSize, w.decode, _body_frame(w.T_REPLY, bytes(body[:40])), limits=LIM)
    # dense rows when dense was not negotiated
    d = mk_reply([row(list(range(20)), [T // 16] * 16 + [0] * 4, w.REPR_DENSE)], [3])
    raises(w.LimitExceeded, dec, d, w.Limits(vocab_size=V, max_support=8))


# ----------------------------------------------------------------------------- HELLO

def hello(role, **kw):
    d = dict(role=role, vocab_size=V, dense_width=20, max_slots=4, max_depth=5, max_support=8,
             max_frame_bytes=1 << 20, q_semantic_id="dyadic24-standard-v1",
             verifier_id="leviathan-standard-v2", rng_abi="philox4x32-10-dyadic-v1",
             id_map_hash=b"\x11" * 32, draft_identity="draft-toy", target_identity="tgt-toy")
    d.update(kw)
    return w.Hello(**d)


def test_hello_roundtrip_and_negotiation():
    a, b = hello(w.ROLE_DRAFTER), hello(w.ROLE_VERIFIER, max_support=4, max_depth=3)
    assert w.decode(w.encode(a)) == a
    ag1, ag2 = w.negotiate(a, b), w.negotiate(b, a)
    assert ag1.limits == ag2.limits
    assert ag1.limits.max_support == 4 and ag1.limits.max_depth == 3


@pytest.mark.parametrize("field,value", [
    ("q_semantic_id", "dyadic24-floor-first-v1"), ("verifier_id", "other"),
    ("rng_abi", "philox-v0"), ("id_map_hash", b"\x22" * 32), ("draft_identity", "x"),
    ("target_identity", "y"), ("vocab_size", 17), ("draft_kind", w.DRAFT_ADAPTED),
])
def test_negotiation_identity_mismatch(field, value):
    e = raises(w.IdentityMismatch, w.negotiate, hello(w.ROLE_DRAFTER),
               hello(w.ROLE_VERIFIER, **{field: value}))
    assert field in str(e)


def test_negotiation_failures():
    raises(w.IdentityMismatch, w.negotiate, hello(w.ROLE_DRAFTER), hello(w.ROLE_DRAFTER))
    raises(w.NegotiationError, w.negotiate, hello(w.ROLE_DRAFTER, max_support=0),
           hello(w.ROLE_VERIFIER, dense_width=0))
    raises(w.NegotiationError, w.negotiate, hello(w.ROLE_DRAFTER, max_frame_bytes=100),
           hello(w.ROLE_VERIFIER))
    f = w.encode(hello(w.ROLE_DRAFTER))
    body = bytearray(f[32:]); struct.pack_into("<H", body, 0, 3)   # wire_version 3
    raises(w.UnsupportedVersion, w.decode, w.frame(w.T_HELLO, 0, bytes(body)))
    body = bytearray(f[32:]); body[32] = 0x01                      # non-printable text
    raises(w.NonCanonicalEncoding, w.decode, w.frame(w.T_HELLO, 0, bytes(body)))
    raises(w.UnexpectedSize, w.decode, w.frame(w.T_HELLO, 0, f[32:-1]))


def test_no_sampled_request_before_negotiation():
    vs = w.VerifierSession(hello(w.ROLE_VERIFIER), session=1)
    slot = w.StepSlot(0, 10, 7, b"\0" * 32)
    raises(w.NegotiationError, vs.begin_round, [slot], depth=2, top_k=4)
    ds = w.DrafterSession(hello(w.ROLE_DRAFTER), propose=None)
    step = w.Step(session=1, generation=0, round=0, attempt=0, depth=2, context_version=0,
                  top_k=4, temperature=1.0, slots=(slot,))
    assert ds.on_frame(w.encode(step)) == []
    assert ds.counters["negotiation"] == 1


# ----------------------------------------------------------------------------- other messages

def test_small_messages_roundtrip():
    s = w.Step(session=9, generation=1, round=2, attempt=0, depth=5, context_version=3,
               top_k=8, temperature=0.5, slots=(w.StepSlot(0, 10, 7, b"\1" * 32),
                                                w.StepSlot(3, 11, 8, b"\2" * 32)))
    c = w.Completion(session=9, generation=1, round=2, attempt=0, context_version=3,
                     n_slots=2, depth=5, reply_bytes=100, reply_crc32=5, step_digest=6)
    cm = w.Commit(session=9, generation=1, round=2,
                  slots=(w.CommitSlot(0, 2, 5, 13), w.CommitSlot(3, 0, 4, 12, fallback=True)))
    r = w.Reset(session=9, new_generation=2, reason=w.RESET_TIMEOUT)
    for m in (s, c, cm, r):
        assert w.decode(w.encode(m), limits=LIM) == m
    f = w.encode(cm)
    b = bytearray(f[32:]); struct.pack_into("<i", b, 16 + 4, 99)
    raises(w.OutOfRangeId, w.decode, w.frame(w.T_COMMIT, 9, bytes(b)), limits=LIM)
    b = bytearray(w.encode(s)[32:]); struct.pack_into("<f", b, 24, float("nan"))
    raises(w.NonCanonicalEncoding, w.decode, w.frame(w.T_STEP, 9, bytes(b)), limits=LIM)
    b = bytearray(w.encode(c)[32:]); struct.pack_into("<H", b, 14, 7)
    raises(w.NonCanonicalEncoding, w.decode, w.frame(w.T_COMPLETION, 9, bytes(b)), limits=LIM)


# ----------------------------------------------------------------------------- conversions

@pytest.mark.parametrize("top_k", [None, 5, 16])
def test_dyadic_reply_exact_both_ways(top_k):
    rng = np.random.default_rng(1)
    lg = rng.standard_normal((6, V)).astype(np.float32) * 3
    tok, q = dyadic.propose(lg, dyadic.Keys(seed=4, position=np.arange(6)), top_k=top_k,
                            backend=BACKEND)
    shape = (2, 3)
    q2 = dyadic.Dyadic(q.counts.reshape(shape + (q.width,)),
                       None if q.ids is None else q.ids.reshape(shape + (q.width,)),
                       vocab_size=V)
    for rep in ("auto", "sparse", "dense"):
        r = w.Reply.from_dyadic(q2, tok.reshape(shape), session=1, generation=0, round=0,
                                slots=(0, 1), representation=rep, dense_width=20)
        back = w.decode(w.encode(r), limits=w.Limits(vocab_size=V, max_support=16,
                                                     dense_width=20))
        assert back.sampled.tolist() == tok.reshape(shape).tolist()
        d = back.to_dyadic(V, width=q2.width if (rep != "dense" and q2.is_sparse) else None)
        if d.is_sparse and q2.is_sparse:
            assert np.array_equal(d.counts, q2.counts) and np.array_equal(d.ids, q2.ids)
        assert np.array_equal(d.to_dense().counts, q2.to_dense().counts)
        # sparse width on the wire is the number of nonzero entries
        if r.representation[0, 0] == w.REPR_SPARSE:
            assert r.n_entries.tolist() == (q2.to_dense().counts != 0).sum(-1).tolist()


# ----------------------------------------------------------------------------- sizes

@pytest.mark.parametrize("k,per_request", [(16, 640), (32, 1280), (64, 2560), (256, 10240)])
def test_sparse_sizes_match_seed_table(k, per_request):
    vocab, depth = 129280, 5
    ids = np.arange(k, dtype=np.int32) * 7
    counts = np.full(k, T // k, np.uint32)
    q = dyadic.Dyadic(np.broadcast_to(counts, (4, depth, k)).copy(),
                      np.broadcast_to(ids, (4, depth, k)).copy(), vocab_size=vocab)
    r = w.Reply.from_dyadic(q, np.zeros((4, depth), np.int32), session=1, generation=0,
                            round=0, slots=range(4))
    payload = r.values.nbytes + r.ids.nbytes
    assert payload == 4 * per_request
    f = w.encode(r)
    assert len(f) == 32 + 32 + 16 * 4 * depth + payload   # headers: docs/wire.md
    back = w.decode(f, limits=w.Limits(vocab_size=vocab, max_support=256))
    assert back.values.nbytes + back.ids.nbytes == 4 * per_request


def test_dense_size_matches_seed_table():
    vocab, depth = 129280, 5
    counts = np.zeros((1, depth, vocab), np.uint32)
    counts[..., 0] = T
    r = w.Reply.from_dyadic(dyadic.Dyadic(counts, vocab_size=vocab),
                            np.zeros((1, depth), np.int32),
                            session=1, generation=0, round=0, slots=(0,),
                            representation="dense")
    assert r.values.nbytes == 2_585_600 and 4 * r.values.nbytes == 10_342_400
    f = w.encode(r)
    back = w.decode(f, limits=w.Limits(vocab_size=vocab, dense_width=vocab,
                                       max_frame_bytes=1 << 23))
    assert back.values.nbytes == 2_585_600


# ----------------------------------------------------------------------------- sessions

def _pair(top_k=4):
    def propose(step):
        S, D = len(step.slots), step.depth
        lg = np.tile(np.linspace(0, 2, V, dtype=np.float32), (S, 1))
        toks, qs = [], []
        for i in range(D):
            keys = dyadic.Keys(seed=np.array([s.seed for s in step.slots], np.uint64),
                               generation=step.generation, round=step.round,
                               position=np.array([s.anchor_position + i for s in step.slots]))
            t, q = dyadic.propose(lg, keys, top_k=step.top_k or None, backend=BACKEND)
            toks.append(t)
            qs.append(q)
        c = np.stack([q.counts for q in qs], 1)
        ids = None if qs[0].ids is None else np.stack([q.ids for q in qs], 1)
        return np.stack(toks, 1), dyadic.Dyadic(c, ids, vocab_size=V)

    vs = w.VerifierSession(hello(w.ROLE_VERIFIER), session=5)
    ds = w.DrafterSession(hello(w.ROLE_DRAFTER), propose)
    back = ds.on_frame(w.encode(vs.local))
    vs.on_hello(w.decode(back[0]))
    slots = [w.StepSlot(0, 3, 11, b"\0" * 32), w.StepSlot(1, 7, 12, b"\0" * 32)]
    return vs, ds, slots


def test_session_happy_path_and_retry_identical():
    vs, ds, slots = _pair()
    step = vs.begin_round(slots, depth=3, top_k=4)
    rf, cf = ds.on_frame(w.encode(step))
    assert vs.on_frame(rf) is None
    p = vs.on_frame(cf)
    assert isinstance(p, w.Proposal) and p.draft.shape == (2, 3) and p.q.batch_shape == (2, 3)
    # a duplicate of the consumed reply is stale, never consumed twice
    assert vs.on_frame(rf) is None and vs.counters["stale-round"] == 1
    vs.commit([w.CommitSlot(0, 0, 1, 4), w.CommitSlot(1, 0, 1, 8)])
    # corrupted reply -> discarded; retry gets the identical q and tokens
    step = vs.begin_round(slots, depth=3, top_k=4)
    rf, cf = ds.on_frame(w.encode(step))
    bad = bytearray(rf); bad[100] ^= 0xFF
    d = vs.on_frame(bytes(bad))
    assert isinstance(d, w.Discarded) and d.error.rule == "checksum-mismatch"
    assert vs.on_frame(cf) is None           # the old attempt's completion is now stale
    step2 = vs.retry()
    rf2, cf2 = ds.on_frame(w.encode(step2))
    assert ds.counters["retry-served"] == 1 and ds.counters["proposal"] == 2
    assert vs.on_frame(rf2) is None
    p2 = vs.on_frame(cf2)
    r1 = w.decode(rf, limits=vs.limits)
    assert np.array_equal(p2.draft, r1.sampled)
    assert np.array_equal(p2.q.counts, r1.to_dyadic(V).counts)


def test_session_failures_discard_whole_proposal():
    vs, ds, slots = _pair()
    step = vs.begin_round(slots, depth=2, top_k=4)
    rf, cf = ds.on_frame(w.encode(step))
    vs.on_frame(rf)
    d = vs.on_frame(rf)                      # duplicate reply before completion
    assert isinstance(d, w.Discarded) and d.error.rule == "duplicate-round"
    assert vs.on_frame(cf) is None           # nothing partial is ever consumed
    reset = vs.reset(w.RESET_PROTOCOL)
    assert ds.on_frame(w.encode(reset)) == [] and ds.generation == 1
    vs.commit([w.CommitSlot(0, 0, 1, 4, True), w.CommitSlot(1, 0, 1, 8, True)])
    # stale generation reply is dropped and counted
    assert vs.on_frame(rf) is None and vs.counters["stale-generation"] == 1
    # completion without reply
    step = vs.begin_round(slots, depth=2, top_k=4)
    rf, cf = ds.on_frame(w.encode(step))
    d = vs.on_frame(cf)
    assert d.error.rule == "missing-q"
    vs.reset(w.RESET_PROTOCOL)
    # timeout
    step = vs.begin_round(slots, depth=2, top_k=4)
    d = vs.on_timeout()
    assert d.error.rule == "reply-timeout" and vs.counters["discarded"] == 3
    # truncated frame
    vs.reset(w.RESET_TIMEOUT)
    vs.begin_round(slots, depth=2, top_k=4)
    d = vs.on_frame(rf[:50])
    assert d.error.rule == "truncated-frame"
    # drafter: stale step after reset is refused, counted
    assert ds.on_frame(w.encode(step)) == [] and ds.counters["stale-generation"] == 1


def test_session_identity_and_completion_checks():
    vs, ds, slots = _pair()
    step = vs.begin_round(slots, depth=2, top_k=4)
    rf, cf = ds.on_frame(w.encode(step))
    vs.on_frame(rf)
    c = w.decode(cf, limits=vs.limits)
    bad = w.Completion(**{**c.__dict__, "reply_crc32": c.reply_crc32 ^ 1})
    assert vs.on_message(bad).error.rule == "checksum-mismatch"
    for field, val, rule in (("step_digest", 1, "identity-mismatch"),
                             ("reply_bytes", 3, "unexpected-size"),
                             ("status", w.STATUS_ABORTED, "drafter-aborted")):
        vs.retry()
        step = vs._step
        rf, cf = ds.on_frame(w.encode(step))
        vs.on_frame(rf)
        c = w.decode(cf, limits=vs.limits)
        assert vs.on_message(w.Completion(**{**c.__dict__, field: val})).error.rule == rule
    vs.retry()
    rf, cf = ds.on_frame(w.encode(vs._step))
    wrong = w.decode(rf, limits=vs.limits)
    wrong = w.Reply(**{**wrong.__dict__, "session": 99})
    assert vs.on_message(wrong).error.rule == "identity-mismatch"
    with pytest.raises(w.MissingQ):
        w.Proposal(step, np.zeros((2, 2), np.int32), None)


# ----------------------------------------------------------------------------- fuzzing

hyp = pytest.importorskip("hypothesis")
from hypothesis import given, strategies as st  # noqa: E402

_SEEDS = [mk_reply(GOOD * 2, [5, 9], depth=2),
          mk_reply([row(list(range(20)), [T // 16] * 16 + [0] * 4, w.REPR_DENSE)], [3]),
          w.encode(hello(w.ROLE_DRAFTER)),
          w.encode(w.Step(session=9, generation=1, round=2, attempt=0, depth=5,
                          context_version=3, top_k=8, temperature=0.5,
                          slots=(w.StepSlot(0, 10, 7, b"\1" * 32),))),
          w.encode(w.Commit(session=9, generation=1, round=2,
                            slots=(w.CommitSlot(0, 2, 5, 13),))),
          w.encode(w.Reset(session=9, new_generation=2))]


def _total(data, fix_crc):
    if fix_crc and len(data) >= 32:
        body = data[32:]
        h = bytearray(data[:32])
        struct.pack_into("<I", h, 20, zlib.crc32(body))
        struct.pack_into("<I", h, 28, zlib.crc32(bytes(h[:28])))
        data = bytes(h) + body
    for lim in (LIM, w.DEFAULT_LIMITS):
        try:
            w.decode(data, limits=lim)
        except w.WireError:
            pass


@given(st.binary(max_size=600))
def test_fuzz_random_bytes(data):
    _total(data, False)
    _total(w.MAGIC + data, True)


@given(st.sampled_from(_SEEDS), st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)),
                                         max_size=6), st.integers(0, 2), st.booleans())
def test_fuzz_mutated_frames(frame, edits, cut, fix_crc):
    b = bytearray(frame)
    for pos, val in edits:
        b[pos % len(b)] = val
    if cut == 1:
        b = b[:len(b) // 2]
    elif cut == 2:
        b += b"\0\1"
    _total(bytes(b), fix_crc)


def _outcome(data):
    try:
        m = w.decode(data, limits=LIM)
    except w.WireError as e:
        return type(e)
    return w.encode(m)


@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=3),
       st.booleans())
def test_fast_path_agrees_with_ordered_checks(edits, fix_crc):
    """The vectorised fast path never accepts what the ordered rule checks reject."""
    b = bytearray(_SEEDS[0])
    for pos, val in edits:
        b[32 + pos % (len(b) - 32)] = val
    data = bytes(b)
    if fix_crc:
        h = bytearray(data[:32])
        struct.pack_into("<I", h, 20, zlib.crc32(data[32:]))
        struct.pack_into("<I", h, 28, zlib.crc32(bytes(h[:28])))
        data = bytes(h) + data[32:]
    fast = _outcome(data)
    orig = _rules.sparse_reply_valid
    _rules.sparse_reply_valid = lambda *a: False
    try:
        slow = _outcome(data)
    finally:
        _rules.sparse_reply_valid = orig
    assert fast == slow
