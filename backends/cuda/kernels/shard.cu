/* Per-shard work of dyadic.distributed on the device: the kernels behind
 * backends/cuda/cupy/shard.py, which mirrors backends/cpu/_shard.pyx function
 * by function (same arguments, same results bit for bit).
 *
 * Its own NVRTC module (not part of kernels.cu), compiled with the options of
 * the kernel module (--fmad=false; CuPy adds -ftz=true, so no float32
 * arithmetic, conversion or comparison appears here: dy_f2d of the core).
 * Every scalar operation is the shared integer core: dyadic_core.h and
 * dyadic_shard.h, the code the CPU backend compiles.
 *
 * Two kinds of kernels:
 *  - per-row serial steps on gathered data (merge, checks, acceptance,
 *    correction pick, tickets, the sparse q expansion): one thread per row
 *    calling the very DY_FUNC of dyadic_shard.h that the CPU calls;
 *  - vocabulary passes (top-k, target summary, dense weights, residual mass,
 *    residual search): one block of SH_THREADS threads per row (dense
 *    weights: several blocks per row, each thread the header's loop over one
 *    contiguous segment).  Their results are order-independent:
 *    integer sums of exact limbs, maxima and minima of integers (the lowest
 *    id among equal keys), an exact radix select of 64-bit keys, and a
 *    first-exceeding search on exact 128-bit prefix sums, so any thread
 *    layout gives the CPU's bits.
 *
 * Memory safety: a shard outside [0, vocab) gives DY_ST_SHARD_INVALID before
 * anything is read; draft ids, sparse q ids and draw positions are
 * bounds-checked before they index memory (a row out of range fails closed:
 * a status, or nothing written but the defaults).
 */
#include "dyadic_shard.h"

/* the core's types (NVRTC: unsigned long long; nvcc on Linux: unsigned long) */
typedef uint64_t u64;
typedef uint32_t u32;
typedef int64_t i64;

#define SH_THREADS 256
#define SH_WARPS (SH_THREADS / 32)

/* ------------------------------------------------------------- block reductions
 * Every thread of the block calls them (uniform control flow) and gets the result.
 * ws: SH_WARPS + 1 words of shared memory, reused after the trailing barrier. */
__device__ __forceinline__ u64 sh_sum64(u64 v, u64* ws) {
  for (int o = 16; o; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) ws[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    u64 t = 0;
    for (int w = 0; w < SH_WARPS; w++) t += ws[w];
    ws[SH_WARPS] = t;
  }
  __syncthreads();
  const u64 r = ws[SH_WARPS];
  __syncthreads();
  return r;
}

__device__ __forceinline__ u64 sh_max64(u64 v, u64* ws) {
  for (int o = 16; o; o >>= 1) {
    const u64 w = __shfl_down_sync(0xffffffffu, v, o);
    v = w > v ? w : v;
  }
  if ((threadIdx.x & 31) == 0) ws[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    u64 t = ws[0];
    for (int w = 1; w < SH_WARPS; w++) t = ws[w] > t ? ws[w] : t;
    ws[SH_WARPS] = t;
  }
  __syncthreads();
  const u64 r = ws[SH_WARPS];
  __syncthreads();
  return r;
}

__device__ __forceinline__ u64 sh_min64(u64 v, u64* ws) {
  for (int o = 16; o; o >>= 1) {
    const u64 w = __shfl_down_sync(0xffffffffu, v, o);
    v = w < v ? w : v;
  }
  if ((threadIdx.x & 31) == 0) ws[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    u64 t = ws[0];
    for (int w = 1; w < SH_WARPS; w++) t = ws[w] < t ? ws[w] : t;
    ws[SH_WARPS] = t;
  }
  __syncthreads();
  const u64 r = ws[SH_WARPS];
  __syncthreads();
  return r;
}

/* Exclusive prefix sum of one u32 per thread in thread order; *total = the block's sum.
 * ws: SH_WARPS + 1 words of shared memory. */
__device__ __forceinline__ u32 sh_scan32(u32 v, u32* ws, u32* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  u32 inc = v;
  for (int o = 1; o < 32; o <<= 1) {
    const u32 t = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += t;
  }
  if (lane == 31) ws[warp] = inc;
  __syncthreads();
  if (threadIdx.x == 0) {
    u32 acc = 0;
    for (int w = 0; w < SH_WARPS; w++) {
      const u32 t = ws[w];
      ws[w] = acc;
      acc += t;
    }
    ws[SH_WARPS] = acc;
  }
  __syncthreads();
  const u32 r = ws[warp] + inc - v;
  *total = ws[SH_WARPS];
  __syncthreads();
  return r;
}

/* The float32 bits of a float as an unsigned word. */
__device__ __forceinline__ u32 sh_bits(const float* p, u32 i) { return ((const u32*)p)[i]; }

/* ------------------------------------------------------------------ top-k
 * dy_shard_topk_row of one row per block: payload row (status, k x bits, (k bias bits,)
 * k global ids; unused entries -1).  The row's z keys are computed once into
 * keys[row * n ...] (uint64 workspace [B, n]); the first NaN / +inf z (lowest id)
 * gives the status; the kk = min(k_row, n) best keys by (key desc, id asc) are found
 * by an exact radix select (8 bits a round) of the kk-th largest key and the count of
 * its ties to take (lowest ids first), then written in ascending id order by a block
 * compaction, as dy_shard_topk_row writes them. */
extern "C" __global__ void __launch_bounds__(SH_THREADS)
sh_topk(const float* __restrict__ x, const float* __restrict__ bias, int has_bias, int bias_rows,
        const double* __restrict__ temperature, const unsigned char* __restrict__ greedy, int k,
        u32 n, u32 offset, u32 vocab, int ncol, int* __restrict__ payload, u64* __restrict__ keys,
        int B) {
  __shared__ u64 red[SH_WARPS + 1];
  __shared__ u32 scan[SH_WARPS + 1];
  __shared__ u32 hist[256];
  __shared__ u64 s_prefix;
  __shared__ u32 s_need;
  const int b = blockIdx.x;
  if (b >= B) return;
  const u32 tid = threadIdx.x;
  const int width = 1 + k * ncol;
  int* row = payload + (i64)b * width;
  int* cx = row + 1;
  int* cb = row + 1 + k;
  int* cg = row + 1 + (ncol - 1) * k;
  for (int j = 1 + (int)tid; j < width; j += SH_THREADS) row[j] = -1;
  if (!dy_shard_valid(offset, n, vocab) || k < 1) {
    if (tid == 0) row[0] = DY_ST_SHARD_INVALID;
    return;
  }
  const u32 kk = greedy[b] ? 1u : (u32)k;
  const double temp = temperature[b];
  const float* xr = x + (i64)b * n;
  const float* br = has_bias ? bias + (i64)(bias_rows > 1 ? b : 0) * n : (const float*)0;
  u64* kr = keys + (i64)b * n;
  const double inf = dy_inf();
  /* keys, and the lowest id whose z is NaN or +inf */
  u64 bad = ~0ull;
  for (u32 v = tid; v < n; v += SH_THREADS) {
    const double z = dy_effective_logit(xr[v], br, v, temp);
    if (!(z < inf)) bad = v < bad ? v : bad;
    kr[v] = z != z ? 0ull : dy_order_key(z);
  }
  bad = sh_min64(bad, red);
  if (bad != ~0ull) {
    if (tid == 0) row[0] = dy_logit_status(dy_effective_logit(xr[bad], br, (u32)bad, temp));
    return;
  }
  /* radix select: prefix = the kk-th largest key, need = how many of its ties to take */
  const u32 m = kk < n ? kk : n;
  u64 thr = 0;
  u32 need = 0;
  if (m < n) {
    u64 prefix = 0, mask = 0;
    u32 nd = m;
    for (int sh = 56; sh >= 0; sh -= 8) {
      for (u32 t = tid; t < 256; t += SH_THREADS) hist[t] = 0;
      __syncthreads();
      for (u32 v = tid; v < n; v += SH_THREADS) {
        const u64 key = kr[v];
        if ((key & mask) == prefix) atomicAdd(&hist[(key >> sh) & 0xFFu], 1u);
      }
      __syncthreads();
      if (tid == 0) {
        u32 acc = 0;
        int t = 255;
        for (; t > 0; t--) {
          if (acc + hist[t] >= nd) break;
          acc += hist[t];
        }
        s_need = nd - acc;
        s_prefix = prefix | ((u64)t << sh);
      }
      __syncthreads();
      nd = s_need;
      prefix = s_prefix;
      mask |= 0xFFull << sh;
      __syncthreads();
    }
    thr = prefix;
    need = nd;
  }
  /* compaction in id order: every key > thr, and the first `need` keys == thr */
  u32 base = 0, ties = 0;
  for (u32 v0 = 0; v0 < n; v0 += SH_THREADS) {
    const u32 v = v0 + tid;
    u64 key = 0;
    u32 gt = 0, eq = 0;
    if (v < n) {
      key = kr[v];
      gt = m == n || key > thr;
      eq = m < n && key == thr;
    }
    u32 tot_eq, tot_sel;
    const u32 tie_rank = sh_scan32(eq, scan, &tot_eq);
    const u32 sel = gt | (eq && ties + tie_rank < need);
    const u32 pos = sh_scan32(sel, scan, &tot_sel);
    if (sel && base + pos < m) {
      const u32 o = base + pos;
      cx[o] = (int)sh_bits(xr, v);
      if (has_bias) cb[o] = (int)sh_bits(br, v);
      cg[o] = (int)(offset + v);
    }
    base += tot_sel;
    ties += tot_eq;
  }
  if (tid == 0) row[0] = DY_ST_OK;
}

/* ------------------------------------------------------------------ merge
 * One thread per row: dy_shard_merge_row on the gathered candidates
 * g int32 [S, B, 1 + k * ncol] (shards in id order), as _shard.pyx's merge. */
extern "C" __global__ void sh_merge(const int* __restrict__ g, int S, int B, int has_bias, int k,
                                    const double* __restrict__ temperature,
                                    const unsigned char* __restrict__ greedy, int policy,
                                    u32 vocab, u32 width, const u64* __restrict__ seed,
                                    const u32* __restrict__ gen, const u32* __restrict__ rnd,
                                    const u32* __restrict__ pos, int* __restrict__ tokens,
                                    u32* __restrict__ counts, int* __restrict__ ids,
                                    int* __restrict__ status, int* __restrict__ alloc_status,
                                    int* __restrict__ cand, u64* __restrict__ ws,
                                    u64 ws_words) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= B) return;
  const int ncol = has_bias ? 3 : 2, pw = 1 + k * ncol;
  const u32 m = (u32)(S * k);
  int* cx = cand + (i64)b * 3 * m;
  int* cb = cx + m;
  int* cg = cb + m;
  int st = 0;
  alloc_status[b] = 0;
  tokens[b] = -1;
  for (u32 j = 0; j < width; j++) {
    counts[(i64)b * width + j] = 0;
    ids[(i64)b * width + j] = -1;
  }
  for (int s = 0; s < S; s++) {
    const int v = g[((i64)s * B + b) * pw];
    if (v != 0) {
      st = v;
      break;
    }
  }
  status[b] = st;
  if (st) return;
  for (int s = 0; s < S; s++) {
    const int* r = g + ((i64)s * B + b) * pw;
    for (int j = 0; j < k; j++) {
      cx[s * k + j] = r[1 + j];
      cb[s * k + j] = has_bias ? r[1 + k + j] : 0;
      cg[s * k + j] = r[1 + (ncol - 1) * k + j];
    }
  }
  st = dy_shard_merge_row(cx, has_bias ? cb : (const int*)0, cg, m,
                          greedy[b] ? 1.0 : temperature[b], greedy[b], policy, vocab, width,
                          seed[b], gen[b], rnd[b], pos[b], &tokens[b], counts + (i64)b * width,
                          ids + (i64)b * width, ws + (u64)b * ws_words);
  if (st == DY_ST_X_ZERO_MASS || st == DY_ST_SHARD_INVALID) status[b] = st;
  else alloc_status[b] = st;
}

/* ------------------------------------------------------------------ dense weights
 * Dense propose: dy_shard_dense_weights of rows[b] != 0, grid (B, blocks per row), each
 * thread one contiguous segment of the row (the header's loop over that segment:
 * w_v = weight_from_gap(zmax - z_v) and the segment's limb sums), the block's limb sums
 * added to sums[b] (zeroed by the launcher; integer sums, so the order of the atomic
 * additions cannot change a bit).  Rows without a flag get w = 0 (sums stay 0).
 * zmax must be >= every z_v of a flagged row (the global maximum z): the core's
 * weight of a negative gap is outside its contract. */
extern "C" __global__ void __launch_bounds__(SH_THREADS)
sh_dense_weights(const float* __restrict__ x, const float* __restrict__ bias, int has_bias,
                 int bias_rows, const double* __restrict__ temperature,
                 const double* __restrict__ zmax, const unsigned char* __restrict__ rows, int B,
                 u32 n, u64* __restrict__ w, u64* __restrict__ sums) {
  __shared__ u64 red[SH_WARPS + 1];
  const int b = blockIdx.x;
  if (b >= B) return;
  const int brow = bias_rows > 1 ? b : 0;
  /* a bias row outside [0, bias_rows) fails closed: the row's weights stay 0 */
  const int on = rows[b] != 0 && !(has_bias && (bias_rows < 1 || brow >= bias_rows));
  const u64 threads = (u64)gridDim.y * SH_THREADS;
  const u64 len = ((u64)n + threads - 1) / threads;
  const u64 t = (u64)blockIdx.y * SH_THREADS + threadIdx.x;
  const u64 v0 = t * len < n ? t * len : n;
  const u64 v1 = v0 + len < n ? v0 + len : n;
  const float* xr = x + (i64)b * n;
  const float* br = has_bias && on ? bias + (i64)brow * n : (const float*)0;
  u64* wr = w + (i64)b * n;
  u64 part[2] = {0, 0};
  if (!on) {
    for (u64 v = v0; v < v1; v++) wr[v] = 0;
  } else if (v1 > v0) {
    dy_shard_dense_weights(xr + v0, br ? br + v0 : (const float*)0, temperature[b],
                           (u32)(v1 - v0), zmax[b], wr + v0, part);
  }
  const u64 hi = sh_sum64(part[0], red);
  const u64 lo = sh_sum64(part[1], red);
  if (threadIdx.x == 0 && (hi | lo)) {
    atomicAdd((unsigned long long*)&sums[2 * (i64)b], (unsigned long long)hi);
    atomicAdd((unsigned long long*)&sums[2 * (i64)b + 1], (unsigned long long)lo);
  }
}

/* ------------------------------------------------------------------ target summary
 * dy_shard_target_summary of one (request, position) per block (grid B * (k+1)):
 * f int64 [B, k+1, 9]; st int32 [B, k+1] (the caller keeps each row's first non-zero). */
extern "C" __global__ void __launch_bounds__(SH_THREADS)
sh_target_summary(const u32* __restrict__ bits, const i64* __restrict__ draft,
                  const u32* __restrict__ qshard, int has_q,
                  const unsigned char* __restrict__ greedy, int B, int K1, u32 n, u32 offset,
                  u32 vocab, i64* __restrict__ f, int* __restrict__ st) {
  __shared__ u64 red[SH_WARPS + 1];
  const int r = blockIdx.x;
  if (r >= B * K1) return;
  const int b = r / K1, i = r % K1, K = K1 - 1;
  i64* fr = f + (i64)r * DY_SHARD_SUMMARY;
  const i64 d = i < K ? draft[(i64)b * K + i] : -1;
  int status = DY_ST_OK;
  if (!dy_shard_valid(offset, n, vocab)) status = DY_ST_SHARD_INVALID;
  else if (d < -1 || d >= (i64)vocab) status = DY_ST_DRAFT_OUT_OF_RANGE;
  if (status) {
    if (threadIdx.x < DY_SHARD_SUMMARY) fr[threadIdx.x] = 0;
    if (threadIdx.x == 0) st[r] = status;
    return;
  }
  const u32* row = bits + (i64)r * n;
  const u32* q = has_q && i < K ? qshard + ((i64)b * K + i) * n : (const u32*)0;
  const int argmax = greedy[b] != 0;
  u64 hi = 0, lo = 0, qs = 0, bad = 0, best = 0;
  for (u32 v = threadIdx.x; v < n; v += SH_THREADS) {
    const u32 bv = row[v];
    const u32 inv = (u32)(bv > 0x3F800000u) & (u32)(bv != 0x80000000u);
    const u64 p = dy_target_fixed_fast(bv) & ((u64)inv - 1u);
    bad |= inv;
    hi += p >> 32;
    lo += p & 0xFFFFFFFFu;
    const u32 mag = bv & 0x7FFFFFFFu;
    best = mag > best ? mag : best;
    if (q) qs += q[v];
  }
  hi = sh_sum64(hi, red);
  lo = sh_sum64(lo, red);
  bad = sh_max64(bad, red);
  qs = sh_sum64(qs, red);
  u64 arg = ~0ull;
  if (argmax) {
    best = sh_max64(best, red);
    for (u32 v = threadIdx.x; v < n; v += SH_THREADS)
      if ((row[v] & 0x7FFFFFFFu) == (u32)best) {
        arg = v;
        break;
      }
    arg = sh_min64(arg, red);
  }
  if (threadIdx.x == 0) {
    fr[0] = (i64)bad;
    fr[1] = (i64)hi;
    fr[2] = (i64)lo;
    fr[3] = n && argmax ? (i64)best : -1;
    fr[4] = n && argmax ? (i64)(offset + (u32)arg) : -1;
    fr[5] = fr[6] = fr[7] = 0;
    if (d >= (i64)offset && d < (i64)offset + (i64)n) {
      const u32 bv = row[d - offset];
      const u64 p = dy_target_bits_valid(bv) ? dy_target_fixed_fast(bv) : 0;
      fr[5] = (i64)(p >> 32);
      fr[6] = (i64)(p & 0xFFFFFFFFu);
      if (q) fr[7] = (i64)q[d - offset];
    }
    fr[8] = (i64)qs;
    st[r] = DY_ST_OK;
  }
}

/* ------------------------------------------------------------------ verify (per row) */
extern "C" __global__ void sh_verify_check(const i64* __restrict__ gf, int S, int B, int K1,
                                           const u32* __restrict__ cd,
                                           const unsigned char* __restrict__ greedy,
                                           u64* __restrict__ total, u64* __restrict__ pd,
                                           int* __restrict__ best, int* __restrict__ status) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= B) return;
  const int K = K1 - 1;
  const u64 stride = (u64)B * K1 * DY_SHARD_SUMMARY;
  status[b] = dy_shard_verify_check(gf + (u64)b * K1 * DY_SHARD_SUMMARY, stride, (u32)S, (u32)K,
                                    cd + (i64)b * K, greedy[b], total + (i64)b * K1,
                                    pd + (i64)b * K, best + (i64)b * K1);
}

extern "C" __global__ void sh_verify_accept(const i64* __restrict__ draft, const u32* __restrict__ cd,
                                            const u64* __restrict__ total,
                                            const u64* __restrict__ pd, const int* __restrict__ best,
                                            const unsigned char* __restrict__ greedy,
                                            const u64* __restrict__ seed, const u32* __restrict__ gen,
                                            const u32* __restrict__ rnd, const u32* __restrict__ pos,
                                            int B, int K, int* __restrict__ accepted,
                                            int* __restrict__ tokens, int* __restrict__ draw_at,
                                            int* __restrict__ status) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= B) return;
  const int K1 = K + 1;
  status[b] = dy_shard_verify_accept(draft + (i64)b * K, cd + (i64)b * K, total + (i64)b * K1,
                                     pd + (i64)b * K, best + (i64)b * K1, (u32)K, greedy[b],
                                     seed[b], gen[b], rnd[b], pos[b], &accepted[b],
                                     tokens + (i64)b * K1, &draw_at[b]);
}

/* ------------------------------------------------------------------ residual (q rows)
 * The local q row (uint32 [n]) of request b at its draw position j = draw_at[b] for the
 * residual kernels, one block per row: qloc[b] = dy_shard_q_local of the sparse row
 * (global ids outside the shard skipped, a repeated id keeps its last count), rows
 * without a draw or at the bonus position left as they are (not read). */
extern "C" __global__ void __launch_bounds__(SH_THREADS)
sh_q_local(const int* __restrict__ draw_at, const u32* __restrict__ qc, const int* __restrict__ qi,
           int width, int B, int K, u32 offset, u32 n, u32* __restrict__ qloc) {
  const int b = blockIdx.x;
  if (b >= B) return;
  const int j = draw_at[b];
  if (j < 0 || j >= K) return;
  u32* out = qloc + (i64)b * n;
  for (u32 v = threadIdx.x; v < n; v += SH_THREADS) out[v] = 0;
  __syncthreads();
  if (threadIdx.x == 0) {
    const u32* c = qc + ((i64)b * K + j) * width;
    const int* id = qi + ((i64)b * K + j) * width;
    for (int e = 0; e < width; e++) {
      const i64 g = id[e];
      if (g >= (i64)offset && g < (i64)offset + (i64)n) out[g - offset] = c[e];
    }
  }
}

/* The q row of request b at position j for the residual kernels (NULL: q = 0 there).
 * qmode 0: none, 1: dense q_dense [B, K, W] read at columns [q_offset, q_offset + n),
 * 2: the expanded sparse row qloc [B, n]. */
__device__ __forceinline__ const u32* sh_q_row(int qmode, const u32* qd, u64 W, u64 q_offset,
                                               const u32* qloc, int b, int j, int K, u32 n) {
  if (j >= K || n == 0) return (const u32*)0;
  if (qmode == 1) return qd + ((u64)b * K + j) * W + q_offset;
  if (qmode == 2) return qloc + (u64)b * n;
  return (const u32*)0;
}

/* dy_shard_residual_mass of one row per block: mass int64 [B, 3] = the limb sums of
 * R_v (dy_shard_residual_at: the residual at j < k, P at the bonus position j = k);
 * 0 for rows without a draw (and for a draw position outside [0, k]). */
extern "C" __global__ void __launch_bounds__(SH_THREADS)
sh_residual_mass(const u32* __restrict__ bits, const int* __restrict__ draw_at, int qmode,
                 const u32* __restrict__ qd, u64 W, u64 q_offset, const u32* __restrict__ qloc,
                 const u64* __restrict__ total, int B, int K, u32 n, i64* __restrict__ mass) {
  __shared__ u64 red[SH_WARPS + 1];
  const int b = blockIdx.x;
  if (b >= B) return;
  const int j = draw_at[b];
  if (j < 0 || j > K) {
    if (threadIdx.x < 3) mass[(i64)b * 3 + threadIdx.x] = 0;
    return;
  }
  const int K1 = K + 1, bonus = j == K;
  const u32* row = bits + ((i64)b * K1 + j) * n;
  const u32* q = sh_q_row(qmode, qd, W, q_offset, qloc, b, j, K, n);
  const u64 t = total[(i64)b * K1 + j];
  u64 s0 = 0, s1 = 0, s2 = 0;
  for (u32 v = threadIdx.x; v < n; v += SH_THREADS) {
    const dy_u128 r = dy_shard_residual_at(row[v], q, v, t, bonus);
    s0 += r.lo & 0xFFFFFFFFull;
    s1 += r.lo >> 32;
    s2 += r.hi;
  }
  s0 = sh_sum64(s0, red);
  s1 = sh_sum64(s1, red);
  s2 = sh_sum64(s2, red);
  if (threadIdx.x == 0) {
    mass[(i64)b * 3] = (i64)s0;
    mass[(i64)b * 3 + 1] = (i64)s1;
    mass[(i64)b * 3 + 2] = (i64)s2;
  }
}

/* dy_shard_residual_find of one row per block: token[b] = offset + the first local id
 * whose running sum of R_v exceeds x = x_hi 2**64 + x_lo (-1 when the shard's mass is
 * <= x, and for rows without a draw).  Each thread sums one contiguous segment exactly
 * (128 bits); thread 0 finds the segment whose exact prefix passes x; that segment's
 * thread scans it id by id. */
extern "C" __global__ void __launch_bounds__(SH_THREADS)
sh_residual_find(const u32* __restrict__ bits, const int* __restrict__ draw_at, int qmode,
                 const u32* __restrict__ qd, u64 W, u64 q_offset, const u32* __restrict__ qloc,
                 const u64* __restrict__ total, const u64* __restrict__ x_hi,
                 const u64* __restrict__ x_lo, int B, int K, u32 n, u32 offset,
                 i64* __restrict__ token) {
  __shared__ u64 seg_hi[SH_THREADS], seg_lo[SH_THREADS];
  __shared__ int s_seg;
  __shared__ u64 s_acc_hi, s_acc_lo;
  const int b = blockIdx.x;
  if (b >= B) return;
  const int j = draw_at[b];
  if (j < 0 || j > K) {
    if (threadIdx.x == 0) token[b] = -1;
    return;
  }
  const int K1 = K + 1, bonus = j == K;
  const u32* row = bits + ((i64)b * K1 + j) * n;
  const u32* q = sh_q_row(qmode, qd, W, q_offset, qloc, b, j, K, n);
  const u64 t = total[(i64)b * K1 + j];
  const dy_u128 x = dy_make128(x_hi[b], x_lo[b]);
  const u32 len = (n + SH_THREADS - 1) / SH_THREADS;
  const u32 v0 = threadIdx.x * len;
  const u32 v1 = v0 + len < n ? v0 + len : n;
  dy_u128 s = dy_from64(0);
  for (u32 v = v0; v < v1; v++) s = dy_add128(s, dy_shard_residual_at(row[v], q, v, t, bonus));
  seg_hi[threadIdx.x] = s.hi;
  seg_lo[threadIdx.x] = s.lo;
  __syncthreads();
  if (threadIdx.x == 0) {
    dy_u128 acc = dy_from64(0);
    int seg = -1;
    for (int e = 0; e < SH_THREADS; e++) {
      const dy_u128 next = dy_add128(acc, dy_make128(seg_hi[e], seg_lo[e]));
      if (dy_lt128(x, next)) {
        seg = e;
        break;
      }
      acc = next;
    }
    s_seg = seg;
    s_acc_hi = acc.hi;
    s_acc_lo = acc.lo;
    if (seg < 0) token[b] = -1;
  }
  __syncthreads();
  if ((int)threadIdx.x == s_seg) {
    dy_u128 acc = dy_make128(s_acc_hi, s_acc_lo);
    i64 found = -1;
    for (u32 v = v0; v < v1; v++) {
      acc = dy_add128(acc, dy_shard_residual_at(row[v], q, v, t, bonus));
      if (dy_lt128(x, acc)) {
        found = (i64)offset + v;
        break;
      }
    }
    token[b] = found;
  }
}

/* ------------------------------------------------------------------ correction, tickets */
extern "C" __global__ void sh_correction_pick(const i64* __restrict__ mass, int S, int B,
                                              const int* __restrict__ draw_at,
                                              const u64* __restrict__ seed,
                                              const u32* __restrict__ gen,
                                              const u32* __restrict__ rnd,
                                              const u32* __restrict__ pos,
                                              int* __restrict__ owner, u64* __restrict__ rel_hi,
                                              u64* __restrict__ rel_lo, int* __restrict__ status) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= B) return;
  owner[b] = -1;
  rel_hi[b] = 0;
  rel_lo[b] = 0;
  status[b] = 0;
  if (draw_at[b] < 0) return;
  dy_u128 rel;
  int o;
  status[b] = dy_shard_correction_pick(mass + (i64)b * 3, (u64)B * 3, (u32)S, seed[b], gen[b],
                                       rnd[b], pos[b] + (u32)draw_at[b], &o, &rel);
  owner[b] = o;
  rel_hi[b] = rel.hi;
  rel_lo[b] = rel.lo;
}

extern "C" __global__ void sh_proposal_tickets(const u64* __restrict__ seed,
                                               const u32* __restrict__ gen,
                                               const u32* __restrict__ rnd,
                                               const u32* __restrict__ pos, int B,
                                               i64* __restrict__ out) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= B) return;
  out[b] = (i64)dy_proposal_ticket(seed[b], gen[b], rnd[b], pos[b]);
}
