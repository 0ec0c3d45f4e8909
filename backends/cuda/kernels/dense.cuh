/* ========================================================================
 * Dense allocate / propose in four launches: the state, arithmetic and
 * selection shared by the kernels dense_max, dense_sum, dense_floor, dense_mark
 * (the second part of this file).
 *
 * Grid (ntiles, B), tile `dt` elements (a multiple of 1024), 256 threads.
 * Every stage recomputes the keys / weights from x (x is 33 MB at the
 * benchmark shape and mostly stays in L2); there is no [B, V] scratch.
 * Per-row state `st` (DA_RS u64 words) is ZERO between calls: the blocks only
 * add / max into it and the last block of dense_mark zeroes it (dense_floor's last
 * block zeroes the coarse histogram).  No memset, no host sync, graph-replayable.
 *
 *   dense_max:   row max key (atomicMax), first bad element (atomicMax of ~packed);
 *             probabilities: also the argmax (atomicMax of mag << 32 | ~id)
 *   dense_sum:   logits: argmax (atomicMax of ~id); S = sum of weights (atomicAdd)
 *   dense_floor: q_v = floor(2^24 w_v / S), r_v = 2^24 w_v - q_v S; sum of q_v;
 *             histogram of the digit d_v = r_v >> dlo (DA_NB = 2048 bins) in
 *             shared memory; the tile's fine histogram is stored (plain
 *             stores, fine[row][tile]), its 256 coarse bins (d >> 3) are added
 *             to the row's global coarse histogram (atomics).  The last block
 *             of the row (atomic counter after a release fence, dc_elect_last) computes
 *             remaining = 2^24 - sum q, the status, the coarse boundary bin,
 *             then sums that bin's 8 fine bins over the tiles: the boundary
 *             bin `bin` and need2 = how many of it are still to be taken
 *   dense_mark:  counts_v = q_v + [d_v > bin] (+[d_v == bin] when the whole bin
 *             is taken); the elements of the bin are appended (atomic slot,
 *             warp-aggregated) as (r_v - bin 2^dlo, v) to a per-row candidate
 *             buffer; the last block takes the need2 best by (r desc, id asc)
 *             and adds their +1, writes the status, zeroes the state.
 *
 * Exactness of the selection (standard policy: +1 for the `remaining`
 * largest r_v, ties to the lowest id, as dy_alloc_weights):
 *  - bl = bitlen(S - 1), dlo = max(bl - 11, 0): every r_v < S <= 2^bl, so
 *    d_v = r_v >> dlo < 2^11 = DA_NB, and d is monotone: r_a > r_b implies
 *    d_a >= d_b.  Hence d_v > bin implies r_v > every r of the bin, and d_v <
 *    bin implies r_v < every r of the bin.
 *  - bin is the largest b with #{d >= b} >= need; need2 = need - #{d > bin}
 *    satisfies 1 <= need2 <= #{d == bin}.  The selected set (the `need`
 *    largest by (r desc, id asc)) therefore is {d > bin} plus the need2 best
 *    of the bin by (r desc, id asc), whatever the order of the appends.
 *  - need = remaining < V always (remaining = sum r_v / S with r_v < S), so
 *    the bin exists; it is found from the exact integer histogram.
 *  - Inside the bin (C = #{d == bin} candidates, known before dense_mark):
 *    C <= DA_RANK: rank counting (rank = #{better by (r desc, id asc)});
 *    C <= DA_CAP:  radix select on r (block_select), then the need_eq lowest
 *                  ids among the r == tau ones (block_select on ~id: distinct);
 *    C >  DA_CAP:  fallback, decided on the device (da_fallback): the last
 *                  block alone sweeps the row, recomputing r from x.  When
 *                  every r of the bin is equal (min == max, gathered by
 *                  dense_mark: equal or two-valued weights) the need2 lowest ids
 *                  of the bin (block_select's tie pass, two sweeps); else
 *                  block_select with key (d == bin ? r - bin 2^dlo + 1 : 0),
 *                  index = id, so its ties-to-lowest-index rule is the
 *                  ties-to-lowest-id rule (up to ~9 sweeps).  Slow (one block
 *                  per row) but exact; reached only when one bin holds > 2048.
 *
 * Division: see da_div (binary64 estimate in {q, q + 1}, one exact integer
 * correction; the hardware division for S >= 2^62).
 * ======================================================================== */
#define DA_NB 2048
#define DA_NBITS 11
#define DA_CAP 2048
#define DA_RANK 256
#define DA_NC 256 /* coarse bins: d >> 3 */
#define DA_RS (16 + DA_NC / 2)
enum { DA_MK = 0, DA_BAD, DA_ARG, DA_S, DA_SB, DA_C1, DA_C2, DA_SLOT, DA_KIND, DA_REM, DA_BIN,
       DA_NEED, DA_CNT, DA_CODE, DA_RMAX, DA_RMINI /* ~min */ };
/* kinds (set by dense_floor's last block; 0: the row was not run there) */
enum { DA_K_ERR = 1, DA_K_FLOOR, DA_K_ALL, DA_K_CAND, DA_K_FALL };

template <int N> struct DaN { static constexpr int n = N; };

/* f(v0, xs, DaN<n>, ok) for groups of n consecutive elements of [lo, hi):
 * vec (float32, V % 4 == 0, x 16-byte aligned): float4 loads, 4 U elements per
 * thread in flight; else 8 scalar loads in flight.  Every thread of the block
 * makes the same number of calls (ok false past hi), so f may use warp
 * collectives.  Per thread, v increases from call to call. */
template <int U = 4, class F>
DC_FN void da_tile(const void* x, int xdt, i64 xoff, int lo, int hi, int vec, F f) {
  const int tid = threadIdx.x;
  if (vec) {
    const float4* x4 = (const float4*)((const float*)x + xoff);
    for (int base = lo; base < hi; base += 256 * 4 * U) {
      float4 b[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int i = base + (u * 256 + tid) * 4;
        b[u] = i < hi ? __ldg(&x4[i >> 2]) : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int i = base + (u * 256 + tid) * 4;
        const float xs[4] = {b[u].x, b[u].y, b[u].z, b[u].w};
        f(i, xs, DaN<4>(), i < hi);
      }
    }
  } else {
    for (int base = lo; base < hi; base += 256 * 8) {
      float xf[8];
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        const int v = base + q * 256 + tid;
        xf[q] = v < hi ? load_f(x, xdt, xoff + v) : 0.0f;
      }
#pragma unroll
      for (int q = 0; q < 8; ++q) { const int v = base + q * 256 + tid; f(v, &xf[q], DaN<1>(), v < hi); }
    }
  }
}

DC_FN bool da_last(u64* st, int slot) {
  __shared__ int is_last;
  return dc_elect_last(&st[slot], (u64)gridDim.x, &is_last);
}

/* status code of the row after dense_max (0 = fine) */
DC_FN int da_code(const u64* st, int logits) {
  const u64 nb = st[DA_BAD];
  if (nb) return (int)((~nb) & 0xFF);
  const u64 mk = st[DA_MK];
  if ((logits && mk == DC_KEY_NEG_INF) || (!logits && mk == 1)) return DY_ST_X_ZERO_MASS;
  return 0;
}

struct DaRow { u64 mk, S; double scale; int fp, dlo, logits; };

DC_FN DaRow da_row(const u64* st, int logits) {
  DaRow R;
  R.mk = st[DA_MK];
  R.S = st[DA_S];
  R.logits = logits;
  const u64 s = R.S ? R.S : 1;  /* S == 0 cannot happen (the max has weight >= 2^15); fail closed */
  R.fp = s < (1ull << 62);
  R.scale = __ddiv_rn(16777216.0, __ull2double_rn(s));
  const int bl = dy_bitlen64(s - 1);
  R.dlo = bl > DA_NBITS ? bl - DA_NBITS : 0;
  return R;
}

/* q = floor(2^24 w / S) and *rem = 2^24 w - q S, exact, for w < 2^52 (weights are
 * < 2^40) and S < 2^62 (else the hardware division).  As the CPU backend's
 * dy_alloc_weights_host: wd = w exactly (bit trick), scale = fl(2^24 / fl(S)),
 * qd = fl(wd scale): three roundings, |qd - Q| < 2^24 * 2^-51 = 2^-27 with
 * Q = 2^24 w / S = q + f, 0 <= f < 1, so qd + 2^52 rounds to qe = round(qd) in
 * {q, q + 1}.  r = 2^24 w - qe S (mod 2^64) is r in [0, S) when qe = q, and r - S
 * in [-S, 0) (top bit set, as S < 2^63) when qe = q + 1: one correction. */
DC_FN u32 da_div(const DaRow& R, u64 w, u64* rem) {
  const u64 m = w << DY_TOTAL_BITS;
  if (R.fp) {
    const double wd = __dsub_rn(__hiloint2double((int)(0x43300000u | (u32)(w >> 32)), (int)(u32)w),
                                4503599627370496.0);
    const double t = __dadd_rn(__dmul_rn(wd, R.scale), 4503599627370496.0);
    u32 q = (u32)__double2loint(t);
    u64 r = m - (u64)q * R.S;
    if ((i64)r < 0) { r += R.S; --q; }
    *rem = r;
    return q;
  }
  const u64 S = R.S ? R.S : 1;
  const u64 q = m / S;
  *rem = m - q * S;
  return (u32)q;  /* q <= 2^24 */
}

/* Weight of one element, specialised per input kind (the per-element loops are
 * compiled once per kind).  Both equal weight_of_key(rank_key(...)). */
struct DaWProb {  /* float32 weights: dy_prob_weight, branch-free (as the CPU backend) */
  int emax; u32 magmax;
  /* mant_v 2^(ex_v - emax + 15), floored: (mant << 15) >> (emax - ex) for emax - ex <= 63
   * (ex <= emax in a valid row; shifts >= 39 give 0 as dy_shift_floor64) */
  __device__ __forceinline__ u64 operator()(float xf, int) const {
    const u32 mag = __float_as_uint(xf) & 0x7FFFFFFFu, e = mag >> 23;
    const u32 mant = (mag & 0x7FFFFFu) | (e ? 0x800000u : 0u);
    const int ex = e ? (int)e - 150 : -149;
    const u32 d = min((u32)(emax - ex), 63u);
    return ((u64)mant << 15) >> d;
  }
  __device__ __forceinline__ bool is_max(float xf, int) const {
    return (__float_as_uint(xf) & 0x7FFFFFFFu) == magmax;
  }
  /* the row's argmax comes from dense_max (packed with the magnitude), not from dense_sum */
  __device__ __forceinline__ bool arg_in_max() const { return true; }
};
struct DaWLogit {
  const void* bias; int bdt; i64 boff; double T; u64 mk;
  __device__ __forceinline__ u64 key(float xf, int v) const {
    int bad;
    return rank_key(xf, bias, bdt, boff + v, T, 1, &bad);
  }
  __device__ __forceinline__ u64 operator()(float xf, int v) const {
    return weight_of_key(key(xf, v), mk, 1);
  }
  __device__ __forceinline__ bool is_max(float xf, int v) const { return key(xf, v) == mk; }
  __device__ __forceinline__ bool arg_in_max() const { return false; }  /* dense_sum finds it */
};

/* f(W) with the weight functor of the row's input kind */
template <class F>
DC_FN void da_kind(int logits, u64 mk, const void* bias, int bdt, i64 boff, double T, F f) {
  if (logits) {
    DaWLogit W; W.bias = bias; W.bdt = bdt; W.boff = boff; W.T = T; W.mk = mk;
    f(W);
  } else {
    DaWProb W; W.magmax = (u32)(mk - 1); W.emax = dy_f32_exp(W.magmax);
    f(W);
  }
}




/* the need best of n candidates (key kr = r - bin 2^dlo < 2^dlo, id) by (r desc, id asc): +1 */
template <class GK, class GI>
DC_FN void da_pick(GK kr, GI kid, int n, int need, int dlo, u32* crow, DcShared& sh) {
  const int tid = threadIdx.x;
  if (n <= DA_RANK) {
    if (tid < n) {
      const u64 k = kr(tid); const u32 id = kid(tid);
      int rank = 0;
      for (int j = 0; j < n; ++j) { const u64 kj = kr(j); rank += kj > k || (kj == k && kid(j) < id); }
      if (rank < need) crow[id] = __ldcg(&crow[id]) + 1u;
    }
    return;
  }
  const int top1 = dlo > 8 ? ((dlo + 7) / 8) * 8 - 8 : 0;  /* keys < 2^dlo <= 2^(top1 + 8) */
  const DcSel s1 = block_select(kr, n, need, sh, top1);
  u64 gt = 0;
  for (int i = tid; i < n; i += 256) gt += (kr(i) & s1.mask) > s1.prefix;
  gt = block_reduce64(gt, 0, sh);
  const int need_eq = need - (int)gt;  /* from {(k & mask) == prefix}: lowest ids */
  auto k2 = [&](int i) -> u64 { return (kr(i) & s1.mask) == s1.prefix ? (u64)(u32)~kid(i) : 0ull; };
  DcSel s2; s2.prefix = ~0ull; s2.mask = ~0ull; s2.cutoff = -1;
  if (need_eq > 0) s2 = block_select(k2, n, need_eq, sh, 24);
  for (int i = tid; i < n; i += 256) {
    const u64 m = kr(i) & s1.mask;
    if (m > s1.prefix || (m == s1.prefix && need_eq > 0 && sel_has(s2, k2(i), i))) {
      const u32 id = kid(i);
      crow[id] = __ldcg(&crow[id]) + 1u;
    }
  }
}

/* The last block of a row whose boundary bin holds more than DA_CAP elements
 * (noinline: its registers do not weigh on dense_mark's main loop). */
static __device__ __noinline__ void da_fallback(
    const void* x, int xdt, const void* bias, int bdt, i64 boff, double T, int logits, int V,
    i64 xoff, DaRow R, u32 bin, int need, bool same, u32* crow, DcShared& sh) {
  const int tid = threadIdx.x;
  const u64 rbase = (u64)bin << R.dlo;
  /* one block over the row; key recomputed from x; index order = id order.
   * Every r of the bin equal (equal / two-valued weights): the need lowest ids
   * of the bin, by block_select's tie pass alone (top < 0: no digit pass;
   * bin elements have key 0 == prefix, cutoff = the need-th of them by id).
   * Else key = r - bin 2^dlo + 1 for the bin's elements, 0 for the others. */
  da_kind(logits, R.mk, bias, bdt, boff, T, [&](auto W) {
    auto rof = [&](int i) -> u64 {
      u64 r;
      da_div(R, W(load_f(x, xdt, xoff + i), i), &r);
      return r;
    };
    if (same) {
      auto kz = [&](int i) -> u64 { return (u32)(rof(i) >> R.dlo) == bin ? 0ull : 1ull; };
      const DcSel s = block_select(kz, V, need, sh, -8);
      for (int i = tid; i <= s.cutoff; i += 256)
        if (kz(i) == 0) crow[i] = __ldcg(&crow[i]) + 1u;
    } else {
      auto kf = [&](int i) -> u64 {
        const u64 r = rof(i);
        return (u32)(r >> R.dlo) == bin ? r - rbase + 1 : 0ull;
      };
      const DcSel s = block_select(kf, V, need, sh, (R.dlo / 8) * 8);
      for (int i = tid; i < V; i += 256) {
        const u64 k = kf(i);
        if (k && sel_has(s, k, i)) crow[i] = __ldcg(&crow[i]) + 1u;
      }
    }
  });
}



/* ========================================================================
 * dense_*: the four dense launches (state, arithmetic and selection above:
 * DaRow, da_div, the weight functors, da_pick, da_fallback).
 * What these do:
 *  - dense_vec: software-pipelined float4 tile loop: the loads of iteration
 *    k + 1 are issued before the elements of iteration k are processed (a
 *    plain loop waits for every batch: ~4 exposed memory latencies per block
 *    at B=64).  Same element -> thread map, same per-thread id order.
 *  - dense_mark: the per-element loop is instantiated per row kind (FLOOR/ALL,
 *    CAND, FALL; row-uniform, chosen outside the loop): no dead per-element
 *    work (argmax compare, ballot, range) and fewer live registers; the
 *    last-block work (da_pick / da_fallback) is a noinline function.
 *  - counts are stored with st.global.cs (evict-first): the 33 MB of counts
 *    (B=64) do not push x out of L2.
 * Non-vector inputs (float16 / bfloat16, unaligned) use da_tile's scalar loop.
 * ======================================================================== */

/* 16-byte read-only load with an L2 eviction hint.  H = 1: evict_last (max, sum,
 * floor: x is read again by the next launch), H = 2: evict_first (mark: the last
 * read; the lines do not stay pinned after the call).  Bits only (no float ops).
 * volatile: never speculated past its guard (i < hi, vec). */
template <int H>
DC_FN float4 dense_ld(const float4* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  u64 pol;
  if (H == 1) asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
  else asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  u32 a, b, c, d;
  asm volatile("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
      : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "l"(p), "l"(pol));
  return make_float4(__uint_as_float(a), __uint_as_float(b), __uint_as_float(c), __uint_as_float(d));
#else
  return __ldg(p);
#endif
}

/* the first batch of dense_vec (U float4 per thread; zeros where !vec or past hi) */
template <int U, int H>
DC_FN void dense_first(float4 (&b)[U], const void* x, i64 xoff, int lo, int hi, int vec) {
  const float4* x4 = (const float4*)((const float*)x + xoff);
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int i = lo + (u * 256 + (int)threadIdx.x) * 4;
    b[u] = vec && i < hi ? dense_ld<H>(&x4[i >> 2]) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

/* f(v0, xs, DaN<4>, ok) over [lo, hi) of a float32 row, U float4 per thread per
 * iteration, the next iteration's loads in flight while f runs; b holds the
 * first batch (dense_first, issued at the kernel's entry, in flight while the
 * kernel reads the row state).  Same element -> thread map and per-thread id
 * order as da_tile: lo is a multiple of 4 and hi == V or a multiple of 1024,
 * V % 4 == 0, so i < hi implies i + 3 < hi.  Every thread makes the same number
 * of calls. */
template <int U, int H, class F>
DC_FN void dense_vec(const float* x, i64 xoff, int lo, int hi, float4 (&b)[U], F f) {
  const int tid = threadIdx.x;
  const float4* x4 = (const float4*)(x + xoff);
  constexpr int ST = 256 * 4 * U;
  for (int base = lo; base < hi; base += ST) {
    float4 c[U];
#pragma unroll
    for (int u = 0; u < U; ++u) c[u] = b[u];
    const int nb = base + ST;
    if (nb < hi) {  /* block-uniform */
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int i = nb + (u * 256 + tid) * 4;
        b[u] = i < hi ? dense_ld<H>(&x4[i >> 2]) : make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int i = base + (u * 256 + tid) * 4;
      const float xs[4] = {c[u].x, c[u].y, c[u].z, c[u].w};
      f(i, xs, DaN<4>(), i < hi);
    }
  }
}

template <int U, int H = 1, class F>
DC_FN void dense_tile(const void* x, int xdt, i64 xoff, int lo, int hi, int vec, float4 (&b)[U], F f) {
  if (vec) dense_vec<U, H>((const float*)x, xoff, lo, hi, b, f);
  else da_tile<U>(x, xdt, xoff, lo, hi, 0, f);
}

extern "C" __global__ void __launch_bounds__(256, 4) dense_max(
    const void* x, int xdt, const void* bias, int bdt, int bias_rows, const double* temp,
    int logits, int greedy_ok, int V, int dt, int vec, u64* state, int nrows) {
  __shared__ DcShared sh;
  const int row = dc_grid_row();
  if (row >= nrows) return;
  bool greedy; const double T = row_temp(temp, row, greedy_ok, &greedy);
  const i64 xoff = (i64)row * V, boff = bias_rows > 1 ? xoff : 0;
  u64* st = state + (i64)row * DA_RS;
  const int lo = blockIdx.x * dt, hi = min(V, lo + dt);
  u64 mk = 0, nb = 0;
  auto body = [&](int v0, const float* xs, auto NN, bool ok) {
    constexpr int n = decltype(NN)::n;
    if (!ok) return;
#pragma unroll
    for (int e = 0; e < n; ++e) {
      int bad;
      const u64 key = rank_key(xs[e], bias, bdt, boff + v0 + e, T, logits, &bad);
      if (bad && nb == 0) nb = ~(((u64)(v0 + e) << 8) | (u64)bad);
      mk = key > mk ? key : mk;
    }
  };
  if (logits) {
    float4 pre[2];
    dense_first<2, 1>(pre, x, xoff, lo, hi, vec);
    dense_tile<2>(x, xdt, xoff, lo, hi, vec, pre, body);
  }
  else {  /* probabilities: the same key (mag + 1) and status; the argmax here too: the
    * largest mag << 32 | ~id is the lowest id of the largest magnitude (dense_sum's is_max
    * test, not run for probabilities), kept in DA_ARG (dense_mark reads its low 32 bits) */
    u64 pm = 0;
    auto pb = [&](int v0, const float* xs, auto NN, bool ok) {
      constexpr int n = decltype(NN)::n;
      if (!ok) return;
#pragma unroll
      for (int e = 0; e < n; ++e) {
        const u32 b = __float_as_uint(xs[e]), mag = b & 0x7FFFFFFFu;
        if (!(b - 1u < 0x7F7FFFFFu || mag == 0) && nb == 0)
          nb = ~(((u64)(v0 + e) << 8) | (u64)dy_weight_bits_status(b));
        const u64 key = ((u64)mag << 32) | (u64)(u32)~(u32)(v0 + e);
        pm = key > pm ? key : pm;
      }
    };
    float4 pre4[4];
    dense_first<4, 1>(pre4, x, xoff, lo, hi, vec);
    dense_tile<4>(x, xdt, xoff, lo, hi, vec, pre4, pb);
    mk = pm;
  }
  mk = block_reduce64(mk, 1, sh);
  nb = block_reduce64(nb, 1, sh);
  if (threadIdx.x == 0) {
    if (logits) atomicMax(&st[DA_MK], mk);
    else { atomicMax(&st[DA_MK], (mk >> 32) + 1); atomicMax(&st[DA_ARG], mk); }
    if (nb) atomicMax(&st[DA_BAD], nb);
  }
}

extern "C" __global__ void __launch_bounds__(256, 4) dense_sum(
    const void* x, int xdt, const void* bias, int bdt, int bias_rows, const double* temp,
    int logits, int greedy_ok, int V, int dt, int vec, u64* state, int nrows) {
  __shared__ DcShared sh;
  const int row = dc_grid_row();
  if (row >= nrows) return;
  float4 pre[2];  /* the first batch of the tile, in flight while the row state is read */
  dense_first<2, 1>(pre, x, (i64)row * V, blockIdx.x * dt, min(V, (int)blockIdx.x * dt + dt), vec);
  u64* st = state + (i64)row * DA_RS;
  if (da_code(st, logits)) return;
  bool greedy; const double T = row_temp(temp, row, greedy_ok, &greedy);
  const i64 xoff = (i64)row * V, boff = bias_rows > 1 ? xoff : 0;
  const u64 mk = st[DA_MK];
  const int lo = blockIdx.x * dt, hi = min(V, lo + dt);
  u64 S = 0, na = 0;
  da_kind(logits, mk, bias, bdt, boff, T, [&](auto W) {
    dense_tile<2>(x, xdt, xoff, lo, hi, vec, pre, [&](int v0, const float* xs, auto NN, bool ok) {
      constexpr int n = decltype(NN)::n;
      if (!ok) return;
#pragma unroll
      for (int e = 0; e < n; ++e) {
        if (!W.arg_in_max() && na == 0 && W.is_max(xs[e], v0 + e)) na = ~(u64)(v0 + e);
        if (!greedy) S += W(xs[e], v0 + e);
      }
    });
  });
  na = block_reduce64(na, 1, sh);
  S = block_reduce64(S, 0, sh);
  if (threadIdx.x == 0) { if (na) atomicMax(&st[DA_ARG], na); if (!greedy) atomicAdd(&st[DA_S], S); }
}

/* the floor stage (this file's header), with the pipelined tile loop */
extern "C" __global__ void __launch_bounds__(256, 4) dense_floor(
    const void* x, int xdt, const void* bias, int bdt, int bias_rows, const double* temp,
    int logits, int greedy_ok, int V, int dt, int vec, int policy, u32* __restrict__ fine,
    u64* state, int nrows) {
  __shared__ DcShared sh;
  __shared__ u32 hs[DA_NB];
  __shared__ u32 f8[8];
  __shared__ int sbin, sneed, scnt;
  const int row = dc_grid_row(), tid = threadIdx.x;
  if (row >= nrows) return;
  float4 pre[2];  /* the first batch of the tile, in flight while the row state is read */
  dense_first<2, 1>(pre, x, (i64)row * V, blockIdx.x * dt, min(V, (int)blockIdx.x * dt + dt), vec);
  u64* st = state + (i64)row * DA_RS;
  if (da_code(st, logits)) return;
  bool greedy; const double T = row_temp(temp, row, greedy_ok, &greedy);
  if (greedy) return;
  const i64 xoff = (i64)row * V, boff = bias_rows > 1 ? xoff : 0;
  const DaRow R = da_row(st, logits);
  if (R.S == 0) return;
  const int lo = blockIdx.x * dt, hi = min(V, lo + dt);
  const bool hist = policy == 0;
  for (int j = tid; j < DA_NB; j += 256) hs[j] = 0;
  __syncthreads();
  u32 sbt = 0;
  da_kind(logits, R.mk, bias, bdt, boff, T, [&](auto W) {
    dense_tile<2>(x, xdt, xoff, lo, hi, vec, pre, [&](int v0, const float* xs, auto NN, bool ok) {
      constexpr int n = decltype(NN)::n;
      if (!ok) return;
#pragma unroll
      for (int e = 0; e < n; ++e) {
        u64 r;
        sbt += da_div(R, W(xs[e], v0 + e), &r);
        if (hist) {
          atomicAdd(&hs[(u32)(r >> R.dlo)], 1u);
        }
      }
    });
  });
  const u64 sb = block_reduce64(sbt, 0, sh);
  if (tid == 0) atomicAdd(&st[DA_SB], sb);
  u32* gh = (u32*)(st + 16);
  const int ntiles = (int)gridDim.x;
  if (hist) {
    u32* fb = fine + ((i64)row * ntiles + blockIdx.x) * DA_NB;
    for (int j = tid; j < DA_NB; j += 256) fb[j] = hs[j];
    u32 cs = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) cs += hs[8 * tid + k];
    if (cs) atomicAdd(&gh[tid], cs);
  }
  if (!da_last(st, DA_C1)) return;
  /* ---- last block of the row ---- */
  const i64 remaining = (i64)DY_TOTAL - (i64)__ldcg(&st[DA_SB]);
  int kind, code = 0;
  if (remaining < 0 || remaining >= (i64)DY_TOTAL) { kind = DA_K_ERR; code = DY_ST_ALLOC_INCONSISTENT; }
  else if (remaining == 0 || !hist) kind = DA_K_FLOOR;
  else kind = DA_K_CAND;
  if (kind == DA_K_CAND) {
    const int need = (int)remaining;
    const int cb = DA_NC - 1 - tid;
    const int c = (int)__ldcg(&gh[cb]);
    if (tid == 0) sbin = -1;
    if (tid < 8) f8[tid] = 0;
    int tot; const int exc = block_excl_scan(c, &tot, sh);
    if (exc < need && need <= exc + c) { sbin = cb; sneed = need - exc; }
    __syncthreads();
    const int cbin = sbin, needc = sneed;
    if (cbin >= 0) {
      for (int i = tid; i < 8 * ntiles; i += 256)
        atomicAdd(&f8[i & 7], __ldcg(&fine[((i64)row * ntiles + (i >> 3)) * DA_NB + 8 * cbin + (i & 7)]));
      __syncthreads();
      if (tid == 0) {
        int cum = 0;
        sbin = -1;
        for (int k = 7; k >= 0; --k) {
          if (cum < needc && needc <= cum + (int)f8[k]) { sbin = 8 * cbin + k; sneed = needc - cum; scnt = (int)f8[k]; break; }
          cum += (int)f8[k];
        }
      }
    }
    __syncthreads();
    if (sbin < 0) { kind = DA_K_ERR; code = DY_ST_ALLOC_INCONSISTENT; }
    else if (sneed == scnt) kind = DA_K_ALL;
    else if (scnt > DA_CAP) kind = DA_K_FALL;
  }
  if (hist) gh[tid] = 0;
  if (tid == 0) {
    st[DA_KIND] = (u64)kind;
    st[DA_CODE] = (u64)code;
    st[DA_REM] = remaining > 0 ? (u64)remaining : 0;
    if (kind >= DA_K_ALL) { st[DA_BIN] = (u64)sbin; st[DA_NEED] = (u64)sneed; st[DA_CNT] = (u64)scnt; }
  }
}

/* the mark stage's last-block work (the bin's +1 by da_pick / da_fallback), out of line */
static __device__ __noinline__ void dense_mark_tail(
    const void* x, int xdt, const void* bias, int bdt, i64 boff, double T, int logits, int V,
    i64 xoff, int kind, u64* st, const u64* cr, const u32* ci, u32* crow, DcShared& sh) {
  __shared__ u64 skr[DA_CAP];
  __shared__ u32 skid[DA_CAP];
  const int tid = threadIdx.x;
  const DaRow R = da_row(st, logits);
  const u32 bin = (u32)st[DA_BIN];
  if (kind == DA_K_CAND) {
    const int C = (int)min(__ldcg(&st[DA_SLOT]), (u64)DA_CAP);
    for (int i = tid; i < C; i += 256) { skr[i] = __ldcg(&cr[i]); skid[i] = __ldcg(&ci[i]); }
    __syncthreads();
    da_pick([&](int i) { return skr[i]; }, [&](int i) { return skid[i]; }, C, (int)st[DA_NEED],
            R.dlo, crow, sh);
  } else {
    da_fallback(x, xdt, bias, bdt, boff, T, logits, V, xoff, R, bin, (int)st[DA_NEED],
                __ldcg(&st[DA_RMAX]) == ~__ldcg(&st[DA_RMINI]), crow, sh);
  }
}

/* counts of [v0, v0 + n): evict-first stores (uint4 when aligned) */
template <int n>
DC_FN void dense_store(u32* crow, int v0, const u32* c, int cvec) {
  if (n == 4 && cvec) __stcs((uint4*)&crow[v0], make_uint4(c[0], c[n > 1 ? 1 : 0], c[n > 2 ? 2 : 0], c[n > 3 ? 3 : 0]));
  else {
#pragma unroll
    for (int e = 0; e < n; ++e) __stcs(&crow[v0 + e], c[e]);
  }
}

/* the mark stage (this file's header); the loop specialised per row kind */
extern "C" __global__ void __launch_bounds__(256, 4) dense_mark(
    const void* x, int xdt, const void* bias, int bdt, int bias_rows, const double* temp,
    int logits, int greedy_ok, int V, int dt, int vec, int policy, u64* state,
    u64* __restrict__ cand_r, u32* __restrict__ cand_i, u32* __restrict__ counts, int cvec,
    int* status, int nrows) {
  __shared__ DcShared sh;
  const int row = dc_grid_row(), tid = threadIdx.x, lane = tid & 31;
  if (row >= nrows) return;
  float4 pre[2];  /* the first batch of the tile, in flight while the row state is read */
  dense_first<2, 2>(pre, x, (i64)row * V, blockIdx.x * dt, min(V, (int)blockIdx.x * dt + dt), vec);
  u64* st = state + (i64)row * DA_RS;
  const i64 xoff = (i64)row * V, boff = bias_rows > 1 ? xoff : 0;
  u32* crow = counts + xoff;
  u64* cr = cand_r + (i64)row * DA_CAP;
  u32* ci = cand_i + (i64)row * DA_CAP;
  const int lo = blockIdx.x * dt, hi = min(V, lo + dt);
  bool greedy; const double T = row_temp(temp, row, greedy_ok, &greedy);
  int code = da_code(st, logits);
  const int kind = code ? 0 : (int)st[DA_KIND];
  if (!code && kind == DA_K_ERR) code = (int)st[DA_CODE];
  const int argmax = (int)~st[DA_ARG];
  const DaRow R = da_row(st, logits);
  if (!code && !greedy && (kind < DA_K_ERR || kind > DA_K_FALL))
    code = R.S == 0 ? DY_ST_X_ZERO_MASS : DY_ST_ALLOC_INCONSISTENT;
  const u32 bin = (u32)st[DA_BIN];
  const u64 rbase = (u64)bin << R.dlo;
  if (code || greedy) {
    const u32 one = code ? 0u : DY_TOTAL;
    for (int v = lo + tid; v < hi; v += 256) __stcs(&crow[v], v == argmax ? one : 0u);
  } else if (kind == DA_K_CAND) {
    /* q + [d > bin]; the bin's elements appended (warp-aggregated slot).  The common
     * path keeps one bit per element (d == bin) and votes once per group; the append
     * (ballot, slot, r computed again) runs only for the groups where some lane of the
     * warp has such an element (faster on the H200 at B = 64 than a ballot per element;
     * ptxas reports spill stores for this kernel). */
    const u32 thr = bin + 1;
    da_kind(logits, R.mk, bias, bdt, boff, T, [&](auto W) {
      dense_tile<2, 2>(x, xdt, xoff, lo, hi, vec, pre, [&](int v0, const float* xs, auto NN, bool ok) {
        constexpr int n = decltype(NN)::n;
        u32 c[n];
        u32 inbin = 0;
#pragma unroll
        for (int e = 0; e < n; ++e) {
          u64 r;
          const u32 q = da_div(R, W(xs[e], ok ? v0 + e : lo), &r);  /* no bias read past hi */
          const u32 d = (u32)(r >> R.dlo);
          c[e] = q + (d >= thr ? 1u : 0u);
          inbin |= (ok && d == bin ? 1u : 0u) << e;
        }
        if (__any_sync(0xffffffffu, inbin)) {
#pragma unroll
          for (int e = 0; e < n; ++e) {
            const bool is = (inbin >> e) & 1u;
            const unsigned bal = __ballot_sync(0xffffffffu, is);
            if (!bal) continue;
            const int leader = __ffs(bal) - 1;
            u32 base = 0;
            if (lane == leader) base = (u32)atomicAdd(&st[DA_SLOT], (u64)__popc(bal));
            base = __shfl_sync(0xffffffffu, base, leader);
            if (is) {
              const int v = v0 + e;
              u64 r;
              da_div(R, W(xs[e], v), &r);
              const u32 p = base + (u32)__popc(bal & ((1u << lane) - 1u));
              if (p < DA_CAP) { cr[p] = r - rbase; ci[p] = (u32)v; }
            }
          }
        }
        if (ok) dense_store<n>(crow, v0, c, cvec);
      });
    });
  } else if (kind == DA_K_FALL) {
    /* q + [d > bin]; the range of r over the bin's elements */
    const u32 thr = bin + 1;
    u64 rmax = 0, rmin = ~0ull;
    da_kind(logits, R.mk, bias, bdt, boff, T, [&](auto W) {
      dense_tile<2, 2>(x, xdt, xoff, lo, hi, vec, pre, [&](int v0, const float* xs, auto NN, bool ok) {
        constexpr int n = decltype(NN)::n;
        if (!ok) return;
        u32 c[n];
#pragma unroll
        for (int e = 0; e < n; ++e) {
          u64 r;
          const u32 q = da_div(R, W(xs[e], v0 + e), &r);
          const u32 d = (u32)(r >> R.dlo);
          c[e] = q + (d >= thr ? 1u : 0u);
          if (d == bin) { rmax = r > rmax ? r : rmax; rmin = r < rmin ? r : rmin; }
        }
        dense_store<n>(crow, v0, c, cvec);
      });
    });
    rmax = block_reduce64(rmax, 1, sh);
    rmin = block_reduce64(rmin, 2, sh);
    if (tid == 0) { atomicMax(&st[DA_RMAX], rmax); atomicMax(&st[DA_RMINI], ~rmin); }
  } else {
    /* FLOOR: q (+ remaining at the argmax); ALL: q + [d >= bin] */
    const u32 thr = kind == DA_K_FLOOR ? 0xFFFFFFFFu : bin;
    const u32 radd = kind == DA_K_FLOOR ? (u32)st[DA_REM] : 0u;
    da_kind(logits, R.mk, bias, bdt, boff, T, [&](auto W) {
      dense_tile<2, 2>(x, xdt, xoff, lo, hi, vec, pre, [&](int v0, const float* xs, auto NN, bool ok) {
        constexpr int n = decltype(NN)::n;
        if (!ok) return;
        u32 c[n];
#pragma unroll
        for (int e = 0; e < n; ++e) {
          const int v = v0 + e;
          u64 r;
          const u32 q = da_div(R, W(xs[e], v), &r);
          const u32 d = (u32)(r >> R.dlo);
          c[e] = q + (d >= thr ? 1u : 0u) + (v == argmax ? radd : 0u);
        }
        dense_store<n>(crow, v0, c, cvec);
      });
    });
  }
  if (!da_last(st, DA_C2)) return;
  /* ---- last block of the row: the bin's +1, status, state reset ---- */
  if (tid == 0) status[row] = code;
  if (!code && !greedy && (kind == DA_K_CAND || kind == DA_K_FALL))
    dense_mark_tail(x, xdt, bias, bdt, boff, T, logits, V, xoff, kind, st, cr, ci, crow, sh);
  __syncthreads();
  if (tid < 16) st[tid] = 0;
}

