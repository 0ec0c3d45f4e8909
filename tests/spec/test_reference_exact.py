"""The reference is exact: output distributions equal the target as fractions."""

from fractions import Fraction
import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

import dyadic
from dyadic import _spec
from dyadic.reference import distribution, fixedpoint, sampling

TOTAL = _spec.TOTAL


def f32_row_bits(p):
    return np.asarray(p, dtype=np.float32).view(np.uint32).tolist()


def random_target(rng, v, zeros=0):
    z = rng.standard_normal(v) * 3
    if zeros:
        z[rng.choice(v, size=min(zeros, v - 1), replace=False)] = -np.inf
    e = np.exp(z - z.max())
    return (e / e.sum()).astype(np.float32)


@pytest.mark.parametrize("v", [1, 2, 3, 5, 17])
@pytest.mark.parametrize("qkind", ["dense", "sparse", "point", "equal"])
def test_first_token_distribution_equals_target(v, qkind, rng):
    for trial in range(4):
        p = random_target(rng, v, zeros=trial)
        bits = f32_row_bits(p)
        if qkind == "point":
            q = [0] * v
            q[int(rng.integers(v))] = TOTAL
        elif qkind == "equal":
            q = dyadic.reference.allocate(p[None]).counts[0].tolist()
        else:
            logits = (rng.standard_normal(v) * 2).astype(np.float32)
            top_k = None if qkind == "dense" else max(1, v // 2)
            a = dyadic.reference.allocate(logits[None], logits=True, top_k=top_k)
            q = a.to_dense().counts[0].tolist()
        out = distribution.first_token_distribution(bits, q)
        assert out == distribution.target_distribution(bits)
        assert sum(out) == 1


@given(st.integers(0, 2**62), st.integers(1, 2**63 - 1), st.integers(1, TOTAL))
def test_acceptance_probability_is_min_one_ratio(p_fixed, total, count):
    want = min(Fraction(1), Fraction(p_fixed * TOTAL, total * count))
    assert distribution.acceptance_probability(p_fixed, total, count) == want


def test_zero_target_never_accepted_and_equal_mass_always():
    keys = (1, 2, 3)
    for pos in range(200):
        assert not sampling.accept(0, 2**62, 5, keys, pos)
        assert sampling.accept(2**62, 2**62, TOTAL, keys, pos)


def test_residual_mass_balances():
    rng = np.random.default_rng(1)
    for v in (2, 9, 40):
        p = random_target(rng, v)
        _, fixed, total = fixedpoint.target_row_fixed(f32_row_bits(p))
        q = dyadic.reference.allocate(random_target(rng, v)[None]).counts[0].tolist()
        r = sampling.residual(fixed, total, q)
        neg = sum(max(c * total - (x << 24), 0) for x, c in zip(fixed, q))
        assert sum(r) == neg  # sum(p - q) = 0 exactly


def test_target_conversion_deviation_bound():
    """|P_v / T - p_v / sum(p)| <= (V + 1) * 2**-62 / (1 - 2**-10), stated in the docs."""
    rng = np.random.default_rng(2)
    for v in (2, 111, 4097):
        p = random_target(rng, v)
        bits = f32_row_bits(p)
        _, fixed, total = fixedpoint.target_row_fixed(bits)
        exact = [Fraction(float(x)) for x in p]
        s = sum(exact)
        bound = Fraction(v + 1, 2**62) / (1 - Fraction(1, 2**10))
        worst = max(abs(Fraction(f, total) - e / s) for f, e in zip(fixed, exact))
        assert worst <= bound


def test_integer_exp_error_against_math_exp():
    """|W / 2**39 - exp(-t)| <= 2**-31 * exp(-t) + 2**-39 (stated in docs/semantics.md)."""
    ts = [0.0, 2**-40, 1e-9, 0.5, 1.0, math.log(2), 3.3, 10.0, 20.0, 27.0, 31.999]
    ts += [float(x) for x in np.random.default_rng(3).uniform(0, 32, 20000)]
    for t in ts:
        w = fixedpoint.weight_from_gap(t)
        exact = math.exp(-t)
        assert abs(w / 2**39 - exact) <= 2**-31 * exact + 2**-39
    assert fixedpoint.weight_from_gap(0.0) == 2**39
    assert fixedpoint.weight_from_gap(32.0) == 0
    assert fixedpoint.weight_from_gap(math.inf) == 0


def test_weights_are_exact_scaling_of_float_bits():
    x = np.array([1.0, 0.5, 3.0, 0.0, 1e-45, 2.0**-30], dtype=np.float32)
    _, w, arg = fixedpoint.probs_row_weights(x.view(np.uint32).tolist())
    assert arg == 2
    # max 3.0 = 0xC00000 * 2**-22 -> 0xC00000 * 2**15
    assert w[2] == 0xC00000 << 15
    assert w[0] == 2**37 and w[1] == 2**36 and w[3] == 0 and w[4] == 0
    assert w[5] == 2**7
