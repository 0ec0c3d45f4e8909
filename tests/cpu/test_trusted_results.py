"""dyadic._types.trusted_dyadic / trusted_verdict (the GPU fast path's results) are the
objects the constructors make: same fields, same behaviour, still immutable."""

import dataclasses

import numpy as np
import pytest

from dyadic._types import Dyadic, Verdict, trusted_dyadic, trusted_verdict

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("policy", ["standard", "floor-first", "external"])
def test_trusted_dyadic_is_the_constructors(sparse, policy):
    counts = torch.zeros(3, 4, dtype=torch.uint32)
    counts[:, 0] = 2**24
    ids = torch.tensor([[0, 5, 7, -1]] * 3, dtype=torch.int32) if sparse else None
    v = 11 if sparse else 4
    got = trusted_dyadic(counts, ids, v, policy)
    want = Dyadic(counts, ids, vocab_size=v, policy=policy)
    assert type(got) is Dyadic
    for name in ("counts", "ids", "vocab_size", "policy", "semantic_id", "is_sparse",
                 "batch_shape", "width"):
        a, b = getattr(got, name), getattr(want, name)
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b), name
        else:
            assert a is b or a == b, name
    assert got.counts is counts and got.ids is ids  # the constructor copies, trusted_ does not
    assert repr(got) == repr(want)
    with pytest.raises(AttributeError, match="immutable"):
        got.policy = "standard"


def test_trusted_verdict_is_the_constructors():
    a = torch.tensor([1, 0], dtype=torch.int32)
    t = torch.tensor([[3, 4], [-1, -1]], dtype=torch.int32)
    for status in (None, torch.zeros(2, dtype=torch.int32)):
        got, want = trusted_verdict(a, t, status), Verdict(a, t, status)
        assert type(got) is Verdict
        assert got.accepted is a and got.tokens is t and got.status is status
        assert list(vars(got)) == list(vars(want)) == ["accepted", "tokens", "status"]
        assert repr(got) == repr(want)
        with pytest.raises(dataclasses.FrozenInstanceError):
            got.accepted = np.zeros(2)
