"""Verification targets from logits (``verify(..., logits=True)``), in exact integers.

docs/semantics.md, section 2 "Target logits": one target row of logits and the
request's sampling parameters (temperature, top_k, top_p, min_p) become an
integer distribution ``P_v / T``:

- ``z_v = float64(x_v) / float64(temperature)`` and ``W_v`` the fixed-point
  exponential of ``allocate(logits=True)`` (``fixedpoint.logits_row_weights``):
  ``W(zmax) = 2**39``; -inf masks a token; NaN or +inf is TARGET_INVALID_VALUE;
  no finite ``z`` is TARGET_ZERO_MASS.
- The ranking: z descending, ties to the lowest id, over the tokens with a
  finite z.  Filters in this order: min-p (a weight threshold), top-k (the
  first top_k ranked survivors), top-p (the shortest ranked prefix of the
  survivors whose weight reaches ``ceil(u * Ts / 2**24)``).
- ``P_v = W_v`` on the kept tokens, 0 elsewhere; ``T = sum P_v``.

A request with temperature 0 (or a ``greedy`` flag) is verified greedily on the
argmax of its logits (float value, lowest id among ties); its target is the
point mass on that argmax.  top_p and min_p arrive as float32 bit patterns:
the kernels read the float32 value exactly (``f32_ceil24``).
"""

import math
from fractions import Fraction

from .. import _spec, _status
from . import fixedpoint

ONE24 = 1 << _spec.TOTAL_BITS  # 2**24: the scale of u and mp
WMAX = 1 << _spec.WEIGHT_BITS  # W(zmax) = 2**39


def f32_ceil24(bits):
    """ceil(f * 2**24) of a finite float32 f >= 0 given as its bit pattern (exact)."""
    m, e = fixedpoint.f32_mant_exp(bits & 0x7FFFFFFF)
    s = e + _spec.TOTAL_BITS
    if s >= 0:
        return m << s
    return -((-m) >> (-s))


def params_status(temperature, top_k, top_p_bits, min_p_bits):
    """The status of one request's sampling parameters (OK or the first bad one).

    ``temperature``: a Python float (binary64), finite and >= 0 (-0.0 counts as 0);
    ``top_k``: an int >= 0 (0: off); ``top_p_bits``: float32 bits of a value in
    (0, 1] (1: off); ``min_p_bits``: float32 bits of a value in [0, 1] (0: off;
    -0.0 counts as 0)."""
    if not (temperature >= 0.0 and temperature != math.inf):
        return _status.TEMPERATURE_INVALID
    if top_k < 0:
        return _status.TOP_K_INVALID
    if not 0 < top_p_bits <= 0x3F800000:
        return _status.TOP_P_INVALID
    if not (min_p_bits <= 0x3F800000 or min_p_bits == 0x80000000):
        return _status.MIN_P_INVALID
    return _status.OK


def logits_argmax(xs):
    """Argmax of a logits row by float value (ties: lowest id; -0.0 == 0.0), with
    the row rules: NaN or +inf -> TARGET_INVALID_VALUE; every value -inf ->
    TARGET_ZERO_MASS.  Returns ``(status, argmax)``."""
    best, arg = -math.inf, -1
    for v, x in enumerate(xs):
        if math.isnan(x) or x == math.inf:
            return _status.TARGET_INVALID_VALUE, -1
        if x > best:
            best, arg = x, v
    if arg < 0:
        return _status.TARGET_ZERO_MASS, -1
    return _status.OK, arg


def rank(zs, ids):
    """``ids`` in ranking order: z descending, ties to the lowest id."""
    return sorted(ids, key=lambda v: (-zs[v], v))


def scale_shift(total_w):
    """s with ``total_w * 2**s`` in [2**62, 2**63]: ``62 - floor(log2(total_w))``, 0
    when total_w >= 2**62 (total_w in [2**39, 2**63])."""
    return max(0, 62 - (total_w.bit_length() - 1))


def processed_row(xs, temperature, top_k, top_p_bits, min_p_bits):
    """The processed target of one logits row at temperature > 0.

    ``(status, P, T, argmax)`` with ``P_v = W_v * 2**s`` on the kept tokens (0
    elsewhere), ``T = sum(P)`` in [2**62, 2**63] (``s = scale_shift(sum W_kept)``:
    a power of two, so ``p(v) = P_v / T`` is that of the weights; the acceptance
    draw ``uniform_below_63(T)`` then succeeds with probability >= 1/2 per
    attempt, as for probability targets)."""
    st, p, total, arg = weights_row(xs, temperature, top_k, top_p_bits, min_p_bits)
    if st:
        return st, None, 0, -1
    s = scale_shift(total)
    return st, [w << s for w in p], total << s, arg


def weights_row(xs, temperature, top_k, top_p_bits, min_p_bits):
    """The kept weights of one logits row at temperature > 0 (before the scaling of
    ``processed_row``).

    ``xs``: Python floats holding exact float32 values.  Returns
    ``(status, P, T, argmax)`` with ``P`` a list of V ints (``P_v = W_v`` on the
    kept tokens, else 0), ``T = sum(P)`` and ``argmax`` the first token of the
    ranking (the largest z, lowest id)."""
    st, weights, zs, arg = fixedpoint.logits_row_weights(xs, None, temperature)
    if st == _status.X_ZERO_MASS:
        return _status.TARGET_ZERO_MASS, None, 0, -1
    if st:  # X_NAN / X_POSINF: NaN or +inf in z
        return _status.TARGET_INVALID_VALUE, None, 0, -1
    order = kept_tokens(weights, zs, top_k, top_p_bits, min_p_bits)
    p = [0] * len(xs)
    for v in order:
        p[v] = weights[v]
    return _status.OK, p, sum(p), arg


def kept_tokens(weights, zs, top_k, top_p_bits, min_p_bits):
    """The kept tokens, in ranking order, of a row with integer weights ``weights`` and
    effective logits ``zs`` (binary64; -inf masks): min-p, then top-k (0: off), then
    top-p (docs/semantics.md, "Target logits").  Shared by verify(logits=True) and
    allocate / propose with top_p / min_p."""
    mp = f32_ceil24(min_p_bits)
    survivors = [v for v in range(len(zs))
                 if zs[v] > -math.inf and weights[v] * ONE24 >= mp * WMAX]
    order = rank(zs, survivors)
    if top_k:
        order = order[:top_k]
    u = f32_ceil24(top_p_bits)
    ts = sum(weights[v] for v in order)
    need = -((-u * ts) // ONE24)  # ceil(u * Ts / 2**24)
    cum = 0
    for i, v in enumerate(order):
        cum += weights[v]
        if cum >= need:
            return order[:i + 1]
    return order


def target_row(xs, greedy, temperature, top_k, top_p_bits, min_p_bits):
    """One target row of a request: ``(status, P, T, argmax)``.

    Greedy requests (``greedy`` or temperature 0): ``logits_argmax`` and the
    point mass ``P = [.., 1 at argmax, ..]``, ``T = 1``; else ``processed_row``.
    The parameters are checked first (``params_status``)."""
    st = params_status(temperature, top_k, top_p_bits, min_p_bits)
    if st:
        return st, None, 0, -1
    if greedy or temperature == 0.0:
        st, arg = logits_argmax(xs)
        if st:
            return st, None, 0, -1
        p = [0] * len(xs)
        p[arg] = 1
        return _status.OK, p, 1, arg
    return processed_row(xs, temperature, top_k, top_p_bits, min_p_bits)


def target_distribution(xs, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, greedy=False):
    """The exact target p(v) = P_v / T of one logits row, as fractions.

    ``xs``: Python floats (exact float32 values); ``top_p``, ``min_p``: Python
    floats converted to float32 (round to nearest even) as ``dyadic.verify``
    does.  Raises ValueError for a row or parameter breaking a rule."""
    st, p, total, _ = target_row(xs, greedy, float(temperature), int(top_k),
                                 param_bits(top_p), param_bits(min_p))
    if st:
        raise ValueError(_status.message(st, 0))
    return [Fraction(x, total) for x in p]


def param_bits(value):
    """The float32 bit pattern of a Python float, rounded to nearest even (the
    conversion of top_p / min_p)."""
    import numpy as np
    return int(np.array([value], dtype=np.float32).view(np.uint32)[0])


def verify_row_logits(rows, draft, q_rows, keys, position, greedy, temperature, top_k,
                      top_p_bits, min_p_bits, num_drafts=None):
    """One request of ``dyadic.verify(..., logits=True)``.

    ``rows``: k+1 lists of Python floats (exact float32 logits); the parameters
    as ``target_row``; the other arguments as ``sampling.verify_row``.  Rules in
    order: ``num_drafts`` (None: k; else NUM_DRAFTS_INVALID outside [0, k], and
    the request is cut to depth n = num_drafts as ``sampling.verify_row_ragged``:
    target rows beyond n, draft ids and q rows from n on are never read), the
    parameters (TEMPERATURE_INVALID, TOP_K_INVALID, TOP_P_INVALID,
    MIN_P_INVALID), every target row (TARGET_INVALID_VALUE, TARGET_ZERO_MASS),
    then ``sampling.verify_fixed_rows`` on ``(P, T)`` of each row, greedy when
    ``greedy`` or temperature 0.  Returns ``(status, accepted, tokens)`` (tokens
    padded with -1 to k + 1)."""
    from . import sampling

    if num_drafts is not None:
        k = len(draft)
        if (isinstance(num_drafts, bool) or not isinstance(num_drafts, int)
                or not 0 <= num_drafts <= k):
            return _status.NUM_DRAFTS_INVALID, 0, None
        n = num_drafts
        st, acc, tokens = verify_row_logits(
            rows[:n + 1], draft[:n], None if q_rows is None else q_rows[:n], keys, position,
            greedy, temperature, top_k, top_p_bits, min_p_bits)
        if st:
            return st, 0, None
        return st, acc, tokens + [-1] * (k - n)
    st = params_status(temperature, top_k, top_p_bits, min_p_bits)
    if st:
        return st, 0, None
    fixed, argmaxes = [], []
    for row in rows:
        st, p, total, arg = target_row(row, greedy, temperature, top_k, top_p_bits, min_p_bits)
        if st:
            return st, 0, None
        fixed.append((p, total))
        argmaxes.append(arg)
    return sampling.verify_fixed_rows(fixed, argmaxes, draft, q_rows, keys, position,
                                      bool(greedy) or temperature == 0.0)
