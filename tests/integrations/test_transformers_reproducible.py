"""dyadic.integrations.transformers on real (tiny, trained) models: the tokens are a
pure function of the request (prompt, seed, generation), identical across dyadic
backends, batch compositions, row order and retries; greedy speculation is the
target's greedy output token for token; the acceptance statistics are consistent."""

import numpy as np
import pytest

from dyadic.integrations import tiny_models
from dyadic.integrations import transformers as dyt

PROMPTS = ["    def ", "import os\n", "class Fraction(numbers.Rational):\n    ", "x"]


def ids(*texts):
    return [tiny_models.encode(t) for t in texts]


@pytest.mark.parametrize("k", [1, 3])
def test_generate_same_on_cpu_and_reference_backends(tiny_pair, k):
    target, draft = tiny_pair
    kw = dict(max_new_tokens=12, num_drafts=k, seed=[11, 12], temperature=0.9,
              draft_temperature=1.3, top_k=40)
    cpu = dyt.generate(target, draft, ids(*PROMPTS[:2]), backend="cpu", **kw)
    ref = dyt.generate(target, draft, ids(*PROMPTS[:2]), backend="reference", **kw)
    assert cpu.new_tokens == ref.new_tokens
    assert all(len(t) == 12 for t in cpu.new_tokens)
    np.testing.assert_array_equal(cpu.stats.accepted, ref.stats.accepted)
    np.testing.assert_array_equal(cpu.stats.rounds, ref.stats.rounds)


def test_sample_same_on_cpu_and_reference_backends(tiny_pair):
    target, _ = tiny_pair
    kw = dict(max_new_tokens=10, seed=[5, 6], temperature=1.1, top_p=0.95)
    cpu = dyt.sample(target, ids(*PROMPTS[:2]), backend="cpu", **kw)
    ref = dyt.sample(target, ids(*PROMPTS[:2]), backend="reference", **kw)
    assert cpu.new_tokens == ref.new_tokens
    assert cpu.stats is None


@pytest.mark.parametrize("fn", ["generate", "sample"])
def test_tokens_do_not_depend_on_batch_composition_or_retry(tiny_pair, fn):
    target, draft = tiny_pair
    kw = dict(max_new_tokens=64, temperature=1.0, top_k=64)

    def run(prompts, seeds, **extra):
        if fn == "generate":
            return dyt.generate(target, draft, ids(*prompts), seed=seeds, num_drafts=3,
                                draft_temperature=0.7, **kw, **extra).new_tokens
        return dyt.sample(target, ids(*prompts), seed=seeds, **kw, **extra).new_tokens

    alone = run([PROMPTS[2]], [2024])[0]
    first = run(PROMPTS[2:] + PROMPTS[:2], [2024, 1, 2, 3])[0]
    last = run(PROMPTS[:2] + [PROMPTS[3], PROMPTS[2]], [7, 8, 9, 2024])[3]
    again = run([PROMPTS[2]], [2024])[0]
    assert alone == first == last == again
    # the seed and the generation are what select the draws: changing either changes them
    assert run([PROMPTS[2]], [2025])[0] != alone
    assert run([PROMPTS[2]], [2024], generation=1)[0] != alone


def test_left_padded_batch_with_attention_mask_equals_unpadded_requests(tiny_pair):
    torch = pytest.importorskip("torch")
    target, draft = tiny_pair
    prompts = ids(PROMPTS[0], PROMPTS[2])
    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    kw = dict(max_new_tokens=10, num_drafts=2, seed=[3, 4], temperature=0.8)
    padded = dyt.generate(target, draft, input_ids, attention_mask=mask, **kw)
    plain = dyt.generate(target, draft, prompts, **kw)
    assert padded.new_tokens == plain.new_tokens
    assert padded.tokens().shape == (2, 10)


@pytest.mark.parametrize("draft_temperature", [0.0, 1.0])
def test_greedy_speculation_equals_target_greedy(tiny_pair, draft_temperature):
    torch = pytest.importorskip("torch")
    target, draft = tiny_pair
    prompts = ids(*PROMPTS)
    n = 32
    spec = dyt.generate(target, draft, prompts, max_new_tokens=n, num_drafts=4,
                        seed=[1, 2, 3, 4], temperature=0.0,
                        draft_temperature=draft_temperature)
    plain = dyt.sample(target, prompts, max_new_tokens=n, seed=[9, 9, 9, 9], temperature=0.0)
    assert spec.new_tokens == plain.new_tokens
    for p, got in zip(prompts, spec.new_tokens):  # transformers' own greedy search agrees
        hf = target.generate(torch.tensor([p]),
                             attention_mask=torch.ones(1, len(p), dtype=torch.long),
                             max_new_tokens=n, do_sample=False)
        assert hf[0, len(p):].tolist() == got


def test_acceptance_statistics_are_consistent(tiny_pair):
    target, draft = tiny_pair
    k, n = 4, 40
    out = dyt.generate(target, draft, ids(*PROMPTS), max_new_tokens=n, num_drafts=k,
                       seed=[21, 22, 23, 24], temperature=1.0, draft_temperature=1.0)
    s = out.stats
    assert s.num_drafts == k and s.accepted.shape == (4, k) and s.rounds.shape == (4,)
    assert (s.accepted[:, 0] <= s.rounds).all()
    assert (np.diff(s.accepted, axis=1) <= 0).all()  # draft i+1 is accepted only after draft i
    per_request = s.accepted.sum(axis=1)
    assert (per_request <= k * s.rounds).all()
    # each round emits accepted + 1 tokens; only the last round can be cut at max_new_tokens
    made = per_request + s.rounds
    assert all(len(t) == n for t in out.new_tokens)
    assert ((made >= n) & (made - n <= k)).all()
    rate = s.acceptance_by_position()
    assert rate.shape == (k,) and ((rate >= 0) & (rate <= 1)).all()
    assert 0 < s.mean_accepted() <= k
    assert s.mean_accepted() == pytest.approx(s.accepted.sum() / s.rounds.sum())


def test_eos_ends_a_request_and_is_kept(tiny_pair):
    target, draft = tiny_pair
    full = dyt.generate(target, draft, ids(PROMPTS[0]), max_new_tokens=30, num_drafts=3,
                        seed=8, temperature=1.0).new_tokens[0]
    eos = full[5]
    cut = dyt.generate(target, draft, ids(PROMPTS[0]), max_new_tokens=30, num_drafts=3,
                       seed=8, temperature=1.0, eos_token_id=eos).new_tokens[0]
    assert cut == full[:full.index(eos) + 1]


def test_bad_arguments_raise_naming_the_argument(tiny_pair):
    target, draft = tiny_pair
    p = ids(PROMPTS[0], PROMPTS[1])
    with pytest.raises(ValueError, match="seed: a batch of 2 requests needs one seed"):
        dyt.generate(target, draft, p, max_new_tokens=4, seed=1)
    with pytest.raises(ValueError, match="seed: expected 2 values"):
        dyt.sample(target, p, max_new_tokens=4, seed=[1, 2, 3])
    with pytest.raises(ValueError, match=r"seed: row 1: value -1 out of range"):
        dyt.sample(target, p, max_new_tokens=4, seed=[1, -1])
    with pytest.raises(ValueError, match="num_drafts"):
        dyt.generate(target, draft, p, max_new_tokens=4, num_drafts=0, seed=[1, 2])
    with pytest.raises(ValueError, match="temperature"):
        dyt.sample(target, p, max_new_tokens=4, seed=[1, 2], temperature=-1.0)
    with pytest.raises(ValueError, match="draft_temperature: expected a finite number"):
        dyt.generate(target, draft, p, max_new_tokens=4, seed=[1, 2], draft_temperature=-0.5)
    with pytest.raises(ValueError, match="draft_top_k: expected an int >= 1"):
        dyt.generate(target, draft, p, max_new_tokens=4, seed=[1, 2], draft_top_k=0)
    with pytest.raises(ValueError, match="top_p"):
        dyt.sample(target, p, max_new_tokens=4, seed=[1, 2], top_p=0.0)
    with pytest.raises(ValueError, match="input_ids: row 1: token ids must be non-negative"):
        dyt.sample(target, [[1], [2, -3]], max_new_tokens=4, seed=[1, 2])
    with pytest.raises(ValueError, match="attention_mask: row 0: values must be 0 or 1"):
        dyt.sample(target, [[1, 2]], attention_mask=[[1, 2]], max_new_tokens=4, seed=1)
    with pytest.raises(ValueError, match="input_ids: row 0: empty prompt"):
        dyt.sample(target, [[], [1]], max_new_tokens=4, seed=[1, 2])
    with pytest.raises(ValueError, match="exceeds model's context"):
        dyt.sample(target, p, max_new_tokens=10_000, seed=[1, 2])
    target.train()
    try:
        with pytest.raises(ValueError, match="model: the model is in training mode"):
            dyt.sample(target, p, max_new_tokens=4, seed=[1, 2])
    finally:
        target.eval()


def test_context_limit_is_the_longest_forward(tiny_pair):
    target, draft = tiny_pair
    limit = target.config.n_positions
    prompt = [32] * (limit - 10)
    # the longest forward is the prompt, max_new_tokens - 1 new tokens, then k drafts
    out = dyt.generate(target, draft, [prompt], max_new_tokens=8, num_drafts=3, seed=1)
    assert len(out.new_tokens[0]) == 8
    with pytest.raises(ValueError, match="exceeds model's context"):
        dyt.generate(target, draft, [prompt], max_new_tokens=9, num_drafts=3, seed=1)


def test_zero_new_tokens(tiny_pair):
    target, draft = tiny_pair
    out = dyt.generate(target, draft, ids(*PROMPTS[:2]), max_new_tokens=0, seed=[1, 2])
    assert out.new_tokens == [[], []] and out.stats.rounds.tolist() == [0, 0]
    assert out.tokens().shape == (2, 0)
