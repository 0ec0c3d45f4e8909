"""A Dyadic owns what it validated; indexing stays on the batch axes; argument errors.

Every test here failed (or crashed) before a Dyadic copied its inputs and before the
argument checks named below existed.
"""

import numpy as np
import pytest

import dyadic
from dyadic import Dyadic, Keys

TOTAL = 1 << 24


def _dense(b, v, hot=0):
    c = np.zeros((b, v), np.uint32)
    c[:, hot] = TOTAL
    return c


def _sparse(b, w, v):
    ids = np.full((b, w), -1, np.int32)
    counts = np.zeros((b, w), np.uint32)
    ids[:, 0], ids[:, 1] = 1, v - 1
    counts[:, 0] = counts[:, 1] = TOTAL // 2
    return counts, ids


# ------------------------------------------------------------------ ownership

def test_constructor_leaves_the_callers_array_writeable_and_unshared():
    c = _dense(2, 5)
    q = Dyadic(c)
    assert c.flags.writeable
    assert not np.shares_memory(q.counts, c)
    assert not q.counts.flags.writeable
    c[0, 0] = 7  # the caller may reuse the buffer: the Dyadic does not change
    assert q.counts[0, 0] == TOTAL


def test_a_writeable_base_refilled_after_construction_cannot_reach_a_kernel():
    base = np.zeros((2, 8), np.uint32)
    base[:, 1] = TOTAL
    ids_base = np.full((2, 8), -1, np.int32)
    ids_base[:, 0] = 3
    counts_view = base[:, 1:5]
    ids_view = ids_base[:, :4]
    q = Dyadic(counts_view, ids_view, vocab_size=6)
    ids_base[:, 0] = 1 << 30  # refill the caller's buffers with hostile values
    base[:, :] = 0xFFFFFFFF
    assert q.ids[:, 0].tolist() == [3, 3]
    assert dyadic.draw(q, Keys(seed=[1, 2]), backend="cpu").tolist() == [3, 3]


def test_torch_inputs_are_copied():
    torch = pytest.importorskip("torch")
    c = torch.from_numpy(_dense(2, 4))
    q = Dyadic(c)
    assert isinstance(q.counts, torch.Tensor)
    assert q.counts.data_ptr() != c.data_ptr()
    c.zero_()
    assert int(q.counts[0, 0]) == TOTAL
    assert dyadic.draw(q, Keys(seed=[3, 4])).tolist() == [0, 0]


def test_meta_tensors_are_refused_naming_the_argument():
    torch = pytest.importorskip("torch")
    meta = torch.empty((2, 4), dtype=torch.float32, device="meta")
    with pytest.raises(TypeError, match="x: a meta tensor has no data"):
        dyadic.allocate(meta)
    with pytest.raises(TypeError, match="logits: a meta tensor"):
        dyadic.propose(meta, Keys(1))
    with pytest.raises(TypeError, match="counts: a meta tensor"):
        Dyadic(torch.empty((2, 4), dtype=torch.uint32, device="meta"))


# ------------------------------------------------------------------ indexing

@pytest.mark.parametrize("index", [(Ellipsis, slice(None, 1)), (Ellipsis, 0), (slice(None), 1),
                                   (0,), (Ellipsis,), (np.array([1, 0]),),
                                   (np.array([True, False, True]),), (None, 0)])
def test_indexing_selects_batch_rows_only(index):
    v = 7
    rows = _dense(6, v)
    for r in range(6):
        rows[r] = 0
        rows[r, r] = TOTAL
    q = Dyadic(rows.reshape(3, 2, v))
    got = q[index]
    want = np.arange(6).reshape(3, 2)[index]
    assert got.batch_shape == np.shape(want)
    assert got.width == v and got.vocab_size == v
    hot = np.asarray(got.counts).reshape(-1, v).argmax(axis=1)
    np.testing.assert_array_equal(hot, np.asarray(want).reshape(-1))


def test_indexing_that_would_reach_the_vocabulary_axis_raises():
    q = Dyadic(_dense(4, 5))
    with pytest.raises(IndexError, match="vocabulary axis is not indexable"):
        q[0, 1]
    with pytest.raises(IndexError, match="vocabulary axis"):
        q[0][0]


def test_ellipsis_index_of_a_chain_verifies_like_the_rows_it_selects():
    rng = np.random.default_rng(0)
    b, k, v = 3, 2, 50
    p = rng.random((b, k + 1, v)).astype(np.float32)
    p /= p.sum(axis=-1, keepdims=True)
    q = dyadic.allocate(rng.random((b, k, v)).astype(np.float32))
    q1 = q[..., :1]  # the first position of the chain: batch (B, 1), still width V
    assert q1.batch_shape == (b, 1) and q1.width == v
    draft = np.zeros((b, 1), np.int32)
    r = dyadic.verify(p[:, :2], draft, q1, Keys(seed=[1, 2, 3]))
    r_ref = dyadic.verify(p[:, :2], draft, q1, Keys(seed=[1, 2, 3]), backend="reference")
    np.testing.assert_array_equal(r.tokens, r_ref.tokens)


def test_stack_and_to_dense_give_valid_copies():
    counts, ids = _sparse(2, 4, 9)
    q = Dyadic(counts, ids, vocab_size=9)
    s = dyadic.stack([q, q], axis=1)
    assert s.batch_shape == (2, 2)
    d = q.to_dense()
    assert d.counts.shape == (2, 9) and int(d.counts[0, 8]) == TOTAL // 2
    assert not np.shares_memory(s.counts, q.counts)


# ------------------------------------------------------------------ argument errors

@pytest.mark.parametrize("vocab_size, err, msg", [
    (2.5, TypeError, "vocab_size: .*expected an int"),
    ("3", TypeError, "vocab_size: .*expected an int"),
    (True, TypeError, "vocab_size: .*expected an int"),
    (0, ValueError, r"vocab_size: vocabulary size 0 out of range"),
    ((1 << 24) + 1, ValueError, "vocab_size: vocabulary size"),
])
def test_vocab_size_must_be_an_int_in_range(vocab_size, err, msg):
    counts, ids = _sparse(1, 3, 3)
    with pytest.raises(err, match=msg):
        Dyadic(counts, ids, vocab_size=vocab_size)


def test_zero_width_counts_and_bad_policies_are_refused():
    with pytest.raises(ValueError, match="counts: width .* is 0"):
        Dyadic(np.zeros((2, 0), np.uint32))
    with pytest.raises(TypeError, match="policy: expected a str, got list"):
        Dyadic(_dense(1, 3), policy=["standard"])
    with pytest.raises(TypeError, match="policy: expected a str, got list"):
        dyadic.allocate(np.ones((1, 3), np.float32), policy=["standard"])
    with pytest.raises(ValueError, match="policy: unknown policy 'bogus'"):
        dyadic.propose(np.ones((1, 3), np.float32), Keys(1), policy="bogus")


@pytest.mark.parametrize("call", ["allocate", "propose", "draw", "verify"])
@pytest.mark.parametrize("check", ["bogus", "", None, 1, "lazy"])
def test_check_must_be_a_known_mode(call, check):
    if check == "lazy" and call == "verify":
        pytest.skip("verify accepts check='lazy'")
    x = np.ones((1, 4), np.float32)
    q = dyadic.allocate(x)
    with pytest.raises(ValueError, match="check: expected True or False|check: expected True,"):
        if call == "allocate":
            dyadic.allocate(x, check=check)
        elif call == "propose":
            dyadic.propose(x, Keys(1), check=check)
        elif call == "draw":
            dyadic.draw(q, Keys(1), check=check)
        else:
            p = np.full((1, 1, 4), 0.25, np.float32)
            dyadic.verify(p, np.zeros((1, 0), np.int32), dyadic.stack([q], axis=1)[:, :0],
                          Keys(1), check=check)


def test_unavailable_backend_names_what_to_install(monkeypatch):
    from dyadic import _backend

    monkeypatch.setitem(_backend._REGISTRY, "missing",
                        ("dyadic.no_such_module", "X", "pip install something-real"))
    with pytest.raises(_backend.BackendUnavailable,
                       match=r"backend 'missing' cannot load: pip install something-real "
                             r"\(ModuleNotFoundError"):
        dyadic.draw(Dyadic(_dense(1, 2)), Keys(1), backend="missing")
    assert "missing" not in dyadic.available_backends()
    assert issubclass(_backend.BackendUnavailable, RuntimeError)


def test_gpu_backends_without_a_gpu_raise_the_registry_error():
    from dyadic import _backend

    for name in ("cuda", "numba"):
        if name in dyadic.available_backends():
            continue
        with pytest.raises(_backend.BackendUnavailable, match=f"backend '{name}' cannot"):
            dyadic.draw(Dyadic(_dense(1, 2)), Keys(1), backend=name)
