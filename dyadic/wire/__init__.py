"""dyadic.wire: versioned binary transport (wire v2) of dyadic q between a
draft worker and a verifier.  Layout and rules: docs/wire.md.

    encode(message) -> bytes
    decode(data, *, limits=DEFAULT_LIMITS) -> message   (strict and total)
    WireError (+ one subclass per rule family, ``.rule`` names it)
    Hello, Step/StepSlot, Reply, Completion, Commit/CommitSlot, Reset
    negotiate(local, remote) -> Agreement; DrafterSession, VerifierSession

Compatibility guarantee: the v2 layout is frozen; any change is a new wire
version that both sides must offer explicitly in HELLO (no auto-upgrade).
"""

from ._errors import *  # noqa: F401,F403
from ._errors import WireError, ALL_ERRORS, RULES
from ._messages import (WIRE_VERSION, MAGIC, ROLE_DRAFTER, ROLE_VERIFIER, REPR_DENSE,
                        REPR_SPARSE, REPR_NONE, STATUS_OK, STATUS_ABORTED, RESET_USER,
                        RESET_TIMEOUT, RESET_CORRUPT, RESET_RECONNECT, RESET_PROTOCOL,
                        DRAFT_NATIVE, DRAFT_ADAPTED, PRECISION_FP32_DYADIC24,
                        Hello, Step, StepSlot, Reply, Completion, Commit, CommitSlot, Reset)
from ._codec import (Limits, DEFAULT_LIMITS, encode, decode, frame, step_digest,
                     probability_checksum, HEADER, T_HELLO, T_STEP, T_REPLY, T_COMPLETION,
                     T_COMMIT, T_RESET)
from ._session import (Agreement, negotiate, Proposal, Discarded, DrafterSession,
                       VerifierSession, prefix_digest)
