"""Allocation semantics (policies, top-k support, padding), checked on the reference
and on every fast backend against it."""

from fractions import Fraction

import numpy as np
import pytest

import dyadic
from dyadic import _spec
from dyadic.reference import fixedpoint

TOTAL = _spec.TOTAL


def backends():
    return ["reference"] + [b for b in ("cpu",) if b in dyadic.available_backends()]


def exact_shares(weights):
    s = sum(weights)
    return [Fraction(TOTAL * w, s) for w in weights]


@pytest.mark.parametrize("backend", backends())
def test_known_small_rows(backend):
    x = np.array([[0.5, 0.25, 0.25], [1, 1, 1], [0, 3, 0], [1, 0, 1]], dtype=np.float32)
    q = dyadic.allocate(x, backend=backend)
    assert q.counts.dtype == np.uint32 and q.ids is None
    assert q.counts.tolist() == [[8388608, 4194304, 4194304], [5592406, 5592405, 5592405],
                                 [0, TOTAL, 0], [8388608, 0, 8388608]]
    ff = dyadic.allocate(x, policy="floor-first", backend=backend)
    assert ff.counts[1].tolist() == [5592406, 5592405, 5592405]  # argmax = lowest id
    assert ff.semantic_id == "dyadic24-floor-first-v1"
    assert q.semantic_id == "dyadic24-standard-v1"


def test_standard_is_floor_plus_largest_remainders(rng):
    for v in (2, 7, 111):
        x = rng.random((5, v)).astype(np.float32)
        x[0, :v // 2] = 0
        q = dyadic.reference.allocate(x)
        for row, c in zip(x, q.counts):
            _, w, _ = fixedpoint.probs_row_weights(row.view(np.uint32).tolist())
            shares = exact_shares(w)
            floors = [int(s) for s in shares]
            extra = [int(ci) - f for ci, f in zip(c.tolist(), floors)]
            assert set(extra) <= {0, 1} and sum(c.tolist()) == TOTAL
            got = [i for i, e in enumerate(extra) if e]
            order = sorted(range(v), key=lambda i: (-(shares[i] - floors[i]), i))
            assert got == sorted(order[:len(got)])


def test_floor_first_gives_remaining_to_largest(rng):
    x = rng.standard_normal((4, 50)).astype(np.float32)
    q = dyadic.reference.allocate(x, logits=True, policy="floor-first")
    for row, c in zip(x, q.counts):
        _, w, _, arg = fixedpoint.logits_row_weights(row.tolist(), None, 1.0)
        floors = [int(s) for s in exact_shares(w)]
        diff = np.array(c.tolist()) - np.array(floors)
        assert arg == int(np.argmax(row))
        assert np.count_nonzero(diff) <= 1 and diff[arg] == TOTAL - sum(floors)


@pytest.mark.parametrize("backend", backends())
def test_top_k_support_ties_and_padding(backend):
    # ties at the boundary go to the lowest id; masked entries are never in the support
    x = np.array([[1.0, 3.0, 3.0, 2.0, 3.0, -np.inf],
                  [0.0, -np.inf, -np.inf, -np.inf, -np.inf, -np.inf]], dtype=np.float32)
    q = dyadic.allocate(x, logits=True, top_k=2, backend=backend)
    assert q.ids.tolist()[0] == [1, 2]
    assert q.ids.tolist()[1] == [0, -1]
    assert q.counts.tolist()[1] == [TOTAL, 0]
    assert q.counts.sum(axis=1).tolist() == [TOTAL, TOTAL]
    q8 = dyadic.allocate(x, logits=True, top_k=8, backend=backend)
    assert q8.width == 6  # min(top_k, V)
    assert q8.ids.tolist()[0] == [0, 1, 2, 3, 4, -1]


def test_top_k_normalises_within_support():
    x = np.array([[4.0, 3.0, 2.0, 1.0]], dtype=np.float32)
    q = dyadic.reference.allocate(x, top_k=2)
    assert q.ids.tolist() == [[0, 1]]
    assert q.counts.tolist() == [[TOTAL * 4 // 7 + 1, TOTAL * 3 // 7]]


def test_to_dense_and_probs_are_exact():
    x = np.array([[4.0, 3.0, 2.0, 1.0]], dtype=np.float32)
    q = dyadic.reference.allocate(x, top_k=3)
    d = q.to_dense()
    assert d.counts.shape == (1, 4) and d.counts[0, 3] == 0
    assert d.counts[0, :3].tolist() == q.counts[0].tolist()
    p = q.probs()
    assert p.dtype == np.float32
    assert [Fraction(float(a)) for a in p[0]] == [Fraction(int(c), TOTAL) for c in q.counts[0]]


def test_dyadic_is_immutable():
    q = dyadic.reference.allocate(np.ones((1, 3), np.float32))
    with pytest.raises(AttributeError):
        q.counts = None
    with pytest.raises(ValueError):
        q.counts[0, 0] = 1


def test_batch_shape_is_kept():
    x = np.ones((2, 3, 5), np.float32)
    q = dyadic.reference.allocate(x, top_k=2)
    assert q.batch_shape == (2, 3) and q.counts.shape == (2, 3, 2)
    assert q[1, 2].batch_shape == ()


def test_logit_path_uses_binary64_effective_logits():
    x = np.array([[1.0, 2.0, 0.0]], dtype=np.float32)
    b = np.array([0.5, -np.inf, 1.0], dtype=np.float32)
    q = dyadic.reference.allocate(x, logits=True, bias=b, temperature=0.5)
    _, w, _, arg = fixedpoint.logits_row_weights([1.0, 2.0, 0.0], [0.5, -np.inf, 1.0], 0.5)
    assert arg == 0 and w[1] == 0
    assert q.counts[0, 1] == 0 and q.counts[0].sum() == TOTAL


def test_stack_chain_positions():
    rows = [dyadic.reference.allocate(np.random.default_rng(i).random((3, 9)).astype(np.float32),
                                      top_k=4) for i in range(2)]
    q = dyadic.stack(rows, axis=1)
    assert q.batch_shape == (3, 2) and q.ids.shape == (3, 2, 4)
    assert np.array_equal(q.counts[:, 1], rows[1].counts)
    with pytest.raises(ValueError, match="qs: entry 1 differs"):
        dyadic.stack([rows[0], dyadic.reference.allocate(np.ones((3, 9), np.float32))])
    with pytest.raises(TypeError, match="qs: expected a non-empty sequence"):
        dyadic.stack([])
