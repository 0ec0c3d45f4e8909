"""torch CPU tensors in, torch tensors out; bfloat16/float16 convert exactly."""

import numpy as np
import pytest

import dyadic
from dyadic import Keys

torch = pytest.importorskip("torch")


def backends():
    return ["reference"] + [b for b in ("cpu",) if b in dyadic.available_backends()]


@pytest.fixture(params=backends())
def backend(request):
    return request.param


def test_allocate_torch_in_torch_out(backend):
    x = torch.softmax(torch.randn(3, 40, generator=torch.Generator().manual_seed(0)), -1)
    q = dyadic.allocate(x, backend=backend)
    assert isinstance(q.counts, torch.Tensor) and q.counts.dtype == torch.uint32
    ref = dyadic.allocate(x.numpy(), backend="reference")
    assert np.array_equal(q.counts.numpy(), ref.counts)
    qs = dyadic.allocate(x, top_k=5, backend=backend)
    assert isinstance(qs.ids, torch.Tensor) and qs.ids.dtype == torch.int32
    assert isinstance(qs.probs(), torch.Tensor)
    assert isinstance(qs.to_dense().counts, torch.Tensor)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_logits_convert_exactly(backend, dtype):
    x = (torch.randn(2, 64, generator=torch.Generator().manual_seed(1)) * 4).to(getattr(torch, dtype))
    exact = x.to(torch.float32).numpy()
    t1, q1 = dyadic.propose(x, Keys(3, position=9), top_k=8, backend=backend)
    t2, q2 = dyadic.propose(exact, Keys(3, position=9), top_k=8, backend="reference")
    assert isinstance(t1, torch.Tensor) and t1.dtype == torch.int32
    assert t1.tolist() == t2.tolist()
    assert np.array_equal(q1.counts.numpy(), q2.counts)
    assert np.array_equal(q1.ids.numpy(), q2.ids)


def test_verify_torch(backend):
    g = torch.Generator().manual_seed(2)
    p = torch.softmax(torch.randn(2, 3, 30, generator=g) * 2, -1)
    q = dyadic.allocate(torch.softmax(torch.randn(2, 2, 30, generator=g), -1), backend=backend)
    draft = dyadic.draw(q, Keys(1), backend=backend)
    assert isinstance(draft, torch.Tensor)
    v = dyadic.verify(p, draft, q, Keys(2), backend=backend)
    assert isinstance(v.accepted, torch.Tensor) and isinstance(v.tokens, torch.Tensor)
    vn = dyadic.verify(p.numpy(), draft.numpy(), dyadic.Dyadic(q.counts.numpy()), Keys(2),
                       backend="reference")
    assert v.tokens.tolist() == vn.tokens.tolist()


def test_zero_copy_view_of_float32_input():
    from dyadic import _arrays

    x = torch.rand(4, 8)
    assert np.shares_memory(_arrays.float_to_numpy(x, "x"), x.numpy())


def test_torch_rejects_other_dtypes():
    with pytest.raises(TypeError, match=r"x: dtype float64 not supported; expected float32, float16 or bfloat16 \(convert explicitly"):
        dyadic.allocate(torch.rand(2, 4, dtype=torch.float64), backend="reference")
    with pytest.raises(TypeError, match="target: dtype bfloat16; expected float32"):
        dyadic.verify(torch.rand(1, 2, 4).to(torch.bfloat16), torch.zeros(1, 1, dtype=torch.int32),
                      None, Keys(1), backend="reference")
