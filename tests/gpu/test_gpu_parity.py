"""backend="cuda" == "cpu" (== "reference" on small sizes) bit for bit.

Runs whenever CuPy and a GPU are present; skips with the reason otherwise.
Small sizes are compared with the reference; large ones with the CPU backend.
"""

import numpy as np
import pytest

import dyadic
from dyadic import _backend
from dyadic.bench.timing import capture_graph

from conftest import _load, random_target as _target

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cuda():
    be, why = _load("cuda")
    if be is None:
        pytest.skip(why)
    return "cuda"


def _oracle(v, batch=1):
    """The reference for small problems, else the CPU backend (reference if absent)."""
    if v * batch <= 5000:
        return "reference"
    be, _ = _load("cpu")
    return "cpu" if be is not None else "reference"


def _logits(rng, b, v, kind="random"):
    if kind == "random":
        x = rng.standard_normal((b, v)).astype(np.float32) * 3
    elif kind == "ties":
        x = rng.integers(-3, 3, size=(b, v)).astype(np.float32)
    elif kind == "spiky":
        x = np.full((b, v), -50.0, dtype=np.float32)
        x[:, rng.integers(0, v, size=3)] = 10.0
    elif kind == "neginf":
        x = rng.standard_normal((b, v)).astype(np.float32)
        x[:, rng.random(v) < 0.5] = -np.inf
        x[:, 0] = 1.0
    return x


def _eq(a, b):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _same_dyadic(q1, q2):
    _eq(q1.counts, q2.counts)
    assert (q1.ids is None) == (q2.ids is None)
    if q1.ids is not None:
        _eq(q1.ids, q2.ids)


VS = [1, 2, 111, 4097, 32000, 129280]


@pytest.mark.parametrize("v", VS)
@pytest.mark.parametrize("b", [1, 3, 64])
@pytest.mark.parametrize("top_k", [None, 1, 32, 256])
def test_propose_parity(cuda, v, b, top_k):
    if v * b > 200000 and top_k is None and b == 64:
        b = 8
    rng = np.random.default_rng(v * 1000 + b + (top_k or 0))
    oracle = _oracle(v, b)
    for kind in ("random", "ties", "spiky", "neginf"):
        x = _logits(rng, b, v, kind)
        temp = rng.choice([0.0, 0.7, 1.0, 1.3], size=b)
        keys = dyadic.Keys(seed=rng.integers(0, 2**63, size=b), generation=3, round=1,
                           position=rng.integers(0, 2**31, size=b))
        t1, q1 = dyadic.propose(x, keys, temperature=temp, top_k=top_k, backend=cuda)
        t2, q2 = dyadic.propose(x, keys, temperature=temp, top_k=top_k, backend=oracle)
        _eq(t1, t2)
        _same_dyadic(q1, q2)
        if v * b > 200000:
            break


@pytest.mark.parametrize("v", VS)
@pytest.mark.parametrize("top_k", [None, 1, 32, 256])
@pytest.mark.parametrize("logits", [False, True])
@pytest.mark.parametrize("policy", ["standard", "floor-first"])
def test_allocate_parity(cuda, v, top_k, logits, policy):
    rng = np.random.default_rng(v + (top_k or 0))
    b = 3
    oracle = _oracle(v, b)
    if logits:
        x = _logits(rng, b, v, "random")
        bias = rng.standard_normal(v).astype(np.float32)
        kw = dict(logits=True, temperature=np.array([0.5, 1.0, 2.0]), bias=bias)
    else:
        x = rng.random((b, v)).astype(np.float32)
        x[:, rng.random(v) < 0.3] = 0
        x[:, 0] = 0.5
        kw = {}
    q1 = dyadic.allocate(x, top_k=top_k, policy=policy, backend=cuda, **kw)
    q2 = dyadic.allocate(x, top_k=top_k, policy=policy, backend=oracle, **kw)
    _same_dyadic(q1, q2)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_inputs(cuda, dtype):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    x = torch.from_numpy(_logits(rng, 4, 4097)).to(getattr(torch, dtype))
    keys = dyadic.Keys(seed=5, position=9)
    for top_k in (None, 32):
        t1, q1 = dyadic.propose(x, keys, top_k=top_k, backend=cuda)
        t2, q2 = dyadic.propose(x, keys, top_k=top_k, backend="cpu" if _load("cpu")[0] else "reference")
        _eq(t1, t2)
        _same_dyadic(q1, q2)


@pytest.mark.parametrize("v", VS)
@pytest.mark.parametrize("b", [1, 3, 64])
@pytest.mark.parametrize("k", [1, 5, 8])
@pytest.mark.parametrize("qkind", ["dense", "sparse", "point"])
def test_verify_parity(cuda, v, b, k, qkind):
    if v * b * (k + 1) > 3_000_000:
        b = max(1, 3_000_000 // (v * (k + 1)))
    rng = np.random.default_rng(v + b + k)
    oracle = _oracle(v * (k + 1), b)
    p = _target(rng, b, k + 1, v)
    logits = np.log(np.maximum(p[:, :k], 1e-30)).reshape(b * k, v) + \
        rng.standard_normal((b * k, v)).astype(np.float32) * 0.5
    top_k = None if qkind == "dense" else 32
    if qkind == "point":
        q = None
        draft = np.argmax(p[:, :k], axis=-1).astype(np.int32)
        draft[:, -1] = rng.integers(0, v, size=b)
    else:
        keys_q = dyadic.Keys(seed=11, position=np.arange(b * k))
        draft, q = dyadic.propose(logits.astype(np.float32), keys_q, top_k=top_k, backend="cuda")
        draft = np.asarray(draft).reshape(b, k)
        q = dyadic.Dyadic(np.asarray(q.counts).reshape(b, k, -1),
                          None if q.ids is None else np.asarray(q.ids).reshape(b, k, -1),
                          vocab_size=v)
    greedy = rng.random(b) < 0.2
    keys = dyadic.Keys(seed=rng.integers(0, 2**63, size=b), generation=1, round=2,
                       position=rng.integers(0, 2**20, size=b))
    r1 = dyadic.verify(p, draft, q, keys, greedy=greedy, backend=cuda)
    r2 = dyadic.verify(p, draft, q, keys, greedy=greedy, backend=oracle)
    _eq(r1.accepted, r2.accepted)
    _eq(r1.tokens, r2.tokens)


def test_draw_and_philox(cuda):
    rng = np.random.default_rng(3)
    x = rng.random((5, 333)).astype(np.float32)
    keys = dyadic.Keys(seed=rng.integers(0, 2**63, size=5), position=4)
    for top_k in (None, 16):
        q = dyadic.allocate(x, top_k=top_k, backend="reference")
        _eq(dyadic.draw(q, keys, backend=cuda), dyadic.draw(q, keys, backend="reference"))
    c = rng.integers(0, 2**32, size=(100, 4), dtype=np.uint64)
    kk = rng.integers(0, 2**32, size=(100, 2), dtype=np.uint64)
    _eq(dyadic.philox4x32(c, kk, backend=cuda), dyadic.philox4x32(c, kk, backend="reference"))


@pytest.mark.parametrize("top_k", [None, 32])
def test_errors_same(cuda, top_k):
    bad = np.zeros((3, 50), dtype=np.float32)
    bad[1, 7] = np.nan
    bad[2, 3] = np.inf
    for backend in (cuda, "reference"):
        with pytest.raises(ValueError) as e:
            dyadic.propose(bad, dyadic.Keys(1), top_k=top_k, backend=backend)
        if backend == cuda:
            msg = str(e.value)
        else:
            assert str(e.value) == msg
    p = _target(np.random.default_rng(1), 2, 3, 40)
    p[1, 1] *= 2
    d = np.zeros((2, 2), dtype=np.int32)
    msgs = []
    for backend in (cuda, "reference"):
        with pytest.raises(ValueError) as e:
            dyadic.verify(p, d, None, dyadic.Keys(1), backend=backend)
        msgs.append(str(e.value))
    assert msgs[0] == msgs[1]


# ---------------------------------------------------------------- device path
def _torch_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    return torch


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("top_k", [None, 32])
def test_device_propose_verify(cuda, dtype, top_k):
    torch = _torch_cuda()
    rng = np.random.default_rng(21)
    b, v, k = 4, 32000, 5
    x = torch.from_numpy(_logits(rng, b, v)).to(getattr(torch, dtype))
    keys = dyadic.Keys(seed=rng.integers(0, 2**63, size=b), position=17)
    t1, q1 = dyadic.propose(x.cuda(), keys, top_k=top_k, backend=cuda)
    t2, q2 = dyadic.propose(x, keys, top_k=top_k, backend="cpu")
    assert t1.is_cuda and q1.counts.is_cuda
    _eq(t1.cpu().numpy(), t2.numpy())
    _eq(q1.counts.cpu().numpy(), q2.counts.numpy())
    p = _target(rng, b, k + 1, v)
    draft = rng.integers(0, v, size=(b, k)).astype(np.int32)
    r1 = dyadic.verify(torch.from_numpy(p).cuda(), torch.from_numpy(draft).cuda(), None, keys,
                       backend=cuda)
    r2 = dyadic.verify(p, draft, None, keys, backend="cpu")
    _eq(r1.accepted.cpu().numpy(), r2.accepted)
    _eq(r1.tokens.cpu().numpy(), r2.tokens)


def test_device_check_false_fail_closed(cuda):
    torch = _torch_cuda()
    from dyadic import _status
    rng = np.random.default_rng(5)
    x = _logits(rng, 3, 500)
    x[1, 10] = np.nan
    xs = torch.from_numpy(x).cuda()
    keys = dyadic.Keys(seed=3)
    with pytest.raises(ValueError) as e1:
        dyadic.propose(xs, keys, backend=cuda)
    with pytest.raises(ValueError) as e2:
        dyadic.propose(x, keys, backend="reference")
    assert str(e1.value) == str(e2.value)
    st = torch.empty(3, dtype=torch.int32, device="cuda")
    tok, q = dyadic.propose(xs, keys, backend=cuda, check=False, out={"status": st})
    assert st.cpu().tolist() == [0, _status.X_NAN, 0]
    assert tok[1].item() == -1
    good = dyadic.propose(x[[0, 2]], dyadic.Keys(seed=3), backend="reference")[0]
    assert tok[[0, 2]].cpu().tolist() == list(good)
    p = _target(rng, 3, 3, 500)
    p[2, 1, :] *= 0.5
    r = dyadic.verify(torch.from_numpy(p).cuda(), torch.zeros(3, 2, dtype=torch.int32, device="cuda"),
                      None, keys, backend=cuda, check=False)
    assert r.status.cpu().tolist() == [0, 0, _status.TARGET_SUM]
    assert r.tokens[2].cpu().tolist() == [-1, -1, -1]
    # draft ids outside [0, V): that request fails closed (greedy requests too), no read
    # at the bad id
    p = _target(rng, 4, 3, 500)
    d = torch.tensor([[1, 2], [3, 500], [-1, 0], [4, 5]], dtype=torch.int32, device="cuda")
    for greedy in (None, torch.tensor([False, True, True, False], device="cuda")):
        r = dyadic.verify(torch.from_numpy(p).cuda(), d, None, keys, greedy=greedy, backend=cuda,
                          check=False)
        assert r.status.cpu().tolist() == [0, _status.DRAFT_OUT_OF_RANGE,
                                           _status.DRAFT_OUT_OF_RANGE, 0]
        assert r.tokens[1:3].cpu().tolist() == [[-1, -1, -1]] * 2
        assert r.accepted[1:3].cpu().tolist() == [0, 0]


def test_cuda_graph_replay(cuda):
    torch = _torch_cuda()
    rng = np.random.default_rng(9)
    b, v, k = 4, 129280, 5
    dev = "cuda"
    x = torch.zeros(b, v, dtype=torch.bfloat16, device=dev)
    seed = torch.zeros(b, dtype=torch.int64, device=dev)
    pos = torch.zeros(b, dtype=torch.int32, device=dev)
    keys = dyadic.Keys(seed=seed, generation=torch.zeros(b, dtype=torch.int32, device=dev),
                       round=torch.zeros(b, dtype=torch.int32, device=dev), position=pos)
    out = {"tokens": torch.empty(b, dtype=torch.int32, device=dev),
           "counts": torch.empty(b, 32, dtype=torch.uint32, device=dev),
           "ids": torch.empty(b, 32, dtype=torch.int32, device=dev),
           "status": torch.empty(b, dtype=torch.int32, device=dev)}
    tgt = torch.zeros(b, k + 1, v, dtype=torch.float32, device=dev)
    draft = torch.zeros(b, k, dtype=torch.int32, device=dev)
    vout = {"accepted": torch.empty(b, dtype=torch.int32, device=dev),
            "tokens": torch.empty(b, k + 1, dtype=torch.int32, device=dev),
            "status": torch.empty(b, dtype=torch.int32, device=dev)}

    def fill():
        x.copy_(torch.from_numpy(_logits(rng, b, v)).to(torch.bfloat16))
        seed.copy_(torch.from_numpy(rng.integers(0, 2**62, size=b)))
        pos.copy_(torch.from_numpy(rng.integers(0, 2**30, size=b).astype(np.int32)))
        tgt.copy_(torch.from_numpy(_target(rng, b, k + 1, v)))
        draft.copy_(torch.from_numpy(rng.integers(0, v, size=(b, k)).astype(np.int32)))

    def step():
        dyadic.propose(x, keys, top_k=32, backend=cuda, check=False, out=out)
        dyadic.verify(tgt, draft, None, keys, backend=cuda, check=False, out=vout)

    fill()
    replay = capture_graph(step)
    for _ in range(3):
        fill()
        replay()
        torch.cuda.synchronize()
        hk = dyadic.Keys(seed=seed.cpu().numpy().astype(np.uint64), position=pos.cpu().numpy())
        xf = x.cpu()
        t2, q2 = dyadic.propose(xf, hk, top_k=32, backend="cpu")
        _eq(out["tokens"].cpu().numpy(), t2.numpy())
        _eq(out["counts"].cpu().numpy(), q2.counts.numpy())
        r2 = dyadic.verify(tgt.cpu().numpy(), draft.cpu().numpy(), None, hk, backend="cpu")
        _eq(vout["tokens"].cpu().numpy(), r2.tokens)
        _eq(vout["accepted"].cpu().numpy(), r2.accepted)
