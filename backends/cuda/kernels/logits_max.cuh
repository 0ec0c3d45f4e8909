/* logits_max and logits_table (the pipeline and its records: logits_common.cuh): each
 * row's largest logit, record and value table, and over more than LG_TABLE_ROWS rows of
 * bfloat16 logits each sampled tile's counts per value. */

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
  const int r = dc_grid_row();
  if (r >= B * (k + 1) || B * (k + 1) > LG_TABLE_ROWS) return;
  const int b = r / (k + 1), i = r - b * (k + 1);
  const LgReq q = lg_req(temp, topk, topp, minp, g, nd, b, k);
  if (q.code || i > q.n) return;  /* block-uniform: logits_max wrote no record */
  const u64* rc = rec + (i64)r * LG_REC;
  const u32 e0 = (u32)rc[LG_WIN];
  if (e0 == LG_NOWIN) return;
  const LgRow row = {x, dt, (i64)r * V, q.temp, q.greedy, 0, LG_NOWIN};
  /* the exponential's table read where it lies (through the read-only cache): a block
   * computes 256 entries, too few to pay for its copy into shared memory (8 KiB a block,
   * LG_TE / 256 blocks a row) */
  const LgTab et = LG_GTAB;
  const int j = (int)blockIdx.x * (int)blockDim.x + (int)threadIdx.x;
  if (j < LG_TE)
    lg_table_entry(row, dy_key_value(rc[LG_MAXKEY]), rc[LG_MPW], e0, j, et,
                   tab + (i64)r * LG_TABW);
}
