"""The repeat-call fast path of the GPU API (backend "cuda", torch tensors).

An eager ``propose`` (``check=False``) or ``verify`` (``check=False`` / ``"lazy"``)
whose configuration was seen before skips the general path's conversions and
layers (dyadic._device, then the backend's argument handling) and makes the same
kernel launches directly.

How it stays the same call:

- A configuration (the cache key below) gets an entry only after the full path
  has run it successfully; the entry holds the backend's launcher
  (``CupyBackend.propose_launcher`` / ``verify_launcher``), which builds the same
  arguments as the full path (``tools/host_overhead_local.py --trace-diff``
  compares the launches of two trees).
- Everything the full path would decide per call and the key does not fix is
  checked here: input contiguity, the key fields (contiguous int32 / int64 /
  uint32 / uint64 CUDA tensors of shape (B,) or (1,)), draft and q on the
  target's device, contiguous, with the shapes and width of the entry.  When
  any of these does not hold, the call returns None and the caller takes the
  full path, which converts or raises exactly as it always did.
- ``out=`` is checked by the same function as the full path (dyadic._device
  ._outputs: the same errors), the stream is entered the same way (``_enter``).
- An entry is dropped when its backend plan leaves the backend's plan cache
  (A/B switches and tests clear it).

Keys: propose (backend, logits shape, dtype, device, temperature, top_k,
policy) with a Python float / int temperature; verify (backend, lazy, target
shape, dtype, device, q width and sparse, or None).  At most ``_MAX`` entries (cleared
when full).
"""

from . import _device as _dev
from ._types import Dyadic, Keys, Verdict

_MAX = 256
_PROPOSE = {}
_VERIFY = {}
_KEY_BITS = {}  # torch key dtype -> format bits (1: 8-byte field); filled with torch


def _key_bits():
    torch = _dev._TORCH or _dev._torch()
    _KEY_BITS.update({torch.int64: 1, torch.uint64: 1, torch.int32: 0, torch.uint32: 0})
    return _KEY_BITS


def device_keys(keys, batch):
    """(pointers, format word) of keys whose four fields are contiguous integer CUDA
    tensors of shape (B,) or (1,), as the backend's _keys makes them; None otherwise.
    One pass that is both dyadic._device._keys's hot-path test and cupy_backend._keys's
    format word: calling the two costs about 2.5 us more per call (measured locally),
    a tenth of the fast path; the trace test (tests/test_fast_path.py) holds them equal."""
    if type(keys) is not Keys:
        return None
    bits = _KEY_BITS or _key_bits()
    tt = _dev._TORCH.Tensor
    full, one = (batch,), (1,)
    ptrs, fmt, j = [], 0, 0
    for f in (keys.seed, keys.generation, keys.round, keys.position):
        if type(f) is not tt or not f.is_cuda or not f.is_contiguous():
            return None
        b = bits.get(f.dtype)
        s = f.shape
        if b is None or (s != full and s != one):
            return None
        if batch != 1 and s == one:
            b |= 2
        fmt |= b << j
        j += 2
        ptrs.append(f.data_ptr())
    return ptrs, fmt


class FastPropose:
    """One propose configuration: [B, V] logits of one dtype on one device, a cached
    temperature tensor, top_k on the backend's one-launch path."""

    __slots__ = ("launcher", "backend", "batch", "v", "policy", "specs", "temp_ptr", "temp")

    def __init__(self, launcher, backend, batch, v, policy, specs, temp):
        self.launcher, self.backend, self.batch, self.v = launcher, backend, batch, v
        self.policy, self.specs, self.temp = policy, specs, temp
        self.temp_ptr = temp.data_ptr()

    def __call__(self, logits, keys, out):
        if not logits.is_contiguous() or not self.launcher.valid():
            return None
        k = device_keys(keys, self.batch)
        if k is None:
            return None
        dev = logits.device
        tokens, counts, ids, status = _dev._outputs(out, dev, self.specs)
        tok = _dev._enter(self.backend, dev)
        try:
            self.launcher.run(logits.data_ptr(), self.temp_ptr, k[0], k[1],
                              (tokens.data_ptr(), counts.data_ptr(), ids.data_ptr(),
                               status.data_ptr()))
        finally:
            if tok is not None:
                _dev._leave(tok)
        return tokens, Dyadic(counts, ids, vocab_size=self.v, policy=self.policy, _trusted=True)


def propose_key(logits, temperature, top_k, policy, backend):
    """The cache key of a propose call, or None where the fast path never applies."""
    tt = type(temperature)
    if (tt is not float and tt is not int) or type(top_k) is not int or type(policy) is not str:
        return None
    return (backend, logits.shape, logits.dtype, logits.device, temperature, top_k, policy)


def propose(key, logits, keys, out):
    fp = _PROPOSE.get(key)
    return None if fp is None else fp(logits, keys, out)


def remember_propose(key, be, backend, batch, v, dtype, width, policy, code, specs, temp):
    """After a successful full-path propose: an entry for ``key`` where the backend has
    a launcher for this configuration (``width``: the support size min(top_k, V),
    ``code``: the policy's number, ``temp``: the temperature tensor the call used).
    Called inside the call's device context: the backend's plans are per device."""
    make = getattr(be, "propose_launcher", None)
    launcher = None if make is None else make(batch, v, dtype, width, code)
    if launcher is None:
        return
    if len(_PROPOSE) >= _MAX:
        _PROPOSE.clear()
    _PROPOSE[key] = FastPropose(launcher, backend, batch, v, policy, specs, temp)


class FastVerify:
    """One verify configuration: fp32 target [B, k+1, V] on one device, q None or of
    one width and kind, no greedy rows."""

    __slots__ = ("launcher", "backend", "b", "k", "v", "specs", "lazy")

    def __init__(self, launcher, backend, b, k, v, specs, lazy):
        self.launcher, self.backend, self.b, self.k, self.v = launcher, backend, b, k, v
        self.specs, self.lazy = specs, lazy

    def __call__(self, target, draft, q, keys, out):
        if not target.is_contiguous() or not self.launcher.valid():
            return None
        torch = _dev._TORCH
        didx = target.get_device()
        bk = (self.b, self.k)
        on = _dev._on
        if not on(draft, didx, torch) or draft.dtype != torch.int32 or draft.shape != bk:
            return None
        qc = qi = None
        if q is not None:
            qc, qi = q._counts, q._ids
            if (q._vocab_size != self.v or qc.shape[:-1] != bk or not on(qc, didx, torch)
                    or (qi is not None and not on(qi, didx, torch))):
                return None
            qc = qc.data_ptr()
            qi = None if qi is None else qi.data_ptr()
        dev = target.device
        g = None
        if not self.lazy:
            g = _dev._ZEROS_U8.get((dev, self.b))
            if g is None:
                return None
            g = g.data_ptr()
        k = device_keys(keys, self.b)
        if k is None:
            return None
        accepted, tokens, status = _dev._outputs(out, dev, self.specs)
        tok = _dev._enter(self.backend, dev)
        try:
            self.launcher.run(target.data_ptr(), draft.data_ptr(), qc, qi, g, k[0], k[1],
                              accepted.data_ptr(), tokens.data_ptr(), status.data_ptr())
        finally:
            if tok is not None:
                _dev._leave(tok)
        return Verdict(accepted, tokens, status)


def verify_key(target, q, backend, lazy):
    """The cache key of a verify call (greedy None, check False / "lazy"), or None."""
    if q is None:
        qk = None
    elif type(q) is Dyadic and type(q._counts) is _dev._TORCH.Tensor:
        qk = (q._counts.shape[-1], q._ids is not None)
    else:
        return None
    return (backend, lazy, target.shape, target.dtype, target.device, qk)


def verify(key, target, draft, q, keys, out):
    fv = _VERIFY.get(key)
    return None if fv is None else fv(target, draft, q, keys, out)


def remember_verify(key, be, backend, b, k1, v, q, lazy, specs):
    """After a successful full-path verify: an entry for ``key`` where the backend has a
    launcher for this configuration; called inside the call's device context."""
    make = getattr(be, "verify_launcher", None)
    w = 0 if q is None else int(q._counts.shape[-1])
    launcher = None if make is None else make(b, k1, v, w, lazy)
    if launcher is None:
        return
    if len(_VERIFY) >= _MAX:
        _VERIFY.clear()
    _VERIFY[key] = FastVerify(launcher, backend, b, k1 - 1, v, specs, lazy)
