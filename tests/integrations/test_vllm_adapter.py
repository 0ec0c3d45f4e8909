"""dyadic.integrations.vllm.rejection_sample: vLLM's rejection-sampler cases restated.

Greedy requests give the exact tokens vLLM's own tests expect (perfect match, early
mismatch, several sequences of different lengths, a single draft, no drafts, several
mismatches, masked logits).  Random requests give, bit for bit, ``dyadic.verify`` on
the padded batch; a request's output does not depend on the other requests or on its
index; certain and impossible acceptances give their exact tokens; top-k / top-p /
min-p never emit a token outside the processed target's support; and the first token
follows the exact processed target.  Errors: float draft probabilities are refused
with the reason, inconsistent lengths and shapes name the argument.
"""

from fractions import Fraction

import numpy as np
import pytest

import dyadic
from dyadic import _backend
from dyadic.integrations.vllm import PLACEHOLDER_TOKEN_ID, rejection_sample

V = 37


@pytest.fixture(params=["cpu", "reference"])
def backend(request):
    try:
        _backend.get(request.param)
    except Exception as exc:  # noqa: BLE001 - the reason becomes the skip message
        pytest.skip(f"backend {request.param!r} unavailable: {exc}")
    return request.param


def greedy_logits(output_tokens, v=100, override=None):
    """[N + B, v] logits, request by request, whose row j argmax is output_tokens[b][j]
    (the n_b draft rows, then the bonus row); ``override`` gets 99 in every row."""
    rows = [t for tokens in output_tokens for t in tokens]
    x = np.full((len(rows), v), -100.0, np.float32)
    x[np.arange(len(rows)), rows] = 100.0
    if override is not None:
        x[:, override] = 99.0
    return x


def flat(spec_tokens):
    return np.array([t for s in spec_tokens for t in s], np.int64), [len(s) for s in spec_tokens]


def keys_for(b, seed0=11):
    return dyadic.Keys(seed=np.arange(seed0, seed0 + b, dtype=np.uint64) * 7919,
                       position=np.arange(b, dtype=np.uint32) * 5 + 3)


def run_greedy(backend, spec_tokens, output_tokens, **kw):
    ids, n = flat(spec_tokens)
    logits = greedy_logits(output_tokens, override=kw.pop("override", None))
    return rejection_sample(draft_token_ids=ids, num_draft_tokens=n, target_logits=logits,
                            draft_probs=None, keys=keys_for(len(n)), temperature=0.0,
                            backend=backend, **kw)


P = PLACEHOLDER_TOKEN_ID


@pytest.mark.parametrize("spec_tokens,output_tokens,expected", [
    ([[1, 2, 3]], [[1, 2, 3, 4]], [[1, 2, 3, 4]]),  # perfect match, bonus 4
    ([[1, 2, 3]], [[1, 5, 3, 4]], [[1, 5, P, P]]),  # early mismatch
    ([[1, 2], [3]], [[1, 2, 5], [3, 4]], [[1, 2, 5], [3, 4, P]]),  # lengths 2 and 1
    ([[1]], [[1, 2]], [[1, 2]]),  # single draft
    ([[]], [[5]], [[5]]),  # no drafts: the bonus only
    ([[1, 2, 3], [4, 5, 6]], [[1, 2, 7, 6], [4, 8, 6, 9]], [[1, 2, 7, P], [4, 8, P, P]]),
    ([[1, 2]], [[1, 2, 3]], [[1, 2, 3]]),
    ([[1]], [[2, 3]], [[2, P]]),  # first mismatch
    ([[1, 2], [3, 4]], [[1, 5, 6], [3, 4, 7]], [[1, 5, P], [3, 4, 7]]),
    ([[1, 1, 1], [], [1, 1, 1]], [[1, 1, 1, 1], [7], [1, 1, 1, 1]],
     [[1, 1, 1, 1], [7, P, P, P], [1, 1, 1, 1]]),  # an empty request between two
])
def test_greedy_cases(backend, spec_tokens, output_tokens, expected):
    got = run_greedy(backend, spec_tokens, output_tokens)
    assert got.dtype == np.int32
    assert got.tolist() == expected


def test_greedy_allowed_token_ids_as_masked_logits(backend):
    """vLLM's allowed-token-ids processor runs before the call: disallowed logits are
    -inf, and the greedy argmax moves to the next allowed token (15, at 99)."""
    spec = [[1, 2, 10], [10, 5, 3], [7, 10, 12]]
    out = [[1, 2, 10, 5], [10, 5, 10, 5], [7, 10, 12, 5]]
    ids, n = flat(spec)
    logits = greedy_logits(out, override=15)
    owner = np.repeat(np.arange(3), np.array(n) + 1)
    logits[owner == 0, 0:5] = -np.inf  # request 0 may not emit 0..4
    logits[owner == 1, 11:16] = -np.inf  # request 1 may not emit 11..15
    got = rejection_sample(draft_token_ids=ids, num_draft_tokens=n, target_logits=logits,
                           draft_probs=None, keys=keys_for(3), temperature=0.0, backend=backend)
    assert got.tolist() == [[15, P, P, P], [10, 5, 10, P], [7, 10, 12, 5]]


def test_greedy_wider_output_and_cu_layout(backend):
    """max_spec_len above max(n) pads with -1; cu_num_draft_tokens alone (vLLM's
    tensor) gives the same result as num_draft_tokens."""
    spec, out = [[1, 2], [3]], [[1, 2, 5], [3, 4]]
    ids, n = flat(spec)
    logits = greedy_logits(out)
    got = rejection_sample(draft_token_ids=ids, cu_num_draft_tokens=np.cumsum(n).astype(np.int32),
                           target_logits=logits, draft_probs=None, keys=keys_for(2),
                           temperature=0.0, max_spec_len=4, backend=backend)
    assert got.tolist() == [[1, 2, 5, P, P], [3, 4, P, P, P]]


# ----------------------------------------------------------------- random requests

def draft_with_dyadic(rng, n, backend, top_k=None, keys=None):
    """Drafts drawn as a drafter would: dyadic.propose on drafter logits, one row per
    flat draft, keyed by (request seed, position + j).  Returns (ids [N], q Dyadic (N,))."""
    b = len(n)
    keys = keys or keys_for(b)
    owner = np.repeat(np.arange(b), n)
    j = np.arange(int(np.sum(n))) - np.repeat(np.cumsum(n) - n, n)
    row_keys = dyadic.Keys(seed=np.asarray(keys.seed)[owner],
                           position=(np.asarray(keys.position)[owner] + j).astype(np.uint32))
    drafter = (rng.standard_normal((len(owner), V)) * 2).astype(np.float32)
    return dyadic.propose(drafter, row_keys, top_k=top_k, backend=backend)


def padded(n, ids, target, q, k):
    """The padded form built row by row: draft [B, k], target [B, k+1, V], q (B, k)
    (padding q rows: the point mass at id 0)."""
    b = len(n)
    draft = np.zeros((b, k), np.int64)
    tgt = np.zeros((b, k + 1, V), np.float32)
    counts, qids = q.counts, q.ids
    w = counts.shape[-1]
    qc = np.zeros((b, k, w), np.uint32)
    qc[..., 0] = dyadic.TOTAL
    qi = None
    if qids is not None:
        qi = np.full((b, k, w), -1, np.int32)
        qi[..., 0] = 0
    d = t = 0
    for r, nb in enumerate(n):
        draft[r, :nb] = ids[d:d + nb]
        tgt[r, :nb + 1] = target[t:t + nb + 1]
        qc[r, :nb] = counts[d:d + nb]
        if qi is not None:
            qi[r, :nb] = qids[d:d + nb]
        d, t = d + nb, t + nb + 1
    return draft, tgt, dyadic.Dyadic(qc, qi, vocab_size=V)


def random_batch(rng, n, backend, top_k=None):
    ids, q = draft_with_dyadic(rng, n, backend, top_k=top_k)
    target = (rng.standard_normal((int(np.sum(n)) + len(n), V)) * 2).astype(np.float32)
    return ids, q, target


PARAMS = dict(temperature=np.array([1.0, 0.0, 0.7, 1.3, 0.0, 1.0]),
              top_k=np.array([0, 0, 5, 0, 3, 36]),
              top_p=np.array([1.0, 1.0, 0.9, 0.6, 1.0, 1.0], np.float32),
              min_p=np.array([0.0, 0.0, 0.0, 0.05, 0.0, 0.2], np.float32))


@pytest.mark.parametrize("q_kind", ["dense", "sparse", "point-mass"])
def test_random_equals_padded_verify(backend, q_kind):
    """Mixed greedy (temperature 0) and random requests of lengths 3, 0, 4, 1, 2, 4,
    drafts from a recorded dense or sparse q or point masses (n-gram: draft_probs
    None): the adapter is verify(num_drafts=n, logits=True) on the padded batch, bit
    for bit; greedy requests emit the argmax chain."""
    rng = np.random.default_rng(5)
    n = [3, 0, 4, 1, 2, 4]
    ids, q, target = random_batch(rng, n, backend, top_k=8 if q_kind == "sparse" else None)
    k = max(n)
    got = rejection_sample(draft_token_ids=ids, num_draft_tokens=n, target_logits=target,
                           draft_probs=None if q_kind == "point-mass" else q,
                           keys=keys_for(6), backend=backend, **PARAMS)
    draft, tgt, qp = padded(n, ids, target, q, k)
    if q_kind == "point-mass":
        qp = None
    want = dyadic.verify(tgt, draft, qp, keys_for(6), num_drafts=np.array(n), logits=True,
                         backend=backend, **PARAMS)
    assert np.array_equal(got, want.tokens)
    for r in (1, 4):  # greedy: accept while the draft is the argmax, then emit the argmax
        arg = tgt[r].argmax(axis=-1)
        a = 0
        while a < n[r] and draft[r, a] == arg[a]:
            a += 1
        assert got[r].tolist() == list(draft[r, :a]) + [arg[a]] + [P] * (k - a)
    # the padded q (B, k) and the split target layout give the same tokens
    split = rejection_sample(draft_token_ids=ids, num_draft_tokens=n, draft_probs=qp,
                             target_logits=np.delete(target, np.cumsum(np.array(n) + 1) - 1, 0),
                             bonus_logits=target[np.cumsum(np.array(n) + 1) - 1],
                             keys=keys_for(6), backend=backend, **PARAMS)
    assert np.array_equal(split, got)


def test_random_request_independent_of_batch(backend):
    """Each request alone (B = 1) and the batch reversed give the same rows: nothing
    depends on the other requests or on the request's index."""
    rng = np.random.default_rng(6)
    n = [2, 4, 0, 3]
    ids, q, target = random_batch(rng, n, backend)
    keys = keys_for(4)
    temp = np.array([1.0, 0.9, 1.0, 1.2])
    got = rejection_sample(draft_token_ids=ids, num_draft_tokens=n, target_logits=target,
                           draft_probs=q, keys=keys, temperature=temp, backend=backend)
    starts, tstarts = np.cumsum(n) - n, np.cumsum(np.array(n) + 1) - np.array(n) - 1
    seeds, pos = np.asarray(keys.seed), np.asarray(keys.position)
    for r in range(4):
        alone = rejection_sample(
            draft_token_ids=ids[starts[r]:starts[r] + n[r]], num_draft_tokens=[n[r]],
            target_logits=target[tstarts[r]:tstarts[r] + n[r] + 1],
            draft_probs=q[starts[r]:starts[r] + n[r]],
            keys=dyadic.Keys(seed=seeds[r:r + 1], position=pos[r:r + 1]),
            temperature=temp[r], max_spec_len=max(n), backend=backend)
        assert np.array_equal(alone[0], got[r])
    order = [3, 2, 1, 0]
    rev_ids = np.concatenate([ids[starts[r]:starts[r] + n[r]] for r in order])
    rev_target = np.concatenate([target[tstarts[r]:tstarts[r] + n[r] + 1] for r in order])
    rev_q = dyadic.stack([q[int(starts[r]) + j] for r in order for j in range(n[r])])
    rev = rejection_sample(draft_token_ids=rev_ids, num_draft_tokens=[n[r] for r in order],
                           target_logits=rev_target, draft_probs=rev_q,
                           keys=dyadic.Keys(seed=seeds[order], position=pos[order]),
                           temperature=temp[order], backend=backend)
    assert np.array_equal(rev, got[order])


def test_seeded_requests_are_deterministic(backend):
    """Same inputs, same tokens; a new seed for request 1 leaves requests 0 and 2 as
    they were."""
    rng = np.random.default_rng(7)
    n = [3, 3, 3]
    ids, q, target = random_batch(rng, n, backend)
    args = dict(draft_token_ids=ids, num_draft_tokens=n, target_logits=target, draft_probs=q,
                temperature=1.0, backend=backend)
    first = rejection_sample(keys=keys_for(3), **args)
    assert np.array_equal(rejection_sample(keys=keys_for(3), **args), first)
    k = keys_for(3)
    other = dyadic.Keys(seed=np.asarray(k.seed) + np.array([0, 1, 0], np.uint64),
                        position=k.position)
    again = rejection_sample(keys=other, **args)
    assert np.array_equal(again[[0, 2]], first[[0, 2]])


def test_certain_and_impossible_acceptance(backend):
    """Point-mass drafts (q None) against targets with one finite logit: a draft the
    target gives probability 1 is always accepted and the bonus is the bonus row's only
    token; a draft at -inf is always rejected and the recovered token is the row's only
    token.  Temperature 1, so the random path decides."""
    n, bonus = [3, 2], [9, 4]
    ids = np.array([5, 6, 7, 8, 1])
    x = np.full((7, V), -np.inf, np.float32)
    x[[0, 1, 2, 3], [5, 6, 7, 9]] = 0.0  # request 0: drafts certain, bonus 9
    x[4, 20] = 1.5  # request 1: draft 8 impossible at row 0, recovered 20
    x[5, 1] = 0.0
    x[6, 4] = 0.0
    for seed0 in (1, 2, 3):
        got = rejection_sample(draft_token_ids=ids, num_draft_tokens=n, target_logits=x,
                               draft_probs=None, keys=keys_for(2, seed0), temperature=1.0,
                               backend=backend)
        assert got.tolist() == [[5, 6, 7, bonus[0]], [20, P, P, P]]


def test_recorded_q_with_point_mass_target(backend):
    """Drafts drawn with dyadic.propose: a target that puts all mass on the drawn draft
    accepts it whatever q(d) was; one that puts all mass elsewhere emits that token."""
    rng = np.random.default_rng(8)
    n = [2, 2]
    ids, q = draft_with_dyadic(rng, n, backend)
    x = np.full((6, V), -np.inf, np.float32)
    x[[0, 1], ids[:2]] = 0.0  # request 0 accepts both drafts
    x[2, 30] = 0.0  # its bonus row
    other = (ids[2] + 1) % V
    x[3, other] = 0.0  # request 1 rejects its first draft
    x[4:6, 0] = 0.0
    got = rejection_sample(draft_token_ids=ids, num_draft_tokens=n, target_logits=x,
                           draft_probs=q, keys=keys_for(2), temperature=1.0, backend=backend)
    assert got.tolist() == [[ids[0], ids[1], 30], [other, P, P]]


@pytest.mark.parametrize("filters", [dict(top_k=np.array([1, 5, 36, 5])),
                                     dict(top_p=np.float32(0.6)),
                                     dict(min_p=np.float32(0.3), top_k=4)])
def test_filters_never_emit_outside_the_processed_target(backend, filters):
    """vLLM's top-k / top-p tests: every emitted token (accepted draft, recovered or
    bonus) has probability > 0 under the exact processed target of its row."""
    rng = np.random.default_rng(9)
    n = [3, 3, 2, 3]
    ids, q, target = random_batch(rng, n, backend)
    got = rejection_sample(draft_token_ids=ids, num_draft_tokens=n, target_logits=target,
                           draft_probs=q, keys=keys_for(4), temperature=1.0, backend=backend,
                           **filters)
    t = 0
    for r, nb in enumerate(n):
        kw = {name: (val[r] if np.ndim(val) else val) for name, val in filters.items()}
        for j in range(nb + 1):
            tok = int(got[r, j])
            if tok == P:
                break
            p = dyadic.reference.logits_target_distribution(
                [float(v) for v in target[t + j]], **{a: (float(b) if a != "top_k" else int(b))
                                                      for a, b in kw.items()})
            assert p[tok] > 0, (r, j, tok)
        t += nb + 1


def test_first_token_follows_the_processed_target():
    """3000 requests of one draft each, drafts drawn from a recorded q: the first
    emitted token's frequencies match the exact processed target (chi-square, 3 degrees
    of freedom, threshold at p = 0.001; fixed seeds, so the outcome is deterministic)."""
    try:
        _backend.get("cpu")
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"backend 'cpu' unavailable: {exc}")
    b, v = 3000, 5
    drafter = np.array([[0.3, -1.0, 1.2, 0.0, 0.5]], np.float32).repeat(b, 0)
    keys = dyadic.Keys(seed=np.arange(b, dtype=np.uint64) + 1000, position=17)
    ids, q = dyadic.propose(drafter, keys, top_k=None)
    row = np.array([1.0, 0.2, -0.5, 0.9, -2.0], np.float32)
    target = np.tile(row, (2 * b, 1))
    got = rejection_sample(draft_token_ids=ids, num_draft_tokens=np.ones(b, np.int64),
                           target_logits=target, draft_probs=q, keys=keys, temperature=0.8,
                           top_k=4)
    p = dyadic.reference.logits_target_distribution([float(x) for x in row], temperature=0.8,
                                                    top_k=4)
    assert p[4] == 0 and sum(p) == Fraction(1)
    counts = np.bincount(got[:, 0], minlength=v)
    assert counts[4] == 0
    expected = np.array([float(x) for x in p[:4]]) * b
    chi2 = float((((counts[:4] - expected) ** 2) / expected).sum())
    assert chi2 < 16.27, (counts, expected)


def test_torch_inputs(backend):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(10)
    n = [2, 0, 3]
    ids, q, target = random_batch(rng, n, backend)
    want = rejection_sample(draft_token_ids=ids, num_draft_tokens=n, target_logits=target,
                            draft_probs=q, keys=keys_for(3), temperature=1.0, backend=backend)
    got = rejection_sample(draft_token_ids=torch.from_numpy(ids).to(torch.int32),
                           cu_num_draft_tokens=torch.tensor(np.cumsum(n), dtype=torch.int32),
                           target_logits=torch.from_numpy(target), draft_probs=q,
                           keys=keys_for(3), temperature=torch.ones(3), backend=backend)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.int32
    assert np.array_equal(got.numpy(), want)


def test_bfloat16_torch_logits_and_preallocated_output(backend):
    """vLLM's bfloat16 logits give the tokens of their exact float32 values; a
    preallocated ``out["tokens"]`` (vLLM's output buffer) is written and returned."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(13)
    n = [1, 3, 2]
    ids, q, target = random_batch(rng, n, backend)
    x = torch.from_numpy(target).to(torch.bfloat16)
    want = rejection_sample(draft_token_ids=ids, num_draft_tokens=n, draft_probs=q,
                            target_logits=x.float().numpy(), keys=keys_for(3),
                            temperature=0.9, backend=backend)
    buf = torch.full((3, 4), 7, dtype=torch.int32)
    got = rejection_sample(draft_token_ids=torch.from_numpy(ids), num_draft_tokens=n,
                           draft_probs=q, target_logits=x, keys=keys_for(3), temperature=0.9,
                           backend=backend, out={"tokens": buf})
    assert got is buf
    assert np.array_equal(buf.numpy(), want)


def test_check_false_fails_one_request_closed(backend):
    """A NaN in a used target row fails that request closed (row -1, status in out);
    the other requests are unchanged."""
    rng = np.random.default_rng(11)
    n = [2, 3, 1]
    ids, q, target = random_batch(rng, n, backend)
    args = dict(draft_token_ids=ids, num_draft_tokens=n, draft_probs=q, keys=keys_for(3),
                temperature=1.0, backend=backend)
    good = rejection_sample(target_logits=target, **args)
    bad = target.copy()
    bad[3, 4] = np.nan  # request 1, row 0
    status = np.empty(3, np.int32)
    got = rejection_sample(target_logits=bad, check=False, out={"status": status}, **args)
    assert got[1].tolist() == [P] * 4 and status[1] != 0
    assert np.array_equal(got[[0, 2]], good[[0, 2]]) and status[0] == status[2] == 0
    with pytest.raises(ValueError, match="row 1"):
        rejection_sample(target_logits=bad, **args)


# ----------------------------------------------------------------- errors

def base_args():
    ids, n = flat([[1, 2], [3]])
    return dict(draft_token_ids=ids, num_draft_tokens=n,
                target_logits=greedy_logits([[1, 2, 5], [3, 4]], v=V), draft_probs=None,
                keys=keys_for(2), temperature=1.0)


def test_float_draft_probs_refused():
    torch = pytest.importorskip("torch")
    probs = np.full((3, V), 1.0 / V, np.float32)
    for fp in (probs, torch.from_numpy(probs), probs.astype(np.float64)):
        with pytest.raises(TypeError, match="draft_probs: float draft probabilities are "
                                            "refused.*different q.*dyadic.propose"):
            rejection_sample(**{**base_args(), "draft_probs": fp})
    with pytest.raises(TypeError, match="draft_probs: expected a dyadic.Dyadic"):
        rejection_sample(**{**base_args(), "draft_probs": np.zeros((3, V), np.uint32)})


@pytest.mark.parametrize("change,exc,match", [
    (dict(num_draft_tokens=[2, 2]), ValueError, "draft_token_ids: length 3 must equal .* 4"),
    (dict(num_draft_tokens=[2, -1]), ValueError, "num_draft_tokens: row 1: .* >= 0"),
    (dict(cu_num_draft_tokens=np.array([2, 4])), ValueError,
     "cu_num_draft_tokens: row 1: does not match num_draft_tokens"),
    (dict(num_draft_tokens=None, cu_num_draft_tokens=np.array([3, 2])), ValueError,
     "cu_num_draft_tokens: row 1: .*non-decreasing"),
    (dict(num_draft_tokens=None), TypeError, "give at least one"),
    (dict(num_draft_tokens=np.array([2.0, 1.0])), TypeError, "not an integer dtype"),
    (dict(max_spec_len=1), ValueError, "num_draft_tokens: row 0: .* max_spec_len = 1"),
    (dict(target_logits=np.zeros((4, V), np.float32)), ValueError,
     "target_logits: 4 rows, expected N \\+ B = 3 \\+ 2 = 5"),
    (dict(target_logits=np.zeros((5, 2, V), np.float32)), ValueError, "target_logits: expected"),
    (dict(bonus_logits=np.zeros((2, V), np.float32)), ValueError,
     "target_logits: 5 rows, expected N = 3"),
    (dict(temperature=None), TypeError, "temperature: required"),
    (dict(draft_token_ids=np.array([[1, 2, 3]])), ValueError, "draft_token_ids: expected a 1-D"),
    (dict(draft_token_ids=np.array([1, V, 3])), ValueError, "draft: row 0"),
])
def test_layout_errors(change, exc, match):
    with pytest.raises(exc, match=match):
        rejection_sample(**{**base_args(), **change})


def test_bonus_logits_shape_and_dtype_errors():
    args = base_args()
    x = args.pop("target_logits")
    draft_rows = x[[0, 1, 3]]
    with pytest.raises(ValueError, match=r"bonus_logits: shape \(3, 37\) must be \(B, V\)"):
        rejection_sample(target_logits=draft_rows, bonus_logits=x[[2, 4, 4]], **args)
    with pytest.raises(TypeError, match="bonus_logits: dtype float16"):
        rejection_sample(target_logits=draft_rows, bonus_logits=x[[2, 4]].astype(np.float16),
                         **args)


def test_draft_q_shape_errors():
    rng = np.random.default_rng(12)
    args = base_args()
    _, q4 = draft_with_dyadic(rng, [2, 2], "reference")  # 4 rows for 3 drafts
    with pytest.raises(ValueError, match=r"draft_probs: batch shape \(4,\) must be \(N,\) = "
                                         r"\(3,\)"):
        rejection_sample(**{**args, "draft_probs": q4})
    padded_q = dyadic.stack([q4[0:3], q4[1:4]])  # (2, 3) but max_spec_len is 2
    with pytest.raises(ValueError, match=r"draft_probs: batch shape \(2, 3\)"):
        rejection_sample(**{**args, "draft_probs": padded_q, "max_spec_len": 2})


def test_import_is_light():
    """The adapter imports neither vLLM nor torch nor a GPU library."""
    import subprocess
    import sys
    code = ("import sys, dyadic.integrations.vllm; "
            "bad = [m for m in ('vllm', 'torch', 'cupy', 'numba') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_padded_q_width_bounds_the_drafts():
    """Without max_spec_len the width of a padded q is the output width: a request
    with more drafts raises naming it."""
    rng = np.random.default_rng(14)
    _, q4 = draft_with_dyadic(rng, [2, 2], "reference")
    narrow = dyadic.stack([q4[0:2]], axis=1)  # (2, 1)
    with pytest.raises(ValueError, match=r"num_draft_tokens: row 0: .* max_spec_len = 1 "
                                         r"\(the padded width of draft_probs\)"):
        rejection_sample(**{**base_args(), "draft_probs": narrow})
