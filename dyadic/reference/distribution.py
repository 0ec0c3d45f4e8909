"""Exact distributions (fractions) of what the sampling functions output.

These are the proofs the tests check: ``first_token_distribution`` of a
one-position verification equals ``target_distribution`` exactly.
"""

from fractions import Fraction

from .. import _spec, _status
from . import fixedpoint, sampling


def target_distribution(target_bits):
    """The exact target p(v) = P_v / T that verification preserves."""
    status, p, total = fixedpoint.target_row_fixed(target_bits)
    if status:
        raise ValueError(_status.message(status, 0))
    return [Fraction(x, total) for x in p]


def q_distribution(q_dense):
    return [Fraction(c, _spec.TOTAL) for c in q_dense]


def acceptance_probability(p_fixed, total, count):
    """P(accept) of the decision procedure in ``sampling.accept``, from its parts."""
    always, a, b = sampling.accept_split(p_fixed, total, count)
    if always:
        return Fraction(1)
    # P(V1 < a) + P(V1 == a) * P(V2 < b), V1 ~ U[0, T), V2 ~ U[0, c)
    return Fraction(a, total) + Fraction(1, total) * Fraction(b, count)


def residual_distribution(p_fixed, total, q_dense):
    r = sampling.residual(p_fixed, total, q_dense)
    s = sum(r)
    return [Fraction(x, s) for x in r] if s else None


def first_token_distribution(target_bits, q_dense):
    """Exact law of the first emitted token when d ~ q and d is verified.

    The first token is d when accepted, else the residual draw; summing over d
    weighted by q(d) gives P(first = v), which equals p(v) exactly.
    """
    status, p, total = fixedpoint.target_row_fixed(target_bits)
    if status:
        raise ValueError(_status.message(status, 0))
    return first_token_distribution_fixed(p, total, q_dense)


def first_token_distribution_fixed(p, total, q_dense):
    """``first_token_distribution`` on a converted target row: ``p`` the integer
    target P_v, ``total`` = sum P (the decisions of ``sampling.verify_fixed_rows``)."""
    out = [Fraction(0)] * len(p)
    res = residual_distribution(p, total, q_dense)
    for d, c in enumerate(q_dense):
        if not c:
            continue
        qd = Fraction(c, _spec.TOTAL)
        acc = acceptance_probability(p[d], total, c)
        out[d] += qd * acc
        if acc != 1:
            for v, rv in enumerate(res):
                out[v] += qd * (1 - acc) * rv
    return out


def first_token_distribution_logits(xs, q_dense, *, temperature=1.0, top_k=0, top_p=1.0,
                                    min_p=0.0, greedy=False):
    """Exact law of the first emitted token of ``verify(..., logits=True)`` at one
    position, for one logits row ``xs`` (Python floats, exact float32 values) and
    the request's parameters (top_p, min_p converted to float32 as the API does).

    Non-greedy: the decisions on the processed target ``(P, T)`` of
    ``target_logits.target_row``.  Greedy (``greedy`` or temperature 0): d is
    emitted when it is the argmax, else the argmax is; no randomness.  The tests
    compare the result with ``target_logits.target_distribution``."""
    from . import target_logits

    st, p, total, arg = target_logits.target_row(
        xs, greedy, float(temperature), int(top_k), target_logits.param_bits(top_p),
        target_logits.param_bits(min_p))
    if st:
        raise ValueError(_status.message(st, 0))
    if greedy or temperature == 0:
        out = [Fraction(0)] * len(xs)
        for d, c in enumerate(q_dense):
            if c:
                out[d if d == arg else arg] += Fraction(c, _spec.TOTAL)
        return out
    return first_token_distribution_fixed(p, total, q_dense)
