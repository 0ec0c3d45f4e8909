/* ========================================================================
 * verify, check="lazy", in ONE launch: verify_lazy (and verify_lazy_r64, the
 * same code at a lower register cap).  Its tile pass and last block also serve
 * verify_one_launch (verify_one_launch.cuh).  Uses LzShared, lz_tests, lz_walk
 * (verify_classify.cuh), lr_find, lr_pick, lr_val, ResRow / res_weight / q_at
 * (verify_common.cuh).
 *
 * Selecting R_v > 0 needs the exact total T of the residual row, which a
 * straightforward kernel gets from a first pass over the row, so the row would
 * be read twice.  Here one pass does both, because the selection hardly depends on T: for a valid row
 * T lies in the band [TLO, THI] = [2^62 - 2^52, 2^62 + 2^52], and
 *   sel_T(v) = P_v 2^24 > c_v T  <=>  P_v > floor(c_v T / 2^24)
 * is monotone in T, with floor(c THI / 2^24) = c (2^38 + 2^28) and
 * floor(c TLO / 2^24) = c (2^38 - 2^28) exact (shifts; c < 2^25 so no overflow).
 * So an element is DEFINITE when P > c (2^38 + 2^28) (selected for every T of
 * the band) or P <= c (2^38 - 2^28) (selected for none), else AMBIGUOUS (also
 * every c >= 2^25, an invalid count: decided exactly later).
 *
 * grid (nt, B), 256 threads, tile vt (a multiple of 1024, <= 32768, nt <= VF_MAXT):
 *   1. lz_tests: classify the k tests, candidate rows.
 *   2. for each candidate row i, the block's tile in one pass over P (and the
 *      dense q row / point mass / sparse support; 16-byte loads, 8 lanes per
 *      chunk and 2 loads (8 ids) per lane, when V % 4 == 0 and the rows are
 *      16-byte aligned; else 4-byte loads, a warp per chunk): the split sums of P
 *      and the
 *      validity (the row total), and per chunk of VF_CH = 64 ids the
 *      sums over its DEFINITE selected ids, sum P and sum c -> chunk records
 *      (2 x u64) and the tile record (T split sums, bad, sum P, sum c, dirty
 *      chunks); every ambiguous id goes to the row's list (P, id, c; one
 *      atomic per warp), and a chunk whose ambiguous id finds the list full
 *      (acap entries) gets a dirty bit.
 *   3. the last block of the request (atomic counter after a release fence, dc_elect_last,
 *      reset by that block: graph replays start at zero): the exact T and
 *      status of each candidate row, lz_walk (thread 0: accepted, tokens,
 *      status, the residual row R; the list counters of the candidate rows
 *      are reset); then for R: each listed id with dy_residual > 0 for the
 *      exact T adds (P, c) to its tile and chunk sums (one thread per id), then
 *      every dirty chunk is summed again exactly (warp per tile) and its
 *      record and tile sums are replaced; then one warp draws x below the
 *      total (domain CORRECTION, position + R, index 0: verify_residual's draw) and
 *      finds the tile, the chunk and the id (lr_find, lr_find, lr_pick).
 * Exactness: a definite id's selection is the same for the exact T (T is in
 * the band when the row's status is OK; otherwise the request fails closed
 * with that status before any residual is formed), so after the dirty chunks
 * are redone every chunk's (sum P, sum c) is over exactly {v: R_v > 0} and
 * lr_val(sum P, sum c, T) = sum of R_v over the chunk; u64 sums are exact
 * (subset sums of a valid row < 2^63; counts < 2^64), the tile corrections
 * wrap mod 2^64 to the exact value.  Hence the tile, chunk and id are those of
 * the first id whose running residual sum exceeds x, as in verify_residual.
 * Reads: the k values P(d_i), c_i(d_i), the candidate rows and the residual row
 * once each (plus, when AMB tests precede the rejection, the q rows of those rows).
 * Scratch: tile records 6 u64 per (request, row, tile); chunk records 2 u64
 * per (request, row, chunk); lists of acap x 2 u64 and their counters per
 * (request, row); one block counter per request.
 * ====================================================================== */
#define VF_CH 64                             /* ids per chunk */
#define VF_MAXT 128                          /* tiles per row */
#define VF_MAXCT 512                         /* chunks per tile (vt <= 32768) */
#define VF_SU 4                              /* scalar path: chunks per warp and iteration */
#define VF_DIRTY (1ull << 63)                /* in a chunk record's count word */
#define VF_THI24 ((1ull << 38) + (1ull << 28))  /* THI / 2^24 */
#define VF_TLO24 ((1ull << 38) - (1ull << 28))  /* TLO / 2^24 */
#define VF_TREC 6                            /* u64 words per tile record */

/* -DDC_PROF: %globaltimer stamps of request 0 in dc_prof[32..63] (DYADIC_CUDA_PROF=1):
 * 32 + 0..3 tile 0 (start, tests done, tiles done, counter taken), 32 + 8..16 the last
 * block (counter taken, then its end), 32 + 17 its start; 62 the earliest start of any
 * block, 63 the latest arrival at the counter; 81-89 the last block's steps in clock64
 * cycles from the counter (totals, walk, setup, list, dirty chunks, tile found, chunk
 * found, id picked, end). */
#ifdef DC_PROF
#define VF_STAMP(c, i) do { if (b == 0 && threadIdx.x == 0 && (c)) dc_prof[32 + (i)] = dc_now(); } while (0)
#define VF_PROF_START() const u64 vf_t0_ = dc_now(); \
  if (b == 0 && threadIdx.x == 0) atomicMin(&dc_prof[62], vf_t0_)
#define VF_PROF_ARRIVE() do { if (b == 0 && threadIdx.x == 0) atomicMax(&dc_prof[63], dc_now()); } while (0)
#define VF_PROF_LAST() do { if (b == 0 && threadIdx.x == 0) dc_prof[32 + 17] = vf_t0_; } while (0)
/* the last block's steps in clock64 cycles (thread 0's registers, written at the end) */
#define VF_CLK_DECL u64 vf_ck[10] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
#define VF_CLK(i) do { if (b == 0) vf_ck[i] = clock64(); } while (0)
#define VF_CLK_PUT() do { if (b == 0 && threadIdx.x == 0) \
    for (int i_ = 1; i_ < 10; ++i_) dc_prof[80 + i_] = vf_ck[i_] - vf_ck[0]; } while (0)
#else
#define VF_CLK_DECL
#define VF_CLK(i) do { } while (0)
#define VF_CLK_PUT() do { } while (0)
#define VF_STAMP(c, i) do { } while (0)
#define VF_PROF_START() do { } while (0)
#define VF_PROF_ARRIVE() do { } while (0)
#define VF_PROF_LAST() do { } while (0)
#endif

struct VfShared {
  LzShared z;
  u64 csp[VF_MAXCT], csc[VF_MAXCT];
  u32 cdirty[VF_MAXCT];
  u64 tsp[VF_MAXT], tsc[VF_MAXT];
  u32 tnd[VF_MAXT];
  u64 whi[8], wlo[8];
  u32 wbad[8];
  int jR, R;
  u32 na[LZ_MAXK + 1];  /* the last block: each candidate row's list length */
  u64 TR;
  DcKey key;     /* the last block: thread 0's key */
  u32 rw[32][4]; /* the last block: the CORRECTION draw's Philox blocks, indices 0..31 (warp 7) */
};

/* One id: its P into the row-total split sums and validity; if DEFINITE selected,
 * (P, c) into (sp, sc); amb when AMBIGUOUS (see the header). */
DC_FN bool vf_elem(u32 bits, u64 c, u64& shi, u64& slo, u32& bad, u64& sp, u32& sc) {
  const u64 P = dy_target_fixed_fast(bits);
  bad |= (u32)!dy_target_bits_valid(bits);
  shi += P >> 32; slo += P & 0xFFFFFFFFull;
  const bool small = c < (1ull << 25);
  const bool hi = small && P > c * VF_THI24, lo = small && P > c * VF_TLO24;
  const u64 m = (u64)0 - (u64)hi;
  sp += P & m; sc += (u32)c & (u32)m;  /* selected: c < 2^25, so a chunk's sum < 2^31 */
  return (lo && !hi) || !small;
}

/* The ambiguous ids of a warp (amb: this lane's) into the row's list (P, id << 32 | c),
 * one atomic per warp; 1 for a lane whose id found the list full (its chunk is then
 * summed again in full by the last block).  All 32 lanes call it. */
DC_FN u32 vf_list(bool amb, u32 bits, int id, u32 c, u64* alist, u32* acnt, int acap) {
  const unsigned bal = __ballot_sync(0xffffffffu, amb);
  if (!bal) return 0;
  const int lane = threadIdx.x & 31;
  u32 base = 0;
  if (lane == 0) base = atomicAdd(acnt, (u32)__popc(bal));
  base = __shfl_sync(0xffffffffu, base, 0) + __popc(bal & ((1u << lane) - 1u));
  if (!amb) return 0;
  if (base >= (u32)acap) return 1;
  *(ulonglong2*)(alist + 2 * (i64)base) =
      make_ulonglong2(dy_target_fixed_fast(bits), ((u64)(u32)id << 32) | c);
  return 0;
}

/* One ambiguous id into the row's list (P, id << 32 | c); false when the list is full
 * (its chunk is then summed again in full by the last block). */
DC_FN bool vf_push(u64* alist, u32* acnt, int acap, u64 P, int id, u32 c) {
  const u32 j = atomicAdd(acnt, 1u);
  if (j >= (u32)acap) return false;
  *(ulonglong2*)(alist + 2 * (i64)j) = make_ulonglong2(P, ((u64)(u32)id << 32) | c);
  return true;
}

/* The exact (sum P, sum c) over {v in [v0, v0 + VF_CH) : R_v > 0} for the total T
 * (one warp, 2 ids per lane; every lane returns the sums). */
DC_FN void vf_chunk_exact(const ResRow& r, int v0, int V, u64* sp, u64* sc) {
  u64 p = 0, c = 0;
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int v = v0 + (threadIdx.x & 31) + 32 * e;
    if (v < V) {
      const u64 P = dy_target_fixed(r.t[v]);
      const u32 cv = r.bonus ? 0u : q_at(r.qcr, r.qir, r.nv, v, r.d);
      if (!dy_is_zero128(dy_residual(P, cv, r.T))) { p += P; c += cv; }
    }
  }
  *sp = warp_sum64(p); *sc = warp_sum64(c);
}

/* Step 2 for row i of request b: the tile [lo, hi) (see the header). */
DC_FN void vf_tile(const u32* trow, const u32* qrow, const u32* qcr, const int* qir, int W, int d,
                   bool bonus, int lo, int hi, u64* rch, u64* trec, u64* alist, u32* acnt, int acap,
                   bool vec, VfShared& s) {
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  const bool sparse = qir != 0;
  const int nct = (hi - lo + VF_CH - 1) / VF_CH;
  u64 shi = 0, slo = 0; u32 bad = 0;
  /* c_v: dense q[v]; point mass 2^24 [v == d]; bonus / sparse 0 (sparse: corrected below) */
  auto cval = [&](u32 qv, int v) -> u64 { return qrow ? (u64)qv : (v == d ? (u64)DY_TOTAL : 0ull); };
  if (vec) {  /* 16-byte loads: 8 lanes hold one chunk, 2 loads (8 ids) per lane */
    const uint4* t4 = (const uint4*)(trow + lo);
    const uint4* q4 = qrow ? (const uint4*)(qrow + lo) : 0;
    const int n4 = (hi - lo) >> 2;
    const int j = tid >> 3, sl = tid & 7;  /* the chunk of the iteration, the lane in it */
    for (int base = 0; base < n4; base += 512) {  /* uniform trip count: shuffles */
      uint4 tb[2], qb[2];
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int g = base + 16 * j + sl + 8 * u;
        tb[u] = g < n4 ? __ldcs(&t4[g]) : make_uint4(0, 0, 0, 0);
        qb[u] = (q4 && g < n4) ? __ldcs(&q4[g]) : make_uint4(0, 0, 0, 0);
      }
      u64 sp = 0; u32 sc = 0, full = 0;
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int g = base + 16 * j + sl + 8 * u, v = lo + 4 * g;
        const u32 bb[4] = {tb[u].x, tb[u].y, tb[u].z, tb[u].w};
        const u32 cc[4] = {qb[u].x, qb[u].y, qb[u].z, qb[u].w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const u64 c = cval(cc[e], v + e);
          const bool amb = vf_elem(bb[e], c, shi, slo, bad, sp, sc) && g < n4;
          full |= vf_list(amb, bb[e], v + e, (u32)c, alist, acnt, acap);
        }
      }
#pragma unroll
      for (int o = 4; o; o >>= 1) {
        sp += __shfl_xor_sync(0xffffffffu, sp, o);
        sc += __shfl_xor_sync(0xffffffffu, sc, o);
      }
      full = (__ballot_sync(0xffffffffu, full != 0) >> (lane & 24)) & 0xFFu;
      const int g0 = base + 16 * j;
      if (sl == 0 && g0 < n4) {
        const int cl = g0 >> 4;
        s.csp[cl] = sp; s.csc[cl] = sc; s.cdirty[cl] = full != 0;
      }
    }
  } else {  /* scalar loads: warp w takes chunks w, w + 8, ... (ids lane and lane + 32) */
    for (int cb = 0; cb < nct; cb += 8 * VF_SU) {
      u32 tb[2 * VF_SU], qb[2 * VF_SU];
#pragma unroll
      for (int u = 0; u < 2 * VF_SU; ++u) {
        const int v = lo + (cb + wid + 8 * (u >> 1)) * VF_CH + lane + 32 * (u & 1);
        tb[u] = v < hi ? __ldcs(&trow[v]) : 0u;
        qb[u] = (qrow && v < hi) ? __ldcs(&qrow[v]) : 0u;
      }
#pragma unroll
      for (int u = 0; u < VF_SU; ++u) {
        const int cl = cb + wid + 8 * u, v = lo + cl * VF_CH + lane;
        u64 sp = 0; u32 sc = 0, full = 0;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int ve = v + 32 * e;
          const u64 c = cval(qb[2 * u + e], ve);
          const bool amb = vf_elem(tb[2 * u + e], c, shi, slo, bad, sp, sc) && ve < hi;
          full |= vf_list(amb, tb[2 * u + e], ve, (u32)c, alist, acnt, acap);
        }
        sp = warp_sum64(sp);
        for (int o = 16; o; o >>= 1) sc += __shfl_xor_sync(0xffffffffu, sc, o);
        full = __any_sync(0xffffffffu, full != 0);
        if (lane == 0 && cl < nct) { s.csp[cl] = sp; s.csc[cl] = sc; s.cdirty[cl] = full; }
      }
    }
  }
  shi = warp_sum64(shi); slo = warp_sum64(slo);
  bad = __any_sync(0xffffffffu, bad != 0);
  if (lane == 0) { s.whi[wid] = shi; s.wlo[wid] = slo; s.wbad[wid] = bad; }
  __syncthreads();
  if (sparse) {  /* support ids were taken with c = 0 (selected iff P > 0): correct them */
    for (int j = tid; j < W; j += 256) {
      const int id = qir[j];
      if (id >= lo && id < hi) {
        const u64 P = dy_target_fixed_fast(trow[id]), c = qcr[j];
        const int cl = (id - lo) / VF_CH;
        u64 h1 = 0, l1 = 0, sp = 0; u32 b1 = 0, sc = 0;
        const bool amb = vf_elem(trow[id], c, h1, l1, b1, sp, sc);
        if (sp) atomicAdd((unsigned long long*)&s.csc[cl], (unsigned long long)sc);
        else atomicAdd((unsigned long long*)&s.csp[cl], (unsigned long long)((u64)0 - P));
        if (amb && !vf_push(alist, acnt, acap, P, id, (u32)c)) atomicOr(&s.cdirty[cl], 1u);
      }
    }
    __syncthreads();
  }
  u64 tp = 0, tc = 0; u32 nd = 0;
  for (int cl = tid; cl < nct; cl += 256) {
    const u64 sp = s.csp[cl], sc = s.csc[cl];
    const u32 dirty = s.cdirty[cl];
    tp += sp; tc += sc; nd += dirty;
    *(ulonglong2*)(rch + 2 * (i64)(lo / VF_CH + cl)) = make_ulonglong2(sp, sc | (dirty ? VF_DIRTY : 0ull));
  }
  tp = warp_sum64(tp); tc = warp_sum64(tc);
  for (int o = 16; o; o >>= 1) nd += __shfl_xor_sync(0xffffffffu, nd, o);
  __syncthreads();  /* s.whi.. read below; s.csp.. rewritten by the next row */
  if (lane == 0) { s.csp[wid] = tp; s.csc[wid] = tc; s.cdirty[wid] = nd; }
  __syncthreads();
  if (tid == 0) {
    u64 h = 0, l = 0, P = 0, C = 0; u32 b = 0, n = 0;
    for (int w = 0; w < 8; ++w) {
      h += s.whi[w]; l += s.wlo[w]; b |= s.wbad[w];
      P += s.csp[w]; C += s.csc[w]; n += s.cdirty[w];
    }
    ulonglong2* tr = (ulonglong2*)trec;  /* 48 bytes: 16-byte aligned */
    tr[0] = make_ulonglong2(h, l); tr[1] = make_ulonglong2(b, P); tr[2] = make_ulonglong2(C, n);
  }
  __syncthreads();
}

/* Step 3, the last block of request b (see the header): the candidate rows' exact totals
 * and statuses, the walk, the residual row's listed and dirty ids, the draw and the search.
 * s.z holds the tests (lz_tests), key is thread 0's; allrows: every row of the request
 * listed ids (verify_one_launch), so every row's list counter is reset; n: the
 * request's draft count (its bonus row). */
DC_FN void vf_last(VfShared& s, const DcKey& key, int ncand, bool allrows, const u32* target,
                   const u32* qc, const int* qi, int W, int k, int n, int V, int nt, u64* tpart,
                   u64* rchunk, u64* alist, u32* acnt, int acap, int* accepted, int* tokens,
                   int* status, int vt, int b) {
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  const int k1 = k + 1, nch = (V + VF_CH - 1) / VF_CH;
  VF_CLK_DECL
  VF_CLK(0);
  if (tid == 0) s.key = key;
  for (int j = wid; j < ncand; j += 8) {  /* exact T and status of each candidate row */
    const i64 rj = (i64)b * k1 + s.z.cand[j];
    const ulonglong2* tr = (const ulonglong2*)(tpart + rj * nt * VF_TREC);
    if (lane == 0) s.na[j] = min(__ldcg(&acnt[rj]), (u32)acap);  /* its list's length */
    u64 h = 0, l = 0; u32 bd = 0;
    const bool keep = j == ncand - 1;  /* the residual row unless an AMB test rejects */
    for (int t0 = 0; t0 < nt; t0 += 64) {  /* 2 records per lane in flight */
      ulonglong2 rec[2][3];
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int t = t0 + lane + 32 * u;
#pragma unroll
        for (int e = 0; e < 3; ++e)
          rec[u][e] = t < nt ? __ldcg(&tr[t * (VF_TREC / 2) + e]) : make_ulonglong2(0, 0);
      }
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int t = t0 + lane + 32 * u;
        h += rec[u][0].x; l += rec[u][0].y; bd |= (u32)rec[u][1].x;
        if (keep && t < nt) { s.tsp[t] = rec[u][1].y; s.tsc[t] = rec[u][2].x; s.tnd[t] = (u32)rec[u][2].y; }
      }
    }
    h = warp_sum64(h); l = warp_sum64(l);
    bd = __any_sync(0xffffffffu, bd != 0);
    if (lane == 0) {
      const dy_u128 sum = dy_add128(dy_make128(h >> 32, h << 32), dy_from64(l));
      int st = DY_ST_OK;
      if (bd) st = DY_ST_TARGET_INVALID_VALUE;
      else if (sum.hi || (sum.lo > LZ_ONE ? sum.lo - LZ_ONE : LZ_ONE - sum.lo) > LZ_TOL) st = DY_ST_TARGET_SUM;
      s.z.rst[j] = st; s.z.T[j] = sum.lo;
    }
  }
  __syncthreads();
  VF_CLK(1);
  if (tid == 0) {
    int jR = 0; u64 TR = 0;
    s.R = lz_walk(s.z, k, n, key, tokens + (i64)b * k1, accepted + b, status + b, &jR, &TR);
    s.jR = jR; s.TR = TR;
  }
  __syncthreads();
  VF_CLK(2);
  const int R = s.R;
  for (int j = tid; j < (allrows ? k1 : ncand); j += 256)  /* replays start at 0 */
    acnt[(i64)b * k1 + (allrows ? j : s.z.cand[j])] = 0;
  if (R < 0) return;
  const u64 T = s.TR;
  const bool bonus = R == n, dense = !bonus && qc && !qi, sparse = !bonus && qc && qi;
  const i64 row = (i64)b * k1 + R;
  const u64* trR = tpart + row * nt * VF_TREC;
  u64* rch = rchunk + 2 * row * nch;
  if (s.jR != ncand - 1) {  /* an AMB test was rejected: that row's tile sums */
    for (int t = tid; t < nt; t += 256) {
      const ulonglong2* tr = (const ulonglong2*)(trR + t * VF_TREC);
      const ulonglong2 r1 = __ldcg(&tr[1]), r2 = __ldcg(&tr[2]);
      s.tsp[t] = r1.y; s.tsc[t] = r2.x; s.tnd[t] = (u32)r2.y;
    }
  }
  ResRow r;
  r.t = target + row * V; r.T = T; r.bonus = bonus; r.d = bonus ? -1 : s.z.d[R];
  r.qcr = dense ? qc + ((i64)b * k + R) * V : (sparse ? qc + ((i64)b * k + R) * W : 0);
  r.qir = sparse ? qi + ((i64)b * k + R) * W : 0;
  r.nv = W;
  if (sparse) {  /* res_setup's count of valid ids (ascending, then -1 padding): thread 0's
    * binary search; the support staged in shared memory when it fits (one round of
    * loads instead of log2 W dependent ones here and in every q_at below; s.cdirty and
    * s.csp are free after the tile phase) */
    if (W <= VF_MAXCT) {
      for (int j = tid; j < W; j += 256) {
        s.cdirty[j] = (u32)__ldg(&r.qir[j]);
        ((u32*)s.csp)[j] = __ldg(&r.qcr[j]);
      }
      r.qir = (const int*)s.cdirty; r.qcr = (const u32*)s.csp;
      __syncthreads();
    }
    if (tid == 0) {
      int l = 0, h = W;
      while (l < h) { const int m = (l + h) >> 1; if (r.qir[m] >= 0) l = m + 1; else h = m; }
      s.z.ncand = l;  /* reused: the walk is done */
    }
  }
  __syncthreads();
  if (sparse) r.nv = s.z.ncand;
  VF_CLK(3);
  /* the listed ambiguous ids of row R, in parallel: (P, c) into their tile and chunk sums
   * where R_v > 0 for the exact T (u64 sums: exact at the end) */
  {
    const u32 na = s.na[s.jR];
    const u64* al = alist + 2 * row * acap;
    for (u32 e = tid; e < na; e += 256) {
      const u64 P = __ldcg(&al[2 * e]), w = __ldcg(&al[2 * e + 1]);
      const int id = (int)(w >> 32);
      const u32 c = (u32)w;
      if (!dy_is_zero128(dy_residual(P, c, T))) {
        atomicAdd((unsigned long long*)&s.tsp[id / vt], (unsigned long long)P);
        atomicAdd((unsigned long long*)&s.tsc[id / vt], (unsigned long long)c);
        atomicAdd((unsigned long long*)&rch[2 * (i64)(id / VF_CH)], (unsigned long long)P);
        atomicAdd((unsigned long long*)&rch[2 * (i64)(id / VF_CH) + 1], (unsigned long long)c);
      }
    }
  }
  if (wid == 7)  /* the draw's first 32 Philox blocks, while the list's loads are in flight */
    dy_philox_block(s.key.seed, s.key.gen, s.key.rnd, s.key.pos + (u32)R, DY_DOMAIN_CORRECTION,
                    (u32)lane, s.rw[lane]);
  int mydirty = 0;
  for (int t = tid; t < nt; t += 256) mydirty |= s.tnd[t] != 0;
  const bool dirty = __syncthreads_or(mydirty);
  VF_CLK(4);
  /* dirty chunks (ids that did not fit in the list): summed again exactly, warp per tile */
  const int cpt = vt / VF_CH;
  for (int t = wid; dirty && t < nt; t += 8) {
    if (!s.tnd[t]) continue;
    const int cf = t * cpt, nc = min(nch, cf + cpt) - cf;
    u64 dp = 0, dc = 0;
    for (int j0 = 0; j0 < nc; j0 += 32) {
      const int j = j0 + lane;
      const u64 w1 = j < nc ? __ldcg(&rch[2 * (i64)(cf + j) + 1]) : 0ull;
      unsigned bal = __ballot_sync(0xffffffffu, (w1 & VF_DIRTY) != 0);
      while (bal) {
        const int L = __ffs(bal) - 1;
        bal &= bal - 1;
        const int ch = cf + j0 + L;
        const u64 op = __shfl_sync(0xffffffffu, j < nc ? __ldcg(&rch[2 * (i64)(cf + j)]) : 0ull, L);
        const u64 oc = __shfl_sync(0xffffffffu, w1 & ~VF_DIRTY, L);
        u64 np, nc2;
        vf_chunk_exact(r, ch * VF_CH, V, &np, &nc2);
        dp += np - op; dc += nc2 - oc;
        if (lane == 0) *(ulonglong2*)(rch + 2 * (i64)ch) = make_ulonglong2(np, nc2);
      }
    }
    if (lane == 0) { s.tsp[t] += dp; s.tsc[t] += dc; }
  }
  if (dirty) __syncthreads();  /* the block's own global writes: a barrier suffices */
  VF_CLK(5);
  if (wid != 0) return;
  /* warp 0: the draw (warp 7's Philox blocks, lr_uniform_below) and the search (verify_residual's token) */
  dy_u128 x1, x2;
  const int jt = lr_find([&](int q) { return lr_val(s.tsp[q], s.tsc[q], T, bonus); }, nt, true,
      [&](dy_u128 tot, dy_u128* px) {
        return lr_uniform_below(tot, s.rw[lane], s.key, s.key.pos + (u32)R, DY_DOMAIN_CORRECTION, px);
      }, dy_make128(0, 0), &x1);
  VF_CLK(6);
  int j = -1;
  if (jt >= 0) {
    const int cf = jt * cpt, nc = min(nch, cf + cpt) - cf;
    if (vt <= 4096) {  /* the tile's rows into L1 while its chunk is found (<= 4 lines per lane) */
      const int lo = jt * vt, nl = (min(V, lo + vt) - lo + 31) / 32;
      for (int l = lane; l < nl; l += 32) {
        asm volatile("prefetch.global.L1 [%0];" :: "l"(r.t + lo + 32 * l));
        if (dense) asm volatile("prefetch.global.L1 [%0];" :: "l"(r.qcr + lo + 32 * l));
      }
    }
    const int jc = lr_find([&](int q) {
        const ulonglong2 w = __ldcg((const ulonglong2*)(rch + 2 * (i64)(cf + q)));
        return lr_val(w.x, w.y & ~VF_DIRTY, T, bonus);
      }, nc, false, [&](dy_u128, dy_u128*) { return false; }, x1, &x2);
    VF_CLK(7);
    if (jc >= 0) j = lr_pick(r, (cf + jc) * VF_CH, V, x2);
  }
  VF_CLK(8);
  if (lane == 0) {
    int* tok = tokens + (i64)b * k1;
    if (j < 0) { status[b] = DY_ST_RNG_EXHAUSTED; accepted[b] = 0; for (int q = 0; q <= k; ++q) tok[q] = -1; }
    else tok[R] = j;
  }
  VF_CLK(9);
  VF_STAMP(true, 16);
  VF_CLK_PUT();
}

/* 2 16-byte loads per thread and row in flight, at most 80 registers (3 blocks per SM),
 * 8 lanes per chunk (3 shuffle levels per 8 ids): on the H200 faster than 4 loads in
 * flight, 2 blocks per SM (118 registers) or both, and than a half warp per chunk (4
 * levels per 4 ids) at B = 64, the same elsewhere (docs/performance.md). */
DC_FN void vf_kernel(
    const u32* target, const int* draft, const u32* qc, const int* qi, int W, int k, int V, int nt,
    const void* kseed, const void* kgen, const void* krnd, const void* kpos, int kfmt,
    u64* tpart, u64* rchunk, u64* alist, u32* acnt, int acap, int* accepted, int* tokens,
    int* status, u32* cnt, int vt, int pre, int vec, int vec_q, int nrows, const int* nd) {
  __shared__ VfShared s;
  const int tile = blockIdx.x, b = dc_grid_row(), tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  if (b >= nrows) return;
  const int k1 = k + 1, nch = (V + VF_CH - 1) / VF_CH;
  /* the request's draft count (num_drafts, bounds-checked before anything is read with it;
   * outside [0, k] the request fails closed with NUM_DRAFTS_INVALID: vr_depth's rule, the
   * count read through the read-only cache) */
  const int n = nd ? __ldg(&nd[b]) : k;
  if (n < 0 || n > k) {
    if (dc_elect_last(&cnt[b], (u32)nt, &s.z.is_last) && tid == 0)
      vr_fail_depth(b, k, accepted, tokens, status);
    return;
  }
  VF_PROF_START();
  VF_STAMP(tile == 0, 0);
  DcKey key; key.seed = 0; key.gen = key.rnd = key.pos = 0;
  if (lane == 0 && (wid < n || tid == 0)) key = load_key(kseed, kgen, krnd, kpos, kfmt, b);
  const int lo = tile * vt, hi = min(V, lo + vt);
  if (pre) {  /* small batches: row 0 (and its dense q row) into L2 while the tests run */
    const u32* t0 = target + (i64)b * k1 * V;
    const int nl = (hi - lo + 31) / 32;  /* 128-byte lines of the tile */
    if (tid < nl) {
      asm volatile("prefetch.global.L2 [%0];" :: "l"(t0 + lo + tid * 32));
      if (qc && !qi && n > 0) asm volatile("prefetch.global.L2 [%0];" :: "l"(qc + (i64)b * k * V + lo + tid * 32));
    }
  }
  /* 1. the tests and the candidate rows */
  const int ncand = lz_tests(target, draft, qc, qi, W, k, n, V, b, key, s.z);
  VF_STAMP(tile == 0, 1);
  /* 2. one pass over each candidate row's tile */
  for (int j = 0; j < ncand; ++j) {
    const int i = s.z.cand[j];
    const bool bonus = i == n, dense = !bonus && qc && !qi, sparse = !bonus && qc && qi;
    const i64 row = (i64)b * k1 + i;
    vf_tile(target + row * V, dense ? qc + ((i64)b * k + i) * V : 0,
            sparse ? qc + ((i64)b * k + i) * W : 0, sparse ? qi + ((i64)b * k + i) * W : 0, W,
            (!bonus && !qc) ? s.z.d[i] : -1, bonus, lo, hi, rchunk + 2 * row * nch,
            tpart + (row * nt + tile) * VF_TREC, alist + 2 * row * acap, acnt + row, acap,
            vec && (!dense || vec_q), s);
  }
  /* 3. the last block of the request */
  VF_STAMP(tile == 0, 2);
  VF_PROF_ARRIVE();
  const bool last = dc_elect_last(&cnt[b], (u32)nt, &s.z.is_last);
  VF_STAMP(tile == 0, 3);
  if (!last) return;
  VF_STAMP(true, 8);
  VF_PROF_LAST();
  vf_last(s, key, ncand, false, target, qc, qi, W, k, n, V, nt, tpart, rchunk, alist, acnt, acap,
          accepted, tokens, status, vt, b);
}

/* The kernel at most 80 registers (3 blocks per SM) and at most 64 (4 blocks per SM);
 * ptxas reports a few bytes of spill stores for each.  The host takes verify_lazy_r64
 * when the grid has more blocks than 3 per SM (B = 64 at V = 129280), verify_lazy else:
 * the faster of the two on the H200 in each case (docs/performance.md). */
extern "C" __global__ void __launch_bounds__(256, 3) verify_lazy(
    const u32* target, const int* draft, const u32* qc, const int* qi, int W, int k, int V, int nt,
    const void* kseed, const void* kgen, const void* krnd, const void* kpos, int kfmt,
    u64* tpart, u64* rchunk, u64* alist, u32* acnt, int acap, int* accepted, int* tokens,
    int* status, u32* cnt, int vt, int pre, int vec, int vec_q, int nrows, const int* nd) {
  vf_kernel(target, draft, qc, qi, W, k, V, nt, kseed, kgen, krnd, kpos, kfmt, tpart, rchunk,
            alist, acnt, acap, accepted, tokens, status, cnt, vt, pre, vec, vec_q, nrows, nd);
}

extern "C" __global__ void __launch_bounds__(256, 4) verify_lazy_r64(
    const u32* target, const int* draft, const u32* qc, const int* qi, int W, int k, int V, int nt,
    const void* kseed, const void* kgen, const void* krnd, const void* kpos, int kfmt,
    u64* tpart, u64* rchunk, u64* alist, u32* acnt, int acap, int* accepted, int* tokens,
    int* status, u32* cnt, int vt, int pre, int vec, int vec_q, int nrows, const int* nd) {
  vf_kernel(target, draft, qc, qi, W, k, V, nt, kseed, kgen, krnd, kpos, kfmt, tpart, rchunk,
            alist, acnt, acap, accepted, tokens, status, cnt, vt, pre, vec, vec_q, nrows, nd);
}
