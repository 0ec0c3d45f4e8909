"""CpuBackend: the kernel interface of dyadic/_backend.py on the compiled core.

Every method receives validated, C-contiguous arrays and preallocated outputs
(see ``dyadic._backend.Backend``), releases the GIL for its row loop and
writes one status code per row instead of raising.
"""

from ..._backend import Backend
from . import _kernels


class CpuBackend(Backend):
    name = "cpu"
    has_logits_verify = True
    has_logits_filters = True

    def usable(self):
        return True

    def philox4x32(self, counters, keys, rounds, out):
        _kernels.philox4x32(counters, keys, rounds, out)

    def allocate(self, x, bias, temperature, logits, policy, top_k, counts, ids, status):
        _kernels.allocate(x, bias, temperature, bool(logits), int(policy), int(top_k or 0),
                          counts, ids, status)

    def propose(self, x, bias, temperature, policy, top_k, seed, generation, round, position,
                tokens, counts, ids, status):
        _kernels.propose(x, bias, temperature, int(policy), int(top_k or 0), seed, generation,
                         round, position, tokens, counts, ids, status)

    def draw(self, counts, ids, seed, generation, round, position, tokens):
        _kernels.draw(counts, ids, seed, generation, round, position, tokens)

    def verify(self, target, draft, q_counts, q_ids, greedy, seed, generation, round,
               position, accepted, tokens, status, num_drafts=None):
        _kernels.verify(target, draft, q_counts, q_ids, greedy, seed, generation, round,
                        position, accepted, tokens, status, num_drafts)

    def verify_logits(self, target, draft, q_counts, q_ids, greedy, temperature, top_k, top_p,
                      min_p, seed, generation, round, position, accepted, tokens, status,
                      num_drafts=None):
        _kernels.verify_logits(target, draft, q_counts, q_ids, greedy, temperature, top_k,
                               top_p, min_p, seed, generation, round, position, accepted,
                               tokens, status, num_drafts)

    def allocate_filtered(self, x, bias, temperature, top_k, top_p, min_p, policy, width,
                          counts, ids, status):
        _kernels.allocate_filtered(x, bias, temperature, top_k, top_p, min_p, int(policy),
                                   int(width or 0), counts, ids, status)

    def propose_filtered(self, x, bias, temperature, top_k, top_p, min_p, policy, width, seed,
                         generation, round, position, tokens, counts, ids, status):
        _kernels.propose_filtered(x, bias, temperature, top_k, top_p, min_p, int(policy),
                                  int(width or 0), seed, generation, round, position, tokens,
                                  counts, ids, status)
