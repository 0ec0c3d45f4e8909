/* Device-side integer helpers and block primitives of the CuPy backend.
 *
 * Compiled by NVRTC with --fmad=false.  The only floating-point operations
 * are those of dyadic/reference/fixedpoint.py: float32/16/bf16 -> binary64
 * (exact), z = (x + bias) / temperature and t = zmax - z.  Every decision is
 * integer arithmetic.  The exponential table is the shared header
 * backends/include/dyadic_exp_table.h (same bits as the CPU backend).
 */
#ifndef DYADIC_CUDA_CUH
#define DYADIC_CUDA_CUH

typedef unsigned long long u64;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long uint64_t;
typedef unsigned int uint32_t;
typedef unsigned short u16;

#define DY_CONST_TABLE __device__ const
#include "dyadic_exp_table.h"

#define DC_FN static __device__ __forceinline__

#define DC_TOTAL (1u << 24)
#define DC_DOMAIN_SHIFT 28
#define DC_MAX_DRAW_INDEX ((1u << 28) - 1u)
#define DC_PROPOSAL 1u
#define DC_ACCEPTANCE 2u
#define DC_CORRECTION 3u

#define ST_OK 0
#define ST_X_NAN 1
#define ST_X_POSINF 2
#define ST_X_NEGATIVE 3
#define ST_X_ZERO_MASS 4
#define ST_ALLOC_INCONSISTENT 5
#define ST_TARGET_INVALID 10
#define ST_TARGET_SUM 11
#define ST_Q_ZERO 12
#define ST_RNG_EXHAUSTED 20

/* ------------------------------------------------------------------ u128 */
struct u128 { u64 lo, hi; };

DC_FN u128 mk128(u64 lo, u64 hi) { u128 r; r.lo = lo; r.hi = hi; return r; }
DC_FN u128 add128(u128 a, u128 b) {
  u128 r; r.lo = a.lo + b.lo; r.hi = a.hi + b.hi + (r.lo < a.lo ? 1ull : 0ull); return r;
}
DC_FN u128 sub128(u128 a, u128 b) {
  u128 r; r.lo = a.lo - b.lo; r.hi = a.hi - b.hi - (a.lo < b.lo ? 1ull : 0ull); return r;
}
DC_FN bool lt128(u128 a, u128 b) { return a.hi < b.hi || (a.hi == b.hi && a.lo < b.lo); }
DC_FN u128 mul64(u64 a, u64 b) { return mk128(a * b, __umul64hi(a, b)); }
DC_FN bool is_zero128(u128 a) { return (a.lo | a.hi) == 0; }

/* ---------------------------------------------------------------- Philox */
DC_FN void philox4x32(u32 c[4], u32 k0, u32 k1, int rounds) {
  for (int r = 0; r < rounds; ++r) {
    if (r) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
    u32 c0 = c[0], c1 = c[1], c2 = c[2], c3 = c[3];
    u32 hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    u32 hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    c[0] = hi1 ^ c1 ^ k0; c[1] = lo1; c[2] = hi0 ^ c3 ^ k1; c[3] = lo0;
  }
}

struct DcKey { u64 seed; u32 gen, rnd, pos; };

DC_FN void philox_block(const DcKey& k, u32 position, u32 domain, u32 index, u32 out[4]) {
  out[0] = (domain << DC_DOMAIN_SHIFT) | index; out[1] = position; out[2] = k.rnd; out[3] = k.gen;
  philox4x32(out, (u32)k.seed, (u32)(k.seed >> 32), 10);
}

DC_FN u32 proposal_ticket(const DcKey& k) {
  u32 w[4]; philox_block(k, k.pos, DC_PROPOSAL, 0, w); return w[0] >> 8;
}

DC_FN int bitlen128(u128 a) {
  if (a.hi) return 128 - __clzll((i64)a.hi);
  if (a.lo) return 64 - __clzll((i64)a.lo);
  return 0;
}

/* Exact uniform in [0, n) by masked rejection; returns false when indices run out. */
DC_FN bool uniform_below(u128 n, const DcKey& k, u32 position, u32 domain, u32* index, u128* out) {
  int L = bitlen128(sub128(n, mk128(1, 0)));
  u64 mlo = L >= 64 ? ~0ull : ((1ull << L) - 1ull);
  u64 mhi = L <= 64 ? 0ull : (L >= 128 ? ~0ull : ((1ull << (L - 64)) - 1ull));
  while (*index <= DC_MAX_DRAW_INDEX) {
    u32 w[4]; philox_block(k, position, domain, *index, w);
    *index += 1;
    u128 x = mk128(((u64)w[1] << 32 | w[0]) & mlo, ((u64)w[3] << 32 | w[2]) & mhi);
    if (lt128(x, n)) { *out = x; return true; }
  }
  return false;
}

/* ----------------------------------------------------------- conversions */
DC_FN float load_f(const void* p, int dt, i64 i) {
  if (dt == 0) return ((const float*)p)[i];
  if (dt == 1) {
    u16 h = ((const u16*)p)[i];
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
  }
  return __uint_as_float(((u32)((const u16*)p)[i]) << 16);
}

/* Order-preserving map of a binary64 (+0 == -0) to u64. */
DC_FN u64 ordkey(double z) {
  u64 b = (u64)__double_as_longlong(z);
  if (z == 0.0) b = 0;
  return (b >> 63) ? ~b : (b | 0x8000000000000000ull);
}
DC_FN double unordkey(u64 k) {
  u64 b = (k >> 63) ? (k & 0x7FFFFFFFFFFFFFFFull) : ~k;
  return __longlong_as_double((i64)b);
}

DC_FN u64 exp2_neg_q62(u32 f) {
  u64 e = dy_exp2_neg_q62[0][(f >> 24) & 0xFF];
  u128 p;
  p = mul64(e, dy_exp2_neg_q62[1][(f >> 16) & 0xFF]); e = (p.hi << 2) | (p.lo >> 62);
  p = mul64(e, dy_exp2_neg_q62[2][(f >> 8) & 0xFF]); e = (p.hi << 2) | (p.lo >> 62);
  p = mul64(e, dy_exp2_neg_q62[3][f & 0xFF]); e = (p.hi << 2) | (p.lo >> 62);
  return e;
}

DC_FN u64 weight_from_gap(double t) {
  if (!(t < 32.0)) return 0;
  u64 t32 = (u64)(t * 4294967296.0);
  u128 p = mul64(t32, DY_LOG2E_Q63);
  u64 y = (p.hi << 1) | (p.lo >> 63);
  u64 n = y >> 32;
  u64 shift = 23 + n;
  if (shift >= 63) return 0;
  return exp2_neg_q62((u32)(y & 0xFFFFFFFFull)) >> shift;
}

DC_FN void f32_mant_exp(u32 bits, u64* m, int* e) {
  u32 ex = (bits >> 23) & 0xFF, mm = bits & 0x7FFFFF;
  if (ex == 0) { *m = mm; *e = -149; } else { *m = mm | 0x800000u; *e = (int)ex - 150; }
}
DC_FN u64 shift_floor(u64 m, int s) {
  if (s >= 0) return s >= 64 ? 0 : (m << s);
  return (-s) >= 64 ? 0 : (m >> (-s));
}

/* P = floor(p * 2**62) of a target bit pattern; *bad set for invalid values. */
DC_FN u64 target_fixed(u32 b, bool* bad) {
  u32 mag = b & 0x7FFFFFFFu;
  if (((b >> 31) && mag) || mag > 0x3F800000u) { *bad = true; return 0; }
  u64 m; int e; f32_mant_exp(mag, &m, &e);
  return shift_floor(m, e + 62);
}

/* Weight from a ranking key (see rank_key): logits keys are ordkey(z) and the
 * weight is exp(-(zmax - z)); probability keys are mag + 1. */
DC_FN u64 weight_of_key(u64 key, u64 maxkey, int logits) {
  if (logits) return weight_from_gap(unordkey(maxkey) - unordkey(key));
  u32 mag = (u32)(key - 1);
  if (!mag) return 0;
  u64 m, mm; int e, emax;
  f32_mant_exp(mag, &m, &e); f32_mant_exp((u32)(maxkey - 1), &mm, &emax);
  return shift_floor(m, e - emax + 15);
}

/* Key and status of one input element (status 0 = fine). */
DC_FN u64 rank_key(float xf, const void* bias, int bdt, i64 bidx, double temp, int logits, int* bad) {
  *bad = 0;
  if (logits) {
    double z = (double)xf;
    if (bias) z = z + (double)load_f(bias, bdt, bidx);
    z = z / temp;
    if (z != z) *bad = ST_X_NAN;
    else if (z == __longlong_as_double(0x7FF0000000000000ll)) *bad = ST_X_POSINF;
    return ordkey(z);
  }
  u32 b = __float_as_uint(xf), mag = b & 0x7FFFFFFFu;
  if (mag > 0x7F800000u) *bad = ST_X_NAN;
  else if (b == 0x7F800000u) *bad = ST_X_POSINF;
  else if ((b >> 31) && mag) *bad = ST_X_NEGATIVE;
  return (u64)mag + 1;
}
#define DC_KEY_NEG_INF 0x000FFFFFFFFFFFFFull /* ordkey(-inf) */

/* --------------------------------------------------------- key fields */
/* kfmt: 2 bits per field (seed, gen, round, pos): bit0 = 8-byte words, bit1 = broadcast. */
DC_FN u64 ld_field(const void* p, int f, int row) {
  int i = (f & 2) ? 0 : row;
  return (f & 1) ? ((const u64*)p)[i] : (u64)((const u32*)p)[i];
}
DC_FN DcKey load_key(const void* s, const void* g, const void* r, const void* p, int kfmt, int row) {
  DcKey k;
  k.seed = ld_field(s, kfmt & 3, row);
  k.gen = (u32)ld_field(g, (kfmt >> 2) & 3, row);
  k.rnd = (u32)ld_field(r, (kfmt >> 4) & 3, row);
  k.pos = (u32)ld_field(p, (kfmt >> 6) & 3, row);
  return k;
}

/* ------------------------------------------------------ block primitives */
struct DcShared {
  u32 hist[256];
  u64 r64[32];
  u64 r64b[32];
  int ri[33];
  u64 prefix, mask;
  int need, done, cutoff, found;
  u128 x;
};

DC_FN u64 warp_sum64(u64 v) { for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o); return v; }
DC_FN u64 warp_max64(u64 v) { for (int o = 16; o; o >>= 1) { u64 w = __shfl_xor_sync(0xffffffffu, v, o); v = w > v ? w : v; } return v; }
DC_FN u64 warp_min64(u64 v) { for (int o = 16; o; o >>= 1) { u64 w = __shfl_xor_sync(0xffffffffu, v, o); v = w < v ? w : v; } return v; }
DC_FN u128 warp_sum128(u128 v) {
  for (int o = 16; o; o >>= 1) {
    u128 w = mk128(__shfl_xor_sync(0xffffffffu, v.lo, o), __shfl_xor_sync(0xffffffffu, v.hi, o));
    v = add128(v, w);
  }
  return v;
}

/* op: 0 sum, 1 max, 2 min.  All threads get the result. */
DC_FN u64 block_reduce64(u64 v, int op, DcShared& sh) {
  int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = op == 0 ? warp_sum64(v) : (op == 1 ? warp_max64(v) : warp_min64(v));
  __syncthreads();
  if (lane == 0) sh.r64[wid] = v;
  __syncthreads();
  if (wid == 0) {
    u64 w = lane < nw ? sh.r64[lane] : (op == 2 ? ~0ull : 0ull);
    w = op == 0 ? warp_sum64(w) : (op == 1 ? warp_max64(w) : warp_min64(w));
    if (lane == 0) sh.r64[32 - 1] = w;
  }
  __syncthreads();
  u64 r = sh.r64[31];
  __syncthreads();
  return r;
}

DC_FN u128 block_sum128(u128 v, DcShared& sh) {
  int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_sum128(v);
  __syncthreads();
  if (lane == 0) { sh.r64[wid] = v.lo; sh.r64b[wid] = v.hi; }
  __syncthreads();
  if (wid == 0) {
    u128 w = lane < nw ? mk128(sh.r64[lane], sh.r64b[lane]) : mk128(0, 0);
    w = warp_sum128(w);
    if (lane == 0) sh.x = w;
  }
  __syncthreads();
  u128 r = sh.x;
  __syncthreads();
  return r;
}

/* Exclusive scan of one int per thread (thread order); *total gets the sum. */
DC_FN int block_excl_scan(int v, int* total, DcShared& sh) {
  int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  int inc = v;
  for (int o = 1; o < 32; o <<= 1) { int t = __shfl_up_sync(0xffffffffu, inc, o); if (lane >= o) inc += t; }
  __syncthreads();
  if (lane == 31) sh.ri[wid] = inc;
  __syncthreads();
  if (wid == 0) {
    int w = lane < nw ? sh.ri[lane] : 0, wi = w;
    for (int o = 1; o < 32; o <<= 1) { int t = __shfl_up_sync(0xffffffffu, wi, o); if (lane >= o) wi += t; }
    sh.ri[lane] = wi - w;
    if (lane == 31) sh.ri[32] = wi;
  }
  __syncthreads();
  int r = sh.ri[wid] + inc - v;
  *total = sh.ri[32];
  __syncthreads();
  return r;
}

/* Selection of the K largest keys among n (ties: lowest index).  Element i
 * with key k is selected iff (k & mask) > prefix, or (k & mask) == prefix and
 * i <= cutoff.  1 <= K <= n. */
struct DcSel { u64 prefix, mask; int cutoff; };

DC_FN bool sel_has(const DcSel& s, u64 key, int i) {
  u64 m = key & s.mask;
  return m > s.prefix || (m == s.prefix && i <= s.cutoff);
}

template <class G>
DC_FN DcSel block_select(G get, int n, int K, DcShared& sh) {
  DcSel s; s.prefix = 0; s.mask = 0; s.cutoff = n - 1;
  if (K >= n) return s;
  int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31;
  u64 prefix = 0, mask = 0; int need = K; bool done = false;
  for (int shift = 56; shift >= 0 && !done; shift -= 8) {
    for (int b = tid; b < 256; b += nt) sh.hist[b] = 0;
    __syncthreads();
    for (int i = tid; i < n; i += nt) {
      u64 k = get(i);
      if ((k & mask) == prefix) atomicAdd(&sh.hist[(k >> shift) & 255], 1u);
    }
    __syncthreads();
    if (tid < 32) {
      u32 c[8]; u32 sl = 0;
      for (int j = 0; j < 8; ++j) { c[j] = sh.hist[255 - 8 * lane - j]; sl += c[j]; }
      u32 inc = sl;
      for (int o = 1; o < 32; o <<= 1) { u32 t = __shfl_up_sync(0xffffffffu, inc, o); if (lane >= o) inc += t; }
      u32 exc = inc - sl;
      if (exc < (u32)need && (u32)need <= inc) {
        u32 cum = exc;
        for (int j = 0; j < 8; ++j) {
          if (cum + c[j] >= (u32)need) {
            int bin = 255 - 8 * lane - j;
            sh.prefix = prefix | ((u64)bin << shift);
            sh.need = need - (int)cum;
            sh.done = (c[j] == (u32)(need - (int)cum));
            break;
          }
          cum += c[j];
        }
      }
    }
    __syncthreads();
    prefix = sh.prefix; need = sh.need; done = sh.done != 0;
    mask |= (u64)0xFF << shift;
    __syncthreads();
  }
  s.prefix = prefix; s.mask = mask;
  if (done) return s;
  /* ties on the full key: the first `need` equal keys in index order */
  int chunk = (n + nt - 1) / nt, lo = tid * chunk, hi = min(n, lo + chunk), cnt = 0;
  for (int i = lo; i < hi; ++i) cnt += (get(i) == prefix);
  int tot; int exc = block_excl_scan(cnt, &tot, sh);
  if (exc < need && need <= exc + cnt) {
    int c = exc;
    for (int i = lo; i < hi; ++i) if (get(i) == prefix && ++c == need) { sh.cutoff = i; break; }
  }
  __syncthreads();
  s.cutoff = sh.cutoff;
  __syncthreads();
  return s;
}

/* Compaction in index order: for i in [0, n) with pred(i), emit(i, rank). Returns the count. */
template <class P, class E>
DC_FN int block_compact(P pred, E emit, int n, DcShared& sh) {
  int nt = blockDim.x, chunk = (n + nt - 1) / nt, lo = threadIdx.x * chunk, hi = min(n, lo + chunk);
  int cnt = 0;
  for (int i = lo; i < hi; ++i) cnt += pred(i) ? 1 : 0;
  int tot; int r = block_excl_scan(cnt, &tot, sh);
  for (int i = lo; i < hi; ++i) if (pred(i)) emit(i, r++);
  __syncthreads();
  return tot;
}

/* Weighted draw: index of the first element whose running sum of getw exceeds
 * x, where x = drawx(total) (called by one thread; returns false when the RNG
 * is exhausted).  Returns -1 on exhaustion or zero total. */
template <class G, class D>
DC_FN int block_draw(G getw, int n, D drawx, DcShared& sh) {
  int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5, nw = blockDim.x >> 5;
  int lo = 0, hi = n; bool first = true;
  u128 x = mk128(0, 0);
  while (true) {
    int len = hi - lo;
    if (len <= 32) {
      if (wid == 0) {
        u128 w = lane < len ? getw(lo + lane) : mk128(0, 0);
        u128 inc = w;
        for (int o = 1; o < 32; o <<= 1) {
          u128 t = mk128(__shfl_up_sync(0xffffffffu, inc.lo, o), __shfl_up_sync(0xffffffffu, inc.hi, o));
          if (lane >= o) inc = add128(inc, t);
        }
        if (first) {  /* tiny row: draw from its total here */
          u128 tot = mk128(__shfl_sync(0xffffffffu, inc.lo, 31), __shfl_sync(0xffffffffu, inc.hi, 31));
          bool ok = false;
          if (lane == 0) ok = !is_zero128(tot) && drawx(tot, &x);
          ok = __shfl_sync(0xffffffffu, (int)ok, 0) != 0;
          x = mk128(__shfl_sync(0xffffffffu, x.lo, 0), __shfl_sync(0xffffffffu, x.hi, 0));
          if (!ok) { if (lane == 0) sh.found = -1; }
          else {
            unsigned bal = __ballot_sync(0xffffffffu, lane < len && lt128(x, inc));
            if (lane == 0) sh.found = lo + __ffs(bal) - 1;
          }
        } else {
          unsigned bal = __ballot_sync(0xffffffffu, lane < len && lt128(x, inc));
          if (lane == 0) sh.found = bal ? lo + __ffs(bal) - 1 : -1;
        }
      }
      __syncthreads();
      int r = sh.found;
      __syncthreads();
      return r;
    }
    int seg = (len + nw - 1) / nw;
    int slo = lo + wid * seg, shi = min(hi, slo + seg);
    u128 s = mk128(0, 0);
    for (int i = slo + lane; i < shi; i += 32) s = add128(s, getw(i));
    s = warp_sum128(s);
    if (lane == 0) { sh.r64[wid] = s.lo; sh.r64b[wid] = s.hi; }
    __syncthreads();
    if (tid == 0) {
      bool ok = true;
      if (first) {
        u128 tot = mk128(0, 0);
        for (int w = 0; w < nw; ++w) tot = add128(tot, mk128(sh.r64[w], sh.r64b[w]));
        ok = !is_zero128(tot) && drawx(tot, &x);
      }
      if (!ok) sh.found = -1;
      else {
        u128 cum = mk128(0, 0);
        sh.found = -2;
        for (int w = 0; w < nw; ++w) {
          u128 nc = add128(cum, mk128(sh.r64[w], sh.r64b[w]));
          if (lt128(x, nc)) {
            sh.x = sub128(x, cum);
            sh.ri[0] = lo + w * seg; sh.ri[1] = min(hi, lo + (w + 1) * seg);
            break;
          }
          cum = nc;
        }
        if (sh.found == -2 && false) sh.found = -1;
      }
    }
    __syncthreads();
    if (sh.found == -1) { __syncthreads(); return -1; }
    x = sh.x; lo = sh.ri[0]; hi = sh.ri[1]; first = false;
    __syncthreads();
  }
}

#endif
