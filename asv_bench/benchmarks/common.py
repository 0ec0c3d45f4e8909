"""Shared inputs, backend checks and device timing for the asv benchmarks.

Inputs: p = softmax(3 z), q = softmax(3 z + 0.5 noise) for
verification, logits z for proposals (bfloat16 on GPU backends, float32 on
the CPU), depth k = 5, top-k width 32.
"""

import os

import numpy as np

QUICK = os.environ.get("DYADIC_ASV_QUICK", "") not in ("", "0")

BACKENDS = tuple(b for b in os.environ.get("DYADIC_ASV_BACKENDS", "cpu,cuda,numba").split(",") if b)
VOCABS = (32000,) if QUICK else (32000, 129280)
BATCHES = (1,) if QUICK else (1, 4, 64)
DEPTH = 5
TOP_K = 32
GPU_BACKENDS = ("cuda", "numba")

PARAMS = [list(BACKENDS), list(VOCABS), list(BATCHES)]
PARAM_NAMES = ["backend", "vocab", "batch"]


def require_backend(name):
    """Import dyadic and check ``name`` runs here; NotImplementedError skips."""
    import dyadic

    if name not in dyadic.available_backends():
        raise NotImplementedError(f"backend {name!r} is not available here")
    if name in GPU_BACKENDS:
        torch = _torch()
        if torch is None or not torch.cuda.is_available():
            raise NotImplementedError(f"backend {name!r}: the benchmarks feed torch CUDA tensors")
    return dyadic


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def softmax(z):
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


def rng_for(vocab, batch):
    return np.random.default_rng(1000003 * vocab + batch)


def to_backend(a, backend, dtype=None):
    """A NumPy array as the backend's input kind (torch CUDA tensor on GPUs)."""
    if backend not in GPU_BACKENDS:
        return a
    torch = _torch()
    t = torch.from_numpy(np.ascontiguousarray(a)).cuda()
    return t.to(dtype) if dtype is not None else t


def sync(backend):
    """Wait for the device so a wall-clock time includes the GPU work."""
    if backend in GPU_BACKENDS:
        _torch().cuda.synchronize()


def logits(backend, batch, vocab):
    """Proposal logits [B, V]: float32 on the CPU, bfloat16 on GPU backends."""
    z = 3.0 * rng_for(vocab, batch).standard_normal((batch, vocab)).astype(np.float32)
    if backend in GPU_BACKENDS:
        return to_backend(z, backend, _torch().bfloat16)
    return z


def verify_inputs(backend, batch, vocab, k=DEPTH, sparse=False):
    """(target p [B, k+1, V], draft [B, k], q Dyadic [B, k]) on the backend.

    The draft is sampled from q with NumPy, so q(d) > 0 always holds.
    """
    import dyadic

    rng = rng_for(vocab, batch)
    z = rng.standard_normal((batch, k + 1, vocab)).astype(np.float32)
    p = softmax(3.0 * z)
    qp = softmax(3.0 * z[:, :k] + 0.5 * rng.standard_normal((batch, k, vocab)).astype(np.float32))
    q = dyadic.allocate(qp, top_k=TOP_K if sparse else None,
                        backend=backend if backend not in GPU_BACKENDS else _host_backend())
    draft = _sample_from(q, rng).astype(np.int32)
    if backend in GPU_BACKENDS:
        q = dyadic.Dyadic(to_backend(np.asarray(q.counts), backend),
                          None if q.ids is None else to_backend(np.asarray(q.ids), backend),
                          vocab_size=vocab, policy=q.policy)
    return to_backend(p, backend), to_backend(draft, backend), q


def verify_logits_inputs(backend, batch, vocab, k=DEPTH):
    """(target logits [B, k+1, V], draft [B, k], dense q Dyadic [B, k], num_drafts [B]):
    the logits 3 z of ``verify_inputs``' p (bfloat16 on GPU backends, float32 on the CPU),
    its draft and q, and ragged draft counts b mod (k + 1)."""
    _, draft, q = verify_inputs(backend, batch, vocab, k)
    z = 3.0 * rng_for(vocab, batch).standard_normal((batch, k + 1, vocab)).astype(np.float32)
    nd = (np.arange(batch) % (k + 1)).astype(np.int32)
    if backend in GPU_BACKENDS:
        return to_backend(z, backend, _torch().bfloat16), draft, q, to_backend(nd, backend)
    return z, draft, q, nd


def _host_backend():
    import dyadic

    return "cpu" if "cpu" in dyadic.available_backends() else "reference"


def _sample_from(q, rng):
    counts = np.asarray(q.counts, dtype=np.int64)
    cum = np.cumsum(counts, axis=-1)
    r = rng.integers(0, 1 << 24, size=counts.shape[:-1])
    j = (cum <= r[..., None]).sum(axis=-1)
    if q.ids is None:
        return j
    return np.take_along_axis(np.asarray(q.ids), j[..., None], axis=-1)[..., 0]


def keys(batch):
    import dyadic

    return dyadic.Keys(seed=np.arange(batch, dtype=np.uint64) + 12345, generation=1, round=2,
                       position=100)


class Backends:
    """Base: parameters and the skip rule; subclasses build inputs in ``setup``."""

    params = PARAMS
    param_names = PARAM_NAMES
    timeout = 300
    warmup_time = 0.05

    def warm(self, fn, backend):
        """Run once outside the timing (compilation, caches), then synchronise."""
        fn()
        sync(backend)


def cuda_event_seconds(fn, repeats=50):
    """Median device time of ``fn`` in seconds, from CUDA events on the current stream."""
    torch = _torch()
    times = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e-3)
    return float(np.median(times))


def device_class(base):
    """``base`` restricted to GPU backends, with ``track_device_seconds``.

    The median device time of ``base.run`` from CUDA events (compilation is
    excluded: ``setup`` warms up).  CPU backends are skipped in ``setup``.
    """

    def setup(self, backend, vocab, batch):
        if backend not in GPU_BACKENDS:
            raise NotImplementedError("CUDA-event timing applies to GPU backends only")
        self.inner = base()
        self.inner.setup(backend, vocab, batch)

    def track_device_seconds(self, backend, vocab, batch):
        return cuda_event_seconds(self.inner.run)

    track_device_seconds.unit = "seconds"
    # Composition, not inheritance: the time_/peakmem_ methods stay in ``base``.
    return type(base.__name__ + "Device", (), {
        "setup": setup, "track_device_seconds": track_device_seconds,
        "param_names": PARAM_NAMES, "timeout": base.timeout,
        "params": [[b for b in BACKENDS if b in GPU_BACKENDS] or ["cuda"]] + PARAMS[1:],
    })
