/* logits_chain of verify(..., logits=True) (the pipeline and its records:
 * logits_common.cuh).  One block per request: in the CPU backend's order
 * (dy_verify_logits_row_host) num_drafts, the parameters, every target row 0..n
 * (TARGET_INVALID_VALUE, TARGET_ZERO_MASS), the draft ids and q rows (dc_draft_check),
 * q(d) > 0; then the acceptance chain on P_i(d_i) (dy_accept) or the argmax (greedy).
 * The records and the drafts are read by a thread each, P_i(d_i), T_i and the key by
 * warp 7 while the other warps check, and each position's acceptance (a pure function
 * of its P_i(d_i), T_i, q_i(d_i) and key) is decided by a thread of its own once the
 * request passed every check; thread 0 then walks the chain to its first
 * rejection (or failing draw), as the sequential chain does.  The residual / bonus row
 * goes to logits_residual, or to logits_one_launch's last block (res_row, -1 when none).
 * lg_chain_run is the block's work (logits_chain's, and block 0's of logits_one_launch). */
DC_FN void lg_chain_run(
    const void* x, int dt, const double* temp, const i64* topk, const u32* topp,
    const u32* minp, const unsigned char* g, const int* nd, int b, int k, int V,
    const int* draft, const u32* qc, const int* qi, int W, const void* kseed, const void* kgen,
    const void* krnd, const void* kpos, int kfmt, const u64* rec, const u64* vtab,
    int* res_row, int* accepted, int* tokens, int* status) {
  __shared__ u32 cq[64], idbits[8];
  __shared__ int rst[65], acode[64], aok[64], s_code;
  __shared__ u64 pd[64], pt[64];
  __shared__ DcKey skey;
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  const LgReq q = lg_req(temp, topk, topp, minp, g, nd, b, k);
  int* tok = tokens + (i64)b * (k + 1);
  const i64 qrow = (i64)b * k;
  const int n = q.n;
  const u64* rb = rec + (i64)b * (k + 1) * LG_REC;
  {
    u32 f = 0;
    for (int i = wid; !q.code && i < n; i += 8) {
      u32 c;
      f |= dc_draft_check(draft[qrow + i], qc, qi, W, V, qrow + i, &c);
      if (lane == 0) cq[i] = c;
    }
    if (lane == 0) idbits[wid] = f;
    for (int i = tid; !q.code && i <= n; i += blockDim.x) rst[i] = (int)rb[(i64)i * LG_REC + LG_ST];
    /* warp 7, after its checks (none while n <= 7): each position's P_i(d_i) and T_i and
     * the request's key, read while the other warps check, so that the acceptance below
     * waits on no load; used only once the request passed every check (each read is in
     * bounds whatever the checks find: rows 0..n-1, a logit at an id in [0, V), a table
     * entry at a slot lg_slot bounds) */
    if (wid == 7 && !q.code && !q.greedy) {
      for (int i = lane; i < n; i += 32) {
        const int d = draft[qrow + i];
        const u64* rc = rb + (i64)i * LG_REC;
        u64 P = 0;
        if (d >= 0 && d < V) {
          const i64 r = (i64)b * (k + 1) + i;
          const LgRow row = {x, dt, r * V, q.temp, 0, vtab + r * LG_TABW, (u32)rc[LG_WIN]};
          P = lg_p(row, lg_cut_of(rc), d);
        }
        pd[i] = P; pt[i] = rc[LG_T];
      }
      if (lane == 0) skey = load_key(kseed, kgen, krnd, kpos, kfmt, b);
    }
  }
  __syncthreads();
  if (tid == 0) {
    res_row[b] = -1;
    int code = q.code;
    for (int i = 0; i <= n && !code; ++i) code = rst[i];
    u32 ids = 0;
    for (int w = 0; w < 8; ++w) ids |= idbits[w];
    if (!code && (ids & 2u)) code = DY_ST_DRAFT_OUT_OF_RANGE;
    if (!code && !q.greedy && (ids & 1u)) code = DY_ST_Q_INVALID;
    for (int i = 0; i < n && !code && !q.greedy; ++i)
      if (cq[i] == 0) code = DY_ST_Q_ZERO_AT_DRAFT;
    for (int i = 0; i <= k; ++i) tok[i] = -1;
    accepted[b] = 0;
    if (code) status[b] = code;
    s_code = code;
  }
  __syncthreads();
  if (s_code) return;  /* block-uniform: nothing is read at a draft id */
  if (tid < n) {  /* position tid's acceptance: every draft id is in [0, V) */
    const int i = tid;
    const u64* rc = rb + (i64)i * LG_REC;
    const int d = draft[qrow + i];
    int ok = 0, c = DY_ST_OK;
    if (q.greedy) ok = d == (int)rc[LG_ARG];
    else c = dy_accept(pd[i], pt[i], cq[i], skey.seed, skey.gen, skey.rnd, skey.pos + i, &ok);
    acode[i] = c; aok[i] = ok;
  }
  __syncthreads();
  if (tid != 0) return;
  for (int i = 0; i < n; ++i) {
    if (acode[i]) {
      for (int a = 0; a <= k; ++a) tok[a] = -1;
      accepted[b] = 0; status[b] = acode[i];
      return;
    }
    if (aok[i]) { tok[i] = draft[qrow + i]; continue; }
    accepted[b] = i;
    if (q.greedy) tok[i] = (int)rb[(i64)i * LG_REC + LG_ARG];
    else res_row[b] = i;
    status[b] = DY_ST_OK;
    return;
  }
  accepted[b] = n;
  if (q.greedy) tok[n] = (int)rb[(i64)n * LG_REC + LG_ARG];
  else res_row[b] = n;
  status[b] = DY_ST_OK;
}

extern "C" __global__ void __launch_bounds__(256) logits_chain(
    const void* x, int dt, const double* temp, const i64* topk, const u32* topp,
    const u32* minp, const unsigned char* g, const int* nd, int B, int k, int V,
    const int* draft, const u32* qc, const int* qi, int W, const void* kseed, const void* kgen,
    const void* krnd, const void* kpos, int kfmt, const u64* rec, const u64* vtab,
    int* res_row, int* accepted, int* tokens, int* status) {
  const int b = dc_grid_row();
  if (b >= B) return;
  lg_chain_run(x, dt, temp, topk, topp, minp, g, nd, b, k, V, draft, qc, qi, W, kseed, kgen, krnd,
               kpos, kfmt, rec, vtab, res_row, accepted, tokens, status);
}
