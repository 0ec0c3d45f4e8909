# C API of backends/include/dyadic_shard.h (per-shard work of dyadic.distributed).
from libc.stdint cimport uint32_t, int32_t, uint64_t, int64_t

cdef extern from "dyadic_shard.h" nogil:
    enum: DY_MAX_VOCAB
    enum: DY_SHARD_SUMMARY
    enum: DY_TOTAL
    ctypedef struct dy_u128:
        uint64_t hi
        uint64_t lo
    dy_u128 dy_make128(uint64_t hi, uint64_t lo)
    int dy_uniform_below_u128(dy_u128 n, uint64_t seed, uint32_t generation, uint32_t round,
                              uint32_t position, uint32_t domain, uint32_t *draw_index,
                              dy_u128 *out)
    uint32_t dy_proposal_ticket(uint64_t seed, uint32_t generation, uint32_t round,
                                uint32_t position)
    int32_t dy_draw_dense(const uint32_t *counts, uint32_t width, uint32_t r)
    uint64_t dy_shard_topk_ws_words(uint32_t k)
    int dy_shard_topk_row(const float *x, const float *bias, double temperature, uint32_t n,
                          uint32_t offset, uint32_t vocab, uint32_t k, int32_t *cx,
                          int32_t *cb, int32_t *cg, uint32_t *m_out, uint64_t *ws)
    uint64_t dy_shard_merge_ws_words(uint32_t width)
    int dy_shard_merge_row(const int32_t *cx, const int32_t *cb, const int32_t *cg,
                           uint32_t m, double temperature, int greedy, int policy,
                           uint32_t vocab, uint32_t width, uint64_t seed,
                           uint32_t generation, uint32_t round, uint32_t position,
                           int32_t *token, uint32_t *counts, int32_t *ids, uint64_t *ws)
    int dy_shard_target_summary(const uint32_t *bits, uint32_t n, uint32_t offset,
                                uint32_t vocab, int64_t draft, const uint32_t *qshard,
                                int argmax, int64_t *f)
    int dy_shard_verify_check(const int64_t *f, uint64_t stride, uint32_t world, uint32_t k,
                              const uint32_t *cd, int greedy, uint64_t *total, uint64_t *pd,
                              int32_t *best)
    int dy_shard_verify_accept(const int64_t *draft, const uint32_t *cd,
                               const uint64_t *total, const uint64_t *pd,
                               const int32_t *best, uint32_t k, int greedy, uint64_t seed,
                               uint32_t generation, uint32_t round, uint32_t position,
                               int32_t *accepted, int32_t *tokens, int32_t *draw_at)
    void dy_shard_q_local(const uint32_t *qc, const int32_t *qi, uint32_t width,
                          uint32_t offset, uint32_t n, uint32_t *out)
    void dy_shard_residual_mass(const uint32_t *bits, const uint32_t *q, uint32_t n,
                                uint64_t total, int bonus, int64_t *mass)
    void dy_shard_residual_mass_sparse(const uint32_t *bits, const uint32_t *qc,
                                       const int32_t *qi, uint32_t width, uint32_t offset,
                                       uint32_t n, uint64_t total, uint32_t *ws, int64_t *mass)
    int32_t dy_shard_residual_find(const uint32_t *bits, const uint32_t *q, uint32_t n,
                                   uint64_t total, int bonus, dy_u128 x)
    int dy_shard_correction_pick(const int64_t *mass, uint64_t stride, uint32_t world,
                                 uint64_t seed, uint32_t generation, uint32_t round,
                                 uint32_t position, int32_t *owner, dy_u128 *rel)
    void dy_shard_dense_weights(const float *x, const float *bias, double temperature,
                                uint32_t n, double zmax, uint64_t *w, uint64_t *sums)
