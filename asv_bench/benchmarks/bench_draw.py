"""draw: one token per row from a dense q and from a top-32 sparse q."""

import numpy as np

from .common import TOP_K, Backends, keys, require_backend, rng_for, softmax, sync, to_backend, device_class


class Draw(Backends):
    def setup(self, backend, vocab, batch):
        self.dyadic = require_backend(backend)
        self.backend = backend
        z = rng_for(vocab, batch).standard_normal((batch, vocab)).astype(np.float32)
        p = to_backend(softmax(3.0 * z), backend)
        self.q = self.dyadic.allocate(p, backend=backend)
        self.qs = self.dyadic.allocate(p, top_k=TOP_K, backend=backend)
        self.keys = keys(batch)
        self.warm(self.run, backend)
        self.warm(self.run_sparse, backend)

    def run(self):
        return self.dyadic.draw(self.q, self.keys, backend=self.backend)

    def run_sparse(self):
        return self.dyadic.draw(self.qs, self.keys, backend=self.backend)

    def time_dense(self, backend, vocab, batch):
        self.run()
        sync(backend)

    def time_sparse(self, backend, vocab, batch):
        self.run_sparse()
        sync(backend)

    def peakmem_dense(self, backend, vocab, batch):
        self.run()


# CUDA-event device time (GPU backends only).
DrawDevice = device_class(Draw)
