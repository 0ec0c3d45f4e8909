/* topk_onepass_packed8k / 16k / 32k: topk_onepass_wide for 16-bit logits (bfloat16 /
 * float16) on packed keys (after
 * topk_onepass_wide.cuh; uses pk_bound, pk_tile_done, pk_tail, pk2_last,
 * pw_exact_tile, pw_bits16, pw_key).
 *
 * The grid (R, B), PK_NT threads and candidate slots are topk_onepass_wide's; the
 * tiles hold 8192 / 16384 / 32768 ids (16 / 32 / 64 per
 * thread, one pp_kernel<NW> each).  The host launches one of them in
 * topk_onepass_wide's place for bfloat16 / float16 logits without bias whose rows take
 * 16-byte loads (vec: V a multiple of 8, x 16-byte aligned): the smallest tile
 * whose grid fits one wave of two blocks per SM, else the largest
 * (backends/cuda/cupy/routes.py).  What differs from
 * topk_onepass_wide is the tile phase of a fast row (pk_fast_row: the float order key
 * of x ranks as the exact key).  Half of topk_onepass_wide's warp instructions (ncu,
 * B = 64) are in two stretches of its tile phase (per
 * element: the tile bound test, bf16 -> float bits, the bad-value test, the
 * float order key, the running top two); here they run on two elements per
 * 32-bit word:
 *  - the ids of a thread stay as the words its 16-byte loads gave (NW words,
 *    each holding two 16-bit floats h: ids 2j, 2j + 1 of a group of 8);
 *  - pp_keys turns a word into two 16-bit order keys in 5 integer operations:
 *    k = 0x8000 + h for h >= 0 and 0x8000 - |h| for h < 0, so -0.0 and +0.0
 *    both give 0x8000 (equal, as pk_fkey makes them) and k is strictly
 *    increasing in the value of h, the same order as pk_fkey(float(h)) (the
 *    conversion to float is exact and monotone); 1 <= k <= 0xFFFF, and 0 marks
 *    an id outside the tile;
 *  - a word with an all-ones exponent (NaN, +inf, -inf) sets a per-thread
 *    flag (2 operations per word); only such a thread tests its elements one
 *    by one (pw_key's status, ids in order) for the first bad id;
 *  - the running maximum per 16-bit half (max.u16x2, sm_90), then the thread's
 *    largest key M1.
 * Then the selection: t = pk_bound(M1) (at least min(K, n) keys >= t; u32
 * sort), the survivors k >= t as a bit mask of the thread's elements (one
 * compare pass, only in threads with M1 >= t), their exclusive scan, their
 * composite keys (k << 32 | ~id: distinct, in (k desc, id asc) order; k
 * selected from the registers, pp_comp) in shared memory, ranked by counting
 * (pp_rank_emit; <= PK_SMAX survivors, else the exact radix select over the
 * tile picks the kk best first): the tile's kk = min(K, n) best go to its
 * candidate slots [0, K) in rank order as (k, id), then padding (0, -1).
 * The last block of a fast row (pp_last) merges the tiles' sorted runs in a
 * tree of warp merges (pp_merge_top: bitonic, one barrier per level) and
 * forms the exact keys of the K winners from the 16-bit floats their k
 * encode; then pk_tail, as pk2_last.
 * Exactness: k orders the tile's elements as their coarse keys do (ties
 * included), so each tile's run is its kk best by (coarse key desc, id asc),
 * and the K best of the row (by exact key desc, id asc: the coarse order) are
 * the K largest composite keys over the runs: pk2_last's K.  Rows that are not
 * fast (T outside pk_fast_row's range) take topk_onepass_wide's exact radix select
 * (pw_exact_tile) and pk2_last, the same code.
 * On the H200 the ranked runs and the merge tree are faster at every batch than
 * unranked survivors in the slots with pk2_last's select over all of them, and
 * topk_onepass_packed* is faster than topk_onepass_wide and, at B = 1, topk_onepass (docs/performance.md). */
#ifndef DYADIC_KERNELS_TOPK_ONEPASS_PACKED_CUH
#define DYADIC_KERNELS_TOPK_ONEPASS_PACKED_CUH


DC_FN u32 pp_max2(u32 a, u32 b) { u32 r; asm("max.u16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b)); return r; }

/* the order keys of the two 16-bit floats of x (see the header) */
DC_FN u32 pp_keys(u32 x) {
  const u32 s = (x >> 15) & 0x00010001u;  /* the sign bits, at bits 0 and 16 */
  return (x ^ ((s * 0xFFFFu) | 0x80008000u)) + s;
}

/* the 16-bit float of an order key (-0.0 comes back as +0.0: the same key) */
DC_FN u32 pp_half(u32 k) { return (k & 0x8000u) ? (k & 0x7FFFu) : (0x8000u | (0x8000u - k)); }

/* the order key of element e (0 .. 2 NW - 1) of the thread: word e / 2, half e % 2 (its
 * index in the tile is pw_ix(e)) */
template <int NW>
DC_FN u32 pp_key_of(const u32 (&w)[NW], int e) { return (w[e >> 1] >> (16 * (e & 1))) & 0xFFFFu; }

/* One warp: the 32 largest of the values of two runs a and b (a run: lane j holds
 * the j-th largest of 32 values), as a run.  max(a_j, b_(31-j)) holds the 32 largest
 * (the first step of a bitonic merge) in a bitonic order, which the five steps sort. */
DC_FN u64 pp_merge_top(u64 a, u64 b) {
  const int lane = threadIdx.x & 31;
  const u64 br = __shfl_sync(0xffffffffu, b, 31 - lane);
  u64 v = a > br ? a : br;
#pragma unroll
  for (int j = 16; j > 0; j >>= 1) {
    const u64 o = __shfl_xor_sync(0xffffffffu, v, j);
    v = (lane & j) ? (o < v ? o : v) : (o > v ? o : v);
  }
  return v;
}

/* A tree of pp_merge_top over the runs of warps [0, nw) (every thread of the block
 * calls it; one barrier per level; buf: nw * 32 u64 of shared memory, written at
 * distinct places per level): warp 0 returns the run of the 32 largest of them all. */
DC_FN u64 pp_tree(u64 run, int nw, u64* buf) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  for (int s = 1; s < nw; s <<= 1) {  /* block-uniform trip count */
    if ((w & (2 * s - 1)) == s) buf[w * 32 + lane] = run;
    __syncthreads();
    if ((w & (2 * s - 1)) == 0 && w + s < nw) run = pp_merge_top(run, buf[(w + s) * 32 + lane]);
  }
  return run;
}

/* The composite key (k << 32 | ~id) of element e of the thread (w: its keys; w[e / 2]'s
 * half e % 2, id lo + pw_ix(e)), selected from the registers (no indexed registers). */
template <int NW>
DC_FN u64 pp_comp(const u32 (&w)[NW], int e, int lo) {
  u32 wv = 0;
#pragma unroll
  for (int q = 0; q < NW; ++q) wv |= w[q] & (0u - (u32)(q == (e >> 1)));
  return ((u64)((wv >> (16 * (e & 1))) & 0xFFFFu) << 32) | (u64)(~(u32)(lo + pw_ix(e)));
}

/* The S (<= PK_SMAX) distinct composite keys in ps.sk ranked by counting (desc), G lanes
 * per key (pk_rank_lanes); the key of rank j < kk goes to slot j: (k, id).  No barrier at
 * the end (pk_tile_done starts with one). */
DC_FN void pp_rank_emit(int S, int kk, u64* ck, int* ci, PkShared& ps) {
  const int tid = threadIdx.x, G = pk_rank_lanes(S);
  for (int a0 = 0; a0 < S; a0 += PK_NT / G) {
    const int a = a0 + tid / G, part = tid & (G - 1);
    const bool live = a < S;
    const u64 ka = live ? ps.sk[a] : 0;
    int rank = 0;
    if (live) {
#pragma unroll 4
      for (int b = part; b < S; b += G) rank += ps.sk[b] > ka;
    }
    for (int o = 1; o < G; o <<= 1) rank += __shfl_xor_sync(0xffffffffu, rank, o);
    if (live && part == 0 && rank < kk) { ck[rank] = ka >> 32; ci[rank] = (int)~(u32)ka; }
  }
}

/* The last block of a fast row (R <= 2 * PK_NT / 32 tiles, host).  Tile r's slots [0, K)
 * hold its min(K, n_r) best in rank order (k desc, id asc) as (k, id), then padding
 * (0, -1).  As composite keys (k << 32 | ~id: distinct, in the same order; padding 0)
 * each tile's first K slots form a run (lanes >= K: 0), and the K best of the row are
 * the K largest composite keys over the runs: warp w merges tiles 2w and 2w + 1, then a
 * tree of merges over the warps (pp_tree) leaves them in warp 0 in rank order.  Warp 0
 * reduces the tiles' first bad elements (a bad row fails closed), forms the exact keys of
 * the winners from the 16-bit floats their k encode and runs the tail (pk_tail, as
 * pk2_last's). */
DC_FN void pp_last(
    int row, int R, int K, int xdt, bool greedy, int logits, double T, int policy, int do_draw,
    const void* kseed, const void* kgen, const void* krnd, const void* kpos, int kfmt,
    const DcFilt& f, const u64* cand_key, const int* cand_id, const u64* blk_bad, int* tokens,
    u32* counts, int* ids, int* status, PkShared& ps) {
  constexpr int NWP = PK_NT / 32;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  int pk_prof = row == 0 ? 16 : -1;
  PK_STAMP(0);
  pk_prefetch_exp_table();
  const DcKey kk = pk_key(do_draw, kseed, kgen, krnd, kpos, kfmt, row);
  const u64* rk = cand_key + (i64)row * R * PK_CAP;
  const int* ri = cand_id + (i64)row * R * PK_CAP;
  auto slot = [&](int r) -> u64 {  /* tile r's entry of rank lane, composite (0: none) */
    if (r >= R || lane >= K) return 0;
    const i64 j = (i64)r * PK_CAP + lane;
    return (__ldcg(&rk[j]) << 32) | (u64)(~(u32)__ldcg(&ri[j]));
  };
  /* warp w merges tiles 2w and 2w + 1 (R <= 2 * NWP, host), then the tree over the
   * (R + 1) / 2 warps' runs */
  const u64 a = slot(2 * w), b = slot(2 * w + 1);
  /* warp 0: the tiles' first bad elements (R <= 32), reduced after the merge */
  const u64 bb = w == 0 && lane < R ? __ldcg(&blk_bad[(i64)row * R + lane]) : NONE_BAD;
  PK_STAMP(1);
  const u64 run = pp_tree(2 * w + 1 < R ? pp_merge_top(a, b) : a, (R + 1) / 2, ps.sk);
  PK_STAMP(5);
  if (tid >= 32) return;
  const u64 bad = warp_min64(bb);
  const int fst = dc_filt_status(f);
  if (fst) { fail_sparse(row, K, fst, do_draw ? tokens : 0, counts, ids, status); return; }
  if (bad != NONE_BAD) { fail_sparse(row, K, (int)(bad & 0xFF), do_draw ? tokens : 0, counts, ids, status); return; }
  /* ---- warp 0: the exact keys of the K winners, then the tail ---- */
  const bool act = lane < K;
  const int id = act ? (int)~(u32)run : 0x7FFFFFFF;
  u64 key = 0;
  if (act) {  /* the float of the 16-bit order key */
    int bad;
    key = rank_key(__uint_as_float(pw_bits16(pp_half((u32)(run >> 32)), xdt)), 0, 0, 0, T, logits, &bad);
  }
  pk_tail(row, K, key, id, logits, greedy, policy, do_draw, kk, f, tokens, counts, ids, status,
          pk_prof);
  PK_STAMP(6);
}

/* The kernel body, NW words (NW / 4 groups of 8 ids, 4 * NW ids) per thread. */
template <int NW>
DC_FN void pp_kernel(
    const void* x, int xdt, const void* bias, int bdt, int bias_rows, const double* temp,
    int logits, int greedy_ok, int V, int K, int R, int chunk, int policy, int do_draw,
    const void* kseed, const void* kgen, const void* krnd, const void* kpos, int kfmt,
    u64* cand_key, int* cand_id, u64* blk_bad, u32* counters,
    int* tokens, u32* counts, int* ids, int* status, int nrows,
    int filt, const i64* ftopk, const u32* ftopp, const u32* fminp) {
  constexpr int NG = NW / 4;
  __shared__ DcShared sh;
  __shared__ PkShared ps;
  const int row = dc_grid_row(), r = blockIdx.x, tid = threadIdx.x;
  if (row >= nrows) return;
  int pk_prof = row == 0 && r == 0 ? 0 : -1;
  PK_STAMP(0);
  const i64 xoff = (i64)row * V;
  const int lo = r * chunk, n = min(V, lo + chunk) - lo;
  /* the tile's loads first (n is a multiple of 8: a group is in the tile or not) */
  u32 w[NW];
  bool in[NG];
#pragma unroll
  for (int g = 0; g < NG; ++g) {
    const int i0 = pw_ix(8 * g);
    in[g] = i0 < n;
    const uint4 u = in[g] ? __ldg((const uint4*)((const u16*)x + xoff + lo + i0)) : make_uint4(0, 0, 0, 0);
    w[4 * g] = u.x; w[4 * g + 1] = u.y; w[4 * g + 2] = u.z; w[4 * g + 3] = u.w;
  }
  bool greedy; const double T = row_temp(temp, row, greedy_ok, &greedy);
  const i64 boff = bias_rows > 1 ? xoff : 0;
  const bool fast = pk_fast_row(logits, bias, T);
  if (tid == 0) ps.bad = NONE_BAD;
  u64* ck = cand_key + ((i64)row * R + r) * PK_CAP;
  int* ci = cand_id + ((i64)row * R + r) * PK_CAP;
  u64 mybad = NONE_BAD;
  int used;
  const int kk = K < n ? K : n;
  if (fast) {
    const u32 em = xdt == 2 ? 0x7F807F80u : 0x7C007C00u;  /* the exponent fields */
    const u32 eo = xdt == 2 ? 0x00800080u : 0x04000400u;  /* carries an all-ones one into the sign */
    u32 mb = 0, m1 = 0;
#pragma unroll
    for (int j = 0; j < NW; ++j) {
      const u32 v = w[j];
      const u32 k = in[j >> 2] ? pp_keys(v) : 0u;
      mb |= in[j >> 2] ? (v & em) + eo : 0u;
      w[j] = k;
      m1 = pp_max2(m1, k);
    }
    const u32 M1 = max(m1 & 0xFFFFu, m1 >> 16);
    if (mb & 0x80008000u) {  /* an all-ones exponent: the thread's first bad id, if any */
#pragma unroll
      for (int e = 0; e < 2 * NW; ++e) {  /* unrolled: w stays in registers */
        int bad = 0;
        if (in[e >> 3] && mybad == NONE_BAD) pw_key(pw_bits16(pp_half(pp_key_of(w, e)), xdt), 1, &bad);
        if (bad) mybad = ((u64)(lo + pw_ix(e)) << 8) | (u64)bad;
      }
    }
    PK_STAMP(1);
    const u32 t = pk_bound(M1, kk, ps);
    PK_STAMP(2);
    u64 sm = 0;  /* the thread's survivors: bit e for its element e with key >= t */
    if (in[0] && M1 >= t) {
#pragma unroll
      for (int j = 0; j < NW; ++j) {
        if (in[j >> 2]) {
          sm |= (u64)((w[j] & 0xFFFFu) >= t) << (2 * j);
          sm |= (u64)((w[j] >> 16) >= t) << (2 * j + 1);
        }
      }
    }
    /* the tile's kk best in rank order (pp_last merges sorted runs), as (k, id) */
    int S; int pos = block_excl_scan(__popcll(sm), &S, sh);
    if (S <= PK_SMAX) {
      for (u64 m = sm; m; m &= m - 1) ps.sk[pos++] = pp_comp(w, __ffsll((long long)m) - 1, lo);
    } else {  /* masses of ties: the exact radix select over the tile (pk_select_map's) */
      auto at = [&](int i) -> u64 {
        return pw_key(__float_as_uint(load_f(x, xdt, xoff + lo + i)), 1, 0);
      };
      const DcSel s = block_select(at, n, kk, sh, 24);
      /* k of id lo + i from x again */
      S = block_compact([&](int i) { return sel_has(s, at(i), i); },
                        [&](int i, int rk) {
                          const u32 k = pp_keys(__ldg((const u16*)x + xoff + lo + i)) & 0xFFFFu;
                          ps.sk[rk] = ((u64)k << 32) | (u64)(~(u32)(lo + i));
                        }, n, sh);
    }
    __syncthreads();
    PK_STAMP(3);
    pp_rank_emit(S, kk, ck, ci, ps);
    used = kk;
  } else {  /* 64-bit keys (T outside the fast range): topk_onepass_wide's exact radix select */
    used = pw_exact_tile(x, xdt, bias, bdt, xoff, boff, lo, n, K, T, logits, ck, ci, &mybad, sh);
  }
  if (!pk_tile_done(used, mybad, ck, ci, blk_bad, counters, row, R, r, ps, pk_prof,
                    fast ? K : PK_CAP))
    return;
  const DcFilt f = dc_filt(filt, ftopk, ftopp, fminp, row, K);
  if (fast)
    pp_last(row, R, K, xdt, greedy, logits, T, policy, do_draw, kseed, kgen, krnd, kpos, kfmt,
            f, cand_key, cand_id, blk_bad, tokens, counts, ids, status, ps);
  else
    pk2_last(row, R, K, false, !logits, greedy, logits, T, policy, do_draw, kseed, kgen, krnd,
             kpos, kfmt, f, cand_key, cand_id, blk_bad, tokens, counts, ids, status, ps, sh);
}

/* The entry points (topk_onepass_wide's parameters, written out): tiles of
 * PK_NT * 16 / 32 / 64 = 8192 / 16384 / 32768 ids. */
extern "C" __global__ void __launch_bounds__(PK_NT, 2) topk_onepass_packed8k(
    const void* x, int xdt, const void* bias, int bdt, int bias_rows, const double* temp,
    int logits, int greedy_ok, int V, int K, int R, int chunk, int policy, int do_draw,
    const void* kseed, const void* kgen, const void* krnd, const void* kpos, int kfmt,
    u64* cand_key, int* cand_id, u64* blk_bad, u32* counters,
    int* tokens, u32* counts, int* ids, int* status, int vec, int nrows,
    int filt, const i64* ftopk, const u32* ftopp, const u32* fminp) {
  pp_kernel<8>(x, xdt, bias, bdt, bias_rows, temp, logits, greedy_ok, V, K, R, chunk, policy,
                do_draw, kseed, kgen, krnd, kpos, kfmt, cand_key, cand_id, blk_bad, counters,
                tokens, counts, ids, status, nrows, filt, ftopk, ftopp, fminp);
}

extern "C" __global__ void __launch_bounds__(PK_NT, 2) topk_onepass_packed16k(
    const void* x, int xdt, const void* bias, int bdt, int bias_rows, const double* temp,
    int logits, int greedy_ok, int V, int K, int R, int chunk, int policy, int do_draw,
    const void* kseed, const void* kgen, const void* krnd, const void* kpos, int kfmt,
    u64* cand_key, int* cand_id, u64* blk_bad, u32* counters,
    int* tokens, u32* counts, int* ids, int* status, int vec, int nrows,
    int filt, const i64* ftopk, const u32* ftopp, const u32* fminp) {
  pp_kernel<16>(x, xdt, bias, bdt, bias_rows, temp, logits, greedy_ok, V, K, R, chunk, policy,
                do_draw, kseed, kgen, krnd, kpos, kfmt, cand_key, cand_id, blk_bad, counters,
                tokens, counts, ids, status, nrows, filt, ftopk, ftopp, fminp);
}

extern "C" __global__ void __launch_bounds__(PK_NT, 2) topk_onepass_packed32k(
    const void* x, int xdt, const void* bias, int bdt, int bias_rows, const double* temp,
    int logits, int greedy_ok, int V, int K, int R, int chunk, int policy, int do_draw,
    const void* kseed, const void* kgen, const void* krnd, const void* kpos, int kfmt,
    u64* cand_key, int* cand_id, u64* blk_bad, u32* counters,
    int* tokens, u32* counts, int* ids, int* status, int vec, int nrows,
    int filt, const i64* ftopk, const u32* ftopp, const u32* fminp) {
  pp_kernel<32>(x, xdt, bias, bdt, bias_rows, temp, logits, greedy_ok, V, K, R, chunk, policy,
                do_draw, kseed, kgen, krnd, kpos, kfmt, cand_key, cand_id, blk_bad, counters,
                tokens, counts, ids, status, nrows, filt, ftopk, ftopp, fminp);
}

#endif

