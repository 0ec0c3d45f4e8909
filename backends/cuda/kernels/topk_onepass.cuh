/* Fast top-k allocate / propose for K <= 32.
 *
 * One launch of topk_onepass (here) or topk_onepass_wide (topk_onepass_wide.cuh), grid (R, B),
 * PK_NT threads: block r of row b takes the ids [r * chunk, min(V, (r + 1) *
 * chunk)) and writes its candidates; the last block of a row (pk_elect_last)
 * merges them, allocates 2**24 tickets and draws in one warp (pk2_last).  No
 * block waits for another.
 *
 * Exactness.  Every block selects the K best of its ids by (key desc, id
 * asc), where key is the exact ranking key of topk_select (dy_order_key(z) for
 * logits, mag + 1 for probabilities), so the result equals topk_select bit for
 * bit.  The selection (pk_select) never ranks all elements:
 *  1. each thread loads its PK_EPT elements in one batch and keeps their
 *     "coarse keys" in registers, with its largest and second largest.  The
 *     coarse key is in the same strict order as the exact key: for logits
 *     without bias and 2**-700 <= T <= 2**800 it is the float order key of x
 *     (x -> x / T is then strictly increasing, see pk_fast_row), otherwise it is
 *     the exact key itself;
 *  2. t = pk_bound: a value with at least K per-thread maxima >= t, from the
 *     warps' bitonic-sorted maxima (no block-wide select); the K best all
 *     have coarse >= t;
 *  3. survivors (coarse >= t; a thread whose second largest is < t has at
 *     most its maximum) are compacted into shared memory by a block scan and
 *     ranked by counting (key desc, id asc), G lanes per survivor; the K best
 *     are written in rank order.  When more than PK_SMAX survive (masses of
 *     ties) the exact radix select of common.cuh over all elements
 *     (ties: lowest index = lowest id) picks the K best instead.
 * The merge in the last block runs pk_select over the candidates (see topk_onepass
 * for their layout and keys).
 * The tail (weights, floor, largest remainders or floor-first, compaction
 * in id order, the draw) is the same integer arithmetic as topk_select, one
 * support entry per lane of warp 0. */
#ifndef DYADIC_KERNELS_TOPK_ONEPASS_CUH
#define DYADIC_KERNELS_TOPK_ONEPASS_CUH

#define PK_NT 512
#define PK_SMAX 1024
#define PK_KMAX 32
#define PK_EPT 8  /* elements per thread: a block takes PK_NT * PK_EPT ids */

/* -DDC_PROF: %globaltimer stamps of row 0 (block 0, then the last block) in dc_prof */
#ifdef DC_PROF
#define PK_STAMP(i) do { if (pk_prof >= 0 && threadIdx.x == 0) dc_prof[(i) + pk_prof] = dc_now(); } while (0)
/* clock64 cycles of the tail's steps (row 0), kept in registers, written at its end */
#define PK_CLK_DECL u64 pk_ck[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#define PK_CLK(i) do { if (pk_prof >= 0) pk_ck[i] = clock64(); } while (0)
#define PK_CLK_PUT() do { if (pk_prof >= 0 && threadIdx.x == 0) \
    for (int i_ = 1; i_ < 8; ++i_) dc_prof[64 + i_] = pk_ck[i_] - pk_ck[0]; } while (0)
#else
#define PK_STAMP(i) do { } while (0)
#define PK_CLK_DECL
#define PK_CLK(i) do { } while (0)
#define PK_CLK_PUT() do { } while (0)
#endif

struct PkShared {
  u64 sk[PK_SMAX];
  u64 sc[PK_SMAX];
  int si[PK_SMAX];
  u64 prefix;  /* pk_bound's result */
  u64 wb[PK_NT / 32];
  u64 bad;
  int is_last;
  int nsurv;
};

/* float order key of a float (-0.0 == +0.0); monotone in the float's value */
DC_FN u32 pk_fkey(float f) { return dc_fkey(__float_as_uint(f)); }

/* The row's RNG key fields (do_draw; warp 0 only: the tail's warp), issued
 * before the last block's merge so that the loads overlap it. */
DC_FN DcKey pk_key(int do_draw, const void* kseed, const void* kgen, const void* krnd,
                   const void* kpos, int kfmt, int row) {
  DcKey kk; kk.seed = 0; kk.gen = kk.rnd = kk.pos = 0;
  if (do_draw && threadIdx.x < 32) kk = load_key(kseed, kgen, krnd, kpos, kfmt, row);
  return kk;
}

/* The float whose pk_fkey is k (-0.0 comes back as +0.0: the same exact key). */
DC_FN float pk_fval(u32 k) { return __uint_as_float(dc_fkey_bits(k)); }

/* L1 prefetch of the exponential table (4 x 256 u64, 64 lines of 128 B) that
 * the tail's weights read, issued as the last block starts so its latency
 * overlaps the merge. */
DC_FN void pk_prefetch_exp_table() {
  if (threadIdx.x < 64)
    asm volatile("prefetch.global.L1 [%0];" :: "l"(&dy_exp2_neg_q62_table[0][0] + 16 * threadIdx.x));
}

/* Descending bitonic sort of one value per lane of a warp (T: u32 or u64; the
 * narrow keys of topk_onepass_wide / topk_onepass_packed8k sort as u32, half the shuffles): lane j gets
 * the j-th largest (0-based). */
template <class T>
DC_FN T pk_warp_sort_desc(T v) {
  const int lane = threadIdx.x & 31;
  for (int k = 2; k <= 32; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      const T o = __shfl_xor_sync(0xffffffffu, v, j);
      /* in a descending run (lane & k) == 0 the lower lane keeps the larger */
      const bool lower = (lane & j) == 0;
      const bool desc = (lane & k) == 0;
      const bool keep_max = lower == desc;
      v = keep_max ? (o > v ? o : v) : (o < v ? o : v);
    }
  }
  return v;
}

/* A value t with at least kk per-thread maxima >= t (1 <= kk <= 64), from
 * the warps' sorted maxima: with j = ceil(kk / 8) and m = ceil(kk / j) <= 8,
 * t = the m-th largest of the 16 warps' j-th largest values; each of those m
 * warps has >= j maxima >= t, so >= m * j >= kk in all.  (j, m) = (4, 8) for
 * kk = 32 puts t near the 12% quantile of the maxima, about 2x kk above it;
 * (2, 16), the plain minimum, sits near 15%.  t = 0 when too few elements. */
template <class T>
DC_FN T pk_bound(T v, int kk, PkShared& ps) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int j = (kk + 7) / 8, m = (kk + j - 1) / j;
  const T s = pk_warp_sort_desc(v);
  if (lane == j - 1) ps.wb[w] = s;
  __syncthreads();
  if (threadIdx.x < PK_NT / 32) {
    const u64 x = ps.wb[threadIdx.x];
    int gt = 0, ge = 0;
#pragma unroll
    for (int i = 0; i < PK_NT / 32; ++i) { const u64 y = ps.wb[i]; gt += y > x; ge += y >= x; }
    if (gt < m && m <= ge) ps.prefix = x;  /* the m-th largest (every writer agrees) */
  }
  __syncthreads();
  const u64 t = ps.prefix;
  __syncthreads();
  return t;
}

/* Lanes per element where the PK_NT threads rank S elements by counting: the largest
 * power of two G <= 32 with G * S <= PK_NT (1 for S > PK_NT / 2); groups of G lanes are
 * aligned (pk_rank_emit, pp_rank_emit). */
DC_FN int pk_rank_lanes(int S) {
  int G = 1;
  while (G < 32 && G * 2 * S <= PK_NT) G <<= 1;
  return G;
}

/* The S (<= PK_SMAX) survivors in ps (sk exact key, si id, sc coarse key) ranked by
 * counting (key desc, id asc), G lanes per survivor (pk_rank_lanes); out(rank, key, id,
 * coarse) for rank < kk.  Ends with a barrier. */
template <class OUT>
DC_FN void pk_rank_emit(int S, int kk, OUT out, PkShared& ps) {
  const int tid = threadIdx.x, G = pk_rank_lanes(S);
  for (int a0 = 0; a0 < S; a0 += PK_NT / G) {
    const int a = a0 + tid / G, part = tid & (G - 1);
    const bool live = a < S;
    const u64 ka = live ? ps.sk[a] : 0; const int ia = live ? ps.si[a] : 0;
    int rank = 0;
    if (live)
      for (int b = part; b < S; b += G) {
        const u64 kb = ps.sk[b];
        rank += kb > ka || (kb == ka && ps.si[b] < ia);
      }
    for (int o = 1; o < G; o <<= 1) rank += __shfl_xor_sync(0xffffffffu, rank, o);
    if (live && part == 0 && rank < kk) out(rank, ka, ia, ps.sc[a]);
  }
  __syncthreads();
}

/* The K best of the block's elements by (exact key desc, id asc); emits
 * out(rank, key, id, coarse) for rank < min(K, n).  Element q of thread t is
 * index i = q * PK_NT + t (valid when i < n), its coarse key c[q] (held in
 * registers: no reloads) is in the same strict order as its exact key
 * exact(q) (equal iff equal); id(q) its id.  Ids increase with the index i
 * among equal keys.  at(i) / coarse_at(i) / id_at(i): exact key, coarse key
 * and id by index, used only by the fallback (more than PK_SMAX survivors). */
template <int EPT, class KT, class IX, class E, class I, class EA, class CA, class IA, class OUT,
          class OUTD>
DC_FN int pk_select_map(const KT (&c)[EPT], IX ix, E exact, I id, EA at, CA coarse_at, IA id_at,
                        int n, int K, int etop, OUT out, PkShared& ps, DcShared& sh, int pk_prof,
                        int direct_cap, OUTD out_direct) {
  const int tid = threadIdx.x;
  /* the thread's largest coarse key (first index) and its second largest (in KT: t,
   * one of the maxima or 0, fits it too) */
  KT m1 = 0, m2 = 0; bool any = false;
#pragma unroll
  for (int q = 0; q < EPT; ++q) {
    const bool in = ix(q) < n;
    const KT v = in ? c[q] : 0;
    any |= in;
    if (v > m1) { m2 = m1; m1 = v; } else if (v > m2) m2 = v;
  }
  PK_STAMP(1);
  const int kk = K < n ? K : n;
  /* t: at least kk elements have coarse >= t (pk_bound), so the kk best all do */
  const KT t = (KT)pk_bound(m1, kk, ps);
  PK_STAMP(2);
  /* survivors: coarse >= t (valid elements only) */
  int cnt = 0;
  if (any && m1 >= t) {
    if (m2 >= t) {
#pragma unroll
      for (int q = 0; q < EPT; ++q) cnt += ix(q) < n && c[q] >= t;
    } else {
      cnt = 1;
    }
  }
  int S; int pos = block_excl_scan(cnt, &S, sh);
  if (S <= direct_cap) {
    /* topk_onepass: the survivors unranked (slot order = thread order) */
    if (cnt) {
#pragma unroll
      for (int q = 0; q < EPT; ++q)
        if (ix(q) < n && c[q] >= t) out_direct(pos++, c[q], id(q));
    }
    return S;
  }
  if (S <= PK_SMAX) {
    /* (m2 < t: exactly the maximum's element has coarse >= t) */
    if (cnt) {
#pragma unroll
      for (int q = 0; q < EPT; ++q)
        if (ix(q) < n && c[q] >= t) { ps.sk[pos] = exact(q); ps.sc[pos] = c[q]; ps.si[pos] = id(q); ++pos; }
    }
  } else {
    DcSel s = block_select(at, n, kk, sh, etop);
    S = block_compact([&](int i) { return sel_has(s, at(i), i); },
                      [&](int i, int r) { ps.sk[r] = at(i); ps.sc[r] = coarse_at(i); ps.si[r] = id_at(i); },
                      n, sh);
  }
  __syncthreads();
  PK_STAMP(3);
  pk_rank_emit(S, kk, out, ps);
  return -1;
}

/* pk_select over PK_EPT keys per thread at index q * PK_NT + tid (topk_onepass, pk2_last) */
template <class E, class I, class EA, class CA, class IA, class OUT, class OUTD>
DC_FN int pk_select(const u64 (&c)[PK_EPT], E exact, I id, EA at, CA coarse_at, IA id_at, int n,
                    int K, int etop, OUT out, PkShared& ps, DcShared& sh, int pk_prof,
                    int direct_cap, OUTD out_direct) {
  return pk_select_map(c, [](int q) { return q * PK_NT + (int)threadIdx.x; }, exact, id, at,
                       coarse_at, id_at, n, K, etop, out, ps, sh, pk_prof, direct_cap, out_direct);
}

/* The tile's elements i = q * PK_NT + tid < n (ids lo + i): one batch of
 * loads, then their coarse keys in registers (float order keys when fast, else
 * the exact keys).  Returns the thread's first bad element as (id << 8) |
 * status (ids increase with q), NONE_BAD if none.  NaN / +inf by bits (no f32
 * compares: see dc_f2d). */
DC_FN u64 pk_load_keys(const void* x, int xdt, i64 xoff, int lo, int n, bool fast,
                       const void* bias, int bdt, i64 boff, double T, int logits,
                       float (&xf)[PK_EPT], u64 (&c)[PK_EPT]) {
  const int tid = threadIdx.x;
#pragma unroll
  for (int q = 0; q < PK_EPT; ++q) {
    const int i = q * PK_NT + tid;
    xf[q] = i < n ? load_f(x, xdt, xoff + lo + i) : __uint_as_float(0u);
  }
  u64 mybad = NONE_BAD;
#pragma unroll
  for (int q = 0; q < PK_EPT; ++q) {
    const int i = q * PK_NT + tid;
    int bad = 0; u64 k = 0;
    if (i < n) {
      if (fast) {
        const u32 fb = __float_as_uint(xf[q]);
        bad = (fb & 0x7FFFFFFFu) > 0x7F800000u ? DY_ST_X_NAN : (fb == 0x7F800000u ? DY_ST_X_POSINF : 0);
        k = pk_fkey(xf[q]);
      } else {
        k = rank_key(xf[q], bias, bdt, boff + lo + i, T, logits, &bad);
      }
      if (bad && mybad == NONE_BAD) mybad = ((u64)(lo + i) << 8) | (u64)bad;
    }
    c[q] = k;
  }
  return mybad;
}

/* The tail, one warp: lane j < K holds the support entry of rank j (exact key
 * desc, id asc) as (key, id); lanes >= K hold (0, 0x7FFFFFFF).  Weights, the
 * filters' kept prefix of the ranking (f.on: dy_filter_prefix; the entries after it
 * weigh 0), floor, largest remainders (ties: lowest id) or floor-first, the nonzero
 * entries in id order, the draw: the integer arithmetic of topk_select.  kk: the
 * row's RNG key (pk_key: loaded before the merge, so its latency overlaps it). */
DC_FN void pk_tail(int row, int K, u64 key, int id, int logits, bool greedy, int policy,
                   int do_draw, const DcKey& kk, const DcFilt& f, int* tokens, u32* counts,
                   int* ids, int* status, int pk_prof) {
  const int lane = threadIdx.x & 31;
  const bool act = lane < K;
  const u64 mk = __shfl_sync(0xffffffffu, key, 0);
  const int argmax = __shfl_sync(0xffffffffu, id, 0);
  const int W = K;
  u32* crow = counts + (i64)row * W;
  int* irow = ids + (i64)row * W;
  if ((logits && mk == DC_KEY_NEG_INF) || (!logits && mk == 1)) {
    fail_sparse(row, W, DY_ST_X_ZERO_MASS, do_draw ? tokens : 0, counts, ids, status);
    return;
  }
  if (greedy) {
    for (int j = lane; j < W; j += 32) { crow[j] = j ? 0u : DY_TOTAL; irow[j] = j ? -1 : argmax; }
    if (lane == 0) { status[row] = 0; if (do_draw) tokens[row] = argmax; }
    return;
  }
  PK_CLK_DECL
  PK_CLK(0);
  const u32 x0 = do_draw ? key_ticket(kk) : 0u;  /* independent of the rest: overlaps it */
  /* The loops over the 32 entries read them from shared memory (broadcast, 16 bytes per
   * load): far fewer cycles than 32 shuffles per loop.
   * Only warp 0 of a block runs the tail. */
  __shared__ __align__(16) int tl_i[32];  /* ids, then (count << 5 | position) */
  __shared__ __align__(16) u64 tl_u[32];  /* ranking keys of the remainders */
  /* position in id order */
  tl_i[lane] = id;
  __syncwarp();
  int pos = 0;
#pragma unroll
  for (int i = 0; i < 32; i += 4) {
    const int4 q = *(const int4*)&tl_i[i];
    pos += (i < K && q.x < id) + (i + 1 < K && q.y < id) + (i + 2 < K && q.z < id) + (i + 3 < K && q.w < id);
  }
  __syncwarp();  /* tl_i is rewritten below */
  PK_CLK(1);
  u64 w = act ? weight_of_key(key, mk, logits) : 0;
  if (f.on) {  /* the weights in rank order (lane = rank), the kept prefix */
    tl_u[lane] = w;
    __syncwarp();
    int keep = 0;
    if (lane == 0)
      keep = (int)dy_filter_prefix((const uint64_t*)tl_u, (uint32_t)K, f.topk, f.topp, f.minp);
    keep = __shfl_sync(0xffffffffu, keep, 0);
    __syncwarp();  /* tl_u is rewritten below */
    if (lane >= keep) w = 0;
  }
  const u64 S = warp_sum64(w);
  PK_CLK(2);
  const u64 m = (u64)DY_TOTAL * w;
  u64 c = m / S;
  const u64 rem = m - c * S;
  const i64 remaining = (i64)DY_TOTAL - (i64)warp_sum64(c);
  PK_CLK(3);
  if (remaining < 0 || remaining >= (i64)DY_TOTAL) {
    fail_sparse(row, W, DY_ST_ALLOC_INCONSISTENT, do_draw ? tokens : 0, counts, ids, status);
    return;
  }
  if (remaining > 0) {
    if (policy == 0) {
      /* rank of (rem desc, pos asc) as one u64: rem < S <= 32 * 2**39, pos < 32 */
      const u64 rk = (rem << 5) | (u64)(31 - pos);
      tl_u[lane] = rk;
      __syncwarp();
      int rank = 0;
#pragma unroll
      for (int i = 0; i < 32; i += 2) {
        const ulonglong2 r2 = *(const ulonglong2*)&tl_u[i];
        rank += (i < K && r2.x > rk) + (i + 1 < K && r2.y > rk);
      }
      __syncwarp();
      if (act && rank < (int)remaining) c += 1;
    } else if (act && id == argmax) {
      c += (u64)remaining;
    }
  }
  PK_CLK(4);
  /* nonzero entries in id order, then zeros / -1 */
  const bool nzj = act && c != 0;
  tl_i[lane] = (int)(((u32)(act ? c : 0) << 5) | (u32)pos);  /* c <= 2**24, pos < 32 */
  __syncwarp();
  int outi = 0, nz = 0; u32 cum = 0;
#pragma unroll
  for (int i = 0; i < 32; i += 4) {
    const uint4 q = *(const uint4*)&tl_i[i];
    const u32 e[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const u32 cv = e[u] >> 5, pi = e[u] & 31u;
      nz += cv != 0;
      outi += cv != 0 && (int)pi < pos;
      cum += (int)pi <= pos ? cv : 0u;  /* <= 2**24 */
    }
  }
  if (nzj) { crow[outi] = (u32)c; irow[outi] = id; }
  PK_CLK(5);
  for (int j = nz + lane; j < W; j += 32) { crow[j] = 0; irow[j] = -1; }
  if (do_draw) {
    /* the first entry in id order whose running count exceeds x0: min of (pos, id) */
    const u64 best = warp_min64(nzj && cum > x0 ? ((u64)pos << 32) | (u32)id : ~0ull);
    if (lane == 0) tokens[row] = best == ~0ull ? -1 : (int)(u32)best;
  }
  if (lane == 0) status[row] = 0;
  PK_CLK(6);
  PK_CLK_PUT();
}

/* Whether a row's coarse keys are float order keys of x (pk_fkey): logits without
 * bias where x -> z = x / T is strictly increasing (-0.0 == +0.0): 2**-700 <= T <=
 * 2**800 keeps every finite nonzero |z| in [2**-949, 2**828], normal doubles, and
 * distinct floats (relative gap >= 2**-24) round to distinct doubles; NaN / +inf
 * statuses then equal rank_key's.  Otherwise the coarse keys are the exact keys. */
DC_FN bool pk_fast_row(int logits, const void* bias, double T) {
  return logits && bias == 0 && T >= 0x1p-700 && T <= 0x1p800;
}

/* Publishes the block's work (dc_elect_last: a release fence) and counts it for its row: true in the
 * last block of the row to finish, which resets the counter (CUDA-graph replays start
 * at zero) and may then read every block's results.  No block waits for another. */
DC_FN bool pk_elect_last(u32* counters, int row, int R, PkShared& ps) {
  return dc_elect_last(&counters[row], (u32)R, &ps.is_last);
}

/* ------------------------------------------------------------------------
 * topk_onepass (the route where its grid is small: docs/architecture.md).
 * Rows whose coarse key fits 32 bits (logits without bias in the fast T
 * range, probabilities) never form exact keys in the tile phase: a block
 * writes its survivors (coarse >= t, at most PK_CAP of them, unranked) with
 * their coarse keys, else its K best by (coarse desc, id asc) (the coarse
 * order IS the exact order, ties included).  The last block selects over
 * composite keys (coarse << 32 | ~id), unique, so its order is (key desc, id
 * asc) whatever the slot order, and forms the exact keys of the K winners
 * only (from the float the coarse key encodes).  Rows with 64-bit keys (bias,
 * T out of the fast range) rank in the tile (slots in rank order).
 * Candidate slots: [B][R][PK_CAP], padding (0, -1); R * PK_CAP <= PK_NT * PK_EPT. */
#define PK_CAP 128

/* The end of a tile block of topk_onepass / topk_onepass_wide / topk_onepass_packed*: the candidate slots [used,
 * pad_end) padded (0, -1) (pad_end: PK_CAP, or K where the last block reads only the first
 * K slots, pp_last), the block's first bad element (mybad: this thread's; the barrier first
 * orders it after thread 0's ps.bad = NONE_BAD) into blk_bad, then pk_elect_last. */
DC_FN bool pk_tile_done(int used, u64 mybad, u64* ck, int* ci, u64* blk_bad, u32* counters,
                        int row, int R, int r, PkShared& ps, int pk_prof, int pad_end = PK_CAP) {
  for (int j = used + (int)threadIdx.x; j < pad_end; j += PK_NT) { ck[j] = 0; ci[j] = -1; }
  __syncthreads();
  if (mybad != NONE_BAD) atomicMin(&ps.bad, mybad);
  __syncthreads();
  if (threadIdx.x == 0) blk_bad[(i64)row * R + r] = ps.bad;
  PK_STAMP(4);
  return pk_elect_last(counters, row, R, ps);
}

/* The last block of a row of topk_onepass / topk_onepass_wide (the slot layout above): the
 * filters' parameters (f), the tiles' first bad element, the merge of the R * PK_CAP slots
 * (loaded before the bad-element reduction, so both reads are in flight together), then
 * warp 0 forms the exact keys of the K winners (fast rows: from the float the coarse
 * key encodes, pk_fval; no reload of x) and runs the tail. */
DC_FN void pk2_last(
    int row, int R, int K, bool fast, bool narrow, bool greedy, int logits, double T, int policy,
    int do_draw, const void* kseed, const void* kgen, const void* krnd, const void* kpos, int kfmt,
    const DcFilt& f, const u64* cand_key, const int* cand_id, const u64* blk_bad, int* tokens,
    u32* counts, int* ids, int* status, PkShared& ps, DcShared& sh) {
  __shared__ u64 ok[PK_KMAX];
  __shared__ int oi[PK_KMAX];
  const int tid = threadIdx.x;
  int pk_prof = row == 0 ? 16 : -1;
  PK_STAMP(0);
  pk_prefetch_exp_table();
  const DcKey kk = pk_key(do_draw, kseed, kgen, krnd, kpos, kfmt, row);
  const int N = R * PK_CAP;  /* <= PK_NT * PK_EPT (host) */
  const u64* rk = cand_key + (i64)row * N;
  const int* ri = cand_id + (i64)row * N;
  /* narrow rows: composite keys (coarse << 32 | ~id), unique; padding (0, -1) -> 0.
   * 64-bit rows: slots in id order among equal keys (topk_onepass: rank order per
   * tile; topk_onepass_wide: id order per tile; tiles in id order): the fallback's tie rule. */
  auto comp = [&](u64 k, int id) -> u64 { return narrow ? (k << 32) | (u64)(~(u32)id) : k; };
  u64 c[PK_EPT]; int idv[PK_EPT];
#pragma unroll
  for (int q = 0; q < PK_EPT; ++q) {
    const int i = q * PK_NT + tid;
    const bool in = i < N;
    const int id = in ? __ldcg(&ri[i]) : -1;
    c[q] = in ? comp(__ldcg(&rk[i]), id) : 0;
    idv[q] = id;
  }
  u64 b = NONE_BAD;
  for (int t = tid; t < R; t += PK_NT) { u64 w = __ldcg(&blk_bad[(i64)row * R + t]); b = w < b ? w : b; }
  b = block_reduce64(b, 2, sh);
  const int fst = dc_filt_status(f);
  if (fst) { fail_sparse(row, K, fst, do_draw ? tokens : 0, counts, ids, status); return; }
  if (b != NONE_BAD) { fail_sparse(row, K, (int)(b & 0xFF), do_draw ? tokens : 0, counts, ids, status); return; }
  {
    auto key = [&](int q) -> u64 { return c[q]; };
    auto idf = [&](int q) { return idv[q]; };
    auto at = [&](int i) -> u64 { return comp(__ldcg(&rk[i]), __ldcg(&ri[i])); };
    auto id_at = [&](int i) { return __ldcg(&ri[i]); };
    auto emit = [&](int rank, u64 k, int id, u64) { ok[rank] = k; oi[rank] = id; };
    pk_select(c, key, idf, at, at, id_at, N, K, 56, emit, ps, sh, pk_prof, -1, [](int, u64, int) {});
  }
  PK_STAMP(5);
  if (tid >= 32) return;
  /* ---- warp 0: exact keys of the K winners, then the tail ---- */
  const bool act = tid < K;
  const int id = act ? oi[tid] : 0x7FFFFFFF;
  u64 key = 0;
  if (act) {
    int bad;
    if (fast) key = rank_key(pk_fval((u32)(ok[tid] >> 32)), 0, 0, 0, T, logits, &bad);
    else key = narrow ? ok[tid] >> 32 : ok[tid];
  }
  pk_tail(row, K, key, id, logits, greedy, policy, do_draw, kk, f, tokens, counts, ids, status,
          pk_prof);
  PK_STAMP(6);
}

extern "C" __global__ void __launch_bounds__(PK_NT, 2) topk_onepass(
    const void* x, int xdt, const void* bias, int bdt, int bias_rows, const double* temp,
    int logits, int greedy_ok, int V, int K, int R, int chunk, int policy, int do_draw,
    const void* kseed, const void* kgen, const void* krnd, const void* kpos, int kfmt,
    u64* cand_key, int* cand_id, u64* blk_bad, u32* counters,
    int* tokens, u32* counts, int* ids, int* status, int nrows,
    int filt, const i64* ftopk, const u32* ftopp, const u32* fminp) {
  __shared__ DcShared sh;
  __shared__ PkShared ps;
  const int row = dc_grid_row(), r = blockIdx.x, tid = threadIdx.x;
  if (row >= nrows) return;
  int pk_prof = row == 0 && r == 0 ? 0 : -1;
  PK_STAMP(0);
  bool greedy; const double T = row_temp(temp, row, greedy_ok, &greedy);
  const i64 xoff = (i64)row * V;
  const i64 boff = bias_rows > 1 ? xoff : 0;
  const bool fast = pk_fast_row(logits, bias, T);
  const bool narrow = fast || !logits;  /* coarse keys < 2**32 */
  const int etop = narrow ? 24 : 56;
  auto exact_x = [&](float xf, i64 v) -> u64 {
    int bad;
    return rank_key(xf, bias, bdt, boff + v, T, logits, &bad);
  };
  if (tid == 0) ps.bad = NONE_BAD;
  const int lo = r * chunk, n = min(V, lo + chunk) - lo;
  u64* ck = cand_key + ((i64)row * R + r) * PK_CAP;
  int* ci = cand_id + ((i64)row * R + r) * PK_CAP;
  {
    float xf[PK_EPT];
    u64 c[PK_EPT];
    const u64 mybad = pk_load_keys(x, xdt, xoff, lo, n, fast, bias, bdt, boff, T, logits, xf, c);
    /* selection in coarse space: coarse keys are the ranking keys here */
    auto key = [&](int q) -> u64 { return c[q]; };
    auto idf = [&](int q) { return lo + q * PK_NT + tid; };
    auto at = [&](int i) -> u64 {
      const float f = load_f(x, xdt, xoff + lo + i);
      return fast ? (u64)pk_fkey(f) : exact_x(f, lo + i);
    };
    auto id_at = [&](int i) { return lo + i; };
    auto emit = [&](int rank, u64 k, int id, u64) { ck[rank] = k; ci[rank] = id; };
    auto emitd = [&](int slot, u64 k, int id) { ck[slot] = k; ci[slot] = id; };
    const int S = pk_select(c, key, idf, at, at, id_at, n, K, etop, emit, ps, sh, pk_prof,
                            narrow ? PK_CAP : -1, emitd);
    if (!pk_tile_done(S >= 0 ? S : min(K, n), mybad, ck, ci, blk_bad, counters, row, R, r, ps,
                      pk_prof))
      return;
  }
  pk2_last(row, R, K, fast, narrow, greedy, logits, T, policy, do_draw, kseed, kgen, krnd, kpos,
           kfmt, dc_filt(filt, ftopk, ftopp, fminp, row, K), cand_key, cand_id, blk_bad, tokens,
           counts, ids, status, ps, sh);
}

#endif

