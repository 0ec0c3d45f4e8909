"""Philox4x32-10 (Salmon et al., SC'11; Random123) in exact Python integers."""

from .. import _spec

M0, M1 = 0xD2511F53, 0xCD9E8D57
W0, W1 = 0x9E3779B9, 0xBB67AE85
MASK32 = 0xFFFFFFFF


def philox4x32(counter, key, rounds=10):
    """One Philox4x32 block: 4 words of counter, 2 words of key -> 4 words."""
    c0, c1, c2, c3 = (int(c) & MASK32 for c in counter)
    k0, k1 = (int(k) & MASK32 for k in key)
    for r in range(rounds):
        if r:
            k0 = (k0 + W0) & MASK32
            k1 = (k1 + W1) & MASK32
        p0 = M0 * c0
        p1 = M1 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0, p1 & MASK32, (p0 >> 32) ^ c3 ^ k1, p0 & MASK32)
    return (c0, c1, c2, c3)


def key_words(seed):
    """The Philox key of ``seed``: (low 32 bits, high 32 bits)."""
    return (seed & MASK32, seed >> 32)


def counter_words(generation, round, position, domain, draw_index):
    """The Philox counter of one draw (docs/semantics.md, "Key and counter layout")."""
    return ((domain << _spec.DOMAIN_SHIFT) | draw_index, position, round, generation)


def block(keys, position, domain, draw_index):
    """The 4 words drawn for ``keys = (seed, generation, round)`` at one counter."""
    seed, generation, round_ = keys
    return philox4x32(counter_words(generation, round_, position, domain, draw_index),
                      key_words(seed))


def uniform_below(n, keys, position, domain, start_index=0):
    """Exact uniform integer in [0, n) by masked rejection.

    Attempt ``j`` reads the block at draw index ``start_index + j`` as the
    128-bit integer ``X = w0 | w1 << 32 | w2 << 64 | w3 << 96``, keeps its low
    ``L = bit_length(n - 1)`` bits and accepts when the result is < n.
    Returns ``(value, next_draw_index)``; raises RuntimeError when draw indices
    run out (probability below 2**-(2**27)).
    """
    if not 1 <= n < (1 << 128):
        raise ValueError(f"uniform_below: n={n} out of range [1, 2**128)")
    mask = (1 << (n - 1).bit_length()) - 1
    index = start_index
    while index <= _spec.MAX_DRAW_INDEX:
        w = block(keys, position, domain, index)
        x = w[0] | (w[1] << 32) | (w[2] << 64) | (w[3] << 96)
        index += 1
        if (x & mask) < n:
            return x & mask, index
    raise RuntimeError("uniform_below: draw indices exhausted")


def uniform_below_63(n, keys, position, domain, start_index=0):
    """Exact uniform integer in [0, n), 1 <= n <= 2**63, by rejection with a fixed mask.

    Attempt ``j`` reads the block at draw index ``start_index + j``, keeps the
    low 63 bits of ``w0 | w1 << 32`` and accepts when the result is < n.  The
    mask does not depend on ``n``: for the same draws, the value is the same
    for every ``n`` above it (a verifier that knows ``n`` only within a band
    decides most draws without it).  Each attempt succeeds with probability
    ``n / 2**63``.  Returns ``(value, next_draw_index)``; raises RuntimeError
    when draw indices run out.
    """
    if not 1 <= n <= (1 << 63):
        raise ValueError(f"uniform_below_63: n={n} out of range [1, 2**63]")
    mask = (1 << 63) - 1
    index = start_index
    while index <= _spec.MAX_DRAW_INDEX:
        w = block(keys, position, domain, index)
        x = (w[0] | (w[1] << 32)) & mask
        index += 1
        if x < n:
            return x, index
    raise RuntimeError("uniform_below_63: draw indices exhausted")


def proposal_ticket(keys, position):
    """The 24-bit proposal draw r: word 0 of draw index 0, shifted right by 8."""
    return block(keys, position, _spec.DOMAIN_PROPOSAL, 0)[0] >> 8
