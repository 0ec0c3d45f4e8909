"""backend="cuda" runs on the caller's current torch stream (GPU; skips without one).

Each test makes a side stream current, queues a long sleep on it and then the
input's last write (a copy), then calls dyadic: a call that launched on another
stream (the default stream, or a stale one) would read the input before the copy
lands and give other counts / tokens than backend="cpu" on the final input.  The
calls must not warn (CuPy >= 14 deprecates ExternalStream; backends/cuda/cupy/runtime.py wraps a
raw handle with Stream.from_external there).
"""

import warnings

import numpy as np
import pytest

import dyadic

from conftest import cuda_torch

pytestmark = pytest.mark.gpu

V = 4097
SLEEP_CYCLES = 20_000_000  # ~10 ms at 2 GHz: far longer than the launch of the call


@pytest.fixture(scope="module")
def torch():
    return cuda_torch()


def _late_input(torch, host, stream):
    """A CUDA tensor whose values arrive on ``stream`` after a long sleep (zeros before)."""
    src = torch.from_numpy(host).cuda()
    dst = torch.zeros_like(src)
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(SLEEP_CYCLES)
        dst.copy_(src)
    src.record_stream(stream)  # src's memory is not reused before the copy has run
    return dst


def test_allocate_on_current_side_stream(torch):
    rng = np.random.default_rng(7)
    host = rng.random((3, V)).astype(np.float32)
    host[:, 5] = 0.0
    want = dyadic.allocate(host, backend="cpu")
    s = torch.cuda.Stream()
    x = _late_input(torch, host, s)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.cuda.stream(s):
            got = dyadic.allocate(x, backend="cuda", check=False)
            counts = got.counts.clone()  # on s: ordered after the kernels
    s.synchronize()
    np.testing.assert_array_equal(counts.cpu().numpy().astype(np.int64),
                                  np.asarray(want.counts, dtype=np.int64))
    assert int(counts.sum(dim=1).min()) == 1 << 24


def test_verify_on_current_side_stream(torch):
    rng = np.random.default_rng(8)
    b, k = 2, 3
    p = rng.random((b, k + 1, V)).astype(np.float32)
    p /= p.sum(axis=-1, keepdims=True)
    q = dyadic.allocate(rng.random((b, k, V)).astype(np.float32), backend="cpu")
    draft = rng.integers(0, V, size=(b, k)).astype(np.int32)
    keys = dyadic.Keys(seed=np.arange(b, dtype=np.int64), generation=np.zeros(b, np.int32),
                       round=np.zeros(b, np.int32), position=np.full(b, 11, np.int32))
    want = dyadic.verify(p, draft, q, keys, backend="cpu")
    qg = dyadic.Dyadic(torch.from_numpy(np.array(q.counts)).cuda(), None, vocab_size=V)
    kg = dyadic.Keys(seed=torch.arange(b, dtype=torch.int64, device="cuda"),
                     generation=torch.zeros(b, dtype=torch.int32, device="cuda"),
                     round=torch.zeros(b, dtype=torch.int32, device="cuda"),
                     position=torch.full((b,), 11, dtype=torch.int32, device="cuda"))
    dg = torch.from_numpy(draft).cuda()
    s = torch.cuda.Stream()
    pt = _late_input(torch, p, s)  # synchronises first: q, keys and draft are in place
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.cuda.stream(s):
            got = dyadic.verify(pt, dg, qg, kg, backend="cuda", check=False)
            acc, tok, st = got.accepted.clone(), got.tokens.clone(), got.status.clone()
    s.synchronize()
    got_all = (acc.cpu().numpy().tolist(), tok.cpu().numpy().tolist(), st.cpu().numpy().tolist())
    assert got_all == (np.asarray(want.accepted).tolist(), np.asarray(want.tokens).tolist(),
                       [0] * b)
