/* ------------------------------------------------------------------------
 * verify_one_launch: verify with check=False (or True) and no greedy requests in ONE
 * launch, for small batches (in place of verify_chain + verify_residual; the same results and
 * statuses bit for bit).  verify_lazy's machinery with the full validation:
 * grid (1 + (k+1) nt, B); block 0 of request b runs lz_tests (the classes and
 * the per-draft codes) and stores them (vf_put_tests); block 1 + i nt + t runs
 * vf_tile for row i, tile t, for EVERY row i of the request (tile records: the row's
 * split sums and invalid-value flag; chunk records and ambiguous-id lists as
 * verify_lazy's).  With num_drafts (nd) request b uses rows 0..n and drafts 0..n-1,
 * n = nd[b] (checked first: outside [0, k] the request fails closed with
 * NUM_DRAFTS_INVALID before anything else is read); the blocks of its rows beyond n
 * read nothing and only arrive at the request's counter; row n is its bonus row.
 * The last of the 1 + (k+1) nt blocks (dc_elect_last) reads the
 * tests back (when it is not block 0) and validates as verify_chain's chain
 * (vchain_body): every row i = 0..n in order (TARGET_INVALID_VALUE, then
 * TARGET_SUM), then the drafts (lz_tests' request code: a draft id outside [0, V),
 * DRAFT_OUT_OF_RANGE, else a q row breaking a Dyadic rule, Q_INVALID), then every
 * draft i = 0..n-1 in order (c_i(d_i) = 0: Q_ZERO_AT_DRAFT, lz_tests' LZ_BAD class;
 * an invalid P(d_i) is already its row's TARGET_INVALID_VALUE); a failing request
 * fails closed.  A
 * valid request then takes vf_last: the walk (lz_walk: the classes where they
 * hold for every valid total, dy_accept with the exact total where not; the
 * same decisions and exhaustion codes as verify_chain's dy_accept) and the residual
 * or bonus draw (verify_residual's token).  Reads every used row's tile: n + 1
 * rows of P and n of q per request, as verify_chain + verify_residual do; the host takes it
 * while its grid fits one wave (backends/cuda/cupy/routes.py).  k + 1 <= VA_MAXK1.
 * Test scratch (u32 words per request, VA_TZW): P[i] as u64 at 0..2k, then c,
 * d, cls, code at VA_TZ_C / D / CLS / CODE + i, ncand at VA_TZ_N, cand at
 * VA_TZ_CAND, the request code at VA_TZ_RQ.
 * ------------------------------------------------------------------------ */
#define VA_MAXK1 8
#define VA_TZW 64
#define VA_TZ_C 16
#define VA_TZ_D 24
#define VA_TZ_CLS 32
#define VA_TZ_CODE 40
#define VA_TZ_N 48
#define VA_TZ_CAND 49
#define VA_TZ_RQ 60

/* block 0: the tests of s.z into the request's scratch (before dc_elect_last, whose
 * barrier and release fence publish them) */
DC_FN void vf_put_tests(const LzShared& z, int k, u32* tz) {
  const int tid = threadIdx.x;
  if (tid < k) {
    ((u64*)tz)[tid] = z.P[tid];
    tz[VA_TZ_C + tid] = z.c[tid]; tz[VA_TZ_D + tid] = (u32)z.d[tid];
    tz[VA_TZ_CLS + tid] = (u32)z.cls[tid]; tz[VA_TZ_CODE + tid] = (u32)z.code[tid];
  }
  if (tid <= k) tz[VA_TZ_CAND + tid] = (u32)z.cand[tid];
  if (tid == 0) { tz[VA_TZ_N] = (u32)z.ncand; tz[VA_TZ_RQ] = (u32)z.rq; }
}

/* the last block (not block 0): the tests back into s.z (L2 loads: written by another
 * block of this launch, ordered by dc_elect_last's acquire) */
DC_FN void vf_get_tests(LzShared& z, int k, const u32* tz) {
  const int tid = threadIdx.x;
  if (tid < k) {
    z.P[tid] = __ldcg(&((const u64*)tz)[tid]);
    z.c[tid] = __ldcg(&tz[VA_TZ_C + tid]); z.d[tid] = (int)__ldcg(&tz[VA_TZ_D + tid]);
    z.cls[tid] = (int)__ldcg(&tz[VA_TZ_CLS + tid]); z.code[tid] = (int)__ldcg(&tz[VA_TZ_CODE + tid]);
  }
  if (tid <= k) z.cand[tid] = (int)__ldcg(&tz[VA_TZ_CAND + tid]);
  if (tid == 0) { z.ncand = (int)__ldcg(&tz[VA_TZ_N]); z.rq = (int)__ldcg(&tz[VA_TZ_RQ]); }
}

/* The last block: verify_chain's validation of request b (see above) from every row's tile
 * records and the tests in s.z; a failing request fails closed here (its outputs, every
 * row's list counter reset).  Returns the code (block-uniform). */
DC_FN int vf_validate(VfShared& s, int k, int n, int nt, const u64* tpart, u32* acnt,
                      int* accepted, int* tokens, int* status, int b) {
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5, k1 = k + 1;
  for (int i = wid; i <= n; i += 8) {  /* row i's total and invalid-value flag */
    const ulonglong2* tr = (const ulonglong2*)(tpart + ((i64)b * k1 + i) * nt * VF_TREC);
    u64 h = 0, l = 0; u32 bd = 0;
    for (int t = lane; t < nt; t += 32) {
      const ulonglong2 r0 = __ldcg(&tr[t * (VF_TREC / 2)]), r1 = __ldcg(&tr[t * (VF_TREC / 2) + 1]);
      h += r0.x; l += r0.y; bd |= (u32)r1.x;
    }
    h = warp_sum64(h); l = warp_sum64(l);
    bd = __any_sync(0xffffffffu, bd != 0);
    if (lane == 0) {
      const dy_u128 sum = dy_add128(dy_make128(h >> 32, h << 32), dy_from64(l));
      int st = DY_ST_OK;
      if (bd) st = DY_ST_TARGET_INVALID_VALUE;
      else if (sum.hi || (sum.lo > LZ_ONE ? sum.lo - LZ_ONE : LZ_ONE - sum.lo) > LZ_TOL) st = DY_ST_TARGET_SUM;
      s.tnd[i] = (u32)st;
    }
  }
  __syncthreads();
  if (tid == 0) {
    int code = DY_ST_OK;
    for (int i = 0; i <= n && !code; ++i) code = (int)s.tnd[i];
    if (!code) code = s.z.rq;  /* a draft id outside [0, V), else a q row breaking a rule */
    for (int i = 0; i < n && !code; ++i)  /* then q_i(d_i) = 0 (a BAD test left) */
      if (s.z.cls[i] == LZ_BAD) code = s.z.code[i];
    s.R = code;
  }
  __syncthreads();
  const int code = s.R;
  if (code) {
    for (int j = tid; j < k1; j += 256) acnt[(i64)b * k1 + j] = 0;  /* replays start at 0 */
    if (tid == 0) {
      status[b] = code; accepted[b] = 0;
      for (int q = 0; q <= k; ++q) tokens[(i64)b * k1 + q] = -1;
    }
  }
  return code;
}

extern "C" __global__ void __launch_bounds__(256, 3) verify_one_launch(
    const u32* target, const int* draft, const u32* qc, const int* qi, int W, int k, int V, int nt,
    const void* kseed, const void* kgen, const void* krnd, const void* kpos, int kfmt,
    u64* tpart, u64* rchunk, u64* alist, u32* acnt, int acap, int* accepted, int* tokens,
    int* status, u32* cnt, u32* tzs, int vt, int vec, int vec_q, int nrows, const int* nd) {
  __shared__ VfShared s;
  const int x = blockIdx.x, b = dc_grid_row(), tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  if (b >= nrows) return;
  const int k1 = k + 1, nch = (V + VF_CH - 1) / VF_CH;
  /* the request's draft count (num_drafts, bounds-checked before anything is read with it;
   * outside [0, k] the request fails closed with NUM_DRAFTS_INVALID: vr_depth's rule, the
   * count read through the read-only cache) */
  const int n = nd ? __ldg(&nd[b]) : k;
  if (n < 0 || n > k) {
    if (dc_elect_last(&cnt[b], (u32)(k1 * nt + 1), &s.z.is_last) && tid == 0)
      vr_fail_depth(b, k, accepted, tokens, status);
    return;
  }
  u32* tz = tzs + (i64)b * VA_TZW;
  VF_PROF_START();
  DcKey key; key.seed = 0; key.gen = key.rnd = key.pos = 0;
  if (x == 0) {  /* the tests */
    VF_STAMP(true, 0);
    if (lane == 0 && (wid < n || tid == 0)) key = load_key(kseed, kgen, krnd, kpos, kfmt, b);
    lz_tests(target, draft, qc, qi, W, k, n, V, b, key, s.z);
    vf_put_tests(s.z, k, tz);
    VF_STAMP(true, 1);
  } else if ((x - 1) / nt <= n) {  /* row i <= n, tile t: step 2 (a row beyond the
                                     * request's count is not read: its blocks only arrive) */
    const int i = (x - 1) / nt, tile = (x - 1) % nt, lo = tile * vt, hi = min(V, lo + vt);
    const bool bonus = i == n, dense = !bonus && qc && !qi, sparse = !bonus && qc && qi;
    const int d = (!bonus && !qc) ? __ldg(&draft[(i64)b * k + i]) : -1;  /* point mass */
    const i64 row = (i64)b * k1 + i;
    vf_tile(target + row * V, dense ? qc + ((i64)b * k + i) * V : 0,
            sparse ? qc + ((i64)b * k + i) * W : 0, sparse ? qi + ((i64)b * k + i) * W : 0, W,
            d, bonus, lo, hi, rchunk + 2 * row * nch, tpart + (row * nt + tile) * VF_TREC,
            alist + 2 * row * acap, acnt + row, acap, vec && (!dense || vec_q), s);
    VF_STAMP(x == 1, 2);
  }
  VF_PROF_ARRIVE();
  const bool last = dc_elect_last(&cnt[b], (u32)(k1 * nt + 1), &s.z.is_last);
  VF_STAMP(x == 1, 3);
  if (!last) return;
  VF_STAMP(true, 8);
  VF_PROF_LAST();
  if (x != 0) {
    if (tid == 0) key = load_key(kseed, kgen, krnd, kpos, kfmt, b);
    vf_get_tests(s.z, k, tz);
    __syncthreads();
  }
  if (vf_validate(s, k, n, nt, tpart, acnt, accepted, tokens, status, b)) return;
  vf_last(s, key, s.z.ncand, true, target, qc, qi, W, k, n, V, nt, tpart, rchunk, alist, acnt,
          acap, accepted, tokens, status, vt, b);
}

