"""allocate: dense (fp32 probabilities) and top-k (fp32 logits, top_k=32)."""

import numpy as np

from .common import TOP_K, Backends, device_class, logits, require_backend, rng_for, softmax, sync, to_backend


class Allocate(Backends):
    def setup(self, backend, vocab, batch):
        self.dyadic = require_backend(backend)
        self.backend = backend
        z = rng_for(vocab, batch).standard_normal((batch, vocab)).astype(np.float32)
        self.p = to_backend(softmax(3.0 * z), backend)
        self.z = logits(backend, batch, vocab)
        self.warm(self.run, backend)
        self.warm(self.run_topk, backend)

    def run(self):
        return self.dyadic.allocate(self.p, backend=self.backend)

    def run_topk(self):
        return self.dyadic.allocate(self.z, logits=True, top_k=TOP_K, backend=self.backend)

    def time_dense(self, backend, vocab, batch):
        self.run()
        sync(backend)

    def time_topk(self, backend, vocab, batch):
        self.run_topk()
        sync(backend)

    def peakmem_dense(self, backend, vocab, batch):
        self.run()

    def peakmem_topk(self, backend, vocab, batch):
        self.run_topk()


# CUDA-event device time (GPU backends only).
AllocateDevice = device_class(Allocate)
