/* logits_one_launch of verify(..., logits=True) (the pipeline and its records:
 * logits_common.cuh): logits_chain and logits_residual in one launch, for small batches
 * (routes.logits_one_launch_tile; the same results and statuses bit for bit).  Grid
 * (1 + (k + 1) nrt, B): block 0 of request b runs logits_chain's block (lg_chain_run: the
 * checks, the acceptance chain, the outputs and the residual / bonus row in res_row[b],
 * all before its arrival); block 1 + i nrt + t runs logits_residual's tile pass
 * (lg_res_pass) of row i, tile t, for EVERY row i <= n of the request: a row's tile sums
 * and kept lists do not depend on the chain (R_v of row i < n is a function of row i and
 * q_i, the bonus row's P_v of row n), so they are summed while block 0 decides.  A row
 * beyond the request's count, a greedy request and one with invalid parameters read
 * nothing and only arrive.  The last of the request's 1 + (k + 1) nrt blocks
 * (dc_elect_last) reads res_row[b] and, when the chain left a row, draws its token from
 * that row's tile sums and kept lists (lg_res_draw), as logits_residual's last block
 * does.  Scratch: rpart / rl_* a slot per (request, row, tile).  Every read of a pass is
 * in bounds whatever the chain finds (rows 0..n; a point-mass draft or a support id is
 * used only inside [lo, hi); a record's cut id only inside [0, V)). */
extern "C" __global__ void __launch_bounds__(256, 3) logits_one_launch(
    const void* x, int dt, const double* temp, const i64* topk, const u32* topp,
    const u32* minp, const unsigned char* g, const int* nd, int B, int k, int V, int nrt,
    int rt, const int* draft, const u32* qc, const int* qi, int W, const void* kseed,
    const void* kgen, const void* krnd, const void* kpos, int kfmt, const u64* rec,
    const u64* vtab, int* res_row, u64* rpart, u32* rcnt, int* accepted, int* tokens,
    int* status, u64* rl_w, u32* rl_id, u32* rl_n) {
  __shared__ LgResShared S;
  const int xb = blockIdx.x, b = dc_grid_row(), k1 = k + 1;
  if (b >= B) return;
  const LgReq q = lg_req(temp, topk, topp, minp, g, nd, b, k);
  if (xb == 0) {
    lg_chain_run(x, dt, temp, topk, topp, minp, g, nd, b, k, V, draft, qc, qi, W, kseed, kgen,
                 krnd, kpos, kfmt, rec, vtab, res_row, accepted, tokens, status);
  } else if (!q.code && !q.greedy && (xb - 1) / nrt <= q.n) {
    const int i = (xb - 1) / nrt, tile = (xb - 1) % nrt, lo = tile * rt;
    const LgRes r = lg_res_row(S, x, dt, q, b, i, k, V, draft, qc, qi, W, rec, vtab);
    lg_res_pass(S, r, lo, min(V, lo + rt), ((i64)b * k1 + i) * nrt + tile, rpart, rl_w, rl_id,
                rl_n);
  }
  if (!dc_elect_last(&rcnt[b], (u32)(1 + k1 * nrt), &S.is_last)) return;
  const int i = __ldcg(&res_row[b]);  /* block 0's, ordered by the election */
  if (i < 0) return;
  const i64 s0 = ((i64)b * k1 + i) * nrt;
  const LgRes r = lg_res_row(S, x, dt, q, b, i, k, V, draft, qc, qi, W, rec, vtab);
  lg_res_draw(S, r, rpart + 2 * s0, s0, nrt, rt, V, rl_w, rl_id, rl_n, kseed, kgen, krnd, kpos,
              kfmt, b, i, k, accepted, tokens, status);
}
