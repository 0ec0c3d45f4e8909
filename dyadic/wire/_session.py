"""HELLO negotiation and the two session state machines.

Verifier side (``VerifierSession``)::

    hello -> on_hello (Agreement) -> begin_round -> STEP
         -> on_frame(REPLY) -> on_frame(COMPLETION) -> Proposal      (consume, then commit)
         -> any failure / on_timeout / on_connection_lost -> Discarded
            (the whole proposal is dropped; call reset() and sample target-only,
            or retry() for an identical re-send of the same round)

Drafter side (``DrafterSession``): answers each STEP once with REPLY +
COMPLETION, re-sends the cached identical q for a retry of the same round
(never redraws under a reused key), drops stale steps, applies RESET (which
invalidates every cached/in-flight proposal) and COMMIT.

Both sides count every failure in ``counters`` (keyed by ``WireError.rule``
plus a few events: "reset", "retry", "proposal", "discarded").  A message
handed to ``on_message`` directly (not through ``on_frame``) is checked
against the agreement's limits exactly as ``decode`` checks a frame.  An
error kept in a ``Discarded`` carries no traceback, so keeping it keeps
nothing of the frame it refused.
"""

import hashlib
import zlib
from collections import Counter
from dataclasses import dataclass

import numpy as np

from .._types import Dyadic
from . import _errors as E
from . import _rules as R
from ._codec import Limits, check_limits, decode, encode, step_digest
from ._messages import (REPR_SPARSE, ROLE_DRAFTER, ROLE_VERIFIER, STATUS_ABORTED, STATUS_OK,
                        Commit, Completion, Hello, Reply, Reset, Step, StepSlot)

_SAME = ("wire_version", "precision", "q_semantic_id", "verifier_id", "rng_abi",
         "id_map_hash", "draft_identity", "draft_kind", "target_identity", "vocab_size")


@dataclass(frozen=True)
class Agreement:
    """What both sides agreed in HELLO (identical on both sides).

    ``limits`` is what ``decode`` must be given from then on."""

    hello: Hello           # the local HELLO with bounds replaced by the agreed ones
    limits: Limits

    def __getattr__(self, name):
        return getattr(self.__dict__["hello"], name)


def negotiate(local, remote):
    """Agree on capabilities; raise IdentityMismatch / NegotiationError otherwise.

    Identities, vocabulary, precision, semantic ids and the RNG ABI must be
    equal (no auto-upgrade, no translation); bounds are the minimum of both
    sides; dense rows need the same dense width on both sides."""
    if not isinstance(local, Hello) or not isinstance(remote, Hello):
        raise E.NegotiationError("hello", "both sides must send a Hello")
    if {local.role, remote.role} != {ROLE_DRAFTER, ROLE_VERIFIER}:
        raise E.IdentityMismatch("hello.role", "need one drafter and one verifier")
    for name in _SAME:
        a, b = getattr(local, name), getattr(remote, name)
        if a != b:
            raise E.IdentityMismatch(f"hello.{name}", f"local {a!r} != remote {b!r}")
    dw = local.dense_width if local.dense_width == remote.dense_width else 0
    if local.dense_width and remote.dense_width and not dw:
        raise E.NegotiationError("hello.dense_width",
                                 f"{local.dense_width} != {remote.dense_width}")
    support = min(local.max_support, remote.max_support)
    if not dw and not support:
        raise E.NegotiationError("hello", "no common q representation (dense or sparse)")
    slots = min(local.max_slots, remote.max_slots)
    depth = min(local.max_depth, remote.max_depth)
    max_frame = min(local.max_frame_bytes, remote.max_frame_bytes)
    rows = slots * depth
    worst = 64 + 16 * rows + rows * max(4 * dw, 8 * support)
    if worst > max_frame:
        raise E.NegotiationError("hello.max_frame_bytes",
                                 f"a full reply ({worst} bytes) exceeds max_frame_bytes "
                                 f"{max_frame}; lower the slot/depth/support bounds")
    fields = {f: getattr(local, f) for f in local.__dataclass_fields__}
    fields.update(dense_width=dw, max_support=support, max_slots=slots, max_depth=depth,
                  max_frame_bytes=max_frame)
    agreed = Hello(**fields)
    limits = Limits(max_frame_bytes=max_frame, max_slots=slots, max_depth=depth,
                    max_support=support, vocab_size=local.vocab_size, dense_width=dw)
    return Agreement(agreed, limits)


def prefix_digest(tokens):
    """32-byte SHA-256 of a committed prefix (int32 little-endian token ids).

    ``tokens``: integer ids that fit int32 (``OutOfRangeId`` naming the index
    otherwise; never wrapped)."""
    ids = R.int_array("tokens", tokens, np.int32, E.OutOfRangeId)
    return hashlib.sha256(ids.astype("<i4", copy=False).tobytes()).digest()


@dataclass(frozen=True)
class Proposal:
    """A validated, complete proposal: draft int32 [B, k] and its q (Dyadic [B, k]).

    Never partial: it exists only after REPLY and a matching COMPLETION."""

    step: Step
    draft: np.ndarray
    q: Dyadic

    def __post_init__(self):
        if not isinstance(self.q, Dyadic):
            raise E.MissingQ("proposal.q", "a proposal always carries q (never q=None)")
        if self.q.batch_shape != self.draft.shape:
            raise E.UnexpectedSize("proposal.q", f"batch shape {self.q.batch_shape} != draft "
                                                 f"shape {self.draft.shape}")


@dataclass(frozen=True)
class Discarded:
    """The whole unverified proposal of ``step`` was dropped because of ``error``
    (a ``WireError`` without traceback or context)."""

    step: Step
    error: E.WireError


def _detached(err):
    """The error without its traceback and context chain (they would keep the
    refused frame and the decoder's arrays alive for as long as the error)."""
    err.__traceback__ = None
    err.__context__ = None
    err.__cause__ = None
    return err


class _Negotiating:
    """HELLO handling shared by both session sides (``self.local`` is our HELLO,
    ``self.agreement`` the negotiated result or None)."""

    def on_hello(self, remote):
        self.agreement = negotiate(self.local, remote)
        return self.agreement

    @property
    def limits(self):
        return self.agreement.limits if self.agreement else Limits()


class VerifierSession(_Negotiating):
    """Verifier-side state: generation/round tracking, in-flight round, counters.

    hello : the local Hello (role ROLE_VERIFIER).  session : u64 session id.
    """

    def __init__(self, hello, session):
        self.local = hello
        self.session = int(session)
        self.agreement = None
        self.generation = 0
        self.round = 0            # id of the current (or next) round
        self.counters = Counter()
        self._step = None         # in-flight STEP
        self._digest = None
        self._reply = None        # (Reply, frame bytes) awaiting COMPLETION
        self._done = False        # current round produced a Proposal / Discarded


    @property
    def in_flight(self):
        return self._step is not None and not self._done

    # -- rounds
    def begin_round(self, slots, *, depth, top_k, temperature=1.0, context_version=0):
        """STEP for this round; slots: StepSlot list.  Requires negotiation.

        ``temperature`` must be exactly an FP32 value (e.g.
        ``float(np.float32(t))``): it is sent as it is, never rounded.  The
        STEP must fit the agreement (slots, depth, top_k: ``LimitExceeded``)."""
        if self.agreement is None:
            raise E.NegotiationError("step", "no sampled request before HELLO negotiation")
        if self.in_flight:
            raise E.UnexpectedMessage("step", f"round {self.round} is still in flight")
        step = Step(session=self.session, generation=self.generation, round=self.round,
                    attempt=0, depth=depth, context_version=context_version, top_k=top_k,
                    temperature=temperature, slots=tuple(slots))
        check_limits(step, self.agreement.limits)
        self._start(step)
        return self._step

    def retry(self):
        """Re-send the current round's STEP (attempt + 1, same generation and
        keys): the drafter must answer with the identical q and tokens."""
        if self._step is None:
            raise E.UnexpectedMessage("retry", "no round to retry")
        s = self._step
        self.counters["retry"] += 1
        self._start(Step(session=s.session, generation=s.generation, round=s.round,
                         attempt=s.attempt + 1, depth=s.depth, context_version=s.context_version,
                         top_k=s.top_k, temperature=s.temperature, slots=s.slots))
        return self._step

    def _start(self, step):
        self._step, self._digest, self._reply, self._done = step, step_digest(step), None, False

    def _fail(self, err):
        err = _detached(err)
        self.counters[err.rule] += 1
        if not self.in_flight:
            return None
        self._done = True
        self._reply = None
        self.counters["discarded"] += 1
        return Discarded(self._step, err)

    def on_timeout(self):
        return self._fail(E.ReplyTimeout("reply", f"round {self.round} timed out"))

    def on_connection_lost(self, detail="transport closed"):
        return self._fail(E.ConnectionLost("transport", detail))

    def on_frame(self, data):
        """Feed one received frame: Proposal, Discarded, or None (keep waiting)."""
        try:
            msg = decode(data, limits=self.limits)
        except E.WireError as err:
            return self._fail(err)
        return self.on_message(msg, bytes(data))

    def on_message(self, msg, frame=None):
        """Feed one message (``frame``: its received bytes, default ``encode(msg)``):
        Proposal, Discarded, or None.  The message is checked against the
        agreement's limits first (as ``decode`` checks a frame)."""
        if not isinstance(msg, (Reply, Completion)):
            return self._fail(E.UnexpectedMessage(type(msg).__name__,
                                                  "verifier expects REPLY/COMPLETION only"))
        try:
            check_limits(msg, self.limits)
        except E.WireError as err:
            return self._fail(err)
        if msg.session != self.session:
            return self._fail(E.IdentityMismatch("session", f"{msg.session} != {self.session}"))
        name = type(msg).__name__.lower()
        if msg.generation < self.generation:
            self.counters[E.StaleGeneration.rule] += 1   # late reply: dropped, harmless
            return None
        if msg.generation > self.generation:
            return self._fail(E.StaleGeneration(f"{name}.generation",
                                                f"{msg.generation} was never issued"))
        step = self._step
        cur = (self.round, step.attempt if step else -1)
        if (msg.round, msg.attempt) < cur or (step is not None and self._done):
            self.counters[E.StaleRound.rule] += 1        # late / already-consumed round
            return None
        if (msg.round, msg.attempt) > cur or step is None:
            return self._fail(E.IdentityMismatch(f"{name}.round",
                                                 f"round {msg.round} attempt {msg.attempt} "
                                                 f"was never requested"))
        if msg.context_version != step.context_version:
            return self._fail(E.IdentityMismatch(f"{name}.context_version",
                                                 f"{msg.context_version} != "
                                                 f"{step.context_version}"))
        if isinstance(msg, Reply):
            if self._reply is not None:
                return self._fail(E.DuplicateRound("reply", f"second REPLY for round "
                                                            f"{msg.round}"))
            want = tuple(s.slot for s in step.slots)
            if msg.slots != want or msg.depth != step.depth:
                return self._fail(E.IdentityMismatch("reply.slots", f"slots {msg.slots} depth "
                                                     f"{msg.depth} != {want} / {step.depth}"))
            if step.top_k:
                if not (msg.representation == REPR_SPARSE).all() or \
                        (msg.n_entries > step.top_k).any():
                    return self._fail(E.LimitExceeded("reply.n_entries",
                                                      f"rows must be sparse with at most "
                                                      f"top_k={step.top_k} entries"))
            if frame is None:
                frame = encode(msg)
            self._reply = (msg, frame)
            return None
        # Completion
        if self._reply is None:
            return self._fail(E.MissingQ("completion", "COMPLETION without its REPLY"))
        reply, rframe = self._reply
        if msg.n_slots != len(step.slots) or msg.depth != step.depth:
            return self._fail(E.IdentityMismatch("completion.n_slots", "does not match STEP"))
        if msg.step_digest != self._digest:
            return self._fail(E.IdentityMismatch("completion.step_digest",
                                                 "answers a different STEP"))
        if msg.reply_bytes != len(rframe):
            return self._fail(E.UnexpectedSize("completion.reply_bytes",
                                               f"{msg.reply_bytes} != received {len(rframe)}"))
        if msg.reply_crc32 != zlib.crc32(rframe):
            return self._fail(E.ChecksumMismatch("completion.reply_crc32",
                                                 "reply bytes differ from those completed"))
        if msg.status != STATUS_OK:
            return self._fail(E.DrafterAborted("completion.status", f"status {msg.status}"))
        self._done = True
        self._reply = None
        self.counters["proposal"] += 1
        return Proposal(step, reply.sampled, reply.to_dyadic())

    def reset(self, reason):
        """Invalidate the generation and every in-flight slot; returns the RESET to send."""
        self.generation += 1
        self._step, self._reply, self._done = None, None, False
        self.counters["reset"] += 1
        return Reset(session=self.session, new_generation=self.generation, reason=reason)

    def commit(self, slots):
        """COMMIT for the round just finished (proposal consumed or discarded)."""
        msg = Commit(session=self.session, generation=self.generation, round=self.round,
                     slots=tuple(slots))
        self._step, self._reply, self._done = None, None, False
        self.round += 1
        return msg


class DrafterSession(_Negotiating):
    """Drafter-side state.

    propose(step) -> (sampled int32 [n_slots, depth], q Dyadic [n_slots, depth]):
        must draw position i of slot s with Keys(seed, step.generation,
        step.round, anchor_position + i).
    on_commit(commit): optional callback (prefix bookkeeping).
    """

    def __init__(self, hello, propose, on_commit=None, representation="auto"):
        self.local = hello
        self.propose = propose
        self.commit_cb = on_commit
        self.representation = representation
        self.agreement = None
        self.session = None
        self.generation = 0
        self.last_round = -1
        self._cache = None        # (round, Reply, step digest) of the last answered round
        self._cache_attempt = -1
        self.counters = Counter()


    def on_frame(self, data):
        """Feed one frame; returns the frames to send back (possibly none)."""
        try:
            msg = decode(data, limits=self.limits)
        except E.WireError as err:
            self.counters[err.rule] += 1
            return []
        try:
            return self.on_message(msg)
        except E.WireError as err:
            self.counters[err.rule] += 1
            return []

    def on_message(self, msg):
        if isinstance(msg, Hello):
            self.on_hello(msg)
            return [encode(self.local)]
        if self.agreement is None:
            raise E.NegotiationError(type(msg).__name__.lower(), "before HELLO negotiation")
        check_limits(msg, self.limits)
        if self.session is None:
            self.session = msg.session
        if msg.session != self.session:
            raise E.IdentityMismatch("session", f"{msg.session} != {self.session}")
        if isinstance(msg, Reset):
            if msg.new_generation <= self.generation and self.last_round >= 0:
                raise E.StaleGeneration("reset.new_generation",
                                        f"{msg.new_generation} <= {self.generation}")
            self.generation = msg.new_generation
            self._cache = None            # every in-flight / cached proposal is invalid
            self.counters["reset"] += 1
            return []
        if isinstance(msg, Commit):
            if msg.generation != self.generation:
                raise E.StaleGeneration("commit.generation",
                                        f"{msg.generation} != {self.generation}")
            self.last_round = max(self.last_round, msg.round)
            if self.commit_cb:
                self.commit_cb(msg)
            return []
        if not isinstance(msg, Step):
            raise E.UnexpectedMessage(type(msg).__name__, "drafter expects STEP/COMMIT/RESET")
        if msg.generation != self.generation:
            raise E.StaleGeneration("step.generation", f"{msg.generation} != {self.generation}")
        if msg.round < self.last_round or (msg.round == self.last_round and self._cache is None):
            raise E.StaleRound("step.round", f"round {msg.round} already finished")
        digest = step_digest(Step(**{**msg.__dict__, "attempt": 0}))
        if self._cache is not None and self._cache[0] == msg.round:
            rnd, reply, d0 = self._cache
            if d0 != digest:
                raise E.IdentityMismatch("step", "retry differs from the original STEP")
            if msg.attempt <= self._cache_attempt:
                raise E.DuplicateRound("step.attempt", f"attempt {msg.attempt} already answered")
            self.counters["retry-served"] += 1
            reply = Reply(**{**reply.__dict__, "attempt": msg.attempt})
        else:
            sampled, q = self.propose(msg)
            reply = Reply.from_dyadic(q, sampled, session=msg.session,
                                      generation=msg.generation, round=msg.round,
                                      attempt=msg.attempt, slots=[s.slot for s in msg.slots],
                                      context_version=msg.context_version,
                                      representation=self.representation,
                                      dense_width=self.agreement.dense_width or None)
            self._cache = (msg.round, reply, digest)
            self.counters["proposal"] += 1
        self._cache_attempt = msg.attempt
        self.last_round = msg.round
        rframe = encode(reply)
        comp = Completion(session=msg.session, generation=msg.generation, round=msg.round,
                          attempt=msg.attempt, context_version=msg.context_version,
                          n_slots=len(msg.slots), depth=msg.depth, reply_bytes=len(rframe),
                          reply_crc32=zlib.crc32(rframe), step_digest=step_digest(msg),
                          status=STATUS_OK)
        return [rframe, encode(comp)]
