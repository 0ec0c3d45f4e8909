"""The reference as a backend: the kernel interface on exact Python integers.

Slow (pure Python loops); meant for small inputs, tests and the fuzz command.
"""

import numpy as np

from .. import _spec, _status
from .._backend import Backend
from . import allocation, philox, sampling, target_logits

_POLICIES = {code: name for name, code in _spec.POLICY_CODES.items()}


def _keys(seed, generation, round_, b):
    return (int(seed[b]), int(generation[b]), int(round_[b]))


def _shape(name, arr, want):
    """ValueError naming ``arr`` unless its shape is ``want`` (the kernels'
    structural check: backends/cpu/_kernels.pyx raises the same)."""
    got = tuple(arr.shape)
    if got != tuple(want):
        raise ValueError(f"{name}: shape {got} must be {tuple(want)}")


def _vocab(name, v):
    if not 1 <= v <= _spec.MAX_VOCAB:
        raise ValueError(f"{name}: vocabulary size {v} must be in [1, 2**24]")


def _key_shapes(prim, batch, seed, generation, round_, position, tokens=None):
    """The four key arrays and the tokens output: one entry per row."""
    for name, a in (("seed", seed), ("generation", generation), ("round", round_),
                    ("position", position), ("tokens", tokens)):
        if a is not None and tuple(a.shape) != (batch,):
            n = a.shape[0] if a.ndim == 1 else tuple(a.shape)
            raise ValueError(f"{prim}: seed, generation, round, position and tokens need "
                             f"{batch} entries (one per row); {name} has {n}")


def _alloc_shapes(x, bias, temperature, policy, top_k, counts, ids, status):
    if x.ndim != 2:
        raise ValueError(f"x: shape {tuple(x.shape)} must be [B, V]")
    batch, v = x.shape
    _vocab("x", v)
    if bias is not None and (bias.ndim != 2 or bias.shape[0] not in (1, batch)
                             or bias.shape[1] != v):
        raise ValueError(f"bias: shape {tuple(bias.shape)} must be (1, {v}) or ({batch}, {v})")
    _shape("temperature", temperature, (batch,))
    if policy not in _POLICIES:
        raise ValueError(f"policy: unknown policy code {policy!r}")
    if not 0 <= top_k <= v:
        raise ValueError(f"top_k: {top_k} must be in [0, V] = [0, {v}] (0: dense)")
    _shape("counts", counts, (batch, top_k or v))
    if top_k:
        if ids is None:
            raise ValueError("ids: required for sparse rows (top_k > 0)")
        _shape("ids", ids, (batch, top_k))
    elif ids is not None:
        raise ValueError("ids: must be None for dense rows (top_k = 0)")
    _shape("status", status, (batch,))
    return batch


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


def _fail_alloc(counts, ids, b):
    """A failed allocate / propose row: counts 0, ids -1 (as the CPU and GPU kernels)."""
    counts[b] = 0
    if ids is not None:
        ids[b] = _spec.PAD_ID


class ReferenceBackend(Backend):
    name = "reference"
    has_logits_verify = True
    has_logits_filters = True

    def philox4x32(self, counters, keys, rounds, out):
        for n in range(counters.shape[0]):
            out[n] = philox.philox4x32(counters[n].tolist(), keys[n].tolist(), rounds)

    def allocate(self, x, bias, temperature, logits, policy, top_k, counts, ids, status):
        top_k = int(top_k or 0)
        _alloc_shapes(x, bias, temperature, policy, top_k, counts, ids, status)
        for b in range(x.shape[0]):
            st, row = allocation.allocate_row(
                x[b].tolist(), logits=logits, bias=_bias_row(bias, b),
                temperature=float(temperature[b]), top_k=top_k or None,
                policy=_POLICIES[policy])
            status[b] = st
            if st:
                _fail_alloc(counts, ids, b)
            else:
                _write_alloc(row, counts, ids, b)

    def propose(self, x, bias, temperature, policy, top_k, seed, generation, round, position,
                tokens, counts, ids, status):
        top_k = int(top_k or 0)
        batch = _alloc_shapes(x, bias, temperature, policy, top_k, counts, ids, status)
        _key_shapes("propose", batch, seed, generation, round, position, tokens)
        for b in range(x.shape[0]):
            tokens[b] = -1
            if temperature[b] == 0:
                st, arg = allocation.argmax_row(x[b].tolist(), _bias_row(bias, b))
                status[b] = st
                if st:
                    _fail_alloc(counts, ids, b)
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
                _fail_alloc(counts, ids, b)
                continue
            _write_alloc(row, counts, ids, b)
            tokens[b] = sampling.draw_row(row, _keys(seed, generation, round, b), int(position[b]))

    def allocate_filtered(self, x, bias, temperature, top_k, top_p, min_p, policy, width,
                          counts, ids, status):
        self._filtered(x, bias, temperature, top_k, top_p, min_p, policy, width, None, None,
                       counts, ids, status)

    def propose_filtered(self, x, bias, temperature, top_k, top_p, min_p, policy, width, seed,
                         generation, round, position, tokens, counts, ids, status):
        self._filtered(x, bias, temperature, top_k, top_p, min_p, policy, width,
                       (seed, generation, round, position), tokens, counts, ids, status)

    def _filtered(self, x, bias, temperature, top_k, top_p, min_p, policy, width, keys,
                  tokens, counts, ids, status):
        width = int(width or 0)
        batch = _alloc_shapes(x, bias, temperature, policy, width, counts, ids, status)
        for name, a in (("top_k", top_k), ("top_p", top_p), ("min_p", min_p)):
            _shape(name, a, (batch,))
        if keys is not None:
            _key_shapes("propose", batch, *keys, tokens)
        p_bits, m_bits = top_p.view(np.uint32), min_p.view(np.uint32)
        for b in range(batch):
            if tokens is not None:
                tokens[b] = -1
            kb, pb, mb = int(top_k[b]), int(p_bits[b]), int(m_bits[b])
            if kb < 0 or (width and kb < 1):
                status[b] = _status.TOP_K_INVALID
                _fail_alloc(counts, ids, b)
                continue
            kb = min(kb, width) if width else kb  # sparse: at most the width is kept
            if tokens is not None and temperature[b] == 0:
                st = target_logits.params_status(1.0, kb, pb, mb)
                if not st:
                    st, arg = allocation.argmax_row(x[b].tolist(), _bias_row(bias, b))
                status[b] = st
                if st:
                    _fail_alloc(counts, ids, b)
                    continue
                tokens[b] = arg
                if ids is None:
                    row = [0] * x.shape[1]
                    row[arg] = _spec.TOTAL
                else:
                    row = [(arg, _spec.TOTAL)]
                _write_alloc(row, counts, ids, b)
                continue
            st, row = allocation.allocate_filtered_row(
                x[b].tolist(), _bias_row(bias, b), float(temperature[b]), kb, not width,
                _POLICIES[policy], pb, mb)
            status[b] = st
            if st:
                _fail_alloc(counts, ids, b)
                continue
            _write_alloc(row, counts, ids, b)
            if keys is not None:
                tokens[b] = sampling.draw_row(row, _keys(*keys[:3], b), int(keys[3][b]))

    def draw(self, counts, ids, seed, generation, round, position, tokens):
        if counts.ndim != 2:
            raise ValueError(f"counts: shape {tuple(counts.shape)} must be [B, W]")
        batch = counts.shape[0]
        if ids is not None:
            _shape("ids", ids, counts.shape)
        _key_shapes("draw", batch, seed, generation, round, position, tokens)
        for b in range(batch):
            keys = _keys(seed, generation, round, b)
            if ids is None:
                tokens[b] = sampling.draw_dense_row(counts[b].tolist(), keys, int(position[b]))
            else:
                tokens[b] = sampling.draw_sparse_row(ids[b].tolist(), counts[b].tolist(), keys,
                                                     int(position[b]))

    def verify(self, target, draft, q_counts, q_ids, greedy, seed, generation, round,
               position, accepted, tokens, status, num_drafts=None):
        bits = target.view(np.uint32)

        def row(b, d, q, keys, pos):
            args = ([bits[b, i].tolist() for i in range(target.shape[1])], d, q, keys, pos,
                    bool(greedy[b]))
            if num_drafts is None:
                return sampling.verify_row(*args)
            return sampling.verify_row_ragged(*args, int(num_drafts[b]))

        _verify_rows(target, draft, q_counts, q_ids, greedy, seed, generation, round, position,
                     accepted, tokens, status, num_drafts, row)

    def verify_logits(self, target, draft, q_counts, q_ids, greedy, temperature, top_k, top_p,
                      min_p, seed, generation, round, position, accepted, tokens, status,
                      num_drafts=None):
        bsz = target.shape[0] if target.ndim == 3 else 0
        for name, a in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p),
                        ("min_p", min_p)):
            _shape(name, a, (bsz,))
        p_bits, m_bits = top_p.view(np.uint32), min_p.view(np.uint32)
        _verify_rows(target, draft, q_counts, q_ids, greedy, seed, generation, round, position,
                     accepted, tokens, status, num_drafts,
                     lambda b, d, q, keys, pos: target_logits.verify_row_logits(
                         [target[b, i].tolist() for i in range(target.shape[1])], d, q, keys,
                         pos, bool(greedy[b]), float(temperature[b]), int(top_k[b]),
                         int(p_bits[b]), int(m_bits[b]),
                         None if num_drafts is None else int(num_drafts[b])))


def _verify_rows(target, draft, q_counts, q_ids, greedy, seed, generation, round, position,
                 accepted, tokens, status, num_drafts, row_fn):
    """The shape checks and the request loop of verify / verify_logits; ``row_fn(b, draft,
    q_rows, keys, position)`` decides request ``b``."""
    if target.ndim != 3 or target.shape[1] < 1:
        raise ValueError(f"target: shape {tuple(target.shape)} must be [B, k+1, V] "
                         f"with k+1 >= 1")
    bsz, k1, v = target.shape
    _vocab("target", v)
    _shape("draft", draft, (bsz, k1 - 1))
    if q_counts is None:
        if q_ids is not None:
            raise ValueError("q_ids: given without q_counts")
    else:
        if q_counts.ndim != 3 or q_counts.shape[:2] != (bsz, k1 - 1):
            raise ValueError(f"q_counts: shape {tuple(q_counts.shape)} must be "
                             f"({bsz}, {k1 - 1}, W)")
        if q_ids is None and q_counts.shape[2] != v:
            raise ValueError(f"q_counts: dense width {q_counts.shape[2]} must equal the "
                             f"target's vocabulary {v}")
        if q_ids is not None:
            _shape("q_ids", q_ids, q_counts.shape)
    _shape("greedy", greedy, (bsz,))
    _key_shapes("verify", bsz, seed, generation, round, position)
    _shape("accepted", accepted, (bsz,))
    _shape("tokens", tokens, (bsz, k1))
    _shape("status", status, (bsz,))
    if num_drafts is not None:
        _shape("num_drafts", num_drafts, (bsz,))
    for b in range(bsz):
        q_rows = None
        if q_counts is not None:
            q_rows = []
            for i in range(k1 - 1):
                if q_ids is None:
                    q_rows.append(q_counts[b, i].tolist())
                else:
                    q_rows.append((q_ids[b, i].tolist(), q_counts[b, i].tolist()))
        try:
            st, acc, toks = row_fn(b, draft[b].tolist(), q_rows,
                                   _keys(seed, generation, round, b), int(position[b]))
        except RuntimeError:
            st, acc, toks = _status.RNG_EXHAUSTED, 0, None
        status[b] = st
        accepted[b] = acc if not st else 0
        tokens[b] = toks if not st else -1
