"""Ticket allocation: integer weights -> counts summing to exactly 2**24."""

from .. import _spec, _status
from . import fixedpoint

TOTAL = _spec.TOTAL


def allocate_weights(weights, support, policy, argmax):
    """Counts for ``weights`` (ints) restricted to ``support`` (ascending ids).

    ``base_v = floor(M * W_v / S)``, ``rem_v = M * W_v mod S`` with
    ``S = sum(W_v for v in support)``.  Standard: the ``M - sum(base)`` tokens
    with the largest ``rem_v`` (ties: lowest id) get one more ticket.
    Floor-first: ``argmax`` (the largest effective value, ties lowest id) gets
    all of them.  Returns ``(status, {id: count})`` over the support.
    """
    s = sum(weights[v] for v in support)
    if s <= 0:
        return _status.X_ZERO_MASS, None
    base, rem = {}, {}
    for v in support:
        base[v], rem[v] = divmod(TOTAL * weights[v], s)
    remaining = TOTAL - sum(base.values())
    if not 0 <= remaining < TOTAL:
        return _status.ALLOC_INCONSISTENT, None
    if policy == _spec.POLICY_STANDARD:
        order = sorted(support, key=lambda v: (-rem[v], v))
        for v in order[:remaining]:
            base[v] += 1
    else:
        base[argmax] += remaining
    if sum(base.values()) != TOTAL:
        return _status.ALLOC_INCONSISTENT, None
    return _status.OK, base


def select_top_k(keys, k):
    """The ``k`` ids with the largest ``keys`` (ties: lowest id), ascending."""
    order = sorted(range(len(keys)), key=lambda v: (-keys[v], v))
    return sorted(order[:k])


def allocate_row(row, *, logits, bias, temperature, top_k, policy, top_p_bits=None,
                 min_p_bits=None):
    """One row of ``dyadic.allocate``.

    ``row`` (and ``bias``) are lists of Python floats holding exact float32
    values.  Returns ``(status, counts)`` where ``counts`` is a dense list of
    length V (``top_k is None``) or a list of ``(id, count)`` pairs, ascending,
    zero counts dropped (padding is the caller's job).  ``top_p_bits`` /
    ``min_p_bits`` (logits only; float32 bits, None: off) filter the support
    first: the kept tokens of ``target_logits.kept_tokens`` (min-p, top-k, top-p on
    the ranking by z), with ``top_k`` the top-k filter (the sparse width is the
    caller's ``top_k``).
    """
    if logits and (top_p_bits is not None or min_p_bits is not None):
        return allocate_filtered_row(row, bias, temperature, top_k or 0, top_k is None, policy,
                                     0x3F800000 if top_p_bits is None else top_p_bits,
                                     0 if min_p_bits is None else min_p_bits)
    if logits:
        status, weights, zs, argmax = fixedpoint.logits_row_weights(row, bias, temperature)
        rank_keys = zs
    else:
        bits = [fixedpoint.f32_bits(x) for x in row]
        status, weights, argmax = fixedpoint.probs_row_weights(bits)
        rank_keys = [b & 0x7FFFFFFF for b in bits]
    if status:
        return status, None
    v = len(row)
    support = list(range(v)) if top_k is None else select_top_k(rank_keys, min(top_k, v))
    status, counts = allocate_weights(weights, support, policy, argmax)
    if status:
        return status, None
    if top_k is None:
        return _status.OK, [counts.get(i, 0) for i in range(v)]
    return _status.OK, [(i, counts[i]) for i in support if counts[i]]


def allocate_filtered_row(row, bias, temperature, top_k, dense, policy, top_p_bits, min_p_bits):
    """One row of allocate on the support kept by min-p, top-k (``top_k``, 0: off) and
    top-p (``target_logits.kept_tokens``); top_p / min_p as float32 bits.  Returns
    ``(status, counts)`` as ``allocate_row`` (dense list when ``dense``, else
    ascending ``(id, count)`` pairs without zero counts).  A parameter out of range
    is TOP_K_INVALID / TOP_P_INVALID / MIN_P_INVALID."""
    from . import target_logits

    status = target_logits.params_status(1.0, top_k, top_p_bits, min_p_bits)
    if status:
        return status, None
    status, weights, zs, argmax = fixedpoint.logits_row_weights(row, bias, temperature)
    if status:
        return status, None
    support = sorted(target_logits.kept_tokens(weights, zs, top_k, top_p_bits, min_p_bits))
    status, counts = allocate_weights(weights, support, policy, argmax)
    if status:
        return status, None
    if dense:
        return _status.OK, [counts.get(i, 0) for i in range(len(row))]
    return _status.OK, [(i, counts[i]) for i in support if counts[i]]


def argmax_row(row, bias):
    """Temperature-0 proposal: argmax of x + bias in binary64 (ties: lowest id)."""
    status, _, _, argmax = fixedpoint.logits_row_weights(row, bias, 1.0)
    return status, argmax
