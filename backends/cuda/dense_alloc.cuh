/* ========================================================================
 * Dense allocate / propose in four launches: the state, arithmetic and
 * selection shared by the kernels da2_max, da2_sum, da2_floor, da2_mark
 * (dense_alloc2.cuh; DYADIC_CUDA_DENSE=mb keeps the dd_* kernels, =old
 * dc_dense).  Included at the end of dyadic_kernels.cu.
 *
 * Grid (ntiles, B), tile `dt` elements (a multiple of 1024), 256 threads.
 * Every stage recomputes the keys / weights from x (x is 33 MB at the
 * benchmark shape and mostly stays in L2); there is no [B, V] scratch.
 * Per-row state `st` (DA_RS u64 words) is ZERO between calls: the blocks only
 * add / max into it and the last block of da2_mark zeroes it (da2_floor's last
 * block zeroes the coarse histogram).  No memset, no host sync, graph-replayable.
 *
 *   da2_max:   row max key (atomicMax), first bad element (atomicMax of ~packed);
 *             probabilities: also the argmax (atomicMax of mag << 32 | ~id)
 *   da2_sum:   logits: argmax (atomicMax of ~id); S = sum of weights (atomicAdd)
 *   da2_floor: q_v = floor(2^24 w_v / S), r_v = 2^24 w_v - q_v S; sum of q_v;
 *             histogram of the digit d_v = r_v >> dlo (DA_NB = 2048 bins) in
 *             shared memory; the tile's fine histogram is stored (plain
 *             stores, fine[row][tile]), its 256 coarse bins (d >> 3) are added
 *             to the row's global coarse histogram (atomics).  The last block
 *             of the row (atomic counter after a release fence, dc_elect_last) computes
 *             remaining = 2^24 - sum q, the status, the coarse boundary bin,
 *             then sums that bin's 8 fine bins over the tiles: the boundary
 *             bin `bin` and need2 = how many of it are still to be taken
 *   da2_mark:  counts_v = q_v + [d_v > bin] (+[d_v == bin] when the whole bin
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
 *  - Inside the bin (C = #{d == bin} candidates, known before da2_mark):
 *    C <= DA_RANK: rank counting (rank = #{better by (r desc, id asc)});
 *    C <= DA_CAP:  radix select on r (block_select), then the need_eq lowest
 *                  ids among the r == tau ones (block_select on ~id: distinct);
 *    C >  DA_CAP:  fallback, decided on the device (da_fallback): the last
 *                  block alone sweeps the row, recomputing r from x.  When
 *                  every r of the bin is equal (min == max, gathered by
 *                  da2_mark: equal or two-valued weights) the need2 lowest ids
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
/* kinds (set by da2_floor's last block; 0: the row was not run there) */
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

/* status code of the row after da2_max (0 = fine) */
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
  /* the row's argmax comes from da2_max (packed with the magnitude), not from da2_sum */
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
  __device__ __forceinline__ bool arg_in_max() const { return false; }  /* da2_sum finds it */
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
 * (noinline: its registers do not weigh on da2_mark's main loop). */
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

