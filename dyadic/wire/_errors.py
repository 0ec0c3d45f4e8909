"""WireError and one subclass per broken rule family.

Every subclass has a class attribute ``rule`` (a short stable name such as
``"duplicate-sparse-id"``); the message always starts with ``"<rule>: "`` and
names the field.  Session counters are keyed by ``rule``.
"""


class WireError(Exception):
    """Base class: a frame or a protocol step broke a wire v2 rule."""

    rule = "wire-error"

    def __init__(self, field, detail):
        self.field = field
        self.detail = detail
        super().__init__(f"{self.rule}: {field}: {detail}")


def _rule(name, rule, doc):
    return type(name, (WireError,), {"rule": rule, "__doc__": doc})


TruncatedFrame = _rule("TruncatedFrame", "truncated-frame",
                       "The buffer ends before the header or the declared body.")
BadMagic = _rule("BadMagic", "bad-magic", "The frame does not start with b'DYQW'.")
UnsupportedVersion = _rule("UnsupportedVersion", "unsupported-version",
                           "Wire version is not 2 (there is no auto-upgrade or downgrade).")
UnknownMessageType = _rule("UnknownMessageType", "unknown-message-type",
                           "The header's message type is not one of HELLO..RESET.")
ChecksumMismatch = _rule("ChecksumMismatch", "checksum-mismatch",
                         "A CRC32 (header, body or completion byte checksum) does not match.")
ProbabilityChecksumMismatch = _rule("ProbabilityChecksumMismatch", "probability-checksum",
                                    "A reply row's probability checksum does not match its q.")
UnexpectedSize = _rule("UnexpectedSize", "unexpected-size",
                       "A length, count or body size differs from the one the layout implies.")
LimitExceeded = _rule("LimitExceeded", "limit-exceeded",
                      "A count or size is above the negotiated bound.")
NonCanonicalEncoding = _rule("NonCanonicalEncoding", "non-canonical-encoding",
                             "Reserved bytes not zero, bad text field, unknown enum value, "
                             "rows out of order.")
DuplicateSparseId = _rule("DuplicateSparseId", "duplicate-sparse-id",
                          "A sparse row repeats an id (even with zero values).")
UnsortedSupport = _rule("UnsortedSupport", "unsorted-support",
                        "Sparse ids are not strictly ascending.")
NonCanonicalSupport = _rule("NonCanonicalSupport", "non-canonical-support",
                            "A sparse row lists a zero-probability entry (the canonical "
                            "support is exactly the nonzero entries).")
OutOfRangeId = _rule("OutOfRangeId", "out-of-range-id",
                     "A token id is outside [0, vocab_size).")
PaddedId = _rule("PaddedId", "padded-id",
                 "A padding id (-1) in a sparse row, or nonzero dense padding beyond the "
                 "vocabulary.")
MissingQ = _rule("MissingQ", "missing-q",
                 "A row has no q (zero entries / representation none), or a completion "
                 "arrived without its reply.")
NonFiniteValue = _rule("NonFiniteValue", "non-finite-value", "A q value is NaN or infinite.")
NegativeValue = _rule("NegativeValue", "negative-value",
                      "A q value has its sign bit set (negative, or -0.0).")
NonDyadicValue = _rule("NonDyadicValue", "non-dyadic-value",
                       "A q value is not c / 2**24 for an integer 0 <= c <= 2**24.")
WrongTotalMass = _rule("WrongTotalMass", "wrong-total-mass",
                       "A row's counts do not sum to exactly 2**24 (checked in uint64).")
ZeroQAtProposedToken = _rule("ZeroQAtProposedToken", "zero-q-at-proposed-token",
                             "The sampled token has q = 0 in its own row.")
IdentityMismatch = _rule("IdentityMismatch", "identity-mismatch",
                         "Session, slot, context, step, semantic/verifier/model identity or "
                         "vocabulary differs from the negotiated or expected one.")
NegotiationError = _rule("NegotiationError", "negotiation",
                         "Capabilities cannot be agreed, or a sampled message arrived before "
                         "HELLO negotiation.")
StaleGeneration = _rule("StaleGeneration", "stale-generation",
                        "The message belongs to an older (or unknown newer) generation.")
StaleRound = _rule("StaleRound", "stale-round",
                   "The message belongs to an older round or attempt.")
DuplicateRound = _rule("DuplicateRound", "duplicate-round",
                       "A second reply/completion for the same generation, round and attempt.")
UnexpectedMessage = _rule("UnexpectedMessage", "unexpected-message",
                          "A message type that the session state does not allow now.")
ReplyTimeout = _rule("ReplyTimeout", "reply-timeout",
                     "The reply did not complete before its deadline.")
ConnectionLost = _rule("ConnectionLost", "connection-lost",
                       "The transport closed or failed mid-round.")
DrafterAborted = _rule("DrafterAborted", "drafter-aborted",
                       "The completion carries a non-OK status.")

ALL_ERRORS = tuple(v for v in list(globals().values())
                   if isinstance(v, type) and issubclass(v, WireError) and v is not WireError)
RULES = tuple(e.rule for e in ALL_ERRORS)
