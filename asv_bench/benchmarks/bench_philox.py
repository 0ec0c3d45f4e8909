"""philox4x32: raw generator throughput over N = batch * vocab counters."""

import numpy as np

from .common import Backends, require_backend


class Philox(Backends):
    def setup(self, backend, vocab, batch):
        self.dyadic = require_backend(backend)
        self.backend = backend
        n = batch * vocab
        self.counters = np.zeros((n, 4), dtype=np.uint32)
        self.counters[:, 0] = np.arange(n, dtype=np.uint32)
        self.key = np.array([0xDEADBEEF, 0x12345678], dtype=np.uint32)
        self.run()

    def run(self):
        return self.dyadic.philox4x32(self.counters, self.key, backend=self.backend)

    def time_philox(self, backend, vocab, batch):
        self.run()

    def peakmem_philox(self, backend, vocab, batch):
        self.run()
