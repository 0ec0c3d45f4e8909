"""Vectorised exact integer helpers (NumPy uint64 limbs) for the sharded path.

Each function is the array twin of a row helper of ``dyadic.reference``
(``fixedpoint.weight_from_gap``, ``fixedpoint.target_row_fixed``,
``sampling.residual``, ``sampling.first_exceeding``); tests compare them with
the reference on random and edge inputs.  No floating-point operation other
than the documented binary64 ones (z = (x + b) / T, t = zmax - z, t * 2**32).
"""

import numpy as np

from .. import _spec
from .._exp_table import EXP2_NEG_Q62, LOG2E_Q63

U64 = np.uint64
M32 = U64(0xFFFFFFFF)
_TAB = [np.array(t, dtype=np.uint64) for t in EXP2_NEG_Q62]
_L2E = U64(LOG2E_Q63)


def mul128(a, b):
    """Full 128-bit product of uint64 arrays: (hi, lo)."""
    a = np.asarray(a, dtype=np.uint64)
    b = np.asarray(b, dtype=np.uint64)
    a0, a1 = a & M32, a >> U64(32)
    b0, b1 = b & M32, b >> U64(32)
    p00, p01, p10, p11 = a0 * b0, a0 * b1, a1 * b0, a1 * b1
    mid = (p00 >> U64(32)) + (p01 & M32) + (p10 & M32)
    lo = (p00 & M32) | (mid << U64(32))
    hi = p11 + (p01 >> U64(32)) + (p10 >> U64(32)) + (mid >> U64(32))
    return hi, lo


def _mulshr62(a, b):
    hi, lo = mul128(a, b)
    return (hi << U64(2)) | (lo >> U64(62))


def _idx(f, shift):
    return ((f >> U64(shift)) & U64(0xFF)).astype(np.intp)


def weights_from_gap(t):
    """Array twin of ``fixedpoint.weight_from_gap`` (float64 gaps -> uint64 weights)."""
    t = np.asarray(t, dtype=np.float64)
    out = np.zeros(t.shape, dtype=np.uint64)
    ok = t < _spec.EXP_CUTOFF
    if not ok.any():
        return out
    t32 = np.floor(t[ok] * 4294967296.0).astype(np.uint64)
    hi, lo = mul128(t32, _L2E)
    y = (hi << U64(1)) | (lo >> U64(63))
    shift = np.minimum((y >> U64(32)) + U64(23), U64(63))
    f = y & M32
    e = _TAB[0][_idx(f, 24)]
    e = _mulshr62(e, _TAB[1][_idx(f, 16)])
    e = _mulshr62(e, _TAB[2][_idx(f, 8)])
    e = _mulshr62(e, _TAB[3][_idx(f, 0)])
    out[ok] = e >> shift
    return out


def effective_logits(x, b, temperature):
    """z = (x + b) / T in binary64, rows of ``x`` (float32 [B, n]); T float64 [B]."""
    with np.errstate(all="ignore"):
        z = x.astype(np.float64)
        if b is not None:
            z = z + b.astype(np.float64)
        return z / temperature[:, None]


def target_fixed(bits):
    """P = floor(p * 2**62) (uint64) and the invalid-value mask of float32 bit patterns.

    p * 2**62 is exact in binary64 (a float32 value scaled by a power of two,
    no overflow for p <= 1), and so is its floor; the result is < 2**63.
    """
    bits = np.asarray(bits, dtype=np.uint32)
    mag = bits & np.uint32(0x7FFFFFFF)
    p = bits.view(np.float32)
    with np.errstate(invalid="ignore"):
        ok = (p >= 0) & (p <= 1)
    scaled = np.floor(np.where(ok, p, np.float32(0)).astype(np.float64)
                      * float(1 << _spec.TARGET_BITS))
    return scaled.astype(np.uint64), ~ok, mag


def limb_sum(hi, lo):
    """Exact Python-int sum of 128-bit values given as uint64 (hi, lo) arrays (hi < 2**32)."""
    if lo.size == 0:
        return 0
    s0 = int((lo & M32).sum(dtype=np.uint64))
    s1 = int((lo >> U64(32)).sum(dtype=np.uint64))
    s2 = 0 if hi is None else int(hi.sum(dtype=np.uint64))
    return s0 + (s1 << 32) + (s2 << 64)


def residual_limbs(p, counts, total):
    """R_v = max(P_v * 2**24 - c_v * T, 0) as uint64 (hi, lo); counts None means all 0."""
    hia = p >> U64(64 - _spec.TOTAL_BITS)
    loa = p << U64(_spec.TOTAL_BITS)
    if counts is None:
        return hia, loa
    hib, lob = mul128(counts.astype(np.uint64), U64(total))
    gt = (hia > hib) | ((hia == hib) & (loa > lob))
    lo = loa - lob
    hi = hia - hib - (loa < lob).astype(np.uint64)
    zero = U64(0)
    return np.where(gt, hi, zero), np.where(gt, lo, zero)


def first_exceeding_limbs(hi, lo, x, block=2048):
    """Index of the first entry whose running sum (exact) is strictly greater than x."""
    acc = 0
    n = lo.shape[0]
    for s in range(0, n, block):
        h = None if hi is None else hi[s:s + block]
        part = limb_sum(h, lo[s:s + block])
        if acc + part > x:
            los = lo[s:s + block].tolist()
            his = [0] * len(los) if h is None else h.tolist()
            for i, (a, b) in enumerate(zip(his, los)):
                acc += (a << 64) | b
                if acc > x:
                    return s + i
            raise AssertionError("block sum mismatch")
        acc += part
    raise AssertionError("draw beyond the shard's mass")
