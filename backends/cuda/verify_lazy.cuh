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
 * dc_vlazy2 (verify_lazy2.cuh), grid (nt, B), 256 threads, tile vt (a multiple of 1024):
 *   1. every block classifies the k tests of its request (warp w: tests
 *      w, w + 8, ...; P(d_i) read once; c_i(d_i): dense direct, sparse: last
 *      match of d_i over the W ids (dy_q_count), none: point mass) into
 *      ACC / REJ / AMB / BAD (BAD: d out of [0, V) -> DRAFT_OUT_OF_RANGE, c = 0 ->
 *      Q_ZERO_AT_DRAFT, invalid P bits -> TARGET_INVALID_VALUE), and checks every
 *      draft id and sparse q row of the request (the request's code rq: a draft id
 *      out of range, else a q row breaking a Dyadic rule).  Deterministic: every
 *      block finds the same classes.
 *   2. candidate rows: the AMB tests before the first REJ / BAD test, plus
 *      that REJ row (or the bonus row k when no REJ / BAD comes first).  Each
 *      block sums its tile of every candidate row (split sums as
 *      dy_target_row_total, validity flag) into part[(b, row, tile)].
 *   3. the last block of the request (atomic counter after a release fence, dc_elect_last,
 *      reset by that block: graph replays start at zero) forms the exact T
 *      and status of each candidate row (one warp per row) and walks the
 *      chain exactly (thread 0): ACC -> accept; BAD -> fail with its code;
 *      AMB -> row status, then dy_accept with the exact T; REJ / bonus ->
 *      row status; a target code found so decides, else the request's rq, else
 *      the walk's own result.  Then res_row / res_T (or -1 and the failure,
 *      tokens -1, accepted 0, status code) and accepted / the accepted tokens.
 * Stage 2 is dc_vres2 (verify_lazy2.cuh): the residual (bonus) row over many blocks.
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
  int qbad[LZ_MAXK];  /* lz_tests: test i's q row breaks a Dyadic rule (dc_draft_check) */
  u64 shi[8], slo[8];
  u32 bad[8];
  int ncand, is_last;
  int rq;  /* lz_tests: DRAFT_OUT_OF_RANGE / Q_INVALID of the request, or 0 */
};


#endif /* LZ_CLASSIFY_ONLY */
