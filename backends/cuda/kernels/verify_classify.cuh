/* ========================================================================
 * verify, check="lazy" (CupyBackend.verify_lazy): read a target row in full
 * only where a decision needs it: the classification of the acceptance tests
 * for every valid row total at once (lz_classify), and lz_tests / lz_walk.
 * Uses dyadic_core.h, common.cuh and verify_common.cuh; with LZ_CLASSIFY_ONLY
 * only lz_classify (tests/gpu/test_gpu_verify_lazy.py compiles it for the host).
 *
 * A valid target row has T = sum floor(p * 2^62) in the band
 * [LZ_TLO, LZ_THI] = [2^62 - 2^52, 2^62 + 2^52] (dy_target_row_total:
 * |T - 2^62| <= 2^62 >> DY_TARGET_TOL_BITS).  dy_accept(P, T, c) depends on
 * T in two ways: "always" iff T <= A = floor(P 2^24 / c), and the bounded draw
 * V1 = dy_uniform_below_63(T) (the low 63 bits X_j of draw j, the first X_j < T).
 * (a, b) = divmod(P 2^24, c) do not depend on T.  lz_classify evaluates the
 * decision for EVERY T of the band at once:
 *   - always at T = THI -> accepted for every valid T;
 *   - always at T = TLO (A in [TLO, THI)): accepted on [TLO, A]; the draw
 *     decides on [A + 1, THI] only;
 *   - on [lo, THI] the rejection loop runs on the draws X_j (the mask is the
 *     same for every T): X_j < lo: V1 = X_j for every T (then the test V1 < a,
 *     or V1 == a and V2 < b, V2 = uniform_below(c) from the next index, is the
 *     same for all); X_j >= THI: rejected for every T, next j; lo <= X_j < THI:
 *     ambiguous.
 * A test is ambiguous with probability about 2^-9 (a draw in the band, or A in
 * it), so a row is summed in full only where the chain needs it: the rejected
 * row, the bonus row, and the rare ambiguous rows (summed in parallel).
 *
 * lz_tests (every block of a request, in verify_lazy and verify_one_launch)
 * classifies the k tests of its request (warp w: tests w, w + 8, ...; P(d_i)
 * read once; c_i(d_i): dense direct, sparse: last match of d_i over the W ids
 * (dy_q_count), none: point mass) into ACC / REJ / AMB / BAD (BAD: d out of
 * [0, V) -> DRAFT_OUT_OF_RANGE, c = 0 -> Q_ZERO_AT_DRAFT, invalid P bits ->
 * TARGET_INVALID_VALUE), checks every draft id and sparse q row of the request
 * (the request's code rq: a draft id out of range, else a q row breaking a
 * Dyadic rule), and lists the candidate rows: the AMB tests before the first
 * REJ / BAD test, plus that REJ row (or the bonus row k when no REJ / BAD comes
 * first).  Deterministic: every block finds the same classes.  lz_walk (thread 0
 * of the request's last block, once the candidate rows' exact totals and
 * statuses are known) walks the chain exactly: ACC -> accept; BAD -> fail with
 * its code; AMB -> row status, then dy_accept with the exact T; REJ / bonus ->
 * row status; a target code found so decides, else the request's rq, else the
 * walk's own result.
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

/* The decision of dy_accept for every T in [lo, hi] (the draws masked to L bits)
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
  const int d = lz_band(lo, LZ_THI, 63, a, b, c, key, pos);
  if (d == LZ_AMB || (dec >= 0 && d != dec)) return LZ_AMB;
  return d;
}

#ifndef LZ_CLASSIFY_ONLY /* (host checks of lz_classify define it) */
struct LzShared {
  u64 P[LZ_MAXK], T[LZ_MAXK + 1];
  u32 c[LZ_MAXK];
  int d[LZ_MAXK], code[LZ_MAXK], cls[LZ_MAXK], cand[LZ_MAXK + 1], rst[LZ_MAXK + 1];
  int qbad[LZ_MAXK];  /* lz_tests: test i's q row breaks a Dyadic rule (dc_draft_check) */
  u64 shi[8], slo[8];
  u32 bad[8];
  int ncand, is_last;
  int rq;  /* lz_tests: DRAFT_OUT_OF_RANGE / Q_INVALID of the request, or 0 */
};


/* lz_tests (verify_lazy, verify_one_launch): classify the n tests of request b
 * (n = its draft count, 0 <= n <= k; k the row stride: k + 1 target rows and k q rows
 * per request) (warp per test; the key in lane 0 of warps < n) into s.P / c / d / cls / code and
 * check each draft id and q row (dc_draft_check: s.qbad, and q(d) from the same pass
 * over a sparse row), then the request's code s.rq (DRAFT_OUT_OF_RANGE when a draft id
 * lies outside [0, V), else Q_INVALID when a q row breaks a Dyadic rule, else 0) and the
 * candidate rows s.cand[0..n): the AMB tests before the first REJ / BAD test, then
 * that REJ row (or the bonus row n when no REJ / BAD comes first).  The same in every
 * block of the request.  Returns n (block-uniform; ends with a __syncthreads). */
DC_FN int lz_tests(const u32* target, const int* draft, const u32* qc, const int* qi, int W, int k,
                   int n, int V, int b, const DcKey& key, LzShared& s) {
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5, k1 = k + 1;
  for (int i = wid; i < n; i += 8) {
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
    for (int i = 0; i < n; ++i) {
      if (s.code[i] == DY_ST_DRAFT_OUT_OF_RANGE) rq = DY_ST_DRAFT_OUT_OF_RANGE;
      else if (s.qbad[i] && !rq) rq = DY_ST_Q_INVALID;
    }
    s.rq = rq;
    int nc = 0, stop = n;
    for (int i = 0; i < n; ++i) {
      const int cl = s.cls[i];
      if (cl == LZ_ACC) continue;
      if (cl == LZ_AMB) { s.cand[nc++] = i; continue; }
      stop = cl == LZ_REJ ? i : -1;  /* BAD: no residual row */
      break;
    }
    if (stop >= 0) s.cand[nc++] = stop;
    s.ncand = nc;
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
 * backend's order on what was read.  n: the request's draft count (bonus row n).
 * Writes tok[0..k] (accepted drafts; -1 from the residual row on, or everywhere on failure), *accepted and *status.  Returns the
 * residual row R (*jR its candidate index, *TR its total), or -1 after a failure. */
DC_FN int lz_walk(const LzShared& s, int k, int n, const DcKey& key, int* tok, int* accepted,
                  int* status, int* jR, u64* TR) {
  int code = DY_ST_OK, R = -1, j = 0;
  for (int i = 0; i <= n; ++i) {
    if (i == n) {  /* bonus row: the last candidate */
      if (s.rst[j]) code = s.rst[j];
      else { R = n; *jR = j; *TR = s.T[j]; }
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

#endif /* LZ_CLASSIFY_ONLY */
