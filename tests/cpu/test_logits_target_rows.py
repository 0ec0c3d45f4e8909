"""The C core's processed target (dy_logits_target_row) == the reference's, entry by entry.

verify draws one token per row, so comparing its outputs samples the processed
target only where a draw lands; here every P_v, T and the argmax are compared on
adversarial rows: logits one ulp apart (the radix selections decide on the low
bytes of the order keys), long tie runs at the top-k / top-p boundary, -inf masks,
gaps past the exponential's cutoff, subnormals, wide rows.
"""

import numpy as np
import pytest
from hypothesis import given, strategies as st

from dyadic.reference import target_logits

_kernels = pytest.importorskip("dyadic.backends.cpu._kernels")

TOP_P = [1.0, 0.999, 0.9, 0.5, 0.25, 1e-3, 1e-7, 2 ** -24]
MIN_P = [0.0, 1e-9, 0.01, 0.3, 0.5, 0.999, 1.0]


def same(x, temperature, top_k, top_p, min_p):
    x = np.ascontiguousarray(x, np.float32)
    pb, mb = target_logits.param_bits(top_p), target_logits.param_bits(min_p)
    st_c, p, total, arg = _kernels.logits_target_row(x, temperature, top_k, pb, mb)
    st_r = target_logits.params_status(temperature, top_k, pb, mb)
    if not st_r:
        st_r, pr, tr, ar = target_logits.processed_row(x.tolist(), temperature, top_k, pb, mb)
    assert st_c == st_r
    if st_c == 0:
        assert p.tolist() == pr and total == tr and arg == ar
        return pr
    return None


def ulp_row(rng, v):
    """Logits a few ulps apart around one value: order keys differing in the low byte."""
    base = np.float32(rng.standard_normal() * 4)
    steps = rng.integers(-300, 300, v)
    bits = np.int64(np.array([base], np.float32).view(np.int32)[0]) + steps
    return np.asarray(bits, np.int32).view(np.float32)


@pytest.mark.parametrize("v", [1, 2, 7, 64, 300, 2051])
def test_adversarial_rows(v):
    rng = np.random.default_rng(v)
    rows = [ulp_row(rng, v), np.round(rng.standard_normal(v)),
            np.full(v, 1.5), rng.standard_normal(v) * 60,
            np.frombuffer(rng.integers(0, 0x800000, v, dtype=np.uint32).tobytes(), np.float32)]
    masked = rng.standard_normal(v)
    masked[rng.random(v) < 0.7] = -np.inf
    masked[rng.integers(v)] = 2.0
    rows.append(masked)
    runs = np.repeat(rng.standard_normal((v + 9) // 10), 10)[:v]  # tie runs of 10
    rows.append(runs)
    kept_some = 0
    for x in rows:
        for temperature in (1.0, 0.37, 3.0):
            for top_k in (0, 1, 3, 10, v - 1, v, v + 5):
                for top_p in TOP_P[::3] + [0.5]:
                    for min_p in (0.0, 0.3):
                        p = same(x, temperature, top_k, top_p, min_p)
                        kept_some += p is not None and sum(1 for w in p if w) > 1
    assert kept_some > 0 or v == 1


@given(st.integers(1, 80), st.integers(0, 2 ** 32 - 1), st.sampled_from([0.05, 0.5, 1.0, 7.0]),
       st.integers(0, 90), st.sampled_from(TOP_P), st.sampled_from(MIN_P),
       st.sampled_from(["normal", "ulp", "ties", "masked", "wide"]))
def test_random_rows(v, seed, temperature, top_k, top_p, min_p, kind):
    rng = np.random.default_rng(seed)
    if kind == "normal":
        x = rng.standard_normal(v) * 3
    elif kind == "ulp":
        x = ulp_row(rng, v)
    elif kind == "ties":
        x = rng.integers(-3, 3, v) * 0.75
    elif kind == "masked":
        x = rng.standard_normal(v)
        x[rng.random(v) < 0.5] = -np.inf
    else:
        x = rng.standard_normal(v) * 1e4
    same(x, temperature, top_k, top_p, min_p)


def test_statuses():
    assert same([np.nan, 1.0], 1.0, 0, 1.0, 0.0) is None
    assert same([np.inf, 1.0], 1.0, 0, 1.0, 0.0) is None
    assert same([-np.inf, -np.inf], 1.0, 0, 1.0, 0.0) is None
    assert same([3e38, 1.0], 1e-300, 0, 1.0, 0.0) is None  # z overflows to +inf
    assert same([-3e38, 1.0], 1e-300, 0, 1.0, 0.0) == [0, 1 << 62]  # z = -inf masks
    for t, k, p, m in ((-1.0, 0, 1.0, 0.0), (np.nan, 0, 1.0, 0.0), (1.0, -1, 1.0, 0.0),
                       (1.0, 0, 1.5, 0.0), (1.0, 0, 1.0, 1.5), (1.0, 0, np.nan, 0.0)):
        assert same([1.0, 2.0], t, k, p, m) is None
