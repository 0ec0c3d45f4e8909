"""Speculative (assisted) generation with Hugging Face transformers models, sampled by dyadic.

The models supply logits through their ordinary forward pass; every sampling
decision is dyadic's: the assistant's drafts come from ``dyadic.propose`` (so
the q handed to verification is, by construction, the exact distribution each
draft was drawn from) and the target's decisions from ``dyadic.verify``.
Nothing of transformers' private generation code is used or patched.

Keys (docs/semantics.md, section 1).  Request ``b`` of a call draws with
``Keys(seed=seed[b], generation=generation[b], round=r, position=p)``:

- ``round`` ``r``: the request's own speculation round, 0, 1, 2, ... (in
  ``sample``, the index of the generated token);
- ``position`` ``p``: the absolute position, in the request's own sequence
  (prompt without padding, then generated tokens), of the token being
  decided: draft ``i`` of a round is proposed at ``p0 + i`` (PROPOSAL domain)
  and verified at ``p0 + i`` (ACCEPTANCE / CORRECTION), the bonus at
  ``p0 + k``, where ``p0`` is the request's length at the start of the round.

So a request's tokens are a function of its own prompt, seed, generation and
the models' logits only: never of the batch it ran in, its index in that
batch, the backend, or earlier calls.

Forward passes.  Each request's sequence runs through the model alone (batch 1,
its exact length: no padding, no attention mask) and without a KV cache: every
forward recomputes the whole sequence (correctness first; the cost is
quadratic in the length, fine for the short generations this module is
for); requests with identical sequences share one forward.  The reason is
exactness: dyadic's decisions are a pure function of the logits' bits, and a
forward over a padded batch gives a request's logits that differ in their last
bits with the batch's shape (on the CPU as on GPUs), which changes draws
(verification draws below the exact row total of the target's probabilities,
so a one-ulp change can change a draw).  Logits computed alone are a function
of the request's tokens only, so the output does not depend on the batch.
dyadic makes the sampling exact and reproducible given the logits; the
logits' bits themselves (machine, library versions, thread settings, device
kernels) are the engine's business.

``import dyadic.integrations.transformers`` imports neither torch nor
transformers; the functions raise ImportError naming the extra
``dyadic[transformers]`` where they are missing.
"""

from dataclasses import dataclass

import numpy as np

import dyadic

from .. import _arrays
from .._types import trusted_dyadic
from ._requires import transformers_stack


@dataclass(frozen=True)
class SamplingParams:
    """The target's sampling parameters (the distribution the output follows).

    temperature : float >= 0 (0: greedy, the argmax of the logits, lowest id among ties)
    top_k : int >= 1 or None; top_p : float in (0, 1] or None; min_p : float in [0, 1] or None
        Applied by dyadic's exact target processing (``verify(..., logits=True)``:
        min-p, then top-k, then top-p on the integer weights, ties to the lowest
        id; docs/semantics.md section 2).  Each filter alone keeps the tokens
        transformers' ``TopKLogitsWarper`` / ``TopPLogitsWarper`` /
        ``MinPLogitsWarper`` keep, except where float rounding decides a token at
        the boundary; combined, the order above applies.  The weights are
        ``exp(logits / T)`` to about 2**-39 relative.
    """

    temperature: float = 1.0
    top_k: int = None
    top_p: float = None
    min_p: float = None

    def __post_init__(self):
        t = self.temperature
        if (isinstance(t, bool) or not isinstance(t, (int, float))
                or not (t >= 0 and t < float("inf"))):
            raise ValueError(f"temperature: expected a finite number >= 0, got {t!r}")
        k = self.top_k
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ValueError(f"top_k: expected an int >= 1 or None, got {k!r}")
        for name, lo_open in (("top_p", True), ("min_p", False)):
            v = getattr(self, name)
            if v is None:
                continue
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and v <= 1 and (
                v > 0 if lo_open else v >= 0)
            if not ok:
                raise ValueError(f"{name}: expected a number in {'(0' if lo_open else '[0'}, 1] "
                                 f"or None, got {v!r}")

    @property
    def greedy(self):
        return self.temperature == 0


def verify_target(logits, draft, q, keys, params, backend):
    """``dyadic.verify`` on the target's raw logits: the one place the target side is converted.

    logits : torch float tensor [B, k+1, V], the target's logits at the
        positions that predict draft 0 .. k-1 and the bonus.
    draft : int32 [B, k]; q : Dyadic [B, k] (the proposals' q) or None when k = 0.
    params : SamplingParams.  The target rows are processed by
    ``dyadic.verify(..., logits=True)`` in exact integers (docs/semantics.md,
    section 2 "Target logits": the fixed-point exponential of ``logits / T``, then
    min-p, top-k, top-p, ties to the lowest id), so the distribution preserved is
    a function of the logits' bits alone, the same on every backend and device.
    Temperature 0 verifies greedily on the argmax of the logits (the lowest id
    among ties: torch's first maximum), so greedy output is the model's argmax
    token for token.  Backends "cuda" and "numba" verify CUDA logits on the
    device; the other backends take them on the host.

    Returns the ``dyadic.Verdict``.
    """
    if backend not in ("cuda", "numba") and logits.is_cuda:
        logits = logits.cpu()
        if q is not None and _arrays.is_gpu_array(q.counts):  # a numba proposal's q
            q = trusted_dyadic(q.counts.cpu(), None if q.ids is None else q.ids.cpu(),
                               q.vocab_size, q.policy)
    return dyadic.verify(logits, draft, q, keys, backend=backend, logits=True,
                         temperature=float(params.temperature), top_k=params.top_k,
                         top_p=params.top_p, min_p=params.min_p)


@dataclass(frozen=True)
class AcceptanceStats:
    """Acceptance counts of a speculative run, per request and draft position.

    num_drafts : int, k.
    rounds : int64 [B], verification rounds each request ran.
    accepted : int64 [B, k], ``accepted[b, i]`` = rounds of request ``b`` in
        which draft ``i`` was accepted (so drafts ``0..i`` all were).

    Counts are verify's decisions; tokens past ``max_new_tokens`` (or after
    ``eos_token_id``) are dropped from the output but still counted here.
    """

    num_drafts: int
    rounds: np.ndarray
    accepted: np.ndarray

    @property
    def reached(self):
        """int64 [B, k]: rounds in which draft ``i`` was verified (drafts before it accepted)."""
        return np.concatenate([self.rounds[:, None], self.accepted[:, :-1]], axis=1)

    def acceptance_by_position(self):
        """float64 [k]: P(draft i accepted | drafts 0..i-1 accepted), over all requests
        (NaN where no round reached position i)."""
        reached = self.reached.sum(axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(reached > 0, self.accepted.sum(axis=0) / reached, np.nan)

    def mean_accepted(self):
        """Mean number of accepted drafts per round (0..k), over all requests."""
        rounds = int(self.rounds.sum())
        return float(self.accepted.sum()) / rounds if rounds else float("nan")


@dataclass(frozen=True)
class Generation:
    """Output of ``generate`` / ``sample``.

    new_tokens : list of B lists of int, the generated token ids per request
        (``max_new_tokens`` of them, fewer where ``eos_token_id`` ended it,
        the eos included).
    stats : AcceptanceStats, or None for ``sample``.
    """

    new_tokens: list
    stats: AcceptanceStats = None

    def tokens(self, pad=-1):
        """torch.LongTensor [B, max length] of ``new_tokens``, padded with ``pad``."""
        torch, _ = transformers_stack()
        width = max((len(t) for t in self.new_tokens), default=0)
        return torch.tensor([t + [pad] * (width - len(t)) for t in self.new_tokens],
                            dtype=torch.long).reshape(len(self.new_tokens), width)


def generate(model, assistant_model, input_ids, *, max_new_tokens, num_drafts=4, seed,
             generation=0, temperature=1.0, top_k=None, top_p=None, min_p=None,
             draft_temperature=None, draft_top_k=None, attention_mask=None,
             eos_token_id=None, backend="cpu"):
    """Speculative generation: ``assistant_model`` drafts with ``dyadic.propose``,
    ``model`` verifies with ``dyadic.verify``.

    Parameters
    ----------
    model, assistant_model : transformers causal LMs (``model(input_ids=...).logits``
        [B, L, V]) in eval mode, on the same device, with the same vocabulary V.
    input_ids : torch.LongTensor [B, L] or a list of B lists of ints.
    attention_mask : torch tensor [B, L] of 0/1, optional
        Marks each request's prompt tokens (left or right padding both work:
        a request's prompt is its tokens with mask 1, in order).
    max_new_tokens : int >= 0, tokens generated per request.
    num_drafts : int >= 1, k drafts per round.
    seed : int (B = 1) or a sequence of B ints in [0, 2**64)
        One seed per request: a single int for a batch is refused, since
        requests sharing a seed would share their random draws.
    generation : int or sequence of B ints in [0, 2**32); bump it to resample a
        request from scratch (a retry with the same value reproduces it).
    temperature, top_k, top_p, min_p : the target's sampling (SamplingParams);
        the output is distributed exactly as ``sample`` with the same values.
    draft_temperature : float >= 0, default ``temperature``; draft_top_k : int or
        None (dense q): the assistant's proposal distribution (any choice keeps
        the output exact; it only changes acceptance).
    eos_token_id : int, optional; a request stops after emitting it.
    backend : dyadic backend ("cpu", "reference", "cuda", "numba").  With
        "cuda" / "numba" the logits stay on the models' device.

    Returns
    -------
    Generation(new_tokens, stats).

    Compatibility guarantee: for given models' logits, the tokens are a pure
    function of (prompt, seed, generation, sampling parameters, num_drafts):
    identical on every dyadic backend, batch composition and row order.

    Examples
    --------
    >>> from dyadic.integrations import tiny_models, transformers as dyt
    >>> target, draft = tiny_models.load_pair()
    >>> out = dyt.generate(target, draft, [tiny_models.encode("def ")], max_new_tokens=16,
    ...                    num_drafts=3, seed=7, temperature=0.8)
    >>> len(out.new_tokens[0]), out.stats.accepted.shape
    (16, (1, 3))
    """
    if assistant_model is None:
        raise TypeError("assistant_model: expected a transformers model (use sample() for "
                        "target-only sampling)")
    if isinstance(num_drafts, bool) or not isinstance(num_drafts, int) or num_drafts < 1:
        raise ValueError(f"num_drafts: expected an int >= 1, got {num_drafts!r}")
    params = SamplingParams(temperature, top_k, top_p, min_p)
    if draft_temperature is None:
        draft_temperature = temperature
    try:  # the same rules on the draft side, the error naming the draft argument
        SamplingParams(draft_temperature, draft_top_k)
    except ValueError as exc:
        raise ValueError(f"draft_{exc}") from None
    return _run(model, assistant_model, input_ids, attention_mask, max_new_tokens, num_drafts,
                seed, generation, params, draft_temperature, draft_top_k, eos_token_id, backend)


def sample(model, input_ids, *, max_new_tokens, seed, generation=0, temperature=1.0,
           top_k=None, top_p=None, min_p=None, attention_mask=None, eos_token_id=None,
           backend="cpu"):
    """Target-only sampling with dyadic: the baseline ``generate`` is exact against.

    Each token is ``dyadic.verify`` with no drafts (k = 0): the bonus token,
    drawn exactly from the target distribution of ``verify_target``, in domain
    CORRECTION at the token's absolute position, round = its index.
    Temperature 0 is greedy (the argmax, torch's first maximum).  Parameters,
    keys and guarantee as in ``generate``; ``stats`` is None.
    """
    params = SamplingParams(temperature, top_k, top_p, min_p)
    return _run(model, None, input_ids, attention_mask, max_new_tokens, 0, seed, generation,
                params, None, None, eos_token_id, backend)


# ---------------------------------------------------------------------------- internals

def _prompts(input_ids, attention_mask):
    """list of B lists of ints: each request's prompt without padding."""
    torch, _ = transformers_stack()
    if isinstance(input_ids, torch.Tensor):
        if input_ids.ndim != 2 or input_ids.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"input_ids: expected an integer tensor [B, L], got "
                             f"{input_ids.dtype} {tuple(input_ids.shape)}")
        rows = input_ids.tolist()
    else:
        rows = [list(r) for r in input_ids]
    if attention_mask is not None:
        mask = attention_mask.tolist() if isinstance(attention_mask, torch.Tensor) else [
            list(r) for r in attention_mask]
        if len(mask) != len(rows) or any(len(m) != len(r) for m, r in zip(mask, rows)):
            raise ValueError("attention_mask: shape does not match input_ids")
        for b, m in enumerate(mask):
            if any(x not in (0, 1) for x in m):
                raise ValueError(f"attention_mask: row {b}: values must be 0 or 1")
        rows = [[t for t, m in zip(r, mr) if m] for r, mr in zip(rows, mask)]
    for b, r in enumerate(rows):
        if not r:
            raise ValueError(f"input_ids: row {b}: empty prompt (a causal LM needs at least "
                             f"one token to condition on)")
        if not all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) and t >= 0
                   for t in r):
            raise ValueError(f"input_ids: row {b}: token ids must be non-negative ints")
    return [[int(t) for t in r] for r in rows]


def _per_request(value, name, batch, hi):
    """uint64 [B] from an int (B = 1 for seeds) or a sequence of B ints in [0, hi]."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        if name == "seed" and batch > 1:
            raise ValueError(f"seed: a batch of {batch} requests needs one seed per request "
                             f"(a sequence of {batch} ints); a shared seed would give "
                             f"requests the same random draws")
        values = [int(value)] * batch
    else:
        values = [int(v) for v in value]
        if len(values) != batch:
            raise ValueError(f"{name}: expected {batch} values (one per request), got "
                             f"{len(values)}")
    for b, v in enumerate(values):
        if not 0 <= v <= hi:
            raise ValueError(f"{name}: row {b}: value {v} out of range [0, {hi}]")
    return np.array(values, dtype=np.uint64)


def _check_model(model, name):
    if getattr(model, "training", False):
        raise ValueError(f"{name}: the model is in training mode (dropout would make its "
                         f"logits random); call .eval() first")
    return model


def _context_limit(model):
    cfg = getattr(model, "config", None)
    for attr in ("max_position_embeddings", "n_positions"):
        v = getattr(cfg, attr, None)
        if isinstance(v, int):
            return v
    return None


def _logit_rows(model, seqs, starts, n):
    """The model's logits at positions ``starts[b] .. starts[b] + n - 1`` of each
    sequence: float32 tensor [B, n, V] on the model's device.

    Each distinct sequence runs alone (batch 1, its exact length, no padding):
    its logits are a function of its own tokens, never of the other requests
    (forwards of different batch shapes differ in the last bits of the logits,
    and dyadic's decisions read every bit).  Requests whose sequences are
    identical share that one forward: the same computation, the same bits.
    """
    torch, _ = transformers_stack()
    device = next(model.parameters()).device
    done = {}
    rows = []
    with torch.inference_mode():
        for s, start in zip(seqs, starts):
            key = tuple(s)
            logits = done.get(key)
            if logits is None:
                ids = torch.tensor([s], dtype=torch.long, device=device)
                logits = done[key] = model(input_ids=ids).logits[0]
            rows.append(logits[int(start):int(start) + n])
    return torch.stack(rows).float()


def _on_backend(x, backend):
    """Logits as dyadic takes them: on the models' device for GPU backends, else the host."""
    return x if backend in ("cuda", "numba") and x.is_cuda else x.cpu()


def _host_ints(x):
    return x.tolist() if hasattr(x, "tolist") else list(x)


def _run(model, assistant, input_ids, attention_mask, max_new_tokens, k, seed, generation,
         params, draft_temperature, draft_top_k, eos_token_id, backend):
    transformers_stack()  # ImportError naming the extra before anything else
    _check_model(model, "model")
    if assistant is not None:
        _check_model(assistant, "assistant_model")
    if (isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int)
            or max_new_tokens < 0):
        raise ValueError(f"max_new_tokens: expected an int >= 0, got {max_new_tokens!r}")
    prompts = _prompts(input_ids, attention_mask)
    batch = len(prompts)
    seeds = _per_request(seed, "seed", batch, 2**64 - 1)
    gens = _per_request(generation, "generation", batch, 2**32 - 1).astype(np.uint32)
    # the longest forward: a prompt, all but the last new token, then k drafts
    longest = max((len(p) for p in prompts), default=0) + max(max_new_tokens - 1, 0) + k
    for m, name in ((model, "model"), (assistant, "assistant_model")):
        limit = None if m is None else _context_limit(m)
        if limit is not None and longest > limit:
            raise ValueError(f"max_new_tokens: the longest prompt + max_new_tokens - 1 + "
                             f"num_drafts = {longest} exceeds {name}'s context of {limit} "
                             f"positions")
    seqs = [list(p) for p in prompts]
    new = [[] for _ in range(batch)]
    live = [max_new_tokens > 0] * batch
    rounds = np.zeros(batch, dtype=np.int64)
    accepted = np.zeros((batch, k), dtype=np.int64)
    r = 0
    while any(live):
        act = [b for b in range(batch) if live[b]]
        ctx = [list(seqs[b]) for b in act]
        pos = np.array([len(c) for c in ctx], dtype=np.int64)
        seed_a, gen_a = seeds[act], gens[act]
        drafts, qs = [], []
        for i in range(k):
            logits = _logit_rows(assistant, ctx, pos + i - 1, 1)[:, 0]
            keys = dyadic.Keys(seed=seed_a, generation=gen_a, round=r,
                               position=(pos + i).astype(np.uint32))
            tok, q = dyadic.propose(_on_backend(logits, backend), keys,
                                    temperature=draft_temperature, top_k=draft_top_k,
                                    backend=backend)
            tok = _host_ints(tok)
            for c, t in zip(ctx, tok):
                c.append(int(t))
            drafts.append(tok)
            qs.append(q)
        target_logits = _logit_rows(model, ctx, pos - 1, k + 1)
        if k and target_logits.shape[-1] != qs[0].vocab_size:
            raise ValueError(f"assistant_model: vocabulary {qs[0].vocab_size} differs from "
                             f"model's {target_logits.shape[-1]}")
        draft = np.array(drafts, dtype=np.int32).T.reshape(len(act), k)
        q = dyadic.stack(qs, axis=1) if k else None
        verdict = verify_target(_on_backend(target_logits, backend), draft, q,
                                dyadic.Keys(seed=seed_a, generation=gen_a, round=r,
                                            position=pos.astype(np.uint32)),
                                params, backend)
        acc = _host_ints(verdict.accepted)
        toks = _host_ints(verdict.tokens)
        for j, b in enumerate(act):
            a = int(acc[j])
            rounds[b] += 1
            accepted[b, :a] += 1
            for t in toks[j][:a + 1]:
                seqs[b].append(int(t))
                new[b].append(int(t))
                if len(new[b]) == max_new_tokens or t == eos_token_id:
                    live[b] = False
                    break
        r += 1
    stats = AcceptanceStats(k, rounds, accepted) if assistant is not None else None
    return Generation(new, stats)
