"""Dense allocate / propose on backend="cuda" (dense_* kernels, kernels/dense.cuh) == "cpu".

Adversarial rows for the boundary-bin selection: equal weights (every
remainder equal: the one-block fallback, or the shared-memory two-step select
when the bin holds 257..2048 elements), two-valued weights, one huge weight
and many tiny ones, zeros, -inf logits.  Counts must equal the CPU backend bit
for bit (ties to the lowest id).  Skips without CuPy and a GPU.
"""

import numpy as np
import pytest

import dyadic
from dyadic.bench.timing import capture_graph

from conftest import _load

pytestmark = pytest.mark.gpu

VS = [1, 2, 111, 4097, 32000, 129280]
BS = [1, 3, 64]
KINDS = ["equal", "two", "huge_tiny", "zeros", "random", "equal_zeros", "near"]


@pytest.fixture(scope="module")
def cuda():
    be, why = _load("cuda")
    if be is None:
        pytest.skip(why)
    cpu, why = _load("cpu")
    if cpu is None:
        pytest.skip(why)
    return "cuda"


def _torch_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    return torch


def _probs(rng, b, v, kind):
    if kind == "equal":
        x = np.ones((b, v), dtype=np.float32)
    elif kind == "equal_zeros":
        x = np.full((b, v), 0.25, dtype=np.float32)
        x[:, rng.random(v) < 0.4] = 0
        x[:, 0] = 0.25
    elif kind == "two":
        x = np.where(rng.random((b, v)) < 0.5, 1.0, 3.0).astype(np.float32)
    elif kind == "huge_tiny":
        x = np.full((b, v), 1e-9, dtype=np.float32)
        x[:, rng.integers(0, v)] = 1.0
        x[:, rng.random(v) < 0.1] = 0
    elif kind == "near":  # one bin holding many elements with a few distinct remainders
        k = rng.integers(0, 4, size=(b, v)).astype(np.float32)
        x = (np.float32(2.0 ** -20) * (np.float32(1) + k * np.float32(2.0 ** -18))).astype(np.float32)
        x[:, 0] = 1.0
    elif kind == "zeros":
        x = rng.random((b, v)).astype(np.float32)
        x[:, rng.random(v) < 0.7] = 0
        x[:, v // 2] = 0.5
    else:
        x = rng.random((b, v)).astype(np.float32)
    return x


def _logits(rng, b, v, kind):
    if kind in ("equal", "equal_zeros"):
        x = np.zeros((b, v), dtype=np.float32)
        if kind == "equal_zeros":
            x[:, rng.random(v) < 0.4] = -np.inf
            x[:, 0] = 0.0
    elif kind == "two":
        x = np.where(rng.random((b, v)) < 0.5, 0.0, 1.0).astype(np.float32)
    elif kind == "huge_tiny":
        x = np.full((b, v), -20.0, dtype=np.float32)
        x[:, rng.integers(0, v)] = 10.0
    elif kind == "near":
        k = rng.integers(0, 4, size=(b, v)).astype(np.float32)
        x = (np.float32(-14.0) + k * np.float32(2.0 ** -16)).astype(np.float32)
        x[:, 0] = 0.0
    elif kind == "zeros":
        x = rng.standard_normal((b, v)).astype(np.float32)
        x[:, rng.random(v) < 0.7] = -np.inf
        x[:, v // 2] = 1.0
    else:
        x = (rng.standard_normal((b, v)) * 3).astype(np.float32)
    return x


def _eq(a, b):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("v", VS)
@pytest.mark.parametrize("b", BS)
@pytest.mark.parametrize("logits", [False, True])
def test_dense_adversarial(cuda, v, b, logits):
    rng = np.random.default_rng(v * 7 + b + logits)
    for kind in KINDS:
        x = (_logits if logits else _probs)(rng, b, v, kind)
        kw = dict(logits=True, temperature=rng.choice([0.5, 1.0, 1.7], size=b)) if logits else {}
        for policy in ("standard", "floor-first"):
            q1 = dyadic.allocate(x, policy=policy, backend=cuda, **kw)
            q2 = dyadic.allocate(x, policy=policy, backend="cpu", **kw)
            _eq(q1.counts, q2.counts)


@pytest.mark.parametrize("v", [200, 256, 257, 300, 1000, 2048, 2049, 3000])
def test_dense_equal_bin_sizes(cuda, v):
    """Every remainder equal: boundary bin of v elements (rank / two-step / fallback)."""
    rng = np.random.default_rng(v)
    for kind in ("equal", "equal_zeros", "two", "near"):
        x = _probs(rng, 3, v, kind)
        _eq(dyadic.allocate(x, backend=cuda).counts, dyadic.allocate(x, backend="cpu").counts)
        z = _logits(rng, 3, v, kind)
        _eq(dyadic.allocate(z, logits=True, backend=cuda).counts,
            dyadic.allocate(z, logits=True, backend="cpu").counts)


@pytest.mark.parametrize("v", [111, 4097, 129280])
def test_dense_propose_adversarial(cuda, v):
    rng = np.random.default_rng(v + 1)
    b = 3
    for kind in KINDS:
        x = _logits(rng, b, v, kind)
        temp = np.array([0.0, 0.7, 1.0])
        keys = dyadic.Keys(seed=rng.integers(0, 2**63, size=b), generation=2, round=1,
                           position=rng.integers(0, 2**31, size=b))
        t1, q1 = dyadic.propose(x, keys, temperature=temp, backend=cuda)
        t2, q2 = dyadic.propose(x, keys, temperature=temp, backend="cpu")
        _eq(t1, t2)
        _eq(q1.counts, q2.counts)


def test_dense_device_graph_replay(cuda):
    """check=False + out= on device arrays, captured in a CUDA graph: the per-row state
    is reset inside the launch sequence (fallback, error and greedy rows included)."""
    torch = _torch_cuda()
    from dyadic import _status
    rng = np.random.default_rng(11)
    b, v = 8, 129280
    x = torch.zeros(b, v, dtype=torch.float32, device="cuda")
    cnt = torch.empty(b, v, dtype=torch.uint32, device="cuda")
    st = torch.empty(b, dtype=torch.int32, device="cuda")
    out = {"counts": cnt, "status": st}

    def step():
        dyadic.allocate(x, backend=cuda, check=False, out=out)

    def fill(i):
        rows = []
        for r in range(b):
            kind = KINDS[(r + i) % len(KINDS)]
            rows.append(_probs(rng, 1, v, kind)[0])
        h = np.stack(rows)
        if i % 2:
            h[1, 17] = np.nan
        x.copy_(torch.from_numpy(h))
        return h

    fill(0)
    replay = capture_graph(step)
    for i in range(4):
        h = fill(i)
        replay()
        torch.cuda.synchronize()
        got = cnt.cpu().numpy()
        sts = st.cpu().numpy()
        for r in range(b):
            if i % 2 and r == 1:
                assert sts[r] == _status.X_NAN
                assert not got[r].any()
                continue
            assert sts[r] == 0
            _eq(got[r], dyadic.allocate(h[r:r + 1], backend="cpu").counts[0])
