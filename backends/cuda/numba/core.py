"""Numba-CUDA device functions of the ``numba`` backend: the integer core.

Everything here is integer arithmetic on uint64 values (128-bit values are
``(hi, lo)`` uint64 pairs), except the few binary64 operations that
``dyadic/reference/fixedpoint.py`` specifies (``(x + b) / T``, ``zmax - z``,
``t < 32``, ``t * 2**32`` truncation); none of them is an ``a * b + c`` pattern,
so numba's FMA contraction cannot change a result.  Every constant is a typed
``np.uint64`` so that numba (and the simulator, which runs this as Python on
NumPy scalars) never promotes a mixed signed/unsigned expression to float64.
Arithmetic is written so that no uint64 operation wraps (the simulator would
warn), except left shifts, which discard high bits by definition.

Block-level helpers (reductions, scans, radix selection) use shared memory
and ``cuda.syncthreads`` only: no warp intrinsics, so the CUDA simulator
(``NUMBA_ENABLE_CUDASIM=1``) runs exactly the code the GPU runs.  Every
helper must be called by all threads of the block (uniform control flow).

The pure-arithmetic functions are decorated ``@device`` (``cuda.jit(device=True)``,
looked up at import): tests/gpu/test_numba_compiled_core.py imports this module
in a fresh interpreter with ``numba.cuda.jit(device=True)`` standing for
``numba.njit``, so compiled-only typing hazards show without a GPU.
"""

import math

import numpy as np

if not hasattr(np, "row_stack"):  # numba-cuda 0.30 refers to np.row_stack (gone in numpy 2.5)
    np.row_stack = np.vstack

from numba import cuda  # noqa: E402

from dyadic import _spec  # noqa: E402
from dyadic._exp_table import EXP2_NEG_Q62, LOG2E_Q63  # noqa: E402

U = np.uint64
U0, U1, U2, U8, U15 = U(0), U(1), U(2), U(8), U(15)
U23, U24, U32, U40, U52, U62, U63 = U(23), U(24), U(32), U(40), U(52), U(62), U(63)
U255 = U(255)
M32 = U(0xFFFFFFFF)
M64 = U(0xFFFFFFFFFFFFFFFF)
TOP_BIT = U(1 << 63)
LOW63 = U((1 << 63) - 1)
TOTAL = U(_spec.TOTAL)
TARGET_ONE = U(1 << _spec.TARGET_BITS)
TARGET_TOL = U((1 << _spec.TARGET_BITS) >> _spec.TARGET_TOL_BITS)
LOG2E = U(LOG2E_Q63)
EXP_TAB = np.array(EXP2_NEG_Q62, dtype=np.uint64)  # [4, 256]
F32_MAG = U(0x7FFFFFFF)
F32_INF = U(0x7F800000)
F32_ONE = U(0x3F800000)
F32_MANT = U(0x7FFFFF)
F32_HIDDEN = U(0x800000)
F64_INF_BITS = U(0x7FF0000000000000)
F64_HIDDEN = U(1 << 52)
TWO53 = 9007199254740992.0
TWO537 = 2.0 ** 537
MIN_NORMAL = 2.0 ** -1022

PH_M0, PH_M1 = U(0xD2511F53), U(0xCD9E8D57)
PH_W0, PH_W1 = U(0x9E3779B9), U(0xBB67AE85)
DOMAIN_SHIFT = U(_spec.DOMAIN_SHIFT)
MAX_DRAW_INDEX = _spec.MAX_DRAW_INDEX

#: The decorator of the pure-arithmetic device functions.  Only these may use it:
#: tests/gpu/test_numba_compiled_core.py compiles them with ``numba.njit`` on the
#: CPU (same typing rules as ``cuda.jit``, unlike the simulator, which runs them as
#: Python on NumPy scalars) by importing this module with ``cuda.jit(device=True)``
#: returning ``numba.njit``.
device = cuda.jit(device=True)

MAX_TPB = 256  # shared arrays are sized for this; blocks are a power of two <= MAX_TPB


# ---------------------------------------------------------------- Philox


@device
def philox(c0, c1, c2, c3, k0, k1, rounds):
    """Philox4x32 on uint64 values that hold 32-bit words."""
    for r in range(rounds):
        if r > 0:
            k0 = (k0 + PH_W0) & M32
            k1 = (k1 + PH_W1) & M32
        p0 = PH_M0 * c0
        p1 = PH_M1 * c2
        n0 = (p1 >> U32) ^ c1 ^ k0
        n1 = p1 & M32
        n2 = (p0 >> U32) ^ c3 ^ k1
        n3 = p0 & M32
        c0 = n0
        c1 = n1
        c2 = n2
        c3 = n3
    return c0, c1, c2, c3


@device
def draw_block(seed, gen, rnd, pos, domain, index):
    """The 4 words at counter (domain << 28 | index, position, round, generation)."""
    c0 = (U(domain) << DOMAIN_SHIFT) | U(index)
    return philox(c0, U(pos) & M32, U(rnd) & M32, U(gen) & M32, U(seed) & M32, U(seed) >> U32, 10)


@device
def key_words(seed, gen, rnd, pos, b):
    """(seed, generation, round, position) of row b as uint64 values.

    Each key field is an array of length B or 1: a length-1 field broadcasts
    over the batch (the device path of dyadic/_device.py passes length-1
    device keys as they are, as the cuda backend's ``ld_field`` allows).
    Fields may be signed (torch int64 seed, int32 others): the 32-bit fields
    are reduced to their low 32 bits, so ``position + i`` never wraps.
    """
    s = U(seed[b if seed.shape[0] > 1 else 0])
    g = U(gen[b if gen.shape[0] > 1 else 0]) & M32
    r = U(rnd[b if rnd.shape[0] > 1 else 0]) & M32
    p = U(pos[b if pos.shape[0] > 1 else 0]) & M32
    return s, g, r, p


# ---------------------------------------------------------------- 128-bit helpers


@device
def mul64(a, b):
    """Full 128-bit product of two uint64 values as (hi, lo)."""
    a0 = a & M32
    a1 = a >> U32
    b0 = b & M32
    b1 = b >> U32
    p00 = a0 * b0
    p01 = a0 * b1
    p10 = a1 * b0
    p11 = a1 * b1
    mid = (p00 >> U32) + (p01 & M32) + (p10 & M32)
    lo = ((mid & M32) << U32) | (p00 & M32)
    hi = p11 + (p01 >> U32) + (p10 >> U32) + (mid >> U32)
    return hi, lo


@device
def add128(ah, al, bh, bl):
    if al > M64 - bl:
        return ah + bh + U1, al - (M64 - bl) - U1
    return ah + bh, al + bl


@device
def sub128(ah, al, bh, bl):
    """a - b for a >= b."""
    if al >= bl:
        return ah - bh, al - bl
    return ah - bh - U1, al + (M64 - bl) + U1


@device
def lt128(ah, al, bh, bl):
    return ah < bh or (ah == bh and al < bl)


@device
def divmod128_small(nh, nl, d):
    """(q_hi, q_lo, r) of a 128-bit n by 0 < d < 2**32 (long division in 32-bit limbs)."""
    r = U0
    x = (r << U32) | (nh >> U32)
    q3 = x // d
    r = x - q3 * d
    x = (r << U32) | (nh & M32)
    q2 = x // d
    r = x - q2 * d
    x = (r << U32) | (nl >> U32)
    q1 = x // d
    r = x - q1 * d
    x = (r << U32) | (nl & M32)
    q0 = x // d
    r = x - q0 * d
    return (q3 << U32) | q2, (q1 << U32) | q0, r


@device
def bitlen64(x):
    n = 0
    while x > U0:
        n += 1
        x = x >> U1
    return n


@device
def shift_floor(m, s):
    """floor(m * 2**s) for uint64 m and an int s (the result must fit in 64 bits)."""
    if s >= 0:
        return m << U(s)
    if s <= -64:
        return U0
    return m >> U(-s)


# ---------------------------------------------------------------- RNG draws


@device
def uniform_below(nh, nl, seed, gen, rnd, pos, domain, start):
    """Exact uniform in [0, n) by masked rejection: (v_hi, v_lo, next_index, ok)."""
    mh, ml = sub128(nh, nl, U0, U1)
    if mh > U0:
        bits = 64 + bitlen64(mh)
    else:
        bits = bitlen64(ml)
    mask_h = U0
    mask_l = M64
    if bits >= 128:
        mask_h = M64
    elif bits > 64:
        mask_h = (U1 << U(bits - 64)) - U1
    elif bits < 64:
        mask_l = (U1 << U(bits)) - U1
    index = start
    while index <= MAX_DRAW_INDEX:
        w0, w1, w2, w3 = draw_block(seed, gen, rnd, pos, domain, index)
        xl = (w0 | (w1 << U32)) & mask_l
        xh = (w2 | (w3 << U32)) & mask_h
        index += 1
        if lt128(xh, xl, nh, nl):
            return xh, xl, index, True
    return U0, U0, index, False


@device
def uniform_below_63(n, seed, gen, rnd, pos, domain, start):
    """Uniform in [0, n), 1 <= n <= 2**63, with the fixed mask 2**63 - 1
    (philox.uniform_below_63): (value, next_index, ok)."""
    index = start
    while index <= MAX_DRAW_INDEX:
        w0, w1, w2, w3 = draw_block(seed, gen, rnd, pos, domain, index)
        x = (w0 | (w1 << U32)) & LOW63
        index += 1
        if x < n:
            return x, index, True
    return U0, index, False


@device
def accept_decision(pd, total, c, seed, gen, rnd, pos, domain):
    """(ok, rng_ok) of one draft token (reference sampling.accept): accept with
    probability min(1, P_d 2**24 / (T c)), exactly.  N = P_d * 2**24 (128-bit);
    N >= T c always accepts, else N = a c + b and the test is
    ``V1 < a or (V1 == a and V2 < b)`` with V1 uniform on [0, T) (uniform_below_63),
    V2 on [0, c)."""
    nh = pd >> U40
    nl = pd << U24
    mh, ml = mul64(total, c)
    if not lt128(nh, nl, mh, ml):
        return True, True
    ah, al, rb = divmod128_small(nh, nl, c)
    vl, nxt, good = uniform_below_63(total, seed, gen, rnd, pos, domain, 0)
    if not good:
        return False, False
    if ah != U0 or vl != al:
        return lt128(U0, vl, ah, al), True
    _, wl, _, good = uniform_below(U0, c, seed, gen, rnd, pos, domain, nxt)
    if not good:
        return False, False
    return wl < rb, True


# ---------------------------------------------------------------- conversions


@device
def exp2_neg_q62(f):
    e = EXP_TAB[0, np.int64((f >> U(24)) & U255)]
    h, l = mul64(e, EXP_TAB[1, np.int64((f >> U(16)) & U255)])
    e = (h << U2) | (l >> U62)
    h, l = mul64(e, EXP_TAB[2, np.int64((f >> U8) & U255)])
    e = (h << U2) | (l >> U62)
    h, l = mul64(e, EXP_TAB[3, np.int64(f & U255)])
    e = (h << U2) | (l >> U62)
    return e


@device
def weight_from_gap(t):
    """Integer weight ~ 2**39 exp(-t) of a binary64 gap t = zmax - z >= 0."""
    if not t < 32.0:
        return U0
    t32 = U(t * 4294967296.0)  # one multiply, truncation (t >= 0)
    h, l = mul64(t32, LOG2E)
    y = (h << U1) | (l >> U63)
    shift = U23 + (y >> U32)
    if shift >= U63:
        return U0
    return exp2_neg_q62(y & M32) >> shift


@device
def f64_key(z):
    """An order-preserving uint64 of a non-NaN binary64 (-0.0 and 0.0 give one key).

    Rebuilds the IEEE magnitude bits with frexp and exact power-of-two scalings
    (no bit casts, which the simulator lacks), then maps sign to order.
    """
    if z == 0.0:
        return TOP_BIT
    neg = z < 0.0
    a = -z if neg else z
    if a == math.inf:
        bits = F64_INF_BITS
    elif a < MIN_NORMAL:
        bits = U((a * TWO537) * TWO537)  # subnormal: a = k * 2**-1074, k < 2**52
    else:
        m, e = math.frexp(a)  # a = m * 2**e, m in [0.5, 1)
        bits = (U(e + 1022) << U52) | (U(m * TWO53) - F64_HIDDEN)
    if neg:
        return TOP_BIT - U1 - bits
    return TOP_BIT | bits


@device
def f32_mant_exp(mag):
    """(mantissa uint64, exponent int) of a float32 magnitude bit pattern."""
    ex = np.int64((mag >> U23) & U255)
    m = mag & F32_MANT
    if ex == 0:
        return m, -149
    return m | F32_HIDDEN, ex - 150


@device
def target_fixed(bits):
    """(P, invalid) for one float32 target value: P = floor(p * 2**62)."""
    mag = bits & F32_MAG
    if ((bits >> U(31)) > U0 and mag > U0) or mag > F32_ONE:
        return U0, True
    m, e = f32_mant_exp(mag)
    return shift_floor(m, e + 62), False


@device
def effective_logit(xf, bias, has_bias, b, brow, v, temperature):
    # np.float64, not float(): compiled numba types float(float32) as float32
    # (the simulator does not), which would round x + bias in binary32.
    x = np.float64(xf[b, v])
    if has_bias:
        x = x + np.float64(bias[brow, v])
    return x / np.float64(temperature)


# ---------------------------------------------------------------- block helpers


@cuda.jit(device=True)
def block_argmax(key, idx, sh_k, sh_i, tid, tpb):
    """Block-wide (key, idx) with the largest key, ties to the lowest idx."""
    cuda.syncthreads()
    sh_k[tid] = key
    sh_i[tid] = idx
    cuda.syncthreads()
    s = tpb // 2
    while s > 0:
        if tid < s:
            k2 = sh_k[tid + s]
            i2 = sh_i[tid + s]
            if k2 > sh_k[tid] or (k2 == sh_k[tid] and i2 < sh_i[tid]):
                sh_k[tid] = k2
                sh_i[tid] = i2
        cuda.syncthreads()
        s //= 2
    rk = sh_k[0]
    ri = sh_i[0]
    cuda.syncthreads()
    return rk, ri


@cuda.jit(device=True)
def block_sum128(h, l, sh_h, sh_l, tid, tpb):
    """Block-wide 128-bit sum (integer, so the tree order does not matter)."""
    cuda.syncthreads()
    sh_h[tid] = h
    sh_l[tid] = l
    cuda.syncthreads()
    s = tpb // 2
    while s > 0:
        if tid < s:
            rh, rl = add128(sh_h[tid], sh_l[tid], sh_h[tid + s], sh_l[tid + s])
            sh_h[tid] = rh
            sh_l[tid] = rl
        cuda.syncthreads()
        s //= 2
    rh = sh_h[0]
    rl = sh_l[0]
    cuda.syncthreads()
    return rh, rl


@cuda.jit(device=True)
def block_exscan128(h, l, sh_h, sh_l, tid, tpb):
    """Exclusive prefix (in thread order) of per-thread 128-bit values."""
    cuda.syncthreads()
    sh_h[tid] = h
    sh_l[tid] = l
    cuda.syncthreads()
    if tid == 0:
        ah = U0
        al = U0
        for t in range(tpb):
            ch = sh_h[t]
            cl = sh_l[t]
            sh_h[t] = ah
            sh_l[t] = al
            ah, al = add128(ah, al, ch, cl)
    cuda.syncthreads()
    ph = sh_h[tid]
    pl = sh_l[tid]
    cuda.syncthreads()
    return ph, pl


@device
def chunk_of(n, tid, tpb):
    c = (n + tpb - 1) // tpb
    lo = tid * c
    hi = lo + c
    if hi > n:
        hi = n
    if lo > n:
        lo = n
    return lo, hi


@cuda.jit(device=True)
def first_exceeding(wh, wl, use_hi, b, n, rh, rl, sh_h, sh_l, sh_k, sh_i, tid, tpb):
    """First index of row b whose running sum of weights exceeds r, or -1.

    Weights are wl[b, v] (plus wh[b, v] << 64 when use_hi).  Each thread sums
    a contiguous chunk, the chunk sums are scanned, and the one thread whose
    chunk contains r walks it.
    """
    lo, hi = chunk_of(n, tid, tpb)
    sh_ = U0
    sl_ = U0
    for v in range(lo, hi):
        xh = U(wh[b, v]) if use_hi else U0
        sh_, sl_ = add128(sh_, sl_, xh, U(wl[b, v]))
    ph, pl = block_exscan128(sh_, sl_, sh_h, sh_l, tid, tpb)
    found = -1
    eh, el = add128(ph, pl, sh_, sl_)
    if not lt128(rh, rl, ph, pl) and lt128(rh, rl, eh, el):
        ah = ph
        al = pl
        for v in range(lo, hi):
            xh = U(wh[b, v]) if use_hi else U0
            ah, al = add128(ah, al, xh, U(wl[b, v]))
            if lt128(rh, rl, ah, al):
                found = v
                break
    key = U1 if found >= 0 else U0
    k, i = block_argmax(key, found, sh_k, sh_i, tid, tpb)
    if k == U0:
        return -1
    return i


@cuda.jit(device=True)
def radix_select(keys, b, n, k, sh_hist, sh_misc, tid, tpb):
    """Threshold of the k largest keys[b, :n] (1 <= k <= n), 8 bits per pass.

    Returns (thr, take): every key > thr is selected, plus the ``take``
    lowest-id keys equal to thr.  Histograms use shared-memory integer atomics,
    whose result does not depend on order.
    """
    prefix = U0
    mask = U0
    kk = k
    for d in range(7, -1, -1):
        shift = U(8 * d)
        cuda.syncthreads()
        for j in range(tid, 256, tpb):
            sh_hist[j] = 0
        cuda.syncthreads()
        for v in range(tid, n, tpb):
            key = keys[b, v]
            if (key & mask) == prefix:
                cuda.atomic.add(sh_hist, np.int64((key >> shift) & U255), 1)
        cuda.syncthreads()
        if tid == 0:
            cum = 0
            j = 255
            while j > 0:
                h = sh_hist[j]
                if cum + h >= kk:
                    break
                cum += h
                j -= 1
            sh_misc[0] = j
            sh_misc[1] = kk - cum
        cuda.syncthreads()
        j = sh_misc[0]
        kk = sh_misc[1]
        prefix = prefix | (U(j) << shift)
        mask = mask | (U255 << shift)
    cuda.syncthreads()
    return prefix, kk


@cuda.jit(device=True)
def apply_select(keys, target, b, n, thr, take, mode, sh_h, sh_l, tid, tpb):
    """Apply a radix_select result: mode 0 zeroes target where not selected,
    mode 1 adds one to target where selected.  Ties to thr are ranked by id
    with a block scan over contiguous chunks."""
    lo, hi = chunk_of(n, tid, tpb)
    cnt = U0
    for v in range(lo, hi):
        if keys[b, v] == thr:
            cnt += U1
    _, rank = block_exscan128(U0, cnt, sh_h, sh_l, tid, tpb)
    utake = U(take)
    for v in range(lo, hi):
        key = keys[b, v]
        sel = key > thr
        if key == thr:
            sel = rank < utake
            rank += U1
        if mode == 0:
            if not sel:
                target[b, v] = U0
        elif sel:
            target[b, v] = target[b, v] + U1
    cuda.syncthreads()
