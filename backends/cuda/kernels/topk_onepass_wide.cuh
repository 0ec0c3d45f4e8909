/* topk_onepass_wide: top-k allocate / propose for K <= 32 with wide tiles (after
 * topk_onepass.cuh; uses pk_select_map, pk2_last).
 *
 * The layout and the last block are topk_onepass's (grid (R, B), PK_NT threads,
 * R * PK_CAP candidate slots per row, the last block of a row found by an
 * atomic counter merges them and runs the tail).  The tile phase differs:
 *  - a tile holds up to PK_NT * PW_EPT = 8192 ids (topk_onepass: 4096), so a row
 *    has half as many blocks, each with the same chain of barriers: at B = 64
 *    the per-block chain, not the bytes, set topk_onepass's time (about 8 waves of
 *    blocks at V = 129280);
 *  - element q of a thread is index pw_ix(q) = ((q / 8) * PK_NT + tid) * 8 +
 *    q % 8 of the tile: groups of 8 consecutive ids, one 16-byte load per
 *    group for 16-bit inputs (two for float32) when the row is 16-byte
 *    aligned (vec), else 8 scalar loads; the loads are issued before the
 *    row's temperature is read;
 *  - coarse keys are u32 (narrow rows: logits without bias with 2**-700 <= T
 *    <= 2**800, where the float order key of x ranks as the exact key, or
 *    probabilities, key mag + 1): PW_EPT registers per thread, u32 compares;
 *  - a bad element (NaN / +inf logits, a bad weight) sets a per-thread flag;
 *    only a thread that has one looks for its first bad id again.
 * The host launches it only without bias (or for probabilities), so every row
 * is narrow unless its temperature lies outside that range; such a row takes
 * the exact radix select of common.cuh over its tile (keys from x again)
 * and writes its K best in id order: slower, the same result.
 * Exactness: the selection over a tile is pk_select_map's (the K best by
 * (key desc, id asc), or all survivors coarse >= t unranked when they fit
 * PK_CAP; the element map only says which register holds which id), and the
 * merge / tail are pk2_last's, so the output equals topk_select's bit for bit.
 * Wider tiles and a running bound over sub-tiles were slower on the H200. */
#ifndef DYADIC_KERNELS_TOPK_ONEPASS_WIDE_CUH
#define DYADIC_KERNELS_TOPK_ONEPASS_WIDE_CUH

#define PW_EPT 16  /* ids per thread: 2 groups of 8 consecutive ids */

DC_FN int pw_ix(int q) { return ((q >> 3) * PK_NT + (int)threadIdx.x) * 8 + (q & 7); }

/* float bits of a 16-bit element (dt 1: float16, exact conversion; 2: bfloat16) */
DC_FN u32 pw_bits16(u32 h, int dt) {
  if (dt == 2) return h << 16;
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((u16)h)); return __float_as_uint(f);
}

/* The float bits of the 8 elements [i0, i0 + 8) of the row at x + off (i0 + 8 <= n
 * when vec; else each element i0 + j < n is loaded alone, the others are 0). */
DC_FN void pw_load8(const void* x, int xdt, i64 off, int i0, int n, bool vec, u32 (&b)[8]) {
  if (vec && i0 + 8 <= n) {
    if (xdt == 0) {
      const uint4* p = (const uint4*)((const u32*)x + off + i0);
      const uint4 u = __ldg(p), w = __ldg(p + 1);
      b[0] = u.x; b[1] = u.y; b[2] = u.z; b[3] = u.w; b[4] = w.x; b[5] = w.y; b[6] = w.z; b[7] = w.w;
    } else {
      const uint4 u = __ldg((const uint4*)((const u16*)x + off + i0));
      const u32 h[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) { b[2 * j] = pw_bits16(h[j] & 0xFFFFu, xdt); b[2 * j + 1] = pw_bits16(h[j] >> 16, xdt); }
    }
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) b[j] = i0 + j < n ? __float_as_uint(load_f(x, xdt, off + i0 + j)) : 0u;
  }
}

/* Narrow coarse key of one element: fast logits (float order key) or probabilities
 * (mag + 1); *bad (when not null): its status, as rank_key's (NaN / +inf by bits). */
DC_FN u32 pw_key(u32 b, int logits, int* bad) {
  if (logits) {
    if (bad) *bad = (b & 0x7FFFFFFFu) > 0x7F800000u ? DY_ST_X_NAN : (b == 0x7F800000u ? DY_ST_X_POSINF : 0);
    return pk_fkey(__uint_as_float(b));
  }
  if (bad) *bad = dy_weight_bits_status(b);
  return (b & 0x7FFFFFFFu) + 1u;
}

/* pw_key's status != 0, cheaper */
DC_FN bool pw_bad(u32 b, int logits) {
  if (logits) return (b & 0x7FFFFFFFu) >= 0x7F800000u && b != 0xFF800000u;
  return !(b - 1u < 0x7F7FFFFFu || (b & 0x7FFFFFFFu) == 0);
}

/* A row with 64-bit keys (T outside the fast range, or bias): the exact radix select
 * over the tile [lo, lo + n) of the row at x + xoff (keys from x again), the K best
 * written to the candidate slots ck / ci in id order, the thread's first bad element
 * into *mybad (when it is still NONE_BAD).  Returns the slots used, min(K, n). */
DC_FN int pw_exact_tile(const void* x, int xdt, const void* bias, int bdt, i64 xoff, i64 boff,
                        int lo, int n, int K, double T, int logits, u64* ck, int* ci, u64* mybad,
                        DcShared& sh) {
  auto at = [&](int i) -> u64 {
    int bad;
    return rank_key(load_f(x, xdt, xoff + lo + i), bias, bdt, boff + lo + i, T, logits, &bad);
  };
  for (int i = threadIdx.x; i < n; i += PK_NT) {
    int bad;
    rank_key(load_f(x, xdt, xoff + lo + i), bias, bdt, boff + lo + i, T, logits, &bad);
    if (bad && *mybad == NONE_BAD) *mybad = ((u64)(lo + i) << 8) | (u64)bad;
  }
  const int kk = K < n ? K : n;
  const DcSel s = block_select(at, n, kk, sh, 56);
  block_compact([&](int i) { return sel_has(s, at(i), i); },
                [&](int i, int rnk) { ck[rnk] = at(i); ci[rnk] = lo + i; }, n, sh);
  return kk;
}

extern "C" __global__ void __launch_bounds__(PK_NT, 2) topk_onepass_wide(
    const void* x, int xdt, const void* bias, int bdt, int bias_rows, const double* temp,
    int logits, int greedy_ok, int V, int K, int R, int chunk, int policy, int do_draw,
    const void* kseed, const void* kgen, const void* krnd, const void* kpos, int kfmt,
    u64* cand_key, int* cand_id, u64* blk_bad, u32* counters,
    int* tokens, u32* counts, int* ids, int* status, int vec, int nrows,
    int filt, const i64* ftopk, const u32* ftopp, const u32* fminp) {
  __shared__ DcShared sh;
  __shared__ PkShared ps;
  const int row = dc_grid_row(), r = blockIdx.x, tid = threadIdx.x;
  if (row >= nrows) return;
  int pk_prof = row == 0 && r == 0 ? 0 : -1;
  PK_STAMP(0);
  const i64 xoff = (i64)row * V;
  const int lo = r * chunk, n = min(V, lo + chunk) - lo;
  /* the tile's loads first: in flight while the row's temperature is read */
  u32 c[PW_EPT];
#pragma unroll
  for (int g = 0; g < PW_EPT / 8; ++g) {
    u32 b[8];
    pw_load8(x, xdt, xoff + lo, pw_ix(8 * g), n, vec != 0, b);
#pragma unroll
    for (int j = 0; j < 8; ++j) c[8 * g + j] = b[j];
  }
  bool greedy; const double T = row_temp(temp, row, greedy_ok, &greedy);
  const i64 boff = bias_rows > 1 ? xoff : 0;
  const bool fast = pk_fast_row(logits, bias, T);
  const bool narrow = fast || !logits;
  if (tid == 0) ps.bad = NONE_BAD;
  u64* ck = cand_key + ((i64)row * R + r) * PK_CAP;
  int* ci = cand_id + ((i64)row * R + r) * PK_CAP;
  u64 mybad = NONE_BAD;
  int used;
  if (narrow) {
    bool anybad = false;
#pragma unroll
    for (int q = 0; q < PW_EPT; ++q) {  /* float bits -> coarse keys, in place */
      anybad |= pw_ix(q) < n && pw_bad(c[q], logits);
      c[q] = pw_key(c[q], logits, 0);
    }
    if (anybad) {  /* the thread's first bad element (ids increase with q) */
#pragma unroll 1
      for (int q = 0; q < PW_EPT; ++q) {
        const int i = pw_ix(q);
        int bad = 0;
        if (i < n) pw_key(__float_as_uint(load_f(x, xdt, xoff + lo + i)), logits, &bad);
        if (bad) { mybad = ((u64)(lo + i) << 8) | (u64)bad; break; }
      }
    }
    auto key = [&](int q) -> u64 { return c[q]; };
    auto idf = [&](int q) { return lo + pw_ix(q); };
    auto at = [&](int i) -> u64 {
      return pw_key(__float_as_uint(load_f(x, xdt, xoff + lo + i)), logits, 0);
    };
    auto id_at = [&](int i) { return lo + i; };
    auto emit = [&](int rank, u64 k, int id, u64) { ck[rank] = k; ci[rank] = id; };
    auto emitd = [&](int slot, u64 k, int id) { ck[slot] = k; ci[slot] = id; };
    const int S = pk_select_map(c, [](int q) { return pw_ix(q); }, key, idf, at, at, id_at, n, K,
                                24, emit, ps, sh, pk_prof, PK_CAP, emitd);
    used = S >= 0 ? S : min(K, n);
  } else {
    used = pw_exact_tile(x, xdt, bias, bdt, xoff, boff, lo, n, K, T, logits, ck, ci, &mybad, sh);
  }
  if (!pk_tile_done(used, mybad, ck, ci, blk_bad, counters, row, R, r, ps, pk_prof)) return;
  pk2_last(row, R, K, fast, narrow, greedy, logits, T, policy, do_draw, kseed, kgen, krnd, kpos,
           kfmt, dc_filt(filt, ftopk, ftopp, fminp, row, K), cand_key, cand_id, blk_bad, tokens,
           counts, ids, status, ps, sh);
}

#endif

