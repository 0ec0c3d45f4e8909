extern "C" __global__ void philox_counters(const u32* ctr, const u32* key, int rounds, int n, u32* out) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  u32 c[4] = {ctr[4 * i], ctr[4 * i + 1], ctr[4 * i + 2], ctr[4 * i + 3]};
  u32 k[2] = {key[2 * i], key[2 * i + 1]}, o[4];
  dy_philox4x32(c, k, rounds, o);
  for (int j = 0; j < 4; ++j) out[4 * i + j] = o[j];
}

/* ------------------------------------------------------------------------
 * draw: one block per row; counts [B, W], ids [B, W] or null.  A sparse row is
 * drawn only when it keeps the rules of a Dyadic row over [0, 2^24) (dy_draw_sparse_host
 * of the core: dc_sparse_entry_ok and a sum of 2^24; the draw does not know V): an
 * entry breaking a rule weighs 2^64 in the draw's own pass over the row, so the total
 * is 2^24 exactly when every entry keeps them, and any other total gives -1, never an
 * id read from the row.  A dense row gives the first id whose running count exceeds
 * the ticket, or -1. */
extern "C" __global__ void __launch_bounds__(256) draw_rows(
    const u32* counts, const int* ids, int W,
    const void* kseed, const void* kgen, const void* krnd, const void* kpos, int kfmt, int* tokens) {
  __shared__ DcShared sh;
  const int row = blockIdx.x;
  const u32* c = counts + (i64)row * W;
  DcKey key = load_key(kseed, kgen, krnd, kpos, kfmt, row);
  u32 r = key_ticket(key);
  int j;
  if (ids) {
    const int* ir = ids + (i64)row * W;
    j = block_draw(
        [&](int i) {
          const u32 ci = c[i];
          return dc_sparse_entry_ok(ir[i], ci, i ? ir[i - 1] : DY_PAD_ID, i == 0, (int)DY_MAX_VOCAB)
                     ? dy_from64(ci) : dy_make128(1, 0);
        },
        W,
        [&](dy_u128 tot, dy_u128* xo) {
          *xo = dy_from64(r);
          return tot.hi == 0 && tot.lo == (u64)DY_TOTAL;
        },
        sh);
  } else {
    j = block_draw([&](int i) { return dy_from64(c[i]); }, W,
                   [&](dy_u128 tot, dy_u128* xo) { *xo = dy_from64(r); return true; }, sh);
  }
  if (threadIdx.x == 0) tokens[row] = j < 0 ? -1 : (ids ? ids[(i64)row * W + j] : j);
}
