"""pk_topk4 (propose_packed.cuh: packed 16-bit keys) == the CPU backend, bit for bit.

The cuda backend takes pk_topk4 in pk_topk3's place for bfloat16 / float16
logits without bias on 16-byte loads.  These cases aim at its branches: the
packed order keys (-0.0 / +0.0, subnormals, huge values, every sign), the
all-ones-exponent flag (NaN, +inf fail closed with the first bad id; -inf
masses do not), the tile's ranking of its survivors (ties spread over warps
and tiles, threads holding several; swamped by ties: the exact radix select),
the last block's merge of the tiles' sorted runs, partial last tiles, rows whose temperature is outside the
coarse-key range (exact keys) and greedy rows.  Each case runs with the
automatic choice, pk_topk4, pk_topk4w, pk_topk4x (tiles of 8192 / 16384 / 32768
ids) and pk_topk3, and checks which was launched.
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
    """cupy_backend, where the cuda and cpu backends load (test_gpu_topk_small_k's fixture
    skips otherwise, with the reason)."""
    from dyadic.backends.cuda import cupy_backend
    return cupy_backend


class _Count:
    """A kernel stand-in that counts its launches and forwards them."""

    def __init__(self, fn):
        self.fn, self.n = fn, 0

    def launch(self, *a):
        self.n += 1
        return self.fn.launch(*a)


def _run(cb, monkeypatch, x16, keys, pk4, **kw):
    """propose on the GPU with pk_topk3's route forced and DYADIC_CUDA_PK4's choice pk4
    (-1 auto, 0 pk_topk3, 1 pk_topk4, 2 pk_topk4w, 3 pk_topk4x); returns the outputs as NumPy arrays (or the
    ValueError's message) and how many times a pk_topk4 kernel was launched."""
    monkeypatch.setattr(cb, "_PK_MODE", "3")
    monkeypatch.setattr(cb, "_PK4", pk4)
    monkeypatch.setattr(cb, "_PLANS", {})
    try:
        dyadic.propose(x16, keys, backend="cuda", **kw)  # makes the plan
    except ValueError as e:
        return str(e), None
    counts = []
    for key, plan in list(cb._PLANS.items()):
        if key[0] == "pk3":
            packed = tuple(p[:2] + (_Count(p[2]),) + p[3:] for p in plan[-1])
            counts += [p[2] for p in packed]
            cb._PLANS[key] = plan[:-1] + (packed,)
    t, q = dyadic.propose(x16, keys, backend="cuda", **kw)
    return (t.cpu().numpy(), q.counts.cpu().numpy(), q.ids.cpu().numpy()), sum(c.n for c in counts)


def _cpu(x16, keys, **kw):
    try:
        t, q = dyadic.propose(x16.float().cpu().numpy(), keys, backend="cpu", **kw)
    except ValueError as e:
        return str(e)
    return np.asarray(t), np.asarray(q.counts), np.asarray(q.ids)


def _check(cb, monkeypatch, x16, keys, expect_pk4=True, **kw):
    """Every DYADIC_CUDA_PK4 choice gives the CPU backend's outputs (or its error)."""
    want = _cpu(x16, keys, **kw)
    for pk4 in (-1, 1, 2, 3, 0):
        got, n4 = _run(cb, monkeypatch, x16, keys, pk4, **kw)
        if isinstance(want, str):
            assert got == want
            continue
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
        assert (n4 > 0) == (pk4 != 0 and expect_pk4)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("kind", KINDS + ["signs", "spread"])
@pytest.mark.parametrize("v", [8, 4104, 8200, 129280])
def test_packed_parity(cb, monkeypatch, dtype, kind, v):
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
            _check(cb, monkeypatch, x16, keys, top_k=top_k, temperature=temp, policy=policy)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("b", [1, 4, 64])
def test_packed_batches(cb, monkeypatch, dtype, b):
    rng = np.random.default_rng(b)
    v = 129280
    x16 = torch.from_numpy(_rows(rng, "random", b, v)).to(getattr(torch, dtype)).cuda()
    keys = dyadic.Keys(seed=rng.integers(0, 2**63, size=b), position=rng.integers(0, 2**31, size=b))
    _check(cb, monkeypatch, x16, keys, top_k=32, temperature=0.7)


@pytest.mark.parametrize("chunk", [4096, 6000, 8192])
def test_packed_tiles(cb, monkeypatch, chunk):
    """Tile lengths other than 8192 (6000: not a power of two) and a spike in the row's
    last, partial tile."""
    monkeypatch.setattr(cb, "_PK3_CHUNK", chunk)
    rng = np.random.default_rng(chunk)
    b, v = 3, 129280
    for kind in ("random", "fewvals", "tail_spike"):
        x16 = torch.from_numpy(_rows(rng, kind, b, v)).to(torch.bfloat16).cuda()
        keys = dyadic.Keys(seed=rng.integers(0, 2**63, size=b), position=rng.integers(0, 2**31, size=b))
        _check(cb, monkeypatch, x16, keys, top_k=32, temperature=0.8)


def test_packed_not_taken(cb, monkeypatch):
    """float32 logits, bias, and rows that are not 16-byte aligned stay on pk_topk3."""
    rng = np.random.default_rng(5)
    b, v = 3, 4104
    x = _rows(rng, "random", b, v)
    keys = dyadic.Keys(seed=np.arange(b), position=0)
    _check(cb, monkeypatch, torch.from_numpy(x).cuda(), keys, expect_pk4=False, top_k=32)
    flat = torch.empty(b * v + 1, dtype=torch.bfloat16, device="cuda")
    xs = flat[1:].view(b, v)
    xs.copy_(torch.from_numpy(x).to(torch.bfloat16))
    _check(cb, monkeypatch, xs, keys, expect_pk4=False, top_k=32)
    v2 = 4100  # not a multiple of 8
    x2 = torch.from_numpy(_rows(rng, "random", b, v2)).to(torch.bfloat16).cuda()
    _check(cb, monkeypatch, x2, keys, expect_pk4=False, top_k=32)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_packed_bad_rows_fail_closed(cb, monkeypatch, dtype):
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
    monkeypatch.setattr(cb, "_PK_MODE", "3")
    for pk4 in (-1, 1, 2, 3, 0):
        monkeypatch.setattr(cb, "_PK4", pk4)
        monkeypatch.setattr(cb, "_PLANS", {})
        out = {"tokens": torch.empty(b, dtype=torch.int32, device="cuda"),
               "counts": torch.empty(b, 32, dtype=torch.uint32, device="cuda"),
               "ids": torch.empty(b, 32, dtype=torch.int32, device="cuda"),
               "status": torch.empty(b, dtype=torch.int32, device="cuda")}
        dyadic.propose(x16, keys, top_k=32, backend="cuda", check=False, out=out)
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


@pytest.mark.parametrize("b", [1, 4, 16, 32, 64])
def test_packed_route(cb, monkeypatch, b):
    """DYADIC_CUDA_PK="auto" sends 16-bit logits without bias to the wide kernels at every
    batch (float32 at B = 1 stays on pk_topk2), and the automatic packed choice is the
    smallest tile whose grid fits two blocks per SM, else the largest."""
    monkeypatch.setattr(cb, "_PK_MODE", "auto")
    monkeypatch.setattr(cb, "_PK4", -1)
    v = 129280
    assert cb._pk_route(32, True, b, v, True) is True
    assert cb._pk_route(32, True, 1, v, False) is False
    monkeypatch.setattr(cb, "_PLANS", {})
    x16 = torch.zeros(b, v, dtype=torch.bfloat16, device="cuda")
    dyadic.propose(x16, dyadic.Keys(seed=np.arange(b), position=0), top_k=32, backend="cuda")
    (plan,) = [p for k, p in cb._PLANS.items() if k[0] == "pk3"]
    auto, *choices = plan[-1]
    fits = [c for c in choices if int(c[0]) * b <= 2 * cb._num_sms()]
    assert auto is (fits[0] if fits else choices[-1])
    assert [int(c[1]) for c in choices] == [8192, 16384, 32768]
