# cython: language_level=3
"""Per-shard work of dyadic.distributed on the host: thin row loops over
backends/include/dyadic_shard.h.

Each function works on a whole batch of one rank: the arrays of this rank's
shard (ids [offset, offset + n) of a vocabulary of size V) or the arrays
gathered from every rank (shards in id order, axis 0).  Inputs are
C-contiguous NumPy arrays of the stated dtypes, outputs are preallocated;
shapes are checked here (ValueError naming the array), the row loops run
without the GIL and never raise for bad data: every id the C code indexes
memory with is bounds-checked there and the row gets a status code.
"""
import numpy as np
cimport numpy as cnp
from libc.stdint cimport uint32_t, int32_t, uint64_t, uint8_t, int64_t
include "dyadic_shard.pxi"

cnp.import_array()

DEF DOMAIN_CORRECTION = 3


cdef int _shape(str name, tuple got, tuple want) except -1:
    if got != want:
        raise ValueError(f"{name}: shape {got} must be {want}")
    return 0


cdef int _shard(Py_ssize_t offset, Py_ssize_t n, Py_ssize_t vocab) except -1:
    if not (1 <= vocab <= DY_MAX_VOCAB and 0 <= offset and 0 <= n and offset + n <= vocab):
        raise ValueError(f"vocab_offset: shard [{offset}, {offset + n}) is not inside "
                         f"[0, {vocab}) (vocab_size in [1, 2**24])")
    return 0


def topk(const float[:, ::1] x, bias, const double[::1] temperature,
         const uint8_t[::1] greedy, int k, Py_ssize_t offset, Py_ssize_t vocab,
         int32_t[:, ::1] payload):
    """This rank's candidates, one payload row per request (dy_shard_topk_row).

    x: float32 [B, n] logits of ids [offset, offset + n); bias: float32 [1 or
    B, n] or None; temperature: float64 [B] (1.0 for greedy rows); greedy:
    uint8 [B] (a greedy row sends its top 1).  payload: int32 [B, 1 + k * c]
    with c = 3 with a bias else 2: status, then k x bits, (k bias bits,) k
    global ids; unused entries -1."""
    cdef Py_ssize_t b, j, B = x.shape[0], n = x.shape[1], nb = 0
    cdef int ncol = 2 if bias is None else 3
    cdef const float[:, ::1] bv
    cdef const float *bp
    cdef int32_t *cbp
    cdef uint32_t m, kk
    _shard(offset, n, vocab)
    if k < 1:
        raise ValueError(f"top_k: {k} must be >= 1")
    _shape("temperature", (temperature.shape[0],), (B,))
    _shape("greedy", (greedy.shape[0],), (B,))
    _shape("payload", (payload.shape[0], payload.shape[1]), (B, 1 + k * ncol))
    if bias is not None:
        bv = bias
        nb = bv.shape[0]
        if (nb != 1 and nb != B) or bv.shape[1] != n:
            raise ValueError(f"bias: shape ({nb}, {bv.shape[1]}) must be (1, {n}) or ({B}, {n})")
    if B == 0:
        return
    cdef uint64_t[::1] ws = np.empty(<Py_ssize_t>dy_shard_topk_ws_words(<uint32_t>k), np.uint64)
    with nogil:
        for b in range(B):
            bp = NULL
            cbp = NULL
            if nb:
                bp = &bv[b if nb > 1 else 0, 0]
                cbp = &payload[b, 1 + k]
            for j in range(1, 1 + k * ncol):
                payload[b, j] = -1
            kk = 1 if greedy[b] else <uint32_t>k
            payload[b, 0] = dy_shard_topk_row(&x[b, 0] if n else NULL, bp if n else NULL,
                                              temperature[b], <uint32_t>n, <uint32_t>offset,
                                              <uint32_t>vocab, kk, &payload[b, 1], cbp,
                                              &payload[b, 1 + (ncol - 1) * k], &m, &ws[0])


def merge(const int32_t[:, :, ::1] g, bint has_bias, int k, const double[::1] temperature,
          const uint8_t[::1] greedy, int policy, Py_ssize_t vocab, int width,
          const uint64_t[::1] seed, const uint32_t[::1] generation, const uint32_t[::1] round,
          const uint32_t[::1] position, int32_t[::1] tokens, uint32_t[:, ::1] counts,
          int32_t[:, ::1] ids, int32_t[::1] status, int32_t[::1] alloc_status):
    """Every rank's merge of the gathered payloads g: int32 [S, B, 1 + k * c]
    (shards in id order) into the sparse q and the tokens (dy_shard_merge_row).

    status [B]: the first shard's non-zero payload status, else the merge's
    X_ZERO_MASS / SHARD_INVALID; alloc_status [B]: the allocation's status
    (rows whose status is set have no allocation).  tokens int32 [B],
    counts uint32 [B, width], ids int32 [B, width]."""
    cdef Py_ssize_t s, b, j, S = g.shape[0], B = g.shape[1]
    cdef int ncol = 3 if has_bias else 2
    cdef int st
    cdef uint32_t m = <uint32_t>(S * k)
    _shape("g", (g.shape[0], g.shape[1], g.shape[2]), (S, B, 1 + k * ncol))
    if not 1 <= vocab <= DY_MAX_VOCAB or not 1 <= width <= vocab or k < 1:
        raise ValueError(f"width: {width} must be in [1, vocab_size={vocab}] and k={k} >= 1")
    if policy != 0 and policy != 1:
        raise ValueError(f"policy: unknown policy code {policy!r}")
    for name, arr in (("temperature", temperature), ("greedy", greedy), ("seed", seed),
                      ("generation", generation), ("round", round), ("position", position),
                      ("tokens", tokens), ("status", status), ("alloc_status", alloc_status)):
        _shape(name, (arr.shape[0],), (B,))
    _shape("counts", (counts.shape[0], counts.shape[1]), (B, width))
    _shape("ids", (ids.shape[0], ids.shape[1]), (B, width))
    if B == 0:
        return
    cdef int32_t[::1] cx = np.empty(max(m, 1), np.int32)
    cdef int32_t[::1] cb = np.empty(max(m, 1), np.int32)
    cdef int32_t[::1] cg = np.empty(max(m, 1), np.int32)
    cdef uint64_t[::1] ws = np.empty(<Py_ssize_t>dy_shard_merge_ws_words(<uint32_t>width),
                                     np.uint64)
    with nogil:
        for b in range(B):
            st = 0
            alloc_status[b] = 0
            tokens[b] = -1
            for j in range(width):
                counts[b, j] = 0
                ids[b, j] = -1
            for s in range(S):
                if g[s, b, 0] != 0:
                    st = g[s, b, 0]
                    break
            status[b] = st
            if st:
                continue
            for s in range(S):
                for j in range(k):
                    cx[s * k + j] = g[s, b, 1 + j]
                    if has_bias:
                        cb[s * k + j] = g[s, b, 1 + k + j]
                    cg[s * k + j] = g[s, b, 1 + (ncol - 1) * k + j]
            st = dy_shard_merge_row(&cx[0], &cb[0] if has_bias else NULL, &cg[0], m,
                                    1.0 if greedy[b] else temperature[b], greedy[b], policy,
                                    <uint32_t>vocab, <uint32_t>width, seed[b], generation[b],
                                    round[b], position[b], &tokens[b], &counts[b, 0],
                                    &ids[b, 0], &ws[0])
            if st == 4 or st == 17:  # X_ZERO_MASS, SHARD_INVALID: the merge's own statuses
                status[b] = st
            else:
                alloc_status[b] = st


def dense_weights(const float[:, ::1] x, bias, const double[::1] temperature,
                  const double[::1] zmax, const uint8_t[::1] rows, uint64_t[:, ::1] w,
                  uint64_t[:, ::1] sums):
    """Dense propose: the integer weights of this shard's rows with rows[b] != 0
    (dy_shard_dense_weights): x float32 [B, n], bias float32 [1 or B, n] or
    None, temperature float64 [B], zmax float64 [B] (the global maximum z);
    w uint64 [B, n], sums uint64 [B, 2] (sums of w >> 32 and w & (2**32 - 1));
    rows without a flag get zeros."""
    cdef Py_ssize_t b, j, B = x.shape[0], n = x.shape[1], nb = 0
    cdef const float[:, ::1] bv
    cdef const float *bp
    for name, arr in (("temperature", temperature), ("zmax", zmax), ("rows", rows)):
        _shape(name, (arr.shape[0],), (B,))
    _shape("w", (w.shape[0], w.shape[1]), (B, n))
    _shape("sums", (sums.shape[0], sums.shape[1]), (B, 2))
    if bias is not None:
        bv = bias
        nb = bv.shape[0]
        if (nb != 1 and nb != B) or bv.shape[1] != n:
            raise ValueError(f"bias: shape ({nb}, {bv.shape[1]}) must be (1, {n}) or ({B}, {n})")
    with nogil:
        for b in range(B):
            sums[b, 0] = 0
            sums[b, 1] = 0
            if not rows[b] or n == 0:
                for j in range(n):
                    w[b, j] = 0
                continue
            bp = NULL
            if nb:
                bp = &bv[b if nb > 1 else 0, 0]
            dy_shard_dense_weights(&x[b, 0], bp, temperature[b], <uint32_t>n, zmax[b], &w[b, 0],
                                   &sums[b, 0])


def target_summary(target, const int64_t[:, ::1] draft, qshard, const uint8_t[::1] greedy,
                   Py_ssize_t offset, Py_ssize_t vocab, int64_t[:, :, ::1] f,
                   int32_t[::1] status):
    """Round-1 summaries of this shard (dy_shard_target_summary) for every
    (request, position): target float32 [B, k+1, n], draft int64 [B, k]
    (global ids), qshard uint32 [B, k, n] (this rank's DyadicShard counts) or
    None, greedy uint8 [B] (the argmax fields are computed for greedy requests
    only); f int64 [B, k+1, 9]; status int32 [B] (a bad draft id or shard)."""
    cdef const uint32_t[:, :, ::1] t = target.view(np.uint32)
    cdef Py_ssize_t b, i, B = t.shape[0], K1 = t.shape[1], n = t.shape[2], K = K1 - 1
    cdef const uint32_t[:, :, ::1] qv
    cdef bint hasq = qshard is not None
    cdef int st
    cdef int64_t d
    cdef const uint32_t *qp
    _shard(offset, n, vocab)
    if K1 < 1:
        raise ValueError("target: needs k+1 >= 1 rows per request")
    _shape("draft", (draft.shape[0], draft.shape[1]), (B, K))
    _shape("f", (f.shape[0], f.shape[1], f.shape[2]), (B, K1, DY_SHARD_SUMMARY))
    _shape("status", (status.shape[0],), (B,))
    _shape("greedy", (greedy.shape[0],), (B,))
    if hasq:
        qv = qshard
        _shape("qshard", (qv.shape[0], qv.shape[1], qv.shape[2]), (B, K, n))
    with nogil:
        for b in range(B):
            status[b] = 0
            for i in range(K1):
                d = draft[b, i] if i < K else -1
                qp = NULL
                if hasq and i < K and n:
                    qp = &qv[b, i, 0]
                st = dy_shard_target_summary(&t[b, i, 0] if n else NULL, <uint32_t>n,
                                             <uint32_t>offset, <uint32_t>vocab, d, qp,
                                             greedy[b], &f[b, i, 0])
                if st and not status[b]:
                    status[b] = st


def verify_check(const int64_t[:, :, :, ::1] gf, const uint32_t[:, ::1] cd,
                 const uint8_t[::1] greedy, uint64_t[:, ::1] total, uint64_t[:, ::1] pd,
                 int32_t[:, ::1] best, int32_t[::1] status):
    """Validation on the gathered summaries gf int64 [S, B, k+1, 9]
    (dy_shard_verify_check): cd uint32 [B, k] = q(d); outputs T uint64
    [B, k+1], P_d uint64 [B, k], the global argmax int32 [B, k+1], status."""
    cdef Py_ssize_t b, S = gf.shape[0], B = gf.shape[1], K1 = gf.shape[2], K = K1 - 1
    cdef uint64_t stride = <uint64_t>(B * K1 * DY_SHARD_SUMMARY)
    if S < 1 or K1 < 1 or gf.shape[3] != DY_SHARD_SUMMARY:
        raise ValueError(f"gf: shape ({S}, {B}, {K1}, {gf.shape[3]}) must be (S >= 1, B, k+1, 9)")
    _shape("cd", (cd.shape[0], cd.shape[1]), (B, K))
    _shape("greedy", (greedy.shape[0],), (B,))
    _shape("total", (total.shape[0], total.shape[1]), (B, K1))
    _shape("pd", (pd.shape[0], pd.shape[1]), (B, K))
    _shape("best", (best.shape[0], best.shape[1]), (B, K1))
    _shape("status", (status.shape[0],), (B,))
    with nogil:
        for b in range(B):
            status[b] = dy_shard_verify_check(&gf[0, b, 0, 0], stride, <uint32_t>S, <uint32_t>K,
                                              &cd[b, 0] if K else NULL, greedy[b], &total[b, 0],
                                              &pd[b, 0] if K else NULL, &best[b, 0])


def verify_accept(const int64_t[:, ::1] draft, const uint32_t[:, ::1] cd,
                  const uint64_t[:, ::1] total, const uint64_t[:, ::1] pd,
                  const int32_t[:, ::1] best, const uint8_t[::1] greedy,
                  const uint64_t[::1] seed, const uint32_t[::1] generation,
                  const uint32_t[::1] round, const uint32_t[::1] position,
                  int32_t[::1] accepted, int32_t[:, ::1] tokens, int32_t[::1] draw_at,
                  int32_t[::1] status):
    """Acceptance of validated requests (dy_shard_verify_accept): accepted
    int32 [B], tokens int32 [B, k+1], draw_at int32 [B] (the position whose
    token is drawn from the residual / P, -1 for greedy rows), status."""
    cdef Py_ssize_t b, B = draft.shape[0], K = draft.shape[1], K1 = K + 1
    _shape("cd", (cd.shape[0], cd.shape[1]), (B, K))
    _shape("total", (total.shape[0], total.shape[1]), (B, K1))
    _shape("pd", (pd.shape[0], pd.shape[1]), (B, K))
    _shape("best", (best.shape[0], best.shape[1]), (B, K1))
    _shape("tokens", (tokens.shape[0], tokens.shape[1]), (B, K1))
    for name, arr in (("greedy", greedy), ("seed", seed), ("generation", generation),
                      ("round", round), ("position", position), ("accepted", accepted),
                      ("draw_at", draw_at), ("status", status)):
        _shape(name, (arr.shape[0],), (B,))
    with nogil:
        for b in range(B):
            status[b] = dy_shard_verify_accept(&draft[b, 0] if K else NULL,
                                               &cd[b, 0] if K else NULL, &total[b, 0],
                                               &pd[b, 0] if K else NULL, &best[b, 0],
                                               <uint32_t>K, greedy[b], seed[b], generation[b],
                                               round[b], position[b], &accepted[b],
                                               &tokens[b, 0], &draw_at[b])


cdef int _q_args(str name, q_dense, Py_ssize_t q_offset, q_counts, q_ids, Py_ssize_t B,
                 Py_ssize_t K, Py_ssize_t n) except -1:
    if q_dense is not None:
        if q_counts is not None or q_ids is not None:
            raise ValueError(f"{name}: pass a dense q or a sparse q, not both")
        if q_dense.ndim != 3 or q_dense.shape[:2] != (B, K) or not (
                0 <= q_offset and q_offset + n <= q_dense.shape[2]):
            raise ValueError(f"q_dense: shape {q_dense.shape} must be ({B}, {K}, W) with "
                             f"q_offset + n = {q_offset + n} <= W")
    elif (q_counts is None) != (q_ids is None):
        raise ValueError("q_counts, q_ids: give both (sparse q) or neither")
    elif q_counts is not None:
        if (q_counts.ndim != 3 or q_counts.shape[:2] != (B, K)
                or q_ids.shape != q_counts.shape):
            raise ValueError(f"q_counts, q_ids: shapes {q_counts.shape}, {q_ids.shape} must be "
                             f"({B}, {K}, w) and equal")
    return 0


def residual_mass(target, const int32_t[::1] draw_at, q_dense, Py_ssize_t q_offset, q_counts,
                  q_ids, Py_ssize_t offset, const uint64_t[:, ::1] total,
                  int64_t[:, ::1] mass):
    """Round-2 masses of this shard (dy_shard_residual_mass) for the requests
    with draw_at[b] = j >= 0: the residual at j < k, P at j = k.

    target float32 [B, k+1, n]; q: dense uint32 [B, k, W] read at columns
    [q_offset, q_offset + n) (a DyadicShard: q_offset 0, W = n; a dense
    Dyadic: q_offset = offset), or sparse q_counts uint32 / q_ids int32
    [B, k, w] (global ids; a point-mass q is the sparse row (d, 2**24)), or
    neither (q = 0).  total uint64 [B, k+1]; mass int64 [B, 3] (0 for rows
    without a draw)."""
    cdef const uint32_t[:, :, ::1] t = target.view(np.uint32)
    cdef Py_ssize_t b, B = t.shape[0], K1 = t.shape[1], n = t.shape[2], K = K1 - 1
    _q_args("q", q_dense, q_offset, q_counts, q_ids, B, K, n)
    _shard(offset, n, max(offset + n, 1))
    _shape("draw_at", (draw_at.shape[0],), (B,))
    _shape("total", (total.shape[0], total.shape[1]), (B, K1))
    _shape("mass", (mass.shape[0], mass.shape[1]), (B, 3))
    cdef uint32_t[::1] qloc = np.zeros(max(n, 1), np.uint32)
    cdef const uint32_t *qp
    cdef const uint32_t[:, :, ::1] qc
    cdef const int32_t[:, :, ::1] qi
    cdef int j
    for b in range(B):
        mass[b, 0] = mass[b, 1] = mass[b, 2] = 0
        j = draw_at[b]
        if j < 0:
            continue
        if j > K:
            raise ValueError(f"draw_at: row {b}: {j} is not in [-1, k={K}]")
        if j < K and n and q_counts is not None and q_counts.shape[2]:
            qc = q_counts
            qi = q_ids
            with nogil:
                dy_shard_residual_mass_sparse(&t[b, j, 0], &qc[b, j, 0], &qi[b, j, 0],
                                              <uint32_t>qc.shape[2], <uint32_t>offset,
                                              <uint32_t>n, total[b, j], &qloc[0], &mass[b, 0])
            continue
        qp = _q_row(q_dense, q_offset, q_counts, q_ids, b, j, K, offset, n, qloc)
        with nogil:
            dy_shard_residual_mass(&t[b, j, 0] if n else NULL, qp, <uint32_t>n, total[b, j],
                                   j == K, &mass[b, 0])


cdef const uint32_t *_q_row(q_dense, Py_ssize_t q_offset, q_counts, q_ids, Py_ssize_t b,
                            int j, Py_ssize_t K, Py_ssize_t offset, Py_ssize_t n,
                            uint32_t[::1] qloc) except? NULL:
    """This shard's local q counts of (b, j) (NULL: all zero, or the bonus position)."""
    cdef const uint32_t[:, :, ::1] qd
    cdef const uint32_t[:, :, ::1] qc
    cdef const int32_t[:, :, ::1] qi
    if j >= K or n == 0:
        return NULL
    if q_dense is not None:
        qd = q_dense
        return &qd[b, j, q_offset]
    if q_counts is None:
        return NULL
    qc = q_counts
    qi = q_ids
    if qc.shape[2] == 0:
        return NULL
    dy_shard_q_local(&qc[b, j, 0], &qi[b, j, 0], <uint32_t>qc.shape[2], <uint32_t>offset,
                     <uint32_t>n, &qloc[0])
    return &qloc[0]


def residual_find(target, const int32_t[::1] draw_at, q_dense, Py_ssize_t q_offset, q_counts,
                  q_ids, Py_ssize_t offset, const uint64_t[:, ::1] total,
                  const uint64_t[::1] x_hi, const uint64_t[::1] x_lo, int64_t[::1] token):
    """The owner's token (dy_shard_residual_find): for the rows with
    draw_at[b] = j >= 0, token[b] = offset + the first local id whose running
    mass exceeds x = x_hi * 2**64 + x_lo (-1 if the shard's mass is <= x);
    -1 for rows without a draw.  Arguments as residual_mass."""
    cdef const uint32_t[:, :, ::1] t = target.view(np.uint32)
    cdef Py_ssize_t b, B = t.shape[0], K1 = t.shape[1], n = t.shape[2], K = K1 - 1
    cdef int j
    cdef int32_t v
    cdef const uint32_t *qp
    _q_args("q", q_dense, q_offset, q_counts, q_ids, B, K, n)
    _shard(offset, n, max(offset + n, 1))
    for name, arr in (("draw_at", draw_at), ("x_hi", x_hi), ("x_lo", x_lo), ("token", token)):
        _shape(name, (arr.shape[0],), (B,))
    _shape("total", (total.shape[0], total.shape[1]), (B, K1))
    cdef uint32_t[::1] qloc = np.zeros(max(n, 1), np.uint32)
    for b in range(B):
        token[b] = -1
        j = draw_at[b]
        if j < 0:
            continue
        if j > K:
            raise ValueError(f"draw_at: row {b}: {j} is not in [-1, k={K}]")
        qp = _q_row(q_dense, q_offset, q_counts, q_ids, b, j, K, offset, n, qloc)
        with nogil:
            v = dy_shard_residual_find(&t[b, j, 0] if n else NULL, qp, <uint32_t>n,
                                       total[b, j], j == K, dy_make128(x_hi[b], x_lo[b]))
        if v >= 0:
            token[b] = offset + v


def correction_pick(const int64_t[:, :, ::1] mass, const int32_t[::1] draw_at,
                    const uint64_t[::1] seed, const uint32_t[::1] generation,
                    const uint32_t[::1] round, const uint32_t[::1] position,
                    int32_t[::1] owner, uint64_t[::1] rel_hi, uint64_t[::1] rel_lo,
                    int32_t[::1] status):
    """The correction draw of every request with draw_at[b] = j >= 0 from the
    gathered masses int64 [S, B, 3] (dy_shard_correction_pick at position[b] + j):
    owner int32 [B] (the shard index in id order; -1 without a draw, -2 when
    the total mass is 0), X minus the mass before the owner as rel_hi * 2**64
    + rel_lo, status int32 [B] (RNG_EXHAUSTED)."""
    cdef Py_ssize_t b, S = mass.shape[0], B = mass.shape[1]
    cdef dy_u128 rel
    cdef uint64_t stride = <uint64_t>(B * 3)
    if S < 1 or mass.shape[2] != 3:
        raise ValueError(f"mass: shape ({S}, {B}, {mass.shape[2]}) must be (S >= 1, B, 3)")
    for name, arr in (("draw_at", draw_at), ("seed", seed), ("generation", generation),
                      ("round", round), ("position", position), ("owner", owner),
                      ("rel_hi", rel_hi), ("rel_lo", rel_lo), ("status", status)):
        _shape(name, (arr.shape[0],), (B,))
    with nogil:
        for b in range(B):
            owner[b] = -1
            rel_hi[b] = 0
            rel_lo[b] = 0
            status[b] = 0
            if draw_at[b] < 0:
                continue
            status[b] = dy_shard_correction_pick(&mass[0, b, 0], stride, <uint32_t>S, seed[b],
                                                 generation[b], round[b],
                                                 position[b] + <uint32_t>draw_at[b],
                                                 &owner[b], &rel)
            rel_hi[b] = rel.hi
            rel_lo[b] = rel.lo


def proposal_tickets(const uint64_t[::1] seed, const uint32_t[::1] generation,
                     const uint32_t[::1] round, const uint32_t[::1] position,
                     int64_t[::1] out):
    """philox.proposal_ticket per row (dy_proposal_ticket)."""
    cdef Py_ssize_t b, B = seed.shape[0]
    for name, arr in (("generation", generation), ("round", round), ("position", position),
                      ("out", out)):
        _shape(name, (arr.shape[0],), (B,))
    with nogil:
        for b in range(B):
            out[b] = dy_proposal_ticket(seed[b], generation[b], round[b], position[b])
