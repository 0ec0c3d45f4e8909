/* Per-shard work of the vocabulary-sharded propose / verify (dyadic.distributed).
 *
 * A shard is the contiguous id range [offset, offset + n) of a vocabulary of
 * size V.  Each function is the local part of one step of
 * dyadic/distributed/_core.py (docs/distributed.md explains the protocol):
 * what a rank computes from its own slice before a collective, or the pure
 * function of gathered data that every rank evaluates identically after one.
 * The results are those of the NumPy / reference code they replace, bit for
 * bit (tests/cpu/test_shard_kernels.py).
 *
 * Plain C in the style of dyadic_core.h (DY_FUNC, no heap allocation,
 * caller-provided workspaces), so NVRTC can compile it too.  Every id used to
 * index memory is bounds-checked: a bad shard (offset + n > V), a draft id
 * outside [0, V) or a candidate id outside [0, V) gives a status code, never
 * an out-of-range access.
 *
 * Compatibility guarantee: as dyadic_core.h.
 */
#ifndef DYADIC_SHARD_H
#define DYADIC_SHARD_H

#include "dyadic_core.h"

/* A shard [offset, offset + n) lies inside [0, vocab), vocab <= DY_MAX_VOCAB. */
DY_FUNC int dy_shard_valid(uint32_t offset, uint32_t n, uint32_t vocab) {
    return vocab >= 1u && vocab <= DY_MAX_VOCAB && offset <= vocab && n <= vocab - offset;
}

/* Heap of candidate positions by (key desc, id asc), full comparison (ids in any order);
 * the root is the worst. */
DY_FUNC int dy_shard_worse(uint64_t ka, uint32_t ia, uint64_t kb, uint32_t ib) {
    return ka < kb || (ka == kb && ia > ib);
}

DY_FUNC void dy_shard_heap_offer(uint64_t *hk, uint32_t *hid, uint32_t *hpos, uint32_t *size,
                                 uint32_t k, uint64_t key, uint32_t id, uint32_t pos) {
    uint32_t i;
    if (*size < k) {
        i = (*size)++;
    } else {
        if (!dy_shard_worse(hk[0], hid[0], key, id)) return;
        i = 0;
        /* sift the new entry down from the root */
        for (;;) {
            uint32_t l = 2 * i + 1, r = l + 1, w = i;
            uint64_t wk = key;
            uint32_t wi = id;
            if (l < k && dy_shard_worse(hk[l], hid[l], wk, wi)) {
                w = l;
                wk = hk[l];
                wi = hid[l];
            }
            if (r < k && dy_shard_worse(hk[r], hid[r], wk, wi)) w = r;
            if (w == i) break;
            hk[i] = hk[w];
            hid[i] = hid[w];
            hpos[i] = hpos[w];
            i = w;
        }
        hk[i] = key;
        hid[i] = id;
        hpos[i] = pos;
        return;
    }
    while (i && dy_shard_worse(key, id, hk[(i - 1) / 2], hid[(i - 1) / 2])) {
        uint32_t p = (i - 1) / 2;
        hk[i] = hk[p];
        hid[i] = hid[p];
        hpos[i] = hpos[p];
        i = p;
    }
    hk[i] = key;
    hid[i] = id;
    hpos[i] = pos;
}

/* Heapsort of uint64 values ascending. */
DY_FUNC void dy_sort_u64(uint64_t *a, uint32_t n) {
    uint32_t start, end;
    if (n < 2) return;
    for (start = n / 2; start-- > 0;) {
        uint32_t root = start;
        for (;;) {
            uint32_t c = 2 * root + 1;
            uint64_t t;
            if (c >= n) break;
            if (c + 1 < n && a[c + 1] > a[c]) c++;
            if (a[root] >= a[c]) break;
            t = a[root]; a[root] = a[c]; a[c] = t;
            root = c;
        }
    }
    for (end = n - 1; end > 0; end--) {
        uint64_t t = a[0];
        uint32_t root = 0;
        a[0] = a[end];
        a[end] = t;
        for (;;) {
            uint32_t c = 2 * root + 1;
            if (c >= end) break;
            if (c + 1 < end && a[c + 1] > a[c]) c++;
            if (a[root] >= a[c]) break;
            t = a[root]; a[root] = a[c]; a[c] = t;
            root = c;
        }
    }
}

/* ------------------------------------------------------------------ propose */

/* Workspace of dy_shard_topk_row, in uint64_t words. */
DY_FUNC uint64_t dy_shard_topk_ws_words(uint32_t k) { return (uint64_t)k + (k + 1u) / 2u; }

/* This shard's candidates of one row: the m = min(k, n) largest
 * z_v = (x_v + b_v) / temperature by (z desc, id asc), among them every
 * -inf when fewer than k are finite.  x, bias: float32 [n] (bias may be
 * NULL); 1 <= k.  Writes, for j < m in ascending id order, cx[j] / cb[j]
 * (when cb is not NULL) = the float32 bits of x / bias at the candidate and
 * cg[j] = its global id offset + v; entries m..k-1 are -1.  Returns the
 * status of the first z (lowest id) that is NaN or +inf (DY_ST_X_NAN /
 * DY_ST_X_POSINF, nothing written but the -1s), DY_ST_SHARD_INVALID for a
 * shard outside [0, vocab), else DY_ST_OK.  ws: dy_shard_topk_ws_words(k). */
DY_FUNC int dy_shard_topk_row(const float *x, const float *bias, double temperature, uint32_t n,
                              uint32_t offset, uint32_t vocab, uint32_t k, int32_t *cx,
                              int32_t *cb, int32_t *cg, uint32_t *m_out, uint64_t *ws) {
    const double inf = dy_inf();
    const uint32_t *xb = (const uint32_t *)x, *bb = (const uint32_t *)bias;
    uint64_t *hk = ws;
    uint32_t *hid = (uint32_t *)(ws + k);
    double zb[DY_BLOCK], thr = -inf;
    uint32_t v0, j, size = 0;
    *m_out = 0;
    for (j = 0; j < k; j++) {
        cx[j] = -1;
        if (cb) cb[j] = -1;
        cg[j] = -1;
    }
    if (!dy_shard_valid(offset, n, vocab) || k == 0) return DY_ST_SHARD_INVALID;
#if !defined(DY_CUDA)
    {
        /* without a bias: the block-maximum prefilter of the unsharded top-k (it
         * declines rows with NaN / +inf or without a finite z; those take the
         * exact path below) */
        double zmax;
        uint32_t arg;
        if (!bias && dy_topk_logits_host(x, temperature, n, k, hk, hid, &size, &zmax, &arg))
            goto done;
        size = 0;
    }
#endif
    for (v0 = 0; v0 < n; v0 += DY_BLOCK) {
        uint32_t nb = n - v0 < DY_BLOCK ? n - v0 : DY_BLOCK, bad = 0, hit = 0;
        dy_logits_block(x + v0, bias ? bias + v0 : DY_NULL, temperature, nb, zb);
        for (j = 0; j < nb; j++) {
            bad |= (uint32_t)!(zb[j] < inf);
            hit |= (uint32_t)(zb[j] > thr);
        }
        if (bad) {
            for (j = 0; j < nb; j++)
                if (!(zb[j] < inf)) return dy_logit_status(zb[j]);
        }
        if (!hit && size == k) continue;
        for (j = 0; j < nb; j++) {
            uint64_t key = dy_order_key(zb[j]);
            if (size < k || key > hk[0]) {
                dy_heap_offer(hk, hid, &size, k, key, v0 + j); /* ids ascending */
                if (size == k) thr = dy_key_value(hk[0]);
            }
        }
    }
#if !defined(DY_CUDA)
done:
#endif
    dy_sort_u32(hid, size);
    for (j = 0; j < size; j++) {
        uint32_t v = hid[j];
        cx[j] = (int32_t)xb[v];
        if (cb) cb[j] = (int32_t)bb[v];
        cg[j] = (int32_t)(offset + v);
    }
    *m_out = size;
    return DY_ST_OK;
}

/* Workspace of dy_shard_merge_row, in uint64_t words. */
DY_FUNC uint64_t dy_shard_merge_ws_words(uint32_t width) {
    return 3ull * width + 2ull * ((width + 1u) / 2u);
}

/* The merge every rank evaluates on the gathered candidates of one row: the
 * unsharded propose row (dy_propose_row with top_k = width) restricted to
 * candidates that contain the global top width.  cx, cb (NULL: no bias), cg:
 * m candidates (float32 bits of x and bias, global id; entries with
 * cg < 0 are padding and skipped; any order).  Selects the `width` best by
 * (z desc, id asc), z = (x + b) / temperature; greedy (temperature must be
 * passed as 1.0): the point mass at the best.  Otherwise weights
 * weight_from_gap(zmax - z), allocation by `policy`, draw with the proposal
 * ticket.  counts / ids: [width] (ascending ids, zero counts dropped, padded
 * with 0 / DY_PAD_ID).  Returns DY_ST_X_ZERO_MASS (no candidate or the best
 * z is -inf), DY_ST_SHARD_INVALID (a candidate id >= vocab or width out of
 * [1, vocab]), the allocation's status, or DY_ST_OK (*token set; -1 on
 * failure).  ws: dy_shard_merge_ws_words(width). */
DY_FUNC int dy_shard_merge_row(const int32_t *cx, const int32_t *cb, const int32_t *cg,
                               uint32_t m, double temperature, int greedy, int policy,
                               uint32_t vocab, uint32_t width, uint64_t seed,
                               uint32_t generation, uint32_t round, uint32_t position,
                               int32_t *token, uint32_t *counts, int32_t *ids, uint64_t *ws) {
    const double inf = dy_inf();
    uint64_t *hk = ws;
    uint64_t *sel = ws + width;
    uint64_t *w = ws + 2ull * width;
    uint32_t *hid = (uint32_t *)(ws + 3ull * width);
    uint32_t *hpos = hid + 2u * ((width + 1u) / 2u);
    uint32_t *idx = hpos; /* allocation workspace, once the positions are in sel */
    uint32_t j, size = 0, best = 0, argpos = 0, o;
    double zmax;
    int st;
    *token = -1;
    for (j = 0; j < width; j++) {
        counts[j] = 0;
        ids[j] = DY_PAD_ID;
    }
    if (width == 0 || vocab > DY_MAX_VOCAB || width > vocab) return DY_ST_SHARD_INVALID;
    for (j = 0; j < m; j++) {
        union {
            uint32_t u;
            float f;
        } xv, bv;
        double z;
        if (cg[j] < 0) continue;
        if ((uint32_t)cg[j] >= vocab) return DY_ST_SHARD_INVALID;
        xv.u = (uint32_t)cx[j];
        bv.u = cb ? (uint32_t)cb[j] : 0u;
        z = dy_effective_logit(xv.f, cb ? &bv.f : DY_NULL, 0, temperature);
        dy_shard_heap_offer(hk, hid, hpos, &size, greedy ? 1u : width, dy_order_key(z),
                            (uint32_t)cg[j], j);
    }
    if (size == 0) return DY_ST_X_ZERO_MASS;
    /* the best candidate: largest key, lowest id */
    for (j = 1; j < size; j++)
        if (dy_shard_worse(hk[best], hid[best], hk[j], hid[j])) best = j;
    zmax = dy_key_value(hk[best]);
    if (!(zmax > -inf)) return DY_ST_X_ZERO_MASS;
    if (greedy) {
        counts[0] = DY_TOTAL;
        ids[0] = (int32_t)hid[best];
        *token = (int32_t)hid[best];
        return DY_ST_OK;
    }
    for (j = 0; j < size; j++) sel[j] = ((uint64_t)hid[j] << 32) | hpos[j];
    dy_sort_u64(sel, size); /* ascending global ids */
    for (j = 0; j < size; j++) {
        uint32_t c = (uint32_t)sel[j];
        union {
            uint32_t u;
            float f;
        } xv, bv;
        xv.u = (uint32_t)cx[c];
        bv.u = cb ? (uint32_t)cb[c] : 0u;
        if ((uint32_t)(sel[j] >> 32) == hid[best]) argpos = j;
        w[j] = dy_weight_from_gap(zmax - dy_effective_logit(xv.f, cb ? &bv.f : DY_NULL, 0,
                                                             temperature));
    }
    st = dy_alloc_weights(w, size, policy, argpos, counts, idx);
    if (st) {
        for (j = 0; j < width; j++) counts[j] = 0;
        return st;
    }
    o = 0;
    for (j = 0; j < size; j++) {
        uint32_t c = counts[j];
        if (c) {
            counts[o] = c;
            ids[o] = (int32_t)(sel[j] >> 32);
            o++;
        }
    }
    for (; o < width; o++) {
        counts[o] = 0;
        ids[o] = DY_PAD_ID;
    }
    *token = dy_draw_sparse(counts, ids, width, dy_proposal_ticket(seed, generation, round,
                                                                    position));
    return DY_ST_OK;
}

/* Dense propose: this shard's integer weights of one row, w_v =
 * weight_from_gap(zmax - z_v) with z_v = (x_v + b_v) / temperature and zmax
 * the global maximum z (from the gathered top-1 candidates); x, bias: float32
 * [n] (bias may be NULL); w: uint64 [n].  sums[0] / sums[1] = the sums of
 * w >> 32 and w & (2**32 - 1) (exact: w <= 2**39, n <= 2**24). */
DY_HOT void dy_shard_dense_weights(const float *x, const float *bias, double temperature,
                                   uint32_t n, double zmax, uint64_t *w, uint64_t *sums) {
    uint64_t hi = 0, lo = 0;
    uint32_t v;
    for (v = 0; v < n; v++) {
        uint64_t wv = dy_weight_from_gap(zmax - dy_effective_logit(x[v], bias, v, temperature));
        w[v] = wv;
        hi += wv >> 32;
        lo += wv & 0xFFFFFFFFu;
    }
    sums[0] = hi;
    sums[1] = lo;
}

/* ------------------------------------------------------------------ verify */

#define DY_SHARD_SUMMARY 9

/* Round-1 summary of one (request, position) target row of this shard:
 * f[0] invalid-value flag, f[1] / f[2] sums of P >> 32 and P & (2**32 - 1)
 * over the shard (P = floor(p 2**62), 0 at an invalid value), f[3] the
 * largest |p| bit pattern and f[4] the global id of its first occurrence
 * (both -1 for an empty shard or without `argmax`: only greedy requests use
 * them), and when draft (a global id, -1: none) lies
 * in the shard: f[5] / f[6] = P_d >> 32 / P_d & (2**32 - 1) and f[7] =
 * qshard[d - offset] (qshard: this shard's counts [n], or NULL); f[8] = the
 * sum of qshard (0 without).  bits: float32 bit patterns [n].  Returns
 * DY_ST_SHARD_INVALID (shard outside [0, vocab)), DY_ST_DRAFT_OUT_OF_RANGE
 * (draft outside [-1, vocab)) with f all 0, else DY_ST_OK. */
DY_HOT int dy_shard_target_summary(const uint32_t *bits, uint32_t n, uint32_t offset,
                                   uint32_t vocab, int64_t draft, const uint32_t *qshard,
                                   int argmax, int64_t *f) {
    uint64_t hi = 0, lo = 0, qs = 0;
    uint32_t v, bad = 0, best = 0, arg = 0;
    for (v = 0; v < DY_SHARD_SUMMARY; v++) f[v] = 0;
    if (!dy_shard_valid(offset, n, vocab)) return DY_ST_SHARD_INVALID;
    if (draft < -1 || draft >= (int64_t)vocab) return DY_ST_DRAFT_OUT_OF_RANGE;
    /* one branch-free (vectorisable) pass: limb sums and the invalid flag */
    for (v = 0; v < n; v++) {
        uint32_t b = bits[v];
        uint32_t inv = (uint32_t)(b > 0x3F800000u) & (uint32_t)(b != 0x80000000u);
        uint64_t p = dy_target_fixed_fast(b) & ((uint64_t)inv - 1u);
        bad |= inv;
        hi += p >> 32;
        lo += p & 0xFFFFFFFFu;
    }
    if (argmax) { /* the largest |p| bits, then its first occurrence */
        for (v = 0; v < n; v++) {
            uint32_t mag = bits[v] & 0x7FFFFFFFu;
            best = mag > best ? mag : best;
        }
        for (v = 0; v < n; v++)
            if ((bits[v] & 0x7FFFFFFFu) == best) {
                arg = v;
                break;
            }
    }
    if (qshard)
        for (v = 0; v < n; v++) qs += qshard[v];
    f[0] = (int64_t)bad;
    f[1] = (int64_t)hi;
    f[2] = (int64_t)lo;
    f[3] = n && argmax ? (int64_t)best : -1;
    f[4] = n && argmax ? (int64_t)(offset + arg) : -1;
    if (draft >= (int64_t)offset && draft < (int64_t)offset + (int64_t)n) {
        uint32_t b = bits[draft - offset];
        uint64_t p = dy_target_bits_valid(b) ? dy_target_fixed_fast(b) : 0;
        f[5] = (int64_t)(p >> 32);
        f[6] = (int64_t)(p & 0xFFFFFFFFu);
        if (qshard) f[7] = (int64_t)qshard[draft - offset];
    }
    f[8] = (int64_t)qs;
    return DY_ST_OK;
}

/* Sum over the `world` gathered shards of (f[a] << 32) + f[a + 1] as 128 bits
 * (f: the first shard's summary; stride: words between shards). */
DY_FUNC dy_u128 dy_shard_limb_total(const int64_t *f, uint64_t stride, uint32_t world, int a) {
    dy_u128 t = dy_from64(0);
    uint32_t s;
    for (s = 0; s < world; s++) {
        const int64_t *g = f + s * stride;
        t = dy_add128(t, dy_add128(dy_shl128(dy_from64((uint64_t)g[a]), 32),
                                   dy_from64((uint64_t)g[a + 1])));
    }
    return t;
}

/* Validation of one request from the gathered round-1 summaries (the checks
 * of the unsharded verify, in its order): per position 0..k an invalid value
 * (DY_ST_TARGET_INVALID_VALUE) or |T - 2**62| > 2**52 (DY_ST_TARGET_SUM),
 * then per draft c_d == 0 without greedy (DY_ST_Q_ZERO_AT_DRAFT).
 * f: the summaries of shard 0 at position 0 ([k+1][DY_SHARD_SUMMARY] per
 * shard, shards `stride` words apart, in id order); cd: q(d) [k].  Out:
 * total [k+1] = T, pd [k] = P_d, best [k+1] = the global first argmax. */
DY_FUNC int dy_shard_verify_check(const int64_t *f, uint64_t stride, uint32_t world, uint32_t k,
                                  const uint32_t *cd, int greedy, uint64_t *total, uint64_t *pd,
                                  int32_t *best) {
    const uint64_t one = 1ull << DY_TARGET_BITS, tol = one >> DY_TARGET_TOL_BITS;
    uint32_t i, s;
    for (i = 0; i <= k; i++) {
        const int64_t *g = f + (uint64_t)i * DY_SHARD_SUMMARY;
        int64_t mbest = g[3];
        best[i] = (int32_t)g[4];
        for (s = 1; s < world; s++)
            if (g[s * stride + 3] > mbest) {
                mbest = g[s * stride + 3];
                best[i] = (int32_t)g[s * stride + 4];
            }
        total[i] = 0;
    }
    for (i = 0; i <= k; i++) {
        const int64_t *g = f + (uint64_t)i * DY_SHARD_SUMMARY;
        dy_u128 t;
        for (s = 0; s < world; s++)
            if (g[s * stride]) return DY_ST_TARGET_INVALID_VALUE;
        t = dy_shard_limb_total(g, stride, world, 1);
        if (t.hi || (t.lo > one ? t.lo - one : one - t.lo) > tol) return DY_ST_TARGET_SUM;
        total[i] = t.lo;
    }
    for (i = 0; i < k; i++) {
        dy_u128 p = dy_shard_limb_total(f + (uint64_t)i * DY_SHARD_SUMMARY, stride, world, 5);
        pd[i] = p.hi ? ~0ull : p.lo;
        if (!greedy && cd[i] == 0) return DY_ST_Q_ZERO_AT_DRAFT;
    }
    return DY_ST_OK;
}

/* Acceptance of one validated request (after dy_shard_verify_check): draft i
 * is accepted when d_i equals best[i] (greedy) or by dy_accept(P_d, T, c_d,
 * position + i); tokens [k+1] gets the accepted drafts, then -1.  Greedy:
 * tokens[j] = best[j] at the first rejection j (or k).  *draw_at = j for a
 * request that draws its token at j from the residual (j < k) or P (j = k),
 * -1 for greedy.  Returns DY_ST_OK, DY_ST_Q_ZERO_AT_DRAFT (c_d == 0: never
 * after the check) or DY_ST_RNG_EXHAUSTED. */
DY_FUNC int dy_shard_verify_accept(const int64_t *draft, const uint32_t *cd,
                                   const uint64_t *total, const uint64_t *pd,
                                   const int32_t *best, uint32_t k, int greedy, uint64_t seed,
                                   uint32_t generation, uint32_t round, uint32_t position,
                                   int32_t *accepted, int32_t *tokens, int32_t *draw_at) {
    uint32_t i, j = k;
    int st, ok;
    *accepted = 0;
    *draw_at = -1;
    for (i = 0; i <= k; i++) tokens[i] = -1;
    for (i = 0; i < k; i++) {
        if (greedy) {
            ok = draft[i] == (int64_t)best[i];
        } else {
            if (cd[i] == 0) return DY_ST_Q_ZERO_AT_DRAFT;
            st = dy_accept(pd[i], total[i], cd[i], seed, generation, round, position + i, &ok);
            if (st) {
                for (i = 0; i <= k; i++) tokens[i] = -1;
                return st;
            }
        }
        if (!ok) {
            j = i;
            break;
        }
        tokens[i] = (int32_t)draft[i];
    }
    *accepted = (int32_t)j;
    if (greedy) tokens[j] = best[j];
    else *draw_at = (int32_t)j;
    return DY_ST_OK;
}

/* Dense local counts [n] of a sparse q row (global ids [width], counts
 * [width]) on the shard [offset, offset + n): ids outside the shard (padding
 * included) are skipped, a repeated id keeps its last count. */
DY_FUNC void dy_shard_q_local(const uint32_t *qc, const int32_t *qi, uint32_t width,
                              uint32_t offset, uint32_t n, uint32_t *out) {
    uint32_t j;
    for (j = 0; j < n; j++) out[j] = 0;
    for (j = 0; j < width; j++) {
        int64_t id = qi[j];
        if (id >= (int64_t)offset && id < (int64_t)offset + (int64_t)n)
            out[id - (int64_t)offset] = qc[j];
    }
}

/* The mass of the distribution a request draws from at one position, over
 * this shard: R_v = max(P_v 2**24 - q_v T, 0) (q: local counts [n], NULL =
 * all 0) or, with bonus, P_v itself.  mass[0..3) = the sums of R & (2**32 -
 * 1), R >> 32 & (2**32 - 1) and R >> 64 (exact; the limbs of every R_v are
 * summed separately).  bits: float32 [n] (an invalid value counts as P = 0). */
DY_HOT void dy_shard_residual_mass(const uint32_t *bits, const uint32_t *q, uint32_t n,
                                   uint64_t total, int bonus, int64_t *mass) {
    uint64_t s0 = 0, s1 = 0, s2 = 0;
    uint32_t v;
    if (bonus || !q) { /* P or P 2**24: no subtraction, a vectorisable pass */
        const int sh = bonus ? 0 : DY_TOTAL_BITS;
        for (v = 0; v < n; v++) {
            uint32_t b = bits[v];
            uint32_t inv = (uint32_t)(b > 0x3F800000u) & (uint32_t)(b != 0x80000000u);
            uint64_t p = dy_target_fixed_fast(b) & ((uint64_t)inv - 1u);
            uint64_t lo = p << sh;
            s0 += lo & 0xFFFFFFFFu;
            s1 += lo >> 32;
            s2 += sh ? p >> (64 - sh) : 0u;
        }
    } else {
        for (v = 0; v < n; v++) {
            uint32_t b = bits[v];
            uint64_t p = dy_target_bits_valid(b) ? dy_target_fixed_fast(b) : 0;
            dy_u128 r = dy_residual(p, q[v], total);
            s0 += r.lo & 0xFFFFFFFFu;
            s1 += r.lo >> 32;
            s2 += r.hi;
        }
    }
    mass[0] = (int64_t)s0;
    mass[1] = (int64_t)s1;
    mass[2] = (int64_t)s2;
}

/* dy_shard_residual_mass (no bonus) with a sparse q row (global ids [width],
 * counts [width]), the same three limb sums: the pass without q, then for
 * each id of q in the shard its term P_v 2**24 replaced by R_v (exact
 * modulo 2**64, and every final sum is the true one).  Ids that are not
 * strictly ascending inside the shard (never in a validated Dyadic) take
 * the dense path: ws (n words) receives dy_shard_q_local. */
DY_FUNC void dy_shard_residual_mass_sparse(const uint32_t *bits, const uint32_t *qc,
                                           const int32_t *qi, uint32_t width, uint32_t offset,
                                           uint32_t n, uint64_t total, uint32_t *ws,
                                           int64_t *mass) {
    int64_t prev = -1;
    uint64_t s0, s1, s2;
    uint32_t j;
    for (j = 0; j < width; j++) {
        int64_t id = qi[j];
        if (id < (int64_t)offset || id >= (int64_t)offset + (int64_t)n) continue;
        if (id <= prev) {
            dy_shard_q_local(qc, qi, width, offset, n, ws);
            dy_shard_residual_mass(bits, ws, n, total, 0, mass);
            return;
        }
        prev = id;
    }
    dy_shard_residual_mass(bits, DY_NULL, n, total, 0, mass);
    s0 = (uint64_t)mass[0];
    s1 = (uint64_t)mass[1];
    s2 = (uint64_t)mass[2];
    for (j = 0; j < width; j++) {
        int64_t id = qi[j];
        uint32_t b;
        uint64_t p, full;
        dy_u128 r;
        if (id < (int64_t)offset || id >= (int64_t)offset + (int64_t)n) continue;
        b = bits[id - (int64_t)offset];
        p = dy_target_bits_valid(b) ? dy_target_fixed_fast(b) : 0;
        full = p << DY_TOTAL_BITS;
        r = dy_residual(p, qc[j], total);
        s0 += (r.lo & 0xFFFFFFFFu) - (full & 0xFFFFFFFFu);
        s1 += (r.lo >> 32) - (full >> 32);
        s2 += r.hi - (p >> (64 - DY_TOTAL_BITS));
    }
    mass[0] = (int64_t)s0;
    mass[1] = (int64_t)s1;
    mass[2] = (int64_t)s2;
}

/* R_v of dy_shard_residual_mass at one id. */
DY_FUNC dy_u128 dy_shard_residual_at(uint32_t b, const uint32_t *q, uint32_t v, uint64_t total,
                                     int bonus) {
    uint64_t p = dy_target_bits_valid(b) ? dy_target_fixed_fast(b) : 0;
    return bonus ? dy_from64(p) : dy_residual(p, q ? q[v] : 0u, total);
}

/* The local index of the first v whose running sum of R_v (as in
 * dy_shard_residual_mass) is > x, or -1 if the shard's mass is <= x.
 * Blocks of DY_BLOCK ids: a block where q is 0 is summed by a vectorisable
 * pass (R_v = P_v 2**24, or P_v for the bonus), other blocks exactly id by
 * id; only the block where the running sum passes x is scanned. */
DY_HOT int32_t dy_shard_residual_find(const uint32_t *bits, const uint32_t *q, uint32_t n,
                                      uint64_t total, int bonus, dy_u128 x) {
    dy_u128 acc = dy_from64(0);
    uint32_t v0, j;
    for (v0 = 0; v0 < n; v0 += DY_BLOCK) {
        uint32_t nb = n - v0 < DY_BLOCK ? n - v0 : DY_BLOCK, qor = 0;
        dy_u128 bs, next;
        if (q && !bonus)
            for (j = 0; j < nb; j++) qor |= q[v0 + j];
        if (!qor) {
            uint64_t s_lo = 0, s_hi = 0; /* limb sums of P (< 2**38 each) */
            for (j = 0; j < nb; j++) {
                uint32_t b = bits[v0 + j];
                uint32_t inv = (uint32_t)(b > 0x3F800000u) & (uint32_t)(b != 0x80000000u);
                uint64_t p = dy_target_fixed_fast(b) & ((uint64_t)inv - 1u);
                s_lo += p & 0xFFFFFFFFu;
                s_hi += p >> 32;
            }
            bs = dy_add128(dy_shl128(dy_from64(s_hi), 32), dy_from64(s_lo));
            if (!bonus) bs = dy_shl128(bs, DY_TOTAL_BITS);
        } else {
            bs = dy_from64(0);
            for (j = 0; j < nb; j++)
                bs = dy_add128(bs, dy_shard_residual_at(bits[v0 + j], q, v0 + j, total, bonus));
        }
        next = dy_add128(acc, bs);
        if (dy_lt128(x, next)) {
            for (j = 0; j < nb; j++) {
                acc = dy_add128(acc, dy_shard_residual_at(bits[v0 + j], q, v0 + j, total, bonus));
                if (dy_lt128(x, acc)) return (int32_t)(v0 + j);
            }
            return -1; /* unreachable: the block's exact sum passed x */
        }
        acc = next;
    }
    return -1;
}

/* The correction draw of one request from the gathered round-2 masses
 * (mass: shard 0's three limbs, shards `stride` words apart, in id order;
 * each shard's mass is m[0] + m[1] 2**32 + m[2] 2**64): n = the total,
 * X = uniform_below(n) (domain CORRECTION at `position`, draw index 0), the
 * first shard whose cumulative mass exceeds X (*owner; a zero-mass shard
 * never does) and X minus the mass before it (*rel).  n = 0: *owner = -2 and
 * DY_ST_OK (the caller refuses it, as the reference's uniform_below does).
 * Returns DY_ST_OK or DY_ST_RNG_EXHAUSTED. */
DY_FUNC int dy_shard_correction_pick(const int64_t *mass, uint64_t stride, uint32_t world,
                                     uint64_t seed, uint32_t generation, uint32_t round,
                                     uint32_t position, int32_t *owner, dy_u128 *rel) {
    dy_u128 n = dy_from64(0), x, acc = dy_from64(0);
    uint32_t s, idx = 0;
    int st;
    *owner = -1;
    *rel = dy_from64(0);
    for (s = 0; s < world; s++) {
        const int64_t *m = mass + s * stride;
        n = dy_add128(n, dy_add128(dy_from64((uint64_t)m[0]),
                                   dy_add128(dy_shl128(dy_from64((uint64_t)m[1]), 32),
                                             dy_make128((uint64_t)m[2], 0))));
    }
    if (dy_is_zero128(n)) {
        *owner = -2;
        return DY_ST_OK;
    }
    st = dy_uniform_below_u128(n, seed, generation, round, position, DY_DOMAIN_CORRECTION, &idx,
                               &x);
    if (st) return st;
    for (s = 0; s < world; s++) {
        const int64_t *m = mass + s * stride;
        dy_u128 ms = dy_add128(dy_from64((uint64_t)m[0]),
                               dy_add128(dy_shl128(dy_from64((uint64_t)m[1]), 32),
                                         dy_make128((uint64_t)m[2], 0)));
        dy_u128 next = dy_add128(acc, ms);
        if (dy_lt128(x, next)) {
            *owner = (int32_t)s;
            *rel = dy_sub128(x, acc);
            return DY_ST_OK;
        }
        acc = next;
    }
    return DY_ST_OK; /* unreachable: X < n */
}

#endif /* DYADIC_SHARD_H */
