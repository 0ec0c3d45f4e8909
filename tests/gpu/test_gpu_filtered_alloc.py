"""allocate / propose with top_p, min_p or a per-row top_k (docs/semantics.md, "Filtered
support") on backend "cuda" with torch CUDA tensors == backend "cpu" on the same values
copied to the host, bit for bit: tokens, counts, ids and (check=False) statuses.
Float32, float16 and bfloat16 logits; top_k an int, per row (NumPy or a CUDA tensor) or
None (a dense support, V = 129280 included);
top_p / min_p as Python scalars, NumPy arrays or CUDA tensors; per-row temperature with
T = 0 rows; bias; both policies; ties at the cuts, -inf masks, rows with fewer finite
logits than top_k; bad parameters failing closed with cpu's status (check=False) or
raising cpu's error (check=True); one CUDA graph replayed with new parameters.  Skips
without a GPU."""

import numpy as np
import pytest

import dyadic
from dyadic.bench.timing import capture_graph

from conftest import cuda_torch

pytestmark = pytest.mark.gpu

DTYPES = ["float32", "float16", "bfloat16"]


@pytest.fixture(scope="module")
def cuda():
    """torch, where backend "cuda" loads and torch has a CUDA device."""
    return cuda_torch()


def _logits(rng, b, v):
    """float32 [b, v]: 3 z per row; row 1 with ties (round(z)), row 2 with all but three
    logits -inf, row 3 every logit equal (where b allows)."""
    x = (3 * rng.standard_normal((b, v))).astype(np.float32)
    if b > 1:
        x[1] = np.round(x[1])
    if b > 2:
        keep = rng.choice(v, 3, replace=False)
        mask = np.full(v, -np.inf, np.float32)
        mask[keep] = x[2, keep]
        x[2] = mask
    if b > 3:
        x[3] = 0.5
    return x


def _host(x, dtype, torch):
    """The device tensor of dtype and the exact float32 host copy of its values."""
    t = torch.from_numpy(x).to("cuda").to(getattr(torch, dtype))
    return t, t.float().cpu().numpy()


def _param(torch, a, where):
    if where == "host" or np.ndim(a) == 0:
        return a
    return torch.from_numpy(np.asarray(a)).to("cuda")


def _same(got, want, names):
    for name in names:
        g, w = got[name], want[name]
        g = g.cpu().numpy() if hasattr(g, "cpu") else np.asarray(g)
        np.testing.assert_array_equal(g, np.asarray(w), err_msg=name)


def _run(primitive, x, keys, backend, kw):
    """(outputs dict, status) of one check=False call with out= status."""
    b, v = x.shape
    tk = kw["top_k"]
    width = None
    if tk is not None:
        tk = np.asarray(tk.cpu() if hasattr(tk, "cpu") else tk)
        width = int(min(max(int(tk.max()), 1), v))
    if backend == "cuda":
        import torch
        status = torch.empty(b, dtype=torch.int32, device="cuda")
    else:
        status = np.empty(b, dtype=np.int32)
    out = {"status": status}
    if primitive == "propose":
        tok, q = dyadic.propose(x, keys, backend=backend, check=False, out=out, **kw)
        res = {"tokens": tok}
    else:
        q = dyadic.allocate(x, logits=True, backend=backend, check=False, out=out, **kw)
        res = {}
    if width is None:
        assert q.ids is None and tuple(q.counts.shape) == (b, v)
    else:
        assert q.ids is not None and q.ids.shape[-1] == width
    res.update(counts=q.counts, ids=q.ids, status=out["status"])
    return res


CASES = [
    # (top_k, top_p, min_p, temperature)
    (32, 0.9, None, 0.8),
    (5, None, 0.05, 1.3),
    (40, 0.5, 0.02, 0.7),
    (100, 0.95, 0.1, [0.7, 0.0, 1.0, 2.0, 0.0, 0.5]),
    ("rows", "rows", "rows", [1.0, 0.8, 0.0, 1.2, 0.6, 1.0]),
    (3, 1.0, 0.0, 1.0),
    # a dense support (top_k None)
    (None, 0.9, None, 0.8),
    (None, 0.5, 0.05, [0.7, 0.0, 1.0, 2.0, 0.0, 0.5]),
    (None, "rows", "rows", [1.0, 0.8, 0.0, 1.2, 0.6, 1.0]),
    (None, None, 0.2, 1.3),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("v", [50, 300, 4099])
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("where", ["host", "device"])
@pytest.mark.parametrize("primitive", ["propose", "allocate"])
def test_filtered_matches_cpu(cuda, dtype, v, case, where, primitive):
    rng = np.random.default_rng(1000 * case + v + len(dtype))
    b = 6
    x, xh = _host(_logits(rng, b, v), dtype, cuda)
    top_k, top_p, min_p, temp = CASES[case]
    if top_k == "rows":
        top_k = rng.integers(1, 70, b)
    if top_p == "rows":
        top_p = rng.uniform(0.05, 1.0, b).astype(np.float32)
        min_p = rng.uniform(0.0, 0.3, b).astype(np.float32)
    if primitive == "allocate" and np.any(np.asarray(temp) == 0):
        temp = np.where(np.asarray(temp) == 0, 0.9, temp)
    temp = temp if np.ndim(temp) == 0 else np.asarray(temp, np.float64)
    keys = dyadic.Keys(seed=rng.integers(0, 2**62, b), position=rng.integers(0, 2**30, b))
    policy = "floor-first" if case % 2 else "standard"
    host_kw = dict(top_k=top_k, top_p=top_p, min_p=min_p, temperature=temp, policy=policy)
    dev_kw = dict(host_kw, top_k=_param(cuda, top_k, where), top_p=_param(cuda, top_p, where),
                  min_p=_param(cuda, min_p, where),
                  temperature=_param(cuda, temp, where))
    want = _run(primitive, xh, keys, "cpu", host_kw)
    got = _run(primitive, x, keys, "cuda", dev_kw)
    _same(got, want, list(want))


# (rows, V, dtype, top_k): the filters on every sparse kernel family of the cuda backend
# (tests/gpu/test_cuda_routes.py): 16-bit logits on 16-byte loads at 2, 20 and 40 rows of
# a large vocabulary, float32 over many tiles, a small grid, top_k above 32
SHAPES = [(2, 129280, "bfloat16", 32), (20, 129280, "bfloat16", 16),
          (40, 129280, "float16", 8), (8, 129280, "float32", 32), (4, 8000, "float32", 32),
          (3, 20000, "bfloat16", 64)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("primitive", ["propose", "allocate"])
def test_filtered_sparse_kernels_match_cpu(cuda, shape, primitive):
    """Per-row top_k / top_p / min_p / temperature (a T = 0 row, a T below 2**-700 that
    ranks on 64-bit keys, a row of ties, a row of three finite logits) and one row with
    an invalid top_p failing closed: every output and status equals cpu's."""
    b, v, dtype, k = shape
    rng = np.random.default_rng(b * v + k)
    x, xh = _host(_logits(rng, b, v), dtype, cuda)
    top_k = rng.integers(1, k + 1, b)
    top_k[0] = k
    top_p = rng.uniform(0.2, 1.0, b).astype(np.float32)
    top_p[b - 1] = 0.0 if b > 4 else top_p[b - 1]
    min_p = np.where(rng.random(b) < 0.5, 0.0, rng.uniform(0.0, 0.2, b)).astype(np.float32)
    temp = rng.choice([0.6, 0.9, 1.0, 1.7], b)
    temp[min(1, b - 1)] = 0.0 if primitive == "propose" else 1e-300
    if b > 5:
        temp[5] = 1e-300
    keys = dyadic.Keys(seed=rng.integers(0, 2**62, b), position=rng.integers(0, 2**30, b))
    policy = "floor-first" if b % 2 else "standard"
    host_kw = dict(top_k=top_k, top_p=top_p, min_p=min_p, temperature=temp, policy=policy)
    dev_kw = dict(host_kw, **{n: _param(cuda, host_kw[n], "device")
                              for n in ("top_k", "top_p", "min_p", "temperature")})
    want = _run(primitive, xh, keys, "cpu", host_kw)
    got = _run(primitive, x, keys, "cuda", dev_kw)
    _same(got, want, list(want))
    if b > 4:
        assert np.asarray(want["status"])[b - 1] != 0


@pytest.mark.parametrize("primitive", ["propose", "allocate"])
def test_filtered_with_bias(cuda, primitive):
    rng = np.random.default_rng(7)
    b, v = 5, 700
    x, xh = _host(_logits(rng, b, v), "float32", cuda)
    for bias in (rng.standard_normal(v).astype(np.float32),
                 rng.standard_normal((b, v)).astype(np.float32)):
        keys = dyadic.Keys(seed=np.arange(b) + 3, position=7)
        kw = dict(top_k=24, top_p=0.8, min_p=0.01, temperature=0.9)
        want = _run(primitive, xh, keys, "cpu", dict(kw, bias=bias))
        got = _run(primitive, x, keys, "cuda",
                   dict(kw, bias=cuda.from_numpy(bias).to("cuda")))
        _same(got, want, list(want))


def test_bad_parameters_fail_closed_as_cpu(cuda):
    """Rows with top_k < 1, top_p outside (0, 1], min_p outside [0, 1] (also on T = 0
    rows): cpu's status and -1 / zero outputs for those rows, every other row exact."""
    rng = np.random.default_rng(3)
    b, v = 6, 400
    x, xh = _host(_logits(rng, b, v), "bfloat16", cuda)
    top_k = np.array([8, 0, 8, 8, -3, 8])
    top_p = np.array([0.9, 0.9, 0.0, 1.5, 0.9, np.nan], np.float32)
    min_p = np.array([0.0, 0.0, 0.0, 0.0, 2.0, -0.5], np.float32)
    temp = np.array([1.0, 0.0, 0.8, 0.0, 1.0, 1.0])
    keys = dyadic.Keys(seed=np.arange(b), position=11)
    host_kw = dict(top_k=top_k, top_p=top_p, min_p=min_p, temperature=temp)
    for where in ("host", "device"):
        dev_kw = dict(top_k=_param(cuda, top_k, where), top_p=_param(cuda, top_p, where),
                      min_p=_param(cuda, min_p, where), temperature=temp)
        want = _run("propose", xh, keys, "cpu", host_kw)
        got = _run("propose", x, keys, "cuda", dev_kw)
        _same(got, want, list(want))
        assert (np.asarray(want["status"])[1:] != 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_dense_bad_parameters_fail_closed_as_cpu(cuda, dtype):
    """A dense support (top_k None): rows with top_p outside (0, 1] or min_p outside
    [0, 1] (also on T = 0 rows) get cpu's status, zero counts and token -1; every other
    row exact."""
    rng = np.random.default_rng(13)
    b, v = 7, 1000
    x, xh = _host(_logits(rng, b, v), dtype, cuda)
    top_p = np.array([0.9, 0.9, 0.0, 1.5, 0.9, np.nan, 0.7], np.float32)
    min_p = np.array([0.0, 0.0, 0.0, 0.0, 2.0, -0.5, 0.1], np.float32)
    temp = np.array([1.0, 0.0, 0.8, 0.0, 1.0, 1.0, 0.0])
    keys = dyadic.Keys(seed=np.arange(b), position=17)
    host_kw = dict(top_k=None, top_p=top_p, min_p=min_p, temperature=temp)
    for where in ("host", "device"):
        dev_kw = dict(host_kw, top_p=_param(cuda, top_p, where),
                      min_p=_param(cuda, min_p, where), temperature=_param(cuda, temp, where))
        want = _run("propose", xh, keys, "cpu", host_kw)
        got = _run("propose", x, keys, "cuda", dev_kw)
        _same(got, want, list(want))
        assert (np.asarray(want["status"])[2:6] != 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("primitive", ["propose", "allocate"])
def test_dense_large_vocabulary_matches_cpu(cuda, dtype, primitive):
    """A dense support over V = 129280 at B = 5: per-row top_p / min_p / temperature
    (a T = 0 row for propose), a row of ties and a row of three finite logits."""
    rng = np.random.default_rng(21 + len(dtype))
    b, v = 5, 129280
    x, xh = _host(_logits(rng, b, v), dtype, cuda)
    top_p = np.array([0.9, 0.5, 0.99, 0.3, 1.0], np.float32)
    min_p = np.array([0.0, 0.01, 0.0, 0.2, 0.05], np.float32)
    temp = np.array([0.8, 1.0, 1.3, 0.6, 0.0 if primitive == "propose" else 2.0])
    keys = dyadic.Keys(seed=rng.integers(0, 2**62, b), position=rng.integers(0, 2**30, b))
    host_kw = dict(top_k=None, top_p=top_p, min_p=min_p, temperature=temp)
    dev_kw = dict(host_kw, **{n: _param(cuda, host_kw[n], "device")
                              for n in ("top_p", "min_p", "temperature")})
    want = _run(primitive, xh, keys, "cpu", host_kw)
    got = _run(primitive, x, keys, "cuda", dev_kw)
    _same(got, want, list(want))


def test_check_true_raises_cpu_error(cuda):
    rng = np.random.default_rng(4)
    b, v = 3, 100
    x, xh = _host(_logits(rng, b, v), "float32", cuda)
    keys = dyadic.Keys(seed=np.arange(b))
    for kw in (dict(top_k=np.array([4, 0, 4])), dict(top_k=4, top_p=np.array([0.5, 1.5, 0.5])),
               dict(top_k=4, min_p=-0.1), dict(top_k=4, top_p=0.0)):
        with pytest.raises(ValueError) as want:
            dyadic.propose(xh, keys, backend="cpu", **kw)
        with pytest.raises(ValueError) as got:
            dyadic.propose(x, keys, backend="cuda", **kw)
        assert str(got.value) == str(want.value)


def test_filters_on_weights_refused_as_cpu(cuda):
    """allocate(logits=False) with top_p: the cpu path's ValueError, on GPU arrays too."""
    x = np.full((2, 16), 1 / 16, np.float32)
    with pytest.raises(ValueError) as want:
        dyadic.allocate(x, logits=False, top_k=4, top_p=0.9, backend="cpu")
    with pytest.raises(ValueError) as got:
        dyadic.allocate(cuda.from_numpy(x).to("cuda"), logits=False, top_k=4, top_p=0.9,
                        backend="cuda")
    assert str(got.value) == str(want.value) == (
        "top_p/min_p/per-row top_k: apply only to logits (logits=True)")


def test_check_true_results_equal_cpu(cuda):
    rng = np.random.default_rng(5)
    b, v = 4, 900
    x, xh = _host(_logits(rng, b, v), "float16", cuda)
    keys = dyadic.Keys(seed=np.arange(b) + 100, position=3)
    kw = dict(top_k=np.array([10, 20, 30, 40]), top_p=0.7, min_p=0.03, temperature=0.6)
    tw, qw = dyadic.propose(xh, keys, backend="cpu", **kw)
    tg, qg = dyadic.propose(x, keys, backend="cuda", **kw)
    np.testing.assert_array_equal(tg.cpu().numpy(), tw)
    np.testing.assert_array_equal(qg.counts.cpu().numpy(), qw.counts)
    np.testing.assert_array_equal(qg.ids.cpu().numpy(), qw.ids)


@pytest.mark.parametrize("k", [16, None])
def test_graph_replay_with_new_parameters(cuda, k):
    """check=False, device keys, device top_p / min_p / temperature and out=: one captured
    graph replayed after the parameters and logits are rewritten in place (a sparse and
    a dense support)."""
    torch = cuda
    rng = np.random.default_rng(9)
    b, v = 4, 3000
    x = torch.from_numpy(_logits(rng, b, v)).to("cuda").to(torch.bfloat16)
    tp = torch.full((b,), 0.9, dtype=torch.float32, device="cuda")
    mp = torch.full((b,), 0.01, dtype=torch.float32, device="cuda")
    temp = torch.full((b,), 0.8, dtype=torch.float64, device="cuda")
    pos = torch.full((b,), 5, device="cuda", dtype=torch.int32)
    keys = dyadic.Keys(seed=torch.arange(b, device="cuda", dtype=torch.int64),
                       generation=torch.zeros(b, device="cuda", dtype=torch.int32),
                       round=torch.zeros(b, device="cuda", dtype=torch.int32), position=pos)
    out = {"tokens": torch.empty(b, dtype=torch.int32, device="cuda"),
           "counts": torch.empty(b, k or v, dtype=torch.uint32, device="cuda"),
           "ids": torch.empty(b, k, dtype=torch.int32, device="cuda") if k else None,
           "status": torch.empty(b, dtype=torch.int32, device="cuda")}
    out = {n: t for n, t in out.items() if t is not None}

    def step():
        dyadic.propose(x, keys, top_k=k, top_p=tp, min_p=mp, temperature=temp,
                       backend="cuda", check=False, out=out)

    replay = capture_graph(step)
    for it in range(3):
        x.copy_(torch.from_numpy(_logits(np.random.default_rng(it), b, v)).to(torch.bfloat16))
        tp.copy_(torch.tensor([0.3, 0.6, 0.9, 1.0]))
        mp.copy_(torch.tensor([0.0, 0.05, 0.2, 0.001]) * it)
        pos.fill_(10 + it)
        replay()
        torch.cuda.synchronize()
        got = {n: t.clone() for n, t in out.items()}
        host = dyadic.Keys(seed=np.arange(b), position=10 + it)
        want = _run("propose", x.float().cpu().numpy(), host, "cpu",
                    dict(top_k=k, top_p=tp.cpu().numpy(), min_p=mp.cpu().numpy(),
                         temperature=0.8))
        _same(dict(got, ids=got.get("ids")), want, list(want))


def test_width_above_the_filter_limit_refused(cuda):
    from dyadic._backend import BackendUnavailable
    from dyadic.backends.cuda.cupy import routes
    v = routes.FILTER_MAX_K + 100
    x = cuda.zeros(2, v, device="cuda")
    with pytest.raises(BackendUnavailable, match="widths up to"):
        dyadic.propose(x, dyadic.Keys(seed=1), top_k=routes.FILTER_MAX_K + 1, top_p=0.9,
                       backend="cuda")
    # at the limit it runs, as the cpu backend
    rng = np.random.default_rng(2)
    x, xh = _host(_logits(rng, 2, v), "float32", cuda)
    kw = dict(top_k=routes.FILTER_MAX_K, top_p=0.5, temperature=2.0)
    keys = dyadic.Keys(seed=np.arange(2))
    _same(_run("propose", x, keys, "cuda", kw), _run("propose", xh, keys, "cpu", kw),
          ["tokens", "counts", "ids", "status"])
