/* dyadic integer core: the whole decision arithmetic of dyadic, header-only.
 *
 * One source for every backend: the Cython CPU extension includes it with a
 * C compiler (gcc/clang, -ffp-contract=off, no fast-math) and the CUDA
 * backend hands it to NVRTC (--fmad=false).  Every function mirrors a
 * function of dyadic/reference/ bit for bit; the reference is the
 * specification, this file is an implementation of it.
 *
 * Floating point appears only where the reference uses it
 * (dyadic/reference/fixedpoint.py): z = (x + bias) / temperature, the gap
 * t = zmax - z, the test t < 32.0, t * 2**32 and its truncation.
 * Everything else is integer arithmetic.
 *
 * Nothing here allocates: row functions take caller-provided workspaces
 * whose sizes are given by the dy_*_ws_words() functions (in uint64_t words).
 *
 * Compatibility guarantee: for the same inputs every function returns the
 * same bits on every platform and compiler that honours IEEE-754 binary64
 * round-to-nearest without contraction, and equals dyadic/reference.
 */
#ifndef DYADIC_CORE_H
#define DYADIC_CORE_H

#if defined(__CUDACC_RTC__)
typedef unsigned char uint8_t;
typedef unsigned int uint32_t;
typedef int int32_t;
typedef unsigned long long uint64_t;
typedef long long int64_t;
#else
#include <stdint.h>
#endif

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define DY_CUDA 1
#define DY_FUNC static __device__ __forceinline__
#ifndef DY_CONST_TABLE
#define DY_CONST_TABLE __device__ static const
#endif
#else
#define DY_FUNC static inline
#ifndef DY_CONST_TABLE
#define DY_CONST_TABLE static const
#endif
#endif

/* Host hot loops get an AVX2 clone next to the baseline one (GCC ifunc);
 * both are integer-exact, so the result does not depend on the clone. */
#if !defined(DY_CUDA) && defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && \
    defined(__linux__) && !defined(DY_NO_CLONES)
#define DY_HOT static __attribute__((target_clones("avx2", "default"), noinline))
#else
#define DY_HOT DY_FUNC
#endif

#ifndef DY_NULL
#define DY_NULL 0
#endif

/* The generated table is declared as dy_exp2_neg_q62[4][256]; it is renamed
 * dy_exp2_neg_q62_table here so that dy_exp2_neg_q62() can be the function. */
#define dy_exp2_neg_q62 dy_exp2_neg_q62_table
#include "dyadic_exp_table.h"
#undef dy_exp2_neg_q62

/* ---- constants: identical to dyadic/_spec.py (tests/spec/test_spec_constants.py) ---- */
#define DY_TOTAL (1u << 24)
#define DY_TOTAL_BITS 24
#define DY_WEIGHT_BITS 39
#define DY_TARGET_BITS 62
#define DY_TARGET_TOL_BITS 10
#define DY_EXP_CUTOFF 32.0
#define DY_MAX_VOCAB (1u << 24)
#define DY_DOMAIN_SHIFT 28
#define DY_MAX_DRAW_INDEX ((1u << 28) - 1u)
#define DY_DOMAIN_PROPOSAL 1u
#define DY_DOMAIN_ACCEPTANCE 2u
#define DY_DOMAIN_CORRECTION 3u
#define DY_POLICY_STANDARD 0
#define DY_POLICY_FLOOR_FIRST 1
#define DY_PAD_ID (-1)

/* ---- status codes: identical to dyadic/_status.py ---- */
#define DY_ST_OK 0
#define DY_ST_X_NAN 1
#define DY_ST_X_POSINF 2
#define DY_ST_X_NEGATIVE 3
#define DY_ST_X_ZERO_MASS 4
#define DY_ST_ALLOC_INCONSISTENT 5
#define DY_ST_TARGET_INVALID_VALUE 10
#define DY_ST_TARGET_SUM 11
#define DY_ST_Q_ZERO_AT_DRAFT 12
#define DY_ST_DRAFT_OUT_OF_RANGE 13
#define DY_ST_Q_INVALID 14
#define DY_ST_NUM_DRAFTS_INVALID 15
#define DY_ST_TARGET_ZERO_MASS 16
#define DY_ST_SHARD_INVALID 17
#define DY_ST_TEMPERATURE_INVALID 30
#define DY_ST_TOP_K_INVALID 31
#define DY_ST_TOP_P_INVALID 32
#define DY_ST_MIN_P_INVALID 33
#define DY_ST_RNG_EXHAUSTED 20

/* Philox4x32 constants (Random123). */
#define DY_PHILOX_M0 0xD2511F53u
#define DY_PHILOX_M1 0xCD9E8D57u
#define DY_PHILOX_W0 0x9E3779B9u
#define DY_PHILOX_W1 0xBB67AE85u

/* ======================= 128-bit unsigned integers ======================= */

typedef struct {
    uint64_t hi, lo;
} dy_u128;

DY_FUNC dy_u128 dy_make128(uint64_t hi, uint64_t lo) {
    dy_u128 r;
    r.hi = hi;
    r.lo = lo;
    return r;
}

DY_FUNC dy_u128 dy_from64(uint64_t lo) { return dy_make128(0, lo); }

/* Full 64 x 64 -> 128-bit product. */
DY_FUNC dy_u128 dy_mul64(uint64_t a, uint64_t b) {
#if defined(DY_CUDA)
    return dy_make128(__umul64hi(a, b), a * b);
#elif defined(__SIZEOF_INT128__)
    unsigned __int128 p = (unsigned __int128)a * b;
    return dy_make128((uint64_t)(p >> 64), (uint64_t)p);
#else
    uint64_t a0 = a & 0xFFFFFFFFu, a1 = a >> 32, b0 = b & 0xFFFFFFFFu, b1 = b >> 32;
    uint64_t p00 = a0 * b0, p01 = a0 * b1, p10 = a1 * b0, p11 = a1 * b1;
    uint64_t mid = (p00 >> 32) + (p01 & 0xFFFFFFFFu) + (p10 & 0xFFFFFFFFu);
    return dy_make128(p11 + (p01 >> 32) + (p10 >> 32) + (mid >> 32),
                      (mid << 32) | (p00 & 0xFFFFFFFFu));
#endif
}

/* High 64 bits of a * b. */
DY_FUNC uint64_t dy_mulhi64(uint64_t a, uint64_t b) { return dy_mul64(a, b).hi; }

DY_FUNC dy_u128 dy_add128(dy_u128 a, dy_u128 b) {
    dy_u128 r;
    r.lo = a.lo + b.lo;
    r.hi = a.hi + b.hi + (r.lo < a.lo);
    return r;
}

/* a - b (mod 2**128). */
DY_FUNC dy_u128 dy_sub128(dy_u128 a, dy_u128 b) {
    dy_u128 r;
    r.lo = a.lo - b.lo;
    r.hi = a.hi - b.hi - (a.lo < b.lo);
    return r;
}

DY_FUNC int dy_lt128(dy_u128 a, dy_u128 b) { return a.hi < b.hi || (a.hi == b.hi && a.lo < b.lo); }
DY_FUNC int dy_le128(dy_u128 a, dy_u128 b) { return !dy_lt128(b, a); }
DY_FUNC int dy_eq128(dy_u128 a, dy_u128 b) { return a.hi == b.hi && a.lo == b.lo; }
DY_FUNC int dy_is_zero128(dy_u128 a) { return (a.hi | a.lo) == 0; }

/* a << s for 0 <= s < 128. */
DY_FUNC dy_u128 dy_shl128(dy_u128 a, int s) {
    if (s <= 0) return a;
    if (s >= 128) return dy_make128(0, 0);
    if (s >= 64) return dy_make128(a.lo << (s - 64), 0);
    return dy_make128((a.hi << s) | (a.lo >> (64 - s)), a.lo << s);
}

/* a >> s for 0 <= s < 128. */
DY_FUNC dy_u128 dy_shr128(dy_u128 a, int s) {
    if (s <= 0) return a;
    if (s >= 128) return dy_make128(0, 0);
    if (s >= 64) return dy_make128(0, a.hi >> (s - 64));
    return dy_make128(a.hi >> s, (a.lo >> s) | (a.hi << (64 - s)));
}

DY_FUNC dy_u128 dy_and128(dy_u128 a, dy_u128 b) { return dy_make128(a.hi & b.hi, a.lo & b.lo); }

DY_FUNC int dy_bitlen64(uint64_t x) {
#if defined(DY_CUDA)
    return 64 - __clzll((long long)x);
#else
    return x ? 64 - __builtin_clzll(x) : 0;
#endif
}

/* Python's int.bit_length(). */
DY_FUNC int dy_bitlen128(dy_u128 a) { return a.hi ? 64 + dy_bitlen64(a.hi) : dy_bitlen64(a.lo); }

/* (1 << bits) - 1 for 0 <= bits <= 128. */
DY_FUNC dy_u128 dy_mask128(int bits) {
    if (bits >= 128) return dy_make128(~0ull, ~0ull);
    if (bits >= 64) return dy_make128(bits == 64 ? 0 : (~0ull >> (128 - bits)), ~0ull);
    return dy_make128(0, bits ? (~0ull >> (64 - bits)) : 0);
}

/* floor(m * 2**s) for m >= 0, any s (fixedpoint.shift_floor) with a 64-bit result. */
DY_FUNC uint64_t dy_shift_floor64(uint64_t m, int s) {
    if (s >= 0) return s >= 64 ? 0 : m << s;
    return s <= -64 ? 0 : m >> (-s);
}

/* Exact division by a fixed divisor d >= 1 using the reciprocal
 * floor((2**64 - 1) / d): the estimate is at most 2 below the quotient and
 * is corrected exactly, so the result equals n / d and n % d. */
DY_FUNC uint64_t dy_recip64(uint64_t d) { return (~0ull) / d; }

DY_FUNC uint64_t dy_divmod_recip(uint64_t n, uint64_t d, uint64_t recip, uint64_t *rem) {
    uint64_t q = dy_mulhi64(n, recip);
    uint64_t r = n - q * d;
    while (r >= d) {
        q += 1;
        r -= d;
    }
    *rem = r;
    return q;
}

/* ================================ Philox ================================ */

DY_FUNC void dy_philox4x32(const uint32_t ctr[4], const uint32_t key[2], int rounds,
                           uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    int r;
    for (r = 0; r < rounds; r++) {
        uint64_t p0, p1;
        uint32_t n0, n1, n2, n3;
        if (r) {
            k0 += DY_PHILOX_W0;
            k1 += DY_PHILOX_W1;
        }
        p0 = (uint64_t)DY_PHILOX_M0 * c0;
        p1 = (uint64_t)DY_PHILOX_M1 * c2;
        n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        n1 = (uint32_t)p1;
        n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        n3 = (uint32_t)p0;
        c0 = n0;
        c1 = n1;
        c2 = n2;
        c3 = n3;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* The 4 words of one draw: key = (seed lo32, seed hi32), counter =
 * ((domain << 28) | draw_index, position, round, generation). */
DY_FUNC void dy_philox_block(uint64_t seed, uint32_t generation, uint32_t round,
                             uint32_t position, uint32_t domain, uint32_t draw_index,
                             uint32_t out[4]) {
    uint32_t ctr[4], key[2];
    ctr[0] = (domain << DY_DOMAIN_SHIFT) | draw_index;
    ctr[1] = position;
    ctr[2] = round;
    ctr[3] = generation;
    key[0] = (uint32_t)seed;
    key[1] = (uint32_t)(seed >> 32);
    dy_philox4x32(ctr, key, 10, out);
}

/* The 24-bit proposal draw: word 0 of draw index 0 (domain PROPOSAL) >> 8. */
DY_FUNC uint32_t dy_proposal_ticket(uint64_t seed, uint32_t generation, uint32_t round,
                                    uint32_t position) {
    uint32_t w[4];
    dy_philox_block(seed, generation, round, position, DY_DOMAIN_PROPOSAL, 0, w);
    return w[0] >> 8;
}

/* Uniform integer in [0, n), 1 <= n < 2**128, by masked rejection over the
 * 128-bit block X = w0 | w1 << 32 | w2 << 64 | w3 << 96 at draw indices
 * *draw_index, *draw_index + 1, ... (philox.uniform_below).  Advances
 * *draw_index past the accepted block.  Returns DY_ST_OK or
 * DY_ST_RNG_EXHAUSTED. */
DY_FUNC int dy_uniform_below_u128(dy_u128 n, uint64_t seed, uint32_t generation, uint32_t round,
                                  uint32_t position, uint32_t domain, uint32_t *draw_index,
                                  dy_u128 *out) {
    dy_u128 mask = dy_mask128(dy_bitlen128(dy_sub128(n, dy_from64(1))));
    uint32_t index = *draw_index;
    while (index <= DY_MAX_DRAW_INDEX) {
        uint32_t w[4];
        dy_u128 x;
        dy_philox_block(seed, generation, round, position, domain, index, w);
        x = dy_make128((uint64_t)w[2] | ((uint64_t)w[3] << 32),
                       (uint64_t)w[0] | ((uint64_t)w[1] << 32));
        x = dy_and128(x, mask);
        index += 1;
        if (dy_lt128(x, n)) {
            *draw_index = index;
            *out = x;
            return DY_ST_OK;
        }
    }
    *draw_index = index;
    return DY_ST_RNG_EXHAUSTED;
}

/* The same for 1 <= n < 2**64 (only the low 64 bits of X are ever kept). */
DY_FUNC int dy_uniform_below_u64(uint64_t n, uint64_t seed, uint32_t generation, uint32_t round,
                                 uint32_t position, uint32_t domain, uint32_t *draw_index,
                                 uint64_t *out) {
    int bits = dy_bitlen64(n - 1);
    uint64_t mask = bits >= 64 ? ~0ull : ((1ull << bits) - 1);
    uint32_t index = *draw_index;
    while (index <= DY_MAX_DRAW_INDEX) {
        uint32_t w[4];
        uint64_t x;
        dy_philox_block(seed, generation, round, position, domain, index, w);
        x = ((uint64_t)w[0] | ((uint64_t)w[1] << 32)) & mask;
        index += 1;
        if (x < n) {
            *draw_index = index;
            *out = x;
            return DY_ST_OK;
        }
    }
    *draw_index = index;
    return DY_ST_RNG_EXHAUSTED;
}

/* ====================== fixed point (fixedpoint.py) ====================== */

DY_FUNC uint64_t dy_mul_q62(uint64_t a, uint64_t b) {
    dy_u128 p = dy_mul64(a, b);
    return (p.hi << 2) | (p.lo >> 62);
}

/* floor-chained 2**(-f / 2**32) * 2**62 (four table steps) with the table tab (a copy
 * of dy_exp2_neg_q62_table: the GPU kernels pass one in shared memory). */
DY_FUNC uint64_t dy_exp2_neg_q62_tab(uint32_t f, const uint64_t (*tab)[256]) {
    uint64_t e = tab[0][(f >> 24) & 0xFFu];
    e = dy_mul_q62(e, tab[1][(f >> 16) & 0xFFu]);
    e = dy_mul_q62(e, tab[2][(f >> 8) & 0xFFu]);
    e = dy_mul_q62(e, tab[3][f & 0xFFu]);
    return e;
}

DY_FUNC uint64_t dy_exp2_neg_q62(uint32_t f) {
    return dy_exp2_neg_q62_tab(f, dy_exp2_neg_q62_table);
}

/* Integer weight ~ 2**39 * exp(-t) of a gap t = zmax - z >= 0 (0 for t >= 32, +inf),
 * with the table tab (dy_exp2_neg_q62_tab). */
DY_FUNC uint64_t dy_weight_from_gap_tab(double t, const uint64_t (*tab)[256]) {
    uint64_t t32, y, n;
    dy_u128 p;
    if (!(t < DY_EXP_CUTOFF)) return 0;
    t32 = (uint64_t)(t * 4294967296.0);
    p = dy_mul64(t32, DY_LOG2E_Q63);
    y = (p.hi << 1) | (p.lo >> 63);
    n = y >> 32;
    if (23 + n >= 63) return 0;
    return dy_exp2_neg_q62_tab((uint32_t)(y & 0xFFFFFFFFu), tab) >> (23 + n);
}

DY_FUNC uint64_t dy_weight_from_gap(double t) {
    return dy_weight_from_gap_tab(t, dy_exp2_neg_q62_table);
}

/* The exponent e of |x| = mant * 2**e (fixedpoint.f32_mant_exp). */
DY_FUNC int dy_f32_exp(uint32_t bits) {
    uint32_t e = (bits >> 23) & 0xFFu;
    return e ? (int)e - 150 : -149;
}

DY_FUNC uint32_t dy_f32_mant(uint32_t bits) {
    uint32_t e = (bits >> 23) & 0xFFu;
    uint32_t m = bits & 0x7FFFFFu;
    return e ? (m | 0x800000u) : m;
}

/* Weight of a validated non-negative float32 weight: floor(mant * 2**(exp - emax + 15)). */
DY_FUNC uint64_t dy_prob_weight(uint32_t bits, int emax) {
    uint32_t mag = bits & 0x7FFFFFFFu;
    uint32_t m = dy_f32_mant(mag);
    if (!m) return 0;
    return dy_shift_floor64(m, dy_f32_exp(mag) - emax + 15);
}

/* A target probability is valid when finite, >= 0 (-0.0 allowed) and <= 1. */
DY_FUNC int dy_target_bits_valid(uint32_t bits) { return bits <= 0x3F800000u || bits == 0x80000000u; }

/* P = floor(p * 2**62) of a valid target probability. */
DY_FUNC uint64_t dy_target_fixed(uint32_t bits) {
    uint32_t mag = bits & 0x7FFFFFFFu;
    return dy_shift_floor64(dy_f32_mant(mag), dy_f32_exp(mag) + DY_TARGET_BITS);
}

/* float32 -> binary64, exact (subnormals kept).  On the device by integer bit
 * manipulation: CuPy appends -ftz=true to every NVRTC compile, under which the
 * conversion instruction would flush a subnormal float32 to zero. */
DY_FUNC double dy_f2d(float f) {
#if defined(DY_CUDA)
    const uint32_t b = __float_as_uint(f);
    const uint64_t s = (uint64_t)(b >> 31) << 63;
    const uint32_t e = (b >> 23) & 0xFFu, m = b & 0x7FFFFFu;
    uint64_t r;
    if (e == 0xFFu) r = s | 0x7FF0000000000000ull | ((uint64_t)m << 29); /* inf, NaN */
    else if (e) r = s | ((uint64_t)(e + 896u) << 52) | ((uint64_t)m << 29);
    else if (!m) r = s;
    else { /* subnormal m * 2**-149 */
        const int p = 31 - __clz(m);
        r = s | ((uint64_t)(p + 874) << 52) | (((uint64_t)m << (52 - p)) & 0xFFFFFFFFFFFFFull);
    }
    return __longlong_as_double((long long)r);
#else
    return (double)f;
#endif
}

/* z = (x + b) / temperature in binary64 (no bias: x / temperature).  The
 * division by exactly 1.0 is skipped: it is the identity in IEEE-754. */
DY_FUNC double dy_effective_logit(float x, const float *bias, uint32_t v, double temperature) {
    double z = dy_f2d(x);
    if (bias) z = z + dy_f2d(bias[v]);
    return temperature == 1.0 ? z : z / temperature;
}

/* +infinity without libm. */
DY_FUNC double dy_inf(void) {
#if defined(DY_CUDA)
    return __longlong_as_double(0x7FF0000000000000LL);
#else
    union {
        uint64_t u;
        double d;
    } c;
    c.u = 0x7FF0000000000000ull;
    return c.d;
#endif
}

/* Monotone map of a non-NaN double to uint64 with -0.0 == +0.0. */
DY_FUNC uint64_t dy_order_key(double z) {
    union {
        double d;
        uint64_t u;
    } c;
    if (z == 0.0) z = 0.0;
#if defined(DY_CUDA)
    c.u = (uint64_t)__double_as_longlong(z);
#else
    c.d = z;
#endif
    return (c.u >> 63) ? ~c.u : (c.u | 0x8000000000000000ull);
}

/* ====================== acceptance (sampling.py) ====================== */

/* Uniform in [0, n), 1 <= n <= 2**63, by rejection with the fixed mask 2**63 - 1
 * (philox.uniform_below_63): the value does not depend on n beyond the
 * comparison x < n.  *index: the first draw index in, the next one out. */
DY_FUNC int dy_uniform_below_63(uint64_t n, uint64_t seed, uint32_t generation, uint32_t round,
                                uint32_t position, uint32_t domain, uint32_t *index,
                                uint64_t *out) {
    uint32_t w[4];
    uint64_t x;
    while (*index <= DY_MAX_DRAW_INDEX) {
        dy_philox_block(seed, generation, round, position, domain, *index, w);
        *index += 1;
        x = ((uint64_t)w[0] | ((uint64_t)w[1] << 32)) & 0x7FFFFFFFFFFFFFFFull;
        if (x < n) {
            *out = x;
            return DY_ST_OK;
        }
    }
    return DY_ST_RNG_EXHAUSTED;
}

/* (always, a, b): accept d with probability min(1, P_d 2**24 / (T c_d)). */
DY_FUNC void dy_accept_split(uint64_t p_fixed, uint64_t total, uint32_t count, int *always,
                             uint64_t *a, uint32_t *b) {
    dy_u128 n = dy_make128(p_fixed >> (64 - DY_TOTAL_BITS), p_fixed << DY_TOTAL_BITS);
    uint64_t q1, r1, low;
    if (!dy_lt128(n, dy_mul64(total, count))) {
        *always = 1;
        *a = 0;
        *b = 0;
        return;
    }
    *always = 0;
    /* n / count = (P / c) * 2**24 + ((P % c) * 2**24) / c, with (P % c) * 2**24 < 2**48 */
    q1 = p_fixed / count;
    r1 = p_fixed % count;
    low = r1 << DY_TOTAL_BITS;
    *a = (q1 << DY_TOTAL_BITS) + low / count;
    *b = (uint32_t)(low % count);
}

/* The acceptance decision of one draft token (domain ACCEPTANCE). */
DY_FUNC int dy_accept(uint64_t p_fixed, uint64_t total, uint32_t count, uint64_t seed,
                      uint32_t generation, uint32_t round, uint32_t position, int *accepted) {
    int always, st;
    uint64_t a, v1, v2;
    uint32_t b, idx = 0;
    dy_accept_split(p_fixed, total, count, &always, &a, &b);
    if (always) {
        *accepted = 1;
        return DY_ST_OK;
    }
    st = dy_uniform_below_63(total, seed, generation, round, position, DY_DOMAIN_ACCEPTANCE,
                             &idx, &v1);
    if (st) return st;
    if (v1 != a) {
        *accepted = v1 < a;
        return DY_ST_OK;
    }
    st = dy_uniform_below_u64(count, seed, generation, round, position, DY_DOMAIN_ACCEPTANCE,
                              &idx, &v2);
    if (st) return st;
    *accepted = v2 < b;
    return DY_ST_OK;
}

/* R_v = max(P_v * 2**24 - c_v * T, 0). */
DY_FUNC dy_u128 dy_residual(uint64_t p_fixed, uint32_t count, uint64_t total) {
    dy_u128 n = dy_make128(p_fixed >> (64 - DY_TOTAL_BITS), p_fixed << DY_TOTAL_BITS);
    dy_u128 m;
    if (count == 0) return n;
    m = dy_mul64(total, count);
    if (dy_le128(n, m)) return dy_make128(0, 0);
    return dy_sub128(n, m);
}

/* ====================== allocation (allocation.py) ====================== */

/* Selection of the k largest keys (ties: lowest position) by an MSD radix
 * select on 8-bit digits, linear time.  Requires 1 <= k <= n and every key
 * < 2**nbits.  Returns the threshold tau (the k-th largest key) and the
 * number `need` of keys equal to tau that are selected; idx[0..need) holds
 * their positions, ascending.  Keys > tau are all selected.  idx: n words. */
DY_FUNC uint32_t dy_select_top(const uint64_t *key, uint32_t n, uint32_t k, int nbits,
                               uint32_t *idx, uint64_t *tau) {
    uint32_t hist[256];
    int sh = nbits > 8 ? ((nbits + 7) / 8) * 8 - 8 : 0;
    uint64_t prefix = 0;
    uint32_t m = n, need = k, i, acc;
    int have_idx = 0, b;
    for (;;) {
        for (b = 0; b < 256; b++) hist[b] = 0;
        if (!have_idx) {
            for (i = 0; i < n; i++) hist[(key[i] >> sh) & 0xFFu]++;
        } else {
            for (i = 0; i < m; i++) hist[(key[idx[i]] >> sh) & 0xFFu]++;
        }
        acc = 0;
        for (b = 255; b > 0; b--) {
            if (acc + hist[b] >= need) break;
            acc += hist[b];
        }
        need -= acc;
        prefix |= (uint64_t)b << sh;
        {
            uint32_t m2 = 0;
            if (!have_idx) {
                for (i = 0; i < n; i++)
                    if (((key[i] >> sh) & 0xFFu) == (uint32_t)b) idx[m2++] = i;
            } else {
                for (i = 0; i < m; i++)
                    if (((key[idx[i]] >> sh) & 0xFFu) == (uint32_t)b) idx[m2++] = idx[i];
            }
            m = m2;
            have_idx = 1;
        }
        if (sh == 0) break;
        sh -= 8;
    }
    *tau = prefix;
    return need;
}

/* Floor + largest remainders (standard) or floor-first over n weights.
 * w: in weights, out remainders; counts: out, n words; argpos: position of
 * the argmax (floor-first); idx: n words of workspace.  Returns a status. */
DY_FUNC int dy_alloc_weights(uint64_t *w, uint32_t n, int policy, uint32_t argpos,
                             uint32_t *counts, uint32_t *idx) {
    uint64_t s = 0, sumbase = 0, recip, remaining;
    uint32_t i;
    for (i = 0; i < n; i++) s += w[i];
    if (s == 0) return DY_ST_X_ZERO_MASS;
    recip = dy_recip64(s);
    for (i = 0; i < n; i++) {
        uint64_t r, q = 0;
        if (w[i]) q = dy_divmod_recip(w[i] << DY_TOTAL_BITS, s, recip, &r);
        else r = 0;
        counts[i] = (uint32_t)q;
        w[i] = r;
        sumbase += q;
    }
    if (sumbase > DY_TOTAL || sumbase == 0) return DY_ST_ALLOC_INCONSISTENT;
    remaining = DY_TOTAL - sumbase;
    if (remaining == 0) return DY_ST_OK;
    if (policy == DY_POLICY_STANDARD) {
        uint64_t tau;
        uint32_t need, j;
        if (remaining > n) return DY_ST_ALLOC_INCONSISTENT;
        need = dy_select_top(w, n, (uint32_t)remaining, dy_bitlen64(s - 1), idx, &tau);
        for (i = 0; i < n; i++) counts[i] += (w[i] > tau);
        for (j = 0; j < need; j++) counts[idx[j]] += 1;
    } else {
        counts[argpos] += (uint32_t)remaining;
    }
    return DY_ST_OK;
}

/* Workspace of dy_allocate_row / dy_propose_row, in uint64_t words. */
DY_FUNC uint64_t dy_alloc_ws_words(uint32_t vocab, uint32_t top_k) {
    if (top_k == 0) return (uint64_t)vocab + (vocab + 1u) / 2u;
    return 2ull * top_k + 2ull * ((top_k + 1u) / 2u);
}

#ifndef DY_BLOCK
#define DY_BLOCK 64
#endif

/* Inverse of dy_order_key. */
DY_FUNC double dy_key_value(uint64_t key) {
    union {
        double d;
        uint64_t u;
    } c;
    c.u = (key >> 63) ? (key & 0x7FFFFFFFFFFFFFFFull) : ~key;
#if defined(DY_CUDA)
    return __longlong_as_double((long long)c.u);
#else
    return c.d;
#endif
}

/* z of n consecutive logits (the loop variants keep each loop branch-free). */
DY_FUNC void dy_logits_block(const float *x, const float *bias, double temperature, uint32_t n,
                             double *z) {
    uint32_t j;
    if (bias) {
        if (temperature == 1.0)
            for (j = 0; j < n; j++) z[j] = dy_f2d(x[j]) + dy_f2d(bias[j]);
        else
            for (j = 0; j < n; j++) z[j] = (dy_f2d(x[j]) + dy_f2d(bias[j])) / temperature;
    } else {
        if (temperature == 1.0)
            for (j = 0; j < n; j++) z[j] = dy_f2d(x[j]);
        else
            for (j = 0; j < n; j++) z[j] = dy_f2d(x[j]) / temperature;
    }
}

/* Heap of the k best (key desc, id asc); the root is the worst. */
DY_FUNC int dy_heap_worse(const uint64_t *hk, const uint32_t *hi, uint32_t a, uint32_t b) {
    return hk[a] < hk[b] || (hk[a] == hk[b] && hi[a] > hi[b]);
}

DY_FUNC void dy_heap_swap(uint64_t *hk, uint32_t *hi, uint32_t a, uint32_t b) {
    uint64_t tk = hk[a];
    uint32_t ti = hi[a];
    hk[a] = hk[b];
    hi[a] = hi[b];
    hk[b] = tk;
    hi[b] = ti;
}

DY_FUNC void dy_heap_down(uint64_t *hk, uint32_t *hi, uint32_t n, uint32_t i) {
    for (;;) {
        uint32_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && dy_heap_worse(hk, hi, l, w)) w = l;
        if (r < n && dy_heap_worse(hk, hi, r, w)) w = r;
        if (w == i) return;
        dy_heap_swap(hk, hi, i, w);
        i = w;
    }
}

DY_FUNC void dy_heap_offer(uint64_t *hk, uint32_t *hi, uint32_t *size, uint32_t k, uint64_t key,
                           uint32_t id) {
    uint32_t i;
    if (*size < k) {
        i = (*size)++;
        hk[i] = key;
        hi[i] = id;
        while (i && dy_heap_worse(hk, hi, i, (i - 1) / 2)) {
            dy_heap_swap(hk, hi, i, (i - 1) / 2);
            i = (i - 1) / 2;
        }
    } else if (key > hk[0]) { /* a later id wins only with a strictly larger key */
        hk[0] = key;
        hi[0] = id;
        dy_heap_down(hk, hi, k, 0);
    }
}

/* Heapsort of ids ascending. */
DY_FUNC void dy_sort_u32(uint32_t *a, uint32_t n) {
    uint32_t start, end;
    if (n < 2) return;
    for (start = n / 2; start-- > 0;) {
        uint32_t root = start;
        for (;;) {
            uint32_t c = 2 * root + 1, t;
            if (c >= n) break;
            if (c + 1 < n && a[c + 1] > a[c]) c++;
            if (a[root] >= a[c]) break;
            t = a[root]; a[root] = a[c]; a[c] = t;
            root = c;
        }
    }
    for (end = n - 1; end > 0; end--) {
        uint32_t t = a[0], root = 0;
        a[0] = a[end];
        a[end] = t;
        for (;;) {
            uint32_t c = 2 * root + 1;
            if (c >= end) break;
            if (c + 1 < end && a[c + 1] > a[c]) c++;
            if (a[root] >= a[c]) break;
            t = a[root]; a[root] = a[c]; a[c] = t;
            root = c;
        }
    }
}

/* Validation of one float32 weight: 0 if fine, else its status. */
DY_FUNC int dy_weight_bits_status(uint32_t b) {
    uint32_t mag = b & 0x7FFFFFFFu;
    if (b - 1u < 0x7F7FFFFFu || mag == 0) return DY_ST_OK; /* +0, -0, positive finite */
    if (mag > 0x7F800000u) return DY_ST_X_NAN;
    if (b == 0x7F800000u) return DY_ST_X_POSINF;
    return DY_ST_X_NEGATIVE;
}

DY_FUNC int dy_logit_status(double z) {
    return z != z ? DY_ST_X_NAN : DY_ST_X_POSINF;
}

#if !defined(DY_CUDA)
/* Host top-k of logits without bias (z = x / temperature, monotone
 * non-decreasing in x).  Pass 1: per block of 64 the float maximum and a
 * NaN/+inf flag.  With t the k-th largest block maximum, at least k tokens
 * have z >= zt = z(t), so every token of the top k (ties to the lowest id
 * included) has z >= zt and lies in a block whose maximum has z >= zt; pass
 * 2 runs the exact heap over those blocks only, in id order.  Returns 0
 * (nothing decided; the caller takes the exact streaming path) for a row
 * with NaN/+inf, an overflowing z, no finite z, or sizes out of range. */
#define DY_PMAXB 8192u
DY_FUNC float dy_key_float(int32_t key) {
    union {
        uint32_t u;
        float f;
    } c;
    c.u = (uint32_t)(key ^ ((key >> 31) & 0x7FFFFFFF));
    return c.f;
}
DY_HOT int dy_topk_logits_host(const float *x, double temperature, uint32_t vocab, uint32_t k,
                               uint64_t *hk, uint32_t *hid, uint32_t *size, double *zmax_out,
                               uint32_t *arg_out) {
    int32_t bkey[DY_PMAXB], th[256], gkey = INT32_MIN;
    const uint32_t *bits = (const uint32_t *)x;
    const double inf = dy_inf();
    uint32_t nb = (vocab + 63u) / 64u, blk, j, bad = 0, hn = 0, arg = 0;
    float t, gmax;
    double zt, zmax = -inf;
    if (nb > DY_PMAXB || k > nb || k > 256u || *size != 0) return 0;
    for (blk = 0; blk < nb; blk++) {
        uint32_t v0 = blk * 64u, n = vocab - v0 < 64u ? vocab - v0 : 64u, bd = 0;
        int32_t m = INT32_MIN;
        const uint32_t *bb = bits + v0;
        /* integer order key of a non-NaN float (-0.0 just below +0.0): a
         * vectorisable max; NaN/+inf are flagged and fall back */
        for (j = 0; j < n; j++) {
            uint32_t b = bb[j];
            int32_t sb = (int32_t)b, key = sb ^ ((sb >> 31) & 0x7FFFFFFF);
            bd |= (uint32_t)((b & 0x7FFFFFFFu) >= 0x7F800000u) & (uint32_t)(b != 0xFF800000u);
            m = key > m ? key : m;
        }
        bad |= bd;
        bkey[blk] = m;
    }
    if (bad) return 0;
    for (blk = 0; blk < nb; blk++) { /* min-heap of the k largest block maxima */
        int32_t m = bkey[blk];
        uint32_t i;
        gkey = m > gkey ? m : gkey;
        if (hn < k) {
            i = hn++;
            th[i] = m;
            while (i && th[(i - 1) / 2] > th[i]) {
                int32_t tmp = th[i];
                th[i] = th[(i - 1) / 2];
                th[(i - 1) / 2] = tmp;
                i = (i - 1) / 2;
            }
        } else if (m > th[0]) {
            th[0] = m;
            i = 0;
            for (;;) {
                uint32_t l = 2 * i + 1, r = l + 1, w = i;
                int32_t tmp;
                if (l < k && th[l] < th[w]) w = l;
                if (r < k && th[r] < th[w]) w = r;
                if (w == i) break;
                tmp = th[i];
                th[i] = th[w];
                th[w] = tmp;
                i = w;
            }
        }
    }
    gmax = dy_key_float(gkey);
    if (!(gmax > (float)-inf)) return 0;
    if (!(dy_effective_logit(gmax, DY_NULL, 0, temperature) < inf)) return 0;
    t = dy_key_float(th[0]);
    zt = dy_effective_logit(t, DY_NULL, 0, temperature);
    for (blk = 0; blk < nb; blk++) {
        uint32_t v0 = blk * 64u, n;
        float fb = dy_key_float(bkey[blk]);
        if (!(fb >= t) &&
            !(temperature != 1.0 && dy_effective_logit(fb, DY_NULL, 0, temperature) >= zt))
            continue;
        n = vocab - v0 < 64u ? vocab - v0 : 64u;
        for (j = 0; j < n; j++) {
            double zv = dy_effective_logit(x[v0 + j], DY_NULL, 0, temperature);
            uint64_t key;
            if (zv > zmax) {
                zmax = zv;
                arg = v0 + j;
            }
            key = dy_order_key(zv);
            if (*size < k || key > hk[0]) dy_heap_offer(hk, hid, size, k, key, v0 + j);
        }
    }
    *zmax_out = zmax;
    *arg_out = arg;
    return 1;
}
#endif

#if !defined(DY_CUDA)
/* Host dense allocation from validated weights w[0..n) (dy_alloc_weights,
 * the same bits): branch-free exact division, the first radix digit's
 * histogram built in the division pass, and the "key > tau" increments made
 * while narrowing (no final pass over n).  counts: n, idx: n words. */
DY_HOT int dy_alloc_weights_host(uint64_t *w, uint32_t n, uint64_t s, int policy,
                                 uint32_t argpos, uint32_t *counts, uint32_t *idx) {
    uint32_t hist[256];
    uint64_t sumbase = 0, recip, remaining;
    uint32_t i, m, need, acc;
    int nbits, sh, b, std = policy == DY_POLICY_STANDARD;
    if (s == 0) return DY_ST_X_ZERO_MASS;
    recip = dy_recip64(s);
    nbits = dy_bitlen64(s - 1);
    sh = nbits > 8 ? ((nbits + 7) / 8) * 8 - 8 : 0;
    for (b = 0; b < 256; b++) hist[b] = 0;
    if (s < (1ull << 62)) {
        /* Vectorisable exact division: qe = round(W 2**24 / s) from binary64
         * (W < 2**52 and the quotient <= 2**24, so |qe - q| <= 1 with q the
         * true floor), then r = W 2**24 - qe s (mod 2**64) identifies the
         * case: top bit set <=> qe = q + 1; r >= s <=> qe = q - 1 (s < 2**62
         * keeps the three ranges apart).  q, r are exactly n / s, n % s. */
        const double scale = 16777216.0 / (double)s, magic = 4503599627370496.0;
        const uint32_t slo = (uint32_t)s, shi = (uint32_t)(s >> 32);
        uint32_t i0;
        /* chunks of 64: the vectorised division, then the histogram of the
         * chunk's remainders while they are in L1 */
        for (i0 = 0; i0 < n; i0 += 64u) {
          uint32_t ne = n - i0 < 64u ? n - i0 : 64u, j;
          uint64_t *wc = w + i0;
          uint32_t *cc = counts + i0;
          for (j = 0; j < ne; j++) {
            uint64_t wv = wc[j], num = wv << DY_TOTAL_BITS, bitsd, qe, r, m;
            double wd, x;
            uint32_t q32;
            bitsd = 0x4330000000000000ull | wv;
            __builtin_memcpy(&wd, &bitsd, 8);
            x = (wd - magic) * scale + magic;
            __builtin_memcpy(&bitsd, &x, 8);
            q32 = (uint32_t)bitsd;
            qe = q32;
            r = num - ((uint64_t)q32 * slo + (((uint64_t)q32 * shi) << 32));
            m = 0 - (r >> 63);
            r += s & m;
            qe += m;
            m = 0 - (uint64_t)(r >= s);
            r -= s & m;
            qe -= m;
            cc[j] = (uint32_t)qe;
            wc[j] = r;
            sumbase += qe;
          }
          if (std)
            for (j = 0; j < ne; j++) hist[(wc[j] >> sh) & 0xFFu]++;
        }
    } else {
        for (i = 0; i < n; i++) {
            uint64_t num = w[i] << DY_TOTAL_BITS;
            uint64_t q = dy_mulhi64(num, recip), r = num - q * s, c;
            c = (uint64_t)(r >= s);
            q += c;
            r -= s & (0 - c);
            c = (uint64_t)(r >= s);
            q += c;
            r -= s & (0 - c);
            counts[i] = (uint32_t)q;
            w[i] = r;
            sumbase += q;
            if (std) hist[(r >> sh) & 0xFFu]++;
        }
    }
    if (sumbase > DY_TOTAL || sumbase == 0) return DY_ST_ALLOC_INCONSISTENT;
    remaining = DY_TOTAL - sumbase;
    if (remaining == 0) return DY_ST_OK;
    if (!std) {
        counts[argpos] += (uint32_t)remaining;
        return DY_ST_OK;
    }
    if (remaining > n) return DY_ST_ALLOC_INCONSISTENT;
    need = (uint32_t)remaining;
    m = 0;
    for (;;) {
        acc = 0;
        for (b = 255; b > 0; b--) {
            if (acc + hist[b] >= need) break;
            acc += hist[b];
        }
        need -= acc;
        if (m == 0) { /* first level: over all n */
            uint32_t m2 = 0;
            for (i = 0; i < n; i++) {
                uint32_t d = (uint32_t)(w[i] >> sh) & 0xFFu;
                counts[i] += (uint32_t)(d > (uint32_t)b);
                idx[m2] = i;
                m2 += (uint32_t)(d == (uint32_t)b);
            }
            m = m2;
        } else {
            uint32_t m2 = 0;
            for (i = 0; i < m; i++) {
                uint32_t v = idx[i], d = (uint32_t)(w[v] >> sh) & 0xFFu;
                counts[v] += (uint32_t)(d > (uint32_t)b);
                idx[m2] = v;
                m2 += (uint32_t)(d == (uint32_t)b);
            }
            m = m2;
        }
        if (sh == 0) break;
        sh -= 8;
        for (b = 0; b < 256; b++) hist[b] = 0;
        for (i = 0; i < m; i++) hist[(w[idx[i]] >> sh) & 0xFFu]++;
    }
    for (i = 0; i < need; i++) counts[idx[i]] += 1;
    return DY_ST_OK;
}
#endif

/* One row of allocate (allocation.allocate_row).
 * x: float32 [V] (weights when !logits, logits otherwise); bias: float32 [V]
 * or NULL (logits only); temperature > 0 (logits only); policy
 * DY_POLICY_*; top_k: 0 for dense, else the sparse width W = min(top_k, V).
 * Dense: counts [V].  Sparse: counts [W], ids [W] (ascending ids, zero
 * counts dropped, padded with DY_PAD_ID / 0).  ws: dy_alloc_ws_words words.
 * *argmax_out (may be NULL) receives the argmax.  Returns a status. */
DY_HOT int dy_allocate_row(const float *x, const float *bias, double temperature, int logits,
                            int policy, uint32_t vocab, uint32_t top_k, uint32_t *counts,
                            int32_t *ids, uint64_t *ws, int32_t *argmax_out) {
    const uint32_t *bits = (const uint32_t *)x;
    uint32_t v, arg = 0;
    int st;
    if (top_k == 0) {
        uint64_t *w = ws;
        uint32_t *idx = (uint32_t *)(ws + vocab);
        if (logits) {
            const double inf = dy_inf();
            double zmax = -inf;
            double *z = (double *)ws;
            for (v = 0; v < vocab; v++) {
                double zv = dy_effective_logit(x[v], bias, v, temperature);
                if (!(zv < inf)) return dy_logit_status(zv);
                z[v] = zv;
                if (zv > zmax) {
                    zmax = zv;
                    arg = v;
                }
            }
            if (!(zmax > -inf)) return DY_ST_X_ZERO_MASS;
            for (v = 0; v < vocab; v++) w[v] = dy_weight_from_gap(zmax - z[v]);
        } else {
            uint32_t best = 0;
            int emax;
            for (v = 0; v < vocab; v++) {
                uint32_t b = bits[v], mag = b & 0x7FFFFFFFu;
                if (!(b - 1u < 0x7F7FFFFFu) && mag) return dy_weight_bits_status(b);
                if (mag > best) {
                    best = mag;
                    arg = v;
                }
            }
            if (best == 0) return DY_ST_X_ZERO_MASS;
            emax = dy_f32_exp(best);
#if !defined(DY_CUDA)
            {
                /* branch-free dy_prob_weight of a validated row: every
                 * exponent is <= emax, so W = (mant << 15) >> (emax - exp) */
                uint64_t s = 0;
                for (v = 0; v < vocab; v++) {
                    uint32_t b = bits[v], e = (b >> 23) & 0xFFu;
                    uint64_t m = (uint64_t)((b & 0x7FFFFFu) | (e ? 0x800000u : 0u));
                    int32_t ex = e ? (int32_t)e - 150 : -149;
                    uint32_t d = (uint32_t)(emax - ex);
                    d = d > 63u ? 63u : d;
                    w[v] = (m << 15) >> d;
                    s += w[v];
                }
                if (argmax_out) *argmax_out = (int32_t)arg;
                return dy_alloc_weights_host(w, vocab, s, policy, arg, counts, idx);
            }
#endif
            for (v = 0; v < vocab; v++) w[v] = dy_prob_weight(bits[v], emax);
        }
        if (argmax_out) *argmax_out = (int32_t)arg;
        return dy_alloc_weights(w, vocab, policy, arg, counts, idx);
    } else {
        uint32_t k = top_k, size = 0, j, argpos = 0, o;
        uint64_t *hk = ws;
        uint64_t *w = ws + k;
        uint32_t *hid = (uint32_t *)(ws + 2 * k);
        uint32_t *idx = (uint32_t *)(ws + 2 * k + (k + 1u) / 2u);
        double zmax = 0.0;
        int emax = 0;
        int host_done = 0;
#if !defined(DY_CUDA)
        if (logits && !bias)
            host_done = dy_topk_logits_host(x, temperature, vocab, k, hk, hid, &size, &zmax, &arg);
#endif
        if (host_done) {
        } else if (logits && !bias) {
            /* No bias: z = x / temperature is monotone non-decreasing in x, so
             * with the heap full every x below the x of the heap root has
             * z <= the root's z and can change neither the heap nor the
             * argmax: a float compare against that x (plus a NaN bit test)
             * prefilters each block; candidates take the exact path. */
            const double inf = dy_inf();
            float xthr = (float)-inf;
            uint32_t v0;
            zmax = -inf;
            for (v0 = 0; v0 < vocab; v0 += DY_BLOCK) {
                uint32_t n = vocab - v0 < DY_BLOCK ? vocab - v0 : DY_BLOCK, j, flag = 0;
                const float *xb = x + v0;
                const uint32_t *bb = bits + v0;
                for (j = 0; j < n; j++)
                    flag |= (uint32_t)((bb[j] & 0x7FFFFFFFu) > 0x7F800000u) | (uint32_t)(xb[j] >= xthr);
                if (!flag) continue;
                for (j = 0; j < n; j++) {
                    double zv;
                    uint64_t key;
                    if (!(xb[j] >= xthr) && (bb[j] & 0x7FFFFFFFu) <= 0x7F800000u) continue;
                    zv = dy_effective_logit(xb[j], DY_NULL, 0, temperature);
                    if (!(zv < inf)) return dy_logit_status(zv);
                    if (zv > zmax) {
                        zmax = zv;
                        arg = v0 + j;
                    }
                    key = dy_order_key(zv);
                    if (size < k || key > hk[0]) {
                        dy_heap_offer(hk, hid, &size, k, key, v0 + j);
                        if (size == k) xthr = x[hid[0]];
                    }
                }
            }
            if (!(zmax > -inf)) return DY_ST_X_ZERO_MASS;
        } else if (logits) {
            const double inf = dy_inf();
            double zb[DY_BLOCK], thr = -inf;
            uint32_t v0;
            zmax = -inf;
            /* Blocks: a branch-free pass computes z, flags NaN/+inf and any z
             * above the heap threshold; only flagged blocks are walked. */
            for (v0 = 0; v0 < vocab; v0 += DY_BLOCK) {
                uint32_t n = vocab - v0 < DY_BLOCK ? vocab - v0 : DY_BLOCK, j, bad = 0, hit = 0;
                dy_logits_block(x + v0, bias ? bias + v0 : DY_NULL, temperature, n, zb);
                for (j = 0; j < n; j++) {
                    bad |= (uint32_t)!(zb[j] < inf);
                    hit |= (uint32_t)(zb[j] > thr);
                }
                if (!bad && !hit && size == k) continue;
                for (j = 0; j < n; j++) {
                    double zv = zb[j];
                    uint64_t key;
                    if (!(zv < inf)) return dy_logit_status(zv);
                    if (zv > zmax) {
                        zmax = zv;
                        arg = v0 + j;
                    }
                    key = dy_order_key(zv);
                    if (size < k || key > hk[0]) {
                        dy_heap_offer(hk, hid, &size, k, key, v0 + j);
                        if (size == k) thr = dy_key_value(hk[0]);
                    }
                }
            }
            if (!(zmax > -inf)) return DY_ST_X_ZERO_MASS;
        } else {
            uint32_t best = 0;
            for (v = 0; v < vocab; v++) {
                uint32_t b = bits[v], mag = b & 0x7FFFFFFFu;
                if (!(b - 1u < 0x7F7FFFFFu) && mag) return dy_weight_bits_status(b);
                if (mag > best) {
                    best = mag;
                    arg = v;
                }
                if (size < k || mag > hk[0]) dy_heap_offer(hk, hid, &size, k, mag, v);
            }
            if (best == 0) return DY_ST_X_ZERO_MASS;
            emax = dy_f32_exp(best);
        }
        if (argmax_out) *argmax_out = (int32_t)arg;
        dy_sort_u32(hid, k);
        for (j = 0; j < k; j++) {
            uint32_t id = hid[j];
            if (id == arg) argpos = j;
            if (logits) w[j] = dy_weight_from_gap(zmax - dy_effective_logit(x[id], bias, id, temperature));
            else w[j] = dy_prob_weight(bits[id], emax);
        }
        st = dy_alloc_weights(w, k, policy, argpos, counts, idx);
        if (st) return st;
        o = 0;
        for (j = 0; j < k; j++) {
            uint32_t c = counts[j];
            if (c) {
                counts[o] = c;
                ids[o] = (int32_t)hid[j];
                o++;
            }
        }
        for (; o < k; o++) {
            counts[o] = 0;
            ids[o] = DY_PAD_ID;
        }
        return DY_ST_OK;
    }
}

/* Temperature-0 proposal: argmax of x + bias in binary64 (ties: lowest id),
 * with the validation of logits_row_weights(row, bias, 1.0). */
DY_HOT int dy_argmax_row(const float *x, const float *bias, uint32_t vocab, int32_t *argmax) {
    uint32_t v, arg = 0;
    const double inf = dy_inf();
    double zmax = -inf;
    for (v = 0; v < vocab; v++) {
        double zv = dy_effective_logit(x[v], bias, v, 1.0);
        if (!(zv < inf)) return dy_logit_status(zv);
        if (zv > zmax) {
            zmax = zv;
            arg = v;
        }
    }
    if (!(zmax > -inf)) return DY_ST_X_ZERO_MASS;
    *argmax = (int32_t)arg;
    return DY_ST_OK;
}

/* Token drawn from a dense count row for a ticket r (first cumulative count > r); -1 if none. */
DY_FUNC int32_t dy_draw_dense(const uint32_t *counts, uint32_t width, uint32_t r) {
    uint64_t acc = 0;
    uint32_t v;
    for (v = 0; v < width; v++) {
        acc += counts[v];
        if (acc > r) return (int32_t)v;
    }
    return -1;
}

DY_FUNC int32_t dy_draw_sparse(const uint32_t *counts, const int32_t *ids, uint32_t width,
                               uint32_t r) {
    uint64_t acc = 0;
    uint32_t j;
    for (j = 0; j < width; j++) {
        acc += counts[j];
        if (acc > r) return ids[j];
    }
    return -1;
}

/* One row of propose: temperature 0 -> argmax point mass (no draw), else
 * allocate on logits and draw with the proposal ticket.  ids NULL when dense. */
DY_FUNC int dy_propose_row(const float *x, const float *bias, double temperature, int policy,
                           uint32_t vocab, uint32_t top_k, uint64_t seed, uint32_t generation,
                           uint32_t round, uint32_t position, int32_t *token, uint32_t *counts,
                           int32_t *ids, uint64_t *ws) {
    int st;
    uint32_t r;
    *token = -1;
    if (temperature == 0.0) {
        int32_t arg = -1;
        uint32_t j;
        st = dy_argmax_row(x, bias, vocab, &arg);
        if (st) return st;
        *token = arg;
        if (top_k == 0) {
            for (j = 0; j < vocab; j++) counts[j] = 0;
            counts[arg] = DY_TOTAL;
        } else {
            for (j = 0; j < top_k; j++) {
                counts[j] = 0;
                ids[j] = DY_PAD_ID;
            }
            counts[0] = DY_TOTAL;
            ids[0] = arg;
        }
        return DY_ST_OK;
    }
    st = dy_allocate_row(x, bias, temperature, 1, policy, vocab, top_k, counts, ids, ws, DY_NULL);
    if (st) return st;
    r = dy_proposal_ticket(seed, generation, round, position);
    *token = top_k == 0 ? dy_draw_dense(counts, vocab, r) : dy_draw_sparse(counts, ids, top_k, r);
    return DY_ST_OK;
}

/* ====================== verification (sampling.verify_row) ====================== */

/* P = floor(p * 2**62) of a valid target probability, branch-free:
 * (mant << 39) >> (127 - max(E, 1)), the shift clamped to 63. */
DY_FUNC uint64_t dy_target_fixed_fast(uint32_t b) {
    uint32_t e = (b >> 23) & 0xFFu;
    uint64_t m = (uint64_t)((b & 0x7FFFFFu) | (e ? 0x800000u : 0u));
    uint32_t s = 127u - (e ? e : 1u);
    s = s > 63u ? 63u : s;
    return (m << 39) >> s;
}

/* Validate a target row and return T = sum P (status DY_ST_OK, TARGET_*). */
DY_HOT int dy_target_row_total(const uint32_t *bits, uint32_t vocab, uint64_t *total) {
    uint64_t hi = 0, lo = 0, t;
    const uint64_t one = 1ull << DY_TARGET_BITS, tol = one >> DY_TARGET_TOL_BITS;
    uint32_t v, bad = 0;
    for (v = 0; v < vocab; v++) {
        uint32_t b = bits[v];
        uint64_t p = dy_target_fixed_fast(b);
        bad |= (uint32_t)(b > 0x3F800000u) & (uint32_t)(b != 0x80000000u);
        hi += p >> 32;
        lo += p & 0xFFFFFFFFu;
    }
    if (bad) return DY_ST_TARGET_INVALID_VALUE;
    /* sum = hi * 2**32 + lo, hi < 2**55, lo < 2**56 */
    if (hi >> 31) return DY_ST_TARGET_SUM;
    t = (hi << 32) + lo;
    if (t < lo) return DY_ST_TARGET_SUM;
    if ((t > one ? t - one : one - t) > tol) return DY_ST_TARGET_SUM;
    *total = t;
    return DY_ST_OK;
}

/* First argmax of a validated float32 row (ties: lowest id; -0.0 == 0). */
DY_HOT int32_t dy_first_argmax_bits(const uint32_t *bits, uint32_t vocab) {
    uint32_t v, best = 0, arg = 0;
    for (v = 0; v < vocab; v++) {
        uint32_t mag = bits[v] & 0x7FFFFFFFu;
        if (mag > best) {
            best = mag;
            arg = v;
        }
    }
    return (int32_t)arg;
}

/* q count at token d of draft step i: dense row, sparse row (last match), or point mass. */
DY_FUNC uint32_t dy_q_count(const uint32_t *qc, const int32_t *qi, uint32_t width, int32_t d,
                            int32_t draft) {
    uint32_t j, c = 0;
    if (!qc) return d == draft ? DY_TOTAL : 0u;
    if (!qi) return qc[d];
    for (j = 0; j < width; j++)
        if (qi[j] == d) c = qc[j];
    return c;
}

/* ============ host fast path of verify (CPU only; not compiled by NVRTC) ============
 * dy_verify_row_host: one request of verify, with the decisions, bits and
 * statuses of dyadic/reference/sampling.verify_row, and a branch-free residual.  R_v = max(P_v 2**24 - c_v T, 0) is positive
 * exactly when P_v > thr(c_v) = c_v Th + floor(c_v Tl / 2**24) (T = Th 2**24
 * + Tl; c_v <= 2**24 so every term fits 64 bits), so sum R = 2**24 SP - T SC
 * with SP, SC the sums of P_v and c_v over those tokens.  The sums are kept
 * per block of DY_VB tokens; the draw then scans the block prefix sums and
 * only the block holding the token elementwise (exact dy_residual).  Sparse
 * and point-mass q need no scatter: the block sums of P are corrected at
 * the (few) support entries. */
#if !defined(DY_CUDA)
#define DY_VB 64u

/* Whether a sparse q row (counts qc, ids qi, width W) is a Dyadic row over
 * [0, bound) (sampling.sparse_row_valid): valid ids strictly ascending in
 * [0, bound), then padding (DY_PAD_ID, count 0) to the end of the row,
 * every count <= 2**24, counts summing to exactly 2**24.  O(W).  Only a row
 * it accepts may address memory by its ids. */
DY_FUNC int dy_sparse_row_valid(const uint32_t *qc, const int32_t *qi, uint32_t width,
                                uint32_t bound) {
    uint64_t sum = 0;
    int64_t prev = -1;
    int pad = 0;
    uint32_t j;
    for (j = 0; j < width; j++) {
        int32_t id = qi[j];
        uint32_t c = qc[j];
        if (id == DY_PAD_ID) {
            if (c) return 0;
            pad = 1;
            continue;
        }
        if (pad || (int64_t)id <= prev || (uint32_t)id >= bound || c > DY_TOTAL) return 0;
        prev = id;
        sum += c;
    }
    return sum == DY_TOTAL;
}

/* dy_draw_sparse on a row checked first (dy_sparse_row_valid with bound
 * 2**24: the draw does not know V, the Dyadic object guarantees id < V);
 * -1 for a row breaking a rule, so no id or padding read from a bad row is
 * ever returned (sampling.draw_sparse_row). */
DY_FUNC int32_t dy_draw_sparse_host(const uint32_t *counts, const int32_t *ids, uint32_t width,
                                    uint32_t r) {
    if (!dy_sparse_row_valid(counts, ids, width, DY_MAX_VOCAB)) return -1;
    return dy_draw_sparse(counts, ids, width, r);
}

DY_FUNC uint64_t dy_verify_host_ws_words(uint32_t vocab, uint32_t k) {
    return (uint64_t)k + 1u + 2ull * ((vocab + DY_VB - 1u) / DY_VB);
}

/* thr(c) with th = T >> 24, tl = T & (2**24 - 1): R > 0 iff P > thr(c). */
DY_FUNC uint64_t dy_resid_thr(uint64_t c, uint64_t th, uint64_t tl) {
    return c * th + ((c * tl) >> DY_TOTAL_BITS);
}

/* Block sums of P (scb = 0) of a validated target row. */
DY_HOT void dy_block_sums_p(const uint32_t *row, uint32_t vocab, uint64_t *spb, uint64_t *scb) {
    uint32_t v0, j, blk = 0;
    for (v0 = 0; v0 < vocab; v0 += DY_VB, blk++) {
        uint32_t n = vocab - v0 < DY_VB ? vocab - v0 : DY_VB;
        uint64_t hi = 0, lo = 0;
        const uint32_t *rb = row + v0;
        for (j = 0; j < n; j++) {
            uint64_t p = dy_target_fixed_fast(rb[j]);
            hi += p >> 32;
            lo += p & 0xFFFFFFFFu;
        }
        spb[blk] = (hi << 32) + lo;
        scb[blk] = 0;
    }
}

/* Block sums of P_v and c_v over {v : R_v > 0} for a dense q row.  Returns
 * the sum of every count of the row (< 2**56): the row is a Dyadic row iff
 * it is 2**24 (counts are >= 0, so no count then exceeds 2**24 and
 * dy_resid_thr cannot overflow). */
DY_HOT uint64_t dy_block_sums_dense(const uint32_t *row, const uint32_t *qc, uint32_t vocab,
                                    uint64_t total, uint64_t *spb, uint64_t *scb) {
    const uint64_t th = total >> DY_TOTAL_BITS, tl = total & (DY_TOTAL - 1u);
    uint32_t v0, j, blk = 0;
    uint64_t call = 0;
    for (v0 = 0; v0 < vocab; v0 += DY_VB, blk++) {
        uint32_t n = vocab - v0 < DY_VB ? vocab - v0 : DY_VB;
        uint64_t sp = 0, sc = 0, ca = 0;
        const uint32_t *rb = row + v0, *cb = qc + v0;
        for (j = 0; j < n; j++) {
            uint64_t p = dy_target_fixed_fast(rb[j]);
            uint64_t c = cb[j];
            uint64_t m = (uint64_t)0 - (uint64_t)(p > dy_resid_thr(c, th, tl));
            sp += p & m;
            sc += c & m;
            ca += c;
        }
        spb[blk] = sp;
        scb[blk] = sc;
        call += ca;
    }
    return call;
}

/* q count at v of a sparse row with nv valid ascending ids (binary search). */
DY_FUNC uint32_t dy_sparse_at(const uint32_t *qc, const int32_t *qi, uint32_t nv, uint32_t v) {
    uint32_t lo = 0, hi = nv;
    while (lo < hi) {
        uint32_t mid = (lo + hi) >> 1;
        if ((uint32_t)qi[mid] < v) lo = mid + 1;
        else hi = mid;
    }
    return lo < nv && (uint32_t)qi[lo] == v ? qc[lo] : 0u;
}

/* The residual draw of verify on one validated row; q: dense (qc),
 * sparse (qc, qi: a row dy_sparse_row_valid accepted), or point mass at d
 * (qc NULL).  A dense row whose counts do not sum to 2**24 gives
 * DY_ST_Q_INVALID before any draw. */
DY_FUNC int dy_residual_draw_host(const uint32_t *row, const uint32_t *qc, const int32_t *qi,
                                  uint32_t width, uint32_t vocab, int32_t d, uint64_t total,
                                  uint64_t seed, uint32_t generation, uint32_t round,
                                  uint32_t pos, uint64_t *spb, uint64_t *scb, int32_t *tok) {
    const uint64_t th = total >> DY_TOTAL_BITS, tl = total & (DY_TOTAL - 1u);
    uint32_t nb = (vocab + DY_VB - 1u) / DY_VB, blk, nv = 0, j, idx = 0;
    uint64_t sp = 0, sc = 0;
    dy_u128 sum, x, acc;
    int st;
    *tok = -1;
    if (qc && !qi) {
        /* the residual reads the whole dense row: it must be a Dyadic row */
        if (dy_block_sums_dense(row, qc, vocab, total, spb, scb) != DY_TOTAL)
            return DY_ST_Q_INVALID;
    } else {
        dy_block_sums_p(row, vocab, spb, scb);
        if (qc) {
            while (nv < width && qi[nv] >= 0) nv++;
        } else {
            nv = 1;
        }
        for (j = 0; j < nv; j++) {
            uint32_t v = qc ? (uint32_t)qi[j] : (uint32_t)d;
            uint64_t c = qc ? qc[j] : DY_TOTAL;
            uint64_t p = dy_target_fixed(row[v]);
            spb[v / DY_VB] -= p;
            if (p > dy_resid_thr(c, th, tl)) {
                spb[v / DY_VB] += p;
                scb[v / DY_VB] += c;
            }
        }
    }
    for (blk = 0; blk < nb; blk++) {
        sp += spb[blk];
        sc += scb[blk];
    }
    sum = dy_sub128(dy_make128(sp >> (64 - DY_TOTAL_BITS), sp << DY_TOTAL_BITS), dy_mul64(sc, total));
    if (dy_is_zero128(sum)) return DY_ST_ALLOC_INCONSISTENT; /* unreachable for a valid q */
    st = dy_uniform_below_u128(sum, seed, generation, round, pos, DY_DOMAIN_CORRECTION, &idx, &x);
    if (st) return st;
    sp = sc = 0;
    acc = dy_make128(0, 0);
    for (blk = 0; blk < nb; blk++) {
        dy_u128 cum;
        uint64_t sp2 = sp + spb[blk], sc2 = sc + scb[blk];
        cum = dy_sub128(dy_make128(sp2 >> (64 - DY_TOTAL_BITS), sp2 << DY_TOTAL_BITS),
                        dy_mul64(sc2, total));
        if (dy_lt128(x, cum)) break;
        sp = sp2;
        sc = sc2;
    }
    if (blk == nb) return DY_ST_ALLOC_INCONSISTENT; /* unreachable */
    acc = dy_sub128(dy_make128(sp >> (64 - DY_TOTAL_BITS), sp << DY_TOTAL_BITS), dy_mul64(sc, total));
    {
        uint32_t v, v1 = (blk + 1u) * DY_VB < vocab ? (blk + 1u) * DY_VB : vocab;
        for (v = blk * DY_VB; v < v1; v++) {
            uint32_t c = qc ? (qi ? dy_sparse_at(qc, qi, nv, v) : qc[v])
                            : ((int32_t)v == d ? DY_TOTAL : 0u);
            acc = dy_add128(acc, dy_residual(dy_target_fixed_fast(row[v]), c, total));
            if (dy_lt128(x, acc)) {
                *tok = (int32_t)v;
                return DY_ST_OK;
            }
        }
    }
    return DY_ST_ALLOC_INCONSISTENT; /* unreachable */
}

/* The bonus draw: first v with cumulative P > x, by block sums. */
DY_FUNC int32_t dy_bonus_token_host(const uint32_t *row, uint32_t vocab, uint64_t x,
                                    uint64_t *spb, uint64_t *scb) {
    uint32_t nb = (vocab + DY_VB - 1u) / DY_VB, blk, v, v1;
    uint64_t acc = 0;
    dy_block_sums_p(row, vocab, spb, scb);
    for (blk = 0; blk < nb; blk++) {
        if (acc + spb[blk] > x) break;
        acc += spb[blk];
    }
    if (blk == nb) return -1;
    v1 = (blk + 1u) * DY_VB < vocab ? (blk + 1u) * DY_VB : vocab;
    for (v = blk * DY_VB; v < v1; v++) {
        acc += dy_target_fixed_fast(row[v]);
        if (acc > x) return (int32_t)v;
    }
    return -1;
}

/* Rules 2-4 of verify's kernel checks for the k drafts of one request
 * (docs/semantics.md section 6): every draft id in [0, vocab)
 * (DRAFT_OUT_OF_RANGE); for non-greedy requests every q row (a sparse row in full,
 * a dense row at its draft: Q_INVALID), then q_i(d_i) > 0 (Q_ZERO_AT_DRAFT).
 * q_counts NULL: point-mass q. */
DY_FUNC int dy_check_drafts_and_q(const int32_t *draft, uint32_t k, uint32_t vocab, int greedy,
                                  const uint32_t *q_counts, const int32_t *q_ids,
                                  uint32_t width) {
    uint32_t i;
    for (i = 0; i < k; i++)
        if (draft[i] < 0 || (uint32_t)draft[i] >= vocab) return DY_ST_DRAFT_OUT_OF_RANGE;
    if (!greedy && q_counts) {
        for (i = 0; i < k; i++) {
            const uint32_t *qc = q_counts + (uint64_t)i * width;
            if (q_ids ? !dy_sparse_row_valid(qc, q_ids + (uint64_t)i * width, width, vocab)
                      : qc[draft[i]] > DY_TOTAL)
                return DY_ST_Q_INVALID;
        }
    }
    if (!greedy) {
        for (i = 0; i < k; i++) {
            const uint32_t *qc = q_counts ? q_counts + (uint64_t)i * width : DY_NULL;
            const int32_t *qi = q_ids ? q_ids + (uint64_t)i * width : DY_NULL;
            if (dy_q_count(qc, qi, width, draft[i], draft[i]) == 0) return DY_ST_Q_ZERO_AT_DRAFT;
        }
    }
    return DY_ST_OK;
}

/* One request of verify.  target: float32 bits [(k+1), V]; draft [k];
 * q_counts [k, W] or NULL (point mass); q_ids [k, W] or NULL (dense, W = V);
 * tokens [k+1]; ws: dy_verify_host_ws_words words (no zero-fill requirement).
 * Returns a status; on error *accepted = 0 and tokens = -1.
 * Nothing is addressed by a draft id or a q id before it is checked; the
 * order of the checks is sampling.verify_row's: target rows (TARGET_*),
 * draft ids in [0, V) (DRAFT_OUT_OF_RANGE, greedy requests too), then for
 * non-greedy requests each q row (sparse: dy_sparse_row_valid over [0, V);
 * dense: the count at the draft <= 2**24) (Q_INVALID), then q_i(d_i) > 0
 * (Q_ZERO_AT_DRAFT); a dense row read in full by the residual must sum to
 * 2**24 (Q_INVALID). */
DY_FUNC int dy_verify_row_host(const uint32_t *target, const int32_t *draft,
                               const uint32_t *q_counts, const int32_t *q_ids, uint32_t width,
                               uint32_t k, uint32_t vocab, int greedy, uint64_t seed,
                               uint32_t generation, uint32_t round, uint32_t position,
                               uint64_t *ws, int32_t *accepted, int32_t *tokens) {
    uint64_t *totals = ws;
    uint64_t *spb = ws + k + 1;
    uint64_t *scb = spb + (vocab + DY_VB - 1u) / DY_VB;
    uint32_t i;
    int st = DY_ST_OK;
    *accepted = 0;
    for (i = 0; i <= k; i++) tokens[i] = -1;
    for (i = 0; i <= k; i++) {
        st = dy_target_row_total(target + (uint64_t)i * vocab, vocab, &totals[i]);
        if (st) return st;
    }
    st = dy_check_drafts_and_q(draft, k, vocab, greedy, q_counts, q_ids, width);
    if (st) return st;
    for (i = 0; i < k; i++) {
        const uint32_t *row = target + (uint64_t)i * vocab;
        const uint32_t *qc = q_counts ? q_counts + (uint64_t)i * width : DY_NULL;
        const int32_t *qi = q_ids ? q_ids + (uint64_t)i * width : DY_NULL;
        int32_t d = draft[i], tok;
        int ok;
        uint32_t pos = position + i;
        if (greedy) {
            int32_t best = dy_first_argmax_bits(row, vocab);
            if (d == best) {
                tokens[i] = d;
                continue;
            }
            tokens[i] = best;
            *accepted = (int32_t)i;
            return DY_ST_OK;
        }
        st = dy_accept(dy_target_fixed(row[d]), totals[i], dy_q_count(qc, qi, width, d, d), seed,
                       generation, round, pos, &ok);
        if (st) break;
        if (ok) {
            tokens[i] = d;
            continue;
        }
        st = dy_residual_draw_host(row, qc, qi, width, vocab, d, totals[i], seed, generation,
                                   round, pos, spb, scb, &tok);
        if (st) break;
        tokens[i] = tok;
        *accepted = (int32_t)i;
        return DY_ST_OK;
    }
    if (!st) {
        const uint32_t *row = target + (uint64_t)k * vocab;
        if (greedy) {
            tokens[k] = dy_first_argmax_bits(row, vocab);
        } else {
            uint64_t x;
            uint32_t idx = 0;
            st = dy_uniform_below_u64(totals[k], seed, generation, round, position + k,
                                      DY_DOMAIN_CORRECTION, &idx, &x);
            if (!st) tokens[k] = dy_bonus_token_host(row, vocab, x, spb, scb);
        }
        if (!st) {
            *accepted = (int32_t)k;
            return DY_ST_OK;
        }
    }
    *accepted = 0;
    for (i = 0; i <= k; i++) tokens[i] = -1;
    return st;
}

/* One request of verify with ragged drafts: n of its k drafts are verified
 * (sampling.verify_row_ragged).  n outside [0, k] is DY_ST_NUM_DRAFTS_INVALID,
 * decided before anything is read; else dy_verify_row_host at depth n (target
 * rows 0..n, draft ids and q rows 0..n-1: nothing beyond is read) and tokens
 * n+1..k set to -1.  tokens [k+1]; ws: dy_verify_host_ws_words(vocab, k) words. */
DY_FUNC int dy_verify_row_ragged_host(const uint32_t *target, const int32_t *draft,
                                      const uint32_t *q_counts, const int32_t *q_ids,
                                      uint32_t width, uint32_t k, int32_t n, uint32_t vocab,
                                      int greedy, uint64_t seed, uint32_t generation,
                                      uint32_t round, uint32_t position, uint64_t *ws,
                                      int32_t *accepted, int32_t *tokens) {
    uint32_t i;
    int st;
    for (i = 0; i <= k; i++) tokens[i] = -1;
    *accepted = 0;
    if (n < 0 || (uint32_t)n > k) return DY_ST_NUM_DRAFTS_INVALID;
    st = dy_verify_row_host(target, n ? draft : DY_NULL, n ? q_counts : DY_NULL,
                            n ? q_ids : DY_NULL, width, (uint32_t)n, vocab, greedy, seed,
                            generation, round, position, ws, accepted, tokens);
    return st;
}
#endif /* !DY_CUDA */

/* ============ target logits (target_logits.py): verify(..., logits=True) ============
 * One target row of logits and its request's sampling parameters become the
 * processed integer target P (docs/semantics.md, section 2 "Target logits"):
 * z = x / temperature (binary64), W = dy_weight_from_gap(zmax - z) (the
 * exponential of allocate), then min-p, top-k and top-p on the ranking by z
 * (descending, ties to the lowest id).  Plain functions without heap
 * allocation (NVRTC compiles them too); the caller passes the workspace. */

/* ceil(f * 2**24) of a finite float32 f >= 0 given as bits (target_logits.f32_ceil24). */
DY_FUNC uint64_t dy_f32_ceil24(uint32_t bits) {
    uint32_t mag = bits & 0x7FFFFFFFu;
    uint64_t m = dy_f32_mant(mag);
    int s = dy_f32_exp(mag) + DY_TOTAL_BITS;
    if (s >= 0) return s < 40 ? m << s : 0; /* s <= 1 for f <= 1 (the callers' range) */
    if (s <= -40) return m ? 1u : 0u;
    return (m + ((1ull << -s) - 1u)) >> -s;
}

/* The status of one request's sampling parameters (target_logits.params_status):
 * temperature finite and >= 0; top_k >= 0; top_p in (0, 1]; min_p in [0, 1]
 * (float32 bits; -0.0 counts as 0). */
DY_FUNC int dy_logits_params_status(double temperature, int64_t top_k, uint32_t top_p_bits,
                                    uint32_t min_p_bits) {
    if (!(temperature >= 0.0 && temperature < dy_inf())) return DY_ST_TEMPERATURE_INVALID;
    if (top_k < 0) return DY_ST_TOP_K_INVALID;
    if (!(top_p_bits - 1u < 0x3F800000u)) return DY_ST_TOP_P_INVALID;
    if (!(min_p_bits <= 0x3F800000u || min_p_bits == 0x80000000u)) return DY_ST_MIN_P_INVALID;
    return DY_ST_OK;
}

/* Argmax of a logits row by float value, ties to the lowest id, -0.0 == 0.0
 * (target_logits.logits_argmax): NaN or +inf -> TARGET_INVALID_VALUE, every
 * value -inf -> TARGET_ZERO_MASS. */
DY_FUNC int dy_logits_argmax(const float *x, uint32_t vocab, int32_t *argmax) {
    const uint32_t *bits = (const uint32_t *)x;
    uint32_t v, arg = 0;
    int found = 0;
    float best = 0.0f;
    for (v = 0; v < vocab; v++) {
        uint32_t b = bits[v];
        if ((b & 0x7FFFFFFFu) > 0x7F800000u || b == 0x7F800000u) return DY_ST_TARGET_INVALID_VALUE;
        if (b == 0xFF800000u) continue;
        if (!found || x[v] > best) {
            best = x[v];
            arg = v;
            found = 1;
        }
    }
    if (!found) return DY_ST_TARGET_ZERO_MASS;
    *argmax = (int32_t)arg;
    return DY_ST_OK;
}

/* Weighted selection for top-p: over n candidates (order keys key[j], masses
 * p[id[j]] > 0, positions j ascending = ids ascending) the shortest prefix of
 * the order (key descending, position ascending) whose mass reaches need
 * (1 <= need <= the total mass).  MSD radix on 8-bit digits, linear time.
 * Returns tau (the key of the token that ends the prefix) and *rest: the mass
 * still needed among the candidates with key == tau, taken in ascending
 * position.  Every candidate with key > tau is in the prefix.  idx: n words. */
DY_FUNC void dy_select_mass(const uint64_t *key, const uint64_t *p, const uint32_t *id,
                            uint32_t n, uint64_t need, uint32_t *idx, uint64_t *tau,
                            uint64_t *rest) {
    uint64_t hist[256], prefix = 0;
    uint32_t m = n, i;
    int sh = 56, b, have_idx = 0;
    for (;;) {
        uint64_t acc = 0;
        for (b = 0; b < 256; b++) hist[b] = 0;
        for (i = 0; i < m; i++) {
            uint32_t j = have_idx ? idx[i] : i;
            hist[(key[j] >> sh) & 0xFFu] += p[id[j]];
        }
        for (b = 255; b > 0; b--) {
            if (acc + hist[b] >= need) break;
            acc += hist[b];
        }
        need -= acc;
        prefix |= (uint64_t)b << sh;
        {
            uint32_t m2 = 0;
            for (i = 0; i < m; i++) {
                uint32_t j = have_idx ? idx[i] : i;
                if (((key[j] >> sh) & 0xFFu) == (uint32_t)b) idx[m2++] = j;
            }
            m = m2;
            have_idx = 1;
        }
        if (sh == 0) break;
        sh -= 8;
    }
    *tau = prefix;
    *rest = need;
}

/* The scaling of a processed target (target_logits.processed_row): P_v <<= s,
 * T <<= s with s = 62 - floor(log2(T)) (0 for T >= 2**62), so T lies in
 * [2**62, 2**63]; 2**39 <= T <= 2**63 on entry. */
DY_FUNC void dy_scale_target(uint64_t *p, uint32_t vocab, uint64_t *total) {
    int s = 62 - (dy_bitlen64(*total) - 1);
    uint32_t v;
    if (s <= 0) return;
    for (v = 0; v < vocab; v++) p[v] <<= s;
    *total <<= s;
}

/* Workspace of dy_logits_target_row, in uint64_t words. */
DY_FUNC uint64_t dy_logits_target_ws_words(uint32_t vocab) { return 2ull * vocab; }

/* The kept weights of one logits row at temperature > 0
 * (target_logits.weights_row; z = (x + bias) / temperature, bias NULL for
 * verify, as dy_effective_logit): p [V] receives W_v on the kept tokens, else
 * 0, *total = sum p (2**39 <= total <= 2**63), *argmax the first token of the
 * ranking; verify scales them by dy_scale_target.  Parameters already validated (dy_logits_params_status).
 * ws: dy_logits_target_ws_words(V) words.  Returns a status
 * (TARGET_INVALID_VALUE for NaN / +inf in z, TARGET_ZERO_MASS). */
DY_FUNC int dy_logits_target_row(const float *x, const float *bias, uint32_t vocab,
                                 double temperature, int64_t top_k, uint32_t top_p_bits,
                                 uint32_t min_p_bits, uint64_t *p, uint64_t *ws, uint64_t *total,
                                 int32_t *argmax) {
    const double inf = dy_inf();
    uint64_t *key = ws;
    uint32_t *id = (uint32_t *)(ws + vocab);
    uint32_t *idx = id + vocab;
    double zmax = -inf;
    uint32_t v, j, n = 0, arg = 0;
    uint64_t mpw, u, t = 0;
    for (v = 0; v < vocab; v++) {
        double z = dy_effective_logit(x[v], bias, v, temperature);
        if (!(z < inf)) return DY_ST_TARGET_INVALID_VALUE;
        if (z > zmax) {
            zmax = z;
            arg = v;
        }
    }
    if (!(zmax > -inf)) return DY_ST_TARGET_ZERO_MASS;
    /* min-p: W * 2**24 >= mp * 2**39 (both sides <= 2**63); -inf is in no ranking */
    mpw = dy_f32_ceil24(min_p_bits) << DY_WEIGHT_BITS;
    for (v = 0; v < vocab; v++) {
        double z = dy_effective_logit(x[v], bias, v, temperature);
        uint64_t w = dy_weight_from_gap(zmax - z);
        p[v] = 0;
        if (z > -inf && (w << DY_TOTAL_BITS) >= mpw) {
            key[n] = dy_order_key(z);
            id[n] = v;
            p[v] = w;
            n++;
        }
    }
    /* top-k: the first top_k survivors of the ranking */
    if (top_k > 0 && (uint64_t)top_k < n) {
        uint64_t tau;
        uint32_t need = dy_select_top(key, n, (uint32_t)top_k, 64, idx, &tau), ties = 0, m = 0;
        for (j = 0; j < n; j++) {
            int keep = key[j] > tau;
            if (key[j] == tau && ties < need) {
                ties++;
                keep = 1;
            }
            if (keep) {
                key[m] = key[j];
                id[m] = id[j];
                m++;
            } else {
                p[id[j]] = 0;
            }
        }
        n = m;
    }
    /* top-p: the shortest ranked prefix of the survivors reaching ceil(u Ts / 2**24);
     * u = 2**24 keeps every survivor with W > 0 (the same P) */
    u = dy_f32_ceil24(top_p_bits);
    if (u < DY_TOTAL) {
        uint64_t ts = 0, need, tau, rest, cum = 0;
        uint32_t m = 0;
        for (j = 0; j < n; j++) ts += p[id[j]];
        need = dy_shr128(dy_add128(dy_mul64(u, ts), dy_from64(DY_TOTAL - 1u)), DY_TOTAL_BITS).lo;
        /* tokens with W = 0 carry no mass and never end the prefix */
        for (j = 0; j < n; j++) {
            if (p[id[j]]) {
                key[m] = key[j];
                id[m] = id[j];
                m++;
            }
        }
        n = m;
        dy_select_mass(key, p, id, n, need, idx, &tau, &rest);
        for (j = 0; j < n; j++) {
            if (key[j] > tau) continue;
            if (key[j] == tau && cum < rest) {
                cum += p[id[j]];
                continue;
            }
            p[id[j]] = 0;
        }
    }
    for (v = 0; v < vocab; v++) t += p[v];
    *total = t;
    *argmax = (int32_t)arg;
    return DY_ST_OK;
}

/* ============ allocate / propose with top_p / min_p (allocation.allocate_filtered_row) ============ */

/* Workspace of dy_allocate_filtered_row / dy_propose_filtered_row, in uint64_t words. */
DY_FUNC uint64_t dy_alloc_filtered_ws_words(uint32_t vocab) { return 5ull * vocab + 1u; }

/* The top-k filter of a filtered row: dense rows (width 0) top_k >= 0 (0: off);
 * sparse rows 1 <= top_k, at most the width kept.  -1 for an invalid top_k. */
DY_FUNC int64_t dy_filter_top_k(int64_t top_k, uint32_t width) {
    if (top_k < 0 || (width && top_k < 1)) return -1;
    return (width && top_k > (int64_t)width) ? (int64_t)width : top_k;
}

/* The kept length of a ranked support (allocate / propose with top_p / min_p on
 * a top-k support, the CUDA route): w [n] the support's weights W in ranking order
 * (z descending, ties to the lowest id; W non-increasing), top_k reduced by
 * dy_filter_top_k (>= 1) and top_p / min_p valid (dy_logits_params_status).  The
 * rules of dy_logits_target_row, each keeping a prefix of the ranking: min-p the
 * tokens with W * 2**24 >= mp * 2**39, top-k the first top_k of those, top-p the
 * shortest prefix of those whose W reaches ceil(u Ts / 2**24).  Tokens past the
 * returned length are not kept; kept tokens with W = 0 carry no mass. */
DY_FUNC uint32_t dy_filter_prefix(const uint64_t *w, uint32_t n, int64_t top_k,
                                  uint32_t top_p_bits, uint32_t min_p_bits) {
    const uint64_t mpw = dy_f32_ceil24(min_p_bits) << DY_WEIGHT_BITS;
    const uint64_t u = dy_f32_ceil24(top_p_bits);
    uint64_t ts = 0, need, cum = 0;
    uint32_t m = 0, j;
    while (m < n && (w[m] << DY_TOTAL_BITS) >= mpw) m++;
    if (top_k > 0 && (uint64_t)top_k < m) m = (uint32_t)top_k;
    if (u >= DY_TOTAL) return m;
    for (j = 0; j < m; j++) ts += w[j];
    need = dy_shr128(dy_add128(dy_mul64(u, ts), dy_from64(DY_TOTAL - 1u)), DY_TOTAL_BITS).lo;
    for (j = 0; j < m && cum < need; j++) cum += w[j];
    return j;
}

/* One row of allocate on logits whose support is the kept set of min-p, top-k
 * and top-p: x, bias, temperature > 0, policy as dy_allocate_row; top_k (see
 * dy_filter_top_k), top_p / min_p as float32 bits; width 0 for dense counts
 * [V], else sparse counts / ids [width] (ascending ids, zero counts dropped,
 * padded).  Checks in order: top_k, top_p, min_p (TOP_K_INVALID, ...), the
 * row (X_NAN, X_POSINF, X_ZERO_MASS).  ws: dy_alloc_filtered_ws_words(V). */
DY_FUNC int dy_allocate_filtered_row(const float *x, const float *bias, double temperature,
                                     int64_t top_k, uint32_t top_p_bits, uint32_t min_p_bits,
                                     int policy, uint32_t vocab, uint32_t width,
                                     uint32_t *counts, int32_t *ids, uint64_t *ws) {
    const double inf = dy_inf();
    uint64_t *p = ws, *tws = ws + vocab, *w = ws + 3ull * vocab, total = 0;
    uint32_t *hid = (uint32_t *)(ws + 4ull * vocab), *idx = hid + vocab;
    uint32_t v, n = 0, argpos = 0, o;
    int32_t arg = 0;
    double zmax = -inf;
    int st;
    top_k = dy_filter_top_k(top_k, width);
    if (top_k < 0) return DY_ST_TOP_K_INVALID;
    st = dy_logits_params_status(1.0, top_k, top_p_bits, min_p_bits);
    if (st) return st;
    for (v = 0; v < vocab; v++) {
        double zv = dy_effective_logit(x[v], bias, v, temperature);
        if (!(zv < inf)) return dy_logit_status(zv);
        if (zv > zmax) zmax = zv;
    }
    if (!(zmax > -inf)) return DY_ST_X_ZERO_MASS;
    st = dy_logits_target_row(x, bias, vocab, temperature, top_k, top_p_bits, min_p_bits, p, tws,
                              &total, &arg);
    if (st) return DY_ST_ALLOC_INCONSISTENT; /* unreachable after the checks above */
    if (!width) {
        for (v = 0; v < vocab; v++) w[v] = p[v];
        return dy_alloc_weights(w, vocab, policy, (uint32_t)arg, counts, idx);
    }
    for (v = 0; v < vocab; v++) {
        if (!p[v]) continue;
        if (n == width) return DY_ST_ALLOC_INCONSISTENT; /* unreachable: top_k <= width */
        if ((int32_t)v == arg) argpos = n;
        w[n] = p[v];
        hid[n] = v;
        n++;
    }
    st = dy_alloc_weights(w, n, policy, argpos, counts, idx);
    if (st) return st;
    o = 0;
    for (v = 0; v < n; v++) {
        uint32_t c = counts[v];
        if (c) {
            counts[o] = c;
            ids[o] = (int32_t)hid[v];
            o++;
        }
    }
    for (; o < width; o++) {
        counts[o] = 0;
        ids[o] = DY_PAD_ID;
    }
    return DY_ST_OK;
}

/* One row of propose with top_p / min_p: temperature 0 -> the parameters are
 * checked, then the argmax point mass of dy_propose_row (no draw); else
 * dy_allocate_filtered_row and the proposal draw. */
DY_FUNC int dy_propose_filtered_row(const float *x, const float *bias, double temperature,
                                    int64_t top_k, uint32_t top_p_bits, uint32_t min_p_bits,
                                    int policy, uint32_t vocab, uint32_t width, uint64_t seed,
                                    uint32_t generation, uint32_t round, uint32_t position,
                                    int32_t *token, uint32_t *counts, int32_t *ids,
                                    uint64_t *ws) {
    int st;
    uint32_t r;
    *token = -1;
    if (temperature == 0.0) {
        int64_t k = dy_filter_top_k(top_k, width);
        if (k < 0) return DY_ST_TOP_K_INVALID;
        st = dy_logits_params_status(1.0, k, top_p_bits, min_p_bits);
        if (st) return st;
        return dy_propose_row(x, bias, 0.0, policy, vocab, width, seed, generation, round,
                              position, token, counts, ids, ws);
    }
    st = dy_allocate_filtered_row(x, bias, temperature, top_k, top_p_bits, min_p_bits, policy,
                                  vocab, width, counts, ids, ws);
    if (st) return st;
    r = dy_proposal_ticket(seed, generation, round, position);
    *token = width == 0 ? dy_draw_dense(counts, vocab, r) : dy_draw_sparse(counts, ids, width, r);
    return DY_ST_OK;
}

#if !defined(DY_CUDA)
/* ============ host verify from target logits (CPU only) ============ */

/* Workspace of dy_verify_logits_row_host, in uint64_t words. */
DY_FUNC uint64_t dy_verify_logits_ws_words(uint32_t vocab, uint32_t k) {
    return (uint64_t)(k + 1u) * vocab + 2ull * (k + 1u) + dy_logits_target_ws_words(vocab);
}

/* The residual draw on a processed target row p [V] with total T; q as in
 * dy_residual_draw_host (a sparse row validated by dy_sparse_row_valid); a
 * dense row whose counts do not sum to 2**24 gives DY_ST_Q_INVALID. */
DY_FUNC int dy_residual_draw_fixed(const uint64_t *p, const uint32_t *qc, const int32_t *qi,
                                   uint32_t width, uint32_t vocab, int32_t d, uint64_t total,
                                   uint64_t seed, uint32_t generation, uint32_t round,
                                   uint32_t pos, int32_t *tok) {
    uint32_t v, nv = 0, idx = 0;
    dy_u128 sum = dy_make128(0, 0), x, acc = dy_make128(0, 0);
    int st;
    *tok = -1;
    if (qc && !qi) {
        uint64_t s = 0;
        for (v = 0; v < vocab; v++) s += qc[v];
        if (s != DY_TOTAL) return DY_ST_Q_INVALID;
    }
    if (qc && qi)
        while (nv < width && qi[nv] >= 0) nv++;
    for (v = 0; v < vocab; v++) {
        uint32_t c = qc ? (qi ? dy_sparse_at(qc, qi, nv, v) : qc[v])
                        : ((int32_t)v == d ? DY_TOTAL : 0u);
        sum = dy_add128(sum, dy_residual(p[v], c, total));
    }
    if (dy_is_zero128(sum)) return DY_ST_ALLOC_INCONSISTENT; /* unreachable for a valid q */
    st = dy_uniform_below_u128(sum, seed, generation, round, pos, DY_DOMAIN_CORRECTION, &idx, &x);
    if (st) return st;
    for (v = 0; v < vocab; v++) {
        uint32_t c = qc ? (qi ? dy_sparse_at(qc, qi, nv, v) : qc[v])
                        : ((int32_t)v == d ? DY_TOTAL : 0u);
        acc = dy_add128(acc, dy_residual(p[v], c, total));
        if (dy_lt128(x, acc)) {
            *tok = (int32_t)v;
            return DY_ST_OK;
        }
    }
    return DY_ST_ALLOC_INCONSISTENT; /* unreachable */
}

/* One request of verify(..., logits=True) (target_logits.verify_row_logits).
 * target: float32 logits [(k+1), V]; the rest as dy_verify_row_host, plus the
 * request's parameters (top_p, min_p as float32 bits).  Checks in order: the
 * parameters (TEMPERATURE_INVALID, TOP_K_INVALID, TOP_P_INVALID,
 * MIN_P_INVALID), every target row (TARGET_INVALID_VALUE, TARGET_ZERO_MASS),
 * draft ids, q rows, q(d) > 0, then the decisions of section 5 on the
 * processed P and T.  Greedy when `greedy` or temperature 0.
 * ws: dy_verify_logits_ws_words(V, k) words. */
DY_FUNC int dy_verify_logits_row_host(const float *target, const int32_t *draft,
                                      const uint32_t *q_counts, const int32_t *q_ids,
                                      uint32_t width, uint32_t k, uint32_t vocab, int greedy,
                                      double temperature, int64_t top_k, uint32_t top_p_bits,
                                      uint32_t min_p_bits, uint64_t seed, uint32_t generation,
                                      uint32_t round, uint32_t position, uint64_t *ws,
                                      int32_t *accepted, int32_t *tokens) {
    uint64_t *pall = ws;
    uint64_t *totals = ws + (uint64_t)(k + 1u) * vocab;
    uint64_t *args = totals + k + 1u;
    uint64_t *rws = args + k + 1u;
    uint32_t i;
    int st;
    *accepted = 0;
    for (i = 0; i <= k; i++) tokens[i] = -1;
    st = dy_logits_params_status(temperature, top_k, top_p_bits, min_p_bits);
    if (st) return st;
    greedy = greedy || temperature == 0.0;
    for (i = 0; i <= k; i++) {
        const float *row = target + (uint64_t)i * vocab;
        int32_t a = 0;
        if (greedy) {
            st = dy_logits_argmax(row, vocab, &a);
            totals[i] = 1;
        } else {
            st = dy_logits_target_row(row, DY_NULL, vocab, temperature, top_k, top_p_bits,
                                      min_p_bits, pall + (uint64_t)i * vocab, rws, &totals[i],
                                      &a);
            if (!st) dy_scale_target(pall + (uint64_t)i * vocab, vocab, &totals[i]);
        }
        if (st) return st;
        args[i] = (uint64_t)a;
    }
    st = dy_check_drafts_and_q(draft, k, vocab, greedy, q_counts, q_ids, width);
    if (st) return st;
    for (i = 0; i < k; i++) {
        const uint64_t *p = pall + (uint64_t)i * vocab;
        const uint32_t *qc = q_counts ? q_counts + (uint64_t)i * width : DY_NULL;
        const int32_t *qi = q_ids ? q_ids + (uint64_t)i * width : DY_NULL;
        int32_t d = draft[i], tok;
        int ok;
        if (greedy) {
            int32_t best = (int32_t)args[i];
            tokens[i] = best;
            if (d == best) continue;
            *accepted = (int32_t)i;
            return DY_ST_OK;
        }
        st = dy_accept(p[d], totals[i], dy_q_count(qc, qi, width, d, d), seed, generation, round,
                       position + i, &ok);
        if (st) break;
        if (ok) {
            tokens[i] = d;
            continue;
        }
        st = dy_residual_draw_fixed(p, qc, qi, width, vocab, d, totals[i], seed, generation,
                                    round, position + i, &tok);
        if (st) break;
        tokens[i] = tok;
        *accepted = (int32_t)i;
        return DY_ST_OK;
    }
    if (!st) {
        if (greedy) {
            tokens[k] = (int32_t)args[k];
        } else {
            const uint64_t *p = pall + (uint64_t)k * vocab;
            uint64_t x, acc = 0;
            uint32_t idx = 0, v;
            st = dy_uniform_below_u64(totals[k], seed, generation, round, position + k,
                                      DY_DOMAIN_CORRECTION, &idx, &x);
            if (!st) {
                for (v = 0; v < vocab; v++) {
                    acc += p[v];
                    if (acc > x) {
                        tokens[k] = (int32_t)v;
                        break;
                    }
                }
            }
        }
        if (!st) {
            *accepted = (int32_t)k;
            return DY_ST_OK;
        }
    }
    *accepted = 0;
    for (i = 0; i <= k; i++) tokens[i] = -1;
    return st;
}

/* One request of verify(..., logits=True) with ragged drafts: n of its k drafts
 * are verified (target_logits.verify_row_logits with num_drafts).  n outside
 * [0, k] is DY_ST_NUM_DRAFTS_INVALID, decided before anything is read; else
 * dy_verify_logits_row_host at depth n (target rows 0..n, draft ids and q rows
 * 0..n-1: nothing beyond is read) and tokens n+1..k set to -1.  tokens [k+1];
 * ws: dy_verify_logits_ws_words(vocab, k) words. */
DY_FUNC int dy_verify_logits_row_ragged_host(const float *target, const int32_t *draft,
                                             const uint32_t *q_counts, const int32_t *q_ids,
                                             uint32_t width, uint32_t k, int32_t n,
                                             uint32_t vocab, int greedy, double temperature,
                                             int64_t top_k, uint32_t top_p_bits,
                                             uint32_t min_p_bits, uint64_t seed,
                                             uint32_t generation, uint32_t round,
                                             uint32_t position, uint64_t *ws, int32_t *accepted,
                                             int32_t *tokens) {
    uint32_t i;
    for (i = 0; i <= k; i++) tokens[i] = -1;
    *accepted = 0;
    if (n < 0 || (uint32_t)n > k) return DY_ST_NUM_DRAFTS_INVALID;
    return dy_verify_logits_row_host(target, n ? draft : DY_NULL, n ? q_counts : DY_NULL,
                                     n ? q_ids : DY_NULL, width, (uint32_t)n, vocab, greedy,
                                     temperature, top_k, top_p_bits, min_p_bits, seed,
                                     generation, round, position, ws, accepted, tokens);
}
#endif /* !DY_CUDA */

#endif /* DYADIC_CORE_H */
