/* logits_hist and logits_hist_groups (the pipeline and its records: logits_common.cuh):
 * every token's weight and each row's top-k / top-p cuts, or the buckets that hold them
 * for logits_resolve. */

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
  /* the bucket's values in ranking order: thread tid looks at ranks 16 tid .. + 15, which
   * are 16 consecutive table slots from s0 (descending ones in the positive half,
   * ascending in the negative), their buckets read as two 16-byte words (a row's table
   * is 16-byte aligned: LG_TABW u64 a row of 16-byte aligned scratch) */
  constexpr int per = LG_TE / 256;
  static_assert(per == 16 && (2 * LG_TE * 8) % 16 == 0 && (LG_TABW * 8) % 16 == 0,
                "a thread's buckets are two aligned 16-byte words");
  const bool pos = tid * per < LG_TE / 2;
  const int s0 = pos ? LG_TE / 2 - per * (tid + 1) : tid * per;
  const uint4* tb4 = (const uint4*)(lg_tab_bucket(row.tab) + s0);
  const uint4 b0 = __ldg(&tb4[0]), b1 = __ldg(&tb4[1]);
  const u32 bw[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
  u32 mine = 0;  /* bit i: rank 16 tid + i lies in bucket j */
#pragma unroll
  for (int i = 0; i < per; ++i)  /* slot s0 + i, rank 16 tid + (pos ? 15 - i : i) */
    mine |= (u32)(((bw[i >> 1] >> (16 * (i & 1))) & 0xFFFFu) == (u32)j) << (pos ? per - 1 - i : i);
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
        const u32 inc = dc_warp_scan(x, lane);
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
  __shared__ __align__(16) u32 sc[LG_NB];
  __shared__ __align__(16) u64 sm[LG_NB];
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
