"""Per-row status codes shared by every backend, and the errors they become.

Kernels never raise: they write one status code per row (0 = OK).  The Python
layer turns the first non-zero code into the exception below, so every backend
raises the same type with the same message.  With ``check=False`` on GPU
backends the codes are returned to the caller instead (fail closed).
"""

OK = 0
# allocate / propose inputs
X_NAN = 1
X_POSINF = 2
X_NEGATIVE = 3
X_ZERO_MASS = 4
ALLOC_INCONSISTENT = 5
# verify inputs
TARGET_INVALID_VALUE = 10
TARGET_SUM = 11
Q_ZERO_AT_DRAFT = 12
DRAFT_OUT_OF_RANGE = 13
Q_INVALID = 14
NUM_DRAFTS_INVALID = 15
# verify from target logits (logits=True)
TARGET_ZERO_MASS = 16
# vocabulary shards (dyadic.distributed)
SHARD_INVALID = 17
# sampling parameters (verify with logits=True; allocate / propose with top_p, min_p)
TEMPERATURE_INVALID = 30
TOP_K_INVALID = 31
TOP_P_INVALID = 32
MIN_P_INVALID = 33
# RNG
RNG_EXHAUSTED = 20

_MESSAGES = {
    X_NAN: ("x", "contains NaN (after (x + bias) / temperature for logits)"),
    X_POSINF: ("x", "contains +inf (after (x + bias) / temperature for logits)"),
    X_NEGATIVE: ("x", "weights must be >= 0 (a negative value or -inf was found)"),
    X_ZERO_MASS: ("x", "has zero effective mass (every weight is 0 or every logit is -inf)"),
    ALLOC_INCONSISTENT: ("x", "integer allocation is inconsistent (remaining tickets out of "
                              "range or counts do not sum to 2**24); refusing"),
    TARGET_INVALID_VALUE: ("target", "probabilities must be finite, >= 0 and <= 1 "
                                     "(NaN, inf, a negative value or a value > 1 was found); "
                                     "logits (logits=True) must not be NaN or +inf after "
                                     "/ temperature"),
    TARGET_SUM: ("target", "probabilities must sum to 1 within 2**-10 (checked exactly "
                           "on floor(p * 2**62))"),
    Q_ZERO_AT_DRAFT: ("q", "q(d) = 0 at a proposed draft token d: the draft could not "
                           "have been sampled from this q"),
    DRAFT_OUT_OF_RANGE: ("draft", "token ids must be in [0, V) (V: the target's vocabulary)"),
    Q_INVALID: ("q", "the q row breaks a Dyadic rule (an id outside [0, V) or -1, valid ids "
                     "not strictly ascending, padding before a valid id or with a count, "
                     "a count above 2**24, or counts not summing to 2**24)"),
    NUM_DRAFTS_INVALID: ("num_drafts", "the request's draft count n must satisfy 0 <= n <= k "
                                       "(k: the draft array's width)"),
    TARGET_ZERO_MASS: ("target", "every target logit is -inf (no token has mass; logits=True)"),
    SHARD_INVALID: ("vocab_offset", "the shard [vocab_offset, vocab_offset + n) or a gathered "
                                    "candidate id is not inside [0, vocab_size)"),
    TEMPERATURE_INVALID: ("temperature", "must be finite and >= 0 (0 means greedy "
                                         "verification)"),
    TOP_K_INVALID: ("top_k", "must be >= 0 (0: off)"),
    TOP_P_INVALID: ("top_p", "must be in (0, 1] as a float32 (1: off)"),
    MIN_P_INVALID: ("min_p", "must be in [0, 1] as a float32 (0: off)"),
    RNG_EXHAUSTED: ("keys", "bounded draw exhausted 2**28 draw indices (probability "
                            "< 2**-(2**28)); the key fields are reused or corrupted"),
}

#: Codes reported by each primitive, for documentation and tests.
CODES = dict((code, msg) for code, msg in _MESSAGES.items())


def message(code, row):
    """The error text for status ``code`` at ``row`` (an int or a tuple)."""
    argument, rule = _MESSAGES[code]
    return f"{argument}: row {row}: {rule} [status {code}]"


def row_label(batch_shape):
    """The function mapping a flat row index to its label in messages: the index itself
    for one batch axis, else the tuple of indices over ``batch_shape``."""
    def label(flat):
        if len(batch_shape) <= 1:
            return flat
        import numpy as np
        return tuple(int(i) for i in np.unravel_index(flat, batch_shape))
    return label


def raise_for_status(status, row_index=None):
    """Raise ValueError for the first row whose status is non-zero.

    ``status`` is an integer array (any shape, C order); ``row_index`` maps a
    flat index to the row label used in the message (default: the unravelled
    index as a tuple, or an int for 1-D).
    """
    import numpy as np

    status = np.asarray(status)
    bad = np.flatnonzero(status)
    if bad.size == 0:
        return
    flat = int(bad[0])
    code = int(status.reshape(-1)[flat])
    if row_index is not None:
        row = row_index(flat)
    elif status.ndim <= 1:
        row = flat
    else:
        row = tuple(int(i) for i in np.unravel_index(flat, status.shape))
    raise ValueError(message(code, row))
