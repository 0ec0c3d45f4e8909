"""Draws and speculative verification on exact integers."""

from .. import _spec, _status
from . import fixedpoint, philox

TOTAL = _spec.TOTAL


def first_exceeding(values, r):
    """Index of the first entry whose running sum is strictly greater than r."""
    acc = 0
    for i, c in enumerate(values):
        acc += c
        if acc > r:
            return i
    raise AssertionError("draw beyond the total mass")


def draw_row(entries, keys, position):
    """Token drawn from ``entries``: a dense count list, or (id, count) pairs."""
    r = philox.proposal_ticket(keys, position)
    if entries and isinstance(entries[0], tuple):
        return entries[first_exceeding([c for _, c in entries], r)][0]
    return first_exceeding(entries, r)


def accept_split(p_fixed, total, count):
    """(always, a, b) for accepting d with probability min(1, P_d 2^24 / (T c_d)).

    With N = P_d * 2**24: if N >= T * c_d the draft is always accepted; else
    N = a * c_d + b and the test is ``V1 < a or (V1 == a and V2 < b)`` with V1
    uniform on [0, T) and V2 uniform on [0, c_d), which has probability
    (a * c_d + b) / (T * c_d) exactly.
    """
    n = p_fixed << _spec.TOTAL_BITS
    if n >= total * count:
        return True, 0, 0
    a, b = divmod(n, count)
    return False, a, b


def accept(p_fixed, total, count, keys, position):
    """The acceptance decision of one draft token (domain ACCEPTANCE)."""
    always, a, b = accept_split(p_fixed, total, count)
    if always:
        return True
    v1, nxt = philox.uniform_below(total, keys, position, _spec.DOMAIN_ACCEPTANCE, 0)
    if v1 != a:
        return v1 < a
    v2, _ = philox.uniform_below(count, keys, position, _spec.DOMAIN_ACCEPTANCE, nxt)
    return v2 < b


def residual(p_fixed, total, q_dense):
    """R_v = max(P_v * 2**24 - c_v * T, 0): the residual in units of 1/(T 2^24)."""
    return [max((p << _spec.TOTAL_BITS) - c * total, 0) for p, c in zip(p_fixed, q_dense)]


def draw_weighted(weights, keys, position):
    """Token v with probability weights[v] / sum(weights) (domain CORRECTION)."""
    x, _ = philox.uniform_below(sum(weights), keys, position, _spec.DOMAIN_CORRECTION, 0)
    return first_exceeding(weights, x)


def first_argmax(bits):
    """Argmax of a validated float32 row given as bits (ties: lowest id; -0.0 == 0)."""
    best, arg = -1, -1
    for i, b in enumerate(bits):
        if (b & 0x7FFFFFFF) > best:
            best, arg = b & 0x7FFFFFFF, i
    return arg


def verify_row(target_bits, draft, q_rows, keys, position, greedy):
    """One request of ``dyadic.verify``.

    ``target_bits``: k+1 lists of float32 bit patterns; ``draft``: k ids;
    ``q_rows``: k dense count lists (None for point-mass q); ``keys`` =
    (seed, generation, round); ``position``: absolute position of draft[0].
    Returns ``(status, accepted, tokens)`` with ``len(tokens) == k + 1``.
    """
    k = len(draft)
    fixed = []
    for row in target_bits:
        status, p, total = fixedpoint.target_row_fixed(row)
        if status:
            return status, 0, None
        fixed.append((p, total))
    dense_q = []
    for i, d in enumerate(draft):
        q = q_rows[i] if q_rows is not None else None
        if q is None:
            q = [0] * len(target_bits[i])
            q[d] = TOTAL
        if not greedy and q[d] == 0:
            return _status.Q_ZERO_AT_DRAFT, 0, None
        dense_q.append(q)
    tokens = []
    for i, d in enumerate(draft):
        p, total = fixed[i]
        if greedy:
            best = first_argmax(target_bits[i])
            ok = d == best
        else:
            ok = accept(p[d], total, dense_q[i][d], keys, position + i)
        if ok:
            tokens.append(d)
            continue
        if greedy:
            tokens.append(best)
        else:
            tokens.append(draw_weighted(residual(p, total, dense_q[i]), keys, position + i))
        return _status.OK, i, tokens + [-1] * (k - i)
    p, total = fixed[k]
    tokens.append(first_argmax(target_bits[k]) if greedy else draw_weighted(p, keys, position + k))
    return _status.OK, k, tokens
