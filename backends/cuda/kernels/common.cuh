/* Device-side glue and block primitives of the CuPy backend.
 *
 * Compiled by NVRTC with --fmad=false.  Every scalar integer operation
 * (128-bit arithmetic, Philox, uniform_below, the exponential weights, the
 * target fixed point, the acceptance split, the residual, status codes and
 * constants) comes from the shared integer core backends/include/dyadic_core.h,
 * the same source the CPU backend compiles.  This file keeps only what is
 * genuinely GPU-side: loads of the input dtypes and key arrays, the ranking
 * key of one element, and the parallel primitives (block reductions, radix
 * select, compaction, scans, the weighted first-exceeding search).  The only
 * floating-point operations are those of dyadic/reference/fixedpoint.py.
 */
#ifndef DYADIC_KERNELS_COMMON_CUH
#define DYADIC_KERNELS_COMMON_CUH

#include "dyadic_core.h"

typedef unsigned long long u64;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned short u16;

#define DC_FN static __device__ __forceinline__

/* -DDC_PROF (DYADIC_CUDA_PROF=1, docs/development.md): %globaltimer stamps in the
 * module's global dc_prof (read it with RawModule.get_global("dc_prof")).  Slots
 * 0-31: propose (topk_onepass.cuh), 32-63: lazy verify (verify_lazy.cuh), 64-79: clock64 cycles inside propose's one-warp tail, 80-89:
 * clock64 cycles of verify_lazy's last block. */
#ifdef DC_PROF
__device__ unsigned long long dc_prof[96];
DC_FN unsigned long long dc_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#endif

/* ----------------------------------------------------------- conversions */
DC_FN float load_f(const void* p, int dt, i64 i) {
  if (dt == 0) return ((const float*)p)[i];
  if (dt == 1) {
    u16 h = ((const u16*)p)[i];
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
  }
  return __uint_as_float(((u32)((const u16*)p)[i]) << 16);
}

/* The order key of a float32 value given as bits (-0 counts as +0): keys compare as
 * the values do, with no float arithmetic (CuPy compiles with -ftz). */
DC_FN u32 dc_fkey(u32 b) {
  if (b == 0x80000000u) b = 0u;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

/* The float32 bits whose dc_fkey is k (-0.0 comes back as +0.0: the same key). */
DC_FN u32 dc_fkey_bits(u32 k) { return (k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k; }

/* float -> double by integer bit manipulation (exact, subnormals kept).  CuPy
 * appends -ftz=true to every NVRTC compile (cupy/cupy#9576), so cvt.f64.f32
 * and f32 compares would flush subnormal floats to zero: no f32 arithmetic,
 * conversion or comparison may appear in these kernels. */
DC_FN double dc_f2d(float f) {
  const u32 b = __float_as_uint(f);
  const u64 s = (u64)(b >> 31) << 63;
  const u32 e = (b >> 23) & 0xFFu, m = b & 0x7FFFFFu;
  u64 r;
  if (e == 0xFFu) r = s | 0x7FF0000000000000ull | ((u64)m << 29);  /* inf, NaN */
  else if (e) r = s | ((u64)(e + 896u) << 52) | ((u64)m << 29);   /* normal: 1023 - 127 */
  else if (!m) r = s;                                              /* +-0 */
  else {                                                           /* subnormal m * 2**-149 */
    const int p = 31 - __clz(m);
    r = s | ((u64)(p + 874) << 52) | (((u64)m << (52 - p)) & 0xFFFFFFFFFFFFFull);
  }
  return __longlong_as_double((long long)r);
}

/* Weight from a ranking key (see rank_key): logits keys are dy_order_key(z)
 * and the weight is dy_weight_from_gap(zmax - z); probability keys are
 * mag + 1 and the weight is dy_prob_weight(mag, exp(max)). */
DC_FN u64 weight_of_key(u64 key, u64 maxkey, int logits) {
  if (logits) return dy_weight_from_gap(dy_key_value(maxkey) - dy_key_value(key));
  return dy_prob_weight((u32)(key - 1), dy_f32_exp((u32)(maxkey - 1)));
}

/* Key and status of one input element (status 0 = fine). */
DC_FN u64 rank_key(float xf, const void* bias, int bdt, i64 bidx, double temp, int logits, int* bad) {
  *bad = DY_ST_OK;
  if (logits) {
    double z = dc_f2d(xf);
    if (bias) z = z + dc_f2d(load_f(bias, bdt, bidx));
    if (temp != 1.0) z = z / temp;
    if (z != z || z == dy_inf()) *bad = dy_logit_status(z);
    return dy_order_key(z);
  }
  u32 b = __float_as_uint(xf);
  *bad = dy_weight_bits_status(b);
  return (u64)(b & 0x7FFFFFFFu) + 1;
}
#define DC_KEY_NEG_INF 0x000FFFFFFFFFFFFFull /* dy_order_key(-inf) */

/* ------------------------------------------------------------- grid rows
 * A kernel with one row (or request) per grid y index takes its row from y and z: the
 * host launches grid (x, y, z) with z = ceil(nrows / 65535) and y = ceil(nrows / z)
 * (y and z are at most 65535 each; z = 1 up to 65535 rows), so y * z - nrows < z
 * blocks of each x lie past the last row and end at once (block-uniform, before any
 * barrier or counter).  Per-row scratch and counters are indexed by this row. */
DC_FN int dc_grid_row() { return (int)(blockIdx.y + gridDim.y * blockIdx.z); }

/* --------------------------------------------------------- key fields */
struct DcKey { u64 seed; u32 gen, rnd, pos; };

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
DC_FN u32 key_ticket(const DcKey& k) { return dy_proposal_ticket(k.seed, k.gen, k.rnd, k.pos); }

/* ------------------------------------------------------ block primitives */
struct DcShared {
  u32 hist[256];
  u64 r64[32];
  u64 r64b[32];
  int ri[33];
  u64 prefix, mask;
  int need, done, cutoff, found;
  dy_u128 x;
};

/* The last-block election of a kernel that splits a row over n blocks: every block
 * calls it (all threads) after writing its partial results; it returns true, the same
 * in all threads, in the one block that arrives last at *counter, which then sees every
 * block's writes, and resets *counter to 0 there (graph replays start at zero).  The
 * barrier orders the block's writes before thread 0, whose fence.acq_rel.gpu before the
 * atomic releases them (the fence is cumulative) and, in the last block, after the
 * atomic acquires the other blocks': the pattern of cooperative groups' grid sync, one
 * fence per block instead of a __threadfence in every thread.  flag: a shared int. */
/* Phase m (0..3) of a kernel's body reached: nothing in this build.  The instrumented
 * copy of python -m dyadic.bench timeline defines it first, to stamp the time thread 0
 * of a block passes it (the latest over the blocks). */
#ifndef DY_TL_MARK
#define DY_TL_MARK(m)
#endif

template <class C>  /* u32 or u64 counters */
DC_FN bool dc_elect_last(C* counter, C n, int* flag) {
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
    const bool last = atomicAdd(counter, (C)1) == n - 1;
    if (last) {
      asm volatile("fence.acq_rel.gpu;" ::: "memory");
      *counter = 0;
    }
    *flag = last;
  }
  __syncthreads();
  return *flag != 0;
}

/* Warp reductions of u64 (all 32 lanes), by the 32-bit redux.sync of sm_80+ instead of
 * 5 levels of two shuffles: the sum (mod 2**64) from its 22 / 21 / 21-bit parts, each
 * part's sum < 2**27; the max / min from the high words, then the low words of the lanes
 * that hold the extreme high word. */
DC_FN u64 warp_sum64(u64 v) {
  const u64 s0 = __reduce_add_sync(0xffffffffu, (u32)(v & 0x3FFFFFu));
  const u64 s1 = __reduce_add_sync(0xffffffffu, (u32)((v >> 22) & 0x1FFFFFu));
  const u64 s2 = __reduce_add_sync(0xffffffffu, (u32)(v >> 43));
  return s0 + (s1 << 22) + (s2 << 43);
}
DC_FN u64 warp_max64(u64 v) {
  const u32 h = __reduce_max_sync(0xffffffffu, (u32)(v >> 32));
  return ((u64)h << 32) | __reduce_max_sync(0xffffffffu, (u32)(v >> 32) == h ? (u32)v : 0u);
}
DC_FN u64 warp_min64(u64 v) {
  const u32 h = __reduce_min_sync(0xffffffffu, (u32)(v >> 32));
  return ((u64)h << 32) | __reduce_min_sync(0xffffffffu, (u32)(v >> 32) == h ? (u32)v : 0xFFFFFFFFu);
}
DC_FN dy_u128 warp_sum128(dy_u128 v) {
  for (int o = 16; o; o >>= 1) {
    dy_u128 w = dy_make128(__shfl_xor_sync(0xffffffffu, v.hi, o), __shfl_xor_sync(0xffffffffu, v.lo, o));
    v = dy_add128(v, w);
  }
  return v;
}

/* *a += m on a u64 in shared memory by two native 32-bit atomics (a 64-bit atomicAdd on
 * shared memory compiles to a compare-and-swap loop, which contending lanes repeat): the
 * low word's carry goes into the high word, so once every adder has returned (a barrier)
 * the word holds the exact sum mod 2**64.  Only this function may add to such a word
 * while others do. */
DC_FN void dc_shared_add64(u64* a, u64 m) {
  u32* w = (u32*)a;
  const u32 lo = (u32)m, old = atomicAdd(&w[0], lo);
  const u32 hi = (u32)(m >> 32) + (old + lo < old ? 1u : 0u);
  if (hi) atomicAdd(&w[1], hi);
}

/* --------------------------------------------------------- sparse rows
 * Entry j of a sparse q row against the Dyadic rules over ids [0, bound)
 * (dy_sparse_row_valid of the core, entry by entry): padding (id -1) has count 0;
 * a valid id lies in [0, bound), has a count <= 2^24 and follows a valid, smaller
 * id (prev: entry j - 1's id; first: j == 0).  The row is valid when every entry
 * is and its counts sum to exactly 2^24. */
DC_FN bool dc_sparse_entry_ok(int id, u32 c, int prev, bool first, int bound) {
  if (id == DY_PAD_ID) return c == 0u;
  return id >= 0 && id < bound && c <= DY_TOTAL && (first || (prev >= 0 && prev < id));
}

/* One warp (every lane calls it and gets the results): whether the sparse q row
 * (counts qc, ids qi, W entries) is valid over [0, bound) (dc_sparse_entry_ok, sum
 * 2^24), and *cd = the count of the last entry whose id is d when match (dy_q_count's
 * sparse rule), else 0.  One pass of W / 32 loads of each array per lane. */
DC_FN bool dc_sparse_row_scan(const u32* qc, const int* qi, int W, int bound, int d, bool match,
                              u32* cd) {
  const int lane = threadIdx.x & 31;
  bool ok = true;
  u64 sum = 0;
  u32 c_at = 0;
  int carry = DY_PAD_ID;  /* the id of the entry before this pass's first */
  for (int j0 = 0; j0 < W; j0 += 32) {
    const int j = j0 + lane;
    const int id = j < W ? qi[j] : DY_PAD_ID;
    const u32 c = j < W ? qc[j] : 0u;
    int prev = __shfl_up_sync(0xffffffffu, id, 1);
    if (lane == 0) prev = carry;
    ok &= dc_sparse_entry_ok(id, c, prev, j == 0, bound);
    sum += c;
    const unsigned bal = __ballot_sync(0xffffffffu, match && j < W && id == d);
    if (bal) c_at = __shfl_sync(0xffffffffu, c, 31 - __clz(bal));
    carry = __shfl_sync(0xffffffffu, id, 31);
  }
  *cd = c_at;
  return __all_sync(0xffffffffu, ok) && warp_sum64(sum) == (u64)DY_TOTAL;
}

/* Draft qrow of a verify request, its id d (one warp; every lane gets the results):
 * bit 2 when d lies outside [0, V); bit 1 when its q row breaks a Dyadic rule (sparse:
 * dc_sparse_row_scan over [0, V); dense: q(d) > 2^24); *cd = q(d) (dy_q_count: dense
 * qc[d], the last sparse match, 2^24 for the point mass; 0 for an id outside [0, V)).
 * Nothing is read at d outside [0, V); a dense row is read at d only. */
DC_FN u32 dc_draft_check(int d, const u32* qc, const int* qi, int W, int V, i64 qrow, u32* cd) {
  const bool inr = d >= 0 && d < V;
  u32 bits = inr ? 0u : 2u, c = 0;
  if (qc && qi) {
    if (!dc_sparse_row_scan(qc + qrow * W, qi + qrow * W, W, V, d, inr, &c)) bits |= 1u;
  } else if (inr) {
    c = qc ? qc[qrow * (i64)V + d] : DY_TOTAL;
    if (c > DY_TOTAL) bits |= 1u;
  }
  *cd = c;
  return bits;
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

DC_FN dy_u128 block_sum128(dy_u128 v, DcShared& sh) {
  int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_sum128(v);
  __syncthreads();
  if (lane == 0) { sh.r64[wid] = v.lo; sh.r64b[wid] = v.hi; }
  __syncthreads();
  if (wid == 0) {
    dy_u128 w = lane < nw ? dy_make128(sh.r64b[lane], sh.r64[lane]) : dy_make128(0, 0);
    w = warp_sum128(w);
    if (lane == 0) sh.x = w;
  }
  __syncthreads();
  dy_u128 r = sh.x;
  __syncthreads();
  return r;
}

/* A warp shuffle up by o lanes and the sum, for each warp-scanned type (dy_u128: both
 * halves shuffled). */
DC_FN int dc_shfl_up(int v, int o) { return __shfl_up_sync(0xffffffffu, v, o); }
DC_FN u32 dc_shfl_up(u32 v, int o) { return __shfl_up_sync(0xffffffffu, v, o); }
DC_FN dy_u128 dc_shfl_up(dy_u128 v, int o) {
  return dy_make128(__shfl_up_sync(0xffffffffu, v.hi, o), __shfl_up_sync(0xffffffffu, v.lo, o));
}
/* The 128-bit v of lane src, to every lane of the warp. */
DC_FN dy_u128 dc_shfl(dy_u128 v, int src) {
  return dy_make128(__shfl_sync(0xffffffffu, v.hi, src), __shfl_sync(0xffffffffu, v.lo, src));
}
DC_FN int dc_add(int a, int b) { return a + b; }
DC_FN u32 dc_add(u32 a, u32 b) { return a + b; }
DC_FN dy_u128 dc_add(dy_u128 a, dy_u128 b) { return dy_add128(a, b); }

/* The inclusive scan of v over the warp's lanes (lane: this thread's). */
template <class T>
DC_FN T dc_warp_scan(T v, int lane) {
  for (int o = 1; o < 32; o <<= 1) {
    const T t = dc_shfl_up(v, o);
    if (lane >= o) v = dc_add(v, t);
  }
  return v;
}

/* Exclusive scan of one int per thread (thread order); *total gets the sum. */
DC_FN int block_excl_scan(int v, int* total, DcShared& sh) {
  int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  const int inc = dc_warp_scan(v, lane);
  __syncthreads();
  if (lane == 31) sh.ri[wid] = inc;
  __syncthreads();
  if (wid == 0) {
    const int w = lane < nw ? sh.ri[lane] : 0, wi = dc_warp_scan(w, lane);
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

/* top: the highest digit shift to examine; every key must be < 2**(top + 8)
 * (the skipped digits are zero in every key, so the passes over them would
 * pick bin 0 with `need` unchanged). */
template <class G>
DC_FN DcSel block_select(G get, int n, int K, DcShared& sh, int top = 56) {
  DcSel s; s.prefix = 0; s.mask = 0; s.cutoff = n - 1;
  if (K >= n) return s;
  int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31;
  u64 prefix = 0, mask = 0; int need = K; bool done = false;
  for (int shift = top; shift >= 0 && !done; shift -= 8) {
    for (int b = tid; b < 256; b += nt) sh.hist[b] = 0;
    __syncthreads();
#pragma unroll 4
    for (int i = tid; i < n; i += nt) {
      u64 k = get(i);
      if ((k & mask) == prefix) atomicAdd(&sh.hist[(k >> shift) & 255], 1u);
    }
    __syncthreads();
    if (tid < 32) {
      u32 c[8]; u32 sl = 0;
      for (int j = 0; j < 8; ++j) { c[j] = sh.hist[255 - 8 * lane - j]; sl += c[j]; }
      const u32 inc = dc_warp_scan(sl, lane);
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
 * is exhausted).  Returns -1 on exhaustion, a zero total, or an x that no running
 * sum exceeds (a drawx beyond the total, e.g. a ticket above the counts of a row
 * that sums to less than 2^24).  With first0 false the search runs over [lo0, n)
 * with the given x0 (< the sum of that range) and drawx is not called. */
template <class G, class D>
DC_FN int block_draw(G getw, int n, D drawx, DcShared& sh, int lo0 = 0, bool first0 = true,
                     dy_u128 x0 = dy_u128{0, 0}) {
  int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5, nw = blockDim.x >> 5;
  int lo = lo0, hi = n; bool first = first0;
  dy_u128 x = x0;
  while (true) {
    int len = hi - lo;
    if (len <= 32) {
      if (wid == 0) {
        dy_u128 w = lane < len ? getw(lo + lane) : dy_make128(0, 0);
        const dy_u128 inc = dc_warp_scan(w, lane);
        if (first) {  /* tiny row: draw from its total here */
          const dy_u128 tot = dc_shfl(inc, 31);
          bool ok = false;
          if (lane == 0) ok = !dy_is_zero128(tot) && drawx(tot, &x);
          ok = __shfl_sync(0xffffffffu, (int)ok, 0) != 0;
          x = dc_shfl(x, 0);
          if (!ok) { if (lane == 0) sh.found = -1; }
          else {
            unsigned bal = __ballot_sync(0xffffffffu, lane < len && dy_lt128(x, inc));
            if (lane == 0) sh.found = bal ? lo + __ffs(bal) - 1 : -1;
          }
        } else {
          unsigned bal = __ballot_sync(0xffffffffu, lane < len && dy_lt128(x, inc));
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
    dy_u128 s = dy_make128(0, 0);
    for (int i = slo + lane; i < shi; i += 32) s = dy_add128(s, getw(i));
    s = warp_sum128(s);
    if (lane == 0) { sh.r64[wid] = s.lo; sh.r64b[wid] = s.hi; }
    __syncthreads();
    if (tid == 0) {
      bool ok = true;
      if (first) {
        dy_u128 tot = dy_make128(0, 0);
        for (int w = 0; w < nw; ++w) tot = dy_add128(tot, dy_make128(sh.r64b[w], sh.r64[w]));
        ok = !dy_is_zero128(tot) && drawx(tot, &x);
      }
      sh.found = -1;  /* -2 once the segment holding x is found */
      if (ok) {
        dy_u128 cum = dy_make128(0, 0);
        for (int w = 0; w < nw; ++w) {
          dy_u128 nc = dy_add128(cum, dy_make128(sh.r64b[w], sh.r64[w]));
          if (dy_lt128(x, nc)) {
            sh.x = dy_sub128(x, cum);
            sh.ri[0] = lo + w * seg; sh.ri[1] = min(hi, lo + (w + 1) * seg);
            sh.found = -2;
            break;
          }
          cum = nc;
        }
      }
    }
    __syncthreads();
    if (sh.found == -1) { __syncthreads(); return -1; }
    x = sh.x; lo = sh.ri[0]; hi = sh.ri[1]; first = false;
    __syncthreads();
  }
}

/* ------------------------------------------------ small top-K (K <= 64)
 * The K best of n elements by (key desc, id asc), written to ok/oi in that
 * order.  Ids must be distinct.  Exact for any input:
 *  1. M = the K-th largest of the per-thread maxima (rank counting over
 *     blockDim.x <= 256 values in shared memory).  The K threads whose maximum
 *     is >= M each own an element >= M, so the K-th largest key is >= M and
 *     every element below M can be dropped.
 *  2. The survivors (key >= M, usually about K of them) are compacted in
 *     thread order by a scan; when more than DC_SMAX survive (many equal keys)
 *     the radix select picks exactly the K best instead.
 *  3. Each survivor's rank = #{better survivors}; rank < K goes to ok[rank].
 * A handful of __syncthreads instead of the radix select's dozens. */
#define DC_SMAX 512
#define DC_KSMALL 64
struct DcTopk {
  u64 tm[256];
  u64 sk[DC_SMAX];
  int si[DC_SMAX];
  u64 M;
  int S;
};

template <class GK, class GI, class OUT>
DC_FN void block_topk_small(GK getk, GI geti, int n, int K, OUT out, DcTopk& tp, DcShared& sh) {
  const int tid = threadIdx.x, nt = blockDim.x;
  u64 mx = 0; int cnt = 0;
  for (int i = tid; i < n; i += nt) { u64 k = getk(i); mx = k > mx ? k : mx; }
  tp.tm[tid] = mx;
  __syncthreads();
  {
    int gt = 0, ge = 0;
    for (int u = 0; u < nt; ++u) { u64 w = tp.tm[u]; gt += w > mx; ge += w >= mx; }
    if (gt < K && K <= ge) tp.M = mx;  /* all writers agree */
  }
  __syncthreads();
  const u64 M = tp.M;
  for (int i = tid; i < n; i += nt) cnt += getk(i) >= M;
  int S; int pos = block_excl_scan(cnt, &S, sh);
  if (S <= DC_SMAX) {
    for (int i = tid; i < n; i += nt) {
      u64 k = getk(i);
      if (k >= M) { tp.sk[pos] = k; tp.si[pos] = geti(i); ++pos; }
    }
  } else {
    /* the K best exactly (ties: lowest index; callers pass ids ascending in index) */
    DcSel s = block_select(getk, n, K, sh);
    S = block_compact([&](int i) { return sel_has(s, getk(i), i); },
                      [&](int i, int r) { tp.sk[r] = getk(i); tp.si[r] = geti(i); }, n, sh);
  }
  __syncthreads();
  for (int a = tid; a < S; a += nt) {
    const u64 ka = tp.sk[a]; const int ia = tp.si[a];
    int rank = 0;
    for (int b = 0; b < S; ++b) {
      const u64 kb = tp.sk[b];
      rank += kb > ka || (kb == ka && tp.si[b] < ia);
    }
    if (rank < K) out(rank, ka, ia);
  }
  __syncthreads();
}

/* ------------------------------------------------------------------------
 * Per-row inputs of allocate / propose (the top-k and dense kernels). */
#define NONE_BAD 0xFFFFFFFFFFFFFFFFull

struct RowIn {
  const void* x; int xdt; const void* bias; int bdt; int bias_rows;
  const double* temp; int logits; int greedy_ok; int V;
};

DC_FN double row_temp(const double* temp, int row, int greedy_ok, bool* greedy) {
  double t = temp[row];
  *greedy = greedy_ok && t == 0.0;
  return *greedy ? 1.0 : t;
}

/* A row's filters of allocate / propose (docs/semantics.md "Filtered support"): on when
 * the call gives top_p / min_p / a per-row top_k; topk the row's top_k (ftopk, null: the
 * width K) reduced by dy_filter_top_k (-1: invalid), topp / minp float32 bits (null: 1
 * and 0). */
struct DcFilt { int on; i64 topk; u32 topp, minp; };

DC_FN DcFilt dc_filt(int filt, const i64* ftopk, const u32* ftopp, const u32* fminp, int row,
                     int K) {
  DcFilt f;
  f.on = filt; f.topk = K; f.topp = 0x3F800000u; f.minp = 0u;
  if (filt) {
    f.topk = dy_filter_top_k(ftopk ? ftopk[row] : (i64)K, (uint32_t)K);
    if (ftopp) f.topp = ftopp[row];
    if (fminp) f.minp = fminp[row];
  }
  return f;
}

/* The status of a row's filter parameters (0: valid, or no filters), checked before the
 * row's values in the order of dy_allocate_filtered_row. */
DC_FN int dc_filt_status(const DcFilt& f) {
  if (!f.on) return 0;
  return f.topk < 0 ? DY_ST_TOP_K_INVALID : dy_logits_params_status(1.0, f.topk, f.topp, f.minp);
}

DC_FN void fail_sparse(int row, int W, int code, int* tokens, u32* counts, int* ids, int* status) {
  for (int j = threadIdx.x; j < W; j += blockDim.x) { counts[(i64)row * W + j] = 0; ids[(i64)row * W + j] = -1; }
  if (threadIdx.x == 0) { status[row] = code; if (tokens) tokens[row] = -1; }
}
#endif

