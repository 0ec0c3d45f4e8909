/* ========================================================================
 * allocate / propose with top_p / min_p on a dense support (docs/semantics.md
 * "Filtered support"; dy_allocate_filtered_row / dy_propose_filtered_row of the core).
 * The kept set of a row is that of a target row of verify(logits=True) with the
 * same parameters, so the call runs, over its B rows as B requests of depth 0:
 *
 *  logits_max, logits_hist, logits_resolve (logits_*.cuh): each row's record
 *                 (status, zmax, min-p threshold, cuts);
 *  filter_mask    grid (tiles, B): xm, the row with every token off the kept set
 *                 (P_v = 0) replaced by -inf; a greedy row (T = 0, propose) or a row
 *                 whose record failed (NaN, +inf, no finite logit, an invalid
 *                 temperature) copied unchanged, so that the dense kernels find the
 *                 same status or argmax as the unfiltered call; every token of a row
 *                 whose top_p / min_p is invalid -inf;
 *  dense_max .. dense_mark (dense.cuh) over xm with the call's temperature, then
 *                 draw_rows for propose;
 *  filter_status  grid (ceil(B / 256)): a row whose top_p / min_p is invalid gets that
 *                 status (the dense kernels failed it closed: zero counts, token -1,
 *                 X_ZERO_MASS).
 *
 * Exactness: W_v depends on z_v and the row's largest z only; the largest logit is
 * always kept (P > 0 at the argmax), so over xm every kept token has the weight of the
 * processed row and every other token weighs 0 (-inf): the dense allocation of xm is
 * dy_alloc_weights over the processed row's weights, as on the CPU.  xm has x's dtype
 * (a kept token's bits unchanged).
 * ====================================================================== */
#ifndef DYADIC_KERNELS_LOGITS_FILTER_CUH
#define DYADIC_KERNELS_LOGITS_FILTER_CUH

/* The status of a row's top_p / min_p (dense support: top_k 0), as
 * dy_allocate_filtered_row checks them before the row; 0 when valid. */
DC_FN int lf_params_status(const u32* topp, const u32* minp, int b) {
  return dc_filt_status(dc_filt(1, 0, topp, minp, b, 0));
}

extern "C" __global__ void __launch_bounds__(256) filter_mask(
    const void* x, int dt, const double* temp, const i64* topk, const u32* topp,
    const u32* minp, int B, int V, int tile, const u64* rec, const u64* vtab, void* xm) {
  __shared__ uint64_t stab[4][256];
  __shared__ u64 spc[LG_TE];  /* the row's P column (lg_load_pcol) */
  const int b = dc_grid_row(), tid = threadIdx.x;
  if (b >= B) return;
  const int lo = blockIdx.x * tile, hi = min(V, lo + tile);
  const i64 off = (i64)b * V;
  const u32 ninf = dt == 0 ? 0xFF800000u : dt == 1 ? 0xFC00u : 0xFF80u;
  auto put = [&](int v, u32 bits) {
    if (dt == 0) ((u32*)xm)[off + v] = bits;
    else ((u16*)xm)[off + v] = (u16)bits;
  };
  auto copy = [&](int v) {
    if (dt == 0) ((u32*)xm)[off + v] = ((const u32*)x)[off + v];
    else ((u16*)xm)[off + v] = ((const u16*)x)[off + v];
  };
  if (lf_params_status(topp, minp, b)) {  /* block-uniform */
    for (int v = lo + tid; v < hi; v += blockDim.x) put(v, ninf);
    return;
  }
  const LgReq q = lg_req(temp, topk, topp, minp, 0, 0, b, 0);
  const u64* rc = rec + (i64)b * LG_REC;
  if (q.code || q.greedy || rc[LG_ST] != DY_ST_OK) {
    for (int v = lo + tid; v < hi; v += blockDim.x) copy(v);
    return;
  }
  const LgRow row = {x, dt, off, q.temp, 0, vtab + (i64)b * LG_TABW, (u32)rc[LG_WIN]};
  const LgCut c = lg_cut_of(rc);
  /* a cut row: only tokens at or above low can be kept (lg_low_key); otherwise the
   * exponential's table and the row's P column in shared memory */
  const u32 low = lg_low_key(row, c, V);
  const bool pcol = low == 0;
  const LgTab tab = pcol ? lg_load_table(stab) : LG_GTAB;
  if (pcol) lg_load_pcol(row, c, spc);
  lg_tile(row, lo, hi, [&](int v, u32 xb) {
    const bool kept = dc_fkey(xb) >= low
        && (pcol ? lg_p_col(row, c, v, xb, spc, tab) : lg_p_of(row, c, v, xb, tab)) != 0;
    if (!kept) put(v, ninf);
    else if (dt == 0) put(v, xb);
    else if (dt == 2) put(v, xb >> 16);
    else copy(v);
  });
}

extern "C" __global__ void __launch_bounds__(256) filter_status(
    const u32* topp, const u32* minp, int B, int* status) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= B) return;
  const int code = lf_params_status(topp, minp, b);
  if (code) status[b] = code;
}

#endif
