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
 * The kernels' files: logits_common.cuh (this file: the records, tile reads, weights,
 * block scans and tile counts the passes share), logits_max.cuh, logits_hist.cuh,
 * logits_resolve.cuh (the target rows, shared with the filtered allocate / propose of
 * logits_filter.cuh), verify_logits_chain.cuh, verify_logits_residual.cuh.
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
  if (cnt && j0 + 8 <= lim && !((((size_t)(cnt + j0)) | ((size_t)(mass + j0))) & 15)) {
    /* the thread's 8 entries as 16-byte words (a quarter of the bank conflicts of 8
     * scalar loads at this stride, all loads issued before any sum) */
    const uint4 a = *(const uint4*)(cnt + j0), b = *(const uint4*)(cnt + j0 + 4);
    const ulonglong2* m2 = (const ulonglong2*)(mass + j0);
    const ulonglong2 x0 = m2[0], x1 = m2[1], x2 = m2[2], x3 = m2[3];
    *c = (u64)a.x + a.y + a.z + a.w + b.x + b.y + b.z + b.w;
    *m = x0.x + x0.y + x1.x + x1.y + x2.x + x2.y + x3.x + x3.y;
    return;
  }
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
