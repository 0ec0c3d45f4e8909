"""propose: top-32 proposal (and dense) from logits; bf16 on GPU backends."""

from .common import TOP_K, Backends, keys, logits, require_backend, sync, device_class


class Propose(Backends):
    def setup(self, backend, vocab, batch):
        self.dyadic = require_backend(backend)
        self.backend = backend
        self.z = logits(backend, batch, vocab)
        self.keys = keys(batch)
        self.warm(self.run, backend)

    def run(self):
        return self.dyadic.propose(self.z, self.keys, temperature=0.7, top_k=TOP_K,
                                   backend=self.backend)

    def run_dense(self):
        return self.dyadic.propose(self.z, self.keys, temperature=0.7, top_k=None,
                                   backend=self.backend)

    def time_topk(self, backend, vocab, batch):
        self.run()
        sync(backend)

    def time_dense(self, backend, vocab, batch):
        self.run_dense()
        sync(backend)

    def peakmem_topk(self, backend, vocab, batch):
        self.run()


# CUDA-event device time (GPU backends only).
ProposeDevice = device_class(Propose)
