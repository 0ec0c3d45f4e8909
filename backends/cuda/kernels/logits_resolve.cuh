/* logits_resolve (the pipeline and its records: logits_common.cuh): the cuts logits_hist
 * left in a bucket, from the bucket's tokens sorted, or a radix select over the row. */

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
