/* The CuPy backend's kernels (NVRTC, --fmad=false).  See cupy_backend.py for
 * the launch structure and dyadic/reference/*.py for the specification. */
#include "dyadic_cuda.cuh"

#define TILE 2048
#define NONE_BAD 0xFFFFFFFFFFFFFFFFull

extern "C" __global__ void dc_philox(const u32* ctr, const u32* key, int rounds, int n, u32* out) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  u32 c[4] = {ctr[4 * i], ctr[4 * i + 1], ctr[4 * i + 2], ctr[4 * i + 3]};
  philox4x32(c, key[2 * i], key[2 * i + 1], rounds);
  for (int j = 0; j < 4; ++j) out[4 * i + j] = c[j];
}

struct RowIn {
  const void* x; int xdt; const void* bias; int bdt; int bias_rows;
  const double* temp; int logits; int greedy_ok; int V;
};

DC_FN double row_temp(const double* temp, int row, int greedy_ok, bool* greedy) {
  double t = temp[row];
  *greedy = greedy_ok && t == 0.0;
  return *greedy ? 1.0 : t;
}

DC_FN void fail_sparse(int row, int W, int code, int* tokens, u32* counts, int* ids, int* status) {
  for (int j = threadIdx.x; j < W; j += blockDim.x) { counts[(i64)row * W + j] = 0; ids[(i64)row * W + j] = -1; }
  if (threadIdx.x == 0) { status[row] = code; if (tokens) tokens[row] = -1; }
}

/* ------------------------------------------------------------------------
 * Sparse (top-k) allocate / propose: one launch, grid (ntiles, B).
 * Each block ranks a tile of TILE ids, keeps its Kc = min(K, TILE) best
 * (key desc, id asc) as candidates, then the last block of the row (atomic
 * counter after __threadfence) selects the K best of all candidates,
 * computes weights, allocates 2**24 tickets and draws.  No block waits for
 * another. */
extern "C" __global__ void __launch_bounds__(256) dc_topk(
    const void* x, int xdt, const void* bias, int bdt, int bias_rows, const double* temp,
    int logits, int greedy_ok, int V, int K, int Kc, int ntiles, int policy, int do_draw,
    const void* kseed, const void* kgen, const void* krnd, const void* kpos, int kfmt,
    u64* cand_key, int* cand_id, u64* tile_bad, u32* counters,
    int* sup_id, u64* sup_key, u64* sup_rem, u32* sup_cnt,
    int* tokens, u32* counts, int* ids, int* status) {
  __shared__ DcShared sh;
  __shared__ u64 tk[TILE];
  __shared__ u64 sbad;
  __shared__ int is_last;
  const int row = blockIdx.y, tile = blockIdx.x, tid = threadIdx.x, nt = blockDim.x;
  bool greedy; double T = row_temp(temp, row, greedy_ok, &greedy);
  const i64 xoff = (i64)row * V;
  const i64 boff = bias_rows > 1 ? xoff : 0;
  if (tid == 0) sbad = NONE_BAD;
  __syncthreads();
  const int base = tile * TILE;
  u64 mybad = NONE_BAD;
  for (int j = tid; j < TILE; j += nt) {
    int v = base + j;
    u64 key = 0;
    if (v < V) {
      int bad;
      key = rank_key(load_f(x, xdt, xoff + v), bias, bdt, boff + v, T, logits, &bad);
      if (bad && mybad == NONE_BAD) mybad = ((u64)v << 8) | (u64)bad;
    }
    tk[j] = key;
  }
  if (mybad != NONE_BAD) atomicMin(&sbad, mybad);
  __syncthreads();
  {
    DcSel s = block_select([&](int i) { return tk[i]; }, TILE, Kc, sh);
    u64* ck = cand_key + ((i64)row * ntiles + tile) * Kc;
    int* ci = cand_id + ((i64)row * ntiles + tile) * Kc;
    block_compact([&](int i) { return sel_has(s, tk[i], i); },
                  [&](int i, int r) { ck[r] = tk[i]; ci[r] = base + i; }, TILE, sh);
  }
  if (tid == 0) tile_bad[(i64)row * ntiles + tile] = sbad;
  __threadfence();
  __syncthreads();
  if (tid == 0) is_last = (atomicAdd(&counters[row], 1u) == (u32)ntiles - 1);
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  if (tid == 0) counters[row] = 0;

  /* ---- last block of the row: final reduction ---- */
  const int N = ntiles * Kc;
  const u64* ck = cand_key + (i64)row * N;
  const int* ci = cand_id + (i64)row * N;
  u64 b = NONE_BAD;
  for (int t = tid; t < ntiles; t += nt) { u64 w = __ldcg(&tile_bad[(i64)row * ntiles + t]); b = w < b ? w : b; }
  b = block_reduce64(b, 2, sh);
  const int W = K;
  if (b != NONE_BAD) { fail_sparse(row, W, (int)(b & 0xFF), do_draw ? tokens : 0, counts, ids, status); return; }
  u64 mk = 0;
  for (int i = tid; i < N; i += nt) { u64 k = __ldcg(&ck[i]); mk = k > mk ? k : mk; }
  mk = block_reduce64(mk, 1, sh);
  if ((logits && mk == DC_KEY_NEG_INF) || (!logits && mk == 1)) {
    fail_sparse(row, W, ST_X_ZERO_MASS, do_draw ? tokens : 0, counts, ids, status); return;
  }
  u64 am = ~0ull;
  for (int i = tid; i < N; i += nt) if (__ldcg(&ck[i]) == mk) { u64 id = (u64)__ldcg(&ci[i]); am = id < am ? id : am; }
  const int argmax = (int)block_reduce64(am, 2, sh);
  u32* crow = counts + (i64)row * W;
  int* irow = ids + (i64)row * W;
  if (greedy) {
    for (int j = tid; j < W; j += nt) { crow[j] = j ? 0u : DC_TOTAL; irow[j] = j ? -1 : argmax; }
    if (tid == 0) { status[row] = 0; if (do_draw) tokens[row] = argmax; }
    return;
  }
  int* sid = sup_id + (i64)row * K;
  u64* skey = sup_key + (i64)row * K;
  u64* srem = sup_rem + (i64)row * K;
  u32* scnt = sup_cnt + (i64)row * K;
  {
    DcSel s = block_select([&](int i) { return __ldcg(&ck[i]); }, N, K, sh);
    block_compact([&](int i) { return sel_has(s, __ldcg(&ck[i]), i); },
                  [&](int i, int r) { skey[r] = __ldcg(&ck[i]); sid[r] = __ldcg(&ci[i]); }, N, sh);
  }
  u64 S = 0;
  for (int j = tid; j < K; j += nt) { u64 w = weight_of_key(skey[j], mk, logits); srem[j] = w; S += w; }
  S = block_reduce64(S, 0, sh);
  u64 sb = 0;
  for (int j = tid; j < K; j += nt) {
    u64 m = (u64)DC_TOTAL * srem[j];
    u64 q = m / S;
    scnt[j] = (u32)q; srem[j] = m - q * S; sb += q;
  }
  sb = block_reduce64(sb, 0, sh);
  i64 remaining = (i64)DC_TOTAL - (i64)sb;
  if (remaining < 0 || remaining >= (i64)DC_TOTAL) {
    fail_sparse(row, W, ST_ALLOC_INCONSISTENT, do_draw ? tokens : 0, counts, ids, status); return;
  }
  if (remaining > 0) {
    if (policy == 0) {
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
    u32 r = proposal_ticket(key);
    int j = block_draw([&](int i) { return mk128(scnt[i], 0); }, K,
                       [&](u128 tot, u128* xo) { *xo = mk128(r, 0); return true; }, sh);
    if (tid == 0) tokens[row] = j >= 0 ? sid[j] : -1;
  }
  if (tid == 0) status[row] = 0;
}

/* ------------------------------------------------------------------------
 * Dense allocate / propose: one block per row. scratch u64 [B, V]. */
extern "C" __global__ void __launch_bounds__(1024) dc_dense(
    const void* x, int xdt, const void* bias, int bdt, int bias_rows, const double* temp,
    int logits, int greedy_ok, int V, int policy, int do_draw,
    const void* kseed, const void* kgen, const void* krnd, const void* kpos, int kfmt,
    u64* scratch, int* tokens, u32* counts, int* status) {
  __shared__ DcShared sh;
  __shared__ u64 sbad;
  const int row = blockIdx.x, tid = threadIdx.x, nt = blockDim.x;
  bool greedy; double T = row_temp(temp, row, greedy_ok, &greedy);
  const i64 xoff = (i64)row * V, boff = bias_rows > 1 ? xoff : 0;
  u64* sc = scratch + xoff;
  u32* crow = counts + xoff;
  if (tid == 0) sbad = NONE_BAD;
  __syncthreads();
  u64 mybad = NONE_BAD, mk = 0;
  for (int v = tid; v < V; v += nt) {
    int bad;
    u64 key = rank_key(load_f(x, xdt, xoff + v), bias, bdt, boff + v, T, logits, &bad);
    if (bad && mybad == NONE_BAD) mybad = ((u64)v << 8) | (u64)bad;
    sc[v] = key; mk = key > mk ? key : mk;
  }
  if (mybad != NONE_BAD) atomicMin(&sbad, mybad);
  mk = block_reduce64(mk, 1, sh);
  int code = 0;
  if (sbad != NONE_BAD) code = (int)(sbad & 0xFF);
  else if ((logits && mk == DC_KEY_NEG_INF) || (!logits && mk == 1)) code = ST_X_ZERO_MASS;
  if (code) {
    for (int v = tid; v < V; v += nt) crow[v] = 0;
    if (tid == 0) { status[row] = code; if (do_draw) tokens[row] = -1; }
    return;
  }
  u64 am = ~0ull;
  for (int v = tid; v < V; v += nt) if (sc[v] == mk) { am = (u64)v < am ? (u64)v : am; }
  const int argmax = (int)block_reduce64(am, 2, sh);
  if (greedy) {
    for (int v = tid; v < V; v += nt) crow[v] = v == argmax ? DC_TOTAL : 0u;
    if (tid == 0) { status[row] = 0; if (do_draw) tokens[row] = argmax; }
    return;
  }
  u64 S = 0;
  for (int v = tid; v < V; v += nt) { u64 w = weight_of_key(sc[v], mk, logits); sc[v] = w; S += w; }
  S = block_reduce64(S, 0, sh);
  u64 sb = 0;
  for (int v = tid; v < V; v += nt) {
    u64 m = (u64)DC_TOTAL * sc[v], q = m / S;
    crow[v] = (u32)q; sc[v] = m - q * S; sb += q;
  }
  sb = block_reduce64(sb, 0, sh);
  i64 remaining = (i64)DC_TOTAL - (i64)sb;
  if (remaining < 0 || remaining >= (i64)DC_TOTAL) {
    for (int v = tid; v < V; v += nt) crow[v] = 0;
    if (tid == 0) { status[row] = ST_ALLOC_INCONSISTENT; if (do_draw) tokens[row] = -1; }
    return;
  }
  if (remaining > 0) {
    if (policy == 0) {
      DcSel s = block_select([&](int i) { return sc[i]; }, V, (int)remaining, sh);
      for (int v = tid; v < V; v += nt) if (sel_has(s, sc[v], v)) crow[v] += 1;
    } else if (tid == 0) {
      crow[argmax] += (u32)remaining;
    }
  }
  __syncthreads();
  if (do_draw) {
    DcKey key = load_key(kseed, kgen, krnd, kpos, kfmt, row);
    u32 r = proposal_ticket(key);
    int j = block_draw([&](int i) { return mk128(crow[i], 0); }, V,
                       [&](u128 tot, u128* xo) { *xo = mk128(r, 0); return true; }, sh);
    if (tid == 0) tokens[row] = j;
  }
  if (tid == 0) status[row] = 0;
}

/* ------------------------------------------------------------------------
 * draw: one block per row; counts [B, W], ids [B, W] or null. */
extern "C" __global__ void __launch_bounds__(256) dc_draw(
    const u32* counts, const int* ids, int W,
    const void* kseed, const void* kgen, const void* krnd, const void* kpos, int kfmt, int* tokens) {
  __shared__ DcShared sh;
  const int row = blockIdx.x;
  const u32* c = counts + (i64)row * W;
  DcKey key = load_key(kseed, kgen, krnd, kpos, kfmt, row);
  u32 r = proposal_ticket(key);
  int j = block_draw([&](int i) { return mk128(c[i], 0); }, W,
                     [&](u128 tot, u128* xo) { *xo = mk128(r, 0); return true; }, sh);
  if (threadIdx.x == 0) tokens[row] = j < 0 ? -1 : (ids ? ids[(i64)row * W + j] : j);
}

/* ------------------------------------------------------------------------
 * verify 1/3: per (tile, target row) partial sums of P, validity, argmax. */
#define VTILE 4096
extern "C" __global__ void __launch_bounds__(256) dc_vpart(
    const u32* target, int V, int ntiles, u64* part_lo, u64* part_hi, u64* part_max, u32* part_bad) {
  __shared__ DcShared sh;
  const int tile = blockIdx.y, r = blockIdx.x;
  const u32* t = target + (i64)r * V;
  int lo = tile * VTILE, hi = min(V, lo + VTILE);
  u128 s = mk128(0, 0); u64 mx = 0; bool bad = false;
  for (int v = lo + threadIdx.x; v < hi; v += blockDim.x) {
    u32 b = t[v];
    s = add128(s, mk128(target_fixed(b, &bad), 0));
    u64 k = ((u64)(b & 0x7FFFFFFFu) << 32) | (u64)(0xFFFFFFFFu - (u32)v);
    mx = k > mx ? k : mx;
  }
  s = block_sum128(s, sh);
  mx = block_reduce64(mx, 1, sh);
  u64 nb = block_reduce64(bad ? 1 : 0, 0, sh);
  if (threadIdx.x == 0) {
    i64 o = (i64)r * ntiles + tile;
    part_lo[o] = s.lo; part_hi[o] = s.hi; part_max[o] = mx; part_bad[o] = nb ? 1u : 0u;
  }
}

DC_FN u32 q_count(const u32* qc, const int* qi, int W, int k, int b, int i, int d) {
  if (!qc) return DC_TOTAL;
  const i64 o = ((i64)b * k + i) * W;
  if (!qi) return qc[o + d];
  for (int j = 0; j < W; ++j) { int id = qi[o + j]; if (id == d) return qc[o + j]; if (id < 0 || id > d) break; }
  return 0;
}

/* ------------------------------------------------------------------------
 * verify 2/3: one warp per request: row totals, status, acceptance chain. */
extern "C" __global__ void dc_vchain(
    const u32* target, const int* draft, const u32* qc, const int* qi, int W, const unsigned char* greedy,
    int B, int k, int V, int ntiles, const u64* part_lo, const u64* part_hi, const u64* part_max,
    const u32* part_bad, const void* kseed, const void* kgen, const void* krnd, const void* kpos, int kfmt,
    int* res_row, u64* res_T, int* accepted, int* tokens, int* status) {
  const int b = blockIdx.x, lane = threadIdx.x;
  __shared__ u64 Tl[64], Th[64]; __shared__ int amax[64], badr[64];
  int* tok = tokens + (i64)b * (k + 1);
  for (int i = 0; i <= k; ++i) {
    const i64 o = ((i64)b * (k + 1) + i) * ntiles;
    u128 s = mk128(0, 0); u64 mx = 0; u32 bad = 0;
    for (int t = lane; t < ntiles; t += 32) {
      s = add128(s, mk128(part_lo[o + t], part_hi[o + t]));
      u64 m = part_max[o + t]; mx = m > mx ? m : mx; bad |= part_bad[o + t];
    }
    s = warp_sum128(s); mx = warp_max64(mx); bad = __any_sync(0xffffffffu, bad != 0);
    if (lane == 0 && i < 64) { Tl[i] = s.lo; Th[i] = s.hi; amax[i] = (int)(0xFFFFFFFFu - (u32)mx); badr[i] = bad; }
  }
  __syncwarp();
  if (lane != 0) return;
  res_row[b] = -1;
  int code = 0;
  for (int i = 0; i <= k && !code; ++i) {
    if (badr[i]) code = ST_TARGET_INVALID;
    else {
      u128 T = mk128(Tl[i], Th[i]);
      const u64 one = 1ull << 62, tol = 1ull << 52;
      if (T.hi || (T.lo > one ? T.lo - one : one - T.lo) > tol) code = ST_TARGET_SUM;
    }
  }
  const bool g = greedy[b] != 0;
  if (!code && !g)
    for (int i = 0; i < k; ++i) if (q_count(qc, qi, W, k, b, i, draft[(i64)b * k + i]) == 0) { code = ST_Q_ZERO; break; }
  if (code) {
    status[b] = code; accepted[b] = 0;
    for (int i = 0; i <= k; ++i) tok[i] = -1;
    return;
  }
  DcKey key = load_key(kseed, kgen, krnd, kpos, kfmt, b);
  for (int i = 0; i <= k; ++i) tok[i] = -1;
  for (int i = 0; i < k; ++i) {
    int d = draft[(i64)b * k + i];
    bool ok;
    if (g) ok = d == amax[i];
    else {
      bool bad = false;
      u64 P = target_fixed(target[((i64)b * (k + 1) + i) * V + d], &bad);
      u64 T = Tl[i];
      u32 c = q_count(qc, qi, W, k, b, i, d);
      u128 n = mk128(P << 24, P >> 40), tc = mul64(T, c);
      if (!lt128(n, tc)) ok = true;
      else {
        /* a, b = divmod(n, c); a < T < 2**63 */
        u64 r = n.hi % c;
        u64 t1 = (r << 32) | (n.lo >> 32); u64 q1 = t1 / c; r = t1 % c;
        u64 t0 = (r << 32) | (n.lo & 0xFFFFFFFFull); u64 q0 = t0 / c; r = t0 % c;
        u64 a = (q1 << 32) + q0, bb = r;
        u32 idx = 0; u128 v1;
        if (!uniform_below(mk128(T, 0), key, key.pos + i, DC_ACCEPTANCE, &idx, &v1)) { code = ST_RNG_EXHAUSTED; break; }
        if (v1.lo != a) ok = v1.lo < a;
        else {
          u128 v2;
          if (!uniform_below(mk128(c, 0), key, key.pos + i, DC_ACCEPTANCE, &idx, &v2)) { code = ST_RNG_EXHAUSTED; break; }
          ok = v2.lo < bb;
        }
      }
    }
    if (ok) { tok[i] = d; continue; }
    accepted[b] = i;
    if (g) tok[i] = amax[i];
    else { res_row[b] = i; res_T[b] = Tl[i]; }
    status[b] = 0;
    return;
  }
  if (code) {
    status[b] = code; accepted[b] = 0;
    for (int i = 0; i <= k; ++i) tok[i] = -1;
    return;
  }
  accepted[b] = k;
  if (g) tok[k] = amax[k];
  else { res_row[b] = k; res_T[b] = Tl[k]; }
  status[b] = 0;
}

/* ------------------------------------------------------------------------
 * verify 3/3: the one residual (or bonus) draw per request that needs it. */
DC_FN u32 q_at(const u32* qc, const int* qi, int nv, int v, int d) {
  if (!qc) return v == d ? DC_TOTAL : 0u;
  if (!qi) return qc[v];
  int lo = 0, hi = nv;  /* ids ascending in [0, nv) */
  while (lo < hi) { int m = (lo + hi) >> 1; int id = qi[m]; if (id < v) lo = m + 1; else hi = m; }
  return (lo < nv && qi[lo] == v) ? qc[lo] : 0u;
}

extern "C" __global__ void __launch_bounds__(1024) dc_vresid(
    const u32* target, const int* draft, const u32* qc, const int* qi, int W, int k, int V,
    const void* kseed, const void* kgen, const void* krnd, const void* kpos, int kfmt,
    const int* res_row, const u64* res_T, int* accepted, int* tokens, int* status) {
  __shared__ DcShared sh;
  __shared__ int snv;
  const int b = blockIdx.x;
  const int i = res_row[b];
  if (i < 0) return;
  const u64 T = res_T[b];
  const u32* t = target + ((i64)b * (k + 1) + i) * V;
  DcKey key = load_key(kseed, kgen, krnd, kpos, kfmt, b);
  const u32 pos = key.pos + i;
  auto drawx = [&](u128 tot, u128* xo) { u32 idx = 0; return uniform_below(tot, key, pos, DC_CORRECTION, &idx, xo); };
  int j;
  if (i == k) {
    j = block_draw([&](int v) { bool bad = false; return mk128(target_fixed(t[v], &bad), 0); }, V, drawx, sh);
  } else {
    const i64 qo = ((i64)b * k + i) * W;
    const u32* qcr = qc ? qc + qo : 0;
    const int* qir = (qc && qi) ? qi + qo : 0;
    const int d = draft[(i64)b * k + i];
    if (threadIdx.x == 0) {
      int nv = W;
      if (qir) { int lo = 0, hi = W; while (lo < hi) { int m = (lo + hi) >> 1; if (qir[m] >= 0) lo = m + 1; else hi = m; } nv = lo; }
      snv = nv;
    }
    __syncthreads();
    const int nv = snv;
    j = block_draw([&](int v) {
          bool bad = false; u64 P = target_fixed(t[v], &bad);
          u128 n = mk128(P << 24, P >> 40), c = mul64(T, q_at(qcr, qir, nv, v, d));
          return lt128(c, n) ? sub128(n, c) : mk128(0, 0); }, V, drawx, sh);
  }
  if (threadIdx.x == 0) {
    if (j < 0) { status[b] = ST_RNG_EXHAUSTED; accepted[b] = 0; for (int q = 0; q <= k; ++q) tokens[(i64)b * (k + 1) + q] = -1; }
    else tokens[(i64)b * (k + 1) + i] = j;
  }
}
