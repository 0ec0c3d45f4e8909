/* ========================================================================
 * Helpers shared by the verify kernels (verify.cuh, verify_lazy.cuh,
 * verify_one_launch.cuh).
 * ====================================================================== */

/* The depth of request b: num_drafts[b] where nd is given (ragged drafts) and the
 * count lies in [0, k]; -1 for a count outside (NUM_DRAFTS_INVALID: nothing of the
 * request is read); k without nd.  Rows beyond the depth are never read. */
DC_FN int vr_depth(const int* nd, int b, int k) {
  if (!nd) return k;
  const int n = nd[b];
  return (n >= 0 && n <= k) ? n : -1;
}

/* Request b failed closed for a count outside [0, k] (depth -1): NUM_DRAFTS_INVALID,
 * nothing accepted, its k + 1 tokens -1.  One thread. */
DC_FN void vr_fail_depth(int b, int k, int* accepted, int* tokens, int* status) {
  for (int i = 0; i <= k; ++i) tokens[(i64)b * (k + 1) + i] = -1;
  accepted[b] = 0; status[b] = DY_ST_NUM_DRAFTS_INVALID;
}

/* ------------------------------------------------------------------------
 * The acceptance chain of a request's last block (verify_chain,
 * verify_one_launch), every thread of the block: warp 0 sums request b's tile records (row
 * totals, validity, argmax); the other warps (warp 0 after its sums in a one-warp
 * block) check the drafts and their q rows (dc_draft_check, a warp per draft) and
 * keep q_i(d_i); thread 0 then decides, in the CPU backend's order: every target row
 * (TARGET_INVALID_VALUE, TARGET_SUM), every draft id in [0, V) (DRAFT_OUT_OF_RANGE,
 * greedy requests too), for a non-greedy request every q row (Q_INVALID), then
 * q_i(d_i) > 0 (Q_ZERO_AT_DRAFT); a failing request fails closed before anything is
 * read at a draft id.  Then the acceptance chain (dy_accept of the shared core).
 * n: the request's depth (vr_depth): rows 0..n, drafts 0..n-1 are used (tokens
 * stay k+1 wide); n = -1 fails the request closed with NUM_DRAFTS_INVALID before
 * anything is read. */
DC_FN void vchain_body(const int b,
    const u32* target, const int* draft, const u32* qc, const int* qi, int W, const unsigned char* greedy,
    int B, int k, int V, int ntiles, const u64* part_lo, const u64* part_hi, const u64* part_max,
    const u32* part_bad, const void* kseed, const void* kgen, const void* krnd, const void* kpos, int kfmt,
    int* res_row, u64* res_T, int* accepted, int* tokens, int* status, const int n) {
  __shared__ u64 Tl[64], Th[64]; __shared__ int amax[64], badr[64];
  __shared__ u32 cq[64], idbits[32];
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5, nw = (int)(blockDim.x >> 5);
  int* tok = tokens + (i64)b * (k + 1);
  const i64 qrow = (i64)b * k;
  if (n < 0) {  /* block-uniform */
    if (tid == 0) { res_row[b] = -1; vr_fail_depth(b, k, accepted, tokens, status); }
    return;
  }
  if (wid == 0) {
    for (int i = 0; i <= n; ++i) {
      const i64 o = ((i64)b * (k + 1) + i) * ntiles;
      dy_u128 s = dy_make128(0, 0); u64 mx = 0; u32 bad = 0;
      for (int t = lane; t < ntiles; t += 32) {
        s = dy_add128(s, dy_make128(__ldcg(&part_hi[o + t]), __ldcg(&part_lo[o + t])));
        u64 m = __ldcg(&part_max[o + t]); mx = m > mx ? m : mx; bad |= __ldcg(&part_bad[o + t]);
      }
      s = warp_sum128(s); mx = warp_max64(mx); bad = __any_sync(0xffffffffu, bad != 0);
      if (lane == 0 && i < 64) { Tl[i] = s.lo; Th[i] = s.hi; amax[i] = (int)(0xFFFFFFFFu - (u32)mx); badr[i] = bad; }
    }
  }
  {
    const int w0 = nw > 1 ? 1 : 0;
    u32 f = 0;
    for (int i = wid - w0; wid >= w0 && i < n; i += nw - w0) {
      u32 c;
      f |= dc_draft_check(draft[qrow + i], qc, qi, W, V, qrow + i, &c);
      if (lane == 0) cq[i] = c;
    }
    if (lane == 0) idbits[wid] = f;
  }
  __syncthreads();
  if (tid != 0) return;
  u32 ids = 0;
  for (int w = 0; w < nw; ++w) ids |= idbits[w];
  res_row[b] = -1;
  int code = DY_ST_OK;
  const u64 one = 1ull << DY_TARGET_BITS, tol = one >> DY_TARGET_TOL_BITS;
  for (int i = 0; i <= n && !code; ++i) {
    if (badr[i]) code = DY_ST_TARGET_INVALID_VALUE;
    else if (Th[i] || (Tl[i] > one ? Tl[i] - one : one - Tl[i]) > tol) code = DY_ST_TARGET_SUM;
  }
  const bool g = greedy[b] != 0;
  if (!code && (ids & 2u)) code = DY_ST_DRAFT_OUT_OF_RANGE;
  if (!code && !g && (ids & 1u)) code = DY_ST_Q_INVALID;
  for (int i = 0; i < n && !code && !g; ++i)
    if (cq[i] == 0) code = DY_ST_Q_ZERO_AT_DRAFT;
  if (code) {
    status[b] = code; accepted[b] = 0;
    for (int i = 0; i <= k; ++i) tok[i] = -1;
    return;
  }
  DcKey key = load_key(kseed, kgen, krnd, kpos, kfmt, b);
  for (int i = 0; i <= k; ++i) tok[i] = -1;
  for (int i = 0; i < n; ++i) {
    const int d = draft[qrow + i];
    int ok;
    if (g) ok = d == amax[i];
    else {
      const u64 P = dy_target_fixed(target[((i64)b * (k + 1) + i) * V + d]);
      code = dy_accept(P, Tl[i], cq[i], key.seed, key.gen, key.rnd, key.pos + i, &ok);
      if (code) break;
    }
    if (ok) { tok[i] = d; continue; }
    accepted[b] = i;
    if (g) tok[i] = amax[i];
    else { res_row[b] = i; res_T[b] = Tl[i]; }
    status[b] = DY_ST_OK;
    return;
  }
  if (code) {
    status[b] = code; accepted[b] = 0;
    for (int i = 0; i <= k; ++i) tok[i] = -1;
    return;
  }
  accepted[b] = n;
  if (g) tok[n] = amax[n];
  else { res_row[b] = n; res_T[b] = Tl[n]; }
  status[b] = DY_ST_OK;
}

/* ------------------------------------------------------------------------
 * The residual (or bonus) row of a request: R_v = dy_residual(P_v, c_v, T)
 * (bonus row: P_v), q_v read from a dense row, a sparse row (binary search
 * over its ascending ids) or the point mass at the draft. */
DC_FN u32 q_at(const u32* qc, const int* qi, int nv, int v, int d) {
  if (!qc) return v == d ? DY_TOTAL : 0u;
  if (!qi) return qc[v];
  int lo = 0, hi = nv;  /* ids ascending in [0, nv) */
  while (lo < hi) { int m = (lo + hi) >> 1; int id = qi[m]; if (id < v) lo = m + 1; else hi = m; }
  return (lo < nv && qi[lo] == v) ? qc[lo] : 0u;
}

struct ResRow { const u32* t; const u32* qcr; const int* qir; int nv, d, bonus; u64 T; };

/* n: the request's depth where it verifies fewer than k drafts (num_drafts), whose
 * bonus row is row n; -1 (default) otherwise.  Row k is always a bonus row. */
DC_FN ResRow res_setup(const u32* target, const int* draft, const u32* qc, const int* qi, int W,
                       int k, int V, int b, int i, u64 T, int* snv, int n = -1) {
  ResRow r;
  r.t = target + ((i64)b * (k + 1) + i) * V;
  r.T = T; r.bonus = i == k || i == n; r.qcr = 0; r.qir = 0; r.d = -1; r.nv = 0;
  if (!r.bonus) {
    const i64 qo = ((i64)b * k + i) * (qi ? W : V);
    r.qcr = qc ? qc + qo : 0;
    r.qir = (qc && qi) ? qi + ((i64)b * k + i) * W : 0;
    r.d = draft[(i64)b * k + i];
    if (threadIdx.x == 0) {
      int nv = W;
      if (r.qir) { int lo = 0, hi = W; while (lo < hi) { int m = (lo + hi) >> 1; if (r.qir[m] >= 0) lo = m + 1; else hi = m; } nv = lo; }
      *snv = nv;
    }
    __syncthreads();
    r.nv = *snv;
  }
  return r;
}

DC_FN dy_u128 res_weight(const ResRow& r, int v) {
  const u64 P = dy_target_fixed(r.t[v]);
  if (r.bonus) return dy_from64(P);
  return dy_residual(P, q_at(r.qcr, r.qir, r.nv, v, r.d), r.T);
}

#define LR_CH 64   /* ids per chunk (tiles are multiples of 1024) */
#define LR_PL 4    /* values per lane and pass in the warp search */

/* The residual sum of a set of ids from its (sum_sel P, sum_sel c). */
DC_FN dy_u128 lr_val(u64 sp, u64 sc, u64 T, bool bonus) {
  return bonus ? dy_from64(sp)
               : dy_sub128(dy_make128(sp >> (64 - DY_TOTAL_BITS), sp << DY_TOTAL_BITS), dy_mul64(sc, T));
}

DC_FN dy_u128 lr_scan(dy_u128 v) {  /* warp inclusive scan */
  return dc_warp_scan(v, (int)(threadIdx.x & 31));
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
    if (bal) { *out = dc_shfl(x, __ffs(bal) - 1); return 1; }
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
    dy_u128 tot = dc_shfl(inc, 31);
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
      *off = dc_shfl(o, L);
      return __shfl_sync(0xffffffffu, r, L);
    }
    base = dy_add128(base, dc_shfl(inc, 31));
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

#define VR_TK 4  /* tile sums a lane of vr_draw_tile keeps in registers */

/* Warp 0 (lane = threadIdx.x < 32) of a residual row's last block: the tile holding X,
 * X uniform below the total of the row's nrt tile sums rp (128-bit, (lo, hi) words
 * written by the row's blocks, read through L2) in domain CORRECTION at position pos + i
 * of request b's key (drawn by lane 0): the lane whose run of consecutive tiles holds X
 * writes the tile, X's offset in it and 1 to *stile, *sx, *sok; lane 0 writes -1 and 0
 * first (a zero total or a failing draw leaves them). */
DC_FN void vr_draw_tile(const u64* rp, int nrt, const void* kseed, const void* kgen,
                        const void* krnd, const void* kpos, int kfmt, int b, int i, int* stile,
                        dy_u128* sx, int* sok) {
  const int lane = threadIdx.x;
  const int chunk = (nrt + 31) / 32, a0 = min(nrt, lane * chunk), a1 = min(nrt, a0 + chunk);
  auto sum_at = [&](int t) { return dy_make128(__ldcg(&rp[2 * t + 1]), __ldcg(&rp[2 * t])); };
  /* the run's first VR_TK sums loaded at once and kept for the walk (the whole run where
   * nrt <= 32 VR_TK) */
  dy_u128 kv[VR_TK];
#pragma unroll
  for (int u = 0; u < VR_TK; ++u) kv[u] = a0 + u < a1 ? sum_at(a0 + u) : dy_make128(0, 0);
  dy_u128 s = dy_make128(0, 0);
#pragma unroll
  for (int u = 0; u < VR_TK; ++u) s = dy_add128(s, kv[u]);
  for (int t = a0 + VR_TK; t < a1; ++t) s = dy_add128(s, sum_at(t));
  const dy_u128 inc = dc_warp_scan(s, lane);
  const dy_u128 tot = dc_shfl(inc, 31);
  int ok = 0; dy_u128 x = dy_make128(0, 0);
  if (lane == 0) {
    DcKey key = load_key(kseed, kgen, krnd, kpos, kfmt, b);
    u32 idx = 0;
    ok = !dy_is_zero128(tot) &&
         dy_uniform_below_u128(tot, key.seed, key.gen, key.rnd, key.pos + i,
                               DY_DOMAIN_CORRECTION, &idx, &x) == DY_ST_OK;
  }
  ok = __shfl_sync(0xffffffffu, ok, 0);
  x = dc_shfl(x, 0);
  if (lane == 0) { *sok = 0; *stile = -1; }
  __syncwarp();
  if (ok) {
    const unsigned bal = __ballot_sync(0xffffffffu, dy_lt128(x, inc));
    const int L = bal ? __ffs(bal) - 1 : -1;
    if (lane == L) {
      dy_u128 cum = dy_sub128(inc, s);
      int t = -1;
#pragma unroll
      for (int u = 0; u < VR_TK; ++u) {
        if (t >= 0 || a0 + u >= a1) continue;
        const dy_u128 nc = dy_add128(cum, kv[u]);
        if (dy_lt128(x, nc)) t = a0 + u;
        else cum = nc;
      }
      for (int v = a0 + VR_TK; t < 0 && v < a1; ++v) {
        const dy_u128 nc = dy_add128(cum, sum_at(v));
        if (dy_lt128(x, nc)) t = v;
        else cum = nc;
      }
      if (t >= 0) { *stile = t; *sx = dy_sub128(x, cum); *sok = 1; }
    }
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
