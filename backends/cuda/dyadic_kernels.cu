/* The CuPy backend's kernels (NVRTC, --fmad=false).  See cupy_backend.py for
 * the launch structure and dyadic/reference/*.py for the specification.
 * Scalar integer work: backends/include/dyadic_core.h (shared with the CPU
 * backend); parallel primitives: dyadic_cuda.cuh. */
#include "dyadic_cuda.cuh"

#define TILE 2048
#define TPT (TILE / 256)
#define NONE_BAD 0xFFFFFFFFFFFFFFFFull

extern "C" __global__ void dc_philox(const u32* ctr, const u32* key, int rounds, int n, u32* out) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  u32 c[4] = {ctr[4 * i], ctr[4 * i + 1], ctr[4 * i + 2], ctr[4 * i + 3]};
  u32 k[2] = {key[2 * i], key[2 * i + 1]}, o[4];
  dy_philox4x32(c, k, rounds, o);
  for (int j = 0; j < 4; ++j) out[4 * i + j] = o[j];
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
 * counter after a release fence, dc_elect_last) selects the K best of all candidates,
 * computes weights, allocates 2**24 tickets and draws.  No block waits for
 * another. */
extern "C" __global__ void __launch_bounds__(256) dc_topk(
    const void* x, int xdt, const void* bias, int bdt, int bias_rows, const double* temp,
    int logits, int greedy_ok, int V, int K, int Kc, int ntiles, int policy, int do_draw, int fast,
    const void* kseed, const void* kgen, const void* krnd, const void* kpos, int kfmt,
    u64* cand_key, int* cand_id, u64* tile_bad, u32* counters,
    int* sup_id, u64* sup_key, u64* sup_rem, u32* sup_cnt,
    int* tokens, u32* counts, int* ids, int* status, int nrows) {
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
  u64 S = 0;
  for (int j = tid; j < K; j += nt) { u64 w = weight_of_key(skey[j], mk, logits); srem[j] = w; S += w; }
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

/* ------------------------------------------------------------------------
 * Dense allocate / propose: one block per row. scratch u64 [B, V]. */
extern "C" __global__ void __launch_bounds__(1024) dc_dense(
    const void* x, int xdt, const void* bias, int bdt, int bias_rows, const double* temp,
    int logits, int greedy_ok, int V, int policy, int do_draw,
    const void* kseed, const void* kgen, const void* krnd, const void* kpos, int kfmt,
    u64* __restrict__ scratch, int* __restrict__ tokens, u32* __restrict__ counts, int* status) {
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
  for (int v0 = tid; v0 < V; v0 += 8 * nt) {  /* 8 loads in flight per thread */
    float xf[8];
#pragma unroll
    for (int q = 0; q < 8; ++q) { int v = v0 + q * nt; xf[q] = v < V ? load_f(x, xdt, xoff + v) : 0.0f; }
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      int v = v0 + q * nt;
      if (v < V) {
        int bad;
        u64 key = rank_key(xf[q], bias, bdt, boff + v, T, logits, &bad);
        if (bad && mybad == NONE_BAD) mybad = ((u64)v << 8) | (u64)bad;
        sc[v] = key; mk = key > mk ? key : mk;
      }
    }
  }
  if (mybad != NONE_BAD) atomicMin(&sbad, mybad);
  mk = block_reduce64(mk, 1, sh);
  int code = 0;
  if (sbad != NONE_BAD) code = (int)(sbad & 0xFF);
  else if ((logits && mk == DC_KEY_NEG_INF) || (!logits && mk == 1)) code = DY_ST_X_ZERO_MASS;
  if (code) {
    for (int v = tid; v < V; v += nt) crow[v] = 0;
    if (tid == 0) { status[row] = code; if (do_draw) tokens[row] = -1; }
    return;
  }
  u64 am = ~0ull;
#pragma unroll 8
  for (int v = tid; v < V; v += nt) if (sc[v] == mk) { am = (u64)v < am ? (u64)v : am; }
  const int argmax = (int)block_reduce64(am, 2, sh);
  if (greedy) {
    for (int v = tid; v < V; v += nt) crow[v] = v == argmax ? DY_TOTAL : 0u;
    if (tid == 0) { status[row] = 0; if (do_draw) tokens[row] = argmax; }
    return;
  }
  u64 S = 0;
#pragma unroll 8
  for (int v = tid; v < V; v += nt) { u64 w = weight_of_key(sc[v], mk, logits); sc[v] = w; S += w; }
  S = block_reduce64(S, 0, sh);
  u64 sb = 0;
#pragma unroll 8
  for (int v = tid; v < V; v += nt) {
    u64 m = (u64)DY_TOTAL * sc[v], q = m / S;
    crow[v] = (u32)q; sc[v] = m - q * S; sb += q;
  }
  sb = block_reduce64(sb, 0, sh);
  i64 remaining = (i64)DY_TOTAL - (i64)sb;
  if (remaining < 0 || remaining >= (i64)DY_TOTAL) {
    for (int v = tid; v < V; v += nt) crow[v] = 0;
    if (tid == 0) { status[row] = DY_ST_ALLOC_INCONSISTENT; if (do_draw) tokens[row] = -1; }
    return;
  }
  if (remaining > 0) {
    if (policy == 0) {
      /* remainders are < S: start at the digit of bitlen(S - 1) */
      const int bl = dy_bitlen64(S - 1), top = bl ? ((bl - 1) / 8) * 8 : 0;
      DcSel s = block_select([&](int i) { return sc[i]; }, V, (int)remaining, sh, top);
#pragma unroll 8
      for (int v = tid; v < V; v += nt) if (sel_has(s, sc[v], v)) crow[v] += 1;
    } else if (tid == 0) {
      crow[argmax] += (u32)remaining;
    }
  }
  __syncthreads();
  if (do_draw) {
    DcKey key = load_key(kseed, kgen, krnd, kpos, kfmt, row);
    u32 r = key_ticket(key);
    int j = block_draw([&](int i) { return dy_from64(crow[i]); }, V,
                       [&](dy_u128 tot, dy_u128* xo) { *xo = dy_from64(r); return true; }, sh);
    if (tid == 0) tokens[row] = j;
  }
  if (tid == 0) status[row] = 0;
}

/* ------------------------------------------------------------------------
 * draw: one block per row; counts [B, W], ids [B, W] or null.  A sparse row is
 * checked first (dy_draw_sparse_host of the core: the rules of a Dyadic row over
 * [0, 2^24), dc_sparse_entry_ok and a sum of 2^24; the draw does not know V): a row
 * breaking one gives -1, never an id read from it.  A dense row gives the first id
 * whose running count exceeds the ticket, or -1. */
extern "C" __global__ void __launch_bounds__(256) dc_draw(
    const u32* counts, const int* ids, int W,
    const void* kseed, const void* kgen, const void* krnd, const void* kpos, int kfmt, int* tokens) {
  __shared__ DcShared sh;
  const int row = blockIdx.x;
  const u32* c = counts + (i64)row * W;
  DcKey key = load_key(kseed, kgen, krnd, kpos, kfmt, row);
  u32 r = key_ticket(key);
  if (ids) {
    const int* ir = ids + (i64)row * W;
    bool ok = true;
    u64 sum = 0;
    for (int j = threadIdx.x; j < W; j += blockDim.x) {
      const u32 cj = c[j];
      ok &= dc_sparse_entry_ok(ir[j], cj, j ? ir[j - 1] : DY_PAD_ID, j == 0, (int)DY_MAX_VOCAB);
      sum += cj;
    }
    ok = __syncthreads_and(ok) != 0;
    if (!ok || block_reduce64(sum, 0, sh) != (u64)DY_TOTAL) {  /* block-uniform */
      if (threadIdx.x == 0) tokens[row] = -1;
      return;
    }
  }
  int j = block_draw([&](int i) { return dy_from64(c[i]); }, W,
                     [&](dy_u128 tot, dy_u128* xo) { *xo = dy_from64(r); return true; }, sh);
  if (threadIdx.x == 0) tokens[row] = j < 0 ? -1 : (ids ? ids[(i64)row * W + j] : j);
}

/* ------------------------------------------------------------------------
 * verify 1/4: per (tile, target row) partial sums of P, validity, argmax.
 * Reads every target row once (the memory floor of an exact T). */
#define VTILE 4096
#define VPT (VTILE / 256)
DC_FN void vpart_body(const int r, const int tile, DcShared& sh,
    const u32* target, int V, int ntiles, u64* part_lo, u64* part_hi, u64* part_max, u32* part_bad) {
  const u32* t = target + (i64)r * V;
  int lo = tile * VTILE, hi = min(V, lo + VTILE);
  /* split sums as in dy_target_row_total: <= VTILE / 256 terms per thread.
   * All loads of a thread are issued before any is used (one DRAM latency
   * per block, not VPT): launched with exactly 256 threads. */
  u64 shi = 0, slo = 0, mx = 0; u32 bad = 0;
  u32 bv[VPT];
#pragma unroll
  for (int j = 0; j < VPT; ++j) { int v = lo + threadIdx.x + j * 256; bv[j] = v < hi ? __ldg(&t[v]) : 0u; }
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    int v = lo + threadIdx.x + j * 256;
    if (v < hi) {
      u32 b = bv[j];
      u64 p = dy_target_fixed_fast(b);
      bad |= (u32)!dy_target_bits_valid(b);
      shi += p >> 32; slo += p & 0xFFFFFFFFull;
      u64 k = ((u64)(b & 0x7FFFFFFFu) << 32) | (u64)(0xFFFFFFFFu - (u32)v);
      mx = k > mx ? k : mx;
    }
  }
  dy_u128 s = dy_add128(dy_make128(shi >> 32, shi << 32), dy_from64(slo));
  s = block_sum128(s, sh);
  mx = block_reduce64(mx, 1, sh);
  u64 nb = block_reduce64(bad, 0, sh);
  if (threadIdx.x == 0) {
    i64 o = (i64)r * ntiles + tile;
    part_lo[o] = s.lo; part_hi[o] = s.hi; part_max[o] = mx; part_bad[o] = nb ? 1u : 0u;
  }
}

extern "C" __global__ void __launch_bounds__(256) dc_vpart(
    const u32* target, int V, int ntiles, u64* part_lo, u64* part_hi, u64* part_max, u32* part_bad) {
  __shared__ DcShared sh;
  vpart_body(blockIdx.x, blockIdx.y, sh, target, V, ntiles, part_lo, part_hi, part_max, part_bad);
}

/* ------------------------------------------------------------------------
 * verify 2/4, every thread of the block: warp 0 sums request b's tile records (row
 * totals, validity, argmax); the other warps (warp 0 after its sums in a one-warp
 * block) check the drafts and their q rows (dc_draft_check, a warp per draft) and
 * keep q_i(d_i); thread 0 then decides, in the CPU backend's order: every target row
 * (TARGET_INVALID_VALUE, TARGET_SUM), every draft id in [0, V) (DRAFT_OUT_OF_RANGE,
 * greedy requests too), for a non-greedy request every q row (Q_INVALID), then
 * q_i(d_i) > 0 (Q_ZERO_AT_DRAFT); a failing request fails closed before anything is
 * read at a draft id.  Then the acceptance chain (dy_accept of the shared core). */
DC_FN void vchain_body(const int b,
    const u32* target, const int* draft, const u32* qc, const int* qi, int W, const unsigned char* greedy,
    int B, int k, int V, int ntiles, const u64* part_lo, const u64* part_hi, const u64* part_max,
    const u32* part_bad, const void* kseed, const void* kgen, const void* krnd, const void* kpos, int kfmt,
    int* res_row, u64* res_T, int* accepted, int* tokens, int* status) {
  __shared__ u64 Tl[64], Th[64]; __shared__ int amax[64], badr[64];
  __shared__ u32 cq[64], idbits[32];
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5, nw = (int)(blockDim.x >> 5);
  int* tok = tokens + (i64)b * (k + 1);
  const i64 qrow = (i64)b * k;
  if (wid == 0) {
    for (int i = 0; i <= k; ++i) {
      const i64 o = ((i64)b * (k + 1) + i) * ntiles;
      dy_u128 s = dy_make128(0, 0); u64 mx = 0; u32 bad = 0;
      for (int t = lane; t < ntiles; t += 32) {
        s = dy_add128(s, dy_make128(__ldcg(&part_hi[o + t]), __ldcg(&part_lo[o + t])));
        u64 m = __ldcg(&part_max[o + t]); mx = m > mx ? m : mx; bad |= __ldcg(&part_bad[o + t]);
      }
      s = warp_sum128(s); mx = warp_max64(mx); bad = __any_sync(0xffffffffu, bad != 0);
      if (lane == 0 && i < 64) { Tl[i] = s.lo; Th[i] = s.hi; amax[i] = (int)(0xFFFFFFFFu - (u32)mx); badr[i] = bad; }
    }
  }
  {
    const int w0 = nw > 1 ? 1 : 0;
    u32 f = 0;
    for (int i = wid - w0; wid >= w0 && i < k; i += nw - w0) {
      u32 c;
      f |= dc_draft_check(draft[qrow + i], qc, qi, W, V, qrow + i, &c);
      if (lane == 0) cq[i] = c;
    }
    if (lane == 0) idbits[wid] = f;
  }
  __syncthreads();
  if (tid != 0) return;
  u32 ids = 0;
  for (int w = 0; w < nw; ++w) ids |= idbits[w];
  res_row[b] = -1;
  int code = DY_ST_OK;
  const u64 one = 1ull << DY_TARGET_BITS, tol = one >> DY_TARGET_TOL_BITS;
  for (int i = 0; i <= k && !code; ++i) {
    if (badr[i]) code = DY_ST_TARGET_INVALID_VALUE;
    else if (Th[i] || (Tl[i] > one ? Tl[i] - one : one - Tl[i]) > tol) code = DY_ST_TARGET_SUM;
  }
  const bool g = greedy[b] != 0;
  if (!code && (ids & 2u)) code = DY_ST_DRAFT_OUT_OF_RANGE;
  if (!code && !g && (ids & 1u)) code = DY_ST_Q_INVALID;
  for (int i = 0; i < k && !code && !g; ++i)
    if (cq[i] == 0) code = DY_ST_Q_ZERO_AT_DRAFT;
  if (code) {
    status[b] = code; accepted[b] = 0;
    for (int i = 0; i <= k; ++i) tok[i] = -1;
    return;
  }
  DcKey key = load_key(kseed, kgen, krnd, kpos, kfmt, b);
  for (int i = 0; i <= k; ++i) tok[i] = -1;
  for (int i = 0; i < k; ++i) {
    const int d = draft[qrow + i];
    int ok;
    if (g) ok = d == amax[i];
    else {
      const u64 P = dy_target_fixed(target[((i64)b * (k + 1) + i) * V + d]);
      code = dy_accept(P, Tl[i], cq[i], key.seed, key.gen, key.rnd, key.pos + i, &ok);
      if (code) break;
    }
    if (ok) { tok[i] = d; continue; }
    accepted[b] = i;
    if (g) tok[i] = amax[i];
    else { res_row[b] = i; res_T[b] = Tl[i]; }
    status[b] = DY_ST_OK;
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
  status[b] = DY_ST_OK;
}

extern "C" __global__ void dc_vchain(
    const u32* target, const int* draft, const u32* qc, const int* qi, int W, const unsigned char* greedy,
    int B, int k, int V, int ntiles, const u64* part_lo, const u64* part_hi, const u64* part_max,
    const u32* part_bad, const void* kseed, const void* kgen, const void* krnd, const void* kpos, int kfmt,
    int* res_row, u64* res_T, int* accepted, int* tokens, int* status) {
  vchain_body(blockIdx.x, target, draft, qc, qi, W, greedy, B, k, V, ntiles, part_lo, part_hi, part_max, part_bad, kseed, kgen, krnd, kpos, kfmt, res_row, res_T, accepted, tokens, status);
}

/* verify 1+2 fused: grid (B * (k + 1), ntiles); the last block of a request
 * (atomic counter after a release fence, dc_elect_last; reset by that block, so CUDA-graph
 * replays start at zero) runs the acceptance chain with its first warp.
 * No block waits for another. */
extern "C" __global__ void __launch_bounds__(256) dc_vpart_chain(
    const u32* target, const int* draft, const u32* qc, const int* qi, int W, const unsigned char* greedy,
    int B, int k, int V, int ntiles, const u64* part_lo, const u64* part_hi, const u64* part_max,
    const u32* part_bad, const void* kseed, const void* kgen, const void* krnd, const void* kpos, int kfmt,
    int* res_row, u64* res_T, int* accepted, int* tokens, int* status, u32* vcnt) {
  __shared__ DcShared sh;
  __shared__ int is_last;
  const int r = blockIdx.x, tile = blockIdx.y, b = r / (k + 1);
  vpart_body(r, tile, sh, target, V, ntiles, (u64*)part_lo, (u64*)part_hi, (u64*)part_max, (u32*)part_bad);
  if (!dc_elect_last(&vcnt[b], (u32)((k + 1) * ntiles), &is_last)) return;
  vchain_body(b, target, draft, qc, qi, W, greedy, B, k, V, ntiles, part_lo, part_hi, part_max, part_bad, kseed, kgen, krnd, kpos, kfmt, res_row, res_T, accepted, tokens, status);
}

/* ------------------------------------------------------------------------
 * verify 3/4 and 4/4: the one residual (or bonus) draw per request that
 * needs it, spread over many blocks: per-tile 128-bit sums of the residual
 * R_v = dy_residual(P_v, c_v, T) (bonus row: P_v), then one block per request
 * draws X below the total, finds the tile by a prefix over the tile sums and
 * the first-exceeding id inside it. */
DC_FN u32 q_at(const u32* qc, const int* qi, int nv, int v, int d) {
  if (!qc) return v == d ? DY_TOTAL : 0u;
  if (!qi) return qc[v];
  int lo = 0, hi = nv;  /* ids ascending in [0, nv) */
  while (lo < hi) { int m = (lo + hi) >> 1; int id = qi[m]; if (id < v) lo = m + 1; else hi = m; }
  return (lo < nv && qi[lo] == v) ? qc[lo] : 0u;
}

struct ResRow { const u32* t; const u32* qcr; const int* qir; int nv, d, bonus; u64 T; };

DC_FN ResRow res_setup(const u32* target, const int* draft, const u32* qc, const int* qi, int W,
                       int k, int V, int b, int i, u64 T, int* snv) {
  ResRow r;
  r.t = target + ((i64)b * (k + 1) + i) * V;
  r.T = T; r.bonus = i == k; r.qcr = 0; r.qir = 0; r.d = -1; r.nv = 0;
  if (!r.bonus) {
    const i64 qo = ((i64)b * k + i) * (qi ? W : V);
    r.qcr = qc ? qc + qo : 0;
    r.qir = (qc && qi) ? qi + ((i64)b * k + i) * W : 0;
    r.d = draft[(i64)b * k + i];
    if (threadIdx.x == 0) {
      int nv = W;
      if (r.qir) { int lo = 0, hi = W; while (lo < hi) { int m = (lo + hi) >> 1; if (r.qir[m] >= 0) lo = m + 1; else hi = m; } nv = lo; }
      *snv = nv;
    }
    __syncthreads();
    r.nv = *snv;
  }
  return r;
}

DC_FN dy_u128 res_weight(const ResRow& r, int v) {
  const u64 P = dy_target_fixed(r.t[v]);
  if (r.bonus) return dy_from64(P);
  return dy_residual(P, q_at(r.qcr, r.qir, r.nv, v, r.d), r.T);
}

#define RTILE VTILE
DC_FN void vrpart_body(const int tile, const int b, DcShared& sh,
    const u32* target, const int* draft, const u32* qc, const int* qi, int W, int k, int V, int nrt,
    const int* res_row, const u64* res_T, u64* rpart) {
  __shared__ int snv;
  const int i = res_row[b];
  ResRow r = res_setup(target, draft, qc, qi, W, k, V, b, i, res_T[b], &snv);
  const int lo = tile * RTILE, hi = min(V, lo + RTILE);
  /* loads first (one latency per block), then the 128-bit sums; 256 threads */
  u32 tb[VPT], qv[VPT];
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    int v = lo + threadIdx.x + j * 256;
    tb[j] = v < hi ? __ldg(&r.t[v]) : 0u;
    qv[j] = (v < hi && !r.bonus && r.qcr && !r.qir) ? __ldg(&r.qcr[v]) : 0u;
  }
  dy_u128 s = dy_make128(0, 0);
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    int v = lo + threadIdx.x + j * 256;
    if (v < hi) {
      const u64 P = dy_target_fixed(tb[j]);
      if (r.bonus) s = dy_add128(s, dy_from64(P));
      else {
        const u32 c = (r.qcr && !r.qir) ? qv[j] : q_at(r.qcr, r.qir, r.nv, v, r.d);
        s = dy_add128(s, dy_residual(P, c, r.T));
      }
    }
  }
  s = block_sum128(s, sh);
  if (threadIdx.x == 0) { rpart[2 * ((i64)b * nrt + tile)] = s.lo; rpart[2 * ((i64)b * nrt + tile) + 1] = s.hi; }
}

extern "C" __global__ void __launch_bounds__(256) dc_vrpart(
    const u32* target, const int* draft, const u32* qc, const int* qi, int W, int k, int V, int nrt,
    const int* res_row, const u64* res_T, u64* rpart, int nrows) {
  __shared__ DcShared sh;
  const int b = dc_grid_row();
  if (b >= nrows || res_row[b] < 0) return;
  vrpart_body(blockIdx.x, b, sh, target, draft, qc, qi, W, k, V, nrt, res_row, res_T, rpart);
}

DC_FN void vrdraw_body(const int b, DcShared& sh,
    const u32* target, const int* draft, const u32* qc, const int* qi, int W, int k, int V, int nrt,
    const void* kseed, const void* kgen, const void* krnd, const void* kpos, int kfmt,
    const int* res_row, const u64* res_T, const u64* rpart, int* accepted, int* tokens, int* status) {
  __shared__ int snv, stile, sok;
  __shared__ dy_u128 sx;
  const int i = res_row[b];
  if (i < 0) return;
  ResRow r = res_setup(target, draft, qc, qi, W, k, V, b, i, res_T[b], &snv);
  if (threadIdx.x == 0) {
    const u64* rp = rpart + 2 * (i64)b * nrt;
    dy_u128 tot = dy_make128(0, 0);
    for (int t = 0; t < nrt; ++t) tot = dy_add128(tot, dy_make128(__ldcg(&rp[2 * t + 1]), __ldcg(&rp[2 * t])));
    DcKey key = load_key(kseed, kgen, krnd, kpos, kfmt, b);
    u32 idx = 0; dy_u128 x = dy_make128(0, 0);
    int ok = !dy_is_zero128(tot) &&
             dy_uniform_below_u128(tot, key.seed, key.gen, key.rnd, key.pos + i, DY_DOMAIN_CORRECTION,
                                   &idx, &x) == DY_ST_OK;
    int tile = -1;
    if (ok) {
      dy_u128 cum = dy_make128(0, 0);
      for (int t = 0; t < nrt; ++t) {
        dy_u128 nc = dy_add128(cum, dy_make128(__ldcg(&rp[2 * t + 1]), __ldcg(&rp[2 * t])));
        if (dy_lt128(x, nc)) { tile = t; x = dy_sub128(x, cum); break; }
        cum = nc;
      }
    }
    sok = ok && tile >= 0; stile = tile; sx = x;
  }
  __syncthreads();
  int j = -1;
  if (sok) {
    const int lo = stile * RTILE, hi = min(V, lo + RTILE);
    j = block_draw([&](int v) { return res_weight(r, v); }, hi,
                   [&](dy_u128, dy_u128*) { return false; }, sh, lo, false, sx);
  }
  if (threadIdx.x == 0) {
    if (j < 0) { status[b] = DY_ST_RNG_EXHAUSTED; accepted[b] = 0; for (int q = 0; q <= k; ++q) tokens[(i64)b * (k + 1) + q] = -1; }
    else tokens[(i64)b * (k + 1) + i] = j;
  }
}

extern "C" __global__ void __launch_bounds__(256) dc_vrdraw(
    const u32* target, const int* draft, const u32* qc, const int* qi, int W, int k, int V, int nrt,
    const void* kseed, const void* kgen, const void* krnd, const void* kpos, int kfmt,
    const int* res_row, const u64* res_T, const u64* rpart, int* accepted, int* tokens, int* status) {
  __shared__ DcShared sh;
  vrdraw_body(blockIdx.x, sh, target, draft, qc, qi, W, k, V, nrt, kseed, kgen, krnd, kpos, kfmt, res_row, res_T, rpart, accepted, tokens, status);
}

/* verify 3+4 fused: grid (nrt, B); the last block of a request (atomic
 * counter after a release fence, dc_elect_last, reset by that block) draws X and finds the
 * token.  Requests without a residual row return at once in every block. */
extern "C" __global__ void __launch_bounds__(256) dc_vresid_fused(
    const u32* target, const int* draft, const u32* qc, const int* qi, int W, int k, int V, int nrt,
    const void* kseed, const void* kgen, const void* krnd, const void* kpos, int kfmt,
    const int* res_row, const u64* res_T, u64* rpart, int* accepted, int* tokens, int* status, u32* rcnt,
    int nrows) {
  __shared__ DcShared sh;
  __shared__ int is_last;
  const int tile = blockIdx.x, b = dc_grid_row();
  if (b >= nrows || res_row[b] < 0) return;
  vrpart_body(tile, b, sh, target, draft, qc, qi, W, k, V, nrt, res_row, res_T, rpart);
  if (!dc_elect_last(&rcnt[b], (u32)nrt, &is_last)) return;
  vrdraw_body(b, sh, target, draft, qc, qi, W, k, V, nrt, kseed, kgen, krnd, kpos, kfmt, res_row, res_T, rpart, accepted, tokens, status);
}

/* ========================================================================
 * verify, bandwidth path (default; DYADIC_CUDA_VERIFY=old / =split keep the
 * 4096-tile kernels above).  Stage 1: runtime tile size vt (a multiple of
 * 1024 chosen so that >= ~4 blocks per SM are in flight), 16-byte loads
 * (uint4) when vec != 0 (V % 4 == 0 and a 16-byte aligned base), U loads in
 * flight per thread, per-thread split sums (sum of P >> 32 and of P & (2^32-1):
 * plain u64, exact: <= 64 terms per thread, <= 2^46 per block) and ONE
 * block reduction (warp shuffles, one __syncthreads) per tile.  The 128-bit
 * tile sum is formed once by thread 0.  The last block of a request runs the
 * acceptance chain (vchain_body). */
#define VU 8
struct V1Acc { u64 shi, slo, mx; u32 bad; };

DC_FN void v1_one(V1Acc& a, u32 b, int v) {
  const u64 p = dy_target_fixed_fast(b);
  a.bad |= (u32)!dy_target_bits_valid(b);
  a.shi += p >> 32; a.slo += p & 0xFFFFFFFFull;
  const u64 key = ((u64)(b & 0x7FFFFFFFu) << 32) | (u64)(0xFFFFFFFFu - (u32)v);
  a.mx = key > a.mx ? key : a.mx;
}

struct V1Shared { u64 shi[8], slo[8], mx[8]; u32 bad[8]; };

DC_FN void v1_body(const int r, const int tile, const int vt, const int vec, V1Shared& s1,
    const u32* target, int V, int ntiles, u64* part_lo, u64* part_hi, u64* part_max, u32* part_bad) {
  const u32* t = target + (i64)r * V;
  const int lo = tile * vt, hi = min(V, lo + vt), tid = threadIdx.x;
  V1Acc a; a.shi = 0; a.slo = 0; a.mx = 0; a.bad = 0;
  if (vec) {
    const uint4* t4 = (const uint4*)(t + lo);
    const int n4 = (hi - lo) >> 2;
    for (int g0 = tid; g0 < n4; g0 += 256 * VU) {
      uint4 buf[VU];
#pragma unroll
      for (int u = 0; u < VU; ++u) { int g = g0 + u * 256; buf[u] = g < n4 ? __ldcs(&t4[g]) : make_uint4(0, 0, 0, 0); }
#pragma unroll
      for (int u = 0; u < VU; ++u) {
        int g = g0 + u * 256;
        if (g < n4) {
          const int v = lo + 4 * g;
          v1_one(a, buf[u].x, v); v1_one(a, buf[u].y, v + 1); v1_one(a, buf[u].z, v + 2); v1_one(a, buf[u].w, v + 3);
        }
      }
    }
  } else {
    for (int v0 = lo + tid; v0 < hi; v0 += 256 * 4 * VU) {
      u32 buf[4 * VU];
#pragma unroll
      for (int u = 0; u < 4 * VU; ++u) { int v = v0 + u * 256; buf[u] = v < hi ? __ldcs(&t[v]) : 0u; }
#pragma unroll
      for (int u = 0; u < 4 * VU; ++u) { int v = v0 + u * 256; if (v < hi) v1_one(a, buf[u], v); }
    }
  }
  /* one block reduction of (shi, slo, mx, bad) */
  for (int o = 16; o; o >>= 1) {
    a.shi += __shfl_xor_sync(0xffffffffu, a.shi, o);
    a.slo += __shfl_xor_sync(0xffffffffu, a.slo, o);
    u64 m = __shfl_xor_sync(0xffffffffu, a.mx, o); a.mx = m > a.mx ? m : a.mx;
  }
  a.bad = __reduce_or_sync(0xffffffffu, a.bad);
  const int lane = tid & 31, wid = tid >> 5;
  if (lane == 0) { s1.shi[wid] = a.shi; s1.slo[wid] = a.slo; s1.mx[wid] = a.mx; s1.bad[wid] = a.bad; }
  __syncthreads();
  if (tid == 0) {
    u64 h = 0, l = 0, m = 0; u32 bd = 0;
    for (int w = 0; w < 8; ++w) { h += s1.shi[w]; l += s1.slo[w]; m = s1.mx[w] > m ? s1.mx[w] : m; bd |= s1.bad[w]; }
    const dy_u128 s = dy_add128(dy_make128(h >> 32, h << 32), dy_from64(l));
    const i64 o = (i64)r * ntiles + tile;
    part_lo[o] = s.lo; part_hi[o] = s.hi; part_max[o] = m; part_bad[o] = bd ? 1u : 0u;
  }
}

extern "C" __global__ void __launch_bounds__(256) dc_v1(
    const u32* target, const int* draft, const u32* qc, const int* qi, int W, const unsigned char* greedy,
    int B, int k, int V, int ntiles, const u64* part_lo, const u64* part_hi, const u64* part_max,
    const u32* part_bad, const void* kseed, const void* kgen, const void* krnd, const void* kpos, int kfmt,
    int* res_row, u64* res_T, int* accepted, int* tokens, int* status, u32* vcnt, int vt, int vec) {
  __shared__ V1Shared s1;
  __shared__ int is_last;
  /* grid (ntiles, rows) (rows over y and z: dc_grid_row): consecutive blocks read
   * consecutive tiles of a row */
  const int tile = blockIdx.x, r = dc_grid_row(), b = r / (k + 1);
  if (r >= B * (k + 1)) return;
  v1_body(r, tile, vt, vec, s1, target, V, ntiles, (u64*)part_lo, (u64*)part_hi, (u64*)part_max, (u32*)part_bad);
  if (!dc_elect_last(&vcnt[b], (u32)((k + 1) * ntiles), &is_last)) return;
  vchain_body(b, target, draft, qc, qi, W, greedy, B, k, V, ntiles, part_lo, part_hi, part_max, part_bad, kseed, kgen, krnd, kpos, kfmt, res_row, res_T, accepted, tokens, status);
}

/* Stage 2: the residual (or bonus) row of each request, grid (nrt, B), tile
 * rt (a multiple of 1024).  R_v > 0 iff P_v > thr(c_v) = c*(T >> 24) +
 * ((c*(T & (2^24-1))) >> 24) (the CPU backend's test, exact), so a tile's
 * residual sum is 2^24 * sum_sel P - T * sum_sel c: two u64 sums per
 * thread (modular; the true totals of a valid row are < 2^64), one block
 * reduction, the 128-bit value formed once.  Sparse / point-mass q: every P
 * of the tile is summed, then the (few) support entries in the tile are
 * corrected (P removed where R = 0, c added where R > 0).  The last block of
 * the request draws X, finds the tile with one warp (scan of the tile sums)
 * and the token inside the tile (block_draw over dy_residual). */
DC_FN u64 dc_resid_thr(u64 c, u64 th, u64 tl) { return c * th + ((c * tl) >> DY_TOTAL_BITS); }

DC_FN void v2_part(const int tile, const int b, const int rt, const int vec_t, const int vec_q, V1Shared& s1,
    const u32* target, const int* draft, const u32* qc, const int* qi, int W, int k, int V, int nrt,
    const int* res_row, const u64* res_T, u64* rpart) {
  const int i = res_row[b], tid = threadIdx.x;
  const u64 T = res_T[b], th = T >> DY_TOTAL_BITS, tl = T & (u64)(DY_TOTAL - 1u);
  const u32* trow = target + ((i64)b * (k + 1) + i) * V;
  const bool bonus = i == k, dense = !bonus && qc && !qi;
  const u32* qrow = dense ? qc + ((i64)b * k + i) * V : 0;
  const int lo = tile * rt, hi = min(V, lo + rt);
  u64 sp = 0, sc = 0;
  if (dense) {
    if (vec_t && vec_q) {
      const uint4* t4 = (const uint4*)(trow + lo);
      const uint4* q4 = (const uint4*)(qrow + lo);
      const int n4 = (hi - lo) >> 2;
      for (int g0 = tid; g0 < n4; g0 += 256 * 4) {
        uint4 tb[4], qb[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          int g = g0 + u * 256;
          tb[u] = g < n4 ? __ldcs(&t4[g]) : make_uint4(0, 0, 0, 0);
          qb[u] = g < n4 ? __ldcs(&q4[g]) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const u32 bb[4] = {tb[u].x, tb[u].y, tb[u].z, tb[u].w};
          const u32 cc[4] = {qb[u].x, qb[u].y, qb[u].z, qb[u].w};
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const u64 P = dy_target_fixed_fast(bb[e]), c = cc[e];
            const u64 m = (u64)0 - (u64)(P > dc_resid_thr(c, th, tl));
            sp += P & m; sc += c & m;
          }
        }
      }
    } else {
      for (int v0 = lo + tid; v0 < hi; v0 += 256 * 8) {
        u32 tb[8], qb[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) { int v = v0 + u * 256; tb[u] = v < hi ? __ldcs(&trow[v]) : 0u; qb[u] = v < hi ? __ldcs(&qrow[v]) : 0u; }
#pragma unroll
        for (int u = 0; u < 8; ++u) {
          const u64 P = dy_target_fixed_fast(tb[u]), c = qb[u];
          const u64 m = (u64)0 - (u64)(P > dc_resid_thr(c, th, tl));
          sp += P & m; sc += c & m;
        }
      }
    }
  } else {
    if (vec_t) {
      const uint4* t4 = (const uint4*)(trow + lo);
      const int n4 = (hi - lo) >> 2;
      for (int g0 = tid; g0 < n4; g0 += 256 * VU) {
        uint4 tb[VU];
#pragma unroll
        for (int u = 0; u < VU; ++u) { int g = g0 + u * 256; tb[u] = g < n4 ? __ldcs(&t4[g]) : make_uint4(0, 0, 0, 0); }
#pragma unroll
        for (int u = 0; u < VU; ++u)
          sp += dy_target_fixed_fast(tb[u].x) + dy_target_fixed_fast(tb[u].y) + dy_target_fixed_fast(tb[u].z) + dy_target_fixed_fast(tb[u].w);
      }
    } else {
      for (int v0 = lo + tid; v0 < hi; v0 += 256 * 8) {
        u32 tb[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) { int v = v0 + u * 256; tb[u] = v < hi ? __ldcs(&trow[v]) : 0u; }
#pragma unroll
        for (int u = 0; u < 8; ++u) sp += dy_target_fixed_fast(tb[u]);
      }
    }
    if (!bonus) {  /* support corrections (sparse q or the point mass at the draft) */
      if (!qc) {
        const int d = draft[(i64)b * k + i];
        if (tid == 0 && d >= lo && d < hi) {
          const u64 P = dy_target_fixed_fast(trow[d]), c = DY_TOTAL;
          if (P > dc_resid_thr(c, th, tl)) sc += c; else sp -= P;
        }
      } else {
        const u32* qcr = qc + ((i64)b * k + i) * W;
        const int* qir = qi + ((i64)b * k + i) * W;
        for (int j = tid; j < W; j += 256) {
          const int id = qir[j];
          if (id >= 0 && id >= lo && id < hi) {
            const u64 P = dy_target_fixed_fast(trow[id]), c = qcr[j];
            if (P > dc_resid_thr(c, th, tl)) sc += c; else sp -= P;
          }
        }
      }
    }
  }
  for (int o = 16; o; o >>= 1) {
    sp += __shfl_xor_sync(0xffffffffu, sp, o);
    sc += __shfl_xor_sync(0xffffffffu, sc, o);
  }
  const int lane = tid & 31, wid = tid >> 5;
  if (lane == 0) { s1.shi[wid] = sp; s1.slo[wid] = sc; }
  __syncthreads();
  if (tid == 0) {
    u64 P = 0, C = 0;
    for (int w = 0; w < 8; ++w) { P += s1.shi[w]; C += s1.slo[w]; }
    /* bonus row: the weights are P itself (res_weight); otherwise R = P * 2^24 - c * T */
    const dy_u128 s = bonus ? dy_from64(P)
                            : dy_sub128(dy_make128(P >> (64 - DY_TOTAL_BITS), P << DY_TOTAL_BITS), dy_mul64(C, T));
    rpart[2 * ((i64)b * nrt + tile)] = s.lo; rpart[2 * ((i64)b * nrt + tile) + 1] = s.hi;
  }
}

extern "C" __global__ void __launch_bounds__(256) dc_v2(
    const u32* target, const int* draft, const u32* qc, const int* qi, int W, int k, int V, int nrt,
    const void* kseed, const void* kgen, const void* krnd, const void* kpos, int kfmt,
    const int* res_row, const u64* res_T, u64* rpart, int* accepted, int* tokens, int* status, u32* rcnt,
    int rt, int vec_t, int vec_q, int nrows) {
  __shared__ DcShared sh;
  __shared__ V1Shared s1;
  __shared__ int is_last, snv, stile, sok;
  __shared__ dy_u128 sx;
  const int tile = blockIdx.x, b = dc_grid_row();
  if (b >= nrows) return;
  const int i = res_row[b];
  if (i < 0) return;
  v2_part(tile, b, rt, vec_t, vec_q, s1, target, draft, qc, qi, W, k, V, nrt, res_row, res_T, rpart);
  if (!dc_elect_last(&rcnt[b], (u32)nrt, &is_last)) return;
  ResRow r = res_setup(target, draft, qc, qi, W, k, V, b, i, res_T[b], &snv);
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    const u64* rp = rpart + 2 * (i64)b * nrt;
    const int chunk = (nrt + 31) / 32, a0 = min(nrt, lane * chunk), a1 = min(nrt, a0 + chunk);
    dy_u128 s = dy_make128(0, 0);
    for (int t = a0; t < a1; ++t) s = dy_add128(s, dy_make128(__ldcg(&rp[2 * t + 1]), __ldcg(&rp[2 * t])));
    dy_u128 inc = s;
    for (int o = 1; o < 32; o <<= 1) {
      dy_u128 u = dy_make128(__shfl_up_sync(0xffffffffu, inc.hi, o), __shfl_up_sync(0xffffffffu, inc.lo, o));
      if (lane >= o) inc = dy_add128(inc, u);
    }
    const dy_u128 tot = dy_make128(__shfl_sync(0xffffffffu, inc.hi, 31), __shfl_sync(0xffffffffu, inc.lo, 31));
    int ok = 0; dy_u128 x = dy_make128(0, 0);
    if (lane == 0) {
      DcKey key = load_key(kseed, kgen, krnd, kpos, kfmt, b);
      u32 idx = 0;
      ok = !dy_is_zero128(tot) &&
           dy_uniform_below_u128(tot, key.seed, key.gen, key.rnd, key.pos + i, DY_DOMAIN_CORRECTION,
                                 &idx, &x) == DY_ST_OK;
    }
    ok = __shfl_sync(0xffffffffu, ok, 0);
    x = dy_make128(__shfl_sync(0xffffffffu, x.hi, 0), __shfl_sync(0xffffffffu, x.lo, 0));
    if (lane == 0) { sok = 0; stile = -1; }
    __syncwarp();
    if (ok) {
      const unsigned bal = __ballot_sync(0xffffffffu, dy_lt128(x, inc));
      const int L = bal ? __ffs(bal) - 1 : -1;
      if (lane == L) {
        dy_u128 cum = dy_sub128(inc, s);
        for (int t = a0; t < a1; ++t) {
          const dy_u128 nc = dy_add128(cum, dy_make128(__ldcg(&rp[2 * t + 1]), __ldcg(&rp[2 * t])));
          if (dy_lt128(x, nc)) { stile = t; sx = dy_sub128(x, cum); sok = 1; break; }
          cum = nc;
        }
      }
    }
  }
  __syncthreads();
  int j = -1;
  if (sok) {
    const int lo = stile * rt, hi = min(V, lo + rt);
    j = block_draw([&](int v) { return res_weight(r, v); }, hi,
                   [&](dy_u128, dy_u128*) { return false; }, sh, lo, false, sx);
  }
  if (threadIdx.x == 0) {
    if (j < 0) { status[b] = DY_ST_RNG_EXHAUSTED; accepted[b] = 0; for (int q = 0; q <= k; ++q) tokens[(i64)b * (k + 1) + q] = -1; }
    else tokens[(i64)b * (k + 1) + i] = j;
  }
}

/* ========================================================================
 * Dense allocate / propose, multi-block (DYADIC_CUDA_DENSE=mb; default: da2_* of
 * dense_alloc2.cuh, =old: dc_dense).  Grid (ntiles, B) per launch, tile `dt`
 * elements, 256 threads.  Keys are recomputed from x in each stage (x is read
 * a few times; no key scratch).  Per-row state `st` (DD_RS u64, zeroed by the
 * host with one memset per call) collects, with exact integer atomics:
 *   dd_max:   row max key (atomicMax), first bad element (atomicMax of ~packed)
 *   dd_sum:   argmax (atomicMax of ~id), S = sum of weights (atomicAdd, u64)
 *   dd_floor: counts = floor(2^24 w / S), remainders -> scratch, sum of floors,
 *             histogram of the first 12-bit remainder digit; the last block of
 *             the row (atomic counter after a release fence, dc_elect_last) fixes remaining /
 *             status / the first digit of the remainder threshold
 *   dd_pass:  (up to 5 launches) the next 12-bit digit among remainders equal
 *             on the digits so far (global histogram, last block picks the bin)
 *   dd_tiecnt, dd_mark: ties on the full remainder go to the lowest ids
 *             (per-tile counts of equal keys, exclusive prefix over tiles);
 *             +1 ticket for every selected remainder.
 * The selection equals block_select (K largest remainders, ties lowest index). */
#define DD_RS 2064
#define DD_HB 4096
enum { DD_MK = 0, DD_BAD, DD_ARG, DD_S, DD_SB, DD_CODE, DD_PREFIX, DD_MASK, DD_NEED, DD_DONE,
       DD_REM, DD_C1, DD_C2, DD_C3, DD_LO, DD_SKIP };

DC_FN bool dd_last(u64* st, int slot) {
  __shared__ int is_last;
  return dc_elect_last(&st[slot], (u64)gridDim.x, &is_last);
}

/* status code of the row after dd_max (0 = fine) */
DC_FN int dd_code(const u64* st, int logits) {
  const u64 nb = __ldcg(&st[DD_BAD]);
  if (nb) return (int)((~nb) & 0xFF);
  const u64 mk = __ldcg(&st[DD_MK]);
  if ((logits && mk == DC_KEY_NEG_INF) || (!logits && mk == 1)) return DY_ST_X_ZERO_MASS;
  return 0;
}

/* the last block: choose the digit bin [lo, hi) holding the need-th largest */
DC_FN void dd_pick(u64* st, int hi, int lo) {
  __shared__ u32 wsum[256];
  __shared__ int sbin, scum, sdone;
  u32* hist = (u32*)(st + 16);
  const int tid = threadIdx.x;
  const int need = (int)st[DD_NEED];
  /* thread t owns bins [4096 - 16 (t+1), 4096 - 16 t), scanned from the top */
  u32 c[16], s = 0;
  for (int j = 0; j < 16; ++j) { c[j] = __ldcg(&hist[DD_HB - 1 - 16 * tid - j]); s += c[j]; }
  wsum[tid] = s;
  if (tid == 0) sbin = -1;
  __syncthreads();
  u32 exc = 0;
  for (int u = 0; u < tid; ++u) exc += wsum[u];
  if (exc < (u32)need && (u32)need <= exc + s) {
    u32 cum = exc;
    for (int j = 0; j < 16; ++j) {
      if (cum + c[j] >= (u32)need) {
        sbin = DD_HB - 1 - 16 * tid - j; scum = (int)cum; sdone = c[j] == (u32)need - cum; break;
      }
      cum += c[j];
    }
  }
  __syncthreads();
  for (int j = tid; j < DD_HB; j += blockDim.x) hist[j] = 0;
  if (tid == 0) {
    const int bin = sbin, w = hi - lo;
    const u64 dm = (w >= 64 ? ~0ull : ((1ull << w) - 1)) << lo;
    const int nn = need - scum;
    st[DD_PREFIX] |= (u64)bin << lo;
    st[DD_MASK] |= dm;
    st[DD_NEED] = (u64)nn;
    st[DD_DONE] = (u64)sdone;
    st[DD_LO] = (u64)lo;
  }
  __syncthreads();
}

extern "C" __global__ void __launch_bounds__(256) dd_max(
    const void* x, int xdt, const void* bias, int bdt, int bias_rows, const double* temp,
    int logits, int greedy_ok, int V, int dt, u64* state, int nrows) {
  __shared__ DcShared sh;
  const int row = dc_grid_row(), tid = threadIdx.x;
  if (row >= nrows) return;
  bool greedy; double T = row_temp(temp, row, greedy_ok, &greedy);
  const i64 xoff = (i64)row * V, boff = bias_rows > 1 ? xoff : 0;
  u64* st = state + (i64)row * DD_RS;
  const int lo = blockIdx.x * dt, hi = min(V, lo + dt);
  u64 mk = 0, nb = 0;
  for (int v0 = lo + tid; v0 < hi; v0 += 256 * 8) {
    float xf[8];
#pragma unroll
    for (int q = 0; q < 8; ++q) { int v = v0 + q * 256; xf[q] = v < hi ? load_f(x, xdt, xoff + v) : 0.0f; }
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      int v = v0 + q * 256;
      if (v < hi) {
        int bad;
        u64 key = rank_key(xf[q], bias, bdt, boff + v, T, logits, &bad);
        if (bad && nb == 0) nb = ~(((u64)v << 8) | (u64)bad);
        mk = key > mk ? key : mk;
      }
    }
  }
  mk = block_reduce64(mk, 1, sh);
  nb = block_reduce64(nb, 1, sh);
  if (tid == 0) { atomicMax(&st[DD_MK], mk); if (nb) atomicMax(&st[DD_BAD], nb); }
}

extern "C" __global__ void __launch_bounds__(256) dd_sum(
    const void* x, int xdt, const void* bias, int bdt, int bias_rows, const double* temp,
    int logits, int greedy_ok, int V, int dt, u64* state, int nrows) {
  __shared__ DcShared sh;
  const int row = dc_grid_row(), tid = threadIdx.x;
  if (row >= nrows) return;
  u64* st = state + (i64)row * DD_RS;
  if (dd_code(st, logits)) return;
  bool greedy; double T = row_temp(temp, row, greedy_ok, &greedy);
  const i64 xoff = (i64)row * V, boff = bias_rows > 1 ? xoff : 0;
  const u64 mk = st[DD_MK];
  const int lo = blockIdx.x * dt, hi = min(V, lo + dt);
  u64 S = 0, na = 0;
  for (int v0 = lo + tid; v0 < hi; v0 += 256 * 8) {
    float xf[8];
#pragma unroll
    for (int q = 0; q < 8; ++q) { int v = v0 + q * 256; xf[q] = v < hi ? load_f(x, xdt, xoff + v) : 0.0f; }
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      int v = v0 + q * 256;
      if (v < hi) {
        int bad;
        u64 key = rank_key(xf[q], bias, bdt, boff + v, T, logits, &bad);
        if (key == mk && na == 0) na = ~(u64)v;
        if (!greedy) S += weight_of_key(key, mk, logits);
      }
    }
  }
  na = block_reduce64(na, 1, sh);
  S = block_reduce64(S, 0, sh);
  if (tid == 0) { if (na) atomicMax(&st[DD_ARG], na); if (!greedy) atomicAdd(&st[DD_S], S); }
}

extern "C" __global__ void __launch_bounds__(256) dd_floor(
    const void* x, int xdt, const void* bias, int bdt, int bias_rows, const double* temp,
    int logits, int greedy_ok, int V, int dt, int policy, u64* state, u64* __restrict__ scratch,
    u32* __restrict__ counts, int* status, int recip, int nrows) {
  __shared__ DcShared sh;
  __shared__ u32 hs[DD_HB];
  const int row = dc_grid_row(), tid = threadIdx.x;
  if (row >= nrows) return;
  u64* st = state + (i64)row * DD_RS;
  const i64 xoff = (i64)row * V, boff = bias_rows > 1 ? xoff : 0;
  u32* crow = counts + xoff;
  u64* sc = scratch + xoff;
  const int lo = blockIdx.x * dt, hi = min(V, lo + dt);
  const int code = dd_code(st, logits);
  bool greedy; double T = row_temp(temp, row, greedy_ok, &greedy);
  if (code) {
    for (int v = lo + tid; v < hi; v += 256) crow[v] = 0;
    if (blockIdx.x == 0 && tid == 0) { status[row] = code; st[DD_SKIP] = 1; }
    return;
  }
  const int argmax = (int)~st[DD_ARG];
  if (greedy) {
    for (int v = lo + tid; v < hi; v += 256) crow[v] = v == argmax ? DY_TOTAL : 0u;
    if (blockIdx.x == 0 && tid == 0) { status[row] = 0; st[DD_SKIP] = 1; }
    return;
  }
  const u64 mk = st[DD_MK], S = st[DD_S];
  const int bl = dy_bitlen64(S - 1);
  const int dlo = bl > 12 ? bl - 12 : 0;
  /* recip (opt-in, DYADIC_CUDA_DENSE_RECIP=1, not yet GPU-tested): floor(m / S) from the
   * row reciprocal inv = floor((2^64 - 1) / S), one division per block: qq = mulhi(m, inv)
   * satisfies q - 2 <= qq <= q, corrected exactly by r >= S steps */
  const u64 inv = recip ? ~0ull / S : 0;
  for (int j = tid; j < DD_HB; j += 256) hs[j] = 0;
  __syncthreads();
  u64 sb = 0;
  for (int v0 = lo + tid; v0 < hi; v0 += 256 * 8) {
    float xf[8];
#pragma unroll
    for (int q = 0; q < 8; ++q) { int v = v0 + q * 256; xf[q] = v < hi ? load_f(x, xdt, xoff + v) : 0.0f; }
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      int v = v0 + q * 256;
      if (v < hi) {
        int bad;
        u64 key = rank_key(xf[q], bias, bdt, boff + v, T, logits, &bad);
        /* exact floor(m / S) via the row reciprocal: qq <= m / S < qq + 3, then corrected */
        u64 m = (u64)DY_TOTAL * weight_of_key(key, mk, logits), qq, r;
        if (recip) { qq = __umul64hi(m, inv); r = m - qq * S; while (r >= S) { r -= S; ++qq; } }
        else { qq = m / S; r = m - qq * S; }
        crow[v] = (u32)qq; sc[v] = r; sb += qq;
        if (bl) atomicAdd(&hs[(r >> dlo) & (DD_HB - 1)], 1u);
      }
    }
  }
  sb = block_reduce64(sb, 0, sh);
  if (tid == 0) atomicAdd(&st[DD_SB], sb);
  __syncthreads();
  u32* gh = (u32*)(st + 16);
  if (bl) for (int j = tid; j < DD_HB; j += 256) if (hs[j]) atomicAdd(&gh[j], hs[j]);
  if (!dd_last(st, DD_C1)) return;
  /* ---- last block of the row ---- */
  const i64 remaining = (i64)DY_TOTAL - (i64)__ldcg(&st[DD_SB]);
  if (remaining < 0 || remaining >= (i64)DY_TOTAL) {
    for (int v = tid; v < V; v += 256) crow[v] = 0;
    for (int j = tid; j < DD_HB; j += 256) gh[j] = 0;
    if (tid == 0) { status[row] = DY_ST_ALLOC_INCONSISTENT; st[DD_SKIP] = 1; }
    return;
  }
  if (remaining == 0 || policy != 0) {
    for (int j = tid; j < DD_HB; j += 256) gh[j] = 0;
    if (tid == 0) {
      if (remaining > 0) crow[argmax] = __ldcg(&crow[argmax]) + (u32)remaining;
      status[row] = 0; st[DD_SKIP] = 1;
    }
    return;
  }
  if (tid == 0) { status[row] = 0; st[DD_REM] = (u64)remaining; st[DD_NEED] = (u64)remaining; }
  __syncthreads();
  if (bl == 0) {  /* S == 1: every remainder is 0, all tie */
    if (tid == 0) { st[DD_PREFIX] = 0; st[DD_MASK] = ~0ull; st[DD_LO] = 0; st[DD_DONE] = (u64)remaining >= (u64)V; }
    return;
  }
  dd_pick(st, bl, dlo);
}

/* the next 12-bit digit among remainders equal to prefix on the digits so far */
DC_FN bool dd_active(const u64* st) {
  return !st[DD_SKIP] && st[DD_REM] != 0;
}

extern "C" __global__ void __launch_bounds__(256) dd_pass(int V, int dt, u64* state, const u64* __restrict__ scratch,
                                                          int nrows) {
  __shared__ u32 hs[DD_HB];
  const int row = dc_grid_row(), tid = threadIdx.x;
  if (row >= nrows) return;
  u64* st = state + (i64)row * DD_RS;
  if (!dd_active(st) || st[DD_DONE] || st[DD_LO] == 0) return;
  const int hi = (int)st[DD_LO], dlo = hi > 12 ? hi - 12 : 0;
  const u64 prefix = st[DD_PREFIX], mask = st[DD_MASK];
  const u64* sc = scratch + (i64)row * V;
  const int lo = blockIdx.x * dt, vhi = min(V, lo + dt);
  for (int j = tid; j < DD_HB; j += 256) hs[j] = 0;
  __syncthreads();
  for (int v0 = lo + tid; v0 < vhi; v0 += 256 * 8) {
    u64 rb[8];
#pragma unroll
    for (int q = 0; q < 8; ++q) { int v = v0 + q * 256; rb[q] = v < vhi ? sc[v] : 0; }
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      int v = v0 + q * 256;
      if (v < vhi && (rb[q] & mask) == prefix) atomicAdd(&hs[(rb[q] >> dlo) & (DD_HB - 1)], 1u);
    }
  }
  __syncthreads();
  u32* gh = (u32*)(st + 16);
  for (int j = tid; j < DD_HB; j += 256) if (hs[j]) atomicAdd(&gh[j], hs[j]);
  if (!dd_last(st, DD_C2)) return;
  dd_pick(st, hi, dlo);
}

/* ties on the full remainder: per-tile counts of remainders == prefix */
extern "C" __global__ void __launch_bounds__(256) dd_tiecnt(int V, int dt, int ntiles, u64* state,
    const u64* __restrict__ scratch, u32* tile_eq, int nrows) {
  __shared__ DcShared sh;
  const int row = dc_grid_row(), tid = threadIdx.x;
  if (row >= nrows) return;
  u64* st = state + (i64)row * DD_RS;
  if (!dd_active(st) || st[DD_DONE]) return;
  const u64 prefix = st[DD_PREFIX];
  const u64* sc = scratch + (i64)row * V;
  const int lo = blockIdx.x * dt, hi = min(V, lo + dt);
  u64 c = 0;
  for (int v = lo + tid; v < hi; v += 256) c += sc[v] == prefix;
  c = block_reduce64(c, 0, sh);
  if (tid == 0) tile_eq[(i64)row * ntiles + blockIdx.x] = (u32)c;
}

/* +1 ticket for each selected remainder: (r & mask) > prefix, or == prefix
 * and (whole bin taken, or among the first `need` equal ones by id) */
extern "C" __global__ void __launch_bounds__(256) dd_mark(int V, int dt, int ntiles, u64* state,
    const u64* __restrict__ scratch, const u32* tile_eq, u32* __restrict__ counts, int nrows) {
  __shared__ DcShared sh;
  const int row = dc_grid_row(), tid = threadIdx.x;
  if (row >= nrows) return;
  u64* st = state + (i64)row * DD_RS;
  if (!dd_active(st)) return;
  const u64 prefix = st[DD_PREFIX], mask = st[DD_MASK];
  const bool done = st[DD_DONE] != 0;
  const u64* sc = scratch + (i64)row * V;
  u32* crow = counts + (i64)row * V;
  const int lo = blockIdx.x * dt, hi = min(V, lo + dt);
  if (done) {
    for (int v0 = lo + tid; v0 < hi; v0 += 256 * 8) {
      u64 rb[8];
#pragma unroll
      for (int q = 0; q < 8; ++q) { int v = v0 + q * 256; rb[q] = v < hi ? sc[v] : 0; }
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        int v = v0 + q * 256;
        if (v < hi && (rb[q] & mask) >= prefix) crow[v] += 1;
      }
    }
    return;
  }
  const int need = (int)st[DD_NEED];
  int base = 0;
  for (int t = 0; t < (int)blockIdx.x; ++t) base += (int)tile_eq[(i64)row * ntiles + t];
  const int n = hi - lo, chunk = (n + 255) / 256, a = lo + min(n, tid * chunk), b = lo + min(n, (tid + 1) * chunk);
  int cnt = 0;
  for (int v = a; v < b; ++v) cnt += sc[v] == prefix;
  int tot; int r = base + block_excl_scan(cnt, &tot, sh);
  for (int v = a; v < b; ++v) {
    const u64 m = sc[v] & mask;
    if (m > prefix) crow[v] += 1;
    else if (m == prefix) { if (r < need) crow[v] += 1; ++r; }
  }
}
#include "verify_lazy.cuh"
#include "verify_lazy2.cuh"
#include "verify_fused.cuh"
#include "propose_fast.cuh"
#include "propose_wide.cuh"
#include "propose_packed.cuh"
#include "dense_alloc.cuh"
#include "dense_alloc2.cuh"
