"""check=False: a bad row fails closed with its status, and no other row changes.

On every backend (the host path for cpu / reference / numba, device tensors for cuda):
a batch holding one row that breaks a rule gives, with check=False, outputs -1 (counts
0, accepted 0) and the rule's status code on that row, and for every other row exactly
the outputs of the same batch without the bad row.  ``out=`` is written and returned.
"""

import numpy as np
import pytest

import dyadic
from dyadic import Keys, _status

from conftest import cuda_torch, random_target

BACKENDS = ["cpu", "reference", "numba", "cuda"]
B, V, K = 4, 40, 3
# The numba backend runs on the CUDA simulator without a GPU (seconds per call): it
# takes one rule of each primitive there, every rule on a GPU.
_SIM = "NUMBA_ENABLE_CUDASIM" in __import__("os").environ


def _cases(rules, extra=((),)):
    out = []
    for backend in BACKENDS:
        for i, rule in enumerate(rules):
            for e in extra:
                if backend == "numba" and _SIM and (i or e != extra[-1]):
                    continue
                out.append((backend, rule) + tuple(e))
    return out
BAD_ROW = 2


def _backend_or_skip(name):
    if name == "cuda":
        return cuda_torch()
    if name not in dyadic.available_backends():
        pytest.skip(f"backend {name!r} unavailable here")
    return None


def _dev(x, torch):
    return x if torch is None else torch.as_tensor(x).cuda()


def _host(x):
    return x if isinstance(x, np.ndarray) else x.cpu().numpy()


def _status_out(torch, b):
    if torch is None:
        return np.empty(b, np.int32)
    return torch.empty(b, dtype=torch.int32, device="cuda")


def _keys(b):
    return Keys(seed=np.arange(100, 100 + b, dtype=np.uint64), round=3,
                position=np.arange(b, dtype=np.uint32) * 7)


def _logits(rng):
    return rng.standard_normal((B, V)).astype(np.float32)


BAD_X = {
    "nan": (_status.X_NAN, lambda x: x.__setitem__((BAD_ROW, 5), np.nan)),
    "posinf": (_status.X_POSINF, lambda x: x.__setitem__((BAD_ROW, 5), np.inf)),
    "zero_mass": (_status.X_ZERO_MASS, lambda x: x.__setitem__(BAD_ROW, -np.inf)),
}


@pytest.mark.parametrize("backend, rule, top_k", _cases(sorted(BAD_X), ((None,), (8,))))
def test_propose_bad_row(backend, rule, top_k, rng):
    torch = _backend_or_skip(backend)
    code, spoil = BAD_X[rule]
    x = _logits(rng)
    bad = x.copy()
    spoil(bad)
    good_t, good_q = dyadic.propose(_dev(x, torch), _keys(B), top_k=top_k, backend=backend,
                                    check=False, out={"status": _status_out(torch, B)})
    st = _status_out(torch, B)
    out_t, out_q = dyadic.propose(_dev(bad, torch), _keys(B), top_k=top_k, backend=backend,
                                  check=False, out={"status": st})
    st = _host(st)
    assert st.tolist() == [code if r == BAD_ROW else 0 for r in range(B)]
    keep = [r for r in range(B) if r != BAD_ROW]
    np.testing.assert_array_equal(_host(out_t)[keep], _host(good_t)[keep])
    np.testing.assert_array_equal(_host(out_q.counts)[keep], _host(good_q.counts)[keep])
    assert _host(out_t)[BAD_ROW] == -1
    assert (_host(out_q.counts)[BAD_ROW] == 0).all()
    if top_k:
        np.testing.assert_array_equal(_host(out_q.ids)[keep], _host(good_q.ids)[keep])
        assert (_host(out_q.ids)[BAD_ROW] == -1).all()
    with pytest.raises(ValueError, match=rf"row {BAD_ROW}: .*\[status {code}\]"):
        dyadic.propose(_dev(bad, torch), _keys(B), top_k=top_k, backend=backend)


@pytest.mark.parametrize("backend, rule", _cases(["negative", "nan", "zero_mass"]))
def test_allocate_weights_bad_row(backend, rule, rng):
    torch = _backend_or_skip(backend)
    w = rng.random((B, V)).astype(np.float32)
    bad = w.copy()
    code = {"negative": _status.X_NEGATIVE, "nan": _status.X_NAN,
            "zero_mass": _status.X_ZERO_MASS}[rule]
    if rule == "negative":
        bad[BAD_ROW, 3] = -1.0
    elif rule == "nan":
        bad[BAD_ROW, 3] = np.nan
    else:
        bad[BAD_ROW] = 0.0
    good = dyadic.allocate(_dev(w, torch), backend=backend, check=False,
                           out={"status": _status_out(torch, B)})
    st = _status_out(torch, B)
    got = dyadic.allocate(_dev(bad, torch), backend=backend, check=False, out={"status": st})
    assert _host(st).tolist() == [code if r == BAD_ROW else 0 for r in range(B)]
    keep = [r for r in range(B) if r != BAD_ROW]
    np.testing.assert_array_equal(_host(got.counts)[keep], _host(good.counts)[keep])
    assert (_host(got.counts)[BAD_ROW] == 0).all()


def _verify_case(rng):
    p = random_target(rng, B, K + 1, V)
    q = dyadic.allocate(rng.random((B, K, V)).astype(np.float32), top_k=6)
    draft = np.asarray(q.ids)[:, :, 0].copy()  # a token each q row can have drawn
    return p, draft, q


def _spoil_target_value(p, d, q):
    p[BAD_ROW, 1, 4] = np.nan
    return _status.TARGET_INVALID_VALUE


def _spoil_target_sum(p, d, q):
    p[BAD_ROW, 0] *= 0.5
    return _status.TARGET_SUM


def _spoil_q_zero(p, d, q):
    ids = np.asarray(q.ids)[BAD_ROW, 0]
    d[BAD_ROW, 0] = next(v for v in range(V) if v not in ids)
    return _status.Q_ZERO_AT_DRAFT


def _spoil_draft_high(p, d, q):
    d[BAD_ROW, 1] = V
    return _status.DRAFT_OUT_OF_RANGE


def _spoil_draft_negative(p, d, q):
    d[BAD_ROW, 2] = -1
    return _status.DRAFT_OUT_OF_RANGE


SPOIL = {"target_value": _spoil_target_value, "target_sum": _spoil_target_sum,
         "q_zero": _spoil_q_zero, "draft_high": _spoil_draft_high,
         "draft_negative": _spoil_draft_negative}


@pytest.mark.parametrize("backend, rule, check",
                         _cases(["draft_high"] + sorted(set(SPOIL) - {"draft_high"}),
                                (("lazy",), (False,))))
def test_verify_bad_row(backend, rule, check, rng):
    torch = _backend_or_skip(backend)
    p, d, q_host = _verify_case(rng)
    q = q_host
    if torch is not None:
        q = dyadic.Dyadic(torch.as_tensor(np.array(q.counts)).cuda(),
                          torch.as_tensor(np.array(q.ids)).cuda(), vocab_size=V)
    good = dyadic.verify(_dev(p, torch), _dev(d, torch), q, _keys(B), backend=backend,
                         check=False)
    p2, d2 = p.copy(), d.copy()
    code = SPOIL[rule](p2, d2, q_host)
    got = dyadic.verify(_dev(p2, torch), _dev(d2, torch), q, _keys(B), backend=backend,
                        check=check)
    status = _host(got.status)
    keep = [r for r in range(B) if r != BAD_ROW]
    if check == "lazy" and rule in ("target_value", "target_sum") and status[BAD_ROW] == 0:
        # lazy: a rule broken on data the decisions did not read is not examined
        pass
    else:
        assert status[BAD_ROW] == code
        assert _host(got.accepted)[BAD_ROW] == 0
        assert (_host(got.tokens)[BAD_ROW] == -1).all()
    assert (status[keep] == 0).all()
    np.testing.assert_array_equal(_host(got.tokens)[keep], _host(good.tokens)[keep])
    np.testing.assert_array_equal(_host(got.accepted)[keep], _host(good.accepted)[keep])
    with pytest.raises(ValueError, match=rf"row {BAD_ROW}: "):
        dyadic.verify(_dev(p2, torch), _dev(d2, torch), q, _keys(B), backend=backend)


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_draft_ids_beyond_int32_fail_closed_instead_of_wrapping(backend, rng):
    p, d, q = _verify_case(rng)
    d64 = d.astype(np.int64)
    d64[BAD_ROW, 0] = (1 << 32) + int(d[BAD_ROW, 0])  # wraps to a valid id in int32
    got = dyadic.verify(p, d64, q, _keys(B), backend=backend, check=False)
    assert got.status[BAD_ROW] == _status.DRAFT_OUT_OF_RANGE
    with pytest.raises(ValueError, match=f"draft: row {BAD_ROW}: token ids must be in"):
        dyadic.verify(p, d64, q, _keys(B), backend=backend)


# ------------------------------------------------------------------ out= on the host

@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_host_out_is_written_and_returned(backend, rng):
    x = _logits(rng)
    out = {"tokens": np.full(B, 99, np.int32), "counts": np.zeros((B, 8), np.uint32),
           "ids": np.zeros((B, 8), np.int32), "status": np.full(B, 7, np.int32)}
    tokens, q = dyadic.propose(x, _keys(B), top_k=8, backend=backend, out=out)
    ref_t, ref_q = dyadic.propose(x, _keys(B), top_k=8, backend=backend)
    assert tokens is out["tokens"]
    np.testing.assert_array_equal(out["tokens"], ref_t)
    np.testing.assert_array_equal(out["counts"], ref_q.counts)
    np.testing.assert_array_equal(out["ids"], ref_q.ids)
    assert out["status"].tolist() == [0] * B
    p, d, qv = _verify_case(rng)
    vout = {"accepted": np.empty(B, np.int32), "tokens": np.empty((B, K + 1), np.int32),
            "status": np.empty(B, np.int32)}
    r = dyadic.verify(p, d, qv, _keys(B), backend=backend, check=False, out=vout)
    assert r.tokens is vout["tokens"] and r.status is vout["status"]
    np.testing.assert_array_equal(r.tokens, dyadic.verify(p, d, qv, _keys(B)).tokens)
    dout = {"tokens": np.empty(B, np.int32)}
    assert dyadic.draw(ref_q, _keys(B), backend=backend, out=dout) is dout["tokens"]
    np.testing.assert_array_equal(dout["tokens"], ref_t)


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_host_out_buffers_stay_writeable_and_serve_the_next_call(backend, rng):
    out = {"counts": np.zeros((B, 8), np.uint32), "ids": np.zeros((B, 8), np.int32),
           "status": np.zeros(B, np.int32)}
    for seed in (1, 2):
        x = np.random.default_rng(seed).standard_normal((B, V)).astype(np.float32)
        q = dyadic.allocate(x, logits=True, top_k=8, backend=backend, out=out)
        assert out["counts"].flags.writeable and out["ids"].flags.writeable
        want = dyadic.allocate(x, logits=True, top_k=8, backend=backend)
        np.testing.assert_array_equal(q.counts, want.counts)
        assert not want.counts.flags.writeable  # dyadic's own arrays are read-only


def test_host_out_torch_tensors_are_written():
    torch = pytest.importorskip("torch")
    x = torch.randn(B, V)
    out = {"counts": torch.zeros(B, V, dtype=torch.uint32)}
    q = dyadic.allocate(x, logits=True, out=out)
    assert q.counts is out["counts"]
    np.testing.assert_array_equal(out["counts"].numpy(),
                                  dyadic.allocate(x, logits=True).counts.numpy())


@pytest.mark.parametrize("bad, err, msg", [
    ({"tokens": np.empty(B, np.int64)}, ValueError, r"out\['tokens'\]: expected int32"),
    ({"tokens": np.empty(B + 1, np.int32)}, ValueError, r"out\['tokens'\]: expected int32"),
    ({"tokens": np.empty((B, 2), np.int32)[:, 0]}, ValueError, "C-contiguous"),
    ({"token": np.empty(B, np.int32)}, ValueError, r"out: unknown output\(s\) \['token'\]"),
    ({"tokens": [0] * B}, TypeError, r"out\['tokens'\]: expected a NumPy array"),
    ([np.empty(B, np.int32)], TypeError, "out: expected a dict"),
])
def test_host_out_errors_name_the_output(bad, err, msg, rng):
    with pytest.raises(err, match=msg):
        dyadic.propose(_logits(rng), _keys(B), top_k=8, out=bad)
