/* ========================================================================
 * verify, check="lazy" (CupyBackend.verify_lazy): read a target row in full
 * only where a decision needs it.  Included at the end of dyadic_kernels.cu
 * (uses dyadic_core.h, dyadic_cuda.cuh and dc_v2 of that file).
 *
 * A valid target row has T = sum floor(p * 2^62) in the band
 * [LZ_TLO, LZ_THI] = [2^62 - 2^52, 2^62 + 2^52] (dy_target_row_total:
 * |T - 2^62| <= 2^62 >> DY_TARGET_TOL_BITS).  dy_accept(P, T, c) depends on
 * T in two ways: "always" iff T <= A = floor(P 2^24 / c), and the bounded draw
 * V1 = uniform_below(T) (masked rejection with L = bitlen(T - 1) bits: L = 62
 * for T <= 2^62, L = 63 above).  (a, b) = divmod(P 2^24, c) do not depend on
 * T.  lz_classify evaluates the decision for EVERY T of the band at once:
 *   - always at T = THI -> accepted for every valid T;
 *   - always at T = TLO (A = floor(P 2^24 / c) in [TLO, THI)): accepted on
 *     [TLO, A]; the band below is then evaluated on [A + 1, THI] only;
 *   - for each sub-band of constant L ([lo, 2^62], L = 62 and
 *     [max(lo, 2^62 + 1), THI], L = 63) the rejection loop is run on the masked draws
 *     X_j: X_j < lo: V1 = X_j for every T of the sub-band (then the test
 *     V1 < a, or V1 == a and V2 < b, V2 = uniform_below(c) from the next
 *     index, is the same for all); X_j >= hi: rejected for every T, next j;
 *     lo <= X_j < hi: ambiguous.  The sub-band decisions must agree.
 * NOT monotone in T: with bit 62 of the first draw set the two sub-bands use
 * different draws, so a test is ambiguous with probability ~ alpha (1 - alpha)
 * + 2^-9 (alpha: acceptance probability), not only 2^-9.  Hence every
 * ambiguous row that the chain may reach is summed in parallel (no serial
 * slow path).
 *
 * dc_vlazy, grid (nt, B), 256 threads, tile vt (multiple of 1024):
 *   1. every block classifies the k tests of its request (warp w: tests
 *      w, w + 8, ...; P(d_i) read once; c_i(d_i): dense direct, sparse: last
 *      match of d_i over the W ids (dy_q_count), none: point mass) into
 *      ACC / REJ / AMB / BAD (BAD: d out of [0, V) or c = 0 -> Q_ZERO_AT_DRAFT,
 *      invalid P bits -> TARGET_INVALID_VALUE).  Deterministic: every block
 *      finds the same classes.
 *   2. candidate rows: the AMB tests before the first REJ / BAD test, plus
 *      that REJ row (or the bonus row k when no REJ / BAD comes first).  Each
 *      block sums its tile of every candidate row (split sums as
 *      dy_target_row_total, validity flag) into part[(b, row, tile)].
 *   3. the last block of the request (atomic counter after __threadfence,
 *      reset by that block: graph replays start at zero) forms the exact T
 *      and status of each candidate row (one warp per row) and walks the
 *      chain exactly (thread 0): ACC -> accept; BAD -> fail with its code;
 *      AMB -> row status, then dy_accept with the exact T; REJ / bonus ->
 *      row status.  Then res_row / res_T (or -1 and the failure, tokens -1,
 *      accepted 0, status code) and accepted / the accepted tokens.
 * Stage 2 is dc_v2 (unchanged): the residual (bonus) row over many blocks.
 * Reads: the k values P(d_i), c_i(d_i) per block, ~1 + #AMB rows per request
 * in stage 1, the residual row (and a dense q row) in stage 2.
 * ====================================================================== */
#define LZ_ONE (1ull << DY_TARGET_BITS)
#define LZ_TOL (LZ_ONE >> DY_TARGET_TOL_BITS)
#define LZ_TLO (LZ_ONE - LZ_TOL)
#define LZ_THI (LZ_ONE + LZ_TOL)
#define LZ_ACC 0
#define LZ_REJ 1
#define LZ_AMB 2
#define LZ_BAD 3
#define LZ_MAXK 64

/* The decision of dy_accept for every T in [lo, hi] with mask bits L fixed
 * (n = P 2^24 < T c for every such T; a, b = divmod(n, c)). */
DC_FN int lz_band(u64 lo, u64 hi, int bits, u64 a, u32 b, u32 c, const DcKey& key, u32 pos) {
  const u64 mask = bits >= 64 ? ~0ull : ((1ull << bits) - 1ull);
  for (u32 idx = 0; idx <= DY_MAX_DRAW_INDEX; ++idx) {
    u32 w[4];
    dy_philox_block(key.seed, key.gen, key.rnd, pos, DY_DOMAIN_ACCEPTANCE, idx, w);
    const u64 x = ((u64)w[0] | ((u64)w[1] << 32)) & mask;
    if (x < lo) {                 /* V1 = x for every T of the band, next index idx + 1 */
      if (x != a) return x < a ? LZ_ACC : LZ_REJ;
      u32 nxt = idx + 1; uint64_t v2;
      if (dy_uniform_below_u64(c, key.seed, key.gen, key.rnd, pos, DY_DOMAIN_ACCEPTANCE, &nxt, &v2))
        return LZ_AMB;            /* exhausted: the exact path reports it */
      return v2 < b ? LZ_ACC : LZ_REJ;
    }
    if (x < hi) return LZ_AMB;    /* accepted for T > x, rejected for T <= x */
    /* x >= hi: rejected for every T of the band; next index */
  }
  return LZ_AMB;
}

/* dy_accept(P, T, c) for every valid T (TLO <= T <= THI) at once: LZ_ACC /
 * LZ_REJ when the same for all, else LZ_AMB.  P valid, c >= 1.  With
 * A = floor(P 2^24 / c): T <= A is "always"; for T > A the draw decides
 * with (a, b) = divmod(P 2^24, c) (a = A), the same for every T. */
DC_FN int lz_classify(u64 P, u32 c, const DcKey& key, u32 pos) {
  int always; uint64_t a; uint32_t b;
  dy_accept_split(P, LZ_THI, c, &always, &a, &b);
  if (always) return LZ_ACC;      /* n >= THI c >= T c */
  dy_accept_split(P, LZ_TLO, c, &always, &a, &b);
  u64 lo = LZ_TLO;
  int dec = -1;
  if (always) {                   /* TLO <= A < THI: always on [TLO, A], the draw above */
    const u64 q1 = P / c, low = (P % c) << DY_TOTAL_BITS;
    a = (q1 << DY_TOTAL_BITS) + low / c;  /* = A < THI < 2^63 */
    b = (uint32_t)(low % c);
    lo = a + 1;
    dec = LZ_ACC;
  }
  /* bitlen(T - 1) = 62 on [TLO, 2^62], 63 on [2^62 + 1, THI] */
  if (lo <= LZ_ONE) {
    const int d1 = lz_band(lo, LZ_ONE, 62, a, b, c, key, pos);
    if (d1 == LZ_AMB || (dec >= 0 && d1 != dec)) return LZ_AMB;
    dec = d1;
  }
  const u64 lo2 = lo > LZ_ONE + 1 ? lo : LZ_ONE + 1;
  if (lo2 <= LZ_THI) {
    const int d2 = lz_band(lo2, LZ_THI, 63, a, b, c, key, pos);
    if (d2 == LZ_AMB || (dec >= 0 && d2 != dec)) return LZ_AMB;
    dec = d2;
  }
  return dec;
}

#ifndef LZ_CLASSIFY_ONLY /* (host checks of lz_classify define it) */
struct LzShared {
  u64 P[LZ_MAXK], T[LZ_MAXK + 1];
  u32 c[LZ_MAXK];
  int d[LZ_MAXK], code[LZ_MAXK], cls[LZ_MAXK], cand[LZ_MAXK + 1], rst[LZ_MAXK + 1];
  u64 shi[8], slo[8];
  u32 bad[8];
  int ncand, is_last;
};

/* Split sums (P >> 32, P & (2^32 - 1)) and the validity of target[lo, hi):
 * <= 64 terms per thread (vt <= 16384); thread 0 gets the 128-bit sum. */
DC_FN void lz_tile(const u32* t, int lo, int hi, int vec, LzShared& s, dy_u128* sum, u32* bad) {
  const int tid = threadIdx.x;
  u64 shi = 0, slo = 0; u32 bd = 0;
  if (vec) {
    const uint4* t4 = (const uint4*)(t + lo);
    const int n4 = (hi - lo) >> 2;
    for (int g0 = tid; g0 < n4; g0 += 256 * VU) {
      uint4 buf[VU];
#pragma unroll
      for (int u = 0; u < VU; ++u) { int g = g0 + u * 256; buf[u] = g < n4 ? __ldg(&t4[g]) : make_uint4(0, 0, 0, 0); }
#pragma unroll
      for (int u = 0; u < VU; ++u) {
        const u32 bb[4] = {buf[u].x, buf[u].y, buf[u].z, buf[u].w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {  /* padding words 0 add nothing and are valid */
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

extern "C" __global__ void __launch_bounds__(256) dc_vlazy(
    const u32* target, const int* draft, const u32* qc, const int* qi, int W, int k, int V, int nt,
    const void* kseed, const void* kgen, const void* krnd, const void* kpos, int kfmt,
    u64* part_lo, u64* part_hi, u32* part_bad, int* res_row, u64* res_T, int* accepted, int* tokens,
    int* status, u32* cnt, int vt, int vec) {
  __shared__ LzShared s;
  const int tile = blockIdx.x, b = blockIdx.y, tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  const int k1 = k + 1;
  /* 1. classify the k tests (warp per test); the key is loaded first (its
   * latency overlaps the draft -> P(d), c(d) loads) */
  DcKey key; key.seed = 0; key.gen = key.rnd = key.pos = 0;
  if (lane == 0 && wid < k) key = load_key(kseed, kgen, krnd, kpos, kfmt, b);
  for (int i = wid; i < k; i += 8) {
    const i64 qrow = (i64)b * k + i;
    const int d = draft[qrow];
    const bool inr = d >= 0 && d < V;
    u32 c = 0;
    if (qc && qi) {  /* dy_q_count: the last j < W with qi[j] == d */
      const int* ir = qi + qrow * W;
      int last = -1;
      for (int j0 = 0; j0 < W; j0 += 32) {
        const int j = j0 + lane;
        const unsigned bal = __ballot_sync(0xffffffffu, j < W && ir[j] == d);
        if (bal) last = j0 + 31 - __clz(bal);
      }
      if (lane == 0 && last >= 0) c = qc[qrow * W + last];
    }
    if (lane == 0) {
      int cl = LZ_BAD, code = DY_ST_Q_ZERO_AT_DRAFT;
      u64 P = 0;
      if (inr) {
        const u32 bits = target[((i64)b * k1 + i) * V + d];
        if (!qc) c = DY_TOTAL;
        else if (!qi) c = qc[qrow * V + d];
        if (!dy_target_bits_valid(bits)) code = DY_ST_TARGET_INVALID_VALUE;
        else if (c != 0) {
          P = dy_target_fixed(bits);
          cl = lz_classify(P, c, key, key.pos + (u32)i);
          code = DY_ST_OK;
        }
      }
      s.P[i] = P; s.c[i] = c; s.d[i] = d; s.cls[i] = cl; s.code[i] = code;
    }
  }
  __syncthreads();
  /* 2. candidate rows (the same in every block of the request) */
  if (tid == 0) {
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
  const int ncand = s.ncand;
  const int lo = tile * vt, hi = min(V, lo + vt);
  for (int j = 0; j < ncand; ++j) {
    const int i = s.cand[j];
    dy_u128 sum; u32 bad;
    lz_tile(target + ((i64)b * k1 + i) * V, lo, hi, vec, s, &sum, &bad);
    if (tid == 0) {
      const i64 o = ((i64)b * k1 + i) * nt + tile;
      part_lo[o] = sum.lo; part_hi[o] = sum.hi; part_bad[o] = bad ? 1u : 0u;
    }
  }
  /* 3. the last block of the request */
  __threadfence();
  __syncthreads();
  if (tid == 0) s.is_last = atomicAdd(&cnt[b], 1u) == (u32)(nt - 1);
  __syncthreads();
  if (!s.is_last) return;
  __threadfence();
  if (tid == 0) cnt[b] = 0;
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
  int* tok = tokens + (i64)b * k1;
  int code = DY_ST_OK, R = -1, j = 0;
  u64 TR = 0;
  for (int i = 0; i <= k; ++i) {
    if (i == k) {  /* bonus row: the last candidate */
      if (s.rst[j]) code = s.rst[j];
      else { R = k; TR = s.T[j]; }
      break;
    }
    const int cl = s.cls[i];
    if (cl == LZ_BAD) { code = s.code[i]; break; }
    if (cl == LZ_ACC) { tok[i] = s.d[i]; continue; }
    const int jj = j++;  /* AMB or REJ: candidate jj is row i */
    if (s.rst[jj]) { code = s.rst[jj]; break; }
    if (cl == LZ_AMB) {
      int ok = 0;
      /* key: loaded by thread 0 in step 1 (k >= 1 here) */
      code = dy_accept(s.P[i], s.T[jj], s.c[i], key.seed, key.gen, key.rnd, key.pos + (u32)i, &ok);
      if (code) break;
      if (ok) { tok[i] = s.d[i]; continue; }
    }
    R = i; TR = s.T[jj];
    break;
  }
  if (code) {
    for (int q = 0; q <= k; ++q) tok[q] = -1;
    res_row[b] = -1; accepted[b] = 0; status[b] = code;
    return;
  }
  for (int q = R; q <= k; ++q) tok[q] = -1;
  res_row[b] = R; res_T[b] = TR; accepted[b] = R; status[b] = DY_ST_OK;
}
#endif /* LZ_CLASSIFY_ONLY */
