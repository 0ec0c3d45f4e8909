"""topk_onepass_packed8k / 16k / 32k (kernels/topk_onepass_packed.cuh: packed 16-bit
keys) == the CPU backend, bit for bit.

The cuda backend takes a packed kernel in topk_onepass_wide's place for bfloat16 /
float16 logits without bias on 16-byte loads: the smallest tile (8192 / 16384 / 32768
ids) whose grid fits one wave of two blocks per SM, so at V = 129280 batches of 1-16,
17-33 and 34-66 rows take the three tiles (tests/gpu/test_cuda_routes.py).  These
cases aim at the kernels' branches: the packed order keys (-0.0 / +0.0, subnormals,
huge values, every sign), the all-ones-exponent flag (NaN, +inf fail closed with the
first bad id; -inf masses do not), the tile's ranking of its survivors (ties spread over
warps and tiles, threads holding several; swamped by ties: the exact radix select), the
last block's merge of the tiles' sorted runs, partial last tiles, rows whose temperature
is outside the coarse-key range (exact keys) and greedy rows.  Each case also runs on
rows one element past a 16-byte boundary, which take topk_onepass_wide's scalar loads.
Skips without a GPU.
"""

import numpy as np
import pytest

import dyadic

from test_gpu_topk_small_k import KINDS, _rows, cuda  # noqa: F401 (cuda: the fixture)

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def cb(cuda):
    """Where the cuda and cpu backends load (test_gpu_topk_small_k's fixture skips
    otherwise, with the reason)."""
    return cuda


def _outputs(x, keys, backend, **kw):
    """propose's outputs as NumPy arrays, or the ValueError's message."""
    try:
        t, q = dyadic.propose(x, keys, backend=backend, **kw)
    except ValueError as e:
        return str(e)
    as_np = (lambda a: a.cpu().numpy()) if backend == "cuda" else np.asarray
    return as_np(t), as_np(q.counts), as_np(q.ids)


def _unaligned(x16):
    """x16's values in rows that start one element past a 16-byte boundary."""
    b, v = x16.shape
    flat = torch.empty(b * v + 1, dtype=x16.dtype, device="cuda")
    xs = flat[1:].view(b, v)
    xs.copy_(x16)
    return xs


def _check(x16, keys, **kw):
    """The packed kernel (x16 as given) and topk_onepass_wide (the same values unaligned)
    give the CPU backend's outputs (or its error)."""
    want = _outputs(x16.float().cpu().numpy(), keys, "cpu", **kw)
    for x in (x16, _unaligned(x16)):
        got = _outputs(x, keys, "cuda", **kw)
        if isinstance(want, str):
            assert got == want
            continue
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("kind", KINDS + ["signs", "spread"])
@pytest.mark.parametrize("v", [8, 4104, 8200, 129280])
def test_packed_parity(cb, dtype, kind, v):
    rng = np.random.default_rng(hash((dtype, kind, v)) % 2**32)
    b = 5 if v > 10000 else 3
    if kind == "signs":  # every 16-bit pattern's neighbours: both signs, tiny and huge
        x = rng.choice(np.array([-0.0, 0.0, -1e-40, 1e-40, -2.0, 2.0, -6e4, 6e4, -1.0, 1.0],
                                dtype=np.float32), size=(b, v))
    elif kind == "spread":
        # ties above a random row, spread over tiles and warps, and threads holding 2-3
        # of them (ids 8g, 8g + 1, 8g + 2 share a thread): the tile's warp runs take
        # several rounds and merge equal keys (ties to the lowest id)
        x = _rows(rng, "random", b, v)
        for row in x:
            row[rng.integers(0, v, size=min(v, 100))] = rng.choice([9.0, 9.5, 10.0], size=min(v, 100))
            for g in rng.integers(0, v // 8, size=5):
                row[8 * g:8 * g + 2 + g % 2] = 10.0
    else:
        x = _rows(rng, kind, b, v)
    if kind == "huge" and dtype == "float16":
        x = np.clip(x, -6e4, 6e4)
    x16 = torch.from_numpy(x).to(getattr(torch, dtype)).cuda()
    for top_k in (1, 31, 32):
        keys = dyadic.Keys(seed=rng.integers(0, 2**63, size=b), generation=3, round=1,
                           position=rng.integers(0, 2**31, size=b))
        temp = 0.7 if top_k != 31 else rng.choice([0.0, 0.5, 1.0, 1e-300, 1e250], size=b)
        for policy in ("standard", "floor-first"):
            _check(x16, keys, top_k=top_k, temperature=temp, policy=policy)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("b", [1, 4, 20, 40, 64])
def test_packed_batches(cb, dtype, b):
    """At V = 129280: tiles of 8192 (B = 1, 4), 16384 (B = 20) and 32768 ids (B = 40, 64)."""
    rng = np.random.default_rng(b)
    v = 129280
    x16 = torch.from_numpy(_rows(rng, "random", b, v)).to(getattr(torch, dtype)).cuda()
    keys = dyadic.Keys(seed=rng.integers(0, 2**63, size=b), position=rng.integers(0, 2**31, size=b))
    _check(x16, keys, top_k=32, temperature=0.7)


@pytest.mark.parametrize("b", [3, 20, 40])
@pytest.mark.parametrize("kind", ["random", "fewvals", "equal", "tail_spike"])
def test_packed_tiles(cb, b, kind):
    """Each of the three tiles (by the batch, at V = 129280) on ties and a spike in the
    row's last, partial tile."""
    rng = np.random.default_rng(b)
    v = 129280
    x16 = torch.from_numpy(_rows(rng, kind, b, v)).to(torch.bfloat16).cuda()
    keys = dyadic.Keys(seed=rng.integers(0, 2**63, size=b), position=rng.integers(0, 2**31, size=b))
    _check(x16, keys, top_k=32, temperature=0.8)


def test_packed_not_taken(cb):
    """float32 logits, a bias, and a V that is not a multiple of 8 take the other one-pass
    kernels: the same results as the CPU backend."""
    rng = np.random.default_rng(5)
    b, v = 3, 4104
    x = _rows(rng, "random", b, v)
    keys = dyadic.Keys(seed=np.arange(b), position=0)
    _check(torch.from_numpy(x).cuda(), keys, top_k=32)
    bias = torch.from_numpy(rng.standard_normal(v).astype(np.float32)).cuda()
    x16 = torch.from_numpy(x).to(torch.bfloat16).cuda()
    for xd in (x16, _unaligned(x16)):
        got = _outputs(xd, keys, "cuda", top_k=32, bias=bias)
        want = _outputs(x16.float().cpu().numpy(), keys, "cpu", top_k=32, bias=bias.cpu().numpy())
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
    v2 = 4100  # not a multiple of 8
    x2 = torch.from_numpy(_rows(rng, "random", b, v2)).to(torch.bfloat16).cuda()
    _check(x2, keys, top_k=32)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_packed_bad_rows_fail_closed(cb, dtype):
    """NaN / +inf: the first bad id decides the status, the row's outputs are -1 / 0, other
    rows are unaffected; -inf masks (an all-ones exponent that is not bad) are fine."""
    rng = np.random.default_rng(11)
    b, v = 7, 8200
    x = _rows(rng, "random", b, v)
    x[1, 8100] = np.nan
    x[2, 7] = np.inf
    x[3, :] = -np.inf
    x[4, 100] = np.nan
    x[4, 50] = np.inf
    x[5, ::3] = -np.inf
    x[6, 4095] = np.inf  # a tile's last id
    x16 = torch.from_numpy(x).to(getattr(torch, dtype)).cuda()
    keys = dyadic.Keys(seed=np.arange(b), position=0)
    for xd in (x16, _unaligned(x16)):  # the packed kernel, topk_onepass_wide
        out = {"tokens": torch.empty(b, dtype=torch.int32, device="cuda"),
               "counts": torch.empty(b, 32, dtype=torch.uint32, device="cuda"),
               "ids": torch.empty(b, 32, dtype=torch.int32, device="cuda"),
               "status": torch.empty(b, dtype=torch.int32, device="cuda")}
        dyadic.propose(xd, keys, top_k=32, backend="cuda", check=False, out=out)
        assert list(out["status"].cpu().numpy()) == [0, 1, 2, 4, 2, 0, 2]
        bad = [1, 2, 3, 4, 6]
        assert (out["tokens"].cpu().numpy()[bad] == -1).all()
        assert (out["ids"].cpu().numpy()[bad] == -1).all()
        assert (out["counts"].cpu().numpy()[bad] == 0).all()
        good = [0, 5]
        t2, q2 = dyadic.propose(x16[good].float().cpu().numpy(),
                                dyadic.Keys(seed=np.array(good), position=0), top_k=32,
                                backend="cpu")
        np.testing.assert_array_equal(out["tokens"].cpu().numpy()[good], np.asarray(t2))
        np.testing.assert_array_equal(out["counts"].cpu().numpy()[good], np.asarray(q2.counts))
        np.testing.assert_array_equal(out["ids"].cpu().numpy()[good], np.asarray(q2.ids))
