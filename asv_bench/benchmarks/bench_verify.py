"""verify: chain verification, k = 5, dense fp32 target, dense and top-32 q; check=True
(every rule, the default) and check="lazy" (rows read and validated only where a decision
needs them: one launch on the cuda backend; full validation on the others).  VerifyLogits:
the target as logits (bfloat16 on GPU backends) with temperature 0.8 and top_p 0.9, padded
and with ragged draft counts (num_drafts = b mod 6), check="lazy"."""

from .common import (DEPTH, Backends, keys, require_backend, sync, verify_inputs,
                     verify_logits_inputs, device_class)


class Verify(Backends):
    def setup(self, backend, vocab, batch):
        self.dyadic = require_backend(backend)
        self.backend = backend
        self.p, self.draft, self.q = verify_inputs(backend, batch, vocab, DEPTH)
        self.ps, self.drafts, self.qs = verify_inputs(backend, batch, vocab, DEPTH, sparse=True)
        self.keys = keys(batch)
        self.warm(self.run, backend)

    def run(self):
        return self.dyadic.verify(self.p, self.draft, self.q, self.keys, backend=self.backend)

    def run_sparse(self):
        return self.dyadic.verify(self.ps, self.drafts, self.qs, self.keys, backend=self.backend)

    def run_lazy(self):
        return self.dyadic.verify(self.p, self.draft, self.q, self.keys, backend=self.backend,
                                  check="lazy")

    def time_dense_q(self, backend, vocab, batch):
        self.run()
        sync(backend)

    def time_sparse_q(self, backend, vocab, batch):
        self.run_sparse()
        sync(backend)

    def time_dense_q_lazy(self, backend, vocab, batch):
        self.run_lazy()
        sync(backend)

    def peakmem_dense_q(self, backend, vocab, batch):
        self.run()


class VerifyLogits(Backends):
    def setup(self, backend, vocab, batch):
        self.dyadic = require_backend(backend)
        self.backend = backend
        self.x, self.draft, self.q, self.nd = verify_logits_inputs(backend, batch, vocab, DEPTH)
        self.keys = keys(batch)
        self.warm(self.run, backend)
        self.warm(self.run_ragged, backend)

    def run(self, num_drafts=None):
        return self.dyadic.verify(self.x, self.draft, self.q, self.keys, backend=self.backend,
                                  check="lazy", logits=True, temperature=0.8, top_p=0.9,
                                  num_drafts=num_drafts)

    def run_ragged(self):
        return self.run(self.nd)

    def time_logits_top_p(self, backend, vocab, batch):
        self.run()
        sync(backend)

    def time_logits_top_p_ragged(self, backend, vocab, batch):
        self.run_ragged()
        sync(backend)


# CUDA-event device time (GPU backends only).
VerifyDevice = device_class(Verify)
VerifyLogitsDevice = device_class(VerifyLogits)
