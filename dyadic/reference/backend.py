"""The reference as a backend: the kernel interface on exact Python integers.

Slow (pure Python loops); meant for small inputs, tests and the fuzz command.
"""

import numpy as np

from .. import _spec, _status
from . import allocation, philox, sampling

_POLICIES = {code: name for name, code in _spec.POLICY_CODES.items()}


def _keys(seed, generation, round_, b):
    return (int(seed[b]), int(generation[b]), int(round_[b]))


def _bias_row(bias, b):
    if bias is None:
        return None
    return bias[b if bias.shape[0] > 1 else 0].tolist()


def _write_alloc(row, counts, ids, b):
    if ids is None:
        counts[b] = row
        return
    ids[b] = _spec.PAD_ID
    counts[b] = 0
    for j, (i, c) in enumerate(row):
        ids[b, j], counts[b, j] = i, c


class ReferenceBackend:
    name = "reference"

    def philox4x32(self, counters, keys, rounds, out):
        for n in range(counters.shape[0]):
            out[n] = philox.philox4x32(counters[n].tolist(), keys[n].tolist(), rounds)

    def allocate(self, x, bias, temperature, logits, policy, top_k, counts, ids, status):
        for b in range(x.shape[0]):
            st, row = allocation.allocate_row(
                x[b].tolist(), logits=logits, bias=_bias_row(bias, b),
                temperature=float(temperature[b]), top_k=top_k or None,
                policy=_POLICIES[policy])
            status[b] = st
            if not st:
                _write_alloc(row, counts, ids, b)

    def propose(self, x, bias, temperature, policy, top_k, seed, generation, round, position,
                tokens, counts, ids, status):
        for b in range(x.shape[0]):
            tokens[b] = -1
            if temperature[b] == 0:
                st, arg = allocation.argmax_row(x[b].tolist(), _bias_row(bias, b))
                status[b] = st
                if st:
                    continue
                tokens[b] = arg
                if ids is None:
                    row = [0] * x.shape[1]
                    row[arg] = _spec.TOTAL
                else:
                    row = [(arg, _spec.TOTAL)]
                _write_alloc(row, counts, ids, b)
                continue
            st, row = allocation.allocate_row(
                x[b].tolist(), logits=True, bias=_bias_row(bias, b),
                temperature=float(temperature[b]), top_k=top_k or None,
                policy=_POLICIES[policy])
            status[b] = st
            if st:
                continue
            _write_alloc(row, counts, ids, b)
            tokens[b] = sampling.draw_row(row, _keys(seed, generation, round, b), int(position[b]))

    def draw(self, counts, ids, seed, generation, round, position, tokens):
        for b in range(counts.shape[0]):
            if ids is None:
                row = counts[b].tolist()
            else:
                row = list(zip(ids[b].tolist(), counts[b].tolist()))
            tokens[b] = sampling.draw_row(row, _keys(seed, generation, round, b), int(position[b]))

    def verify(self, target, draft, q_counts, q_ids, greedy, seed, generation, round,
               position, accepted, tokens, status):
        bsz, k1, v = target.shape
        bits = target.view(np.uint32)
        for b in range(bsz):
            q_rows = None
            if q_counts is not None:
                q_rows = []
                for i in range(k1 - 1):
                    if q_ids is None:
                        q_rows.append(q_counts[b, i].tolist())
                    else:
                        dense = [0] * v
                        for t, c in zip(q_ids[b, i].tolist(), q_counts[b, i].tolist()):
                            if t >= 0:
                                dense[t] = c
                        q_rows.append(dense)
            try:
                st, acc, toks = sampling.verify_row(
                    [bits[b, i].tolist() for i in range(k1)], draft[b].tolist(), q_rows,
                    _keys(seed, generation, round, b), int(position[b]), bool(greedy[b]))
            except RuntimeError:
                st, acc, toks = _status.RNG_EXHAUSTED, 0, None
            status[b] = st
            accepted[b] = acc if not st else 0
            tokens[b] = toks if not st else -1
