/* logits_residual of verify(..., logits=True) (the pipeline and its records:
 * logits_common.cuh).  R_v = dy_residual(P_v, q_v, T) of the rejected row (the bonus row:
 * P_v), P_v from the logits.  Tile sums in 128 bits (sparse q / point mass: every P_v,
 * then the support entries of the tile corrected); the request's last block draws X
 * below the total (domain CORRECTION at the row's position), the tile holding X, then
 * the token in it, with the tile's logits held in shared memory. */
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

/* The shared state of a logits_residual / logits_one_launch block. */
struct LgResShared {
  DcShared sh;
  int is_last, snv, stile, sok;
  dy_u128 sx;
  uint64_t stab[4][256];
  /* the row's P column (lg_load_pcol) in the tile pass; in the request's last block
   * the drawn tile's logits as float32 bits (a tile of at most LG_RTILE tokens) */
  union { u64 pcol[LG_TE]; u32 bits[LG_RTILE]; } sb;
  LgRes sr;  /* the block's one copy of its row, for the out-of-line calls */
  u32 nl, rln;
};

/* Row i (the residual row of a rejected draft i < n, the bonus row i = n) of request b
 * (parameters q) for the block: its record, cut, q row, support size and the bound
 * r.low; the exponential's table in S.stab where every token computes its weight.
 * Every thread of the block calls it; the copy in S.sr is set when it returns. */
DC_FN LgRes lg_res_row(LgResShared& S, const void* x, int dt, const LgReq& q, int b, int i,
                       int k, int V, const int* draft, const u32* qc, const int* qi, int W,
                       const u64* rec, const u64* vtab) {
  const int tid = threadIdx.x;
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
  r.tab = r.low == 0 ? lg_load_table(S.stab) : LG_GTAB;
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
      S.snv = nv;
    }
    __syncthreads();
    r.nv = S.snv;
  }
  /* the out-of-line calls read r from one copy in shared memory (every field is the
   * block's): a reference to a per-thread copy would store it to each thread's stack */
  __syncthreads();  /* every thread is past the previous row's copy */
  if (tid == 0) S.sr = r;
  __syncthreads();
  return r;
}

/* The tile pass of row r over its tokens [lo, hi): the tile's sum into rpart[2 slot ..]
 * (128 bits) and, on a cut row, its kept list (rl_*[slot LG_RL ..], rl_n[slot]).  Every
 * thread of the block calls it. */
DC_FN void lg_res_pass(LgResShared& S, const LgRes& r, int lo, int hi, i64 slot, u64* rpart,
                       u64* rl_w, u32* rl_id, u32* rl_n) {
  const int tid = threadIdx.x;
  const bool pcol = r.low == 0;
  const bool dense = !r.bonus && r.qcr && !r.qir;
  u64* const spc = S.sb.pcol;
  if (pcol) lg_load_pcol(r.row, r.c, spc);
  dy_u128 s = dy_make128(0, 0);
  if (tid == 0) rl_n[slot] = LG_RL_NONE;  /* no kept list, unless below */
  /* a token below r.low has P = 0: no residual, no bonus mass */
  if (!pcol && hi - lo <= LG_RTILE) {
    /* a cut row: the tokens at or above r.low (few, scattered over the tile) are listed
     * first, by their offsets in the tile (sb is free: the P column is only for a row
     * without a cut), then their terms are computed by the block's threads together, so
     * that no warp runs the term one lane at a time; the sum is the same integer */
    u16* const lst = (u16*)S.sb.bits;
    if (tid == 0) S.nl = 0;
    __syncthreads();
    lg_tile(r.row, lo, hi, [&](int v, u32 xb) {
      if (dc_fkey(xb) >= r.low) lst[atomicAdd(&S.nl, 1u)] = (u16)(v - lo);
    });
    __syncthreads();
    const int nl = (int)S.nl;
    /* on a dense q row and the bonus row a listed token's term is its draw weight: the
     * tile keeps up to LG_RL of them, (id, weight) in list order, for its last block */
    const bool keep = (dense || r.bonus) && nl <= LG_RL;
    const i64 rl = slot * LG_RL;
    for (int j = tid; j < nl; j += blockDim.x) {
      const int v = lo + lst[j];
      const dy_u128 t = lg_res_term_call(S.sr, v, lg_bits(r.row, v), false, dense, spc);
      s = dy_add128(s, t);
      if (keep) { rl_id[rl + j] = (u32)v; rl_w[2 * (rl + j)] = t.lo; rl_w[2 * (rl + j) + 1] = t.hi; }
    }
    if (tid == 0 && keep) rl_n[slot] = (u32)nl;
  } else if (r.row.dt == 0) {  /* float32: one loop, the token's work inline */
    lg_tile(r.row, lo, hi, [&](int v, u32 xb) {
      if (dc_fkey(xb) >= r.low) s = dy_add128(s, lg_res_term(r, v, xb, pcol, dense, spc));
    });
  } else {
    lg_tile(r.row, lo, hi, [&](int v, u32 xb) {
      if (dc_fkey(xb) >= r.low) s = dy_add128(s, lg_res_term_call(S.sr, v, xb, pcol, dense, spc));
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
  s = block_sum128(s, S.sh);
  if (tid == 0) { rpart[2 * slot] = s.lo; rpart[2 * slot + 1] = s.hi; }
}

/* The request's last block: X below the row's total (domain CORRECTION at position i of
 * request b), the tile holding X from the row's nrt tile sums (rp) and kept lists (slots
 * from s0), then the token in it: tokens[b (k + 1) + i], or the request failed closed
 * with RNG_EXHAUSTED.  Every thread of the block calls it. */
DC_FN void lg_res_draw(LgResShared& S, const LgRes& r, const u64* rp, i64 s0, int nrt, int rt,
                       int V, const u64* rl_w, const u32* rl_id, const u32* rl_n,
                       const void* kseed, const void* kgen, const void* krnd, const void* kpos,
                       int kfmt, int b, int i, int k, int* accepted, int* tokens, int* status) {
  const int tid = threadIdx.x;
  const bool pcol = r.low == 0;
  if (tid < 32)  /* warp 0: the tile holding X */
    vr_draw_tile(rp, nrt, kseed, kgen, krnd, kpos, kfmt, b, i, &S.stile, &S.sx, &S.sok);
  __syncthreads();
  DY_TL_MARK(0);  /* the tile drawn */
  int j = -1;
  /* the drawn tile's kept list (the pass's listed tokens with their weights): the token
   * over it in ascending id, as block_draw over the tile's list below would draw it */
  if (tid == 0) S.rln = S.sok ? __ldcg(&rl_n[s0 + S.stile]) : LG_RL_NONE;
  __syncthreads();
  const u32 rln = S.rln;
  if (S.sok && rln <= LG_RL) {
    u32* const kid = S.sb.bits;                 /* ids, then ranks by id */
    dy_u128* const kw = (dy_u128*)(S.sb.bits + 2 * LG_RL);  /* weights in id order */
    const i64 rl = (s0 + S.stile) * LG_RL;
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
                             [&](dy_u128, dy_u128*) { return false; }, S.sh, 0, false, S.sx);
    j = a >= 0 ? (int)kid[LG_RL + a] : -1;
  } else if (S.sok) {
    /* the drawn tile's logits loaded once into shared memory (every thread's loads in
     * flight together), so that the search's passes over it wait on no global load;
     * a tile longer than LG_RTILE reads them from global memory */
    const int l2 = S.stile * rt, h2 = min(V, l2 + rt);
    const bool held = h2 - l2 <= LG_RTILE;
    if (held) lg_tile(r.row, l2, h2, [&](int v, u32 xb) { S.sb.bits[v - l2] = xb; });
    __syncthreads();
    DY_TL_MARK(1);  /* the tile's logits in shared memory */
    /* a cut row: the draw runs over the list of the tile's tokens at or above r.low in
     * ascending id (the others have R = 0, and a draw never stops at a token of weight 0:
     * the same token), the list in stab (free: the exponential's table is only for a row
     * without a cut), when it fits */
    u16* const ord = (u16*)S.stab;
    constexpr int ORD_CAP = (int)(sizeof(LgResShared::stab) / sizeof(u16));
    int nl = -1;
    if (held && !pcol) nl = lg_list_at_or_above(S.sb.bits, h2 - l2, r.low, ord, ORD_CAP);
    const bool listed = nl >= 0;
    j = block_draw([&](int a) {
                     if (listed) return lg_res_weight_call(S.sr, l2 + ord[a], S.sb.bits[ord[a]]);
                     return lg_res_weight(S.sr, a, held ? S.sb.bits[a - l2] : lg_bits(r.row, a));
                   }, listed ? nl : h2, [&](dy_u128, dy_u128*) { return false; }, S.sh,
                   listed ? 0 : l2, false, S.sx);
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

extern "C" __global__ void __launch_bounds__(256, 3) logits_residual(
    const void* x, int dt, const double* temp, const i64* topk, const u32* topp,
    const u32* minp, const unsigned char* g, const int* nd, int B, int k, int V, int nrt,
    int rt, const int* draft, const u32* qc, const int* qi, int W, const void* kseed,
    const void* kgen, const void* krnd, const void* kpos, int kfmt, const u64* rec,
    const u64* vtab, const int* res_row, u64* rpart, u32* rcnt, int* accepted, int* tokens,
    int* status, u64* rl_w, u32* rl_id, u32* rl_n) {
  __shared__ LgResShared S;
  const int tile = blockIdx.x, b = dc_grid_row();
  if (b >= B) return;
  const int i = res_row[b];
  if (i < 0) return;
  const LgReq q = lg_req(temp, topk, topp, minp, g, nd, b, k);
  const LgRes r = lg_res_row(S, x, dt, q, b, i, k, V, draft, qc, qi, W, rec, vtab);
  lg_res_pass(S, r, tile * rt, min(V, tile * rt + rt), (i64)b * nrt + tile, rpart, rl_w, rl_id,
              rl_n);
  if (!dc_elect_last(&rcnt[b], (u32)nrt, &S.is_last)) return;
  lg_res_draw(S, r, rpart + 2 * (i64)b * nrt, (i64)b * nrt, nrt, rt, V, rl_w, rl_id, rl_n,
              kseed, kgen, krnd, kpos, kfmt, b, i, k, accepted, tokens, status);
}
