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


def sparse_row_valid(ids, counts, vocab):
    """Whether ``(ids, counts)`` is a sparse Dyadic row over ``[0, vocab)``.

    The rules of ``dyadic.Dyadic``: valid ids strictly ascending in
    ``[0, vocab)``, then padding entries (id -1, count 0) to the end of the
    row; every count <= 2**24; the counts sum to exactly 2**24.  A row
    breaking one of them is status ``Q_INVALID`` wherever a kernel reads it.
    """
    prev, pad, total = -1, False, 0
    for i, c in zip(ids, counts):
        if i == _spec.PAD_ID:
            if c:
                return False
            pad = True
            continue
        if pad or not prev < i < vocab or c > TOTAL:
            return False
        prev = i
        total += c
    return total == TOTAL


def draw_dense_row(counts, keys, position):
    """Token drawn from a dense count row: the first id whose running count
    exceeds the proposal ticket, or -1 when none does (a row summing to less
    than 2**24)."""
    r = philox.proposal_ticket(keys, position)
    acc = 0
    for i, c in enumerate(counts):
        acc += c
        if acc > r:
            return i
    return -1


def draw_sparse_row(ids, counts, keys, position):
    """Token drawn from a sparse row (entry order = ascending id).

    The row is checked first (``sparse_row_valid`` with the largest
    vocabulary, 2**24: the draw does not know V; ``Dyadic`` guarantees
    ``id < vocab_size``); a row breaking a rule gives -1, never an id read
    from it."""
    if not sparse_row_valid(ids, counts, _spec.MAX_VOCAB):
        return -1
    r = philox.proposal_ticket(keys, position)
    return ids[first_exceeding(counts, r)]


def draw_row(entries, keys, position):
    """Token drawn from ``entries``: a dense count list, or (id, count) pairs."""
    if entries and isinstance(entries[0], tuple):
        return draw_sparse_row([i for i, _ in entries], [c for _, c in entries], keys, position)
    return draw_dense_row(entries, keys, position)


def accept_split(p_fixed, total, count):
    """(always, a, b) for accepting d with probability min(1, P_d 2^24 / (T c_d)).

    With N = P_d * 2**24: if N >= T * c_d the draft is always accepted; else
    N = a * c_d + b and the test is ``V1 < a or (V1 == a and V2 < b)`` with V1
    uniform on [0, T) (``philox.uniform_below_63``: the draw's mask does not
    depend on T) and V2 uniform on [0, c_d), which has probability
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
    v1, nxt = philox.uniform_below_63(total, keys, position, _spec.DOMAIN_ACCEPTANCE, 0)
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

    ``target_bits``: k+1 lists of float32 bit patterns (V each); ``draft``: k
    ids; ``q_rows``: None (point-mass q) or k rows, each a dense count list
    (length V) or a sparse pair ``(ids, counts)`` of lists; ``keys`` =
    (seed, generation, round); ``position``: absolute position of draft[0].
    Returns ``(status, accepted, tokens)`` with ``len(tokens) == k + 1``
    (``(status, 0, None)`` when the request fails).

    The rules are checked in this order, the first that fails decides the
    status (docs/semantics.md, section 6): every target row (TARGET_*);
    then the rules of ``verify_fixed_rows``.
    """
    fixed = []
    for row in target_bits:
        status, p, total = fixedpoint.target_row_fixed(row)
        if status:
            return status, 0, None
        fixed.append((p, total))
    argmaxes = [first_argmax(row) for row in target_bits] if greedy else None
    return verify_fixed_rows(fixed, argmaxes, draft, q_rows, keys, position, greedy)


def verify_fixed_rows(fixed, argmaxes, draft, q_rows, keys, position, greedy):
    """The decisions of one request on its converted target rows.

    ``fixed``: k+1 pairs ``(P, T)`` (P a list of V ints, T = sum P, 1 <= T <=
    2**63); ``argmaxes``: the k+1 greedy argmaxes (read only when ``greedy``);
    the other arguments as ``verify_row``.  Rules, in order: every draft id
    in [0, V) (DRAFT_OUT_OF_RANGE, greedy requests too); then, for non-greedy
    requests, every q row: a sparse row in full, a dense row at its draft (a
    count <= 2**24) (Q_INVALID); then q_i(d_i) > 0 for every draft
    (Q_ZERO_AT_DRAFT).  The residual at a rejection reads its q row in full:
    a row whose counts do not sum to 2**24 fails there (Q_INVALID).
    """
    k = len(draft)
    vocab = len(fixed[0][0])
    if not all(0 <= d < vocab for d in draft):
        return _status.DRAFT_OUT_OF_RANGE, 0, None
    dense_q = []
    if not greedy:
        for i, d in enumerate(draft):
            q = q_rows[i] if q_rows is not None else None
            if q is None:
                q = [0] * vocab
                q[d] = TOTAL
            elif isinstance(q, tuple):
                ids, counts = q
                if not sparse_row_valid(ids, counts, vocab):
                    return _status.Q_INVALID, 0, None
                q = [0] * vocab
                for t, c in zip(ids, counts):
                    if t != _spec.PAD_ID:
                        q[t] = c
            elif q[d] > TOTAL:
                return _status.Q_INVALID, 0, None
            dense_q.append(q)
        for i, d in enumerate(draft):
            if dense_q[i][d] == 0:
                return _status.Q_ZERO_AT_DRAFT, 0, None
    tokens = []
    for i, d in enumerate(draft):
        p, total = fixed[i]
        if greedy:
            best = argmaxes[i]
            ok = d == best
        else:
            ok = accept(p[d], total, dense_q[i][d], keys, position + i)
        if ok:
            tokens.append(d)
            continue
        if greedy:
            tokens.append(best)
        else:
            if sum(dense_q[i]) != TOTAL:
                return _status.Q_INVALID, 0, None
            tokens.append(draw_weighted(residual(p, total, dense_q[i]), keys, position + i))
        return _status.OK, i, tokens + [-1] * (k - i)
    p, total = fixed[k]
    tokens.append(argmaxes[k] if greedy else draw_weighted(p, keys, position + k))
    return _status.OK, k, tokens


def verify_row_ragged(target_bits, draft, q_rows, keys, position, greedy, num_drafts):
    """One request of ``dyadic.verify`` with ``num_drafts``: only the first
    ``n = num_drafts`` drafts are verified.

    ``target_bits``, ``draft``, ``q_rows`` are the padded row (k + 1 target
    rows, k draft ids, None or k q rows); target rows ``0..n``, draft ids and
    q rows ``0..n-1`` are used, the rest is never read nor validated.  ``n``
    outside ``[0, k]`` is ``NUM_DRAFTS_INVALID``, checked before anything
    else.  Otherwise the result is ``verify_row`` of the request cut to
    depth ``n`` (same keys, so the same draws: the bonus of ``n = 0`` is drawn
    from target row 0 at ``position``), its tokens padded with -1 to
    ``k + 1``.  Returns ``(status, accepted, tokens)`` as ``verify_row``.
    """
    k = len(draft)
    if isinstance(num_drafts, bool) or not isinstance(num_drafts, int) or not 0 <= num_drafts <= k:
        return _status.NUM_DRAFTS_INVALID, 0, None
    n = num_drafts
    status, acc, tokens = verify_row(target_bits[:n + 1], draft[:n],
                                     None if q_rows is None else q_rows[:n], keys, position,
                                     greedy)
    if status:
        return status, 0, None
    return status, acc, tokens + [-1] * (k - n)
