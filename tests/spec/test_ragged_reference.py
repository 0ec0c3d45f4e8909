"""The reference with ragged drafts (``num_drafts``): a request with n of its k drafts
is exactly the request cut to depth n, its padding is never read, and the first
emitted token keeps the target distribution exactly (fractions)."""

import numpy as np
import pytest

import dyadic
from dyadic import _spec, _status
from dyadic.reference import distribution, sampling

TOTAL = _spec.TOTAL
NAN_BITS = 0x7FC00000


def _rows(rng, k1, v):
    z = rng.standard_normal((k1, v)) * 3
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).astype(np.float32).view(np.uint32).tolist()


def _q_rows(rng, k, v):
    a = dyadic.reference.allocate((rng.standard_normal((k, v)) * 2).astype(np.float32),
                                  logits=True, top_k=max(1, v // 2))
    return [(a.ids[i].tolist(), a.counts[i].tolist()) for i in range(k)]


def _hostile(target, draft, q_rows, n, v):
    """The padding beyond depth n spoiled: NaN target rows, ids outside [0, V), q rows
    breaking every Dyadic rule."""
    k = len(draft)
    target = [row if i <= n else [NAN_BITS] * v for i, row in enumerate(target)]
    draft = [d if i < n else (v + 7 if i % 2 else -3) for i, d in enumerate(draft)]
    if q_rows is not None and isinstance(q_rows[0], tuple):
        w = len(q_rows[0][0])
        q_rows = [q if i < n else ([v + 1] * w, [TOTAL + 5] * w) for i, q in enumerate(q_rows)]
    elif q_rows is not None:
        q_rows = [q if i < n else [TOTAL + 5] * v for i, q in enumerate(q_rows)]
    return target, draft, q_rows


@pytest.mark.parametrize("greedy", [False, True])
@pytest.mark.parametrize("qkind", ["sparse", "dense", "point"])
def test_ragged_row_is_the_row_cut_to_its_depth(greedy, qkind, rng):
    k, v = 4, 11
    for trial in range(12):
        target = _rows(rng, k + 1, v)
        q_rows = None if qkind == "point" else _q_rows(rng, k, v)
        if qkind == "dense":
            q_rows = [[dict(zip(*q)).get(t, 0) if t >= 0 else 0 for t in range(v)]
                      for q in q_rows]
        # a draft each q row can have drawn
        if qkind == "sparse":
            draft = [int(q[0][0]) for q in q_rows]
        elif qkind == "dense":
            draft = [int(np.flatnonzero(q)[0]) for q in q_rows]
        else:
            draft = [int(rng.integers(v)) for _ in range(k)]
        keys = (1000 + trial, 2, 3)
        for n in range(k + 1):
            alone = sampling.verify_row(target[:n + 1], draft[:n],
                                        None if q_rows is None else q_rows[:n], keys, 50,
                                        greedy)
            t2, d2, q2 = _hostile(target, draft, q_rows, n, v)
            st, acc, toks = sampling.verify_row_ragged(t2, d2, q2, keys, 50, greedy, n)
            assert st == alone[0] == 0
            assert acc == alone[1] <= n
            assert toks == alone[2] + [-1] * (k - n)


def test_zero_drafts_draw_the_bonus_from_row_zero_at_the_position(rng):
    v = 9
    target = _rows(rng, 3, v)
    for seed in range(40):
        keys = (seed, 0, 1)
        st, acc, toks = sampling.verify_row_ragged(target, [v + 1, -1], None, keys, 77,
                                                   False, 0)
        p = dyadic.reference.fixedpoint.target_row_fixed(target[0])[1]
        assert (st, acc) == (0, 0)
        assert toks == [sampling.draw_weighted(p, keys, 77), -1, -1]


@pytest.mark.parametrize("n", [-1, 3, 2**31])
def test_count_outside_zero_k_fails_before_anything_is_read(n, rng):
    target = [[NAN_BITS] * 5] * 3  # never examined
    assert sampling.verify_row_ragged(target, [0, 1], None, (1, 2, 3), 0, False, n) == (
        _status.NUM_DRAFTS_INVALID, 0, None)


@pytest.mark.parametrize("v", [1, 2, 5, 13])
@pytest.mark.parametrize("n", [0, 1, 3])
def test_ragged_first_token_distribution_equals_target(v, n, rng):
    k = 3
    for trial in range(3):
        target = _rows(rng, k + 1, v)
        q = [dyadic.reference.allocate((rng.standard_normal((1, v)) * 2).astype(np.float32),
                                       logits=True).counts[0].tolist() for _ in range(k)]
        spoiled = [row if i <= n else [NAN_BITS] * v for i, row in enumerate(target)]
        out = distribution.ragged_first_token_distribution(spoiled, q, n)
        assert out == distribution.target_distribution(target[0])
        assert sum(out) == 1


def test_ragged_distribution_refuses_a_count_outside():
    with pytest.raises(ValueError, match=r"num_drafts: row 0: .*\[status 15\]"):
        distribution.ragged_first_token_distribution([[0]], [[TOTAL]], 2)
