/* ========================================================================
 * verify, check="lazy", stage 2: dc_vres2, the
 * residual (or bonus) draw of each request, in place of dc_v2.  Included at
 * the end of dyadic_kernels.cu (uses dyadic_core.h, dyadic_cuda.cuh, ResRow /
 * res_weight / dc_resid_thr of that file).
 *
 * Same sums and the same draw as dc_v2; only the search differs.  dc_v2's
 * last block searches a whole tile (up to 8192 ids) with block_draw: per
 * level every lane walks its segment with dependent loads, ~3 levels, one
 * __syncthreads phase each.  dc_vres2 stores, besides the tile sums, the
 * residual sum of every chunk of LR_CH = 64 ids (16 bytes per 64 ids, 1/32 of
 * the row's bytes), so the last block needs one warp and no __syncthreads:
 *   level 1: the tile sums (LR_PL per lane in registers per pass), total,
 *            x = uniform_below_u128(total) (domain CORRECTION, position + i,
 *            index 0: exactly dc_v2's draw), the tile holding x;
 *   level 2: the chunk sums of that tile (<= 128: 4 per lane), the chunk;
 *   level 3: the 64 ids of the chunk (2 per lane, res_weight as dc_v2's
 *            block_draw), the first id whose running sum exceeds x.
 * Exactness: every sum is exact integer arithmetic.  A chunk / tile sum is
 * 2^24 * sum_sel P - T * sum_sel c (bonus row: sum P) with sel = {P > thr(c)}
 * (= {R_v > 0}, as in dc_v2), u64 partial sums exact (subset sums of a valid
 * row < 2^63, sums of counts < 2^64), the 128-bit value exact; so the tile
 * sums equal dc_v2's and each chunk sum is the sum of res_weight over its ids.
 * Hence x, the tile, the chunk and the id are those of dc_v2's block_draw (the
 * first id whose running residual sum exceeds x).  Sparse q: the chunk sums
 * in shared memory get dc_v2's support corrections (per support entry j with
 * its id in the tile, by shared 64-bit atomics: sums mod 2^64, exact at the
 * end) before they are written.  Point mass: c_v = 2^24 [v == d] inline.
 * Graph replay: rcnt is reset by the last block; rpart / rchunk entries of a
 * request are all rewritten by each launch before they are read.
 * ====================================================================== */
#define LR_CH 64   /* ids per chunk (tiles are multiples of 1024) */
#define LR_CU 2    /* 16-byte loads in flight per thread and row */
#define LR_SU 4    /* scalar path: chunks per warp and iteration */
#define LR_PL 4    /* values per lane and pass in the warp search */
#define LR_MAXCT 128 /* chunks per tile (rt <= 8192) */

struct LrShared {
  u64 sp[8], sc[8];
  u64 csp[LR_MAXCT], csc[LR_MAXCT];
  int is_last, nv;
};

DC_FN dy_u128 lr_ld(const u64* a, int j) {
  const ulonglong2 v = __ldcg((const ulonglong2*)(a + 2 * (i64)j));
  return dy_make128(v.y, v.x);
}

DC_FN void lr_st(u64* a, int j, dy_u128 r) {
  *(ulonglong2*)(a + 2 * (i64)j) = make_ulonglong2(r.lo, r.hi);
}

/* The residual sum of a set of ids from its (sum_sel P, sum_sel c). */
DC_FN dy_u128 lr_val(u64 sp, u64 sc, u64 T, bool bonus) {
  return bonus ? dy_from64(sp)
               : dy_sub128(dy_make128(sp >> (64 - DY_TOTAL_BITS), sp << DY_TOTAL_BITS), dy_mul64(sc, T));
}

DC_FN void lr_elem(u32 bits, u64 c, u64 th, u64 tl, u64& sp, u64& sc) {
  const u64 P = dy_target_fixed_fast(bits);
  const u64 m = (u64)0 - (u64)(P > dc_resid_thr(c, th, tl));
  sp += P & m; sc += c & m;
}

DC_FN dy_u128 lr_shfl(dy_u128 v, int src) {
  return dy_make128(__shfl_sync(0xffffffffu, v.hi, src), __shfl_sync(0xffffffffu, v.lo, src));
}

DC_FN dy_u128 lr_scan(dy_u128 v) {  /* warp inclusive scan */
  const int lane = threadIdx.x & 31;
  for (int o = 1; o < 32; o <<= 1) {
    const dy_u128 u = dy_make128(__shfl_up_sync(0xffffffffu, v.hi, o), __shfl_up_sync(0xffffffffu, v.lo, o));
    if (lane >= o) v = dy_add128(v, u);
  }
  return v;
}

/* dy_uniform_below_u128 (draw indices from 0) by one warp: lane j takes draw index
 * base + j, w0 its block at base 0 (computed ahead, e.g. by another warp), the blocks
 * of later bases (probability <= 2**-32 each) computed here; the first accepted index
 * wins, so x is the sequential loop's.  Every lane returns the same. */
DC_FN int lr_uniform_below(dy_u128 n, const u32* w0, const DcKey& key, u32 pos, u32 domain,
                           dy_u128* out) {
  const int lane = threadIdx.x & 31;
  const dy_u128 mask = dy_mask128(dy_bitlen128(dy_sub128(n, dy_from64(1))));
  for (u32 base = 0; base <= DY_MAX_DRAW_INDEX; base += 32) {
    u32 w[4];
    if (base == 0) { w[0] = w0[0]; w[1] = w0[1]; w[2] = w0[2]; w[3] = w0[3]; }
    else dy_philox_block(key.seed, key.gen, key.rnd, pos, domain, base + lane, w);
    const dy_u128 x = dy_and128(dy_make128((u64)w[2] | ((u64)w[3] << 32), (u64)w[0] | ((u64)w[1] << 32)), mask);
    const unsigned bal = __ballot_sync(0xffffffffu, dy_lt128(x, n) && base + lane <= DY_MAX_DRAW_INDEX);
    if (bal) { *out = lr_shfl(x, __ffs(bal) - 1); return 1; }
  }
  return 0;
}

/* One warp: j in [0, n) with S(j) <= x < S(j + 1), S the prefix sums of the
 * 128-bit values load(0..n) (load(j): the j-th value); *off = x - S(j).  With first, x is drawn below the
 * total first (drawx(total, &x), called by every lane with the same total, returns
 * the same in every lane; a zero total or exhaustion: -1).  -1 when x is not
 * below the total.  Every lane returns the same. */
template <class LD, class D>
DC_FN int lr_find(LD load, int n, bool first, D drawx, dy_u128 x, dy_u128* off) {
  const int lane = threadIdx.x & 31;
  dy_u128 w[LR_PL];
  dy_u128 s = dy_make128(0, 0);
#pragma unroll
  for (int e = 0; e < LR_PL; ++e) {
    const int j = lane * LR_PL + e;
    w[e] = j < n ? load(j) : dy_make128(0, 0);
    s = dy_add128(s, w[e]);
  }
  dy_u128 inc = lr_scan(s);
  if (first) {
    dy_u128 tot = lr_shfl(inc, 31);
    if (n > 32 * LR_PL) {  /* ids beyond the first pass (warp-uniform test) */
      dy_u128 ex = dy_make128(0, 0);
#pragma unroll 4
      for (int j = 32 * LR_PL + lane; j < n; j += 32) ex = dy_add128(ex, load(j));
      tot = dy_add128(tot, warp_sum128(ex));
    }
    if (dy_is_zero128(tot) || !drawx(tot, &x)) return -1;
  }
  dy_u128 base = dy_make128(0, 0);
  for (int p0 = 0;;) {
    const unsigned bal = __ballot_sync(0xffffffffu, dy_lt128(x, dy_add128(base, inc)));
    if (bal) {
      const int L = __ffs(bal) - 1;
      int r = -1;
      dy_u128 o = dy_make128(0, 0);
      if (lane == L) {
        dy_u128 cum = dy_add128(base, dy_sub128(inc, s));
#pragma unroll
        for (int e = 0; e < LR_PL; ++e) {
          const dy_u128 nc = dy_add128(cum, w[e]);
          if (r < 0 && dy_lt128(x, nc)) { r = p0 + lane * LR_PL + e; o = dy_sub128(x, cum); }
          cum = nc;
        }
      }
      *off = lr_shfl(o, L);
      return __shfl_sync(0xffffffffu, r, L);
    }
    base = dy_add128(base, lr_shfl(inc, 31));
    p0 += 32 * LR_PL;
    if (p0 >= n) return -1;
    s = dy_make128(0, 0);
#pragma unroll
    for (int e = 0; e < LR_PL; ++e) {
      const int j = p0 + lane * LR_PL + e;
      w[e] = j < n ? load(j) : dy_make128(0, 0);
      s = dy_add128(s, w[e]);
    }
    inc = lr_scan(s);
  }
}

/* One warp: the first id v of the chunk [v0, v0 + LR_CH) whose running residual sum
 * (res_weight) exceeds x (x below the chunk's sum); -1 when none.  Every lane returns it. */
DC_FN int lr_pick(const ResRow& r, int v0, int V, dy_u128 x) {
  const int v = v0 + 2 * (threadIdx.x & 31);
  const dy_u128 w0 = v < V ? res_weight(r, v) : dy_make128(0, 0);
  const dy_u128 w1 = v + 1 < V ? res_weight(r, v + 1) : dy_make128(0, 0);
  const dy_u128 sw = dy_add128(w0, w1), inc = lr_scan(sw);
  const unsigned bal = __ballot_sync(0xffffffffu, dy_lt128(x, inc));
  if (!bal) return -1;
  const int L = __ffs(bal) - 1;
  const int jj = dy_lt128(x, dy_add128(dy_sub128(inc, sw), w0)) ? v : v + 1;
  return __shfl_sync(0xffffffffu, jj, L);
}

extern "C" __global__ void __launch_bounds__(256) dc_vres2(
    const u32* target, const int* draft, const u32* qc, const int* qi, int W, int k, int V, int nrt,
    const void* kseed, const void* kgen, const void* krnd, const void* kpos, int kfmt,
    const int* res_row, const u64* res_T, u64* rpart, u64* rchunk, int* accepted, int* tokens, int* status,
    u32* rcnt, int rt, int vec_t, int vec_q, int nrows) {
  __shared__ LrShared s;
  const int tile = blockIdx.x, b = dc_grid_row(), tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  if (b >= nrows) return;
  const int i = res_row[b];
  if (i < 0) return;
  const u64 T = res_T[b], th = T >> DY_TOTAL_BITS, tl = T & (u64)(DY_TOTAL - 1u);
  const u32* trow = target + ((i64)b * (k + 1) + i) * V;
  const bool bonus = i == k, dense = !bonus && qc && !qi, sparse = !bonus && qc && qi, point = !bonus && !qc;
  const u32* qrow = dense ? qc + ((i64)b * k + i) * V : 0;
  const int d = point ? draft[(i64)b * k + i] : -1;
  const int lo = tile * rt, hi = min(V, lo + rt);
  const int nch = (V + LR_CH - 1) / LR_CH, c0 = lo / LR_CH, nct = (hi - lo + LR_CH - 1) / LR_CH;
  u64* rch = rchunk + 2 * (i64)b * nch;
  u64 tp = 0, tc = 0;  /* this thread's share of the tile's sum_sel P, sum_sel c */
  /* c_v: dense q[v]; point mass 2^24 [v == d]; bonus / sparse 0 (sparse: corrected below) */
  if (vec_t && (!dense || vec_q)) {
    const uint4* t4 = (const uint4*)(trow + lo);
    const uint4* q4 = dense ? (const uint4*)(qrow + lo) : 0;
    const int n4 = (hi - lo) >> 2;
    for (int base = 0; base < n4; base += 256 * LR_CU) {  /* uniform trip count: shuffles below */
      uint4 tb[LR_CU], qb[LR_CU];
#pragma unroll
      for (int u = 0; u < LR_CU; ++u) {
        const int g = base + tid + u * 256;
        tb[u] = g < n4 ? __ldcs(&t4[g]) : make_uint4(0, 0, 0, 0);
        qb[u] = (dense && g < n4) ? __ldcs(&q4[g]) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < LR_CU; ++u) {
        const int g = base + tid + u * 256, v = lo + 4 * g;
        const u32 bb[4] = {tb[u].x, tb[u].y, tb[u].z, tb[u].w};
        const u32 cc[4] = {qb[u].x, qb[u].y, qb[u].z, qb[u].w};
        u64 sp = 0, sc = 0;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const u64 c = dense ? (u64)cc[e] : (v + e == d ? (u64)DY_TOTAL : 0ull);
          lr_elem(bb[e], c, th, tl, sp, sc);
        }
        tp += sp; tc += sc;
        /* the 16 lanes of a half warp hold one chunk (lo / 4 and g - lane % 16 are multiples of 16) */
#pragma unroll
        for (int o = 8; o; o >>= 1) sp += __shfl_xor_sync(0xffffffffu, sp, o);
        if (dense || point) {
#pragma unroll
          for (int o = 8; o; o >>= 1) sc += __shfl_xor_sync(0xffffffffu, sc, o);
        }
        if ((lane & 15) == 0 && g < n4) {
          const int cl = g >> 4;
          if (sparse) { s.csp[cl] = sp; s.csc[cl] = sc; }
          else lr_st(rch, c0 + cl, lr_val(sp, sc, T, bonus));
        }
      }
    }
  } else {  /* scalar loads: warp w takes chunks w, w + 8, ... (ids lane and lane + 32) */
    for (int cb = 0; cb < nct; cb += 8 * LR_SU) {
      u32 tb[2 * LR_SU], qb[2 * LR_SU];
#pragma unroll
      for (int u = 0; u < 2 * LR_SU; ++u) {
        const int v = lo + (cb + wid + 8 * (u >> 1)) * LR_CH + lane + 32 * (u & 1);
        tb[u] = v < hi ? __ldcs(&trow[v]) : 0u;
        qb[u] = (dense && v < hi) ? __ldcs(&qrow[v]) : 0u;
      }
#pragma unroll
      for (int u = 0; u < LR_SU; ++u) {
        const int cl = cb + wid + 8 * u, v = lo + cl * LR_CH + lane;
        u64 sp = 0, sc = 0;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int ve = v + 32 * e;
          const u64 c = dense ? (u64)qb[2 * u + e] : (ve == d ? (u64)DY_TOTAL : 0ull);
          lr_elem(tb[2 * u + e], c, th, tl, sp, sc);
        }
        tp += sp; tc += sc;
        sp = warp_sum64(sp); sc = warp_sum64(sc);
        if (lane == 0 && cl < nct) {
          if (sparse) { s.csp[cl] = sp; s.csc[cl] = sc; }
          else lr_st(rch, c0 + cl, lr_val(sp, sc, T, bonus));
        }
      }
    }
  }
  if (sparse) {  /* dc_v2's support corrections, per chunk; then the chunk sums */
    __syncthreads();
    const u32* qcr = qc + ((i64)b * k + i) * W;
    const int* qir = qi + ((i64)b * k + i) * W;
    for (int j = tid; j < W; j += 256) {
      const int id = qir[j];
      if (id >= lo && id < hi) {
        const u64 P = dy_target_fixed_fast(trow[id]), c = qcr[j];
        const int cl = (id - lo) / LR_CH;
        if (P > dc_resid_thr(c, th, tl)) atomicAdd((unsigned long long*)&s.csc[cl], (unsigned long long)c);
        else atomicAdd((unsigned long long*)&s.csp[cl], (unsigned long long)((u64)0 - P));
      }
    }
    __syncthreads();
    tp = 0; tc = 0;
    for (int cl = tid; cl < nct; cl += 256) {
      const u64 sp = s.csp[cl], sc = s.csc[cl];
      tp += sp; tc += sc;
      lr_st(rch, c0 + cl, lr_val(sp, sc, T, false));
    }
  }
  /* the tile sum (one block reduction) */
  tp = warp_sum64(tp); tc = warp_sum64(tc);
  if (lane == 0) { s.sp[wid] = tp; s.sc[wid] = tc; }
  __syncthreads();
  if (tid == 0) {
    u64 P = 0, C = 0;
    for (int w = 0; w < 8; ++w) { P += s.sp[w]; C += s.sc[w]; }
    lr_st(rpart + 2 * (i64)b * nrt, tile, lr_val(P, C, T, bonus));
  }
  if (!dc_elect_last(&rcnt[b], (u32)nrt, &s.is_last) || wid > 1) return;
  const u32* qcr = sparse ? qc + ((i64)b * k + i) * W : (dense ? qrow : 0);
  const int* qir = sparse ? qi + ((i64)b * k + i) * W : 0;
  if (wid == 1) {  /* sparse: res_setup's count of valid ids, beside warp 0's search */
    if (sparse) {
      if (lane == 0) {
        int l = 0, h = W;
        while (l < h) { int m = (l + h) >> 1; if (qir[m] >= 0) l = m + 1; else h = m; }
        s.nv = l;
      }
      __syncwarp();
      asm volatile("bar.sync 1, 64;" ::: "memory");
    }
    return;
  }
  /* warp 0 */
  DcKey key; key.seed = 0; key.gen = key.rnd = key.pos = 0;
  if (lane == 0) key = load_key(kseed, kgen, krnd, kpos, kfmt, b);
  dy_u128 x1, x2;
  const u64* rp = rpart + 2 * (i64)b * nrt;
  const int jt = lr_find([&](int q) { return lr_ld(rp, q); }, nrt, true,
      [&](dy_u128 tot, dy_u128* px) {  /* lane 0 draws (its key), then broadcasts */
        u32 idx = 0; int ok = 0; dy_u128 xx = dy_make128(0, 0);
        if (lane == 0) ok = dy_uniform_below_u128(tot, key.seed, key.gen, key.rnd, key.pos + i,
                                                  DY_DOMAIN_CORRECTION, &idx, &xx) == DY_ST_OK;
        *px = lr_shfl(xx, 0);
        return __shfl_sync(0xffffffffu, ok, 0);
      }, dy_make128(0, 0), &x1);
  int j = -1;
  if (jt >= 0) {
    const int cpt = rt / LR_CH, cf = jt * cpt, nc = min(nch, cf + cpt) - cf;
    const u64* rc = rch + 2 * (i64)cf;
    const int jc = lr_find([&](int q) { return lr_ld(rc, q); }, nc, false,
                           [&](dy_u128, dy_u128*) { return false; }, x1, &x2);
    if (jc >= 0) {
      ResRow r;
      r.t = trow; r.T = T; r.bonus = bonus; r.qcr = qcr; r.qir = qir; r.d = bonus ? -1 : draft[(i64)b * k + i];
      r.nv = W;
      if (sparse) { asm volatile("bar.sync 1, 64;" ::: "memory"); r.nv = s.nv; }
      j = lr_pick(r, (cf + jc) * LR_CH, V, x2);
    } else if (sparse) asm volatile("bar.sync 1, 64;" ::: "memory");
  } else if (sparse) asm volatile("bar.sync 1, 64;" ::: "memory");
  if (lane == 0) {
    if (j < 0) { status[b] = DY_ST_RNG_EXHAUSTED; accepted[b] = 0; for (int q = 0; q <= k; ++q) tokens[(i64)b * (k + 1) + q] = -1; }
    else tokens[(i64)b * (k + 1) + i] = j;
  }
}

/* ------------------------------------------------------------------------
 * Stage 1, dc_vlazy2 (the algorithm of verify_lazy.cuh's header) with, for small
 * batches (pre != 0), row 0's first LZ_PRE 16-byte words per thread of the
 * tile loaded before the classification (used when row 0 is a candidate) and
 * an L2 prefetch of the dense q row of the last candidate (stage 2's residual
 * row when the chain ends at that rejection).  (With the early loads and dc_vres2's
 * chunk sums the two launches are faster on the H200 at B = 4 and 64 than the same
 * work without them, docs/performance.md.) */
#define LZ_PRE 4

/* Split sums (P >> 32, P & (2^32 - 1)) and the validity of target[lo, hi)
 * (<= 64 terms per thread, vt <= 16384; thread 0 gets the 128-bit sum), with
 * the first LZ_PRE x 256 16-byte words of the tile already in pbuf when
 * use_pre (padding words 0 add nothing and are valid). */
DC_FN void lz_tile2(const u32* t, int lo, int hi, int vec, LzShared& s, dy_u128* sum, u32* bad,
                    bool use_pre, const uint4 (&pbuf)[LZ_PRE]) {
  const int tid = threadIdx.x;
  u64 shi = 0, slo = 0; u32 bd = 0;
  if (vec) {
    const uint4* t4 = (const uint4*)(t + lo);
    const int n4 = (hi - lo) >> 2;
    int start = tid;
    if (use_pre) {
#pragma unroll
      for (int u = 0; u < LZ_PRE; ++u) {
        const u32 bb[4] = {pbuf[u].x, pbuf[u].y, pbuf[u].z, pbuf[u].w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const u64 p = dy_target_fixed_fast(bb[e]);
          bd |= (u32)!dy_target_bits_valid(bb[e]);
          shi += p >> 32; slo += p & 0xFFFFFFFFull;
        }
      }
      start = tid + 256 * LZ_PRE;
    }
    for (int g0 = start; g0 < n4; g0 += 256 * VU) {
      uint4 buf[VU];
#pragma unroll
      for (int u = 0; u < VU; ++u) { int g = g0 + u * 256; buf[u] = g < n4 ? __ldg(&t4[g]) : make_uint4(0, 0, 0, 0); }
#pragma unroll
      for (int u = 0; u < VU; ++u) {
        const u32 bb[4] = {buf[u].x, buf[u].y, buf[u].z, buf[u].w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const u64 p = dy_target_fixed_fast(bb[e]);
          bd |= (u32)!dy_target_bits_valid(bb[e]);
          shi += p >> 32; slo += p & 0xFFFFFFFFull;
        }
      }
    }
  } else {
    for (int v0 = lo + tid; v0 < hi; v0 += 256 * 4 * VU) {
      u32 buf[4 * VU];
#pragma unroll
      for (int u = 0; u < 4 * VU; ++u) { int v = v0 + u * 256; buf[u] = v < hi ? __ldg(&t[v]) : 0u; }
#pragma unroll
      for (int u = 0; u < 4 * VU; ++u) {
        const u64 p = dy_target_fixed_fast(buf[u]);
        bd |= (u32)!dy_target_bits_valid(buf[u]);
        shi += p >> 32; slo += p & 0xFFFFFFFFull;
      }
    }
  }
  for (int o = 16; o; o >>= 1) {
    shi += __shfl_xor_sync(0xffffffffu, shi, o);
    slo += __shfl_xor_sync(0xffffffffu, slo, o);
  }
  bd = __reduce_or_sync(0xffffffffu, bd);
  const int lane = tid & 31, wid = tid >> 5;
  if (lane == 0) { s.shi[wid] = shi; s.slo[wid] = slo; s.bad[wid] = bd; }
  __syncthreads();
  if (tid == 0) {
    u64 h = 0, l = 0; u32 b = 0;
    for (int w = 0; w < 8; ++w) { h += s.shi[w]; l += s.slo[w]; b |= s.bad[w]; }
    *sum = dy_add128(dy_make128(h >> 32, h << 32), dy_from64(l));
    *bad = b;
  }
  __syncthreads();  /* s.shi / s.slo / s.bad reused by the next call */
}

/* Steps 1-2 of dc_vlazy2 (and dc_vfused, dc_vone): classify the k tests of request b
 * (warp per test; the key in lane 0 of warps < k) into s.P / c / d / cls / code and
 * check each draft id and q row (dc_draft_check: s.qbad, and q(d) from the same pass
 * over a sparse row), then the request's code s.rq (DRAFT_OUT_OF_RANGE when a draft id
 * lies outside [0, V), else Q_INVALID when a q row breaks a Dyadic rule, else 0) and the
 * candidate rows s.cand[0..n): the AMB tests before the first REJ / BAD test, then
 * that REJ row (or the bonus row k when no REJ / BAD comes first).  The same in every
 * block of the request.  Returns n (block-uniform; ends with a __syncthreads). */
DC_FN int lz_tests(const u32* target, const int* draft, const u32* qc, const int* qi, int W, int k,
                   int V, int b, const DcKey& key, LzShared& s) {
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5, k1 = k + 1;
  for (int i = wid; i < k; i += 8) {
    const i64 qrow = (i64)b * k + i;
    const int d = draft[qrow];
    const bool inr = d >= 0 && d < V;
    /* P(d)'s load first: in flight with the q row's */
    const u32 bits = (lane == 0 && inr) ? target[((i64)b * k1 + i) * V + d] : 0u;
    u32 c;
    const u32 ib = dc_draft_check(d, qc, qi, W, V, qrow, &c);
    if (lane == 0) {
      int cl = LZ_BAD, code = inr ? DY_ST_Q_ZERO_AT_DRAFT : DY_ST_DRAFT_OUT_OF_RANGE;
      u64 P = 0;
      if (inr) {
        if (!dy_target_bits_valid(bits)) code = DY_ST_TARGET_INVALID_VALUE;
        else if (c != 0) {
          P = dy_target_fixed(bits);
          cl = lz_classify(P, c, key, key.pos + (u32)i);
          code = DY_ST_OK;
        }
      }
      s.P[i] = P; s.c[i] = c; s.d[i] = d; s.cls[i] = cl; s.code[i] = code;
      s.qbad[i] = (ib & 1u) != 0;
    }
  }
  __syncthreads();
  /* 2. the request's code and the candidate rows (the same in every block of the request) */
  if (tid == 0) {
    int rq = 0;
    for (int i = 0; i < k; ++i) {
      if (s.code[i] == DY_ST_DRAFT_OUT_OF_RANGE) rq = DY_ST_DRAFT_OUT_OF_RANGE;
      else if (s.qbad[i] && !rq) rq = DY_ST_Q_INVALID;
    }
    s.rq = rq;
    int n = 0, stop = k;
    for (int i = 0; i < k; ++i) {
      const int cl = s.cls[i];
      if (cl == LZ_ACC) continue;
      if (cl == LZ_AMB) { s.cand[n++] = i; continue; }
      stop = cl == LZ_REJ ? i : -1;  /* BAD: no residual row */
      break;
    }
    if (stop >= 0) s.cand[n++] = stop;
    s.ncand = n;
  }
  __syncthreads();
  return s.ncand;
}

/* The chain walk of a last block (one thread), from the classes of lz_tests and,
 * per candidate j, its row status s.rst[j] and exact total s.T[j]: ACC -> accepted;
 * BAD -> fail with its code; AMB -> row status, then dy_accept with the exact T;
 * REJ / bonus -> row status.  A target code it meets (TARGET_*: the rows it read)
 * decides; else the request's s.rq (a draft id or q row lz_tests refused) does, before
 * the walk's other results (Q_ZERO_AT_DRAFT, RNG_EXHAUSTED, a residual row): the CPU
 * backend's order on what was read.  Writes tok[0..k] (accepted drafts; -1 from the
 * residual row on, or everywhere on failure), *accepted and *status.  Returns the
 * residual row R (*jR its candidate index, *TR its total), or -1 after a failure. */
DC_FN int lz_walk(const LzShared& s, int k, const DcKey& key, int* tok, int* accepted, int* status,
                  int* jR, u64* TR) {
  int code = DY_ST_OK, R = -1, j = 0;
  for (int i = 0; i <= k; ++i) {
    if (i == k) {  /* bonus row: the last candidate */
      if (s.rst[j]) code = s.rst[j];
      else { R = k; *jR = j; *TR = s.T[j]; }
      break;
    }
    const int cl = s.cls[i];
    if (cl == LZ_BAD) { code = s.code[i]; break; }
    if (cl == LZ_ACC) { tok[i] = s.d[i]; continue; }
    const int jj = j++;  /* AMB or REJ: candidate jj is row i */
    if (s.rst[jj]) { code = s.rst[jj]; break; }
    if (cl == LZ_AMB) {
      int ok = 0;
      code = dy_accept(s.P[i], s.T[jj], s.c[i], key.seed, key.gen, key.rnd, key.pos + (u32)i, &ok);
      if (code) break;
      if (ok) { tok[i] = s.d[i]; continue; }
    }
    R = i; *jR = jj; *TR = s.T[jj];
    break;
  }
  if (s.rq && code != DY_ST_TARGET_INVALID_VALUE && code != DY_ST_TARGET_SUM) code = s.rq;
  if (code) {
    for (int q = 0; q <= k; ++q) tok[q] = -1;
    *accepted = 0; *status = code;
    return -1;
  }
  for (int q = R; q <= k; ++q) tok[q] = -1;
  *accepted = R; *status = DY_ST_OK;
  return R;
}

extern "C" __global__ void __launch_bounds__(256) dc_vlazy2(
    const u32* target, const int* draft, const u32* qc, const int* qi, int W, int k, int V, int nt,
    const void* kseed, const void* kgen, const void* krnd, const void* kpos, int kfmt,
    u64* part_lo, u64* part_hi, u32* part_bad, int* res_row, u64* res_T, int* accepted, int* tokens,
    int* status, u32* cnt, int vt, int vec, int pre, int nrows) {
  __shared__ LzShared s;
  const int tile = blockIdx.x, b = dc_grid_row(), tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  if (b >= nrows) return;
  const int k1 = k + 1;
  /* 1. classify the k tests (warp per test); the key is loaded first (its
   * latency overlaps the draft -> P(d), c(d) loads) */
  DcKey key; key.seed = 0; key.gen = key.rnd = key.pos = 0;
  if (lane == 0 && wid < k) key = load_key(kseed, kgen, krnd, kpos, kfmt, b);
  const int lo = tile * vt, hi = min(V, lo + vt);
  /* small batches: row 0's first LZ_PRE x 4 KiB of the tile are loaded now, their latency
   * overlapping the classification (row 0 is the first candidate unless test 0 is
   * accepted for every T or fails) */
  uint4 pbuf[LZ_PRE];
#pragma unroll
  for (int u = 0; u < LZ_PRE; ++u) pbuf[u] = make_uint4(0, 0, 0, 0);
  const bool pf = pre && vec;
  if (pf) {
    const uint4* t4 = (const uint4*)(target + (i64)b * k1 * V + lo);
    const int n4 = (hi - lo) >> 2;
#pragma unroll
    for (int u = 0; u < LZ_PRE; ++u) { const int g = tid + u * 256; pbuf[u] = g < n4 ? __ldg(&t4[g]) : make_uint4(0, 0, 0, 0); }
  }
  const int ncand = lz_tests(target, draft, qc, qi, W, k, V, b, key, s);
  if (pf && ncand > 0) {  /* the last candidate row (stage 2 reads it, with its dense q row) */
    const int i = s.cand[ncand - 1];
    if (i < k && qc && !qi && tid < ((hi - lo) * 4 + 127) / 128)
      asm volatile("prefetch.global.L2 [%0];" :: "l"(qc + ((i64)b * k + i) * V + lo + tid * 32));
  }
  for (int j = 0; j < ncand; ++j) {
    const int i = s.cand[j];
    dy_u128 sum; u32 bad;
    lz_tile2(target + ((i64)b * k1 + i) * V, lo, hi, vec, s, &sum, &bad, pf && i == 0, pbuf);
    if (tid == 0) {
      const i64 o = ((i64)b * k1 + i) * nt + tile;
      part_lo[o] = sum.lo; part_hi[o] = sum.hi; part_bad[o] = bad ? 1u : 0u;
    }
  }
  /* 3. the last block of the request */
  if (!dc_elect_last(&cnt[b], (u32)nt, &s.is_last)) return;
  for (int j = wid; j < ncand; j += 8) {
    const i64 o = ((i64)b * k1 + s.cand[j]) * nt;
    dy_u128 sum = dy_make128(0, 0); u32 bad = 0;
    for (int t = lane; t < nt; t += 32) {
      sum = dy_add128(sum, dy_make128(__ldcg(&part_hi[o + t]), __ldcg(&part_lo[o + t])));
      bad |= __ldcg(&part_bad[o + t]);
    }
    sum = warp_sum128(sum);
    bad = __any_sync(0xffffffffu, bad != 0);
    if (lane == 0) {
      int st = DY_ST_OK;
      if (bad) st = DY_ST_TARGET_INVALID_VALUE;
      else if (sum.hi || (sum.lo > LZ_ONE ? sum.lo - LZ_ONE : LZ_ONE - sum.lo) > LZ_TOL) st = DY_ST_TARGET_SUM;
      s.rst[j] = st; s.T[j] = sum.lo;
    }
  }
  __syncthreads();
  if (tid != 0) return;
  int jR;
  u64 TR = 0;
  /* key: loaded by thread 0 in step 1 (k >= 1 when a test is AMB) */
  const int R = lz_walk(s, k, key, tokens + (i64)b * k1, accepted + b, status + b, &jR, &TR);
  res_row[b] = R;
  if (R >= 0) res_T[b] = TR;
}
