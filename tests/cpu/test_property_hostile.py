"""Property: a Dyadic built through any public constructor or transform, from arbitrary
field values, is either refused (ValueError / TypeError / IndexError / WireError) or
valid; draw, verify (check=True and check=False) and the wire round trip on it never
crash, raise only those errors or report per-row statuses, and valid rows equal the
reference backend bit for bit.
"""

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

import dyadic  # noqa: E402
from dyadic import Dyadic, Keys, wire  # noqa: E402

TOTAL = 1 << 24
REFUSED = (ValueError, TypeError, IndexError, OverflowError, wire.WireError)

_COUNT_VALUES = st.sampled_from([0, 1, TOTAL // 2, TOTAL // 4, TOTAL - 1, TOTAL, TOTAL + 1,
                                 (1 << 32) - 1, -1, 1 << 40])
_ID_VALUES = st.sampled_from([-2, -1, 0, 1, 2, 3, 5, 7, 8, 100, (1 << 31) - 1, 1 << 31, -(1 << 31)])
_DTYPES = st.sampled_from([np.uint32, np.int64, np.int32, np.uint64, np.float32, np.uint8])


def _near_valid_counts(draw, rows, width, valid):
    """Counts summing to 2**24 per row (``valid``), else arbitrary values."""
    counts = np.zeros((rows, width), np.int64)
    for r in range(rows):
        if valid or draw(st.booleans()):
            cut = sorted(draw(st.lists(st.integers(0, TOTAL), min_size=width - 1,
                                       max_size=width - 1)))
            counts[r] = np.diff([0] + cut + [TOTAL])
        else:
            counts[r] = draw(st.lists(_COUNT_VALUES, min_size=width, max_size=width))
    return counts


@st.composite
def hostile_dyadic(draw):
    """Arrays and arguments of a Dyadic: about half valid, the rest with one or more
    fields spoiled by arbitrary values."""
    rows = draw(st.integers(1, 3))
    width = draw(st.integers(1, 5))
    spoil = set(draw(st.lists(st.sampled_from(["counts", "dtype", "ids", "order", "vocab",
                                               "policy"]), max_size=2)))
    sparse = draw(st.booleans())
    vocab = draw(st.integers(max(width, 1), 12)) if sparse else width
    if "vocab" in spoil:
        vocab = draw(st.sampled_from([2.5, "8", 0, -1, True, 1 << 25, width - 1, None]))
    counts = _near_valid_counts(draw, rows, width, valid="counts" not in spoil)
    with np.errstate(all="ignore"):
        counts = counts.astype(draw(_DTYPES) if "dtype" in spoil else np.uint32)
    ids = None
    if sparse:
        hi = vocab if isinstance(vocab, int) and vocab >= width else width
        ids = np.array([sorted(draw(st.lists(st.integers(0, hi - 1), min_size=width,
                                             max_size=width, unique=True)))
                        for _ in range(rows)], np.int32)
        if "ids" in spoil:
            r, j = draw(st.integers(0, rows - 1)), draw(st.integers(0, width - 1))
            with np.errstate(all="ignore"):
                ids = ids.astype(np.int64)
                ids[r, j] = draw(_ID_VALUES)
                ids = ids.astype(draw(st.sampled_from([np.int32, np.int64])))
        if "order" in spoil:
            ids = ids[:, ::-1].copy()
    policy = draw(st.sampled_from(["standard", "external", "floor-first"]))
    if "policy" in spoil:
        policy = draw(st.sampled_from(["bogus", ["standard"], None, 1]))
    transform = draw(st.sampled_from(["none", "ellipsis", "index", "stack", "to_dense",
                                      "wire"]))
    return counts, ids, vocab, policy, transform


def _build(counts, ids, vocab, policy, transform):
    q = Dyadic(counts, ids, vocab_size=vocab, policy=policy)
    if transform == "ellipsis":
        q = q[..., :1] if q.batch_shape[0] else q
    elif transform == "index":
        q = q[np.array([0] * 2)]
    elif transform == "stack":
        q = dyadic.stack([q, q], axis=0).__getitem__(0)
    elif transform == "to_dense":
        q = q.to_dense()
    elif transform == "wire":
        chain = dyadic.stack([q], axis=1)  # (rows, depth 1)
        sampled = np.asarray(dyadic.draw(q, Keys(1))).reshape(-1, 1)
        if (sampled < 0).any():
            raise AssertionError("a valid Dyadic drew -1")
        reply = wire.Reply.from_dyadic(chain, sampled, session=1, generation=0, round=0,
                                       slots=tuple(range(q.batch_shape[0])))
        limits = wire.Limits(vocab_size=q.vocab_size, max_support=q.vocab_size,
                             dense_width=q.vocab_size)
        back = wire.decode(wire.encode(reply), limits=limits)
        assert back == reply
        q = back.to_dyadic()[:, 0]
    return q


def _target_for(q, rng):
    v = q.vocab_size
    p = rng.random((q.batch_shape[0], 2, v)).astype(np.float64) + 1e-3
    p /= p.sum(axis=-1, keepdims=True)
    return p.astype(np.float32)


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(hostile_dyadic(), st.integers(0, 2**32 - 1))
def test_any_public_dyadic_is_refused_or_safe_and_exact(case, seed):
    try:
        q = _build(*case)
    except REFUSED as exc:
        hypothesis.event(f"refused: {type(exc).__name__}")
        return
    hypothesis.event(f"built: {case[4]}")
    assert q.width >= 1 and 1 <= q.vocab_size <= 1 << 24
    rows = q.batch_shape[0]
    keys = Keys(seed=np.arange(seed % 1000, seed % 1000 + rows, dtype=np.uint64))
    tokens = dyadic.draw(q, keys, backend="cpu")
    ref = dyadic.draw(q, keys, backend="reference")
    np.testing.assert_array_equal(tokens, ref)
    assert ((tokens >= 0) & (tokens < q.vocab_size)).all()
    rng = np.random.default_rng(seed)
    p = _target_for(q, rng)
    chain = dyadic.stack([q], axis=1)
    drafts = np.asarray(tokens).reshape(rows, 1).astype(np.int64)
    drafts[rng.random(rows) < 0.3, 0] = rng.choice([-1, q.vocab_size, 1 << 33])
    for check in (True, False):
        try:
            got = dyadic.verify(p, drafts, chain, keys, backend="cpu", check=check)
        except ValueError:
            assert check is True
            continue
        want = dyadic.verify(p, drafts, chain, keys, backend="reference", check=check)
        np.testing.assert_array_equal(got.tokens, want.tokens)
        np.testing.assert_array_equal(got.accepted, want.accepted)
        if check is False:
            np.testing.assert_array_equal(got.status, want.status)
            bad = (drafts[:, 0] < 0) | (drafts[:, 0] >= q.vocab_size)
            np.testing.assert_array_equal(got.status[bad], 13)
            assert (got.tokens[got.status != 0] == -1).all()
