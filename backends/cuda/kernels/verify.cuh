/* ========================================================================
 * verify (check=False / True) in two launches, verify_chain + verify_residual:
 * the route for greedy requests and for batches where verify_one_launch is not
 * taken (docs/architecture.md).  verify_chain: runtime tile size vt (a multiple of
 * 1024 chosen so that >= ~4 blocks per SM are in flight), 16-byte loads
 * (uint4) when vec != 0 (V % 4 == 0 and a 16-byte aligned base), U loads in
 * flight per thread, per-thread split sums (sum of P >> 32 and of P & (2^32-1):
 * plain u64, exact: <= 64 terms per thread, <= 2^46 per block) and ONE
 * block reduction (warp shuffles, one __syncthreads) per tile.  The 128-bit
 * tile sum is formed once by thread 0.  The last block of a request runs the
 * acceptance chain (vchain_body). */
#define VU 8
struct V1Acc { u64 shi, slo, mx; u32 bad; };

DC_FN void v1_one(V1Acc& a, u32 b, int v) {
  const u64 p = dy_target_fixed_fast(b);
  a.bad |= (u32)!dy_target_bits_valid(b);
  a.shi += p >> 32; a.slo += p & 0xFFFFFFFFull;
  const u64 key = ((u64)(b & 0x7FFFFFFFu) << 32) | (u64)(0xFFFFFFFFu - (u32)v);
  a.mx = key > a.mx ? key : a.mx;
}

struct V1Shared { u64 shi[8], slo[8], mx[8]; u32 bad[8]; };

DC_FN void v1_body(const int r, const int tile, const int vt, const int vec, V1Shared& s1,
    const u32* target, int V, int ntiles, u64* part_lo, u64* part_hi, u64* part_max, u32* part_bad) {
  const u32* t = target + (i64)r * V;
  const int lo = tile * vt, hi = min(V, lo + vt), tid = threadIdx.x;
  V1Acc a; a.shi = 0; a.slo = 0; a.mx = 0; a.bad = 0;
  if (vec) {
    const uint4* t4 = (const uint4*)(t + lo);
    const int n4 = (hi - lo) >> 2;
    for (int g0 = tid; g0 < n4; g0 += 256 * VU) {
      uint4 buf[VU];
#pragma unroll
      for (int u = 0; u < VU; ++u) { int g = g0 + u * 256; buf[u] = g < n4 ? __ldcs(&t4[g]) : make_uint4(0, 0, 0, 0); }
#pragma unroll
      for (int u = 0; u < VU; ++u) {
        int g = g0 + u * 256;
        if (g < n4) {
          const int v = lo + 4 * g;
          v1_one(a, buf[u].x, v); v1_one(a, buf[u].y, v + 1); v1_one(a, buf[u].z, v + 2); v1_one(a, buf[u].w, v + 3);
        }
      }
    }
  } else {
    for (int v0 = lo + tid; v0 < hi; v0 += 256 * 4 * VU) {
      u32 buf[4 * VU];
#pragma unroll
      for (int u = 0; u < 4 * VU; ++u) { int v = v0 + u * 256; buf[u] = v < hi ? __ldcs(&t[v]) : 0u; }
#pragma unroll
      for (int u = 0; u < 4 * VU; ++u) { int v = v0 + u * 256; if (v < hi) v1_one(a, buf[u], v); }
    }
  }
  /* one block reduction of (shi, slo, mx, bad) */
  for (int o = 16; o; o >>= 1) {
    a.shi += __shfl_xor_sync(0xffffffffu, a.shi, o);
    a.slo += __shfl_xor_sync(0xffffffffu, a.slo, o);
    u64 m = __shfl_xor_sync(0xffffffffu, a.mx, o); a.mx = m > a.mx ? m : a.mx;
  }
  a.bad = __reduce_or_sync(0xffffffffu, a.bad);
  const int lane = tid & 31, wid = tid >> 5;
  if (lane == 0) { s1.shi[wid] = a.shi; s1.slo[wid] = a.slo; s1.mx[wid] = a.mx; s1.bad[wid] = a.bad; }
  __syncthreads();
  if (tid == 0) {
    u64 h = 0, l = 0, m = 0; u32 bd = 0;
    for (int w = 0; w < 8; ++w) { h += s1.shi[w]; l += s1.slo[w]; m = s1.mx[w] > m ? s1.mx[w] : m; bd |= s1.bad[w]; }
    const dy_u128 s = dy_add128(dy_make128(h >> 32, h << 32), dy_from64(l));
    const i64 o = (i64)r * ntiles + tile;
    part_lo[o] = s.lo; part_hi[o] = s.hi; part_max[o] = m; part_bad[o] = bd ? 1u : 0u;
  }
}

extern "C" __global__ void __launch_bounds__(256) verify_chain(
    const u32* target, const int* draft, const u32* qc, const int* qi, int W, const unsigned char* greedy,
    int B, int k, int V, int ntiles, const u64* part_lo, const u64* part_hi, const u64* part_max,
    const u32* part_bad, const void* kseed, const void* kgen, const void* krnd, const void* kpos, int kfmt,
    int* res_row, u64* res_T, int* accepted, int* tokens, int* status, u32* vcnt, int vt, int vec,
    const int* nd) {
  __shared__ V1Shared s1;
  __shared__ int is_last;
  /* grid (ntiles, rows) (rows over y and z: dc_grid_row): consecutive blocks read
   * consecutive tiles of a row */
  const int tile = blockIdx.x, r = dc_grid_row(), b = r / (k + 1);
  if (r >= B * (k + 1)) return;
  /* nd (num_drafts, or null): a row beyond the request's depth is not read, its tile
   * record neither written nor read (the block only arrives at the counter) */
  const int n = vr_depth(nd, b, k);
  if (r - b * (k + 1) <= n)
    v1_body(r, tile, vt, vec, s1, target, V, ntiles, (u64*)part_lo, (u64*)part_hi, (u64*)part_max, (u32*)part_bad);
  if (!dc_elect_last(&vcnt[b], (u32)((k + 1) * ntiles), &is_last)) return;
  vchain_body(b, target, draft, qc, qi, W, greedy, B, k, V, ntiles, part_lo, part_hi, part_max, part_bad, kseed, kgen, krnd, kpos, kfmt, res_row, res_T, accepted, tokens, status, n);
}

/* Stage 2: the residual (or bonus) row of each request, grid (nrt, B), tile
 * rt (a multiple of 1024).  R_v > 0 iff P_v > thr(c_v) = c*(T >> 24) +
 * ((c*(T & (2^24-1))) >> 24) (the CPU backend's test, exact), so a tile's
 * residual sum is 2^24 * sum_sel P - T * sum_sel c: two u64 sums per
 * thread (modular; the true totals of a valid row are < 2^64), one block
 * reduction, the 128-bit value formed once.  Sparse / point-mass q: every P
 * of the tile is summed, then the (few) support entries in the tile are
 * corrected (P removed where R = 0, c added where R > 0).  The last block of
 * the request draws X, finds the tile with one warp (scan of the tile sums)
 * and the token inside the tile (block_draw over dy_residual). */
DC_FN u64 dc_resid_thr(u64 c, u64 th, u64 tl) { return c * th + ((c * tl) >> DY_TOTAL_BITS); }

DC_FN void v2_part(const int tile, const int b, const int rt, const int vec_t, const int vec_q, V1Shared& s1,
    const u32* target, const int* draft, const u32* qc, const int* qi, int W, int k, int V, int nrt,
    const int* res_row, const u64* res_T, u64* rpart, int n = -1) {
  /* n: the request's depth under num_drafts (its bonus row), else -1; row k is always
   * a bonus row */
  const int i = res_row[b], tid = threadIdx.x;
  const u64 T = res_T[b], th = T >> DY_TOTAL_BITS, tl = T & (u64)(DY_TOTAL - 1u);
  const u32* trow = target + ((i64)b * (k + 1) + i) * V;
  const bool bonus = i == k || i == n, dense = !bonus && qc && !qi;
  const u32* qrow = dense ? qc + ((i64)b * k + i) * V : 0;
  const int lo = tile * rt, hi = min(V, lo + rt);
  u64 sp = 0, sc = 0;
  if (dense) {
    if (vec_t && vec_q) {
      const uint4* t4 = (const uint4*)(trow + lo);
      const uint4* q4 = (const uint4*)(qrow + lo);
      const int n4 = (hi - lo) >> 2;
      for (int g0 = tid; g0 < n4; g0 += 256 * 4) {
        uint4 tb[4], qb[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          int g = g0 + u * 256;
          tb[u] = g < n4 ? __ldcs(&t4[g]) : make_uint4(0, 0, 0, 0);
          qb[u] = g < n4 ? __ldcs(&q4[g]) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const u32 bb[4] = {tb[u].x, tb[u].y, tb[u].z, tb[u].w};
          const u32 cc[4] = {qb[u].x, qb[u].y, qb[u].z, qb[u].w};
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const u64 P = dy_target_fixed_fast(bb[e]), c = cc[e];
            const u64 m = (u64)0 - (u64)(P > dc_resid_thr(c, th, tl));
            sp += P & m; sc += c & m;
          }
        }
      }
    } else {
      for (int v0 = lo + tid; v0 < hi; v0 += 256 * 8) {
        u32 tb[8], qb[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) { int v = v0 + u * 256; tb[u] = v < hi ? __ldcs(&trow[v]) : 0u; qb[u] = v < hi ? __ldcs(&qrow[v]) : 0u; }
#pragma unroll
        for (int u = 0; u < 8; ++u) {
          const u64 P = dy_target_fixed_fast(tb[u]), c = qb[u];
          const u64 m = (u64)0 - (u64)(P > dc_resid_thr(c, th, tl));
          sp += P & m; sc += c & m;
        }
      }
    }
  } else {
    if (vec_t) {
      const uint4* t4 = (const uint4*)(trow + lo);
      const int n4 = (hi - lo) >> 2;
      for (int g0 = tid; g0 < n4; g0 += 256 * VU) {
        uint4 tb[VU];
#pragma unroll
        for (int u = 0; u < VU; ++u) { int g = g0 + u * 256; tb[u] = g < n4 ? __ldcs(&t4[g]) : make_uint4(0, 0, 0, 0); }
#pragma unroll
        for (int u = 0; u < VU; ++u)
          sp += dy_target_fixed_fast(tb[u].x) + dy_target_fixed_fast(tb[u].y) + dy_target_fixed_fast(tb[u].z) + dy_target_fixed_fast(tb[u].w);
      }
    } else {
      for (int v0 = lo + tid; v0 < hi; v0 += 256 * 8) {
        u32 tb[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) { int v = v0 + u * 256; tb[u] = v < hi ? __ldcs(&trow[v]) : 0u; }
#pragma unroll
        for (int u = 0; u < 8; ++u) sp += dy_target_fixed_fast(tb[u]);
      }
    }
    if (!bonus) {  /* support corrections (sparse q or the point mass at the draft) */
      if (!qc) {
        const int d = draft[(i64)b * k + i];
        if (tid == 0 && d >= lo && d < hi) {
          const u64 P = dy_target_fixed_fast(trow[d]), c = DY_TOTAL;
          if (P > dc_resid_thr(c, th, tl)) sc += c; else sp -= P;
        }
      } else {
        const u32* qcr = qc + ((i64)b * k + i) * W;
        const int* qir = qi + ((i64)b * k + i) * W;
        for (int j = tid; j < W; j += 256) {
          const int id = qir[j];
          if (id >= 0 && id >= lo && id < hi) {
            const u64 P = dy_target_fixed_fast(trow[id]), c = qcr[j];
            if (P > dc_resid_thr(c, th, tl)) sc += c; else sp -= P;
          }
        }
      }
    }
  }
  for (int o = 16; o; o >>= 1) {
    sp += __shfl_xor_sync(0xffffffffu, sp, o);
    sc += __shfl_xor_sync(0xffffffffu, sc, o);
  }
  const int lane = tid & 31, wid = tid >> 5;
  if (lane == 0) { s1.shi[wid] = sp; s1.slo[wid] = sc; }
  __syncthreads();
  if (tid == 0) {
    u64 P = 0, C = 0;
    for (int w = 0; w < 8; ++w) { P += s1.shi[w]; C += s1.slo[w]; }
    /* bonus row: the weights are P itself (res_weight); otherwise R = P * 2^24 - c * T */
    const dy_u128 s = bonus ? dy_from64(P)
                            : dy_sub128(dy_make128(P >> (64 - DY_TOTAL_BITS), P << DY_TOTAL_BITS), dy_mul64(C, T));
    rpart[2 * ((i64)b * nrt + tile)] = s.lo; rpart[2 * ((i64)b * nrt + tile) + 1] = s.hi;
  }
}

extern "C" __global__ void __launch_bounds__(256) verify_residual(
    const u32* target, const int* draft, const u32* qc, const int* qi, int W, int k, int V, int nrt,
    const void* kseed, const void* kgen, const void* krnd, const void* kpos, int kfmt,
    const int* res_row, const u64* res_T, u64* rpart, int* accepted, int* tokens, int* status, u32* rcnt,
    int rt, int vec_t, int vec_q, int nrows, const int* nd) {
  __shared__ DcShared sh;
  __shared__ V1Shared s1;
  __shared__ int is_last, snv, stile, sok;
  __shared__ dy_u128 sx;
  const int tile = blockIdx.x, b = dc_grid_row();
  if (b >= nrows) return;
  const int i = res_row[b];
  if (i < 0) return;
  /* the request's depth (num_drafts; verify_chain validated it): row n is its bonus row */
  const int n = vr_depth(nd, b, k);
  v2_part(tile, b, rt, vec_t, vec_q, s1, target, draft, qc, qi, W, k, V, nrt, res_row, res_T, rpart, n);
  if (!dc_elect_last(&rcnt[b], (u32)nrt, &is_last)) return;
  ResRow r = res_setup(target, draft, qc, qi, W, k, V, b, i, res_T[b], &snv, n);
  if (threadIdx.x < 32)  /* warp 0: the tile holding X */
    vr_draw_tile(rpart + 2 * (i64)b * nrt, nrt, kseed, kgen, krnd, kpos, kfmt, b, i, &stile, &sx,
                 &sok);
  __syncthreads();
  int j = -1;
  if (sok) {
    const int lo = stile * rt, hi = min(V, lo + rt);
    j = block_draw([&](int v) { return res_weight(r, v); }, hi,
                   [&](dy_u128, dy_u128*) { return false; }, sh, lo, false, sx);
  }
  if (threadIdx.x == 0) {
    if (j < 0) { status[b] = DY_ST_RNG_EXHAUSTED; accepted[b] = 0; for (int q = 0; q <= k; ++q) tokens[(i64)b * (k + 1) + q] = -1; }
    else tokens[(i64)b * (k + 1) + i] = j;
  }
}
