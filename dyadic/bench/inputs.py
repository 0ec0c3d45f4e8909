"""Inputs shared by every implementation: p = softmax(3 z), q = softmax(3 z + 0.5 noise)."""

import numpy as np

import dyadic


def softmax(z, axis=-1):
    z = z - z.max(axis=axis, keepdims=True)
    e = np.exp(z)
    return (e / e.sum(axis=axis, keepdims=True)).astype(np.float32)


class Inputs:
    """Host (NumPy) inputs for one size; ``device(...)`` gives torch copies."""

    def __init__(self, primitive, batch, vocab, k=5, top_k=32, seed=0):
        self.primitive, self.batch, self.vocab, self.k, self.top_k = primitive, batch, vocab, k, top_k
        rng = np.random.default_rng([seed, batch, vocab, k])
        self.temperature = 0.7
        self.seeds = np.arange(batch, dtype=np.uint64) + 1234
        if primitive == "propose":
            self.logits = (3.0 * rng.standard_normal((batch, vocab))).astype(np.float32)
        elif primitive in ("allocate", "draw"):
            self.p = softmax(3.0 * rng.standard_normal((batch, vocab)).astype(np.float32))
            if primitive == "draw":
                self.q = dyadic.allocate(self.p, backend=host_backend())
        elif primitive == "verify":
            z = rng.standard_normal((batch, k + 1, vocab)).astype(np.float32)
            self.p = softmax(3.0 * z)
            noise = rng.standard_normal((batch, k, vocab)).astype(np.float32)
            self.qp = softmax(3.0 * z[:, :k] + 0.5 * noise)
            self.q = dyadic.allocate(self.qp, backend=host_backend())
            counts = np.asarray(self.q.counts, dtype=np.int64)
            cum = np.cumsum(counts, axis=-1)
            r = rng.integers(0, 1 << 24, size=(batch, k))
            self.draft = (cum <= r[..., None]).sum(axis=-1).astype(np.int32)
        elif primitive == "philox":
            n = batch * vocab
            self.counter = np.zeros((n, 4), dtype=np.uint32)
            self.counter[:, 0] = np.arange(n, dtype=np.uint32)
            self.key = np.array([7, 11], dtype=np.uint32)
        else:
            raise ValueError(f"unknown primitive {primitive!r}")

    def keys(self):
        return dyadic.Keys(seed=self.seeds, generation=1, round=0, position=100)

    def bytes_read(self):
        """Bytes any implementation must read at least once (the memory floor)."""
        b, v, k = self.batch, self.vocab, self.k
        if self.primitive == "propose":
            return b * v * 2  # bf16 logits on the GPU
        if self.primitive == "allocate":
            return b * v * 4
        if self.primitive == "draw":
            return b * v * 4
        if self.primitive == "verify":
            return b * (k + 1) * v * 4 + b * k * v * 4
        return b * v * 16


def host_backend():
    return "cpu" if "cpu" in dyadic.available_backends() else "reference"
