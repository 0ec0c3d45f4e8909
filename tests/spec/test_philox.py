"""Philox4x32 against Random123's known-answer vectors, on every backend."""

import pathlib

import numpy as np
import pytest

import dyadic
from dyadic import _spec
from dyadic.reference import philox

KAT = pathlib.Path(__file__).resolve().parents[1] / "data" / "random123_philox4x32_kat.txt"


def kat_vectors():
    rows = []
    for line in KAT.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        f = line.split()
        rows.append((int(f[1]), [int(w, 16) for w in f[2:6]], [int(w, 16) for w in f[6:8]],
                     [int(w, 16) for w in f[8:12]]))
    return rows


@pytest.mark.parametrize("rounds,ctr,key,expected", kat_vectors())
def test_reference_kat(rounds, ctr, key, expected):
    assert list(philox.philox4x32(ctr, key, rounds)) == expected


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_api_kat(backend):
    if backend not in dyadic.available_backends():
        pytest.skip(f"backend {backend!r} not available")
    vectors = kat_vectors()
    for rounds in (7, 10):
        sel = [v for v in vectors if v[0] == rounds]
        ctr = np.array([v[1] for v in sel], dtype=np.uint32)
        key = np.array([v[2] for v in sel], dtype=np.uint32)
        out = dyadic.philox4x32(ctr, key, rounds, backend=backend)
        assert out.dtype == np.uint32
        assert out.tolist() == [v[3] for v in sel]


def test_fast_backend_matches_reference_on_random_counters(fast_backend, rng):
    ctr = rng.integers(0, 2**32, size=(257, 4), dtype=np.uint64).astype(np.uint32)
    key = rng.integers(0, 2**32, size=(257, 2), dtype=np.uint64).astype(np.uint32)
    ref = dyadic.philox4x32(ctr, key, backend="reference")
    assert np.array_equal(dyadic.philox4x32(ctr, key, backend=fast_backend), ref)


def test_counter_layout():
    # key = (seed lo, seed hi); counter = ((domain << 28) | index, position, round, generation)
    seed = 0x0123456789ABCDEF
    got = philox.block((seed, 7, 9), 11, _spec.DOMAIN_ACCEPTANCE, 5)
    want = philox.philox4x32(((2 << 28) | 5, 11, 9, 7), (0x89ABCDEF, 0x01234567))
    assert got == want


def test_domains_never_share_counters():
    seen = set()
    for domain in (_spec.DOMAIN_PROPOSAL, _spec.DOMAIN_ACCEPTANCE, _spec.DOMAIN_CORRECTION):
        for index in (0, 1, _spec.MAX_DRAW_INDEX):
            c = philox.counter_words(3, 4, 5, domain, index)
            assert c not in seen
            seen.add(c)


def test_uniform_below_is_in_range_and_deterministic():
    keys = (99, 1, 2)
    for n in (1, 2, 3, 7, 2**24, 2**62 + 12345, 2**100 + 7):
        a = [philox.uniform_below(n, keys, pos, _spec.DOMAIN_CORRECTION)[0] for pos in range(50)]
        b = [philox.uniform_below(n, keys, pos, _spec.DOMAIN_CORRECTION)[0] for pos in range(50)]
        assert a == b
        assert all(0 <= v < n for v in a)


def test_uniform_below_rejection_uses_next_index():
    # n = 2**64 + 1 keeps 65 bits: rejection probability ~1/2, so some position rejects.
    keys, n = (5, 0, 0), 2**64 + 1
    used = {philox.uniform_below(n, keys, pos, _spec.DOMAIN_ACCEPTANCE)[1] for pos in range(64)}
    assert 1 in used and max(used) > 1


def test_philox_input_validation():
    with pytest.raises(ValueError, match="counter"):
        dyadic.philox4x32([0, 0, 0], [0, 0], backend="reference")
    with pytest.raises(ValueError, match="key"):
        dyadic.philox4x32([0, 0, 0, 0], [0, 2**32], backend="reference")
    with pytest.raises(ValueError, match="rounds"):
        dyadic.philox4x32([0, 0, 0, 0], [0, 0], rounds=17, backend="reference")


def test_uniform_below_63_is_the_first_masked_draw_below_n():
    keys, low63 = (11, 3, 4), (1 << 63) - 1
    for pos in range(40):
        for n in (1 << 62, (1 << 62) + (1 << 52), 3 << 61, 1 << 63):
            v, nxt = philox.uniform_below_63(n, keys, pos, _spec.DOMAIN_ACCEPTANCE)
            xs = []
            for j in range(nxt):
                w = philox.block(keys, pos, _spec.DOMAIN_ACCEPTANCE, j)
                xs.append((w[0] | (w[1] << 32)) & low63)
            assert xs[-1] == v < n and all(x >= n for x in xs[:-1])


def test_uniform_below_63_same_value_for_every_n_above_it():
    """The mask does not depend on n: for n1 < n2, whenever the draw for n2 is below
    n1 it is also the draw for n1 (what lets a lazy verifier decide without T)."""
    keys, band = (7, 1, 2), [(1 << 62) - (1 << 52), 1 << 62, (1 << 62) + (1 << 52)]
    for pos in range(200):
        vals = [philox.uniform_below_63(n, keys, pos, _spec.DOMAIN_ACCEPTANCE) for n in band]
        for (v1, i1), (v2, i2), n1 in zip(vals, vals[1:], band):
            if v2 < n1:
                assert (v1, i1) == (v2, i2)


def test_uniform_below_63_range():
    for n in (0, (1 << 63) + 1):
        with pytest.raises(ValueError, match="uniform_below_63"):
            philox.uniform_below_63(n, (1, 0, 0), 0, _spec.DOMAIN_ACCEPTANCE)
