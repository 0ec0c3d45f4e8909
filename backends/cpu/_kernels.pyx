# cython: language_level=3
"""Thin typed loops over rows around backends/include/dyadic_core.h.

Inputs are validated, C-contiguous NumPy arrays (see dyadic/_backend.py);
outputs are preallocated.  Every loop runs without the GIL and never raises
for bad data: each row gets a status code.
"""
import numpy as np
cimport numpy as cnp
from libc.stdint cimport uint32_t, int32_t, uint64_t, uint8_t
include "dyadic_core.pxi"

cnp.import_array()


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


cdef int _alloc_rows(const float[:, ::1] x, bias, const double[::1] temperature, bint logits,
                     int policy, int top_k, uint32_t[:, ::1] counts, ids, int32_t[::1] status,
                     const uint64_t *seed, const uint32_t *generation, const uint32_t *round,
                     const uint32_t *position, int32_t *tokens) except -1:
    """allocate (tokens NULL) or propose (tokens and the four key arrays, length B) per row."""
    cdef Py_ssize_t b, B = x.shape[0]
    cdef uint32_t V = <uint32_t>x.shape[1]
    cdef const float[:, ::1] bv
    cdef int32_t[:, ::1] iv
    cdef const float *bp = NULL
    cdef int32_t *ip = NULL
    cdef Py_ssize_t nb = 0
    cdef uint64_t[::1] ws = np.empty(max(<Py_ssize_t>dy_alloc_ws_words(V, top_k), 1), np.uint64)
    if bias is not None:
        bv = bias
        nb = bv.shape[0]
    if ids is not None:
        iv = ids
    with nogil:
        for b in range(B):
            bp = NULL
            if nb:
                bp = &bv[b if nb > 1 else 0, 0]
            ip = NULL
            if top_k:
                ip = &iv[b, 0]
            if tokens != NULL:
                status[b] = dy_propose_row(&x[b, 0], bp, temperature[b], policy, V,
                                           <uint32_t>top_k, seed[b], generation[b], round[b],
                                           position[b], &tokens[b], &counts[b, 0], ip, &ws[0])
            else:
                status[b] = dy_allocate_row(&x[b, 0], bp, temperature[b], logits, policy, V,
                                            <uint32_t>top_k, &counts[b, 0], ip, &ws[0], NULL)
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
    if min(seed.shape[0], generation.shape[0], round.shape[0], position.shape[0],
           tokens.shape[0]) < B:
        raise ValueError(f"propose: seed, generation, round, position and tokens need {B} "
                         f"entries (one per row)")
    if B == 0:
        return
    _alloc_rows(x, bias, temperature, True, policy, top_k, counts, ids, status,
                &seed[0], &generation[0], &round[0], &position[0], &tokens[0])


def draw(const uint32_t[:, ::1] counts, ids, const uint64_t[::1] seed,
         const uint32_t[::1] generation, const uint32_t[::1] round, const uint32_t[::1] position,
         int32_t[::1] tokens):
    cdef Py_ssize_t b, B = counts.shape[0]
    cdef uint32_t W = <uint32_t>counts.shape[1]
    cdef const int32_t[:, ::1] iv
    cdef bint sparse = ids is not None
    cdef uint32_t r
    if sparse:
        iv = ids
    with nogil:
        for b in range(B):
            r = dy_proposal_ticket(seed[b], generation[b], round[b], position[b])
            if sparse:
                tokens[b] = dy_draw_sparse(&counts[b, 0], &iv[b, 0], W, r)
            else:
                tokens[b] = dy_draw_dense(&counts[b, 0], W, r)


def verify(target, const int32_t[:, ::1] draft, q_counts, q_ids, const uint8_t[::1] greedy,
           const uint64_t[::1] seed, const uint32_t[::1] generation, const uint32_t[::1] round,
           const uint32_t[::1] position, int32_t[::1] accepted, int32_t[:, ::1] tokens,
           int32_t[::1] status):
    cdef const uint32_t[:, :, ::1] t = target.view(np.uint32)
    cdef Py_ssize_t b, B = t.shape[0]
    cdef uint32_t k = <uint32_t>(t.shape[1] - 1)
    cdef uint32_t V = <uint32_t>t.shape[2]
    cdef uint32_t W = V
    cdef const uint32_t[:, :, ::1] qc
    cdef const int32_t[:, :, ::1] qi
    cdef const uint32_t *qcp = NULL
    cdef const int32_t *qip = NULL
    cdef bint has_q = q_counts is not None, has_ids = q_ids is not None
    cdef uint64_t[::1] ws = np.empty(<Py_ssize_t>dy_verify_host_ws_words(V, k), np.uint64)
    if has_q:
        qc = q_counts
        W = <uint32_t>qc.shape[2]
    if has_ids:
        qi = q_ids
    with nogil:
        for b in range(B):
            qcp = NULL
            qip = NULL
            if has_q and k:
                qcp = &qc[b, 0, 0]
            if has_ids and k:
                qip = &qi[b, 0, 0]
            status[b] = dy_verify_row_host(&t[b, 0, 0], &draft[b, 0] if k else NULL, qcp, qip, W, k, V,
                                      greedy[b], seed[b], generation[b], round[b], position[b],
                                      &ws[0], &accepted[b], &tokens[b, 0])
