"""dyadic.integrations.vllm.rejection_sample on CUDA tensors with backend "cuda": the
output is an int32 CUDA tensor on target_logits' device, bit for bit the tokens of
backend "cpu" on the same inputs held on the host.  Cases: ragged counts with zeros
(vLLM's CUDA cu_num_draft_tokens), greedy requests among sampled ones, per-request
top-k / top-p / min-p as CUDA tensors, draft distributions on the device (flat and
padded, dense and sparse) or None, float16 / bfloat16 logits, bonus rows apart, host
inputs next to CUDA logits, a preallocated output, a draft id out of range failing
its request closed (check=False; check=True raises as on the host), a 129280-token
vocabulary; inputs on the wrong side raise TypeError naming the argument.  Skipped
without a GPU."""

import numpy as np
import pytest

import dyadic
from dyadic import _status, ragged
from dyadic.integrations.vllm import PLACEHOLDER_TOKEN_ID, rejection_sample

from conftest import cuda_torch

pytestmark = pytest.mark.gpu

V = 1000
N_DRAFTS = [3, 0, 4, 1, 0, 2]  # ragged, with requests without drafts
PARAMS = dict(temperature=np.array([1.0, 0.0, 0.7, 1.3, 0.0, 1.0], np.float32),
              top_k=np.array([0, 0, 50, 0, 3, 900], np.int32),
              top_p=np.array([1.0, 1.0, 0.9, 0.6, 1.0, 1.0], np.float32),
              min_p=np.array([0.0, 0.0, 0.0, 0.05, 0.0, 0.01], np.float32))


@pytest.fixture(scope="module")
def torch():
    return cuda_torch()


def request_keys(b):
    return dyadic.Keys(seed=np.arange(b, dtype=np.uint64) * 7919 + 5, generation=1, round=2,
                       position=(np.arange(b) * 5 + 3).astype(np.uint32))


def flat_drafts(rng, n, v, keys, top_k):
    """Drafts as a drafter draws them: ``dyadic.propose`` (backend "cpu") on drafter
    logits, one row per flat draft, draft i of request b at ``position + i``.  Returns
    (ids int64 [N], q Dyadic (N,)) on the host; every draft has q(d) > 0."""
    owner = np.repeat(np.arange(len(n)), n)
    j = np.arange(int(np.sum(n))) - np.repeat(np.cumsum(n) - n, n)
    row_keys = dyadic.Keys(seed=np.asarray(keys.seed)[owner], generation=1, round=2,
                           position=(np.asarray(keys.position)[owner] + j).astype(np.uint32))
    drafter = (rng.standard_normal((len(owner), v)) * 2).astype(np.float32)
    ids, q = dyadic.propose(drafter, row_keys, top_k=top_k, backend="cpu")
    return ids.astype(np.int64), q


def batch(rng, n=N_DRAFTS, v=V, top_k=None):
    """A vLLM batch on the host: ids [N], q (N,), logits [N + B, V], keys."""
    keys = request_keys(len(n))
    ids, q = flat_drafts(rng, n, v, keys, top_k)
    logits = (rng.standard_normal((int(np.sum(n)) + len(n), v)) * 2).astype(np.float32)
    return ids, q, logits, keys


def gpu(torch, x):
    """A host value as CUDA tensors: NumPy arrays, a Dyadic's counts / ids (through
    ``dyadic.Dyadic``), a Keys' fields (int64 seed, int32 others)."""
    if isinstance(x, dyadic.Dyadic):
        ids = None if x.ids is None else torch.from_numpy(np.array(x.ids)).cuda()
        return dyadic.Dyadic(torch.from_numpy(np.array(x.counts)).cuda(), ids,
                             vocab_size=x.vocab_size)
    if isinstance(x, dyadic.Keys):
        b = np.asarray(x.seed).shape[0]
        fields = [np.broadcast_to(np.asarray(f), (b,)) for f in
                  (x.seed, x.generation, x.round, x.position)]
        return dyadic.Keys(*[torch.from_numpy(f.astype(np.int64 if i == 0 else np.int32)).cuda()
                             for i, f in enumerate(fields)])
    return torch.from_numpy(np.ascontiguousarray(x)).cuda()


def cpu_tokens(**kw):
    return rejection_sample(backend="cpu", **kw)


def assert_same(torch, got, want, device):
    assert isinstance(got, torch.Tensor) and got.dtype == torch.int32
    assert got.device == device
    np.testing.assert_array_equal(got.cpu().numpy(), np.asarray(want))


@pytest.mark.parametrize("q_kind", ["flat dense", "flat sparse", "padded dense",
                                    "padded sparse", "none"])
def test_ragged_batch_matches_cpu(torch, q_kind):
    """Every input on the GPU (vLLM's CUDA cu_num_draft_tokens, parameters and key
    fields as CUDA tensors [B]): the tokens of backend "cpu" on the host inputs.  A
    padded q of width 5 sets the output width (max(n) is 4)."""
    rng = np.random.default_rng(1)
    ids, q, logits, keys = batch(rng, top_k=40 if "sparse" in q_kind else None)
    if q_kind.startswith("padded"):
        q = ragged.pad_q(q, np.cumsum(N_DRAFTS), 5)
    elif q_kind == "none":
        q = None
    host = dict(draft_token_ids=ids, num_draft_tokens=N_DRAFTS, target_logits=logits,
                draft_probs=q, keys=keys, **PARAMS)
    want = cpu_tokens(**host)
    x = gpu(torch, logits)
    got = rejection_sample(
        draft_token_ids=gpu(torch, ids.astype(np.int32)),
        cu_num_draft_tokens=gpu(torch, np.cumsum(N_DRAFTS).astype(np.int32)),
        target_logits=x, draft_probs=None if q is None else gpu(torch, q),
        keys=gpu(torch, keys), backend="cuda",
        **{name: gpu(torch, value) for name, value in PARAMS.items()})
    assert_same(torch, got, want, x.device)
    assert got.shape[1] == (6 if q_kind.startswith("padded") else 5)
    assert (got[:, 0] != PLACEHOLDER_TOKEN_ID).all()  # every request emits a token


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_logits_unchecked_with_status(torch, dtype):
    """float16 / bfloat16 logits on the GPU with check=False and preallocated CUDA
    tokens and status: the tokens and status of backend "cpu" on the same logits (torch
    CPU tensors of that dtype); a valid batch has status 0."""
    rng = np.random.default_rng(2)
    ids, q, logits, keys = batch(rng, top_k=64)
    x = gpu(torch, logits).to(getattr(torch, dtype))
    b, width = len(N_DRAFTS), max(N_DRAFTS) + 1
    host_status = np.full(b, 7, np.int32)
    want = rejection_sample(draft_token_ids=ids, num_draft_tokens=N_DRAFTS,
                            target_logits=x.cpu(), draft_probs=q, keys=keys, backend="cpu",
                            check=False, out={"status": host_status}, **PARAMS)
    tokens = torch.full((b, width), 7, dtype=torch.int32, device=x.device)
    status = torch.full((b,), 7, dtype=torch.int32, device=x.device)
    got = rejection_sample(draft_token_ids=gpu(torch, ids), num_draft_tokens=N_DRAFTS,
                           target_logits=x, draft_probs=gpu(torch, q), keys=gpu(torch, keys),
                           backend="cuda", check=False,
                           out={"tokens": tokens, "status": status},
                           **{name: gpu(torch, value) for name, value in PARAMS.items()})
    assert got is tokens
    assert_same(torch, got, want, x.device)
    np.testing.assert_array_equal(status.cpu().numpy(), host_status)
    assert (host_status == 0).all()


def test_bonus_rows_apart(torch):
    """vLLM's split layout on the GPU (draft rows [N, V], bonus rows [B, V]) gives the
    tokens of the joint layout on the CPU."""
    rng = np.random.default_rng(3)
    ids, q, logits, keys = batch(rng)
    bonus_rows = np.cumsum(np.array(N_DRAFTS) + 1) - 1
    want = cpu_tokens(draft_token_ids=ids, num_draft_tokens=N_DRAFTS, target_logits=logits,
                      draft_probs=q, keys=keys, **PARAMS)
    x = gpu(torch, np.delete(logits, bonus_rows, 0))
    got = rejection_sample(draft_token_ids=gpu(torch, ids), num_draft_tokens=N_DRAFTS,
                           target_logits=x, bonus_logits=gpu(torch, logits[bonus_rows]),
                           draft_probs=gpu(torch, q), keys=gpu(torch, keys), backend="cuda",
                           **{name: gpu(torch, value) for name, value in PARAMS.items()})
    assert_same(torch, got, want, x.device)


def test_host_inputs_next_to_cuda_logits(torch):
    """Only the logits on the GPU: host draft ids, q, counts list, NumPy parameters,
    scalar top_p and NumPy keys are copied to the device; the tokens are the CPU's."""
    rng = np.random.default_rng(4)
    ids, q, logits, keys = batch(rng, top_k=32)
    params = dict(PARAMS, top_p=0.95)
    want = cpu_tokens(draft_token_ids=ids, num_draft_tokens=N_DRAFTS, target_logits=logits,
                      draft_probs=q, keys=keys, **params)
    x = gpu(torch, logits)
    got = rejection_sample(draft_token_ids=ids, num_draft_tokens=N_DRAFTS, target_logits=x,
                           draft_probs=q, keys=keys, backend="cuda", **params)
    assert_same(torch, got, want, x.device)


def test_draft_out_of_range_fails_its_request_closed(torch):
    """Device draft ids are not clamped: with check=False a request holding an id >= V
    (a sampled request) or one that int32 cannot hold (a greedy request) fails closed
    with the CPU's status (DRAFT_OUT_OF_RANGE) and tokens -1; the other requests keep
    the tokens of the valid batch.  check=True raises the CPU's ValueError."""
    rng = np.random.default_rng(5)
    n = [2, 3, 0, 2]
    temperature = np.array([1.0, 0.0, 1.0, 0.8], np.float32)
    ids, q, logits, keys = batch(rng, n=n)
    bad = ids.copy()
    bad[1] = V  # request 0, draft 1
    bad[2] = 2 ** 40  # request 1 (greedy), draft 0
    x = gpu(torch, logits)
    gq, gkeys, gtemp = gpu(torch, q), gpu(torch, keys), gpu(torch, temperature)
    common = dict(num_draft_tokens=n, draft_probs=gq, keys=gkeys, temperature=gtemp,
                  backend="cuda")
    good = rejection_sample(draft_token_ids=gpu(torch, ids), target_logits=x, **common)
    host_status = np.empty(4, np.int32)
    want = cpu_tokens(draft_token_ids=bad, num_draft_tokens=n, target_logits=logits,
                      draft_probs=q, keys=keys, temperature=temperature, check=False,
                      out={"status": host_status})
    status = torch.empty(4, dtype=torch.int32, device=x.device)
    got = rejection_sample(draft_token_ids=gpu(torch, bad), target_logits=x, check=False,
                           out={"status": status}, **common)
    assert_same(torch, got, want, x.device)
    np.testing.assert_array_equal(status.cpu().numpy(), host_status)
    assert host_status.tolist() == [_status.DRAFT_OUT_OF_RANGE] * 2 + [0, 0]
    assert (got[:2] == PLACEHOLDER_TOKEN_ID).all()
    assert torch.equal(got[2:], good[2:])
    with pytest.raises(ValueError, match="draft: row 0: token ids must be in"):
        cpu_tokens(draft_token_ids=bad, num_draft_tokens=n, target_logits=logits,
                   draft_probs=q, keys=keys, temperature=temperature)
    with pytest.raises(ValueError, match="draft: row 0: token ids must be in"):
        rejection_sample(draft_token_ids=gpu(torch, bad), target_logits=x, **common)


def test_large_vocabulary(torch):
    """B = 4 at V = 129280, bfloat16 logits, sparse q: the CPU's tokens."""
    rng = np.random.default_rng(6)
    n, v = [2, 0, 3, 1], 129280
    ids, q, logits, keys = batch(rng, n=n, v=v, top_k=64)
    x = gpu(torch, logits).to(torch.bfloat16)
    params = dict(temperature=np.array([0.8, 0.0, 1.0, 1.2], np.float32),
                  top_k=np.array([0, 0, 1000, 50], np.int64),
                  top_p=np.array([1.0, 1.0, 0.95, 0.9], np.float32),
                  min_p=np.array([0.0, 0.0, 0.0, 0.001], np.float32))
    want = cpu_tokens(draft_token_ids=ids, num_draft_tokens=n, target_logits=x.cpu(),
                      draft_probs=q, keys=keys, **params)
    got = rejection_sample(draft_token_ids=gpu(torch, ids),
                           cu_num_draft_tokens=gpu(torch, np.cumsum(n)), target_logits=x,
                           draft_probs=gpu(torch, q), keys=gpu(torch, keys), backend="cuda",
                           **{name: gpu(torch, value) for name, value in params.items()})
    assert_same(torch, got, want, x.device)


def test_inputs_on_the_wrong_side_name_the_argument(torch):
    rng = np.random.default_rng(7)
    ids, q, logits, keys = batch(rng)
    x = gpu(torch, logits)
    args = dict(draft_token_ids=ids, num_draft_tokens=N_DRAFTS, target_logits=x,
                draft_probs=None, keys=keys, temperature=1.0, backend="cuda")
    with pytest.raises(TypeError, match="target_logits: a CUDA tensor needs backend 'cuda'"):
        rejection_sample(**{**args, "backend": "cpu"})
    bonus_rows = np.cumsum(np.array(N_DRAFTS) + 1) - 1
    with pytest.raises(TypeError, match="bonus_logits: on cpu"):
        rejection_sample(**{**args, "target_logits": gpu(torch, np.delete(logits, bonus_rows, 0)),
                            "bonus_logits": torch.from_numpy(logits[bonus_rows])})
    with pytest.raises(TypeError, match=r"out\['tokens'\]: expected a torch tensor on cuda"):
        rejection_sample(**args, out={"tokens": torch.zeros(6, 5, dtype=torch.int32)})
    host = {**args, "target_logits": logits, "backend": "cpu"}
    for name, value in (("draft_token_ids", gpu(torch, ids)),
                        ("temperature", gpu(torch, PARAMS["temperature"])),
                        ("draft_probs", gpu(torch, q))):
        with pytest.raises(TypeError, match=f"{name}: a CUDA array, but target_logits is "
                                            f"on the host"):
            rejection_sample(**{**host, name: value})
    with pytest.raises(ValueError, match="draft_token_ids: length 10 must equal .* 11"):
        rejection_sample(**{**args, "cu_num_draft_tokens": gpu(torch, np.cumsum(N_DRAFTS) + 1),
                            "num_draft_tokens": None})
