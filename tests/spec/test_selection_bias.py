"""The seed's selection-bias toy: depth admission must not look at its own draws.

With q = p uniform on two tokens, fixed-depth verification emits token 0 with
probability 1/2; a scheduler that admits the first draft only when it is
token 0 (and otherwise samples target-only) emits token 0 with probability 3/4.
The exact verifier cannot undo that selection; dyadic only ever verifies a
depth fixed before drawing.
"""

from fractions import Fraction

import numpy as np

import dyadic
from dyadic import Keys
from dyadic.reference import distribution

HALF = Fraction(1, 2)


def uniform_case():
    p = np.array([0.5, 0.5], np.float32)
    q = dyadic.reference.allocate(p[None]).counts[0].tolist()
    return p.view(np.uint32).tolist(), q


def test_fixed_depth_first_token_is_the_target():
    bits, q = uniform_case()
    assert distribution.first_token_distribution(bits, q) == [HALF, HALF]


def test_selective_admission_is_biased():
    bits, q = uniform_case()
    target = distribution.target_distribution(bits)
    qd = distribution.q_distribution(q)
    # admit d only when d == 0 (then it is accepted: p = q); otherwise target-only
    biased = [qd[0] * 1 + qd[1] * target[0], qd[1] * target[1]]
    assert biased == [Fraction(3, 4), Fraction(1, 4)]


def test_fixed_depth_frequencies_on_the_reference_backend():
    n = 400
    p = np.tile(np.array([[[0.5, 0.5], [0.5, 0.5]]], np.float32), (n, 1, 1))
    q = dyadic.reference.allocate(p[:, :1].copy())
    seeds = np.arange(n, dtype=np.uint64)
    d = dyadic.reference.draw(q, Keys(seed=seeds))
    out = dyadic.reference.verify(p, d, q, Keys(seed=seeds + 7))
    assert out.accepted.tolist() == [1] * n  # p == q: always accepted
    share = float(np.mean(out.tokens[:, 0] == 0))
    assert 0.4 < share < 0.6  # fixed depth: about 1/2, not 3/4
