# C API of backends/include/dyadic_core.h used by the CPU backend.
from libc.stdint cimport uint32_t, int32_t, uint64_t, int64_t

cdef extern from "dyadic_core.h" nogil:
    enum: DY_MAX_VOCAB
    ctypedef struct dy_u128:
        uint64_t hi
        uint64_t lo
    void dy_philox4x32(const uint32_t *ctr, const uint32_t *key, int rounds, uint32_t *out)
    uint32_t dy_proposal_ticket(uint64_t seed, uint32_t generation, uint32_t round,
                                uint32_t position)
    int dy_uniform_below_u128(dy_u128 n, uint64_t seed, uint32_t generation, uint32_t round,
                              uint32_t position, uint32_t domain, uint32_t *draw_index,
                              dy_u128 *out)
    uint64_t dy_exp2_neg_q62(uint32_t f)
    uint64_t dy_weight_from_gap(double t)
    uint64_t dy_alloc_ws_words(uint32_t vocab, uint32_t top_k)
    uint64_t dy_verify_host_ws_words(uint32_t vocab, uint32_t k)
    int dy_allocate_row(const float *x, const float *bias, double temperature, int logits,
                        int policy, uint32_t vocab, uint32_t top_k, uint32_t *counts,
                        int32_t *ids, uint64_t *ws, int32_t *argmax_out)
    int dy_propose_row(const float *x, const float *bias, double temperature, int policy,
                       uint32_t vocab, uint32_t top_k, uint64_t seed, uint32_t generation,
                       uint32_t round, uint32_t position, int32_t *token, uint32_t *counts,
                       int32_t *ids, uint64_t *ws)
    int32_t dy_draw_dense(const uint32_t *counts, uint32_t width, uint32_t r)
    int32_t dy_draw_sparse(const uint32_t *counts, const int32_t *ids, uint32_t width,
                           uint32_t r)
    int32_t dy_draw_sparse_host(const uint32_t *counts, const int32_t *ids, uint32_t width,
                                uint32_t r)
    int dy_verify_row_host(const uint32_t *target, const int32_t *draft, const uint32_t *q_counts,
                           const int32_t *q_ids, uint32_t width, uint32_t k, uint32_t vocab,
                           int greedy, uint64_t seed, uint32_t generation, uint32_t round,
                           uint32_t position, uint64_t *ws, int32_t *accepted, int32_t *tokens)
    uint64_t dy_verify_logits_ws_words(uint32_t vocab, uint32_t k)
    int dy_verify_logits_row_host(const float *target, const int32_t *draft,
                                  const uint32_t *q_counts, const int32_t *q_ids, uint32_t width,
                                  uint32_t k, uint32_t vocab, int greedy, double temperature,
                                  int64_t top_k, uint32_t top_p_bits, uint32_t min_p_bits,
                                  uint64_t seed, uint32_t generation, uint32_t round,
                                  uint32_t position, uint64_t *ws, int32_t *accepted,
                                  int32_t *tokens)
    uint64_t dy_logits_target_ws_words(uint32_t vocab)
    int dy_logits_target_row(const float *x, const float *bias, uint32_t vocab,
                             double temperature, int64_t top_k,
                             uint32_t top_p_bits, uint32_t min_p_bits, uint64_t *p, uint64_t *ws,
                             uint64_t *total, int32_t *argmax)
    int dy_logits_params_status(double temperature, int64_t top_k, uint32_t top_p_bits,
                                uint32_t min_p_bits)
    uint64_t dy_alloc_filtered_ws_words(uint32_t vocab)
    int dy_allocate_filtered_row(const float *x, const float *bias, double temperature,
                                 int64_t top_k, uint32_t top_p_bits, uint32_t min_p_bits,
                                 int policy, uint32_t vocab, uint32_t width, uint32_t *counts,
                                 int32_t *ids, uint64_t *ws)
    int dy_propose_filtered_row(const float *x, const float *bias, double temperature,
                                int64_t top_k, uint32_t top_p_bits, uint32_t min_p_bits,
                                int policy, uint32_t vocab, uint32_t width, uint64_t seed,
                                uint32_t generation, uint32_t round, uint32_t position,
                                int32_t *token, uint32_t *counts, int32_t *ids, uint64_t *ws)
    void dy_scale_target(uint64_t *p, uint32_t vocab, uint64_t *total)
    int dy_verify_row_ragged_host(const uint32_t *target, const int32_t *draft,
                                  const uint32_t *q_counts, const int32_t *q_ids, uint32_t width,
                                  uint32_t k, int32_t n, uint32_t vocab, int greedy,
                                  uint64_t seed, uint32_t generation, uint32_t round,
                                  uint32_t position, uint64_t *ws, int32_t *accepted,
                                  int32_t *tokens)
    int dy_verify_logits_row_ragged_host(const float *target, const int32_t *draft,
                                         const uint32_t *q_counts, const int32_t *q_ids,
                                         uint32_t width, uint32_t k, int32_t n, uint32_t vocab,
                                         int greedy, double temperature, int64_t top_k,
                                         uint32_t top_p_bits, uint32_t min_p_bits, uint64_t seed,
                                         uint32_t generation, uint32_t round, uint32_t position,
                                         uint64_t *ws, int32_t *accepted, int32_t *tokens)
