/* ========================================================================
 * verify(..., logits=True): target rows of logits processed into exact integer
 * distributions (docs/semantics.md "Target logits"; dy_logits_target_row of the core
 * is the host form of the same rules), then the acceptance chain and the residual /
 * bonus draw of section 5.  Six kernels, every launch graph-capturable (per-row state
 * lives in scratch that each call rewrites before reading):
 *
 *  logits_max       grid (tiles, rows): per tile the largest logit (integer order key
 *                   of its float32 value; with its lowest id on a greedy row, the only
 *                   rows whose argmax is read), the largest magnitude and the NaN / +inf
 *                   flag; the row's last block divides that logit once (z is monotone
 *                   in x, so zmax = z(xmax)), sets the row's record (status, zmax,
 *                   argmax, min-p threshold), zeroes its histogram and, for bfloat16
 *                   logits over more than LG_TABLE_ROWS rows, fills the row's value
 *                   table (below).  Over more than LG_TABLE_ROWS rows it also counts a
 *                   sampled bfloat16 tile's tokens per value as it reads them ("tile
 *                   counts" below): logits_hist takes those instead of the logits.
 *  logits_table     grid (LG_TE / 256, rows), calls over at most LG_TABLE_ROWS rows: the
 *                   value tables, an entry a thread (one block a row would take its
 *                   4096 entries one SM at a time).
 *  logits_hist      grid (tiles, rows); logits_hist_groups, over more than LG_TABLE_ROWS
 *                   rows of bfloat16 logits, grid (groups, rows): the weight W_v of
 *                   every token (the fixed-point exponential of allocate) and, over the
 *                   survivors of min-p with
 *                   W_v > 0, a histogram of counts and masses by gap bucket
 *                   floor(64 * (zmax - z_v)) (monotone in the ranking: z descending);
 *                   the last block finds the bucket where top-k's count or top-p's mass
 *                   is reached.  Tokens with a value in the row's table are counted per
 *                   value and enter the histogram as count x W once per value; each
 *                   tile's counts are kept (tcnt: logits_max's record, or the counts of
 *                   the block that read the tile), from which the last block places
 *                   the cut inside its bucket where it can (lg_value_pick).  A block
 *                   takes one tile, or several consecutive ones where logits_max counted
 *                   them (routes.logits_hist_groups): their counts moved onto the row's
 *                   window, the tiles' logits read only where logits_max could not count
 *                   them; with one block a row no merge nor election.
 *  logits_resolve   (launched twice, once when the call gives no top_k) grid (tiles,
 *                   rows), rows whose cut logits_hist did not place: the survivors in
 *                   that bucket are gathered; the last block
 *                   sorts them by (z desc, id asc) and takes the exact cut; a top-p cut
 *                   after a top-k cut may need the second launch.  More than LG_CAP
 *                   tokens in one bucket (ties of thousands of equal logits): the last
 *                   block selects by an 8-bit radix over the whole row instead (exact,
 *                   slower).
 *  logits_chain     grid (1, B): the request's checks in the CPU backend's order and
 *                   the acceptance chain on P(d) computed from the logits.
 *  logits_residual  grid (tiles, B): the residual (or bonus) row's tile sums; the
 *                   request's last block draws the tile, then the token in it.  On a
 *                   row with a cut, a token whose logit ranks below the cut token's
 *                   value has P = 0 and is passed over by its order key alone.
 *
 * Value table (bfloat16 logits): everything a pass needs of a token (W after min-p,
 * the gap bucket, the order key of z) is a function of its 16-bit value alone, given
 * the row's temperature, zmax and min-p.  logits_max computes it once per row for the
 * LG_TE values of the LG_BIN binades at and below the row's largest magnitude (both
 * signs, all 128 mantissas); a token whose value lies there reads it (lg_slot), any
 * other token (a magnitude below 2**-15 of the largest, a zero, -inf) computes it.
 * Sixteen binades leave almost no token of a real row outside the table: a warp then
 * rarely waits on one lane computing a weight.
 * Both give the same bits: the table holds the same functions of the same value.
 *
 * Tokens with W_v = 0 have P_v = 0 whatever the filters decide, and they rank after
 * every token with W_v > 0 (W is monotone in z): the filters are decided over the
 * tokens with W_v > 0 only.  The kept set is then a prefix of the ranking, held as two
 * cuts (top-k, top-p): token v with key kv is kept iff kv > cut key, or kv == cut key
 * and v <= cut id.
 * ====================================================================== */
#define LG_NB 2048   /* gap buckets: W > 0 implies zmax - z < 32 */
#define LG_CAP 2048  /* tokens of one bucket resolved in shared memory (= LG_NB: the
                        arrays serve both) */
#define LG_REC 16    /* u64 words of a row record */
#define LG_BIN 16    /* binades of the value table */
#define LG_TE (2 * LG_BIN * 128)  /* value-table entries: 2 signs x binades x 128 mantissas */
#define LG_TABW (LG_TE * 18 / 8)  /* u64 words of a row's table: W, key (u64), bucket (u16) */
#define LG_RL 128  /* listed tokens a residual tile keeps with their weights (rl_*) */
#define LG_RL_NONE 0xFFFFFFFFu  /* a tile whose list was not kept */
#define LG_RTILE (2 * LG_TE)  /* tokens of a residual tile its last block holds in shared
                                memory (routes.LOGITS_RESIDUAL_MAX_TILE) */
#define LG_TABLE_ROWS 128  /* calls over at most this many rows fill the value tables in
                             logits_table (routes.LOGITS_TABLE_ROWS), larger ones in
                             logits_max's tails */
#define LG_NOWIN 256u  /* LG_WIN of a row without a table (no binade matches it) */
static_assert((int)(DY_EXP_CUTOFF * 64.0) == LG_NB, "one gap bucket per 1/64 below the cutoff");

enum { LG_ST = 0, LG_MAXKEY, LG_ARG, LG_KKEY, LG_KID, LG_PKEY, LG_PID, LG_T, LG_S, LG_MPW,
       LG_STAGE, LG_BUCKET, LG_NEED, LG_BASE, LG_WIN };
enum { LG_DONE = 0, LG_RES_K = 1, LG_RES_P = 2 };

/* One request's parameters: n its depth (vr_depth), code the first failing rule
 * (NUM_DRAFTS_INVALID, then dy_logits_params_status), greedy when flagged or T = 0. */
struct LgReq { double temp; i64 topk; u32 topp, minp; int n, code, greedy; };

DC_FN LgReq lg_req(const double* temp, const i64* topk, const u32* topp, const u32* minp,
                   const unsigned char* g, const int* nd, int b, int k) {
  LgReq q;
  q.temp = temp[b]; q.topk = topk[b]; q.topp = topp[b]; q.minp = minp[b];
  q.n = vr_depth(nd, b, k);
  q.code = q.n < 0 ? DY_ST_NUM_DRAFTS_INVALID
                   : dy_logits_params_status(q.temp, q.topk, q.topp, q.minp);
  q.greedy = (g && g[b]) || q.temp == 0.0;
  return q;
}

/* A target row: logits x (dtype code dt) from offset off; z = x / temperature
 * (dy_effective_logit; greedy rows rank the logits themselves); its value table tab
 * over the binades from e0 (LG_NOWIN: none). */
struct LgRow { const void* x; int dt; i64 off; double temp; int greedy; const u64* tab; u32 e0; };

/* The float32 bits of token v's logit. */
DC_FN u32 lg_bits(const LgRow& r, int v) { return __float_as_uint(load_f(r.x, r.dt, r.off + v)); }

DC_FN double lg_z_of(const LgRow& r, u32 xb) {
  const double z = dc_f2d(__uint_as_float(xb));
  return (r.greedy || r.temp == 1.0) ? z : z / r.temp;
}

/* The float32 bits of a float16 value (exact). */
DC_FN u32 lg_half_bits(u16 h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return __float_as_uint(f);
}

#define LG_LOADS 4  /* 16-byte loads a thread has in flight in lg_tile16 */

/* Over the tokens [lo, hi) of a row of 16-bit logits p: w(v, word) for each 32-bit word
 * holding tokens v (low half) and v + 1 of the 16-byte aligned part, read eight tokens a
 * load with LG_LOADS loads issued before any is used, then t(v, h) for each other token.
 * Each thread visits its tokens in ascending id. */
template <class W, class T>
DC_FN void lg_tile16(const u16* p, int lo, int hi, W w, T t) {
  int v0 = lo;
  if ((((size_t)(p + lo)) & 15) == 0) {
    const int n8 = (hi - lo) >> 3;
    const uint4* p4 = (const uint4*)(p + lo);
    for (int j0 = threadIdx.x; j0 < n8; j0 += LG_LOADS * blockDim.x) {
      uint4 x[LG_LOADS];
#pragma unroll
      for (int u = 0; u < LG_LOADS; ++u) {
        const int j = j0 + u * (int)blockDim.x;
        if (j < n8) x[u] = __ldcs(&p4[j]);
      }
#pragma unroll
      for (int u = 0; u < LG_LOADS; ++u) {
        const int j = j0 + u * (int)blockDim.x;
        if (j >= n8) break;
        const int v = lo + 8 * j;
        w(v, x[u].x); w(v + 2, x[u].y); w(v + 4, x[u].z); w(v + 6, x[u].w);
      }
    }
    v0 = lo + 8 * n8;
  }
  for (int v = v0 + threadIdx.x; v < hi; v += blockDim.x) t(v, p[v]);
}

/* f(v, float32 bits of x_v) for every token v of [lo, hi) of a row, each thread its
 * tokens in ascending id (16-bit logits through lg_tile16). */
template <class F>
DC_FN void lg_tile(const LgRow& r, int lo, int hi, F f) {
  if (r.dt == 0) {
    for (int v = lo + threadIdx.x; v < hi; v += blockDim.x) f(v, lg_bits(r, v));
    return;
  }
  const u16* p = (const u16*)r.x + r.off;
  if (r.dt == 2)
    lg_tile16(p, lo, hi, [&](int v, u32 h) { f(v, h << 16); f(v + 1, h & 0xFFFF0000u); },
              [&](int v, u16 h) { f(v, (u32)h << 16); });
  else
    lg_tile16(p, lo, hi, [&](int v, u32 h) {
                f(v, lg_half_bits((u16)(h & 0xFFFFu))); f(v + 1, lg_half_bits((u16)(h >> 16)));
              },
              [&](int v, u16 h) { f(v, lg_half_bits(h)); });
}

/* The table entry of a bfloat16 value (as float32 bits) whose binade is one of the
 * LG_BIN from e0, or -1: sign, binade - e0, the 7 mantissa bits. */
DC_FN int lg_slot(u32 xb, u32 e0) {
  const u32 d = ((xb >> 23) & 0xFFu) - e0;
  return d < (u32)LG_BIN ? (int)((xb >> 31) * (LG_TE / 2) | (d << 7) | ((xb >> 16) & 0x7Fu))
                         : -1;
}

/* The float32 bits of table entry s (lg_slot's inverse). */
DC_FN u32 lg_slot_bits(int s, u32 e0) {
  return ((u32)(s / (LG_TE / 2)) << 31) | ((e0 + (u32)((s >> 7) & (LG_BIN - 1))) << 23)
         | ((u32)(s & 0x7F) << 16);
}

/* The table's three columns: W of a min-p survivor (else 0), the order key of z, the
 * gap bucket of a survivor (else LG_NB); T is u64 (the writer) or const u64. */
template <class T> DC_FN T* lg_tab_w(T* t) { return t; }
template <class T> DC_FN T* lg_tab_key(T* t) { return t + LG_TE; }
DC_FN u16* lg_tab_bucket(u64* t) { return (u16*)(t + 2 * LG_TE); }
DC_FN const u16* lg_tab_bucket(const u64* t) { return (const u16*)(t + 2 * LG_TE); }

/* The value of a dc_fkey key, as a double (exact). */
DC_FN double lg_key_x(u32 k) { return dc_f2d(__uint_as_float(dc_fkey_bits(k))); }

/* The decided state of a row: zmax, the min-p threshold, the two cuts, the scaling. */
struct LgCut { double zmax; u64 mpw, kkey, pkey; i64 kid, pid; int s; };

DC_FN LgCut lg_cut_of(const u64* rec) {
  LgCut c;
  c.zmax = dy_key_value(rec[LG_MAXKEY]); c.mpw = rec[LG_MPW];
  c.kkey = rec[LG_KKEY]; c.kid = (i64)rec[LG_KID];
  c.pkey = rec[LG_PKEY]; c.pid = (i64)rec[LG_PID];
  c.s = (int)rec[LG_S];
  return c;
}

DC_FN bool lg_before(u64 key, int v, u64 ck, i64 cid) {
  return key > ck || (key == ck && (i64)v <= cid);
}

/* Token v of a valid row: its order key, weight W (0: no mass) and gap bucket. */
struct LgEl { u64 key, w; int bucket; };

typedef const uint64_t (*LgTab)[256];  /* the exponential's table (dy_exp2_neg_q62_tab) */
#define LG_GTAB ((LgTab)dy_exp2_neg_q62_table)

/* The table copied into shared memory (8 KiB): the weight's four random 8-byte
 * lookups per token then come from shared memory, not from L1. */
DC_FN LgTab lg_load_table(uint64_t (*tab)[256]) {
  for (int j = threadIdx.x; j < 4 * 256; j += blockDim.x)
    tab[j >> 8][j & 255] = dy_exp2_neg_q62_table[j >> 8][j & 255];
  __syncthreads();
  return (LgTab)tab;
}

DC_FN LgEl lg_el_of(const LgRow& r, double zmax, u32 xb, LgTab tab = LG_GTAB) {
  const double z = lg_z_of(r, xb), gap = zmax - z;
  LgEl e;
  e.key = dy_order_key(z);
  e.w = dy_weight_from_gap_tab(gap, tab);
  e.bucket = e.w ? (int)(gap * 64.0) : LG_NB;
  return e;
}

DC_FN LgEl lg_el(const LgRow& r, double zmax, int v, LgTab tab = LG_GTAB) {
  return lg_el_of(r, zmax, lg_bits(r, v), tab);
}

/* A survivor of min-p with W > 0 (W * 2**24 >= mp * 2**39). */
DC_FN bool lg_surv(u64 w, u64 mpw) { return w && (w << DY_TOTAL_BITS) >= mpw; }

/* P_v of the processed target (0 off the kept set); the weight is computed only for
 * a token before both cuts. */
DC_FN u64 lg_p_of(const LgRow& r, const LgCut& c, int v, u32 xb, LgTab tab = LG_GTAB) {
  const int s = lg_slot(xb, r.e0);
  if (s >= 0) {
    const u64 w = lg_tab_w(r.tab)[s];
    if (!w) return 0;
    const u64 key = lg_tab_key(r.tab)[s];
    return lg_before(key, v, c.kkey, c.kid) && lg_before(key, v, c.pkey, c.pid) ? w << c.s : 0;
  }
  const double z = lg_z_of(r, xb);
  const u64 key = dy_order_key(z);
  if (!lg_before(key, v, c.kkey, c.kid) || !lg_before(key, v, c.pkey, c.pid)) return 0;
  const u64 w = dy_weight_from_gap_tab(c.zmax - z, tab);
  return lg_surv(w, c.mpw) ? w << c.s : 0;
}

DC_FN u64 lg_p(const LgRow& r, const LgCut& c, int v, LgTab tab = LG_GTAB) {
  return lg_p_of(r, c, v, lg_bits(r, v), tab);
}

#define LG_PTIE (~0ull)  /* a P-column entry whose key is a cut's: P depends on the id */

/* The table's P column in shared memory: P of a token with that value, or LG_PTIE
 * when its key equals a cut key (kept iff its id is at or before the cut id). */
DC_FN void lg_load_pcol(const LgRow& r, const LgCut& c, u64* sp) {
  if (r.e0 == LG_NOWIN) return;
  const u64* tw = lg_tab_w(r.tab);
  const u64* tk = lg_tab_key(r.tab);
  for (int j = threadIdx.x; j < LG_TE; j += blockDim.x) {
    const u64 w = __ldg(&tw[j]), key = __ldg(&tk[j]);
    sp[j] = !w ? 0
          : (key == c.kkey || key == c.pkey) ? LG_PTIE
          : (key > c.kkey && key > c.pkey) ? w << c.s : 0;
  }
  __syncthreads();
}

/* lg_p_of with the P column of lg_load_pcol (the same value). */
DC_FN u64 lg_p_col(const LgRow& r, const LgCut& c, int v, u32 xb, const u64* sp, LgTab tab) {
  const int s = lg_slot(xb, r.e0);
  if (s >= 0) {
    const u64 p = sp[s];
    if (p != LG_PTIE) return p;
  }
  return lg_p_of(r, c, v, xb, tab);
}

/* Inclusive warp scans of N u64 per lane at once (lane order). */
template <int N>
DC_FN void lg_warp_scan64n(u64 (&x)[N], int lane) {
  for (int o = 1; o < 32; o <<= 1) {
    u64 y[N];
#pragma unroll
    for (int i = 0; i < N; ++i) y[i] = __shfl_up_sync(0xffffffffu, x[i], o);
    if (lane >= o) {
#pragma unroll
      for (int i = 0; i < N; ++i) x[i] += y[i];
    }
  }
}

/* Exclusive block scans of N u64 per thread at once (thread order; the barriers of one
 * scan): v[i] becomes its exclusive scan, t[i] the sum.  blockDim.x < 1024 (the warp
 * totals are scanned in place in sh.r64 / sh.r64b, the sums left in their entry 31). */
template <int N>
DC_FN void lg_scan64n(u64 (&v)[N], u64 (&t)[N], DcShared& sh) {
  static_assert(N == 1 || N == 2, "two scratch rows");
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  u64* const row[2] = {sh.r64, sh.r64b};
  u64 inc[N];
#pragma unroll
  for (int i = 0; i < N; ++i) inc[i] = v[i];
  lg_warp_scan64n(inc, lane);
  __syncthreads();
  if (lane == 31) {
#pragma unroll
    for (int i = 0; i < N; ++i) row[i][wid] = inc[i];
  }
  __syncthreads();
  if (wid == 0) {
    u64 w[N], sc[N];
#pragma unroll
    for (int i = 0; i < N; ++i) sc[i] = w[i] = lane < nw ? row[i][lane] : 0;
    lg_warp_scan64n(sc, lane);
#pragma unroll
    for (int i = 0; i < N; ++i) {
      if (lane < nw) row[i][lane] = sc[i] - w[i];
      if (lane == 31) row[i][31] = sc[i];
    }
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < N; ++i) {
    v[i] = row[i][wid] + inc[i] - v[i];
    t[i] = row[i][31];
  }
  __syncthreads();
}

/* Exclusive block scan of one u64 per thread (thread order); *total = the sum. */
DC_FN u64 lg_scan64(u64 v, u64* total, DcShared& sh) {
  u64 a[1] = {v}, t[1];
  lg_scan64n<1>(a, t, sh);
  *total = t[0];
  return a[0];
}

/* Two scans at once (the barriers of one): returns a's exclusive scan, *eb b's; *ta, *tb
 * the sums. */
DC_FN u64 lg_scan64x2(u64 a, u64 b, u64* ta, u64* tb, u64* eb, DcShared& sh) {
  u64 x[2] = {a, b}, t[2];
  lg_scan64n<2>(x, t, sh);
  *ta = t[0]; *tb = t[1]; *eb = x[1];
  return x[0];
}

/* A place in an ordered list of LG_NB (bucket) or sorted-candidate entries. */
struct LgFound { int j; u64 cnt_before, mass_before, mass_at; };

/* The first entry j < lim of the lists cnt / mass (shared, LG_NB entries, 8 per
 * thread of a 256-thread block) whose inclusive running sum of mass (by_mass) or of
 * cnt reaches target (1 <= target <= that sum over [0, lim)), with the sums before
 * it and its own mass.  All threads get it. */
DC_FN void lg_find_sums(const u32* cnt, const u64* mass, int lim, u64* c, u64* m) {
  const int j0 = threadIdx.x * 8;
  *c = 0; *m = 0;
  for (int j = j0; j < j0 + 8; ++j)
    if (j < lim) { *c += cnt ? cnt[j] : 1u; *m += mass[j]; }
}

/* lg_find once the thread's sums c, m of its 8 entries (lg_find_sums) and their
 * exclusive scans ce, me over the block are known. */
DC_FN LgFound lg_find_scanned(const u32* cnt, const u64* mass, int lim, u64 target,
                              bool by_mass, u64 c, u64 m, u64 ce, u64 me, LgFound* out) {
  const int j0 = threadIdx.x * 8;
  const u64 e = by_mass ? me : ce, own = by_mass ? m : c;
  if (e < target && target <= e + own) {
    u64 cb = ce, mb = me;
    for (int j = j0; j < j0 + 8 && j < lim; ++j) {
      const u64 cj = cnt ? cnt[j] : 1u, mj = mass[j];
      if ((by_mass ? mb + mj : cb + cj) >= target) {
        out->j = j; out->cnt_before = cb; out->mass_before = mb; out->mass_at = mj;
        break;
      }
      cb += cj; mb += mj;
    }
  }
  __syncthreads();
  const LgFound f = *out;
  __syncthreads();
  return f;
}

DC_FN LgFound lg_find(const u32* cnt, const u64* mass, int lim, u64 target, bool by_mass,
                      DcShared& sh, LgFound* out) {
  u64 c, m, ct, mt, me;
  lg_find_sums(cnt, mass, lim, &c, &m);
  const u64 ce = lg_scan64x2(c, m, &ct, &mt, &me, sh);
  return lg_find_scanned(cnt, mass, lim, target, by_mass, c, m, ce, me, out);
}

/* Scaling of the kept total T (2**39 <= T <= 2**63) into [2**62, 2**63]
 * (dy_scale_target): the row is done. */
DC_FN void lg_finish(u64* rec, u64 T) {
  int s = 62 - (dy_bitlen64(T) - 1);
  if (s < 0) s = 0;
  rec[LG_T] = T << s; rec[LG_S] = (u64)s; rec[LG_STAGE] = LG_DONE;
}

/* After the filters before top-p left the kept mass Ts: top-p's target
 * ceil(u * Ts / 2**24), or 0 when top-p is off (u = 2**24). */
DC_FN u64 lg_top_p_need(u32 topp, u64 ts) {
  const u64 u = dy_f32_ceil24(topp);
  if (u >= DY_TOTAL) return 0;
  return dy_shr128(dy_add128(dy_mul64(u, ts), dy_from64(DY_TOTAL - 1u)), DY_TOTAL_BITS).lo;
}

/* Two (flag bit 31, largest magnitude bits 0-30) words of logits_max merged. */
DC_FN u32 lg_merge_bad(u32 a, u32 b) {
  return ((a | b) & 0x80000000u) | max(a & 0x7FFFFFFFu, b & 0x7FFFFFFFu);
}

/* ------------------------------------------------------------- tile counts
 * Over more than LG_TABLE_ROWS rows (lg_counted) logits_max reads a sampled bfloat16
 * tile once and, with its largest logit, counts the tile's tokens per value of a window
 * of LG_BIN binades, from e0t = max(1, top - LG_BIN + 1) where top is one binade above
 * the largest finite magnitude among the tile's first round of loads (LG_LOADS 16-byte
 * words a thread; LG_NOWIN when that round holds no normal finite logit, or the tile is
 * not 16-byte aligned), and lists by value the finite
 * tokens outside the window (zeros, subnormals, smaller or larger magnitudes), up to
 * LG_OTH of them; -inf tokens (W = 0) are left out.  The tile's record in tcnt (LG_TCW
 * words): the LG_TE 16-bit counts two a word (lg_slot's entries over e0t), the header
 * e0t << 16 | n, the n listed values two a word.  n = LG_TOVER: more than LG_OTH listed,
 * or the tile holds NaN / +inf (an invalid row, never histogrammed); logits_hist then
 * reads the tile itself (and, in a block of one tile, stores its counts over the row's
 * window as the tile's record: header e0 << 16).  logits_hist moves a record's counts
 * onto the row's window (the binades both share; the others are weighed a value at a
 * time) without reading the tile's logits, and lg_tcount reads a tile's count of a row
 * value from it.  Over at most LG_TABLE_ROWS rows every block of logits_hist reads its
 * tile and stores its record so. */
#define LG_OTH 62  /* tokens outside the tile's window listed in its record */
#define LG_TCW (LG_TE / 2 + 1 + LG_OTH / 2)  /* u32 words of a tile's record */
#define LG_TOVER 0xFFFFu  /* a record's n when logits_hist must read the tile */

/* A record's word of two 16-bit counts from a pair of counts held as one u64 (entry 2j in
 * the low half, 2j + 1 in the high half; a tile's counts fit 16 bits). */
DC_FN u32 lg_rec_pair(u64 e) { return (u32)e | ((u32)(e >> 32) << 16); }
/* A record's count of its window's entry s. */
DC_FN u32 lg_rec_count(const u32* tr, int s) {
  return (__ldcg(&tr[s >> 1]) >> ((s & 1) << 4)) & 0xFFFFu;
}
/* A record's listed token i (its bfloat16 bits). */
DC_FN u32 lg_rec_listed(const u32* tr, u32 i) {
  return (__ldcg(&tr[LG_TE / 2 + 1 + (i >> 1)]) >> (16 * (i & 1))) & 0xFFFFu;
}

/* A word of two bfloat16 tokens w against the value-table window of 2048 entries from
 * binade e, base2 = (e << 7) * 0x10001: a half h is in the window iff (h & 0x7FFF) - (e <<
 * 7) is in [0, 2048) (binade and mantissa), tested on both halves at once with each half
 * offset by 0x8000 so that no borrow crosses it (in the window iff the half is in [0x8000,
 * 0x8800)); the entry is then those 11 bits with the sign at bit 11 (lg_slot).  Both
 * halves in the window: one count each into ec; otherwise other(w) takes the word. */
template <typename F>
DC_FN void lg_window_word(u32 w, u32 base2, u32* ec, F other) {
  const u32 d2 = (w | 0x80008000u) - base2;
  if ((d2 & 0xF800F800u) == 0x80008000u) {
    atomicAdd(&ec[(d2 & 0x7FFu) | ((w >> 4) & 0x800u)], 1u);
    atomicAdd(&ec[((d2 >> 16) & 0x7FFu) | ((w >> 20) & 0x800u)], 1u);
  } else {
    other(w);
  }
}

/* Whether logits_max counts the tiles of a row (logits dtype code dt, greedy) of a call
 * over `rows` rows: sampled bfloat16 rows of calls over more than LG_TABLE_ROWS rows
 * (routes.logits_counted); over fewer the count would cost logits_max more than it
 * saves logits_hist. */
DC_FN bool lg_counted(int dt, bool greedy, int rows) {
  return dt == 2 && !greedy && rows > LG_TABLE_ROWS;
}

/* logits_max's read of the tile [lo, hi) of a sampled bfloat16 row p, two tokens per
 * 32-bit word in SIMD halves (nothing reads the argmax of a sampled row): *best the
 * dc_fkey of the largest logit, *bad as lg_merge_bad's words (NaN / +inf flag, largest
 * finite magnitude), and the tile's counts: ec (LG_TE u32, zeroed) over the window from
 * *e0t, the listed tokens into ol (*on, zeroed: how many were found, possibly more than
 * LG_OTH; *m0, zeroed: the first round's largest finite magnitude).  The order key of a
 * bfloat16 h is h ^ 0xFFFF (negative) or h ^ 0x8000: keys compare as the values do (-0
 * below +0, the same dc_fkey).  Per half: the largest key (+inf or a positive NaN: a
 * key >= 0xFF80), the largest magnitude (a NaN: above 0x7F80) and the largest finite
 * magnitude (m + 0x80 reaches bit 15 exactly when m >= 0x7F80, with no carry out of the
 * half).  COUNT false: the largest logit alone (ec, ol, on, m0, e0t untouched).  Every
 * thread of the block calls it. */
template <bool COUNT>
DC_FN void lg_max_count_bf16(const u16* p, int lo, int hi, u64* best, u32* bad, u32* ec, u16* ol,
                             u32* on, u32* m0, u32* e0t) {
  u32 k2 = 0, a2 = 0, m2 = 0;
  auto word = [&](u32 w) {
    const u32 neg = (w >> 15) & 0x00010001u;
    k2 = __vmaxu2(k2, w ^ (neg * 0xFFFFu | 0x80008000u));
    const u32 m = w & 0x7FFF7FFFu;
    a2 = __vmaxu2(a2, m);
    const u32 nonfinite = ((m + 0x00800080u) >> 15) & 0x00010001u;
    m2 = __vmaxu2(m2, m & ~(nonfinite * 0xFFFFu));
  };
  if constexpr (!COUNT) {
    lg_tile16(p, lo, hi, [&](int, u32 w) { word(w); },
              [&](int, u16 h) { word((u32)h * 0x00010001u); });  /* one token in both halves */
  } else {
    /* lg_tile16's loads, with a block barrier after the first round: its largest finite
     * magnitude sets the window */
    const int tid = threadIdx.x;
    const int n8 = (((size_t)(p + lo)) & 15) == 0 ? (hi - lo) >> 3 : 0;
    const uint4* p4 = (const uint4*)(p + lo);
    uint4 x[LG_LOADS];
    auto load = [&](int j0) {
#pragma unroll
      for (int u = 0; u < LG_LOADS; ++u) {
        const int j = j0 + u * (int)blockDim.x;
        if (j < n8) x[u] = __ldcs(&p4[j]);
      }
    };
    auto each = [&](int j0, auto f) {
#pragma unroll
      for (int u = 0; u < LG_LOADS; ++u) {
        const int j = j0 + u * (int)blockDim.x;
        if (j >= n8) break;
        f(x[u].x); f(x[u].y); f(x[u].z); f(x[u].w);
      }
    };
    load(tid);
    each(tid, word);
    const u32 mr = __reduce_max_sync(0xffffffffu, max(m2 & 0xFFFFu, m2 >> 16));
    if ((tid & 31) == 0) atomicMax(m0, mr);
    __syncthreads();
    const int top = min(254, (int)(*m0 >> 7) + 1);
    const u32 e = *m0 >> 7 ? (u32)max(1, top - (LG_BIN - 1)) : LG_NOWIN;
    *e0t = e;
    auto one = [&](u32 h) {
      const u32 d = (h & 0x7FFFu) - (e << 7);  /* (binade - e0t) << 7 | mantissa */
      if (d < (u32)(LG_TE / 2)) atomicAdd(&ec[d | ((h >> 4) & 0x800u)], 1u);
      else if ((h & 0x7FFFu) < 0x7F80u) {  /* finite, not -inf (a NaN / +inf tile is not used) */
        const u32 i = atomicAdd(on, 1u);
        if (i < (u32)LG_OTH) ol[i] = (u16)h;
      }
    };
    const u32 base2 = (e << 7) * 0x10001u;
    auto count = [&](u32 w) {
      lg_window_word(w, base2, ec, [&](u32 o) { one(o & 0xFFFFu); one(o >> 16); });
    };
    each(tid, count);
    for (int j0 = tid + LG_LOADS * (int)blockDim.x; j0 < n8; j0 += LG_LOADS * (int)blockDim.x) {
      load(j0);
      each(j0, [&](u32 w) { word(w); count(w); });
    }
    for (int v = lo + 8 * n8 + tid; v < hi; v += blockDim.x) {
      const u32 h = p[v];
      word(h * 0x00010001u);  /* one token in both halves */
      one(h);
    }
  }
  const u32 k = max(k2 & 0xFFFFu, k2 >> 16), a = max(a2 & 0xFFFFu, a2 >> 16),
            m = max(m2 & 0xFFFFu, m2 >> 16);
  *best = dc_fkey((k ^ ((k & 0x8000u) ? 0x8000u : 0xFFFFu)) << 16);
  *bad = (a > 0x7F80u || k >= 0xFF80u ? 0x80000000u : 0u) | (m << 16);
}

/* Entry j of a row's value table tr (binades from e0): W of a min-p survivor (else 0),
 * the order key of z, the gap bucket of a survivor (else LG_NB). */
DC_FN void lg_table_entry(const LgRow& row, double zmax, u64 mpw, u32 e0, int j, LgTab et,
                          u64* tr) {
  const LgEl e = lg_el_of(row, zmax, lg_slot_bits(j, e0), et);
  const bool surv = lg_surv(e.w, mpw);
  lg_tab_w(tr)[j] = surv ? e.w : 0;
  lg_tab_key(tr)[j] = e.key;
  lg_tab_bucket(tr)[j] = (u16)(surv ? e.bucket : LG_NB);
}

extern "C" __global__ void __launch_bounds__(256) logits_max(
    const void* x, int dt, const double* temp, const i64* topk, const u32* topp,
    const u32* minp, const unsigned char* g, const int* nd, int B, int k, int V, int nt,
    int tile, u64* part_key, u32* part_id, u32* part_bad, u64* rec, u32* cnt, u32* hcnt,
    u64* hmass, u32* cand_n, u64* tab, u32* tcnt) {
  __shared__ int is_last;
  __shared__ u64 wk[8];
  __shared__ u32 wi[8], wb[8];
  __shared__ u32 s_e0, s_on, s_m0;
  __shared__ double s_zmax;
  /* a counted tile's tokens per value (u32 ec[LG_TE]); in the row's last block then the
   * exponential's table (uint64_t[4][256]) */
  __shared__ u64 eb[LG_TE / 2];
  static_assert(sizeof(eb) >= 4 * 256 * sizeof(uint64_t), "eb holds the exponential's table");
  __shared__ u32 olw[LG_OTH / 2];  /* the listed tokens, two a word */
  const int t = blockIdx.x, r = dc_grid_row();
  if (r >= B * (k + 1)) return;
  const int b = r / (k + 1), i = r - b * (k + 1);
  const LgReq q = lg_req(temp, topk, topp, minp, g, nd, b, k);
  if (q.code || i > q.n) return;  /* block-uniform: the row is not read */
  const LgRow row = {x, dt, (i64)r * V, q.temp, q.greedy, 0, LG_NOWIN};
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  /* bad: bit 31 the NaN / +inf flag, bits 0-30 the largest magnitude (bits of |x|)
   * over the other logits but -inf */
  u64 best = 0; u32 arg = 0xFFFFFFFFu, bad = 0;
  const int lo = t * tile, hi = min(V, lo + tile);
  const bool counted = lg_counted(dt, q.greedy, B * (k + 1));
  u32* const ec = (u32*)eb;
  u16* const ol = (u16*)olw;
  u32 e0t = 0;
  if (counted) {
    for (int j = tid; j < LG_TE / 2; j += 256) eb[j] = 0;
    if (tid == 0) { s_on = 0; s_m0 = 0; }
    __syncthreads();
    lg_max_count_bf16<true>((const u16*)row.x + row.off, lo, hi, &best, &bad, ec, ol, &s_on,
                            &s_m0, &e0t);
  } else if (dt == 2 && !q.greedy) {
    lg_max_count_bf16<false>((const u16*)row.x + row.off, lo, hi, &best, &bad, 0, 0, 0, 0, 0);
  } else {
    lg_tile(row, lo, hi, [&](int v, u32 xb) {
      const u32 mag = xb & 0x7FFFFFFFu;
      if (mag >= 0x7F800000u && xb != 0xFF800000u) { bad = 0x80000000u; return; }  /* NaN, +inf */
      if (mag < 0x7F800000u) bad = lg_merge_bad(bad, mag);
      const u64 key = dc_fkey(xb);
      if (key > best) { best = key; arg = (u32)v; }  /* ids ascending per thread */
    });
  }
  for (int o = 16; o; o >>= 1) {
    const u64 ob = __shfl_xor_sync(0xffffffffu, best, o);
    const u32 oa = __shfl_xor_sync(0xffffffffu, arg, o);
    if (ob > best || (ob == best && oa < arg)) { best = ob; arg = oa; }
  }
  bad = __reduce_or_sync(0xffffffffu, bad & 0x80000000u) | __reduce_max_sync(0xffffffffu, bad & 0x7FFFFFFFu);
  if (lane == 0) { wk[wid] = best; wi[wid] = arg; wb[wid] = bad; }
  __syncthreads();
  if (tid == 0) {
    for (int w = 1; w < 8; ++w) {
      if (wk[w] > best || (wk[w] == best && wi[w] < arg)) { best = wk[w]; arg = wi[w]; }
      bad = lg_merge_bad(bad, wb[w]);
    }
    part_key[(i64)r * nt + t] = best; part_id[(i64)r * nt + t] = arg;
    part_bad[(i64)r * nt + t] = bad;
    s_e0 = bad >> 31;  /* a tile with NaN / +inf: its counts are not used */
  }
  if (counted) {
    __syncthreads();
    u32* tr = tcnt + ((i64)r * nt + t) * LG_TCW;
    const u32 n = !s_e0 && s_on <= (u32)LG_OTH ? s_on : LG_TOVER;
    if (n != LG_TOVER)
      for (int j = tid; j < LG_TE / 2; j += 256) {  /* at most 32768 tokens a tile */
        __stcg(&tr[j], lg_rec_pair(eb[j]));
      }
    if (tid == 0) tr[LG_TE / 2] = e0t << 16 | n;
    if (n != LG_TOVER && tid < (int)(n + 1) / 2) tr[LG_TE / 2 + 1 + tid] = olw[tid];
    DY_TL_MARK(1);  /* the tile's counts stored */
  }
  if (!dc_elect_last(&cnt[r], (u32)nt, &is_last)) return;
  /* the row's record (thread 0) and its histogram zeroed for logits_hist */
  for (int j = tid; j < LG_NB; j += 256) { hcnt[(i64)r * LG_NB + j] = 0; hmass[(i64)r * LG_NB + j] = 0; }
  if (wid == 0) {  /* the tiles' records, a lane per tile */
    best = 0; arg = 0xFFFFFFFFu; bad = 0;
    for (int s = lane; s < nt; s += 32) {
      const u64 kk = __ldcg(&part_key[(i64)r * nt + s]);
      const u32 a = __ldcg(&part_id[(i64)r * nt + s]);
      if (kk > best || (kk == best && a < arg)) { best = kk; arg = a; }
      bad = lg_merge_bad(bad, __ldcg(&part_bad[(i64)r * nt + s]));
    }
    for (int o = 16; o; o >>= 1) {
      const u64 ob = __shfl_xor_sync(0xffffffffu, best, o);
      const u32 oa = __shfl_xor_sync(0xffffffffu, arg, o);
      if (ob > best || (ob == best && oa < arg)) { best = ob; arg = oa; }
    }
    bad = __reduce_or_sync(0xffffffffu, bad & 0x80000000u) | __reduce_max_sync(0xffffffffu, bad & 0x7FFFFFFFu);
  }
  const u64 mpw = dy_f32_ceil24(q.minp) << DY_WEIGHT_BITS;  /* the min-p threshold */
  if (tid == 0) {
    const u32 amax = bad & 0x7FFFFFFFu;
    bad >>= 31;
    u64* rc = rec + (i64)r * LG_REC;
    /* zmax = z(xmax): division by T > 0 is monotone, so the largest z is the largest
     * x divided once (+inf when it overflows: TARGET_INVALID_VALUE, as a z of +inf) */
    const double xmax = lg_key_x((u32)best);
    const double zmax = (q.greedy || q.temp == 1.0) ? xmax : xmax / q.temp;
    if (!(zmax < dy_inf())) bad = 1;
    best = dy_order_key(zmax);
    rc[LG_ST] = bad ? DY_ST_TARGET_INVALID_VALUE
                    : (best <= DC_KEY_NEG_INF ? DY_ST_TARGET_ZERO_MASS : DY_ST_OK);
    rc[LG_MAXKEY] = best; rc[LG_ARG] = arg;
    rc[LG_KKEY] = 0; rc[LG_KID] = (u64)(i64)-1; rc[LG_PKEY] = 0; rc[LG_PID] = (u64)(i64)-1;
    rc[LG_MPW] = mpw;
    rc[LG_STAGE] = LG_DONE; rc[LG_T] = 1; rc[LG_S] = 0;
    cand_n[r] = 0;
    /* the value table of a sampled bfloat16 row: the LG_BIN binades at and below the
     * largest magnitude's (binades 1..254: never zero, subnormal, inf or NaN) */
    const int top = (int)(amax >> 23);
    const u32 e0 = (dt == 2 && !q.greedy && rc[LG_ST] == DY_ST_OK && top >= 1)
                   ? (u32)max(1, top - (LG_BIN - 1)) : LG_NOWIN;
    rc[LG_WIN] = e0;
    s_e0 = e0; s_zmax = zmax;
  }
  __syncthreads();
  const u32 e0 = s_e0;
  /* a call over at most LG_TABLE_ROWS rows fills the tables in logits_table, over every
   * SM; a larger one here, the tails overlapping the other rows' passes */
  if (e0 == LG_NOWIN || B * (k + 1) <= LG_TABLE_ROWS) return;
  const double zmax = s_zmax;
  u64* tr = tab + (i64)r * LG_TABW;
  DY_TL_MARK(0);  /* the record written: the value table next */
  const LgTab et = lg_load_table((uint64_t(*)[256])eb);  /* this block's counts are stored */
  for (int j = tid; j < LG_TE; j += 256) lg_table_entry(row, zmax, mpw, e0, j, et, tr);
}

/* The value tables of up to LG_TABLE_ROWS rows (logits_max leaves them), grid
 * (LG_TE / 256, rows): entry j of row r by thread j % 256 of block (j / 256, r), after
 * logits_max has written the row's record (its window e0, zmax, the min-p threshold);
 * rows without a table (not bfloat16, greedy, invalid) and inactive rows are not read. */
extern "C" __global__ void __launch_bounds__(256) logits_table(
    const void* x, int dt, const double* temp, const i64* topk, const u32* topp,
    const u32* minp, const unsigned char* g, const int* nd, int B, int k, int V, const u64* rec,
    u64* tab) {
  __shared__ uint64_t stab[4][256];
  const int r = dc_grid_row();
  if (r >= B * (k + 1) || B * (k + 1) > LG_TABLE_ROWS) return;
  const int b = r / (k + 1), i = r - b * (k + 1);
  const LgReq q = lg_req(temp, topk, topp, minp, g, nd, b, k);
  if (q.code || i > q.n) return;  /* block-uniform: logits_max wrote no record */
  const u64* rc = rec + (i64)r * LG_REC;
  const u32 e0 = (u32)rc[LG_WIN];
  if (e0 == LG_NOWIN) return;
  const LgRow row = {x, dt, (i64)r * V, q.temp, q.greedy, 0, LG_NOWIN};
  const LgTab et = lg_load_table(stab);
  const int j = (int)blockIdx.x * (int)blockDim.x + (int)threadIdx.x;
  if (j < LG_TE)
    lg_table_entry(row, dy_key_value(rc[LG_MAXKEY]), rc[LG_MPW], e0, j, et,
                   tab + (i64)r * LG_TABW);
}

/* The row (non-greedy, valid) of a logits_hist / logits_resolve block, or false. */
DC_FN bool lg_row_active(const double* temp, const i64* topk, const u32* topp, const u32* minp,
                         const unsigned char* g, const int* nd, int B, int k, int r,
                         const u64* rec, LgReq* q) {
  if (r >= B * (k + 1)) return false;
  const int b = r / (k + 1), i = r - b * (k + 1);
  *q = lg_req(temp, topk, topp, minp, g, nd, b, k);
  return !q->code && i <= q->n && !q->greedy && rec[(i64)r * LG_REC + LG_ST] == DY_ST_OK;
}

/* The top-p decision over the buckets before lim (kept mass ts, the mass before bucket
 * lim is base, the bucket's kept mass beyond it handled by the caller): a row done
 * or left with stage LG_RES_P.  cnt / mass: the row's histogram in shared memory. */
DC_FN void lg_mark_p_bucket(u64* rc, u64 need, const LgFound& f) {
  if (threadIdx.x == 0) {
    rc[LG_STAGE] = LG_RES_P; rc[LG_BUCKET] = (u64)f.j;
    rc[LG_NEED] = need - f.mass_before; rc[LG_BASE] = f.mass_before;
  }
}

DC_FN LgFound lg_decide_p_buckets(u64* rc, u64 need, const u32* cnt, const u64* mass, int lim,
                                  DcShared& sh, LgFound* scratch) {
  const LgFound f = lg_find(cnt, mass, lim, need, true, sh, scratch);
  lg_mark_p_bucket(rc, need, f);
  return f;
}

/* ------------------------------------------------------------- value cut
 * On a row with a value table the tiles' records (logits_max's counts, "tile counts")
 * give each tile's tokens per table value (lg_tcount).  The row's last
 * block then places a cut inside its bucket without another pass: the bucket's values in
 * ranking order (z descending: positive entries by descending slot, then negative ones by
 * ascending slot), the row's count of each, the value c where the count or the mass is
 * reached and how many of its tokens m the cut keeps (ties go to the lowest ids), the
 * tile holding the m-th token of value c, and that token's id from a scan of the one
 * tile.  It gives the cut logits_resolve's sorted candidates give, and applies when no
 * token outside the table can lie in the bucket, the bucket holds at most LG_VCUT values,
 * their keys are distinct (z of distinct values can coincide only when z underflows) and
 * the cut's tile is 16-byte aligned; otherwise ok is false and logits_resolve takes the
 * pass. */
#define LG_VCUT 256  /* values of a bucket placed from the counts (one a thread) */
#define LG_VROWS 16  /* rows of 256 16-byte words in a tile (routes.LOGITS_MAX_TILE = 32768
                        tokens) */

struct LgVPick { u64 key, mass; i64 id; u32 m; int ok; };

/* Whether a finite token outside the row's table (|x| < 2**(e0 - 127)) could lie in gap
 * bucket j (decided with a bucket of margin on each side). */
DC_FN bool lg_bucket_has_others(double zmax, double temp, u32 e0, int j) {
  const double zl = ldexp(1.0, (int)e0 - 127) / temp;
  const double glo = floor(64.0 * (zmax - zl)) - 1.0, ghi = floor(64.0 * (zmax + zl)) + 1.0;
  return !(glo > (double)j || ghi < (double)j);
}

/* The table slot at rank rk of the ranking (z descending): positive slots descending,
 * then negative ones ascending. */
DC_FN int lg_rank_slot(int rk) { return rk < LG_TE / 2 ? LG_TE / 2 - 1 - rk : rk; }

/* Token count of the row's table entry s (binades from e0) in tile t, from the tile's
 * record in the row's tcnt: its count over the record's window where that window holds
 * the value, plus its listed tokens of that value.  Only for a record logits_hist took
 * (lg_records_usable).  counted false (a call logits_max did not count): every record is
 * logits_hist's, over the row's window with nothing listed, and the count is read at once. */
DC_FN u32 lg_tcount(const u32* tc, int t, int s, u32 e0, bool counted) {
  const u32* tr = tc + (i64)t * LG_TCW;
  if (!counted) return lg_rec_count(tr, s);
  const u32 hdr = __ldcg(&tr[LG_TE / 2]), e0t = hdr >> 16, n = min(hdr & 0xFFFFu, (u32)LG_OTH);
  u32 c = 0;
  if (e0t != LG_NOWIN) {
    const int dt = ((s >> 7) & (LG_BIN - 1)) + (int)e0 - (int)e0t;  /* its record binade */
    if (dt >= 0 && dt < LG_BIN) {
      const int st = s + 128 * ((int)e0 - (int)e0t);
      c = lg_rec_count(tr, st);
    }
  }
  const u32 h = lg_slot_bits(s, e0) >> 16;
  for (u32 i = 0; i < n; ++i)
    c += lg_rec_listed(tr, i) == h;
  return c;
}

/* Whether every tile record of the row (tc, nt tiles) was taken by logits_hist (none
 * with LG_TOVER, whose tile logits_hist read instead): all threads get it. */
DC_FN bool lg_records_usable(const u32* tc, int nt) {
  int bad = 0;
  for (int t = threadIdx.x; t < nt; t += blockDim.x)
    bad |= (__ldcg(&tc[(i64)t * LG_TCW + LG_TE / 2]) & 0xFFFFu) == LG_TOVER;
  return !__syncthreads_or(bad);
}

/* The cut inside bucket j by count (top-k, !by_mass) or by mass reaching target; by
 * mass after a top-k cut of key kkey keeping km tokens of that value when kcut.  tc: the
 * row's tile counts (counted: the call's, logits_max's records among them; lg_tcount);
 * ls: 2 x LG_VCUT words of shared scratch.  Every thread of the block calls it and gets
 * the result. */
static __device__ __noinline__ LgVPick lg_value_pick(const LgRow& row, double zmax,
                                                     const u32* tc, int nt, bool counted,
                                                     int tile, int V, int j, bool by_mass,
                                                     u64 target,
                                                     bool kcut, u64 kkey, u32 km, u32* ls,
                                                     DcShared& sh) {
  __shared__ LgVPick res;
  __shared__ int s_at, s_bad;
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  __syncthreads();  /* every thread holds the previous call's result */
  if (tid == 0) { res.ok = 0; res.id = -1; s_at = -1; s_bad = 0; }
  if (lg_bucket_has_others(zmax, row.temp, row.e0, j) ||
      (counted && !lg_records_usable(tc, nt))) {
    __syncthreads();
    return res;
  }
  /* the bucket's values in ranking order: thread tid looks at ranks 16 tid .. + 15 */
  const u16* tbk = lg_tab_bucket(row.tab);
  const int per = LG_TE / 256;
  u32 mine = 0;
  for (int i = 0; i < per; ++i) mine |= (u32)(__ldg(&tbk[lg_rank_slot(tid * per + i)]) == j) << i;
  u64 n64;
  const int at = (int)lg_scan64((u64)__popc(mine), &n64, sh);
  const int n = (int)n64;
  if (n == 0 || n > LG_VCUT) return res;  /* (lg_scan64 synchronised after res) */
  for (int i = 0, o = at; i < per; ++i)
    if ((mine >> i) & 1u) ls[o++] = (u32)lg_rank_slot(tid * per + i);
  __syncthreads();
  DY_TL_MARK(3);  /* the bucket's values listed */
  /* each value's W and key, their loads in flight during the counts */
  u64 cnt = 0, mass = 0, w = 0, key = 0, next = 0;
  int s = 0;
  if (tid < n) {
    s = (int)ls[tid];
    w = __ldg(&lg_tab_w(row.tab)[s]); key = __ldg(&lg_tab_key(row.tab)[s]);
    if (tid + 1 < n) next = __ldg(&lg_tab_key(row.tab)[ls[tid + 1]]);
  }
  /* each value's count over the row's tiles, a warp a value; with at most 8 values over
   * at most 128 tiles each warp keeps its value's tile counts (tile lane + 32 u) for the
   * walk below */
  const bool few = n <= 8 && nt <= 128;
  u32 tcr[4] = {0, 0, 0, 0};
  if (few) {
    if (wid < n) {
      const int sv = (int)ls[wid];
#pragma unroll
      for (int u = 0; u < 4; ++u)
        if (lane + 32 * u < nt) tcr[u] = lg_tcount(tc, lane + 32 * u, sv, row.e0, counted);
      const u32 c = __reduce_add_sync(0xffffffffu, tcr[0] + tcr[1] + tcr[2] + tcr[3]);
      if (lane == 0) ls[LG_VCUT + wid] = c;
    }
  } else {
    for (int i = wid; i < n; i += 8) {
      const int sv = (int)ls[i];
      u32 c = 0;
      for (int t = lane; t < nt; t += 32) c += lg_tcount(tc, t, sv, row.e0, counted);
      c = __reduce_add_sync(0xffffffffu, c);
      if (lane == 0) ls[LG_VCUT + i] = c;
    }
  }
  __syncthreads();
  DY_TL_MARK(4);  /* the values' counts over the tiles */
  __shared__ int s_ci;
  if (tid < n) {
    cnt = ls[LG_VCUT + tid];
    if (tid + 1 < n && !(next < key)) s_bad = 1;
    if (by_mass && kcut) cnt = key < kkey ? 0 : (key == kkey ? km : cnt);
    mass = cnt * w;
  }
  u64 ct, mt, me;
  const u64 ce = lg_scan64x2(cnt, mass, &ct, &mt, &me, sh);
  if (s_bad) return res;
  const u64 e = by_mass ? me : ce, own = by_mass ? mass : cnt;
  if (tid < n && e < target && target <= e + own) {
    const u64 m = by_mass ? (target - me + w - 1) / w : target - ce;
    res.key = key; res.m = (u32)m; res.mass = me + m * w; s_at = s; s_ci = tid;
  }
  __shared__ int s_tile;
  __shared__ u32 s_rest, rowtot[LG_VROWS];
  if (tid == 0) s_tile = -1;
  if (tid < LG_VROWS) rowtot[tid] = 0;
  __syncthreads();
  DY_TL_MARK(5);  /* the cut's value */
  if (s_at < 0) return res;
  const int sc = s_at, ci = s_ci;
  const u32 m = res.m;
  /* the tile holding the m-th token of value sc */
  u64 tot;
  if (few) {  /* by warp ci's tile counts, in tile order (u, lane) */
    tot = ls[LG_VCUT + ci];
    if (wid == ci) {
      u32 run = 0;
      for (int u = 0; u < 4; ++u) {
        const u32 x = tcr[u];
        u32 inc = x;
        for (int o = 1; o < 32; o <<= 1) {
          const u32 y = __shfl_up_sync(0xffffffffu, inc, o);
          if (lane >= o) inc += y;
        }
        const u32 all = __shfl_sync(0xffffffffu, inc, 31);
        if (x && run + inc >= m && run + inc - x < m) {
          s_tile = lane + 32 * u; s_rest = m - (run + inc - x);
        }
        if (run + all >= m) break;
        run += all;
      }
    }
  } else {  /* a run of tiles a thread */
    const int tper = (nt + 255) / 256, t0 = min(nt, tid * tper), t1 = min(nt, t0 + tper);
    u32 own_c = 0;
    for (int t = t0; t < t1; ++t) own_c += lg_tcount(tc, t, sc, row.e0, counted);
    const u32 tb = (u32)lg_scan64(own_c, &tot, sh);
    if (tb < m && m <= tb + own_c) {
      u32 b = tb;
      for (int t = t0; t < t1; ++t) {
        const u32 c = lg_tcount(tc, t, sc, row.e0, counted);
        if (b + c >= m) { s_tile = t; s_rest = m - b; break; }
        b += c;
      }
    }
  }
  __syncthreads();
  DY_TL_MARK(6);  /* the cut's tile */
  if (!(m <= tot) || s_tile < 0 || s_tile >= nt) return res;
  /* the tile's s_rest-th token of value sc in ascending id, read in 16-byte words of 8
   * tokens (word 256 i + tid to thread tid, its match count in 4 bits of `packed`), four
   * rows of 256 words a round until the rows read hold s_rest of them, then the tokens
   * after the last whole word; a tile not 16-byte aligned is left to logits_resolve */
  const u16 hv = (u16)(lg_slot_bits(sc, row.e0) >> 16);
  const u16* p = (const u16*)row.x + row.off;
  const int lo = s_tile * tile, hi = min(V, lo + tile), nw = (hi - lo) >> 3;
  const int nrow = (nw + 255) / 256;
  if ((((size_t)(p + lo)) & 15) || nrow > LG_VROWS) return res;
  const uint4* p4 = (const uint4*)(p + lo);
  const u32 hv2 = (u32)hv * 0x00010001u, rest = s_rest;
  u64 packed = 0;
  u32 before = 0;  /* the value's tokens in the rows before row rs */
  int rs = -1;     /* the row holding the s_rest-th, block-uniform */
  uint4 xr = make_uint4(0, 0, 0, 0);  /* the thread's word of row rs */
  for (int i0 = 0; i0 < nrow && rs < 0; i0 += 4) {
    uint4 x[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int j = (i0 + u) * 256 + tid;
      x[u] = i0 + u < nrow && j < nw ? __ldcg(&p4[j]) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int j = (i0 + u) * 256 + tid;
      if (i0 + u >= nrow || j >= nw) continue;
      const u32 c = (__popc(__vcmpeq2(x[u].x, hv2)) + __popc(__vcmpeq2(x[u].y, hv2))
                     + __popc(__vcmpeq2(x[u].z, hv2)) + __popc(__vcmpeq2(x[u].w, hv2))) >> 4;
      packed |= (u64)c << (4 * (i0 + u));
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      if (i0 + u >= nrow) continue;
      const u32 c = __reduce_add_sync(0xffffffffu, (u32)(packed >> (4 * (i0 + u))) & 15u);
      if (lane == 0 && c) atomicAdd(&rowtot[i0 + u], c);
    }
    __syncthreads();
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      if (rs >= 0 || i0 + u >= nrow) continue;
      const u32 c = rowtot[i0 + u];
      if (before + c >= rest) { rs = i0 + u; xr = x[u]; }
      else before += c;
    }
  }
  DY_TL_MARK(7);  /* the cut's tile read */
  if (rs < 0) {  /* among the tokens after the last whole word */
    if (tid == 0) {
      u32 b = before;
      for (int v = lo + 8 * nw; v < hi; ++v)
        if (__ldcg(&p[v]) == hv && ++b == rest) { res.id = v; res.ok = 1; break; }
    }
    __syncthreads();
    return res;
  }
  const u32 own_v = (u32)(packed >> (4 * rs)) & 15u, want = rest - before;
  const u32 vb = (u32)lg_scan64(own_v, &tot, sh);
  if (vb < want && want <= vb + own_v) {
    const int j = rs * 256 + tid;
    const u32 w4[4] = {xr.x, xr.y, xr.z, xr.w};
    u32 b = vb;
    for (int h = 0; h < 8; ++h)
      if ((u16)(w4[h >> 1] >> ((h & 1) << 4)) == hv && ++b == want) {
        res.id = lo + 8 * j + h; res.ok = 1; break;
      }
  }
  __syncthreads();
  return res;
}

/* logits_hist's work for c tokens of one value outside the row's value table: its
 * weight, and their count and mass into the histogram when it survives min-p. */
DC_FN void lg_hist_other(const LgRow& row, double zmax, u32 xb, LgTab tab, u64 mpw, bool counts,
                         u32* sc, u64* sm, u32 c = 1) {
  const LgEl e = lg_el_of(row, zmax, xb, tab);
  if (lg_surv(e.w, mpw)) {
    if (counts) atomicAdd(&sc[e.bucket], c);
    dc_shared_add64(&sm[e.bucket], (u64)c * e.w);
  }
}

/* lg_hist_other out of line, for the passes over 16-bit logits: lg_tile16 unrolls its
 * loop to 32 tokens, and with each token's weight computed inline the loop would not fit
 * the instruction cache (a table row's common token takes the short inline table path). */
static __device__ __noinline__ void lg_hist_other_call(const LgRow& row, double zmax, u32 xb,
                                                       LgTab tab, u64 mpw, bool counts, u32* sc,
                                                       u64* sm) {
  lg_hist_other(row, zmax, xb, tab, mpw, counts, sc, sm);
}

/* logits_hist's work for a token of a table row (xb: its logit's float32 bits): its
 * value's count into ec, or other(xb) for a token outside the row's values. */
template <class F>
DC_FN void lg_hist_table_token(const LgRow& row, u32 xb, u32* ec, F other) {
  const int s = lg_slot(xb, row.e0);
  if (s >= 0) atomicAdd(&ec[s], 1u);
  else other(xb);
}

/* logits_hist's work for a 32-bit word of two bfloat16 logits (tokens v: the low half,
 * v + 1) of a table row when either lies outside the row's values: lg_hist_table_token,
 * another token's weight as lg_hist_other.  Out of line, as lg_hist_other_call. */
static __device__ __noinline__ void lg_hist_word_call(const LgRow& row, double zmax, u32 h,
                                                      u64 mpw, bool counts, u32* sc, u64* sm,
                                                      u32* ec) {
  const u32 xb[2] = {h << 16, h & 0xFFFF0000u};
  for (int i = 0; i < 2; ++i)
    lg_hist_table_token(row, xb[i], ec, [&](u32 o) {
      lg_hist_other(row, zmax, o, LG_GTAB, mpw, counts, sc, sm);
    });
}

/* logits_hist's work for a table row's tile from its record tr (logits_max's counts over
 * the window from e0t, n listed tokens): the counts of the binades the row's window
 * shares added to ec, the values outside the row's window weighed once a value (count x
 * W), the listed tokens one by one.  Every thread of the block calls it; out of line,
 * as lg_hist_other_call is. */
static __device__ __noinline__ void lg_hist_record(const LgRow& row, double zmax, const u32* tr,
                                                   u32 e0t, u32 n, u64 mpw, bool counts, u32* sc,
                                                   u64* sm, u32* ec) {
  if (e0t != LG_NOWIN) {  /* (a record without a window counted nothing) */
    const int dl = (int)row.e0 - (int)e0t;  /* the row's window starts dl binades above */
    constexpr int PER = LG_TE / 2 / 256;  /* words a thread (a 256-thread block) */
    u32 ws[PER];  /* loaded together: their latencies overlap */
#pragma unroll
    for (int u = 0; u < PER; ++u) ws[u] = __ldcg(&tr[threadIdx.x + 256 * u]);
#pragma unroll
    for (int u = 0; u < PER; ++u) {
      const int j = threadIdx.x + 256 * u;
      const u32 w = ws[u];
      if (!w) continue;
      const int d = ((j >> 6) & (LG_BIN - 1)) - dl;  /* the row binade (64 words each) */
      if (d >= 0 && d < LG_BIN) {
        const int rj = j - 64 * dl;  /* the same two values in the row's window */
        if (w & 0xFFFFu) atomicAdd(&ec[2 * rj], w & 0xFFFFu);
        if (w >> 16) atomicAdd(&ec[2 * rj + 1], w >> 16);
        continue;
      }
      for (int h = 0; h < 2; ++h) {
        const u32 c = (w >> (16 * h)) & 0xFFFFu;
        if (c) lg_hist_other(row, zmax, lg_slot_bits(2 * j + h, e0t), LG_GTAB, mpw, counts, sc, sm,
                             c);
      }
    }
  }
  for (int i = threadIdx.x; i < (int)min(n, (u32)LG_OTH); i += blockDim.x) {
    const u32 xb = lg_rec_listed(tr, (u32)i) << 16;
    lg_hist_table_token(row, xb, ec, [&](u32 o) {
      lg_hist_other(row, zmax, o, LG_GTAB, mpw, counts, sc, sm);
    });
  }
}

/* logits_hist's last block, the row's histogram in sc / sm: the top-k cut's bucket
 * (count) or else top-p's (mass), each placed from the value counts where it can
 * (lg_value_pick), else left in the record for logits_resolve; a row with neither cut is
 * done.  Out of line: the pass's registers are not held across it. */
static __device__ __noinline__ void lg_hist_decide(u64* rc, const LgReq& q, const LgRow& row,
                                                   double zmax, bool table, const u32* tc,
                                                   int nt, bool counted, int tile, int V,
                                                   const u32* sc,
                                                   const u64* sm, u32* ls, DcShared& sh,
                                                   LgFound* fdp) {
  LgFound& fd = *fdp;
  const int tid = threadIdx.x;
  u64 c, m, nsurv, ts, me;
  lg_find_sums(sc, sm, LG_NB, &c, &m);
  const u64 ce = lg_scan64x2(c, m, &nsurv, &ts, &me, sh);
  /* a cut is placed here from the value counts where it can (lg_value_pick), else the
   * record names its bucket for logits_resolve */
  auto p_pick = [&](const LgFound& f, u64 target, bool kcut, u64 kkey, u32 km) {
    if (!table) return;
    const LgVPick pp = lg_value_pick(row, zmax, tc, nt, counted, tile, V, f.j, true, target,
                                     kcut, kkey, km, ls, sh);
    if (pp.ok && tid == 0) {
      rc[LG_PKEY] = pp.key; rc[LG_PID] = (u64)pp.id; lg_finish(rc, f.mass_before + pp.mass);
    }
  };
  if (q.topk > 0 && (u64)q.topk < nsurv) {  /* top-k cuts inside bucket j */
    const LgFound f = lg_find_scanned(sc, sm, LG_NB, (u64)q.topk, false, c, m, ce, me, &fd);
    const u64 needk = (u64)q.topk - f.cnt_before, base = f.mass_before;
    LgVPick pk;
    pk.ok = 0;
    if (table) pk = lg_value_pick(row, zmax, tc, nt, counted, tile, V, f.j, false, needk, false,
                                  0, 0, ls, sh);
    if (!pk.ok) {
      if (tid == 0) {
        rc[LG_STAGE] = LG_RES_K; rc[LG_BUCKET] = (u64)f.j;
        rc[LG_NEED] = needk; rc[LG_BASE] = base;
      }
      return;
    }
    /* the top-k cut placed: top-p over the tokens before it, as logits_resolve's RES_K */
    if (tid == 0) { rc[LG_KKEY] = pk.key; rc[LG_KID] = (u64)pk.id; }
    const u64 tk = base + pk.mass, needp = lg_top_p_need(q.topp, tk);
    if (!needp) { if (tid == 0) lg_finish(rc, tk); return; }
    if (needp > base) {  /* top-p ends inside this bucket too */
      if (tid == 0) {
        rc[LG_STAGE] = LG_RES_P; rc[LG_BUCKET] = (u64)f.j;
        rc[LG_NEED] = needp - base; rc[LG_BASE] = base;
      }
      p_pick(f, needp - base, true, pk.key, pk.m);
      return;
    }
    const LgFound fp = lg_decide_p_buckets(rc, needp, sc, sm, f.j, sh, &fd);
    p_pick(fp, needp - fp.mass_before, false, 0, 0);
    return;
  }
  const u64 need = lg_top_p_need(q.topp, ts);
  if (!need) { if (tid == 0) lg_finish(rc, ts); return; }
  /* the buckets' scans above serve the top-p search over all of them */
  const LgFound f = lg_find_scanned(sc, sm, LG_NB, need, true, c, m, ce, me, &fd);
  lg_mark_p_bucket(rc, need, f);
  p_pick(f, need - f.mass_before, false, 0, 0);
}

/* logits_hist's body: GROUPS false, a tile a block (ng = nt); true, ng groups of tiles a
 * row (the calls whose tiles logits_max counted).  Two kernels, so that the reading pass
 * of the first is not compiled around the loop over tiles of the second. */
template <bool GROUPS>
DC_FN void lg_hist_run(const void* x, int dt, const double* temp, const i64* topk,
                       const u32* topp, const u32* minp, const unsigned char* g, const int* nd,
                       int B, int k, int V, int nt, int tile, u64* rec, u32* cnt, u32* hcnt,
                       u64* hmass, const u64* vtab, u32* tcnt, int ng) {
  __shared__ DcShared sh;
  __shared__ int is_last;
  __shared__ u32 sc[LG_NB];
  __shared__ u64 sm[LG_NB];
  /* a table row: its tile's tokens per table value (u32 ec[LG_TE]); a row without a
   * table: the exponential's table (uint64_t[4][256]) */
  __shared__ u64 eb[LG_TE / 2];
  static_assert(sizeof(eb) >= 4 * 256 * sizeof(uint64_t), "eb holds the exponential's table");
  u32* const ec = (u32*)eb;
  __shared__ LgFound fd;
  const int gi = blockIdx.x, r = dc_grid_row(), tid = threadIdx.x;
  LgReq q;
  if (gi >= ng || !lg_row_active(temp, topk, topp, minp, g, nd, B, k, r, rec, &q)) return;
  u64* rc = rec + (i64)r * LG_REC;
  const LgRow row = {x, dt, (i64)r * V, q.temp, 0, vtab + (i64)r * LG_TABW, (u32)rc[LG_WIN]};
  const double zmax = dy_key_value(rc[LG_MAXKEY]);
  const u64 mpw = rc[LG_MPW];
  const bool table = row.e0 != LG_NOWIN;
  for (int j = tid; j < LG_NB; j += 256) { sc[j] = 0; sm[j] = 0; }
  if (table) for (int j = tid; j < LG_TE / 2; j += 256) eb[j] = 0;
  /* the exponential's table in shared memory where every token computes its weight;
   * a table row's few tokens outside its values read it from global memory */
  const LgTab tab = table ? LG_GTAB : lg_load_table((uint64_t(*)[256])eb);
  __syncthreads();  /* the zeroed counts */
  /* counts are read only by a top-k cut: without top-k the row's counts stay 0 */
  const bool counts = q.topk > 0;
  u32* const tc = tcnt + (i64)r * nt * LG_TCW;  /* the row's tile records (table rows) */
  const bool counted = table && lg_counted(dt, false, B * (k + 1));
  /* the block's tiles: group gi of ng, consecutive */
  const int per = GROUPS ? (nt + ng - 1) / ng : 1;
  const int t0 = min(nt, gi * per), t1 = min(nt, t0 + per);
  bool store = false;  /* a block of one tile that reads it: its counts become its record */
  auto take = [&](int t) {  /* tile t into the block's counts and histogram */
    const int lo = t * tile, hi = min(V, lo + tile);
    /* a table row's tile from its record unless logits_max did not or could not count it */
    const u32* tr = tc + (i64)t * LG_TCW;
    const u32 hdr = counted ? __ldcg(&tr[LG_TE / 2]) : LG_TOVER, n = hdr & 0xFFFFu;
    store = table && t1 == t0 + 1 && n == LG_TOVER;
    if (row.dt == 0)  /* float32: one loop, the token's work inline */
      lg_tile(row, lo, hi,
              [&](int, u32 xb) { lg_hist_other(row, zmax, xb, tab, mpw, counts, sc, sm); });
    else if (!table)  /* 16-bit without a table (float16, or a bfloat16 row outside the
                       * table's reach): every token's work out of line */
      lg_tile(row, lo, hi, [&](int, u32 xb) {
        lg_hist_other_call(row, zmax, xb, tab, mpw, counts, sc, sm);
      });
    else if (n != LG_TOVER)  /* bfloat16 with a table, the tile counted by logits_max */
      lg_hist_record(row, zmax, tr, hdr >> 16, n, mpw, counts, sc, sm, ec);
    else {  /* bfloat16 with a table, the tile read: a word of two table values counted
             * inline */
      const u32 base2 = (row.e0 << 7) * 0x10001u;  /* the row's window is its table */
      lg_tile16((const u16*)row.x + row.off, lo, hi, [&](int, u32 h) {
        lg_window_word(h, base2, ec, [&](u32 o) {
          lg_hist_word_call(row, zmax, o, mpw, counts, sc, sm, ec);
        });
      }, [&](int, u16 h) {  /* a token outside the 16-byte aligned words */
        lg_hist_table_token(row, (u32)h << 16, ec, [&](u32 o) {
          lg_hist_other_call(row, zmax, o, tab, mpw, counts, sc, sm);
        });
      });
    }
  };
  if constexpr (GROUPS) {
    for (int t = t0; t < t1; ++t) take(t);
  } else {
    take(t0);
  }
  __syncthreads();
  DY_TL_MARK(0);  /* the tiles' tokens counted */
  if (table) {  /* each value present in the block's tiles: count x W into its bucket */
    /* a block of one tile that read it stores its counts as the tile's record over the
     * row's window, for lg_tcount (a tile read in a block of several keeps LG_TOVER:
     * the value cut is then left to logits_resolve) */
    u32* const tr = tc + (i64)t0 * LG_TCW;
    if (store) {
      for (int j = tid; j < LG_TE / 2; j += 256) {  /* two 16-bit counts a word (a tile
                                                      * holds at most 32768 tokens) */
        tr[j] = lg_rec_pair(eb[j]);
      }
      if (tid == 0) tr[LG_TE / 2] = row.e0 << 16;  /* the row's window, nothing listed */
    }
    const u64* tw = lg_tab_w(row.tab);
    const u16* tbk = lg_tab_bucket(row.tab);
    /* warp wp enters values [512 wp, 512 wp + 512), lane l those l + 32 u: the loads of
     * a warp are coalesced, and a lane's values of one sign are monotone in z, so those
     * of one bucket are consecutive in u: each run's count and mass are summed before
     * one atomic */
    constexpr int U = 8;  /* values a thread looks up at once (their loads overlap) */
    constexpr int N = LG_TE / 256;  /* values a thread enters */
    static_assert(N % U == 0 && (LG_TE / 2) % (32 * N) == 0, "whole rounds; one sign a warp");
    const int jb = (tid >> 5) * (32 * N) + (tid & 31);
    int rb = -1;  /* the run's bucket, count and mass */
    u32 rn = 0;
    u64 rm = 0;
    auto flush = [&] { if (counts) atomicAdd(&sc[rb], rn); dc_shared_add64(&sm[rb], rm); };
    for (int u0 = 0; u0 < N; u0 += U) {
      u32 c[U]; u64 w[U]; int bk[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int j = jb + 32 * (u0 + u);
        c[u] = ec[j];
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int j = jb + 32 * (u0 + u);
        w[u] = c[u] ? __ldg(&tw[j]) : 0;
        bk[u] = c[u] ? __ldg(&tbk[j]) : 0;
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (!w[u]) continue;
        if (bk[u] != rb) {
          if (rb >= 0) flush();
          rb = bk[u]; rn = 0; rm = 0;
        }
        rn += c[u]; rm += (u64)c[u] * w[u];
      }
    }
    if (rb >= 0) flush();
    __syncthreads();
  }
  DY_TL_MARK(1);  /* the table values entered: the histogram's merge next */
  /* the row's histogram (zeroed by logits_max) for logits_resolve: the blocks of a row
   * merge theirs, and the last one decides */
  u32* gc = hcnt + (i64)r * LG_NB;
  u64* gm = hmass + (i64)r * LG_NB;
  for (int j = tid; j < LG_NB; j += 256)  /* a survivor has W > 0: mass 0 iff none */
    if (sm[j]) {
      if (ng == 1) { if (counts) gc[j] = sc[j]; gm[j] = sm[j]; }
      else { if (counts) atomicAdd(&gc[j], sc[j]); atomicAdd(&gm[j], sm[j]); }
    }
  if (ng > 1) {
    if (!dc_elect_last(&cnt[r], (u32)ng, &is_last)) return;
    for (int j = tid; j < LG_NB; j += 256) { sc[j] = __ldcg(&gc[j]); sm[j] = __ldcg(&gm[j]); }
    __syncthreads();
  }
  DY_TL_MARK(2);  /* the last block holds the row's histogram */
  /* ec is free: its counts have entered the histogram */
  lg_hist_decide(rc, q, row, zmax, table, tc, nt, counted, tile, V, sc, sm, ec, sh, &fd);
}

extern "C" __global__ void __launch_bounds__(256, 4) logits_hist(
    const void* x, int dt, const double* temp, const i64* topk, const u32* topp,
    const u32* minp, const unsigned char* g, const int* nd, int B, int k, int V, int nt,
    int tile, u64* rec, u32* cnt, u32* hcnt, u64* hmass, const u64* vtab, u32* tcnt) {
  lg_hist_run<false>(x, dt, temp, topk, topp, minp, g, nd, B, k, V, nt, tile, rec, cnt, hcnt,
                     hmass, vtab, tcnt, nt);
}

extern "C" __global__ void __launch_bounds__(256, 4) logits_hist_groups(
    const void* x, int dt, const double* temp, const i64* topk, const u32* topp,
    const u32* minp, const unsigned char* g, const int* nd, int B, int k, int V, int nt,
    int tile, u64* rec, u32* cnt, u32* hcnt, u64* hmass, const u64* vtab, u32* tcnt, int ng) {
  lg_hist_run<true>(x, dt, temp, topk, topp, minp, g, nd, B, k, V, nt, tile, rec, cnt, hcnt,
                    hmass, vtab, tcnt, ng);
}

/* The exact pick inside one bucket when it holds more than LG_CAP candidates: an MSD
 * radix select on 8-bit digits of the order key over the whole row (the candidates:
 * survivors in `bucket`, before the top-k cut when by_mass), counting tokens
 * (!by_mass) or mass (by_mass) until target, then the tied tokens of the final key
 * by ascending id.  Returns the last token taken (key, id) and the mass taken. */
struct LgPick { u64 key, mass; i64 id; };

DC_FN LgPick lg_pick_slow(const LgRow& row, const LgCut& c, int V, int bucket, bool by_mass,
                          u64 target, DcShared& sh, u64* hc, u64* hm) {  /* hc, hm: 256 each */
  const int tid = threadIdx.x;
  __shared__ u64 s_prefix, s_need, s_above;
  u64 prefix = 0, mask = 0, need = target, above = 0;
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int d = tid; d < 256; d += 256) { hc[d] = 0; hm[d] = 0; }
    __syncthreads();
    for (int v = tid; v < V; v += 256) {
      const LgEl e = lg_el(row, c.zmax, v);
      if (!lg_surv(e.w, c.mpw) || e.bucket != bucket || (e.key & mask) != prefix) continue;
      if (by_mass && !lg_before(e.key, v, c.kkey, c.kid)) continue;
      const int d = (int)((e.key >> shift) & 0xFFu);
      atomicAdd(&hc[d], 1ull); atomicAdd(&hm[d], e.w);
    }
    __syncthreads();
    if (tid == 0) {
      u64 acc = 0, ab = above;
      int d = 255;
      for (; d > 0; --d) {
        const u64 val = by_mass ? hm[d] : hc[d];
        if (acc + val >= need) break;
        acc += val; ab += hm[d];
      }
      s_need = need - acc; s_above = ab; s_prefix = prefix | ((u64)d << shift);
    }
    __syncthreads();
    need = s_need; above = s_above; prefix = s_prefix; mask |= (u64)0xFF << shift;
    __syncthreads();
  }
  /* the final key's tokens (equal z: equal W) in ascending id: the first m of them */
  const u64 wt = dy_weight_from_gap(c.zmax - dy_key_value(prefix));
  const u64 m = by_mass ? (need + wt - 1) / wt : need;
  const int chunk = (V + 255) / 256, lo = tid * chunk, hi = min(V, lo + chunk);
  int n = 0;
  for (int v = lo; v < hi; ++v) {
    const LgEl e = lg_el(row, c.zmax, v);
    n += (e.key == prefix && lg_surv(e.w, c.mpw) && e.bucket == bucket
          && (!by_mass || lg_before(e.key, v, c.kkey, c.kid)));
  }
  int tot;
  const int ex = block_excl_scan(n, &tot, sh);
  if ((u64)ex < m && m <= (u64)(ex + n)) {
    int cc = ex;
    for (int v = lo; v < hi; ++v) {
      const LgEl e = lg_el(row, c.zmax, v);
      if (e.key == prefix && lg_surv(e.w, c.mpw) && e.bucket == bucket
          && (!by_mass || lg_before(e.key, v, c.kkey, c.kid)) && (u64)(++cc) == m) {
        sh.cutoff = v;
        break;
      }
    }
  }
  __syncthreads();
  LgPick p;
  p.key = prefix; p.id = sh.cutoff; p.mass = above + m * wt;
  __syncthreads();
  return p;
}

/* A superset [*lo, *hi] of the dc_fkeys of the logits x whose gap bucket is j: the x
 * with z = x / T (T = temp > 0) at most 1/64 outside the bucket's range of z,
 * (zmax - (j+1)/64, zmax - j/64], bounds rounded outwards to float32.  The margin is far
 * beyond the rounding of z = x / T, of the gap and of x = z * T while |zmax| < 2**40;
 * otherwise, or with a bound too near zero for float32 (flushed), every key. */
DC_FN void lg_bucket_keys(double zmax, double temp, int j, u32* lo, u32* hi) {
  *lo = 0; *hi = 0xFFFFFFFFu;
  if (!(fabs(zmax) < 1099511627776.0)) return;
  const double xl = (zmax - (j + 2) / 64.0) * temp, xh = (zmax - (j - 1) / 64.0) * temp;
  if (fabs(xl) < 1e-30 || fabs(xh) < 1e-30) return;
  *lo = dc_fkey(__float_as_uint(__double2float_rd(xl)));
  *hi = dc_fkey(__float_as_uint(__double2float_ru(xh)));
}

/* Bitonic sort of n <= LG_CAP (key, id) pairs in shared memory by key descending, id
 * ascending (entries past n padded to sort last). */
DC_FN void lg_sort(u64* key, u32* id, int n) {
  int np = 1;
  while (np < n) np <<= 1;
  for (int j = n + threadIdx.x; j < np; j += 256) { key[j] = 0; id[j] = 0xFFFFFFFFu; }
  __syncthreads();
  for (int size = 2; size <= np; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int a = threadIdx.x; a < np; a += 256) {
        const int p = a ^ stride;
        if (p > a) {
          const bool up = (a & size) == 0;  /* this run sorted "better first" */
          const bool pb = key[p] > key[a] || (key[p] == key[a] && id[p] < id[a]);
          if (pb == up) {
            const u64 tk = key[a]; key[a] = key[p]; key[p] = tk;
            const u32 ti = id[a]; id[a] = id[p]; id[p] = ti;
          }
        }
      }
      __syncthreads();
    }
  }
}

/* The order key of a token outside the row's value table (logit bits xb) when it
 * survives min-p in gap bucket j (the bucket from the gap alone: W > 0 needs a gap below
 * 32; the weight only inside it), else 0 (a survivor's key is above DC_KEY_NEG_INF). */
DC_FN u64 lg_gap_key(const LgRow& row, const LgCut& c, int j, u32 xb) {
  const double z = lg_z_of(row, xb), gap = c.zmax - z;
  if (!(gap < DY_EXP_CUTOFF) || (int)(gap * 64.0) != j) return 0;
  return lg_surv(dy_weight_from_gap(gap), c.mpw) ? dy_order_key(z) : 0;
}

/* lg_gap_key out of line for the passes over 16-bit logits, as lg_hist_other_call is. */
static __device__ __noinline__ u64 lg_gap_key_call(const LgRow& row, const LgCut& c, int j,
                                                   u32 xb) {
  return lg_gap_key(row, c, j, xb);
}

extern "C" __global__ void __launch_bounds__(256) logits_resolve(
    const void* x, int dt, const double* temp, const i64* topk, const u32* topp,
    const u32* minp, const unsigned char* g, const int* nd, int B, int k, int V, int nt,
    int tile, u64* rec, u32* cnt, u32* hcnt, u64* hmass, u64* cand_key, u32* cand_id,
    u32* cand_n, const u64* vtab) {
  __shared__ DcShared sh;
  __shared__ int is_last;
  __shared__ u64 s64[LG_CAP];
  __shared__ u32 s32[LG_CAP];
  __shared__ u64 smass[LG_CAP];  /* sorted candidates' masses; the slow pick's histogram */
  __shared__ LgFound fd;
  const int t = blockIdx.x, r = dc_grid_row(), tid = threadIdx.x;
  LgReq q;
  if (!lg_row_active(temp, topk, topp, minp, g, nd, B, k, r, rec, &q)) return;
  u64* rc = rec + (i64)r * LG_REC;
  const int stage = (int)rc[LG_STAGE];
  if (stage == LG_DONE) return;
  const LgRow row = {x, dt, (i64)r * V, q.temp, 0, vtab + (i64)r * LG_TABW, (u32)rc[LG_WIN]};
  LgCut c = lg_cut_of(rc);
  const int bucket = (int)rc[LG_BUCKET];
  const bool by_mass = stage == LG_RES_P;
  const u64* tkey = lg_tab_key(row.tab);
  const u16* tbk = lg_tab_bucket(row.tab);
  u32 klo, khi;
  lg_bucket_keys(c.zmax, q.temp, bucket, &klo, &khi);
  /* gather the bucket's candidates (before the top-k cut when resolving top-p) */
  const int lo = t * tile, hi = min(V, lo + tile);
  /* a table token's key when it is a survivor in the bucket, else 0 (a survivor's key is
   * above DC_KEY_NEG_INF) */
  auto table_key = [&](int s, u32 xb) -> u64 {
    const u32 fk = dc_fkey(xb);
    return fk < klo || fk > khi || __ldg(&tbk[s]) != bucket ? 0 : __ldg(&tkey[s]);
  };
  auto add = [&](int v, u64 key) {
    if (by_mass && !lg_before(key, v, c.kkey, c.kid)) return;
    const u32 slot = atomicAdd(&cand_n[r], 1u);
    if (slot < LG_CAP) { cand_key[(i64)r * LG_CAP + slot] = key; cand_id[(i64)r * LG_CAP + slot] = (u32)v; }
  };
  /* float32: the token's work inline */
  auto gather = [&](int v, u32 xb) {
    const int s = lg_slot(xb, row.e0);
    const u64 key = s >= 0 ? table_key(s, xb) : lg_gap_key(row, c, bucket, xb);
    if (key) add(v, key);
  };
  /* 16-bit: a token outside the table out of line, reading the block's shared copy */
  __shared__ LgRow srow;
  __shared__ LgCut scut;
  if (tid == 0) { srow = row; scut = c; }
  __syncthreads();
  auto gather16 = [&](int v, u32 xb) {
    const int s = lg_slot(xb, row.e0);
    const u64 key = s >= 0 ? table_key(s, xb) : lg_gap_key_call(srow, scut, bucket, xb);
    if (key) add(v, key);
  };
  if (row.e0 != LG_NOWIN) {
    /* bfloat16 with a table, two tokens a 32-bit word: a table token whose 16-bit order
     * key lies outside [klo >> 16, khi >> 16] has a dc_fkey outside [klo, khi] (its
     * dc_fkey is that key << 16, plus 0xFFFF when negative), so gather would pass it
     * over; a word of two such tokens is passed over by SIMD compares alone */
    const u32 lo2 = (klo >> 16) * 0x00010001u, hi2 = (khi >> 16) * 0x00010001u,
              e02 = row.e0 * 0x00010001u;
    lg_tile16((const u16*)x + row.off, lo, hi, [&](int v, u32 w) {
      const u32 k2 = w ^ (((w >> 15) & 0x00010001u) * 0xFFFFu | 0x80008000u);
      const u32 tab2 = __vcmpltu2(__vsub2((w >> 7) & 0x00FF00FFu, e02), LG_BIN * 0x00010001u);
      const u32 skip = tab2 & ~(__vcmpgeu2(k2, lo2) & __vcmpleu2(k2, hi2));
      if ((skip & 0xFFFFu) != 0xFFFFu) gather16(v, w << 16);
      if ((skip >> 16) != 0xFFFFu) gather16(v + 1, w & 0xFFFF0000u);
    }, [&](int v, u16 h) { gather16(v, (u32)h << 16); });
  } else if (row.dt == 0) {
    lg_tile(row, lo, hi, gather);
  } else {
    lg_tile(row, lo, hi, gather16);
  }
  if (!dc_elect_last(&cnt[r], (u32)nt, &is_last)) return;  /* (synchronises: s32 is free) */
  const u32 n = __ldcg(&cand_n[r]);
  const u64 need = rc[LG_NEED], base = rc[LG_BASE];
  const bool fits = n <= LG_CAP;
  if (fits) {
    for (u32 j = tid; j < n; j += 256) { s64[j] = __ldcg(&cand_key[(i64)r * LG_CAP + j]); s32[j] = __ldcg(&cand_id[(i64)r * LG_CAP + j]); }
    __syncthreads();
    lg_sort(s64, s32, (int)n);
  }
  __syncthreads();
  DY_TL_MARK(0);  /* the candidates loaded and sorted */
  if (tid == 0) cand_n[r] = 0;
  /* candidate j's mass (sorted order) as a list for lg_find: W from its key */
  if (fits) {
    for (int j = tid; j < LG_CAP; j += 256)
      smass[j] = j < (int)n ? dy_weight_from_gap(c.zmax - dy_key_value(s64[j])) : 0;
    __syncthreads();
  }
  DY_TL_MARK(1);  /* the candidates' masses */
  LgPick pk;
  /* the pick by count (top-k) or mass (top-p) inside the bucket */
  auto pick = [&](bool bym, u64 target) {
    LgPick p;
    if (fits) {
      const LgFound f = lg_find(0, smass, (int)n, target, bym, sh, &fd);
      p.key = s64[f.j]; p.id = s32[f.j]; p.mass = f.mass_before + f.mass_at;
    } else {
      p = lg_pick_slow(row, c, V, bucket, bym, target, sh, s64, smass);
    }
    return p;
  };
  if (stage == LG_RES_K) {
    pk = pick(false, need);
    const u64 ts = base + pk.mass;
    if (tid == 0) { rc[LG_KKEY] = pk.key; rc[LG_KID] = (u64)pk.id; }
    c.kkey = pk.key; c.kid = pk.id;
    const u64 needp = lg_top_p_need(q.topp, ts);
    if (!needp) { if (tid == 0) lg_finish(rc, ts); return; }
    if (needp > base) {  /* top-p ends inside this bucket too */
      const LgPick pp = pick(true, needp - base);
      if (tid == 0) { rc[LG_PKEY] = pp.key; rc[LG_PID] = (u64)pp.id; lg_finish(rc, base + pp.mass); }
      return;
    }
    /* top-p ends in an earlier bucket: the next launch resolves it */
    __syncthreads();
    for (int j = tid; j < LG_NB; j += 256) { s32[j] = __ldcg(&hcnt[(i64)r * LG_NB + j]); s64[j] = __ldcg(&hmass[(i64)r * LG_NB + j]); }
    __syncthreads();
    lg_decide_p_buckets(rc, needp, s32, s64, bucket, sh, &fd);
    return;
  }
  pk = pick(true, need);
  if (tid == 0) { rc[LG_PKEY] = pk.key; rc[LG_PID] = (u64)pk.id; lg_finish(rc, base + pk.mass); }
}

/* ------------------------------------------------------------------ chain
 * One block per request: in the CPU backend's order (dy_verify_logits_row_host)
 * num_drafts, the parameters, every target row 0..n (TARGET_INVALID_VALUE,
 * TARGET_ZERO_MASS), the draft ids and q rows (dc_draft_check), q(d) > 0; then the
 * acceptance chain on P_i(d_i) (dy_accept) or the argmax (greedy).  The records and the
 * drafts are read by a thread each, and each position's acceptance (a pure function of
 * its P_i(d_i), T_i, q_i(d_i) and key) is decided by a thread of its own once the
 * request passed every check; thread 0 then walks the chain to its first rejection (or
 * failing draw), as the sequential chain does.  The residual / bonus row goes to
 * logits_residual (res_row, -1 when none). */
extern "C" __global__ void __launch_bounds__(256) logits_chain(
    const void* x, int dt, const double* temp, const i64* topk, const u32* topp,
    const u32* minp, const unsigned char* g, const int* nd, int B, int k, int V,
    const int* draft, const u32* qc, const int* qi, int W, const void* kseed, const void* kgen,
    const void* krnd, const void* kpos, int kfmt, const u64* rec, const u64* vtab,
    int* res_row, int* accepted, int* tokens, int* status) {
  __shared__ u32 cq[64], idbits[8];
  __shared__ int rst[65], acode[64], aok[64], s_code;
  const int b = dc_grid_row(), tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  if (b >= B) return;
  const LgReq q = lg_req(temp, topk, topp, minp, g, nd, b, k);
  int* tok = tokens + (i64)b * (k + 1);
  const i64 qrow = (i64)b * k;
  const int n = q.n;
  const u64* rb = rec + (i64)b * (k + 1) * LG_REC;
  {
    u32 f = 0;
    for (int i = wid; !q.code && i < n; i += 8) {
      u32 c;
      f |= dc_draft_check(draft[qrow + i], qc, qi, W, V, qrow + i, &c);
      if (lane == 0) cq[i] = c;
    }
    if (lane == 0) idbits[wid] = f;
    for (int i = tid; !q.code && i <= n; i += blockDim.x) rst[i] = (int)rb[(i64)i * LG_REC + LG_ST];
  }
  __syncthreads();
  if (tid == 0) {
    res_row[b] = -1;
    int code = q.code;
    for (int i = 0; i <= n && !code; ++i) code = rst[i];
    u32 ids = 0;
    for (int w = 0; w < 8; ++w) ids |= idbits[w];
    if (!code && (ids & 2u)) code = DY_ST_DRAFT_OUT_OF_RANGE;
    if (!code && !q.greedy && (ids & 1u)) code = DY_ST_Q_INVALID;
    for (int i = 0; i < n && !code && !q.greedy; ++i)
      if (cq[i] == 0) code = DY_ST_Q_ZERO_AT_DRAFT;
    for (int i = 0; i <= k; ++i) tok[i] = -1;
    accepted[b] = 0;
    if (code) status[b] = code;
    s_code = code;
  }
  __syncthreads();
  if (s_code) return;  /* block-uniform: nothing is read at a draft id */
  if (tid < n) {  /* position tid's acceptance: every draft id is in [0, V) */
    const int i = tid;
    const u64* rc = rb + (i64)i * LG_REC;
    const int d = draft[qrow + i];
    int ok = 0, c = DY_ST_OK;
    if (q.greedy) ok = d == (int)rc[LG_ARG];
    else {
      const DcKey key = load_key(kseed, kgen, krnd, kpos, kfmt, b);
      const i64 r = (i64)b * (k + 1) + i;
      const LgRow row = {x, dt, r * V, q.temp, 0, vtab + r * LG_TABW, (u32)rc[LG_WIN]};
      c = dy_accept(lg_p(row, lg_cut_of(rc), d), rc[LG_T], cq[i], key.seed, key.gen,
                    key.rnd, key.pos + i, &ok);
    }
    acode[i] = c; aok[i] = ok;
  }
  __syncthreads();
  if (tid != 0) return;
  for (int i = 0; i < n; ++i) {
    if (acode[i]) {
      for (int a = 0; a <= k; ++a) tok[a] = -1;
      accepted[b] = 0; status[b] = acode[i];
      return;
    }
    if (aok[i]) { tok[i] = draft[qrow + i]; continue; }
    accepted[b] = i;
    if (q.greedy) tok[i] = (int)rb[(i64)i * LG_REC + LG_ARG];
    else res_row[b] = i;
    status[b] = DY_ST_OK;
    return;
  }
  accepted[b] = n;
  if (q.greedy) tok[n] = (int)rb[(i64)n * LG_REC + LG_ARG];
  else res_row[b] = n;
  status[b] = DY_ST_OK;
}

/* ---------------------------------------------------------------- residual
 * R_v = dy_residual(P_v, q_v, T) of the rejected row (the bonus row: P_v), P_v from
 * the logits.  Tile sums in 128 bits (sparse q / point mass: every P_v, then the
 * support entries of the tile corrected); the request's last block draws X below
 * the total (domain CORRECTION at the row's position), the tile holding X, then the
 * token in it, with the tile's logits held in shared memory. */
struct LgRes { LgRow row; LgCut c; const u32* qcr; const int* qir; int nv, d, bonus; u64 T; LgTab tab; u32 low; };

/* A dc_fkey below which no token of the row has P > 0: the key of the value of the
 * tighter cut's token (the larger cut key), provided the next float32 below that value
 * already ranks below the cut (z = x / T could round distinct values together; then, and
 * without a cut or with a cut id outside [0, V), 0: no bound, every token's P computed). */
DC_FN u32 lg_low_key(const LgRow& r, const LgCut& c, int V) {
  const bool p = c.pkey >= c.kkey;
  const u64 ck = p ? c.pkey : c.kkey;
  const i64 id = p ? c.pid : c.kid;
  if (!ck || id < 0 || id >= V) return 0;
  const u32 key = dc_fkey(lg_bits(r, (int)id));
  return key && dy_order_key(lg_z_of(r, dc_fkey_bits(key - 1))) < ck ? key : 0;
}

/* R_v (the bonus row: P_v) of token v whose logit has the float32 bits xb, at or above
 * r.low; out of line, as lg_hist_other_call is: block_draw's loops inline their weight. */
static __device__ __noinline__ dy_u128 lg_res_weight_call(const LgRes& r, int v, u32 xb) {
  const u64 P = lg_p_of(r.row, r.c, v, xb, r.tab);
  if (!P) return dy_make128(0, 0);  /* dy_residual(0, q, T) = 0: q is not read */
  if (r.bonus) return dy_from64(P);
  return dy_residual(P, q_at(r.qcr, r.qir, r.nv, v, r.d), r.T);
}

/* R_v (the bonus row: P_v) of token v whose logit has the float32 bits xb. */
DC_FN dy_u128 lg_res_weight(const LgRes& r, int v, u32 xb) {
  return dc_fkey(xb) < r.low ? dy_make128(0, 0) : lg_res_weight_call(r, v, xb);
}

/* The tile pass's term of token v (logit bits xb, at or above r.low): R_v on a dense q
 * row, P_v on the bonus row, else P_v * 2**24 (the support entries corrected after);
 * spc the row's P column when pcol. */
DC_FN dy_u128 lg_res_term(const LgRes& r, int v, u32 xb, bool pcol, bool dense, const u64* spc) {
  const u64 P = pcol ? lg_p_col(r.row, r.c, v, xb, spc, r.tab) : lg_p_of(r.row, r.c, v, xb, r.tab);
  return dense ? dy_residual(P, r.qcr[v], r.T)
               : (r.bonus ? dy_from64(P)
                          : dy_make128(P >> (64 - DY_TOTAL_BITS), P << DY_TOTAL_BITS));
}

/* lg_res_term out of line for the passes over 16-bit logits, as lg_hist_other_call is; r
 * is the block's one copy in shared memory. */
static __device__ __noinline__ dy_u128 lg_res_term_call(const LgRes& r, int v, u32 xb, bool pcol,
                                                        bool dense, const u64* spc) {
  return lg_res_term(r, v, xb, pcol, dense, spc);
}

/* The offsets a < n of the float32 bits held in bits[] whose dc_fkey is at least low, in
 * ascending order, into ord[0..count) when count <= cap: returns count, else -1 (ord
 * untouched).  A warp lists a contiguous segment 32 offsets at a time (ballots), after the
 * block's count per warp.  Every thread of the block calls it. */
DC_FN int lg_list_at_or_above(const u32* bits, int n, u32 low, u16* ord, int cap) {
  __shared__ int wcnt[32];
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int seg = (n + nw - 1) / nw, s0 = min(n, wid * seg), s1 = min(n, s0 + seg);
  int c = 0;
  for (int a0 = s0; a0 < s1; a0 += 32) {
    const int a = a0 + lane;
    c += __popc(__ballot_sync(0xffffffffu, a < s1 && dc_fkey(bits[a]) >= low));
  }
  if (lane == 0) wcnt[wid] = c;
  __syncthreads();
  int base = 0, tot = 0;
  for (int w = 0; w < nw; ++w) { base += w < wid ? wcnt[w] : 0; tot += wcnt[w]; }
  if (tot <= cap) {
    for (int a0 = s0; a0 < s1; a0 += 32) {
      const int a = a0 + lane;
      const bool in = a < s1 && dc_fkey(bits[a]) >= low;
      const unsigned bal = __ballot_sync(0xffffffffu, in);
      if (in) ord[base + __popc(bal & ((1u << lane) - 1u))] = (u16)a;
      base += __popc(bal);
    }
  }
  __syncthreads();
  return tot <= cap ? tot : -1;
}

extern "C" __global__ void __launch_bounds__(256, 3) logits_residual(
    const void* x, int dt, const double* temp, const i64* topk, const u32* topp,
    const u32* minp, const unsigned char* g, const int* nd, int B, int k, int V, int nrt,
    int rt, const int* draft, const u32* qc, const int* qi, int W, const void* kseed,
    const void* kgen, const void* krnd, const void* kpos, int kfmt, const u64* rec,
    const u64* vtab, const int* res_row, u64* rpart, u32* rcnt, int* accepted, int* tokens,
    int* status, u64* rl_w, u32* rl_id, u32* rl_n) {
  __shared__ DcShared sh;
  __shared__ int is_last, snv, stile, sok;
  __shared__ dy_u128 sx;
  __shared__ uint64_t stab[4][256];
  /* the row's P column (lg_load_pcol) in the tile pass; in the request's last block
   * the drawn tile's logits as float32 bits (a tile of at most LG_RTILE tokens) */
  __shared__ union { u64 pcol[LG_TE]; u32 bits[LG_RTILE]; } sb;
  u64* const spc = sb.pcol;
  const int tile = blockIdx.x, b = dc_grid_row(), tid = threadIdx.x;
  if (b >= B) return;
  const int i = res_row[b];
  if (i < 0) return;
  const LgReq q = lg_req(temp, topk, topp, minp, g, nd, b, k);
  const u64* rc = rec + ((i64)b * (k + 1) + i) * LG_REC;
  LgRes r;
  r.row.x = x; r.row.dt = dt; r.row.off = ((i64)b * (k + 1) + i) * V; r.row.temp = q.temp;
  r.row.greedy = 0; r.row.tab = vtab + ((i64)b * (k + 1) + i) * LG_TABW;
  r.row.e0 = (u32)rc[LG_WIN];
  r.c = lg_cut_of(rc); r.T = rc[LG_T];
  /* a cut row: only tokens at or above r.low can have P > 0, and they are few (their
   * weights from global memory); otherwise the exponential's table and the row's P
   * column in shared memory */
  r.low = lg_low_key(r.row, r.c, V);
  const bool pcol = r.low == 0;
  r.tab = pcol ? lg_load_table(stab) : LG_GTAB;
  r.bonus = i == k || i == q.n; r.qcr = 0; r.qir = 0; r.d = -1; r.nv = 0;
  if (!r.bonus) {
    r.d = draft[(i64)b * k + i];
    if (qc) {
      r.qcr = qc + ((i64)b * k + i) * (qi ? W : V);
      r.qir = qi ? qi + ((i64)b * k + i) * W : 0;
    }
    if (tid == 0) {
      int nv = W;
      if (r.qir) { int a = 0, z = W; while (a < z) { int m = (a + z) >> 1; if (r.qir[m] >= 0) a = m + 1; else z = m; } nv = a; }
      snv = nv;
    }
    __syncthreads();
    r.nv = snv;
  }
  /* the out-of-line calls read r from one copy in shared memory (every field is the
   * block's): a reference to a per-thread copy would store it to each thread's stack */
  __shared__ LgRes sr;
  if (tid == 0) sr = r;
  __syncthreads();
  const int lo = tile * rt, hi = min(V, lo + rt);
  const bool dense = !r.bonus && r.qcr && !r.qir;
  if (pcol) lg_load_pcol(r.row, r.c, spc);
  dy_u128 s = dy_make128(0, 0);
  if (tid == 0) rl_n[(i64)b * nrt + tile] = LG_RL_NONE;  /* no kept list, unless below */
  /* a token below r.low has P = 0: no residual, no bonus mass */
  if (!pcol && hi - lo <= LG_RTILE) {
    /* a cut row: the tokens at or above r.low (few, scattered over the tile) are listed
     * first, by their offsets in the tile (sb is free: the P column is only for a row
     * without a cut), then their terms are computed by the block's threads together, so
     * that no warp runs the term one lane at a time; the sum is the same integer */
    u16* const lst = (u16*)sb.bits;
    __shared__ u32 s_nl;
    if (tid == 0) s_nl = 0;
    __syncthreads();
    lg_tile(r.row, lo, hi, [&](int v, u32 xb) {
      if (dc_fkey(xb) >= r.low) lst[atomicAdd(&s_nl, 1u)] = (u16)(v - lo);
    });
    __syncthreads();
    const int nl = (int)s_nl;
    /* on a dense q row and the bonus row a listed token's term is its draw weight: the
     * tile keeps up to LG_RL of them, (id, weight) in list order, for its last block */
    const bool keep = (dense || r.bonus) && nl <= LG_RL;
    const i64 rl = ((i64)b * nrt + tile) * LG_RL;
    for (int j = tid; j < nl; j += blockDim.x) {
      const int v = lo + lst[j];
      const dy_u128 t = lg_res_term_call(sr, v, lg_bits(r.row, v), false, dense, spc);
      s = dy_add128(s, t);
      if (keep) { rl_id[rl + j] = (u32)v; rl_w[2 * (rl + j)] = t.lo; rl_w[2 * (rl + j) + 1] = t.hi; }
    }
    if (tid == 0 && keep) rl_n[(i64)b * nrt + tile] = (u32)nl;
  } else if (dt == 0) {  /* float32: one loop, the token's work inline */
    lg_tile(r.row, lo, hi, [&](int v, u32 xb) {
      if (dc_fkey(xb) >= r.low) s = dy_add128(s, lg_res_term(r, v, xb, pcol, dense, spc));
    });
  } else {
    lg_tile(r.row, lo, hi, [&](int v, u32 xb) {
      if (dc_fkey(xb) >= r.low) s = dy_add128(s, lg_res_term_call(sr, v, xb, pcol, dense, spc));
    });
  }
  if (!r.bonus && !dense) {  /* support corrections: R = residual instead of P * 2**24 */
    if (!r.qcr) {
      if (tid == 0 && r.d >= lo && r.d < hi) {
        const u64 P = lg_p(r.row, r.c, r.d, r.tab);
        s = dy_add128(dy_sub128(s, dy_make128(P >> (64 - DY_TOTAL_BITS), P << DY_TOTAL_BITS)),
                      dy_residual(P, DY_TOTAL, r.T));
      }
    } else {
      for (int j = tid; j < r.nv; j += 256) {
        const int id = r.qir[j];
        if (id >= lo && id < hi) {
          const u64 P = lg_p(r.row, r.c, id, r.tab);
          s = dy_add128(dy_sub128(s, dy_make128(P >> (64 - DY_TOTAL_BITS), P << DY_TOTAL_BITS)),
                        dy_residual(P, r.qcr[j], r.T));
        }
      }
    }
  }
  s = block_sum128(s, sh);
  if (tid == 0) { rpart[2 * ((i64)b * nrt + tile)] = s.lo; rpart[2 * ((i64)b * nrt + tile) + 1] = s.hi; }
  if (!dc_elect_last(&rcnt[b], (u32)nrt, &is_last)) return;
  if (tid < 32) {  /* warp 0: the tile sums in chunks of consecutive tiles per lane */
    const int lane = tid;
    const u64* rp = rpart + 2 * (i64)b * nrt;
    const int chunk = (nrt + 31) / 32, a0 = min(nrt, lane * chunk), a1 = min(nrt, a0 + chunk);
    dy_u128 own = dy_make128(0, 0);
    for (int t2 = a0; t2 < a1; ++t2) own = dy_add128(own, dy_make128(__ldcg(&rp[2 * t2 + 1]), __ldcg(&rp[2 * t2])));
    dy_u128 inc = own;
    for (int o = 1; o < 32; o <<= 1) {
      const dy_u128 u = dy_make128(__shfl_up_sync(0xffffffffu, inc.hi, o), __shfl_up_sync(0xffffffffu, inc.lo, o));
      if (lane >= o) inc = dy_add128(inc, u);
    }
    const dy_u128 tot = dy_make128(__shfl_sync(0xffffffffu, inc.hi, 31), __shfl_sync(0xffffffffu, inc.lo, 31));
    int ok = 0;
    dy_u128 xx = dy_make128(0, 0);
    if (lane == 0) {
      const DcKey key = load_key(kseed, kgen, krnd, kpos, kfmt, b);
      u32 idx = 0;
      ok = !dy_is_zero128(tot) &&
           dy_uniform_below_u128(tot, key.seed, key.gen, key.rnd, key.pos + i, DY_DOMAIN_CORRECTION,
                                 &idx, &xx) == DY_ST_OK;
      sok = 0; stile = -1;
    }
    ok = __shfl_sync(0xffffffffu, ok, 0);
    xx = dy_make128(__shfl_sync(0xffffffffu, xx.hi, 0), __shfl_sync(0xffffffffu, xx.lo, 0));
    __syncwarp();
    if (ok) {
      const unsigned bal = __ballot_sync(0xffffffffu, dy_lt128(xx, inc));
      const int L = bal ? __ffs(bal) - 1 : -1;
      if (lane == L) {
        dy_u128 cum = dy_sub128(inc, own);
        for (int t2 = a0; t2 < a1; ++t2) {
          const dy_u128 nc = dy_add128(cum, dy_make128(__ldcg(&rp[2 * t2 + 1]), __ldcg(&rp[2 * t2])));
          if (dy_lt128(xx, nc)) { stile = t2; sx = dy_sub128(xx, cum); sok = 1; break; }
          cum = nc;
        }
      }
    }
  }
  __syncthreads();
  DY_TL_MARK(0);  /* the tile drawn */
  int j = -1;
  /* the drawn tile's kept list (the pass's listed tokens with their weights): the token
   * over it in ascending id, as block_draw over the tile's list below would draw it */
  __shared__ u32 s_rln;
  if (tid == 0) s_rln = sok ? __ldcg(&rl_n[(i64)b * nrt + stile]) : LG_RL_NONE;
  __syncthreads();
  const u32 rln = s_rln;
  if (sok && rln <= LG_RL) {
    u32* const kid = sb.bits;                 /* ids, then ranks by id */
    dy_u128* const kw = (dy_u128*)(sb.bits + 2 * LG_RL);  /* weights in id order */
    const i64 rl = ((i64)b * nrt + stile) * LG_RL;
    u32 myid = 0;
    dy_u128 myw = dy_make128(0, 0);
    if (tid < (int)rln) {
      myid = __ldcg(&rl_id[rl + tid]);
      myw = dy_make128(__ldcg(&rl_w[2 * (rl + tid) + 1]), __ldcg(&rl_w[2 * (rl + tid)]));
      kid[tid] = myid;
    }
    __syncthreads();
    if (tid < (int)rln) {  /* the ids are distinct: a rank a place */
      int rk = 0;
      for (int a = 0; a < (int)rln; ++a) rk += kid[a] < myid;
      kw[rk] = myw;
      kid[LG_RL + rk] = myid;
    }
    __syncthreads();
    const int a = block_draw([&](int q2) { return kw[q2]; }, (int)rln,
                             [&](dy_u128, dy_u128*) { return false; }, sh, 0, false, sx);
    j = a >= 0 ? (int)kid[LG_RL + a] : -1;
  } else if (sok) {
    /* the drawn tile's logits loaded once into shared memory (every thread's loads in
     * flight together), so that the search's passes over it wait on no global load;
     * a tile longer than LG_RTILE reads them from global memory */
    const int l2 = stile * rt, h2 = min(V, l2 + rt);
    const bool held = h2 - l2 <= LG_RTILE;
    if (held) lg_tile(r.row, l2, h2, [&](int v, u32 xb) { sb.bits[v - l2] = xb; });
    __syncthreads();
    DY_TL_MARK(1);  /* the tile's logits in shared memory */
    /* a cut row: the draw runs over the list of the tile's tokens at or above r.low in
     * ascending id (the others have R = 0, and a draw never stops at a token of weight 0:
     * the same token), the list in stab (free: the exponential's table is only for a row
     * without a cut), when it fits */
    u16* const ord = (u16*)stab;
    constexpr int ORD_CAP = (int)(sizeof(stab) / sizeof(u16));
    int nl = -1;
    if (held && !pcol) nl = lg_list_at_or_above(sb.bits, h2 - l2, r.low, ord, ORD_CAP);
    const bool listed = nl >= 0;
    j = block_draw([&](int a) {
                     if (listed) return lg_res_weight_call(sr, l2 + ord[a], sb.bits[ord[a]]);
                     return lg_res_weight(sr, a, held ? sb.bits[a - l2] : lg_bits(r.row, a));
                   }, listed ? nl : h2, [&](dy_u128, dy_u128*) { return false; }, sh,
                   listed ? 0 : l2, false, sx);
    if (listed && j >= 0) j = l2 + ord[j];
  }
  DY_TL_MARK(2);  /* the token drawn */
  if (tid == 0) {
    if (j < 0) {
      status[b] = DY_ST_RNG_EXHAUSTED; accepted[b] = 0;
      for (int a = 0; a <= k; ++a) tokens[(i64)b * (k + 1) + a] = -1;
    } else {
      tokens[(i64)b * (k + 1) + i] = j;
    }
  }
}
