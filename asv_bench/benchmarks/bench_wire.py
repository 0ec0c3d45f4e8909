"""dyadic.wire: encode + decode of a depth-5, top-32 REPLY for 4 requests.

Target: well under 100 us per encode + decode in Python.
Standalone: ``python -m asv_bench.benchmarks.bench_wire`` prints the times.
"""

import numpy as np

DEPTH, TOP_K, REQUESTS, VOCAB = 5, 32, 4, 129280


def make_reply(vocab=VOCAB, requests=REQUESTS, depth=DEPTH, top_k=TOP_K, seed=0):
    """A valid Reply with top_k-sparse q (distinct ids, counts summing to 2**24)."""
    import dyadic
    from dyadic import wire

    rng = np.random.default_rng(seed)
    rows = requests * depth
    ids = np.sort(np.stack([rng.choice(vocab, top_k, replace=False) for _ in range(rows)]),
                  axis=1).astype(np.int32)
    w = rng.integers(1, 1000, size=(rows, top_k)).astype(np.float64)
    counts = np.floor(w / w.sum(1, keepdims=True) * (1 << 24)).astype(np.uint32)
    counts[:, 0] += np.uint32(1 << 24) - counts.sum(1).astype(np.uint32)
    q = dyadic.Dyadic(counts.reshape(requests, depth, top_k), ids.reshape(requests, depth, top_k),
                      vocab_size=vocab)
    sampled = ids[np.arange(rows), rng.integers(0, top_k, rows)].reshape(requests, depth)
    reply = wire.Reply.from_dyadic(q, sampled, session=1, generation=0, round=0,
                                   slots=range(requests))
    limits = wire.Limits(vocab_size=vocab, max_support=top_k, max_slots=requests,
                         max_depth=depth)
    return reply, limits


class WireReply:
    """Times in seconds for one 4-request, depth-5, top-32 REPLY frame (5,504 bytes)."""

    def setup(self):
        from dyadic import wire

        self.wire = wire
        self.reply, self.limits = make_reply()
        self.frame = wire.encode(self.reply)

    def time_encode(self):
        self.wire.encode(self.reply)

    def time_decode(self):
        self.wire.decode(self.frame, limits=self.limits)

    def time_encode_decode(self):
        self.wire.decode(self.wire.encode(self.reply), limits=self.limits)

    def track_frame_bytes(self):
        return len(self.frame)

    track_frame_bytes.unit = "bytes"


def _main():
    import timeit

    b = WireReply()
    b.setup()
    for name in ("time_encode", "time_decode", "time_encode_decode"):
        fn = getattr(b, name)
        best = min(timeit.repeat(fn, number=2000, repeat=7)) / 2000
        print(f"{name}: {best * 1e6:.1f} us")
    print(f"frame bytes: {b.track_frame_bytes()}")


if __name__ == "__main__":
    _main()
