"""Input conversions: float bits -> exact integers (docs/semantics.md, "Conversions").

The only floating-point operations of the whole contract live here:
``z = (float64(x) + float64(bias)) / float64(temperature)`` and
``t = zmax - z`` (IEEE-754 binary64, round to nearest, one operation at a time).
Everything after is integer arithmetic.
"""

import math
import struct

from .. import _spec
from .._exp_table import EXP2_NEG_Q62, LOG2E_Q63

MASK32 = 0xFFFFFFFF


def f32_bits(value):
    """The IEEE binary32 bit pattern of a Python float that is exactly a float32."""
    return struct.unpack("<I", struct.pack("<f", value))[0]


def f32_value(bits):
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def f32_mant_exp(bits):
    """(mantissa, exponent) with value = mantissa * 2**exponent, for finite |x|."""
    e = (bits >> 23) & 0xFF
    m = bits & 0x7FFFFF
    if e == 0:
        return m, -149
    return m | 0x800000, e - 150


def shift_floor(m, s):
    """floor(m * 2**s) for an integer m >= 0 and any integer s."""
    return m << s if s >= 0 else m >> (-s)


def exp2_neg_q62(f):
    """floor-chained 2**(-f / 2**32) * 2**62 for 0 <= f < 2**32 (four table steps)."""
    e = EXP2_NEG_Q62[0][(f >> 24) & 0xFF]
    e = (e * EXP2_NEG_Q62[1][(f >> 16) & 0xFF]) >> 62
    e = (e * EXP2_NEG_Q62[2][(f >> 8) & 0xFF]) >> 62
    e = (e * EXP2_NEG_Q62[3][f & 0xFF]) >> 62
    return e


def weight_from_gap(t):
    """Integer weight ~ 2**39 * exp(-t) for a float64 gap t = zmax - z >= 0.

    ``T32 = floor(t * 2**32)``; ``y = floor(T32 * LOG2E_Q63 / 2**63)`` (t*log2(e)
    in Q32); ``W = floor(exp2_neg_q62(y mod 2**32) / 2**(23 + y // 2**32))``.
    Gaps >= 32 (and +inf) give 0.
    """
    if not t < _spec.EXP_CUTOFF:
        return 0
    t32 = int(t * 4294967296.0)  # exact scaling, truncation == floor for t >= 0
    y = (t32 * LOG2E_Q63) >> 63
    n = y >> 32
    shift = 23 + n
    if shift >= 63:
        return 0
    return exp2_neg_q62(y & MASK32) >> shift


def effective_logit(x, b, temperature):
    """z = (x + b) / temperature in binary64 (b None means no addition)."""
    z = x if b is None else x + b
    return z / temperature


def logits_row_weights(xs, bias, temperature):
    """Integer weights of a logits row, or a status code.

    ``xs``, ``bias``: sequences of Python floats (exact float32/16/bf16 values),
    ``bias`` may be None.  Returns ``(status, weights, zs, argmax)``.
    """
    from .. import _status

    zs = []
    for v, x in enumerate(xs):
        z = effective_logit(x, None if bias is None else bias[v], temperature)
        if math.isnan(z):
            return _status.X_NAN, None, None, -1
        if z == math.inf:
            return _status.X_POSINF, None, None, -1
        zs.append(z)
    zmax, arg = -math.inf, -1
    for v, z in enumerate(zs):
        if z > zmax:
            zmax, arg = z, v
    if arg < 0:
        return _status.X_ZERO_MASS, None, None, -1
    weights = [weight_from_gap(zmax - z) for z in zs]
    return _status.OK, weights, zs, arg


def probs_row_weights(bits):
    """Integer weights of a float32 weight row given as bit patterns.

    The row maximum (the first one, by id) gets ``mant * 2**15`` in
    [2**38, 2**39) for normal values; every weight is
    ``floor(mant_v * 2**(exp_v - exp_max + 15))``.  Returns
    ``(status, weights, argmax)``.
    """
    from .. import _status

    best, arg = -1, -1
    for v, b in enumerate(bits):
        mag = b & 0x7FFFFFFF
        if mag > 0x7F800000:
            return _status.X_NAN, None, -1
        if b == 0x7F800000:
            return _status.X_POSINF, None, -1
        if (b >> 31) and mag:
            return _status.X_NEGATIVE, None, -1
        if mag > best:
            best, arg = mag, v
    if best <= 0:
        return _status.X_ZERO_MASS, None, -1
    _, emax = f32_mant_exp(best)
    weights = []
    for b in bits:
        m, e = f32_mant_exp(b & 0x7FFFFFFF)
        weights.append(shift_floor(m, e - emax + 15) if m else 0)
    return _status.OK, weights, arg


def target_row_fixed(bits):
    """P_v = floor(p_v * 2**62) of a float32 target row; returns (status, P, T)."""
    from .. import _status

    fixed = []
    for b in bits:
        mag = b & 0x7FFFFFFF
        if (b >> 31) and mag or mag > 0x3F800000:  # negative, NaN, inf or > 1
            return _status.TARGET_INVALID_VALUE, None, 0
        m, e = f32_mant_exp(mag)
        fixed.append(shift_floor(m, e + _spec.TARGET_BITS))
    total = sum(fixed)
    one = 1 << _spec.TARGET_BITS
    if abs(total - one) > (one >> _spec.TARGET_TOL_BITS):
        return _status.TARGET_SUM, None, 0
    return _status.OK, fixed, total
