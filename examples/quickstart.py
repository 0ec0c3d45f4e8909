"""Allocate, propose and verify a depth-3 draft chain for a batch of 4 requests.

Run: python examples/quickstart.py [--backend cpu]
"""

import argparse

import numpy as np

import dyadic


def softmax(z):
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--backend", default="cpu")
    args = ap.parse_args()
    be = args.backend
    rng = np.random.default_rng(0)
    batch, depth, vocab = 4, 3, 32000
    seeds = np.array([101, 202, 303, 404], dtype=np.uint64)
    start = np.array([17, 5, 230, 42])  # absolute position of each request's first draft

    # 1. allocate: a draft distribution as exact integer tickets (sum 2**24)
    q0 = dyadic.allocate(softmax(rng.standard_normal((batch, vocab))), backend=be)
    print("allocate:", q0, "row sums", q0.counts.sum(axis=1).tolist())

    # 2. propose: the drafter samples a chain, one position at a time (top-32, T=0.7)
    draft_logits = (rng.standard_normal((batch, depth, vocab)) * 3).astype(np.float32)
    tokens, qs = [], []
    for i in range(depth):
        keys = dyadic.Keys(seed=seeds, generation=0, round=0, position=start + i)
        t, q = dyadic.propose(draft_logits[:, i], keys, temperature=0.7, top_k=32, backend=be)
        tokens.append(t)
        qs.append(q)
    draft = np.stack(tokens, axis=1)
    q = dyadic.stack(qs, axis=1)  # [batch, depth] rows of q
    print("draft tokens:\n", draft)

    # 3. verify against the target's probabilities (depth + 1 rows per request)
    target = softmax(draft_logits[:, list(range(depth)) + [depth - 1]] / 0.8
                     + rng.standard_normal((batch, depth + 1, vocab)) * 0.5)
    verdict = dyadic.verify(target, draft, q, dyadic.Keys(seed=seeds, position=start), backend=be)
    print("accepted:", verdict.accepted.tolist())
    print("emitted tokens (-1 = none):\n", verdict.tokens)

    # Same request alone, in another batch position: same tokens (batch invariance).
    again = dyadic.verify(target[2:3], draft[2:3], q[2:3],
                          dyadic.Keys(seed=seeds[2:3], position=start[2:3]), backend=be)
    assert again.tokens[0].tolist() == verdict.tokens[2].tolist()
    print("backends available here:", dyadic.available_backends())


if __name__ == "__main__":
    main()
