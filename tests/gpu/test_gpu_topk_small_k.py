"""topk_onepass / topk_onepass_wide (backend="cuda", top_k <= 32) == the CPU backend, on
adversarial rows.  The batch picks the kernel (backends/cuda/cupy/routes.py: at V = 129280
B = 1 takes topk_onepass, larger batches topk_onepass_wide; a bias on logits keeps
topk_onepass; 16-bit logits without bias take the packed kernels, tested in
test_gpu_topk_16bit_logits.py).

The fast top-k kernel thresholds on per-thread maxima of a coarse key and
falls back to an exact radix select when ties swamp the survivors; these
cases aim at each branch: mass ties (fallback), ties straddling the K-th
place, -0.0 / +0.0, subnormals, huge logits, -inf masses, temperatures
outside the coarse-key range (exact keys), bias (exact keys), probabilities,
half-precision inputs, both policies, failing rows.  Skips without a GPU.
"""

import numpy as np
import pytest

import dyadic

from conftest import _load

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cuda():
    be, why = _load("cuda")
    if be is None:
        pytest.skip(why)
    if _load("cpu")[0] is None:
        pytest.skip("the CPU backend is not built")
    return "cuda"


def _rows(rng, kind, b, v):
    if kind == "random":
        return (rng.standard_normal((b, v)) * 3).astype(np.float32)
    if kind == "equal":  # every key equal: survivors swamp PK_SMAX
        return np.full((b, v), 0.25, dtype=np.float32)
    if kind == "fewvals":  # ties straddle the K-th place
        return rng.integers(-2, 2, size=(b, v)).astype(np.float32)
    if kind == "zeros":  # -0.0 and +0.0 mixed: equal keys
        x = np.where(rng.random((b, v)) < 0.5, -0.0, 0.0).astype(np.float32)
        x[:, rng.integers(0, v, size=min(v, 5))] = -1.0
        return x
    if kind == "subnormal":
        x = (rng.integers(-50, 50, size=(b, v)) * np.float32(1e-45)).astype(np.float32)
        return x
    if kind == "huge":
        x = rng.choice(np.array([-3e38, 3e38, 1e38, -1e-38, 0.0], dtype=np.float32), size=(b, v))
        return x
    if kind == "neginf":
        x = np.full((b, v), -np.inf, dtype=np.float32)
        x[:, rng.integers(0, v, size=min(v, 3))] = rng.standard_normal(min(v, 3)).astype(np.float32)
        return x
    if kind == "tail_spike":  # the best ids in the last block of the row
        x = np.full((b, v), -5.0, dtype=np.float32)
        x[:, -min(v, 40):] = 7.0
        return x
    raise AssertionError(kind)


KINDS = ["random", "equal", "fewvals", "zeros", "subnormal", "huge", "neginf", "tail_spike"]


def _both(f):
    """f(backend) on cuda and cpu: the same results, or the same error."""
    try:
        r2 = f("cpu")
    except ValueError as e:
        with pytest.raises(ValueError) as e1:
            f("cuda")
        assert str(e1.value) == str(e)
        return None, None
    return f("cuda"), r2


def _same(q1, q2):
    np.testing.assert_array_equal(np.asarray(q1.counts), np.asarray(q2.counts))
    np.testing.assert_array_equal(np.asarray(q1.ids), np.asarray(q2.ids))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("v", [1, 2, 33, 111, 4097, 129280])
@pytest.mark.parametrize("b", [1, 64])
def test_propose_topk_small_k_parity(cuda, kind, v, b):
    if v * b > 2_000_000:
        b = 16
    rng = np.random.default_rng(hash((kind, v, b)) % 2**32)
    x = _rows(rng, kind, b, v)
    for top_k in (1, 31, 32):
        for temp in (0.7, rng.choice([0.0, 0.5, 1.0, 1e-300, 1e250], size=b)):
            keys = dyadic.Keys(seed=rng.integers(0, 2**63, size=b), generation=2, round=5,
                               position=rng.integers(0, 2**31, size=b))
            for policy in ("standard", "floor-first"):
                r1, r2 = _both(lambda be: dyadic.propose(x, keys, temperature=temp, top_k=top_k,
                                                         policy=policy, backend=be))
                if r1 is None:
                    continue
                np.testing.assert_array_equal(np.asarray(r1[0]), np.asarray(r2[0]))
                _same(r1[1], r2[1])


@pytest.mark.parametrize("kind", ["random", "fewvals", "equal"])
@pytest.mark.parametrize("v", [2, 111, 4097, 129280])
def test_allocate_fast_bias_and_probs(cuda, kind, v):
    rng = np.random.default_rng(v)
    b = 5
    x = _rows(rng, kind, b, v)
    bias = np.where(rng.random(v) < 0.1, -np.inf, rng.standard_normal(v)).astype(np.float32)
    bias[0] = 0.0
    probs = np.abs(x) / max(1.0, float(np.abs(x).max()))
    probs[:, 0] = 0.5
    for top_k in (1, 32):
        for policy in ("standard", "floor-first"):
            q1, q2 = _both(lambda be: dyadic.allocate(x, logits=True, bias=bias, temperature=0.9,
                                                      top_k=top_k, policy=policy, backend=be))
            if q1 is not None:
                _same(q1, q2)
            q1, q2 = _both(lambda be: dyadic.allocate(probs, top_k=top_k, policy=policy,
                                                      backend=be))
            if q1 is not None:
                _same(q1, q2)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("b", [1, 4, 64])
def test_propose_topk_small_k_device_half(cuda, dtype, b):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(b)
    v = 129280
    x = torch.from_numpy(_rows(rng, "random", b, v)).to(getattr(torch, dtype))
    keys = dyadic.Keys(seed=rng.integers(0, 2**63, size=b), position=rng.integers(0, 2**31, size=b))
    t1, q1 = dyadic.propose(x.cuda(), keys, temperature=0.7, top_k=32, backend=cuda)
    t2, q2 = dyadic.propose(x.float().numpy(), keys, temperature=0.7, top_k=32, backend="cpu")
    np.testing.assert_array_equal(t1.cpu().numpy(), np.asarray(t2))
    np.testing.assert_array_equal(q1.counts.cpu().numpy(), np.asarray(q2.counts))
    np.testing.assert_array_equal(q1.ids.cpu().numpy(), np.asarray(q2.ids))


def test_propose_topk_small_k_bad_rows_fail_closed(cuda):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    b, v = 6, 4097
    x = _rows(rng, "random", b, v)
    x[1, 4000] = np.nan
    x[2, 7] = np.inf
    x[3, :] = -np.inf
    x[4, 100] = np.nan
    x[4, 50] = np.inf  # the first bad id decides the status
    keys = dyadic.Keys(seed=np.arange(b), position=0)
    out = {"tokens": torch.empty(b, dtype=torch.int32, device="cuda"),
           "counts": torch.empty(b, 32, dtype=torch.uint32, device="cuda"),
           "ids": torch.empty(b, 32, dtype=torch.int32, device="cuda"),
           "status": torch.empty(b, dtype=torch.int32, device="cuda")}
    dyadic.propose(torch.from_numpy(x).cuda(), keys, top_k=32, backend=cuda, check=False, out=out)
    st = out["status"].cpu().numpy()
    assert list(st) == [0, 1, 2, 4, 2, 0]
    tok = out["tokens"].cpu().numpy()
    assert (tok[1:5] == -1).all()
    assert (out["ids"].cpu().numpy()[1:5] == -1).all()
    assert (out["counts"].cpu().numpy()[1:5] == 0).all()
    good = [0, 5]
    t2, q2 = dyadic.propose(x[good], dyadic.Keys(seed=np.array(good), position=0), top_k=32,
                            backend="cpu")
    np.testing.assert_array_equal(tok[good], np.asarray(t2))
    np.testing.assert_array_equal(out["counts"].cpu().numpy()[good], np.asarray(q2.counts))


@pytest.mark.parametrize("b", [1, 3])
@pytest.mark.parametrize("kind", ["random", "fewvals", "equal", "tail_spike"])
def test_propose_topk_small_k_tiles(cuda, b, kind):
    """topk_onepass's tiles of 4096 ids (B = 1) and topk_onepass_wide's of 8192 (B = 3):
    ties that overflow the survivor buffer hit the exact fallback, ties at the bound the
    rank counting."""
    rng = np.random.default_rng(b)
    v = 129280
    x = _rows(rng, kind, b, v)
    keys = dyadic.Keys(seed=rng.integers(0, 2**63, size=b), position=rng.integers(0, 2**31, size=b))
    for policy in ("standard", "floor-first"):
        t1, q1 = dyadic.propose(x, keys, temperature=0.8, top_k=32, policy=policy, backend=cuda)
        t2, q2 = dyadic.propose(x, keys, temperature=0.8, top_k=32, policy=policy, backend="cpu")
        np.testing.assert_array_equal(np.asarray(t1), np.asarray(t2))
        _same(q1, q2)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("v", [4099, 129280])
def test_propose_topk_small_k_unaligned_rows(cuda, dtype, v):
    """Rows that are not 16-byte aligned (a pointer one element past an aligned one,
    or V not a multiple of 8) take the scalar loads of topk_onepass_wide: the same results."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(v)
    b = 3
    x = torch.from_numpy(_rows(rng, "random", b, v)).to(getattr(torch, dtype))
    flat = torch.empty(b * v + 1, dtype=x.dtype, device="cuda")
    xs = flat[1:].view(b, v)
    xs.copy_(x.cuda())
    keys = dyadic.Keys(seed=rng.integers(0, 2**63, size=b), position=rng.integers(0, 2**31, size=b))
    t2, q2 = dyadic.propose(x.float().numpy(), keys, temperature=0.7, top_k=32, backend="cpu")
    for xd in (xs, x.cuda()):
        t1, q1 = dyadic.propose(xd, keys, temperature=0.7, top_k=32, backend=cuda)
        np.testing.assert_array_equal(t1.cpu().numpy(), np.asarray(t2))
        np.testing.assert_array_equal(q1.counts.cpu().numpy(), np.asarray(q2.counts))
        np.testing.assert_array_equal(q1.ids.cpu().numpy(), np.asarray(q2.ids))
