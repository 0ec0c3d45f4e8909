# cython: language_level=3
"""Thin typed loops over rows around backends/include/dyadic_core.h.

Inputs are C-contiguous NumPy arrays (see dyadic/_backend.py); outputs are
preallocated.  Each wrapper checks the shapes it indexes with (a mismatch is
a structural error: ValueError naming the array, as the reference backend);
the row loops run without the GIL and never raise for bad data: the core
bounds-checks every id it addresses memory with and each row gets a status
code, so memory safety does not rest on the Python layer's validation.
"""
import numpy as np
cimport numpy as cnp
from libc.stdint cimport uint32_t, int32_t, uint64_t, uint8_t, int64_t
include "dyadic_core.pxi"

cnp.import_array()

cdef int _shape1(str name, Py_ssize_t got, Py_ssize_t want) except -1:
    if got != want:
        raise ValueError(f"{name}: shape ({got},) must be ({want},)")
    return 0


cdef int _shape2(str name, Py_ssize_t g0, Py_ssize_t g1, Py_ssize_t w0, Py_ssize_t w1) except -1:
    if g0 != w0 or g1 != w1:
        raise ValueError(f"{name}: shape ({g0}, {g1}) must be ({w0}, {w1})")
    return 0


cdef int _vocab(str name, Py_ssize_t v) except -1:
    if not 1 <= v <= DY_MAX_VOCAB:
        raise ValueError(f"{name}: vocabulary size {v} must be in [1, 2**24]")
    return 0


cdef int _key_shapes(str prim, Py_ssize_t B, Py_ssize_t ns, Py_ssize_t ng, Py_ssize_t nr,
                     Py_ssize_t np_, Py_ssize_t nt) except -1:
    """The four key arrays and the tokens output: one entry per row."""
    cdef str name = None
    if ns != B:
        name, n = "seed", ns
    elif ng != B:
        name, n = "generation", ng
    elif nr != B:
        name, n = "round", nr
    elif np_ != B:
        name, n = "position", np_
    elif nt != B:
        name, n = "tokens", nt
    if name is not None:
        raise ValueError(f"{prim}: seed, generation, round, position and tokens need {B} "
                         f"entries (one per row); {name} has {n}")
    return 0


def philox4x32(const uint32_t[:, ::1] counters, const uint32_t[:, ::1] keys, int rounds,
               uint32_t[:, ::1] out):
    cdef Py_ssize_t n, N = counters.shape[0]
    with nogil:
        for n in range(N):
            dy_philox4x32(&counters[n, 0], &keys[n, 0], rounds, &out[n, 0])


def weight_from_gap(double t):
    return dy_weight_from_gap(t)


def exp2_neg_q62(uint32_t f):
    return dy_exp2_neg_q62(f)


def logits_target_row(const float[::1] x, double temperature, int64_t top_k,
                      uint32_t top_p_bits, uint32_t min_p_bits):
    """dy_logits_target_row and dy_scale_target on one row, as verify(logits=True)
    builds a target row (tests compare it with the reference's processed_row):
    (status, P uint64 [V], T, argmax); the parameters are checked first."""
    cdef Py_ssize_t Vs = x.shape[0]
    _vocab("x", Vs)
    cdef uint32_t V = <uint32_t>Vs
    p = np.zeros(Vs, np.uint64)
    cdef uint64_t[::1] pv = p
    cdef uint64_t[::1] ws = np.empty(<Py_ssize_t>dy_logits_target_ws_words(V), np.uint64)
    cdef uint64_t total = 0
    cdef int32_t arg = -1
    cdef int st = dy_logits_params_status(temperature, top_k, top_p_bits, min_p_bits)
    if st == 0:
        st = dy_logits_target_row(&x[0], NULL, V, temperature, top_k, top_p_bits, min_p_bits,
                                  &pv[0], &ws[0], &total, &arg)
    if st == 0:
        dy_scale_target(&pv[0], V, &total)
    return st, p, total, arg


cdef int _alloc_rows(const float[:, ::1] x, bias, const double[::1] temperature, bint logits,
                     int policy, int top_k, uint32_t[:, ::1] counts, ids, int32_t[::1] status,
                     const uint64_t *seed, const uint32_t *generation, const uint32_t *round,
                     const uint32_t *position, int32_t *tokens) except -1:
    """allocate (tokens NULL) or propose (tokens and the four key arrays, length B) per row.

    A failed row gets counts 0, ids -1 (and token -1) besides its status."""
    cdef Py_ssize_t b, j, B = x.shape[0]
    cdef Py_ssize_t Vs = x.shape[1]
    cdef uint32_t V = <uint32_t>Vs
    cdef const float[:, ::1] bv
    cdef int32_t[:, ::1] iv
    cdef const float *bp = NULL
    cdef int32_t *ip = NULL
    cdef Py_ssize_t nb = 0, W
    cdef int st
    _vocab("x", Vs)
    _shape1("temperature", temperature.shape[0], B)
    if policy != 0 and policy != 1:
        raise ValueError(f"policy: unknown policy code {policy!r}")
    if not 0 <= top_k <= Vs:
        raise ValueError(f"top_k: {top_k} must be in [0, V] = [0, {Vs}] (0: dense)")
    W = top_k if top_k else Vs
    _shape2("counts", counts.shape[0], counts.shape[1], B, W)
    if bias is not None:
        bv = bias
        nb = bv.shape[0]
        if (nb != 1 and nb != B) or bv.shape[1] != Vs:
            raise ValueError(f"bias: shape ({nb}, {bv.shape[1]}) must be (1, {Vs}) or ({B}, {Vs})")
    if top_k:
        if ids is None:
            raise ValueError("ids: required for sparse rows (top_k > 0)")
        iv = ids
        _shape2("ids", iv.shape[0], iv.shape[1], B, W)
    elif ids is not None:
        raise ValueError("ids: must be None for dense rows (top_k = 0)")
    _shape1("status", status.shape[0], B)
    if B == 0:
        return 0
    cdef uint64_t[::1] ws = np.empty(max(<Py_ssize_t>dy_alloc_ws_words(V, top_k), 1), np.uint64)
    with nogil:
        for b in range(B):
            bp = NULL
            if nb:
                bp = &bv[b if nb > 1 else 0, 0]
            ip = NULL
            if top_k:
                ip = &iv[b, 0]
            if tokens != NULL:
                st = dy_propose_row(&x[b, 0], bp, temperature[b], policy, V, <uint32_t>top_k,
                                    seed[b], generation[b], round[b], position[b], &tokens[b],
                                    &counts[b, 0], ip, &ws[0])
            else:
                st = dy_allocate_row(&x[b, 0], bp, temperature[b], logits, policy, V,
                                     <uint32_t>top_k, &counts[b, 0], ip, &ws[0], NULL)
            status[b] = st
            if st:
                for j in range(W):
                    counts[b, j] = 0
                if top_k:
                    for j in range(W):
                        iv[b, j] = -1
                if tokens != NULL:
                    tokens[b] = -1
    return 0


def allocate(const float[:, ::1] x, bias, const double[::1] temperature, bint logits,
             int policy, int top_k, uint32_t[:, ::1] counts, ids, int32_t[::1] status):
    _alloc_rows(x, bias, temperature, logits, policy, top_k, counts, ids, status,
                NULL, NULL, NULL, NULL, NULL)


def propose(const float[:, ::1] x, bias, const double[::1] temperature, int policy, int top_k,
            const uint64_t[::1] seed, const uint32_t[::1] generation, const uint32_t[::1] round,
            const uint32_t[::1] position, int32_t[::1] tokens, uint32_t[:, ::1] counts, ids,
            int32_t[::1] status):
    cdef Py_ssize_t B = x.shape[0]
    _key_shapes("propose", B, seed.shape[0], generation.shape[0], round.shape[0],
                position.shape[0], tokens.shape[0])
    if B == 0:
        _alloc_rows(x, bias, temperature, True, policy, top_k, counts, ids, status,
                    NULL, NULL, NULL, NULL, NULL)
        return
    _alloc_rows(x, bias, temperature, True, policy, top_k, counts, ids, status,
                &seed[0], &generation[0], &round[0], &position[0], &tokens[0])


def draw(const uint32_t[:, ::1] counts, ids, const uint64_t[::1] seed,
         const uint32_t[::1] generation, const uint32_t[::1] round, const uint32_t[::1] position,
         int32_t[::1] tokens):
    """Dense rows: the first id whose running count exceeds the ticket (ids < W).
    Sparse rows are checked first (dy_draw_sparse_host): a bad row gives -1."""
    cdef Py_ssize_t b, B = counts.shape[0]
    cdef uint32_t W = <uint32_t>counts.shape[1]
    cdef const int32_t[:, ::1] iv
    cdef bint sparse = ids is not None
    cdef uint32_t r
    if sparse:
        iv = ids
        _shape2("ids", iv.shape[0], iv.shape[1], B, counts.shape[1])
    _key_shapes("draw", B, seed.shape[0], generation.shape[0], round.shape[0],
                position.shape[0], tokens.shape[0])
    with nogil:
        for b in range(B):
            r = dy_proposal_ticket(seed[b], generation[b], round[b], position[b])
            if sparse:
                tokens[b] = dy_draw_sparse_host(&counts[b, 0], &iv[b, 0], W, r)
            else:
                tokens[b] = dy_draw_dense(&counts[b, 0], W, r)


cdef int _verify_row_shapes(Py_ssize_t B, Py_ssize_t k1, Py_ssize_t greedy, Py_ssize_t seed,
                            Py_ssize_t generation, Py_ssize_t round_, Py_ssize_t position,
                            Py_ssize_t accepted, Py_ssize_t tokens0, Py_ssize_t tokens1,
                            Py_ssize_t status) except -1:
    """verify's per-request arrays: greedy flags, the four key fields, accepted,
    tokens [B, k+1] and status (ValueError naming the array)."""
    _shape1("greedy", greedy, B)
    _key_shapes("verify", B, seed, generation, round_, position, B)
    _shape1("accepted", accepted, B)
    _shape2("tokens", tokens0, tokens1, B, k1)
    _shape1("status", status, B)
    return 0


cdef Py_ssize_t _q_width(q_counts, q_ids, Py_ssize_t B, Py_ssize_t k, Py_ssize_t V) except -1:
    """The row width W of verify's q (V for a dense or a point-mass q); ValueError
    naming the array whose shape does not fit [B, k, W] (dense: W = V)."""
    cdef const uint32_t[:, :, ::1] qc
    cdef const int32_t[:, :, ::1] qi
    if q_counts is None:
        if q_ids is not None:
            raise ValueError("q_ids: given without q_counts")
        return V
    qc = q_counts
    if qc.shape[0] != B or qc.shape[1] != k:
        raise ValueError(f"q_counts: shape ({qc.shape[0]}, {qc.shape[1]}, {qc.shape[2]}) "
                         f"must be ({B}, {k}, W)")
    if q_ids is None:
        if qc.shape[2] != V:
            raise ValueError(f"q_counts: dense width {qc.shape[2]} must equal the target's "
                             f"vocabulary {V}")
        return V
    qi = q_ids
    if qi.shape[0] != qc.shape[0] or qi.shape[1] != qc.shape[1] or qi.shape[2] != qc.shape[2]:
        raise ValueError(f"q_ids: shape ({qi.shape[0]}, {qi.shape[1]}, {qi.shape[2]}) must "
                         f"be ({qc.shape[0]}, {qc.shape[1]}, {qc.shape[2]})")
    return qc.shape[2]


def verify(target, const int32_t[:, ::1] draft, q_counts, q_ids, const uint8_t[::1] greedy,
           const uint64_t[::1] seed, const uint32_t[::1] generation, const uint32_t[::1] round,
           const uint32_t[::1] position, int32_t[::1] accepted, int32_t[:, ::1] tokens,
           int32_t[::1] status, num_drafts=None):
    """Shapes are checked here (ValueError naming the array; a dense q must
    have width V); ids and counts inside the rows are checked by
    dy_verify_row_host, which fails a bad request closed with its status.
    ``num_drafts`` (int32 [B] or None): request b verifies its first n_b drafts
    (dy_verify_row_ragged_host, which bounds-checks n_b itself)."""
    cdef const uint32_t[:, :, ::1] t = target.view(np.uint32)
    cdef Py_ssize_t b, B = t.shape[0]
    cdef Py_ssize_t k1 = t.shape[1], Vs = t.shape[2]
    cdef uint32_t k, V, W
    cdef const uint32_t[:, :, ::1] qc
    cdef const int32_t[:, :, ::1] qi
    cdef const uint32_t *qcp = NULL
    cdef const int32_t *qip = NULL
    cdef bint has_q = q_counts is not None, has_ids = q_ids is not None
    if k1 < 1:
        raise ValueError(f"target: shape ({B}, {k1}, {Vs}) must be [B, k+1, V] with k+1 >= 1")
    _vocab("target", Vs)
    k = <uint32_t>(k1 - 1)
    V = <uint32_t>Vs
    _shape2("draft", draft.shape[0], draft.shape[1], B, k1 - 1)
    W = <uint32_t>_q_width(q_counts, q_ids, B, k1 - 1, Vs)
    if has_q:
        qc = q_counts
    if has_ids:
        qi = q_ids
    _verify_row_shapes(B, k1, greedy.shape[0], seed.shape[0], generation.shape[0],
                       round.shape[0], position.shape[0], accepted.shape[0], tokens.shape[0],
                       tokens.shape[1], status.shape[0])
    cdef const int32_t[::1] nd
    cdef bint ragged = num_drafts is not None
    if ragged:
        nd = num_drafts
        _shape1("num_drafts", nd.shape[0], B)
    cdef uint64_t[::1] ws = np.empty(<Py_ssize_t>dy_verify_host_ws_words(V, k), np.uint64)
    with nogil:
        for b in range(B):
            qcp = NULL
            qip = NULL
            if has_q and k:
                qcp = &qc[b, 0, 0]
            if has_ids and k:
                qip = &qi[b, 0, 0]
            if ragged:
                status[b] = dy_verify_row_ragged_host(
                    &t[b, 0, 0], &draft[b, 0] if k else NULL, qcp, qip, W, k, nd[b], V,
                    greedy[b], seed[b], generation[b], round[b], position[b], &ws[0],
                    &accepted[b], &tokens[b, 0])
                continue
            status[b] = dy_verify_row_host(&t[b, 0, 0], &draft[b, 0] if k else NULL, qcp, qip, W, k, V,
                                      greedy[b], seed[b], generation[b], round[b], position[b],
                                      &ws[0], &accepted[b], &tokens[b, 0])


def verify_logits(const float[:, :, ::1] target, const int32_t[:, ::1] draft, q_counts, q_ids,
                  const uint8_t[::1] greedy, const double[::1] temperature,
                  const int64_t[::1] top_k, top_p, min_p, const uint64_t[::1] seed,
                  const uint32_t[::1] generation, const uint32_t[::1] round,
                  const uint32_t[::1] position, int32_t[::1] accepted, int32_t[:, ::1] tokens,
                  int32_t[::1] status, num_drafts=None):
    """verify(..., logits=True): target float32 logits [B, k+1, V]; temperature
    float64 [B], top_k int64 [B], top_p / min_p float32 [B] (read as bits).  Shapes
    are checked here (ValueError naming the array); the parameters, target rows,
    ids and counts are checked by dy_verify_logits_row_host, which fails a bad
    request closed with its status.  ``num_drafts`` (int32 [B] or None): request b
    verifies its first n_b drafts (dy_verify_logits_row_ragged_host, which
    bounds-checks n_b itself)."""
    cdef Py_ssize_t b, B = target.shape[0]
    cdef Py_ssize_t k1 = target.shape[1], Vs = target.shape[2]
    cdef uint32_t k, V, W
    cdef const uint32_t[::1] tp = top_p.view(np.uint32)
    cdef const uint32_t[::1] mp = min_p.view(np.uint32)
    cdef const uint32_t[:, :, ::1] qc
    cdef const int32_t[:, :, ::1] qi
    cdef const uint32_t *qcp = NULL
    cdef const int32_t *qip = NULL
    cdef bint has_q = q_counts is not None, has_ids = q_ids is not None
    if k1 < 1:
        raise ValueError(f"target: shape ({B}, {k1}, {Vs}) must be [B, k+1, V] with k+1 >= 1")
    _vocab("target", Vs)
    k = <uint32_t>(k1 - 1)
    V = <uint32_t>Vs
    _shape2("draft", draft.shape[0], draft.shape[1], B, k1 - 1)
    W = <uint32_t>_q_width(q_counts, q_ids, B, k1 - 1, Vs)
    if has_q:
        qc = q_counts
    if has_ids:
        qi = q_ids
    _verify_row_shapes(B, k1, greedy.shape[0], seed.shape[0], generation.shape[0],
                       round.shape[0], position.shape[0], accepted.shape[0], tokens.shape[0],
                       tokens.shape[1], status.shape[0])
    _shape1("temperature", temperature.shape[0], B)
    _shape1("top_k", top_k.shape[0], B)
    _shape1("top_p", tp.shape[0], B)
    _shape1("min_p", mp.shape[0], B)
    cdef const int32_t[::1] nd
    cdef bint ragged = num_drafts is not None
    if ragged:
        nd = num_drafts
        _shape1("num_drafts", nd.shape[0], B)
    cdef uint64_t[::1] ws = np.empty(<Py_ssize_t>dy_verify_logits_ws_words(V, k), np.uint64)
    with nogil:
        for b in range(B):
            qcp = NULL
            qip = NULL
            if has_q and k:
                qcp = &qc[b, 0, 0]
            if has_ids and k:
                qip = &qi[b, 0, 0]
            if ragged:
                status[b] = dy_verify_logits_row_ragged_host(
                    &target[b, 0, 0], &draft[b, 0] if k else NULL, qcp, qip, W, k, nd[b], V,
                    greedy[b], temperature[b], top_k[b], tp[b], mp[b], seed[b], generation[b],
                    round[b], position[b], &ws[0], &accepted[b], &tokens[b, 0])
                continue
            status[b] = dy_verify_logits_row_host(
                &target[b, 0, 0], &draft[b, 0] if k else NULL, qcp, qip, W, k, V, greedy[b],
                temperature[b], top_k[b], tp[b], mp[b], seed[b], generation[b], round[b],
                position[b], &ws[0], &accepted[b], &tokens[b, 0])


cdef int _filtered_rows(const float[:, ::1] x, bias, const double[::1] temperature,
                        const int64_t[::1] top_k, top_p, min_p, int policy, int width,
                        uint32_t[:, ::1] counts, ids, int32_t[::1] status,
                        const uint64_t *seed, const uint32_t *generation,
                        const uint32_t *round, const uint32_t *position,
                        int32_t *tokens) except -1:
    """allocate (tokens NULL) or propose with top_p / min_p (per-row top_k int64 [B],
    top_p / min_p float32 [B] read as bits).  A failed row gets counts 0, ids -1 (and
    token -1) besides its status."""
    cdef Py_ssize_t b, j, B = x.shape[0]
    cdef Py_ssize_t Vs = x.shape[1]
    cdef uint32_t V = <uint32_t>Vs
    cdef const float[:, ::1] bv
    cdef int32_t[:, ::1] iv
    cdef const float *bp = NULL
    cdef int32_t *ip = NULL
    cdef Py_ssize_t nb = 0, W
    cdef int st
    cdef const uint32_t[::1] tp = top_p.view(np.uint32)
    cdef const uint32_t[::1] mp = min_p.view(np.uint32)
    _vocab("x", Vs)
    _shape1("temperature", temperature.shape[0], B)
    _shape1("top_k", top_k.shape[0], B)
    _shape1("top_p", tp.shape[0], B)
    _shape1("min_p", mp.shape[0], B)
    if policy != 0 and policy != 1:
        raise ValueError(f"policy: unknown policy code {policy!r}")
    if not 0 <= width <= Vs:
        raise ValueError(f"width: {width} must be in [0, V] = [0, {Vs}] (0: dense)")
    W = width if width else Vs
    _shape2("counts", counts.shape[0], counts.shape[1], B, W)
    if bias is not None:
        bv = bias
        nb = bv.shape[0]
        if (nb != 1 and nb != B) or bv.shape[1] != Vs:
            raise ValueError(f"bias: shape ({nb}, {bv.shape[1]}) must be (1, {Vs}) or ({B}, {Vs})")
    if width:
        if ids is None:
            raise ValueError("ids: required for sparse rows (width > 0)")
        iv = ids
        _shape2("ids", iv.shape[0], iv.shape[1], B, W)
    elif ids is not None:
        raise ValueError("ids: must be None for dense rows (width = 0)")
    _shape1("status", status.shape[0], B)
    if B == 0:
        return 0
    cdef uint64_t[::1] ws = np.empty(<Py_ssize_t>dy_alloc_filtered_ws_words(V), np.uint64)
    with nogil:
        for b in range(B):
            bp = NULL
            if nb:
                bp = &bv[b if nb > 1 else 0, 0]
            ip = NULL
            if width:
                ip = &iv[b, 0]
            if tokens != NULL:
                st = dy_propose_filtered_row(&x[b, 0], bp, temperature[b], top_k[b], tp[b], mp[b],
                                             policy, V, <uint32_t>width, seed[b], generation[b],
                                             round[b], position[b], &tokens[b], &counts[b, 0],
                                             ip, &ws[0])
            else:
                st = dy_allocate_filtered_row(&x[b, 0], bp, temperature[b], top_k[b], tp[b],
                                              mp[b], policy, V, <uint32_t>width, &counts[b, 0],
                                              ip, &ws[0])
            status[b] = st
            if st:
                for j in range(W):
                    counts[b, j] = 0
                if width:
                    for j in range(W):
                        iv[b, j] = -1
                if tokens != NULL:
                    tokens[b] = -1
    return 0


def allocate_filtered(const float[:, ::1] x, bias, const double[::1] temperature,
                      const int64_t[::1] top_k, top_p, min_p, int policy, int width,
                      uint32_t[:, ::1] counts, ids, int32_t[::1] status):
    _filtered_rows(x, bias, temperature, top_k, top_p, min_p, policy, width, counts, ids,
                   status, NULL, NULL, NULL, NULL, NULL)


def propose_filtered(const float[:, ::1] x, bias, const double[::1] temperature,
                     const int64_t[::1] top_k, top_p, min_p, int policy, int width,
                     const uint64_t[::1] seed, const uint32_t[::1] generation,
                     const uint32_t[::1] round, const uint32_t[::1] position,
                     int32_t[::1] tokens, uint32_t[:, ::1] counts, ids, int32_t[::1] status):
    cdef Py_ssize_t B = x.shape[0]
    _key_shapes("propose", B, seed.shape[0], generation.shape[0], round.shape[0],
                position.shape[0], tokens.shape[0])
    if B == 0:
        _filtered_rows(x, bias, temperature, top_k, top_p, min_p, policy, width, counts, ids,
                       status, NULL, NULL, NULL, NULL, NULL)
        return
    _filtered_rows(x, bias, temperature, top_k, top_p, min_p, policy, width, counts, ids,
                   status, &seed[0], &generation[0], &round[0], &position[0], &tokens[0])
