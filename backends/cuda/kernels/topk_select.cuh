#define TILE 2048
#define TPT (TILE / 256)

/* ------------------------------------------------------------------------
 * Sparse (top-k) allocate / propose: one launch, grid (ntiles, B).
 * Each block ranks a tile of TILE ids, keeps its Kc = min(K, TILE) best
 * (key desc, id asc) as candidates, then the last block of the row (atomic
 * counter after a release fence, dc_elect_last) selects the K best of all candidates,
 * computes weights, allocates 2**24 tickets and draws.  No block waits for
 * another. */
extern "C" __global__ void __launch_bounds__(256) topk_select(
    const void* x, int xdt, const void* bias, int bdt, int bias_rows, const double* temp,
    int logits, int greedy_ok, int V, int K, int Kc, int ntiles, int policy, int do_draw, int fast,
    const void* kseed, const void* kgen, const void* krnd, const void* kpos, int kfmt,
    u64* cand_key, int* cand_id, u64* tile_bad, u32* counters,
    int* sup_id, u64* sup_key, u64* sup_rem, u32* sup_cnt,
    int* tokens, u32* counts, int* ids, int* status, int nrows,
    int filt, const i64* ftopk, const u32* ftopp, const u32* fminp) {
  __shared__ DcShared sh;
  __shared__ u64 tk[TILE];
  __shared__ DcTopk tp;
  __shared__ u64 okk[DC_KSMALL];
  __shared__ int oki[DC_KSMALL];
  __shared__ u64 sbad;
  __shared__ int is_last;
  __shared__ int tki[TILE];  /* fast == 2: candidate ids staged in the last block */
  __shared__ u64 s_key[DC_KSMALL], s_rem[DC_KSMALL];
  __shared__ int s_id[DC_KSMALL];
  __shared__ u32 s_cnt[DC_KSMALL];
  const int row = dc_grid_row(), tile = blockIdx.x, tid = threadIdx.x, nt = blockDim.x;
  if (row >= nrows) return;
  bool greedy; double T = row_temp(temp, row, greedy_ok, &greedy);
  const i64 xoff = (i64)row * V;
  const i64 boff = bias_rows > 1 ? xoff : 0;
  if (tid == 0) sbad = NONE_BAD;
  __syncthreads();
  const int base = tile * TILE;
  u64 mybad = NONE_BAD;
  /* loads first (launched with exactly 256 threads), then the keys */
  float xf[TPT];
#pragma unroll
  for (int q = 0; q < TPT; ++q) { int v = base + tid + q * 256; xf[q] = v < V ? load_f(x, xdt, xoff + v) : 0.0f; }
#pragma unroll
  for (int q = 0; q < TPT; ++q) {
    int j = tid + q * 256, v = base + j;
    u64 key = 0;
    if (v < V) {
      int bad;
      key = rank_key(xf[q], bias, bdt, boff + v, T, logits, &bad);
      if (bad && mybad == NONE_BAD) mybad = ((u64)v << 8) | (u64)bad;
    }
    tk[j] = key;
  }
  if (mybad != NONE_BAD) atomicMin(&sbad, mybad);
  __syncthreads();
  if (fast) {  /* Kc <= 64: candidates in (key desc, id asc) order */
    u64* ck = cand_key + ((i64)row * ntiles + tile) * Kc;
    int* ci = cand_id + ((i64)row * ntiles + tile) * Kc;
    block_topk_small([&](int i) { return tk[i]; }, [&](int i) { return base + i; }, TILE, Kc,
                     [&](int r, u64 k, int id) { ck[r] = k; ci[r] = id; }, tp, sh);
  } else {
    DcSel s = block_select([&](int i) { return tk[i]; }, TILE, Kc, sh);
    u64* ck = cand_key + ((i64)row * ntiles + tile) * Kc;
    int* ci = cand_id + ((i64)row * ntiles + tile) * Kc;
    block_compact([&](int i) { return sel_has(s, tk[i], i); },
                  [&](int i, int r) { ck[r] = tk[i]; ci[r] = base + i; }, TILE, sh);
  }
  if (tid == 0) tile_bad[(i64)row * ntiles + tile] = sbad;
  if (!dc_elect_last(&counters[row], (u32)ntiles, &is_last)) return;

  /* ---- last block of the row: final reduction ---- */
  const int N = ntiles * Kc;
  const u64* ck = cand_key + (i64)row * N;
  const int* ci = cand_id + (i64)row * N;
  /* fast == 2 (N <= TILE): all candidates staged in shared memory with one
   * batch of loads; the max key and the argmax are the first of the K best */
  const bool staged = fast == 2 && N <= TILE;
  u64 b = NONE_BAD;
  if (staged) {
    u64 kb[TPT]; int ib[TPT];
#pragma unroll
    for (int q = 0; q < TPT; ++q) { int i = tid + q * 256; if (i < N) { kb[q] = __ldcg(&ck[i]); ib[q] = __ldcg(&ci[i]); } }
    for (int t = tid; t < ntiles; t += nt) { u64 w = __ldcg(&tile_bad[(i64)row * ntiles + t]); b = w < b ? w : b; }
#pragma unroll
    for (int q = 0; q < TPT; ++q) { int i = tid + q * 256; if (i < N) { tk[i] = kb[q]; tki[i] = ib[q]; } }
  } else {
    for (int t = tid; t < ntiles; t += nt) { u64 w = __ldcg(&tile_bad[(i64)row * ntiles + t]); b = w < b ? w : b; }
  }
  b = block_reduce64(b, 2, sh);
  const int W = K;
  /* filt: the row's top_k (ftopk, or K), top_p and min_p (float32 bits; null: 1 and
   * 0) are checked before the row, in the order of dy_allocate_filtered_row */
  const DcFilt f = dc_filt(filt, ftopk, ftopp, fminp, row, K);
  const int pst = dc_filt_status(f);
  if (pst) { fail_sparse(row, W, pst, do_draw ? tokens : 0, counts, ids, status); return; }
  if (b != NONE_BAD) { fail_sparse(row, W, (int)(b & 0xFF), do_draw ? tokens : 0, counts, ids, status); return; }
  u64 mk = 0;
  int argmax;
  if (staged) {
    block_topk_small([&](int i) { return tk[i]; }, [&](int i) { return tki[i]; }, N, K,
                     [&](int r, u64 k, int id) { okk[r] = k; oki[r] = id; }, tp, sh);
    mk = okk[0]; argmax = oki[0];
  } else {
    for (int i = tid; i < N; i += nt) { u64 k = __ldcg(&ck[i]); mk = k > mk ? k : mk; }
    mk = block_reduce64(mk, 1, sh);
  }
  if ((logits && mk == DC_KEY_NEG_INF) || (!logits && mk == 1)) {
    fail_sparse(row, W, DY_ST_X_ZERO_MASS, do_draw ? tokens : 0, counts, ids, status); return;
  }
  if (!staged) {
    u64 am = ~0ull;
    for (int i = tid; i < N; i += nt) if (__ldcg(&ck[i]) == mk) { u64 id = (u64)__ldcg(&ci[i]); am = id < am ? id : am; }
    argmax = (int)block_reduce64(am, 2, sh);
  }
  u32* crow = counts + (i64)row * W;
  int* irow = ids + (i64)row * W;
  if (greedy) {
    for (int j = tid; j < W; j += nt) { crow[j] = j ? 0u : DY_TOTAL; irow[j] = j ? -1 : argmax; }
    if (tid == 0) { status[row] = 0; if (do_draw) tokens[row] = argmax; }
    return;
  }
  int* sid = staged ? s_id : sup_id + (i64)row * K;
  u64* skey = staged ? s_key : sup_key + (i64)row * K;
  u64* srem = staged ? s_rem : sup_rem + (i64)row * K;
  u32* scnt = staged ? s_cnt : sup_cnt + (i64)row * K;
  if (fast) {
    /* the K best by (key desc, id asc), then stored in ascending id order (as
     * the radix path's compaction in candidate order leaves them) */
    if (!staged)
      block_topk_small([&](int i) { return __ldcg(&ck[i]); }, [&](int i) { return __ldcg(&ci[i]); }, N, K,
                       [&](int r, u64 k, int id) { okk[r] = k; oki[r] = id; }, tp, sh);
    for (int j = tid; j < K; j += nt) {
      const int idj = oki[j];
      int pos = 0;
      for (int i = 0; i < K; ++i) pos += oki[i] < idj;
      skey[pos] = okk[j]; sid[pos] = idj;
    }
    __syncthreads();
  } else {
    DcSel s = block_select([&](int i) { return __ldcg(&ck[i]); }, N, K, sh);
    block_compact([&](int i) { return sel_has(s, __ldcg(&ck[i]), i); },
                  [&](int i, int r) { skey[r] = __ldcg(&ck[i]); sid[r] = __ldcg(&ci[i]); }, N, sh);
  }
  /* filt: the kept prefix of the support's ranking (key desc, id asc; the support is
   * in id order): each entry's rank, the weights in rank order, dy_filter_prefix */
  int keep = K;
  if (f.on) {
    __shared__ int s_keep;
    for (int j = tid; j < K; j += nt) {
      const u64 kj = skey[j];
      int rank = 0;
      for (int i = 0; i < K; ++i) { const u64 ki = skey[i]; rank += ki > kj || (ki == kj && i < j); }
      srem[rank] = weight_of_key(kj, mk, logits);
      scnt[j] = (u32)rank;
    }
    __syncthreads();
    if (tid == 0)
      s_keep = (int)dy_filter_prefix((const uint64_t*)srem, (uint32_t)K, f.topk, f.topp, f.minp);
    __syncthreads();
    keep = s_keep;
  }
  u64 S = 0;
  for (int j = tid; j < K; j += nt) {
    const u64 w = !f.on || (int)scnt[j] < keep ? weight_of_key(skey[j], mk, logits) : 0;
    srem[j] = w; S += w;
  }
  S = block_reduce64(S, 0, sh);
  u64 sb = 0;
  for (int j = tid; j < K; j += nt) {
    u64 m = (u64)DY_TOTAL * srem[j];
    u64 q = m / S;
    scnt[j] = (u32)q; srem[j] = m - q * S; sb += q;
  }
  sb = block_reduce64(sb, 0, sh);
  i64 remaining = (i64)DY_TOTAL - (i64)sb;
  if (remaining < 0 || remaining >= (i64)DY_TOTAL) {
    fail_sparse(row, W, DY_ST_ALLOC_INCONSISTENT, do_draw ? tokens : 0, counts, ids, status); return;
  }
  if (remaining > 0) {
    if (policy == 0 && fast) {
      /* the `remaining` largest remainders, ties lowest position: rank counting */
      for (int j = tid; j < K; j += nt) {
        const u64 rj = srem[j];
        int rank = 0;
        for (int i = 0; i < K; ++i) { const u64 ri = srem[i]; rank += ri > rj || (ri == rj && i < j); }
        if (rank < (int)remaining) scnt[j] += 1;
      }
    } else if (policy == 0) {
      DcSel s = block_select([&](int i) { return srem[i]; }, K, (int)remaining, sh);
      for (int j = tid; j < K; j += nt) if (sel_has(s, srem[j], j)) scnt[j] += 1;
    } else {
      for (int j = tid; j < K; j += nt) if (sid[j] == argmax) scnt[j] += (u32)remaining;
    }
  }
  __syncthreads();
  int nz = block_compact([&](int i) { return scnt[i] != 0; },
                         [&](int i, int r) { crow[r] = scnt[i]; irow[r] = sid[i]; }, K, sh);
  for (int j = nz + tid; j < W; j += nt) { crow[j] = 0; irow[j] = -1; }
  __syncthreads();
  if (do_draw) {
    DcKey key = load_key(kseed, kgen, krnd, kpos, kfmt, row);
    u32 r = key_ticket(key);
    int j = block_draw([&](int i) { return dy_from64(scnt[i]); }, K,
                       [&](dy_u128 tot, dy_u128* xo) { *xo = dy_from64(r); return true; }, sh);
    if (tid == 0) tokens[row] = j >= 0 ? sid[j] : -1;
  }
  if (tid == 0) status[row] = 0;
}
