"""verify with ragged drafts (``num_drafts``) on the GPU path: backend "cuda" (device
tensors and the host path) and "numba" (device tensors) == the CPU backend bit for
bit, with hostile padding, greedy requests, every check mode and invalid counts; one
captured CUDA graph replayed with counts changed in place in device memory; the
dyadic.ragged helpers on CUDA tensors.  Skips without a GPU."""

import numpy as np
import pytest

import dyadic
from dyadic import Keys, _spec, _status, ragged
from dyadic._types import trusted_dyadic
from dyadic.bench.timing import capture_graph

from conftest import _load, random_target

pytestmark = pytest.mark.gpu


def _torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    return torch


@pytest.fixture(scope="module")
def cuda():
    be, why = _load("cuda")
    if be is None:
        pytest.skip(why)
    return _torch()


def _keys(b, torch=None):
    seed = np.arange(100, 100 + b, dtype=np.uint64)
    pos = (np.arange(b) * 5 + 3).astype(np.uint32)
    if torch is None:
        return Keys(seed=seed, generation=2, round=7, position=pos)
    dev = lambda a, dt: torch.as_tensor(a.astype(dt)).cuda()  # noqa: E731
    return Keys(seed=dev(seed, np.int64), generation=dev(np.full(b, 2), np.int32),
                round=dev(np.full(b, 7), np.int32), position=dev(pos, np.int32))


def _case(rng, b, k, v, qkind, n):
    """A padded batch with hostile padding beyond each request's count."""
    p = random_target(rng, b, k + 1, v)
    counts = ids = None
    if qkind == "none":
        draft = rng.integers(0, v, (b, k)).astype(np.int32)
    else:
        q = dyadic.allocate(rng.standard_normal((b, k, v)).astype(np.float32), logits=True,
                            top_k=8 if qkind == "sparse" else None)
        counts = np.array(q.counts)
        ids = None if q.ids is None else np.array(q.ids)
        draft = (ids[:, :, 0] if ids is not None else np.argmax(counts, axis=2)).astype(np.int32)
    for r in range(b):
        m = min(max(int(n[r]), 0), k)
        p[r, m + 1:] = np.nan
        draft[r, m:] = np.where(np.arange(m, k) % 2, v + 9, -5)
        if counts is not None:
            counts[r, m:] = _spec.TOTAL + 3
        if ids is not None:
            ids[r, m:] = v + 1
    return p, draft, counts, ids


def _q(counts, ids, v, torch=None):
    if counts is None:
        return None
    if torch is not None:
        counts = torch.as_tensor(counts).cuda()
        ids = None if ids is None else torch.as_tensor(ids).cuda()
    return trusted_dyadic(counts, ids, v, "standard", readonly=False)


def _eq(got, want):
    np.testing.assert_array_equal(got.cpu().numpy() if hasattr(got, "cpu") else got, want)


CASES = [(4, 5, 129280), (37, 3, 4099), (3, 7, 1000)]


@pytest.mark.parametrize("b, k, v", CASES)
@pytest.mark.parametrize("qkind", ["sparse", "dense", "none"])
@pytest.mark.parametrize("check", [True, False, "lazy"])
@pytest.mark.parametrize("greedy", [False, True])
def test_cuda_ragged_equals_cpu(cuda, b, k, v, qkind, check, greedy, rng):
    torch = cuda
    n = rng.integers(0, k + 1, b).astype(np.int32)
    n[0], n[-1] = 0, k
    p, draft, counts, ids = _case(rng, b, k, v, qkind, n)
    g = (np.arange(b) % 3 == 1) if greedy else None
    want = dyadic.verify(p, draft, _q(counts, ids, v), _keys(b), greedy=g, backend="cpu",
                         check=check, num_drafts=n)
    got = dyadic.verify(torch.as_tensor(p).cuda(), torch.as_tensor(draft).cuda(),
                        _q(counts, ids, v, torch), _keys(b, torch),
                        greedy=None if g is None else torch.as_tensor(g).cuda(),
                        backend="cuda", check=check, num_drafts=torch.as_tensor(n).cuda())
    _eq(got.tokens, want.tokens)
    _eq(got.accepted, want.accepted)
    if check is not True:
        _eq(got.status, want.status)
    host = dyadic.verify(p, draft, _q(counts, ids, v), _keys(b), greedy=g, backend="cuda",
                         check=check, num_drafts=n)  # the host path of backend "cuda"
    _eq(host.tokens, want.tokens)


@pytest.mark.parametrize("check", [False, "lazy"])
def test_cuda_invalid_counts_fail_closed(cuda, check, rng):
    torch = cuda
    b, k, v = 6, 4, 3000
    n = np.array([1, 4, -1, 0, 5, 2], dtype=np.int64)
    p, draft, counts, ids = _case(rng, b, k, v, "sparse", n)
    want = dyadic.verify(p, draft, _q(counts, ids, v), _keys(b), backend="cpu", check=False,
                         num_drafts=n)
    assert want.status.tolist() == [0, 0, _status.NUM_DRAFTS_INVALID, 0,
                                    _status.NUM_DRAFTS_INVALID, 0]
    for nd in (torch.as_tensor(n).cuda(), torch.as_tensor(n.astype(np.int32)).cuda(), n):
        got = dyadic.verify(torch.as_tensor(p).cuda(), torch.as_tensor(draft).cuda(),
                            _q(counts, ids, v, torch), _keys(b, torch), backend="cuda",
                            check=check, num_drafts=nd)
        _eq(got.status, want.status)
        _eq(got.tokens, want.tokens)
        _eq(got.accepted, want.accepted)
    with pytest.raises(ValueError, match=r"num_drafts: row 2: the number of drafts must be "
                                         rf"in \[0, k\] = \[0, {k}\]"):
        dyadic.verify(torch.as_tensor(p).cuda(), torch.as_tensor(draft).cuda(),
                      _q(counts, ids, v, torch), _keys(b, torch), backend="cuda",
                      num_drafts=torch.as_tensor(n).cuda())


def test_cuda_graph_replay_with_counts_changed_in_place(cuda, rng):
    """One graph captured with check=False, device keys, out= and device counts serves
    any mix of counts: they are written in place between replays."""
    torch = cuda
    b, k, v = 8, 5, 32000
    dev = "cuda"
    tgt = torch.zeros(b, k + 1, v, dtype=torch.float32, device=dev)
    draft = torch.zeros(b, k, dtype=torch.int32, device=dev)
    nd = torch.zeros(b, dtype=torch.int32, device=dev)
    keys = _keys(b, torch)
    out = {"accepted": torch.empty(b, dtype=torch.int32, device=dev),
           "tokens": torch.empty(b, k + 1, dtype=torch.int32, device=dev),
           "status": torch.empty(b, dtype=torch.int32, device=dev)}

    def fill(counts):
        p = random_target(rng, b, k + 1, v)
        d = rng.integers(0, v, (b, k)).astype(np.int32)
        for r in range(b):
            p[r, counts[r] + 1:] = np.nan
            d[r, counts[r]:] = -1
        tgt.copy_(torch.from_numpy(p))
        draft.copy_(torch.from_numpy(d))
        nd.copy_(torch.from_numpy(np.asarray(counts, dtype=np.int32)))
        return p, d

    def step():
        dyadic.verify(tgt, draft, None, keys, backend="cuda", check=False, out=out,
                      num_drafts=nd)

    fill(np.full(b, k))
    replay = capture_graph(step)
    for counts in ([0, 1, 2, 3, 4, 5, 0, 5], [5] * 8, [0] * 8, [3, 9, 1, -2, 0, 5, 4, 2]):
        p, d = fill(counts)
        replay()
        torch.cuda.synchronize()
        want = dyadic.verify(p, d, None, _keys(b), backend="cpu", check=False,
                             num_drafts=np.asarray(counts, dtype=np.int64))
        _eq(out["status"], want.status)
        _eq(out["tokens"], want.tokens)
        _eq(out["accepted"], want.accepted)


def test_numba_device_ragged_equals_cpu(rng):
    be, why = _load("numba")
    if be is None:
        pytest.skip(why)
    torch = _torch()
    b, k, v = 5, 3, 2000
    n = np.array([0, 3, 1, 7, 2], dtype=np.int32)
    p, draft, counts, ids = _case(rng, b, k, v, "sparse", n)
    want = dyadic.verify(p, draft, _q(counts, ids, v), _keys(b), backend="cpu", check=False,
                         num_drafts=n)
    got = dyadic.verify(torch.as_tensor(p).cuda(), torch.as_tensor(draft).cuda(),
                        _q(counts, ids, v, torch), _keys(b, torch), backend="numba",
                        check=False, num_drafts=torch.as_tensor(n).cuda())
    _eq(got.status, want.status)
    _eq(got.tokens, want.tokens)


def test_ragged_helpers_stay_on_the_device(cuda, rng):
    torch = cuda
    n = np.array([2, 0, 3, 1], dtype=np.int32)
    cu = torch.as_tensor(np.cumsum(n).astype(np.int32)).cuda()
    flat = torch.as_tensor(rng.integers(0, 100, 6).astype(np.int32)).cuda()
    padded = ragged.pad(flat, cu, 3, fill=-1, check=False)
    assert padded.is_cuda
    want = ragged.pad(flat.cpu(), cu.cpu(), 3, fill=-1)
    _eq(padded, want.numpy())
    back = ragged.unpad(padded, ragged.lengths(cu))
    assert back.is_cuda
    _eq(back, flat.cpu().numpy())
    tgt = torch.rand(6, 10, device="cuda")
    bonus = torch.rand(4, 10, device="cuda")
    t = ragged.pad_target(tgt, bonus, cu, 3, check=False)
    assert t.is_cuda and tuple(t.shape) == (4, 4, 10)
    _eq(t, ragged.pad_target(tgt.cpu(), bonus.cpu(), cu.cpu(), 3).numpy())
    q = dyadic.allocate(torch.rand(6, 10, device="cuda"), top_k=4, backend="cuda")
    pq = ragged.pad_q(q, cu, 3)
    assert pq.counts.is_cuda and pq.batch_shape == (4, 3)
