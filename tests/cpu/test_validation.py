"""Every validation rule: a clear error naming the argument, the row and the rule,
identical on every backend."""

import numpy as np
import pytest

import dyadic
from dyadic import Keys, _spec

TOTAL = _spec.TOTAL


def backends():
    return ["reference"] + [b for b in ("cpu",) if b in dyadic.available_backends()]


def probs(b, v, seed=0):
    z = np.random.default_rng(seed).standard_normal((b, v))
    e = np.exp(z - z.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).astype(np.float32)


@pytest.fixture(params=backends())
def backend(request):
    return request.param


@pytest.mark.parametrize("bad,rule", [
    (np.nan, "row 1: contains NaN"),
    (np.inf, "row 1: contains \\+inf"),
    (-1.0, "row 1: weights must be >= 0"),
    (-np.inf, "row 1: weights must be >= 0"),
])
def test_weight_rows(backend, bad, rule):
    x = np.ones((3, 5), np.float32)
    x[1, 2] = bad
    with pytest.raises(ValueError, match=f"^x: {rule}"):
        dyadic.allocate(x, backend=backend)


def test_zero_mass_rows(backend):
    x = np.ones((2, 4), np.float32)
    x[1] = 0
    with pytest.raises(ValueError, match="x: row 1: has zero effective mass"):
        dyadic.allocate(x, backend=backend)
    lg = np.zeros((2, 4), np.float32)
    lg[0] = -np.inf
    with pytest.raises(ValueError, match="x: row 0: has zero effective mass"):
        dyadic.allocate(lg, logits=True, backend=backend)
    with pytest.raises(ValueError, match="row 0: has zero effective mass"):
        dyadic.propose(lg, Keys(1), backend=backend)


def test_logit_rows(backend):
    lg = np.zeros((2, 4), np.float32)
    lg[1, 3] = np.nan
    with pytest.raises(ValueError, match="x: row 1: contains NaN"):
        dyadic.allocate(lg, logits=True, backend=backend)
    lg[1, 3] = np.inf
    with pytest.raises(ValueError, match=r"x: row 1: contains \+inf"):
        dyadic.allocate(lg, logits=True, backend=backend)
    # -inf logits are masks, not errors; a bias of +inf is an error
    lg[1, 3] = -np.inf
    dyadic.allocate(lg, logits=True, backend=backend)
    with pytest.raises(ValueError, match=r"row 0: contains \+inf"):
        dyadic.allocate(lg, logits=True, bias=np.array([0, np.inf, 0, 0], np.float32),
                        backend=backend)
    # temperature so small that (x + b) / T overflows to +inf
    with pytest.raises(ValueError, match=r"row 0: contains \+inf"):
        dyadic.allocate(np.array([[3e38, 0]], np.float32), logits=True, temperature=1e-300,
                        backend=backend)


def test_structural_errors():
    x = np.ones((2, 4), np.float32)
    with pytest.raises(TypeError, match="x: dtype float64"):
        dyadic.allocate(x.astype(np.float64), backend="reference")
    with pytest.raises(TypeError, match="x: dtype int64"):
        dyadic.allocate(np.ones((2, 4), np.int64), backend="reference")
    with pytest.raises(ValueError, match="policy: unknown policy 'greedy'"):
        dyadic.allocate(x, policy="greedy", backend="reference")
    with pytest.raises(ValueError, match="backend: unknown backend 'tpu'"):
        dyadic.allocate(x, backend="tpu")
    with pytest.raises(ValueError, match="top_k: must be >= 1"):
        dyadic.allocate(x, top_k=0, backend="reference")
    with pytest.raises(TypeError, match="top_k"):
        dyadic.allocate(x, top_k=2.0, backend="reference")
    with pytest.raises(ValueError, match="temperature: row 1: value 0.0 must be finite and > 0"):
        dyadic.allocate(x, logits=True, temperature=np.array([1.0, 0.0]), backend="reference")
    with pytest.raises(ValueError, match="temperature: row 0: .* must be finite and >= 0"):
        dyadic.propose(x, Keys(1), temperature=-1.0, backend="reference")
    with pytest.raises(ValueError, match="temperature/bias: apply only to logits"):
        dyadic.allocate(x, temperature=0.5, backend="reference")
    with pytest.raises(ValueError, match="bias: last dimension"):
        dyadic.allocate(x, logits=True, bias=np.zeros(3, np.float32), backend="reference")
    with pytest.raises(ValueError, match="x: vocabulary size 0"):
        dyadic.allocate(np.ones((2, 0), np.float32), backend="reference")
    with pytest.raises(ValueError, match=r"logits: expected shape \[B, V\]"):
        dyadic.propose(np.ones((2, 2, 4), np.float32), Keys(1), backend="reference")


@pytest.mark.parametrize("field,value,msg", [
    ("seed", -1, r"keys.seed: value -1 out of range \[0, 18446744073709551615\]"),
    ("seed", 2**64, "keys.seed: value 18446744073709551616 out of range"),
    ("generation", 2**32, "keys.generation: value 4294967296 out of range"),
    ("round", -3, "keys.round: value -3 out of range"),
    ("position", 2**32, "keys.position: value 4294967296 out of range"),
    ("position", np.array([0, -1]), r"keys.position: row 1: value -1 out of range"),
    ("seed", np.array([1, 2, 3]), "keys.seed: length 3 does not match the batch 2"),
])
def test_key_ranges(field, value, msg):
    kw = dict(seed=1)
    kw[field] = value
    with pytest.raises(ValueError, match=msg):
        dyadic.propose(np.zeros((2, 4), np.float32), Keys(**kw), backend="reference")


def test_key_types():
    with pytest.raises(TypeError, match="keys: expected dyadic.Keys"):
        dyadic.propose(np.zeros((1, 4), np.float32), 5, backend="reference")
    with pytest.raises(TypeError, match="keys.seed: dtype float64"):
        dyadic.propose(np.zeros((1, 4), np.float32), Keys(np.array([1.0])), backend="reference")
    with pytest.raises(TypeError, match="keys.seed: expected an integer, got bool"):
        dyadic.propose(np.zeros((1, 4), np.float32), Keys(True), backend="reference")


def test_verify_position_plus_k_in_range():
    p = probs(1, 3 * 4).reshape(1, 3, 4)
    with pytest.raises(ValueError, match=r"keys.position: value 4294967294 out of range \[0, 4294967293\]"):
        dyadic.verify(p, np.zeros((1, 2), np.int32), None, Keys(1, position=2**32 - 2),
                      backend="reference")


def _verify_case(b=2, k=2, v=6):
    p = probs(b * (k + 1), v).reshape(b, k + 1, v)
    q = dyadic.allocate(probs(b * k, v, seed=1).reshape(b, k, v), backend="reference")
    d = np.zeros((b, k), np.int32)
    return p, d, q


def test_target_rows(backend):
    p, d, q = _verify_case()
    for bad in (np.nan, -0.1, np.inf, 1.5):
        pb = p.copy()
        pb[1, 2, 3] = bad
        with pytest.raises(ValueError, match="target: row 1: probabilities must be finite, >= 0 and <= 1"):
            dyadic.verify(pb, d, q, Keys(1), backend=backend)
    pb = p.copy()
    pb[0, 1] *= np.float32(1.01)
    with pytest.raises(ValueError, match=r"target: row 0: probabilities must sum to 1 within 2\*\*-10"):
        dyadic.verify(pb, d, q, Keys(1), backend=backend)
    # within tolerance is accepted as given (never renormalised on the float side)
    pb = p.copy()
    pb[0, 1] *= np.float32(1.0005)
    dyadic.verify(pb, d, q, Keys(1), backend=backend)


def test_q_zero_at_draft(backend):
    p, _, _ = _verify_case()
    q = dyadic.allocate(np.array([[[1, 0, 0, 0, 0, 1]] * 2] * 2, np.float32), backend="reference")
    d = np.array([[0, 5], [0, 1]], np.int32)
    with pytest.raises(ValueError, match=r"q: row 1: q\(d\) = 0 at a proposed draft token"):
        dyadic.verify(p, d, q, Keys(1), backend=backend)
    # greedy rows are verified against the target argmax and do not consult q
    dyadic.verify(p, d, q, Keys(1), greedy=np.array([False, True]), backend=backend)


def test_verify_structure():
    p, d, q = _verify_case()
    with pytest.raises(TypeError, match="target: dtype float64; expected float32"):
        dyadic.verify(p.astype(np.float64), d, q, Keys(1), backend="reference")
    with pytest.raises(ValueError, match=r"target: expected shape \[B, k\+1, V\]"):
        dyadic.verify(p[0], d, q, Keys(1), backend="reference")
    with pytest.raises(ValueError, match=r"draft: shape \(2, 3\) must be \(B, k\)"):
        dyadic.verify(p, np.zeros((2, 3), np.int32), q, Keys(1), backend="reference")
    with pytest.raises(ValueError, match=r"draft: row 1: token ids must be in \[0, 6\)"):
        dyadic.verify(p, np.array([[0, 0], [6, 0]], np.int32), q, Keys(1), backend="reference")
    with pytest.raises(TypeError, match="draft: dtype float32"):
        dyadic.verify(p, d.astype(np.float32), q, Keys(1), backend="reference")
    with pytest.raises(TypeError, match="q: expected a dyadic.Dyadic or None"):
        dyadic.verify(p, d, q.counts, Keys(1), backend="reference")
    with pytest.raises(ValueError, match=r"q: batch shape \(2,\) must be \(B, k\)"):
        dyadic.verify(p, d, q[:, 0], Keys(1), backend="reference")
    q7 = dyadic.allocate(np.ones((2, 2, 7), np.float32), backend="reference")
    with pytest.raises(ValueError, match="q: vocab_size 7 does not match target's 6"):
        dyadic.verify(p, d, q7, Keys(1), backend="reference")
    with pytest.raises(ValueError, match=r"greedy: shape \(3,\) must be \(B,\)"):
        dyadic.verify(p, d, q, Keys(1), greedy=np.zeros(3, bool), backend="reference")
    with pytest.raises(TypeError, match="greedy: dtype int64 is not bool"):
        dyadic.verify(p, d, q, Keys(1), greedy=np.zeros(2, np.int64), backend="reference")
    with pytest.raises(ValueError, match=r"check: expected True, False or 'lazy', got 'fast'"):
        dyadic.verify(p, d, q, Keys(1), backend="reference", check="fast")


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_verify_check_lazy_on_host_arrays_validates_in_full(backend):
    """Host arrays: check="lazy" validates every row (the contract allows reading more)
    and fails a bad request closed with the status check=True raises for."""
    p, d, q = _verify_case()
    r1 = dyadic.verify(p, d, q, Keys(5), backend=backend)
    r2 = dyadic.verify(p, d, q, Keys(5), backend=backend, check="lazy")
    np.testing.assert_array_equal(r1.tokens, r2.tokens)
    np.testing.assert_array_equal(r1.accepted, r2.accepted)
    bad = p.copy()
    bad[1, 2, :] *= 0.5  # an unread row (after the last draft) still fails on the host
    with pytest.raises(ValueError, match=r"target: row 1: .*\[status 11\]"):
        dyadic.verify(bad, d, q, Keys(5), backend=backend)
    r3 = dyadic.verify(bad, d, q, Keys(5), backend=backend, check="lazy")
    assert r3.status.tolist() == [0, 11]
    assert r3.accepted[1] == 0 and (r3.tokens[1] == -1).all()
    np.testing.assert_array_equal(r3.tokens[0], r1.tokens[0])


def test_dyadic_construction_rules():
    ok = np.array([[TOTAL // 2, TOTAL // 2, 0]], np.uint32)
    dyadic.Dyadic(ok)
    with pytest.raises(TypeError, match="counts: dtype int64; expected uint32"):
        dyadic.Dyadic(ok.astype(np.int64))
    with pytest.raises(ValueError, match=r"counts: row 1: counts must sum to exactly 2\*\*24"):
        dyadic.Dyadic(np.array([[TOTAL, 0], [TOTAL, 1]], np.uint32))
    ids = np.array([[3, 7, -1]], np.int32)
    dyadic.Dyadic(ok, ids, vocab_size=8)
    with pytest.raises(ValueError, match="vocab_size: required for sparse rows"):
        dyadic.Dyadic(ok, ids)
    cases = [
        (np.array([[3, 8, -1]], np.int32), r"ids: row 0: ids must be in \[0, 8\) or -1"),
        (np.array([[7, 3, -1]], np.int32), "ids: row 0: valid ids must be strictly ascending"),
        (np.array([[3, 3, -1]], np.int32), "ids: row 0: valid ids must be strictly ascending"),
        (np.array([[3, -1, 5]], np.int32), r"ids: row 0: padding \(-1\) must come after"),
        (np.array([[-2, 3, 5]], np.int32), r"ids: row 0: ids must be in \[0, 8\) or -1"),
    ]
    for bad_ids, msg in cases:
        with pytest.raises(ValueError, match=msg):
            dyadic.Dyadic(ok, bad_ids, vocab_size=8)
    with pytest.raises(ValueError, match="counts: row 0: padding entries must have count 0"):
        dyadic.Dyadic(np.array([[TOTAL // 2, 0, TOTAL // 2]], np.uint32), ids, vocab_size=8)
    with pytest.raises(ValueError, match="counts: dense width 3 != vocab_size 4"):
        dyadic.Dyadic(ok, vocab_size=4)
    with pytest.raises(ValueError, match="policy: unknown policy"):
        dyadic.Dyadic(ok, policy="nope")
    assert dyadic.Dyadic(ok, policy="external").semantic_id == "dyadic24-external"


def test_draw_needs_dyadic():
    with pytest.raises(TypeError, match="q: expected a dyadic.Dyadic"):
        dyadic.draw(np.ones((1, 3), np.uint32), Keys(1), backend="reference")


def test_dtype_messages_do_not_depend_on_the_array_library():
    """The same text for NumPy and torch inputs, so every backend (CPU or device
    path) raises the same message (found by dyadic.fuzz on the H200)."""
    torch = pytest.importorskip("torch")
    msgs = []
    for x in (np.ones((1, 3), np.float64), torch.ones(1, 3, dtype=torch.float64)):
        with pytest.raises(TypeError) as err:
            dyadic.allocate(x, backend="reference")
        msgs.append(str(err.value))
    assert msgs[0] == msgs[1] == ("x: dtype float64 not supported; expected float32, float16 "
                                  "or bfloat16 (convert explicitly: dyadic never rounds inputs)")


def test_default_runners_check_device_key_fields():
    """The backend runners' defaults (numba's on GPU arrays) take device key fields of
    4- or 8-byte integers (another shape as a 1-D view; the kernel methods check the
    length) and NumPy fields as they are; other dtypes raise, naming the field."""
    torch = pytest.importorskip("torch")
    from dyadic._backend import device_keys
    good = [torch.zeros(3, dtype=dt) for dt in (torch.int64, torch.int32, torch.uint32,
                                                torch.uint64)]
    assert all(a is b for a, b in zip(device_keys(good), good))
    host = np.zeros(3, np.uint64)
    assert device_keys([host] + good[1:])[0] is host
    flat = device_keys([torch.zeros((3, 1), dtype=torch.int64)] + good[1:])[0]
    assert tuple(flat.shape) == (3,)
    for j, dt, name in ((0, torch.float32, "float32"), (2, torch.int16, "int16"),
                        (3, torch.bool, "bool")):
        bad = list(good)
        bad[j] = torch.zeros(3, dtype=dt)
        field = ("seed", "generation", "round", "position")[j]
        with pytest.raises(TypeError, match=f"keys.{field}: dtype {name} is not supported"):
            device_keys(bad)
