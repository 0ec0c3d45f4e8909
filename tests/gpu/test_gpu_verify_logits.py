"""verify(logits=True) on backend "cuda" with torch CUDA tensors == backend "cpu" on the
same values copied to the host, bit for bit: accepted counts, tokens and (check=False /
"lazy") statuses.  Float32, float16 and bfloat16 logits; per-request temperature (0:
greedy), top_k, top_p and min_p as Python scalars, NumPy arrays or device tensors;
dense, top-32 and point-mass q (made on the host and moved, or made on the device);
ties by the thousand at the top-k / top-p boundary, -inf masks, ragged draft counts with
hostile padding; bad requests failing closed with cpu's status (check=False) or raising
cpu's error (check=True); one CUDA graph replayed with every input rewritten in place.
Skips without a GPU."""

import numpy as np
import pytest

import dyadic
from dyadic import _spec, _status
from dyadic._types import trusted_dyadic
from dyadic.bench.timing import capture_graph

from conftest import cuda_torch

pytestmark = pytest.mark.gpu

DEV, BACKEND = "cuda", "cuda"  # the device the inputs live on, the backend under test
V_REAL = 129280
DTYPES = ["float32", "float16", "bfloat16"]
RECIPES = ("greedy", "plain", "top_k", "top_k_above_v", "top_p", "top_p_one", "min_p",
           "min_p_one", "all")


@pytest.fixture(scope="module")
def cuda():
    """torch, where backend "cuda" loads and torch has a CUDA device."""
    return cuda_torch()


# ------------------------------------------------------------------------- inputs
def _keys(rng, n):
    """Host keys over n rows, in the ranges device key tensors (int64 / int32) hold."""
    return dyadic.Keys(seed=rng.integers(0, 2**63, n, dtype=np.uint64),
                       generation=rng.integers(0, 2**31, n).astype(np.uint32),
                       round=rng.integers(0, 2**31, n).astype(np.uint32),
                       position=rng.integers(0, 2**30, n).astype(np.uint32))


def _device_keys(torch, keys):
    def dev(a, dt):
        return torch.from_numpy(np.ascontiguousarray(a).astype(dt)).to(DEV)
    return dyadic.Keys(seed=dev(keys.seed, np.int64), generation=dev(keys.generation, np.int32),
                       round=dev(keys.round, np.int32), position=dev(keys.position, np.int32))


def _logits(rng, b, k1, v):
    """float32 logits [b, k1, v]: 3 z per request (z ~ N(0, 1)); some requests with ties
    (round(z)), 90% -inf masks, or every logit equal."""
    x = rng.standard_normal((b, k1, v)) * 3
    for r in range(b):
        kind = rng.integers(0, 6)
        if kind == 1:
            x[r] = np.round(x[r] / 3)
        elif kind == 2:
            x[r][rng.random((k1, v)) < 0.9] = -np.inf
            x[r, np.arange(k1), rng.integers(0, v, k1)] = 0.5
        elif kind == 3:
            x[r] = 0.0
    return x.astype(np.float32)


def _q_draft(rng, x, k, qkind):
    """(host q, draft int32 [b, k]).  dense / sparse: q = allocate(x + 0.5 noise) (top-32
    when sparse) and drafts drawn from it; point (or k = 0): q None, each draft the row's
    argmax or a random id."""
    b, _, v = x.shape
    if qkind == "point" or k == 0:
        am = np.argmax(x[:, :k], axis=2)
        return None, np.where(rng.random((b, k)) < 0.5, am,
                              rng.integers(0, v, (b, k))).astype(np.int32)
    zq = (x[:, :k] + 0.5 * rng.standard_normal((b, k, v))).astype(np.float32)
    q = dyadic.allocate(zq, logits=True, top_k=32 if qkind == "sparse" else None,
                        backend="cpu")
    return q, np.asarray(dyadic.draw(q, _keys(rng, b * k), backend="cpu")).astype(np.int32)


def _device_q(torch, q):
    if q is None:
        return None
    ids = None if q.ids is None else torch.from_numpy(np.array(q.ids)).to(DEV)
    return trusted_dyadic(torch.from_numpy(np.array(q.counts)).to(DEV), ids, q.vocab_size,
                          "standard", readonly=False)


def _recipe(rng, name, v):
    """(temperature, top_k, top_p, min_p) of one request (top_k 0, top_p 1, min_p 0: off)."""
    t = float(rng.choice([0.3, 0.7, 1.0, 1.6]))
    tk, tp, mp = 0, 1.0, 0.0
    if name == "greedy":  # temperature 0: the filters are checked, not applied
        t, tk = 0.0, int(rng.choice([0, 3]))
        tp, mp = float(rng.choice([1.0, 0.5])), float(rng.choice([0.0, 0.2]))
    elif name == "top_k":
        tk = int(rng.choice([1, 2, 7, 40]))
    elif name == "top_k_above_v":
        tk = v + int(rng.integers(1, 1000))
    elif name == "top_p":
        tp = float(rng.choice([0.95, 0.6, 0.05, 1e-3]))
    elif name == "min_p":
        mp = float(rng.choice([0.01, 0.1, 0.5]))
    elif name == "min_p_one":
        mp = 1.0
    elif name == "all":
        tk, tp = int(rng.choice([3, 20, 300])), float(rng.choice([0.95, 0.7]))
        mp = float(rng.choice([0.01, 0.05]))
    return t, tk, tp, mp  # "plain", "top_p_one": the filters off


def _params(rng, b, v, kind):
    """The sampling parameters of b requests: kind "scalar" (one recipe for every request,
    as Python scalars; a filter that is off is left out, top_p=1 / min_p=1 given), else
    NumPy arrays [B] of mixed recipes (temperature float64, top_k int64, top_p / min_p
    float32: the dtypes of device parameter tensors)."""
    if kind == "scalar":
        name = RECIPES[rng.integers(len(RECIPES))]
        t, tk, tp, mp = _recipe(rng, name, v)
        p = {"temperature": t}
        if tk:
            p["top_k"] = tk
        if tp != 1.0 or name == "top_p_one":
            p["top_p"] = tp
        if mp:
            p["min_p"] = mp
        return p
    rows = [_recipe(rng, RECIPES[i], v) for i in rng.integers(0, len(RECIPES), b)]
    t, tk, tp, mp = (np.array(c) for c in zip(*rows))
    return {"temperature": t.astype(np.float64), "top_k": tk.astype(np.int64),
            "top_p": tp.astype(np.float32), "min_p": mp.astype(np.float32)}


def _full_params(b, **values):
    """Parameter arrays [B] (temperature float64, top_k int64, top_p / min_p float32)
    with each given value in every request."""
    dt = {"temperature": np.float64, "top_k": np.int64, "top_p": np.float32,
          "min_p": np.float32}
    return {n: np.full(b, val, dtype=dt[n]) for n, val in values.items()}


# -------------------------------------------------------------------------- calls
def _calls(torch, x, dtype, draft, q, keys, params, check, on_device=(), greedy=None,
           num_drafts=None, out=None, device_q=None):
    """(run on backend "cuda", run on backend "cpu"): zero-argument verify calls on the
    logits x (float32 NumPy) in ``dtype`` on the device, and on their copy to the host.
    ``on_device`` names the optional inputs given to the cuda call as device tensors
    ("params", "keys", "greedy", "num_drafts"; else as the cpu call gets them); q (host)
    is moved to the device unless ``device_q`` (its device counterpart) is given."""
    target = torch.from_numpy(x).to(getattr(torch, dtype)).to(DEV)
    host = target.cpu()
    dev = {"target": target, "draft": torch.from_numpy(draft).to(DEV),
           "q": _device_q(torch, q) if device_q is None else device_q,
           "keys": _device_keys(torch, keys) if "keys" in on_device else keys,
           "params": dict(params), "greedy": greedy, "num_drafts": num_drafts}
    if "params" in on_device:
        dev["params"] = {n: torch.from_numpy(a).to(DEV) if isinstance(a, np.ndarray) else a
                         for n, a in params.items()}
    if greedy is not None and "greedy" in on_device:
        dev["greedy"] = torch.from_numpy(greedy).to(DEV)
    if num_drafts is not None and "num_drafts" in on_device:
        dev["num_drafts"] = torch.from_numpy(np.asarray(num_drafts, np.int32)).to(DEV)

    def run_cuda():
        return dyadic.verify(dev["target"], dev["draft"], dev["q"], dev["keys"], logits=True,
                             backend=BACKEND, check=check, greedy=dev["greedy"],
                             num_drafts=dev["num_drafts"], out=out, **dev["params"])

    def run_cpu():
        return dyadic.verify(host, draft, q, keys, logits=True, backend="cpu", check=check,
                             greedy=greedy, num_drafts=num_drafts, **params)
    return run_cuda, run_cpu


def _np(a):
    return a.cpu().numpy() if hasattr(a, "cpu") else np.asarray(a)


def _same(got, want, check):
    np.testing.assert_array_equal(_np(got.accepted), _np(want.accepted))
    np.testing.assert_array_equal(_np(got.tokens), _np(want.tokens))
    if check is True:
        assert got.status is None and want.status is None
    else:
        np.testing.assert_array_equal(_np(got.status), _np(want.status))


def _both(torch, x, dtype, draft, q, keys, params, check, **kw):
    """(cuda verdict, cpu verdict) of the ``_calls``, asserted equal."""
    run_cuda, run_cpu = _calls(torch, x, dtype, draft, q, keys, params, check, **kw)
    want = run_cpu()
    got = run_cuda()
    _same(got, want, check)
    return got, want


def _raises_like_cpu(run_cuda, run_cpu):
    """Both calls raise: the cpu call a ValueError, the cuda call the same type and
    message."""
    with pytest.raises(ValueError) as want:
        run_cpu()
    with pytest.raises(want.type) as got:
        run_cuda()
    assert type(got.value) is want.type
    assert str(got.value) == str(want.value)


# -------------------------------------------------------------------------- tests
@pytest.mark.parametrize("qkind", ["dense", "sparse", "point"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_random_small_vocabularies(cuda, dtype, qkind):
    """Random B in {1, 3, 8}, k in {0, 1, 3, 5}, V in [50, 1000], per-request mixed
    parameters (greedy requests among them), every check mode and parameter kind."""
    torch = cuda
    rng = np.random.default_rng(100 * DTYPES.index(dtype) + len(qkind))
    accepted = 0
    for i in range(9):
        b, k = int(rng.choice([1, 3, 8])), int(rng.choice([0, 1, 3, 5]))
        v = int(rng.integers(50, 1001))
        x = _logits(rng, b, k + 1, v)
        q, draft = _q_draft(rng, x, k, qkind)
        check = (False, "lazy", True)[i % 3]
        kind = ("array", "scalar", "device")[i // 3]
        params = _params(rng, b, v, kind)
        on_device = {"params", "greedy", "num_drafts"} if kind == "device" else set()
        if i % 2:
            on_device.add("keys")
        # greedy flags with (array, lazy), (scalar, check=True), (device, check=False)
        greedy = rng.random(b) < 0.3 if i in (1, 5, 6) else None
        got, want = _both(torch, x, dtype, draft, q, _keys(rng, b), params, check,
                          on_device=on_device, greedy=greedy)
        if check is not True:
            assert not _np(want.status).any()  # valid inputs
        assert got.tokens.device.type == DEV and tuple(got.tokens.shape) == (b, k + 1)
        accepted += int(_np(want.accepted).sum())
    assert accepted > 0


@pytest.mark.parametrize("params", [dict(temperature=0.8, top_p=0.9),
                                    dict(temperature=0.8, top_k=50)], ids=["top_p", "top_k"])
@pytest.mark.parametrize("qkind", ["dense", "sparse"])
def test_real_vocabulary_bf16(cuda, params, qkind):
    """The benchmark workload: B=4, k=5, V=129280, bf16 logits 3 z; q from 3 z + 0.5 noise
    (dense: allocated on the host and moved; top-32: allocated on the device), drafts drawn
    from q.  Parameters as device tensors (check=False, out= given), NumPy arrays
    ("lazy") and Python scalars (check=True)."""
    torch = cuda
    b, k, v = 4, 5, V_REAL
    rng = np.random.default_rng(7 + len(qkind))
    z = rng.standard_normal((b, k + 1, v)).astype(np.float32)
    zq = (3 * z[:, :k] + 0.5 * rng.standard_normal((b, k, v))).astype(np.float32)
    qd = None
    if qkind == "sparse":
        qd = dyadic.allocate(torch.from_numpy(zq).to(DEV), logits=True, top_k=32,
                             backend=BACKEND)
        q = dyadic.Dyadic(qd.counts.cpu().numpy(), qd.ids.cpu().numpy(), vocab_size=v)
    else:
        q = dyadic.allocate(zq, logits=True, backend="cpu")
    draft = np.asarray(dyadic.draw(q, _keys(rng, b * k), backend="cpu")).astype(np.int32)
    keys = _keys(rng, b)
    arrays = _full_params(b, **params)
    out = {"accepted": torch.empty(b, dtype=torch.int32, device=DEV),
           "tokens": torch.empty(b, k + 1, dtype=torch.int32, device=DEV),
           "status": torch.empty(b, dtype=torch.int32, device=DEV)}
    for check, p, on_device, o in ((False, arrays, {"params", "keys"}, out),
                                   ("lazy", arrays, set(), None), (True, params, set(), None)):
        got, want = _both(torch, 3 * z, "bfloat16", draft, q, keys, p, check,
                          on_device=on_device, out=o, device_q=qd)
        for name in ("accepted", "tokens"):
            t = getattr(got, name)
            assert t.device.type == DEV and t.dtype == torch.int32
        if o is not None:
            assert got.tokens.data_ptr() == out["tokens"].data_ptr()
            assert got.status.data_ptr() == out["status"].data_ptr()
        assert int(_np(want.accepted).sum()) > 0


@pytest.mark.parametrize("v", [3000, V_REAL])
def test_bf16_logits_spanning_many_binades(cuda, v):
    """bfloat16 rows whose magnitudes span 2**-24 .. 2**6 (every binade holds tokens),
    rows of negative logits only (log-probabilities), zeros and -inf among them, at
    temperatures 0.3 / 1 / 2.5 with top-k, top-p and min-p mixed per request: cuda
    equals cpu bit for bit, for dense and sparse q."""
    torch = cuda
    rng = np.random.default_rng(29 + v % 7)
    b, k = 6, 3
    mag = np.exp2(rng.uniform(-24, 6, (b, k + 1, v)))
    x = np.where(rng.random((b, k + 1, v)) < 0.5, -mag, mag)
    x[1] = -mag[1]  # log-probability rows
    x[2][rng.random((k + 1, v)) < 0.05] = 0.0
    x[3][rng.random((k + 1, v)) < 0.2] = -np.inf
    x = x.astype(np.float32)
    params = {"temperature": np.array([0.3, 1.0, 2.5, 1.0, 0.3, 2.5]),
              "top_k": np.array([0, 5, 0, 300, 0, 40], dtype=np.int64),
              "top_p": np.array([1.0, 1.0, 0.9, 0.5, 0.99, 1.0], dtype=np.float32),
              "min_p": np.array([0.0, 0.0, 0.0, 0.01, 0.2, 0.0], dtype=np.float32)}
    for qkind, check in (("dense", False), ("sparse", "lazy")):
        q, draft = _q_draft(rng, x, k, qkind)
        _, want = _both(torch, x, "bfloat16", draft, q, _keys(rng, b), params, check,
                        on_device={"params", "keys"})
        assert not _np(want.status).any()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_extreme_scales_and_cut_values(cuda, dtype):
    """Rows whose z = x / T is beyond 2**40 in magnitude (logits near 1e12 at T = 1;
    ordinary logits at T = 1e-11), logits near 1e-32 at T = 1e-32 (the bounds of a gap
    bucket's logits then lie below float32's normal range), a top-p cut landing inside the
    tokens of value 0 and -0.0 (round(z) at T = 1), a row with no cut (its residual
    reads every token) and top-k with top-p at T = 2.5: cuda equals cpu bit for bit."""
    torch = cuda
    rng = np.random.default_rng(83 + len(dtype))
    b, k, v = 6, 2, 3000
    z = rng.standard_normal((b, k + 1, v))
    x = 3 * z
    x[0] *= 1e12
    x[2] *= 1e-32
    x[3] = np.round(z[3])
    x = x.astype(np.float32)
    assert (x[3] == 0).any() and np.signbit(x[3][x[3] == 0]).any()  # -0.0 among the zeros
    params = {"temperature": np.array([1.0, 1e-11, 1e-32, 1.0, 0.7, 2.5]),
              "top_k": np.array([0, 0, 0, 0, 0, 7], dtype=np.int64),
              "top_p": np.array([0.9, 0.5, 0.9, 0.8, 1.0, 0.95], dtype=np.float32),
              "min_p": np.zeros(b, dtype=np.float32)}
    for qkind, check in (("dense", False), ("sparse", "lazy"), ("point", False)):
        q, draft = _q_draft(rng, x, k, qkind)
        _both(torch, x, dtype, draft, q, _keys(rng, b), params, check,
              on_device={"params", "keys"})


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_residual_tiles_with_many_kept_tokens(cuda, dtype):
    """B=64 at V=129280 (the residual's largest tiles, 8192 tokens): near-flat rows (T = 50)
    cut by top_k 1000 / 30000 / 100000 and by top_p 0.999, so a tile holds from tens to
    thousands of kept tokens (above half the tile: more than its draw lists), ties at the
    cut value; q from 3 z + 0.5 noise at T = 1 (peaked), so drafts are mostly rejected and
    the residual rows have thousands of positive terms.  cuda equals cpu bit for bit, dense
    and point-mass q."""
    torch = cuda
    rng = np.random.default_rng(311 + len(dtype))
    b, k, v = 64, 2, V_REAL
    x = (3 * rng.standard_normal((b, k + 1, v))).astype(np.float32)
    tk = np.array([1000, 30000, 100000, 0] * (b // 4), dtype=np.int64)
    params = {"temperature": np.full(b, 50.0), "top_k": tk,
              "top_p": np.where(tk == 0, 0.999, 1.0).astype(np.float32),
              "min_p": np.zeros(b, dtype=np.float32)}
    for qkind, check in (("dense", False), ("point", "lazy")):
        q, draft = _q_draft(rng, x, k, qkind)
        if qkind == "point":  # every draft the argmax: the flat rows accept some of them
            draft = np.argmax(x[:, :k], axis=2).astype(np.int32)
        _, want = _both(torch, x, dtype, draft, q, _keys(rng, b), params, check,
                        on_device={"params", "keys"})
        assert not _np(want.status).any()
        assert (_np(want.accepted) < k).sum() >= b // 2  # residual rows


@pytest.mark.parametrize("b", [4, 64])
def test_residual_tiles_with_and_without_their_kept_lists(cuda, b):
    """Residual rows whose tiles list from a few to all of their tokens in one call: the
    first 60000 ids logits in [20, 21), 500 ids among the rest in [25, 26), the others
    3 z, cut by top_k 60500 (B=4: residual tiles of 1024 tokens, B=64: 8192), so a tile
    of the first ids lists more tokens than it keeps (128) and a tile of the rest keeps
    its few; both carry about half the row's mass, and the corrections fall in both
    over the calls.  q from 3 z + 0.5 noise (dense), drafts drawn from it (rejected):
    cuda equals cpu bit for bit."""
    torch = cuda
    rng = np.random.default_rng(577 + b)
    k, v = 2, V_REAL
    kinds = set()
    for _ in range(4 if b == 4 else 1):
        z = rng.standard_normal((b, k + 1, v))
        x = 3 * z
        x[:, :, :60000] = 20 + rng.random((b, k + 1, 60000))
        few = 60000 + rng.choice(v - 60000, 500, replace=False)
        x[:, :, few] = 25 + rng.random((b, k + 1, 500))
        q, draft = _q_draft(rng, (3 * z).astype(np.float32), k, "dense")
        params = _full_params(b, temperature=1.0, top_k=60500)
        for dtype in ("float32", "bfloat16"):
            _, want = _both(torch, x.astype(np.float32), dtype, draft, q, _keys(rng, b),
                            params, False, on_device={"params", "keys"})
            assert not _np(want.status).any()
            tok = _np(want.tokens)[np.arange(b), _np(want.accepted)]
            kinds |= {"first" if t < 60000 else "few" for t in tok}
    assert kinds == {"first", "few"}


@pytest.mark.parametrize("b", [16, 64])
def test_bf16_cuts_on_tied_values(cuda, b):
    """bfloat16 rows of 3 z at V=129280 (hundreds of tokens share each value near a cut),
    B=16 / 64 (tiles of about 22000 / 32768 tokens), each request a mix of: top-p alone,
    top-k alone (1 .. 60000), top-k with top-p (the top-p cut in top-k's bucket or an
    earlier one), min-p, temperatures 0.3 .. 1000 (a gap bucket holding one value up to
    hundreds of values), and rows of tiny logits around a few large ones (the cut among
    values below the value table's binades): cuda equals cpu bit for bit."""
    torch = cuda
    rng = np.random.default_rng(97 + b)
    k, v = 2, V_REAL
    x = 3 * rng.standard_normal((b, k + 1, v))
    recipes = [(1.0, 0, 0.9, 0.0), (1.0, 0, 0.5, 0.0), (1.0, 0, 0.999, 0.0),
               (1.0, 1, 1.0, 0.0), (1.0, 50, 1.0, 0.0), (1.0, 2000, 1.0, 0.0),
               (1.0, 60000, 1.0, 0.0), (1.0, 2000, 0.5, 0.0), (1.0, 50, 0.999, 0.0),
               (50.0, 0, 0.9, 0.0), (50.0, 30000, 0.95, 0.0), (1000.0, 0, 0.5, 0.0),
               (0.3, 0, 0.9, 0.0), (1.0, 0, 0.95, 0.05), (1.0, 400, 0.97, 0.0),
               (1.0, 0, 0.5, 0.0)]
    for r in range(15, b, 16):  # tiny logits around two large ones
        x[r] *= 1e-6
        x[r, :, :2] = 0.5
    _bf16_dense_and_sparse(torch, rng, x.astype(np.float32), k, _cycled_params(recipes, b))


@pytest.mark.parametrize("b", [1, 64])
def test_bf16_top_k_and_top_p_cut_inside_one_value(cuda, b):
    """bfloat16 rows at V=129280 of few values (round(4 z) / 4 x 3: thousands of tokens
    each), B=1 (a block a tile) and 64 (tiles counted by logits_max): top_k landing inside
    a value with top_p just below 1, so that the top-p cut lies inside the same value and
    keeps fewer of its tokens (ties to the lowest ids); top-k alone, top-p alone, both
    with min-p, and rows whose cut lies among the values below the value table's binades
    (tiny logits around a few large ones, some of them tied): cuda equals cpu bit for
    bit."""
    torch = cuda
    rng = np.random.default_rng(131 + b)
    k, v = 5 if b == 1 else 2, V_REAL
    x = 3 * np.round(4 * rng.standard_normal((b, k + 1, v))) / 4
    recipes = [(1.0, 3000, 0.99999, 0.0), (1.0, 20000, 0.9999, 0.0), (0.7, 500, 0.999, 0.0),
               (1.0, 3000, 1.0, 0.0), (1.0, 0, 0.6, 0.0), (2.0, 10000, 0.99999, 0.01)]
    for r in range(b):
        if r % 4 == 3:  # tiny logits around a few large ones; ties among the tiny ones
            x[r] = np.round(x[r]) * 1e-8
            x[r, :, :3] = 0.25
    if b == 1:  # the one request's rows with both cuts in one value, then its rows of tiny
        # logits around a few large ones (the top-p cut among them)
        _bf16_dense_and_sparse(torch, rng, x.astype(np.float32), k,
                               {"temperature": 1.0, "top_k": 3000, "top_p": 0.99999})
        x = np.round(x) * 1e-8
        x[:, :, :3] = 0.25
        params = {"temperature": 1.0, "top_p": 0.9}
    else:
        params = _cycled_params(recipes, b)
    _bf16_dense_and_sparse(torch, rng, x.astype(np.float32), k, params)


def _cycled_params(recipes, b):
    """Parameter arrays [B] (temperature float64, top_k int64, top_p / min_p float32):
    request i takes recipes[i % len(recipes)], each (temperature, top_k, top_p, min_p)."""
    t, tk, tp, mp = (np.array(c) for c in zip(*(recipes[i % len(recipes)] for i in range(b))))
    return {"temperature": t.astype(np.float64), "top_k": tk.astype(np.int64),
            "top_p": tp.astype(np.float32), "min_p": mp.astype(np.float32)}


def _bf16_dense_and_sparse(torch, rng, x, k, params):
    """cuda == cpu on the logits x [b, k + 1, V] in bfloat16 with dense q (check=False)
    and top-32 q ("lazy"), parameters and keys on the device; no request fails."""
    for qkind, check in (("dense", False), ("sparse", "lazy")):
        q, draft = _q_draft(rng, x, k, qkind)
        _, want = _both(torch, x, "bfloat16", draft, q, _keys(rng, x.shape[0]), params, check,
                        on_device={"params", "keys"})
        assert not _np(want.status).any()


@pytest.mark.parametrize("b", [4, 64])
def test_bf16_tiles_of_one_row_in_different_ranges(cuda, b):
    """bfloat16 rows at V=129280 whose parts lie in different ranges, so that a row's tiles
    have largest magnitudes from its own down to 2**-30 below it: 4096-token runs scaled
    by 2**-20 .. 2**4, half a row scaled by 2**-12, runs of 50000 tokens of 2**-30 x, of
    exact zeros, of -inf or of subnormals, zeros and tiny values sprinkled one in a
    thousand, magnitudes growing 2**23-fold along the row (each tile's largest at its
    end); temperatures 0.5 / 1 / 40 with top-p, top-k and min-p mixed: cuda equals cpu
    bit for bit (every token of every tile is weighed, whichever range its tile spans)."""
    torch = cuda
    rng = np.random.default_rng(53 + b)
    k, v = 2, V_REAL
    x = 3 * rng.standard_normal((b, k + 1, v))
    run = slice(40000, 90000)
    for r in range(b):
        for i in range(k + 1):
            row, kind = x[r, i], (r * (k + 1) + i) % 8
            if kind == 0:
                row *= np.repeat(np.exp2(rng.integers(-20, 5, -(-v // 4096))), 4096)[:v]
            elif kind == 1:
                row[: v // 2] *= 2.0**-12
            elif kind == 2:
                row[run] = 0.0
            elif kind == 3:
                row[run] = -np.inf
            elif kind == 4:
                row[rng.random(v) < 1e-3] = 0.0
                row[rng.random(v) < 1e-3] *= 2.0**-30
            elif kind == 5:
                row[run] *= 2.0**-30
            elif kind == 6:
                row[run] = 1e-39 * rng.standard_normal(run.stop - run.start)
            else:  # magnitudes growing along the row: each tile's largest at its end
                row *= np.exp2(np.linspace(-20, 3, v))
    recipes = [(1.0, 0, 0.9, 0.0), (40.0, 0, 0.999, 0.0), (0.5, 5000, 1.0, 0.0),
               (1.0, 300, 0.95, 0.01), (40.0, 60000, 0.9, 0.0), (1.0, 0, 1.0, 0.001)]
    _bf16_dense_and_sparse(torch, rng, x.astype(np.float32), k, _cycled_params(recipes, b))


def _tied_at_boundary(row, top_p):
    """How many tokens share the value at which a row's top-p prefix ends (T = 1; from
    float64 weights: the test's premise, not the rule)."""
    vals, counts = np.unique(row[np.isfinite(row)].astype(np.float64), return_counts=True)
    vals, counts = vals[::-1], counts[::-1]
    mass = np.cumsum(np.exp(vals - vals[0]) * counts)
    return int(counts[np.searchsorted(mass / mass[-1], top_p)])


@pytest.mark.parametrize("qkind", ["point", "dense"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_ties_and_masks_at_real_vocabulary(cuda, dtype, qkind):
    """V=129280 rows with thousands of exactly tied logits at the top-k / top-p / min-p
    boundaries (every logit equal; round(z): -0.0 and 0.0 among them), a row masked to
    1% by -inf, a row with one finite logit, and a greedy request on tied maxima."""
    torch = cuda
    b, k, v = 8, 2, V_REAL
    rng = np.random.default_rng(40 + DTYPES.index(dtype) + len(qkind))
    x = np.round(rng.standard_normal((b, k + 1, v))).astype(np.float32)
    x[0] = x[7] = 0.0
    x[4] = (3 * rng.standard_normal((k + 1, v))).astype(np.float32)
    x[4][rng.random((k + 1, v)) < 0.99] = -np.inf
    x[4, :, 11] = 2.0
    x[5] = -np.inf
    x[5, np.arange(k + 1), rng.integers(0, v, k + 1)] = 1.5
    for i in range(k + 1):
        assert _tied_at_boundary(x[1, i], 0.5) > 2048
    params = _full_params(b, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    params["temperature"][[4, 6]] = 0.8, 0.0
    params["top_p"][[0, 1, 2, 3, 4, 5]] = 0.5, 0.5, 0.3, 0.9, 0.9, 0.5
    params["top_k"][[2, 5, 7]] = 5000, 3, 2049
    params["min_p"][[3, 7]] = 0.3, 1.0
    if qkind == "dense":
        q = dyadic.allocate(x[:, :k].copy(), logits=True, backend="cpu")
        draft = np.asarray(dyadic.draw(q, _keys(rng, b * k), backend="cpu")).astype(np.int32)
    else:
        q, draft = None, np.zeros((b, k), np.int32)
        for r in range(b):
            for i in range(k):
                row = x[r, i]
                pick = rng.integers(3)  # the last of the tied maxima, a finite id, any id
                if pick == 0:
                    draft[r, i] = np.flatnonzero(row == row.max())[-1]
                elif pick == 1:
                    draft[r, i] = rng.choice(np.flatnonzero(np.isfinite(row)))
                else:
                    draft[r, i] = rng.integers(v)
    keys = _keys(rng, b)
    for check, on_device in ((False, {"params"}), ("lazy", set()), (True, {"keys"})):
        _, want = _both(torch, x, dtype, draft, q, keys, params, check, on_device=on_device)
        if check is not True:
            assert not _np(want.status).any()


def _ragged_case(rng, b, k, v, qkind, n):
    """Logits, draft and q of b requests with hostile padding beyond each count n_b: NaN /
    +inf target rows, draft ids -1 / V + 9, q counts above 2**24 and ids past V."""
    x = _logits(rng, b, k + 1, v)
    q, draft = _q_draft(rng, x, k, qkind)
    counts = ids = None
    if q is not None:
        counts = np.array(q.counts)
        ids = None if q.ids is None else np.array(q.ids)
    for r in range(b):
        m = min(max(int(n[r]), 0), k)
        x[r, m + 1:] = np.where(np.arange(m + 1, k + 1) % 2, np.inf, np.nan)[:, None]
        draft[r, m:] = np.where(np.arange(m, k) % 2, v + 9, -1)
        if counts is not None:
            counts[r, m:] = _spec.TOTAL + 3
        if ids is not None:
            ids[r, m:] = v + 1
    q = None if counts is None else trusted_dyadic(counts, ids, v, "standard", readonly=False)
    return x, draft, q


@pytest.mark.parametrize("b, k, v, dtype", [(8, 5, 1000, "float16"), (3, 3, 300, "float32"),
                                            (4, 5, V_REAL, "bfloat16")])
@pytest.mark.parametrize("qkind", ["sparse", "dense", "point"])
def test_ragged_drafts_with_garbage_padding(cuda, b, k, v, dtype, qkind):
    """Counts 0..k with NaN / +inf target rows, bad draft ids and q rows beyond them.
    Greedy requests (the last, n = k, among them) draft their argmax: every draft is
    accepted and the bonus comes from target row n_b."""
    torch = cuda
    rng = np.random.default_rng(b * 1000 + k + len(qkind))
    n = rng.integers(0, k + 1, b)
    n[0], n[-1] = 0, k
    x, draft, q = _ragged_case(rng, b, k, v, qkind, n)
    keys = _keys(rng, b)
    params = _full_params(b, temperature=1.0)
    params.update(top_k=rng.choice([0, 40, v + 1], b).astype(np.int64),
                  top_p=rng.choice([1.0, 0.95, 0.9], b).astype(np.float32),
                  min_p=rng.choice([0.0, 0.01], b).astype(np.float32))
    greedy = np.arange(b) % 3 == 1
    greedy[-1] = True
    params["temperature"][greedy] = 0.0
    for r in np.flatnonzero(greedy):
        draft[r, :n[r]] = np.argmax(x[r, :n[r]], axis=1)
    out = {"accepted": torch.empty(b, dtype=torch.int32, device=DEV),
           "tokens": torch.empty(b, k + 1, dtype=torch.int32, device=DEV),
           "status": torch.empty(b, dtype=torch.int32, device=DEV)}
    for check, on_device, o in ((False, {"num_drafts", "params", "keys"}, out),
                                ("lazy", set(), None), (True, {"num_drafts"}, None)):
        got, want = _both(torch, x, dtype, draft, q, keys, params, check,
                          on_device=on_device, num_drafts=n, out=o)
        if check is not True:
            assert not _np(want.status).any()
        assert (_np(want.accepted)[greedy] == n[greedy]).all()
        assert (_np(want.tokens)[np.arange(k + 1)[None, :] > n[:, None]] == -1).all()


def _bad_case(rng, v=500):
    """16 requests (k = 2, dense q, drafts drawn from it): request r breaks the rule of
    BAD_STATUS[r] (0: valid; 12 is temperature -0.0, a greedy request; 15 min_p = 1)."""
    b, k = 16, 2
    x = (3 * rng.standard_normal((b, k + 1, v))).astype(np.float32)
    q, draft = _q_draft(rng, x, k, "dense")
    params = _full_params(b, temperature=0.9, top_k=0, top_p=0.95, min_p=0.0)
    x[1, 1, 7] = np.nan
    x[2, 0, 3] = np.inf
    x[3, 2] = -np.inf
    params["temperature"][[4, 5, 12, 13, 14]] = -1.0, np.nan, -0.0, 1e-305, 0.0
    params["top_p"][[6, 7]] = 0.0, 1.5
    params["min_p"][[8, 15]] = 1.5, 1.0
    params["top_k"][9] = -1
    draft[10, 1], draft[11, 0] = v, -1
    x[13, 0, 5] = 60000.0  # z = x / 1e-305 overflows to +inf
    x[14, 1, 2] = np.nan  # a greedy request validates its rows too
    return x, draft, q, params


BAD_STATUS = [0, _status.TARGET_INVALID_VALUE, _status.TARGET_INVALID_VALUE,
              _status.TARGET_ZERO_MASS, _status.TEMPERATURE_INVALID,
              _status.TEMPERATURE_INVALID, _status.TOP_P_INVALID, _status.TOP_P_INVALID,
              _status.MIN_P_INVALID, _status.TOP_K_INVALID, _status.DRAFT_OUT_OF_RANGE,
              _status.DRAFT_OUT_OF_RANGE, 0, _status.TARGET_INVALID_VALUE,
              _status.TARGET_INVALID_VALUE, 0]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("where", ["host", "device"])
def test_bad_requests_fail_closed_as_cpu(cuda, dtype, where):
    """check=False: each bad request fails closed with cpu's status; parameters as NumPy
    arrays or device tensors; the other requests unchanged."""
    torch = cuda
    rng = np.random.default_rng(3 + len(dtype))
    x, draft, q, params = _bad_case(rng)
    on_device = {"params", "keys"} if where == "device" else set()
    got, want = _both(torch, x, dtype, draft, q, _keys(rng, 16), params, False,
                      on_device=on_device)
    assert _np(want.status).tolist() == BAD_STATUS
    bad = np.array(BAD_STATUS) != 0
    assert (_np(got.tokens)[bad] == -1).all() and (_np(got.accepted)[bad] == 0).all()


@pytest.mark.parametrize("where", ["host", "device"])
def test_counts_out_of_range_fail_closed_as_cpu(cuda, where):
    """num_drafts -1 and k + 1 fail closed (NUM_DRAFTS_INVALID); a NaN row and an id out
    of range beyond a request's count are padding (status 0)."""
    torch = cuda
    rng = np.random.default_rng(11)
    b, k, v = 5, 3, 700
    x = _logits(rng, b, k + 1, v)
    q, draft = _q_draft(rng, x, k, "sparse")
    n = np.array([-1, k + 1, 1, 0, k], np.int64)
    x[2, 2:] = np.nan
    draft[2, 1:] = v
    params = _params(rng, b, v, "array")
    on_device = {"num_drafts", "params"} if where == "device" else set()
    _, want = _both(torch, x, "bfloat16", draft, q, _keys(rng, b), params, False,
                    on_device=on_device, num_drafts=n)
    assert _np(want.status).tolist() == [_status.NUM_DRAFTS_INVALID] * 2 + [0] * 3


def _raising_cases():
    """(name, change) pairs: each change turns a valid call into one that raises with
    check=True.  A change edits (x, draft, params, n) in place, or returns what replaces
    params."""
    def setx(idx, val):
        def change(x, draft, params, n):
            x[idx] = val
        return change

    def param(name, vals):
        def change(x, draft, params, n):
            params[name] = np.asarray(vals, dtype=params[name].dtype)
        return change

    def scalar(**kw):
        def change(x, draft, params, n):
            return kw
        return change

    def draft_id(x, draft, params, n):
        draft[1, 0] = x.shape[-1]

    def counts(x, draft, params, n):
        n[1] = draft.shape[1] + 1

    return [("nan", setx((1, 1, 7), np.nan)), ("inf", setx((2, 0, 3), np.inf)),
            ("all_neginf", setx((0, 2), -np.inf)),
            ("temperature", param("temperature", [1.0, -0.5, 1.0])),
            ("temperature_scalar", scalar(temperature=-1.0)),
            ("top_p", param("top_p", [1.0, 0.0, 1.0])),
            ("top_p_scalar", scalar(top_p=1.5)),
            ("min_p", param("min_p", [0.0, 0.0, 1.5])),
            ("top_k", param("top_k", [0, -1, 0])), ("draft", draft_id),
            ("num_drafts", counts)]


RAISING = dict(_raising_cases())


@pytest.mark.parametrize("name", list(RAISING))
@pytest.mark.parametrize("where", ["host", "device"])
def test_check_true_raises_as_cpu(cuda, name, where):
    """check=True: a bad target row, parameter, draft id or count raises cpu's exception
    with cpu's message; parameters, keys and counts given on the host or the device."""
    torch = cuda
    rng = np.random.default_rng(list(RAISING).index(name))
    b, k, v = 3, 2, 300
    x = _logits(rng, b, k + 1, v)
    q, draft = _q_draft(rng, x, k, "dense")
    params = _full_params(b, temperature=0.7, top_k=40, top_p=0.9, min_p=0.01)
    n = np.array([k, 1, 0], np.int64)
    replaced = RAISING[name](x, draft, params, n)
    if replaced is not None:
        params = replaced
    on_device = {"params", "keys", "num_drafts"} if where == "device" else set()
    run_cuda, run_cpu = _calls(torch, x, "float32", draft, q, _keys(rng, b), params, True,
                               on_device=on_device,
                               num_drafts=n if where == "device" or name == "num_drafts"
                               else None)
    _raises_like_cpu(run_cuda, run_cpu)


def test_cuda_graph_replay_with_inputs_rewritten(cuda):
    """One graph captured with check=False, device keys, parameters, num_drafts, a top-32 q
    in device buffers and out=; every input rewritten in place (copy_) between replays
    (one replay with bad requests); each replay == cpu on the new values."""
    torch = cuda
    rng = np.random.default_rng(17)
    b, k, v, w = 4, 5, V_REAL, 32

    def empty(*shape, dtype):  # written by fill() before the first call
        return torch.empty(*shape, dtype=dtype, device=DEV)

    tgt = empty(b, k + 1, v, dtype=torch.bfloat16)
    draft = empty(b, k, dtype=torch.int32)
    qc, qi = empty(b, k, w, dtype=torch.uint32), empty(b, k, w, dtype=torch.int32)
    q = trusted_dyadic(qc, qi, v, "standard", readonly=False)
    par = {"temperature": empty(b, dtype=torch.float64), "top_k": empty(b, dtype=torch.int64),
           "top_p": empty(b, dtype=torch.float32), "min_p": empty(b, dtype=torch.float32)}
    nd = empty(b, dtype=torch.int32)
    fields = (empty(b, dtype=torch.int64),) + tuple(empty(b, dtype=torch.int32)
                                                   for _ in range(3))
    keys = dyadic.Keys(*fields)
    out = {"accepted": empty(b, dtype=torch.int32), "tokens": empty(b, k + 1, dtype=torch.int32),
           "status": empty(b, dtype=torch.int32)}

    def fill(bad=False):
        """New values in every input buffer; returns the cpu call's inputs."""
        n = rng.integers(0, k + 1, b)
        if bad:
            n[2], n[3] = -1, k
        x, d, hq = _ragged_case(rng, b, k, v, "sparse", n)
        params = _params(rng, b, v, "array")
        if bad:
            params["top_p"][0] = 0.0
            x[1, 0, 17] = np.nan
            d[3, 0] = v
        hk = _keys(rng, b)
        xb = torch.from_numpy(x).to(torch.bfloat16)
        tgt.copy_(xb)
        draft.copy_(torch.from_numpy(d))
        qc.copy_(torch.from_numpy(np.asarray(hq.counts)))
        qi.copy_(torch.from_numpy(np.asarray(hq.ids)))
        for name, t in par.items():
            t.copy_(torch.from_numpy(params[name]))
        nd.copy_(torch.from_numpy(n.astype(np.int32)))
        for f, h in zip(fields, (hk.seed, hk.generation, hk.round, hk.position)):
            f.copy_(torch.from_numpy(h.astype(np.int64 if f.dtype == torch.int64 else np.int32)))
        return xb, d, hq, hk, params, n

    def step():
        dyadic.verify(tgt, draft, q, keys, logits=True, backend=BACKEND, check=False, out=out,
                      num_drafts=nd, **par)

    fill()
    replay = capture_graph(step)
    for bad in (False, True, False, False):
        xb, d, hq, hk, params, n = fill(bad)
        replay()
        torch.cuda.synchronize()
        want = dyadic.verify(xb, d, hq, hk, logits=True, backend="cpu", check=False,
                             num_drafts=n, **params)
        if bad:
            assert _np(want.status).tolist() == [
                _status.TOP_P_INVALID, _status.TARGET_INVALID_VALUE,
                _status.NUM_DRAFTS_INVALID, _status.DRAFT_OUT_OF_RANGE]
        else:
            assert not _np(want.status).any()
        np.testing.assert_array_equal(_np(out["status"]), _np(want.status))
        np.testing.assert_array_equal(_np(out["tokens"]), _np(want.tokens))
        np.testing.assert_array_equal(_np(out["accepted"]), _np(want.accepted))
