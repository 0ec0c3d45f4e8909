"""Draw, propose and verify semantics; batch invariance; statistics on the CPU."""

import numpy as np
import pytest

import dyadic
from dyadic import Keys, _spec
from dyadic.reference import philox

TOTAL = _spec.TOTAL


def backends():
    return ["reference"] + [b for b in ("cpu",) if b in dyadic.available_backends()]


@pytest.fixture(params=backends())
def backend(request):
    return request.param


def probs(shape, seed=0, scale=3.0):
    z = np.random.default_rng(seed).standard_normal(shape) * scale
    e = np.exp(z - z.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).astype(np.float32)


def test_draw_is_first_cumulative_count_above_ticket(backend):
    q = dyadic.allocate(probs((6, 9)), backend=backend)
    keys = Keys(seed=np.arange(6) * 7919, generation=3, round=2, position=np.arange(6) + 100)
    tokens = dyadic.draw(q, keys, backend=backend)
    for b in range(6):
        r = philox.proposal_ticket((b * 7919, 3, 2), 100 + b)
        cum = np.cumsum(q.counts[b].astype(np.int64))
        assert tokens[b] == int(np.argmax(cum > r))


def test_draw_sparse_matches_dense(backend):
    q = dyadic.allocate(probs((5, 40)), top_k=7, backend=backend)
    keys = Keys(seed=11, position=np.arange(5))
    assert np.array_equal(dyadic.draw(q, keys, backend=backend),
                          dyadic.draw(q.to_dense(), keys, backend=backend))


def test_propose_is_allocate_then_draw(backend):
    x = (np.random.default_rng(4).standard_normal((4, 50)) * 2).astype(np.float32)
    keys = Keys(seed=5, round=1, position=np.array([3, 4, 5, 6]))
    for top_k in (None, 1, 8):
        tokens, q = dyadic.propose(x, keys, temperature=0.7, top_k=top_k, backend=backend)
        q2 = dyadic.allocate(x, logits=True, temperature=0.7, top_k=top_k, backend=backend)
        assert np.array_equal(q.counts, q2.counts)
        assert (q.ids is None and q2.ids is None) or np.array_equal(q.ids, q2.ids)
        assert np.array_equal(tokens, dyadic.draw(q, keys, backend=backend))


def test_propose_temperature_zero_rows(backend):
    x = np.array([[0.0, 2.0, 2.0, 1.0], [5.0, 1.0, 0.0, -np.inf]], np.float32)
    tokens, q = dyadic.propose(x, Keys(1), temperature=np.array([0.0, 1.0]), top_k=3,
                               backend=backend)
    assert tokens[0] == 1  # argmax, ties to the lowest id
    assert q.ids[0].tolist() == [1, -1, -1] and q.counts[0].tolist() == [TOTAL, 0, 0]
    # no randomness consumed: any keys give the same greedy token
    for seed in (0, 1, 2**64 - 1):
        t, _ = dyadic.propose(x[:1], Keys(seed), temperature=0.0, backend=backend)
        assert t[0] == 1
    _, qd = dyadic.propose(x, Keys(1), temperature=0.0, top_k=None, backend=backend)
    assert qd.counts[0].tolist() == [0, TOTAL, 0, 0]


def test_verify_output_layout(backend):
    b, k, v = 6, 4, 30
    p = probs((b, k + 1, v), seed=1)
    q = dyadic.allocate(probs((b, k, v), seed=2), backend=backend)
    draft = np.stack([dyadic.draw(q[:, i], Keys(9, position=i), backend=backend)
                      for i in range(k)], axis=1)
    out = dyadic.verify(p, draft, q, Keys(3, position=0), backend=backend)
    assert out.accepted.dtype == np.int32 and out.tokens.dtype == np.int32
    for r in range(b):
        a = int(out.accepted[r])
        assert out.tokens[r, :a].tolist() == draft[r, :a].tolist()
        assert 0 <= out.tokens[r, a] < v
        assert (out.tokens[r, a + 1:] == -1).all()


def test_verify_identical_q_and_p_accepts_everything(backend):
    # p == q exactly (both dyadic) => every draft accepted, bonus from p
    q = dyadic.allocate(probs((3, 3, 20), seed=5), backend=backend)
    p = q.probs().astype(np.float32)
    p = np.concatenate([p, probs((3, 1, 20), seed=6)], axis=1)
    draft = np.stack([dyadic.draw(q[:, i], Keys(1, position=i), backend=backend)
                      for i in range(3)], axis=1)
    out = dyadic.verify(p, draft, q, Keys(2), backend=backend)
    assert out.accepted.tolist() == [3, 3, 3]


def test_verify_greedy_rows_use_target_argmax(backend):
    p = np.array([[[0.1, 0.6, 0.3], [0.5, 0.25, 0.25], [0.2, 0.2, 0.6]]], np.float32)
    out = dyadic.verify(p, np.array([[1, 2]], np.int32), None, Keys(1),
                        greedy=np.array([True]), backend=backend)
    assert out.accepted.tolist() == [1] and out.tokens.tolist() == [[1, 0, -1]]
    out = dyadic.verify(p, np.array([[1, 0]], np.int32), None, Keys(1),
                        greedy=np.array([True]), backend=backend)
    assert out.accepted.tolist() == [2] and out.tokens.tolist() == [[1, 0, 2]]


def test_point_mass_q_rejects_zero_target(backend):
    p = np.array([[[0.0, 0.5, 0.5], [1.0, 0.0, 0.0]]], np.float32)
    for seed in range(20):
        out = dyadic.verify(p, np.array([[0]], np.int32), None, Keys(seed), backend=backend)
        assert out.accepted[0] == 0 and out.tokens[0, 0] in (1, 2)


def test_batch_invariance(backend):
    """A row gives the same tokens alone, in any batch, at any index."""
    b, k, v = 5, 3, 25
    p = probs((b, k + 1, v), seed=7)
    x = (np.random.default_rng(8).standard_normal((b, v)) * 2).astype(np.float32)
    seeds = np.array([11, 22, 33, 44, 55], np.uint64)
    pos = np.array([0, 10, 20, 30, 40], np.int64)
    keys = Keys(seed=seeds, generation=1, round=2, position=pos)
    tokens, q = dyadic.propose(x, keys, top_k=6, backend=backend)
    qk = dyadic.allocate(probs((b, k, v), seed=9), backend=backend)
    draft = np.stack([dyadic.draw(qk[:, i], Keys(seed=seeds, position=pos + i), backend=backend)
                      for i in range(k)], axis=1)
    full = dyadic.verify(p, draft, qk, keys, backend=backend)
    perm = np.array([3, 0, 4, 1, 2])
    kp = Keys(seed=seeds[perm], generation=1, round=2, position=pos[perm])
    tp, _ = dyadic.propose(x[perm], kp, top_k=6, backend=backend)
    assert np.array_equal(tp, tokens[perm])
    vp = dyadic.verify(p[perm], draft[perm], qk[perm], kp, backend=backend)
    assert np.array_equal(vp.tokens, full.tokens[perm])
    for r in range(b):
        kr = Keys(seed=int(seeds[r]), generation=1, round=2, position=int(pos[r]))
        t1, _ = dyadic.propose(x[r:r + 1], kr, top_k=6, backend=backend)
        assert t1[0] == tokens[r]
        v1 = dyadic.verify(p[r:r + 1], draft[r:r + 1], qk[r:r + 1], kr, backend=backend)
        assert v1.tokens[0].tolist() == full.tokens[r].tolist()


def _chi_square_p(observed, expected):
    from scipy import stats

    mask = expected > 0
    assert observed[~mask].sum() == 0, "a token with zero probability was produced"
    return stats.chisquare(observed[mask], expected[mask] * observed.sum() / expected[mask].sum()).pvalue


@pytest.mark.skipif("cpu" not in dyadic.available_backends(), reason="needs the CPU backend")
def test_draw_frequencies_chi_square():
    pytest.importorskip("scipy")
    v, n = 12, 40000
    q = dyadic.allocate(probs((1, v), seed=3, scale=1.0), backend="cpu")
    rows = dyadic.Dyadic(np.repeat(q.counts, n, axis=0))
    tokens = dyadic.draw(rows, Keys(seed=np.arange(n, dtype=np.uint64), position=7), backend="cpu")
    obs = np.bincount(tokens, minlength=v).astype(float)
    assert _chi_square_p(obs, q.counts[0].astype(float)) > 1e-4


@pytest.mark.skipif("cpu" not in dyadic.available_backends(), reason="needs the CPU backend")
def test_verify_first_token_frequencies_chi_square():
    """d ~ q, then verify: the first emitted token is distributed as p (chi-square)."""
    pytest.importorskip("scipy")
    v, n = 10, 30000
    p = probs((1, 2, v), seed=21, scale=1.5)
    qrow = dyadic.allocate(probs((1, v), seed=22, scale=1.5), top_k=6, backend="cpu")
    q = dyadic.Dyadic(np.repeat(qrow.counts[:, None], n, axis=0),
                      np.repeat(qrow.ids[:, None], n, axis=0), vocab_size=v)
    seeds = np.arange(n, dtype=np.uint64)
    draft = dyadic.draw(q, Keys(seed=seeds, position=0), backend="cpu")
    out = dyadic.verify(np.repeat(p, n, axis=0), draft.reshape(n, 1), q,
                        Keys(seed=seeds + 10**6, position=0), backend="cpu")
    obs = np.bincount(out.tokens[:, 0], minlength=v).astype(float)
    exact = dyadic.reference.target_distribution(p[0, 0].view(np.uint32).tolist())
    assert _chi_square_p(obs, np.array([float(f) for f in exact])) > 1e-4
