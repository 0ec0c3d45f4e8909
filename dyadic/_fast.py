"""The repeat-call fast path of the GPU API (backend "cuda", torch tensors).

An eager ``propose``, ``allocate`` or ``draw`` (``check=False``) or ``verify``
(``check=False`` / ``"lazy"``) whose configuration was seen before skips the general
path's conversions and layers (dyadic._device, then the backend's argument
handling) and makes the same kernel launches directly.

How it stays the same call:

- A configuration (the cache key below) gets an entry only after the full path
  has run it successfully; the entry holds the backend's launcher
  (``CupyBackend.propose_launcher`` / ``allocate_launcher`` / ``draw_launcher`` /
  ``verify_launcher``), which builds the same
  arguments as the full path (``tools/host_overhead_local.py --trace-diff``
  compares the launches of two trees).
- Everything the full path would decide per call and the key does not fix is
  checked here: input contiguity, the key fields (contiguous int32 / int64 /
  uint32 / uint64 CUDA tensors of shape (B,) or (1,)), draft, q and the greedy
  flags (a bool tensor of shape (B,)) on the target's device, contiguous, with the
  shapes and width of the entry (draw: q's
  ids on its counts' device, contiguous, of its shape and int32).  When
  any of these does not hold, the call returns None and the caller takes the
  full path, which converts or raises exactly as it always did.
- ``out=`` is checked by the same function as the full path (dyadic._gpu_arrays
  ._outputs: the same errors), the stream is entered the same way (``_enter``).
- An entry is dropped when its backend plan leaves the backend's plan cache
  (A/B switches and tests clear it).

Keys: propose (backend, logits shape, dtype, device, temperature, top_k,
policy) with a Python float / int temperature; allocate (the same with logits,
top_k an int or None, no bias); draw (backend, q's counts shape, dtype and device, sparse);
verify (backend, lazy, target shape, dtype, device, q width and sparse, or None,
whether greedy flags are given).
At most ``_MAX`` entries per primitive (cleared when full).
"""

from . import _gpu_arrays as _ga
from ._types import Dyadic, Keys, trusted_dyadic, trusted_verdict

_MAX = 256
_PROPOSE = {}
_ALLOCATE = {}
_DRAW = {}
_VERIFY = {}
_KEY_BITS = {}  # torch key dtype -> format bits (1: 8-byte field); filled with torch


def _key_bits():
    torch = _ga._TORCH or _ga._torch()
    _KEY_BITS.update({torch.int64: 1, torch.uint64: 1, torch.int32: 0, torch.uint32: 0})
    return _KEY_BITS


def device_keys(keys, batch):
    """(pointers, format word) of keys whose four fields are contiguous integer CUDA
    tensors of shape (B,) or (1,), as the backend's _keys makes them; None otherwise.
    One pass that is both dyadic._gpu_arrays._keys's hot-path test and cupy_backend._keys's
    format word (calling the two would cost a tenth of the fast path's host time); the
    trace test (tests/gpu/test_fast_path.py) holds them equal.  The four fields are
    tested side by side, not in a loop (fewer bytecodes per call)."""
    if type(keys) is not Keys:
        return None
    bits = _KEY_BITS or _key_bits()
    tt = _ga._TORCH.Tensor
    s, g, r, p = keys.seed, keys.generation, keys.round, keys.position
    if (type(s) is not tt or type(g) is not tt or type(r) is not tt or type(p) is not tt
            or not (s.is_cuda and g.is_cuda and r.is_cuda and p.is_cuda)
            or not (s.is_contiguous() and g.is_contiguous() and r.is_contiguous()
                    and p.is_contiguous())):
        return None
    bs, bg, br, bp = bits.get(s.dtype), bits.get(g.dtype), bits.get(r.dtype), bits.get(p.dtype)
    if bs is None or bg is None or br is None or bp is None:
        return None
    fmt = bs | bg << 2 | br << 4 | bp << 6  # 2 bits per field: 1 an 8-byte field, 2 (1,)
    full = (batch,)
    shapes = s.shape, g.shape, r.shape, p.shape
    if shapes[0] != full or shapes[1] != full or shapes[2] != full or shapes[3] != full:
        if batch == 1:  # (1,) is the full shape
            return None
        one = (1,)
        for j, sh in enumerate(shapes):
            if sh == one:
                fmt |= 2 << (2 * j)
            elif sh != full:
                return None
    return [s.data_ptr(), g.data_ptr(), r.data_ptr(), p.data_ptr()], fmt


def _launch(backend, dev, run, *args):
    """``run(*args)`` inside the call's stream / device context (dyadic._device's
    _enter / _leave, as the full path)."""
    tok = _ga._enter(backend, dev)
    try:
        run(*args)
    finally:
        if tok is not None:
            _ga._leave(tok)


def _store(table, key, be, maker, args, entry):
    """``table[key] = entry(launcher)`` where the backend's ``maker(*args)`` gives a
    launcher for the configuration (None: the full path takes a route the fast path does
    not cover); the table is cleared when it holds ``_MAX`` entries.  A valid entry for
    ``key`` is kept as it is: a call that the fast path declined (host keys, say) and the
    full path served does not rebuild the launcher on every call."""
    old = table.get(key)
    if old is not None and old.launcher.valid():
        return
    launcher = getattr(be, maker)(*args) if be.has_launchers else None
    if launcher is None:
        return
    if len(table) >= _MAX:
        table.clear()
    table[key] = entry(launcher)


def _scalar_config(temperature, top_k, policy, dense_ok):
    """The temperature a Python float / int, top_k an int (or None where ``dense_ok``),
    policy a string: the arguments a cache key can hold as they are."""
    tt = type(temperature)
    return ((tt is float or tt is int) and type(policy) is str
            and (type(top_k) is int or (dense_ok and top_k is None)))


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
        tokens, counts, ids, status = _ga._outputs(out, dev, self.specs)
        _launch(self.backend, dev, self.launcher.run, logits.data_ptr(), self.temp_ptr, k[0],
                k[1], (tokens.data_ptr(), counts.data_ptr(), ids.data_ptr(), status.data_ptr()))
        return tokens, trusted_dyadic(counts, ids, self.v, self.policy)


def propose_key(logits, temperature, top_k, policy, backend):
    """The cache key of a propose call, or None where the fast path never applies."""
    if not _scalar_config(temperature, top_k, policy, False):
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
    _store(_PROPOSE, key, be, "propose_launcher", (batch, v, dtype, width, code),
           lambda lk: FastPropose(lk, backend, batch, v, policy, specs, temp))


class FastAllocate:
    """One allocate configuration (top-k or dense): [B, V] logits or weights of one dtype
    on one device, a cached temperature tensor (ones for weights), no bias."""

    __slots__ = ("launcher", "backend", "v", "policy", "specs", "temp_ptr", "temp")

    def __init__(self, launcher, backend, v, policy, specs, temp):
        self.launcher, self.backend, self.v, self.policy = launcher, backend, v, policy
        self.specs, self.temp = specs, temp
        self.temp_ptr = temp.data_ptr()

    def __call__(self, x, out):
        if not x.is_contiguous() or not self.launcher.valid():
            return None
        dev = x.device
        counts, ids, status = _ga._outputs(out, dev, self.specs)
        _launch(self.backend, dev, self.launcher.run, x.data_ptr(), self.temp_ptr,
                counts.data_ptr(), None if ids is None else ids.data_ptr(), status.data_ptr())
        return trusted_dyadic(counts, ids, self.v, self.policy)


def allocate_key(x, logits, temperature, top_k, policy, backend):
    """The cache key of an allocate call (check False, no bias), or None where the fast
    path never applies (a temperature that is not a Python float / int, top_k neither
    None nor an int)."""
    if not _scalar_config(temperature, top_k, policy, True):
        return None
    return (backend, x.shape, x.dtype, x.device, bool(logits), temperature, top_k, policy)


def allocate(key, x, out):
    fa = _ALLOCATE.get(key)
    return None if fa is None else fa(x, out)


def remember_allocate(key, be, backend, batch, v, dtype, width, policy, code, logits, specs,
                      temp):
    """After a successful full-path allocate: an entry for ``key`` where the backend has a
    launcher (``width`` 0: dense; called inside the call's device context)."""
    _store(_ALLOCATE, key, be, "allocate_launcher", (batch, v, dtype, width, code, logits),
           lambda lk: FastAllocate(lk, backend, v, policy, specs, temp))


class FastDraw:
    """One draw configuration: q's counts [B, w] (uint32) on one device, ids [B, w] or
    None."""

    __slots__ = ("launcher", "backend", "batch", "shape", "sparse", "specs")

    def __init__(self, launcher, backend, shape, sparse, specs):
        self.launcher, self.backend, self.shape, self.sparse = launcher, backend, shape, sparse
        self.batch, self.specs = shape[0], specs

    def __call__(self, q, keys, out):
        counts = q._counts
        if not counts.is_contiguous() or not self.launcher.valid():
            return None
        ids = q._ids
        if self.sparse:
            torch = _ga._TORCH
            if (not _ga._on(ids, counts.get_device(), torch) or ids.shape != self.shape
                    or ids.dtype != torch.int32):
                return None
            ids = ids.data_ptr()
        k = device_keys(keys, self.batch)
        if k is None:
            return None
        dev = counts.device
        (tokens,) = _ga._outputs(out, dev, self.specs)
        _launch(self.backend, dev, self.launcher.run, counts.data_ptr(), ids, k[0], k[1],
                tokens.data_ptr())
        return tokens


def draw_key(q, backend):
    """The cache key of a draw call (check False), or None where the fast path never
    applies (q not a Dyadic of torch tensors, counts not [B, w])."""
    if type(q) is not Dyadic:
        return None
    c, i = q._counts, q._ids
    tt = _ga._TORCH.Tensor
    if type(c) is not tt or c.dim() != 2 or (i is not None and type(i) is not tt):
        return None
    return (backend, c.shape, c.dtype, c.device, i is not None)


def draw(key, q, keys, out):
    fd = _DRAW.get(key)
    return None if fd is None else fd(q, keys, out)


def remember_draw(key, be, backend, shape, sparse, specs):
    """After a successful full-path draw: an entry for ``key`` where the backend has a
    launcher (called inside the call's device context)."""
    _store(_DRAW, key, be, "draw_launcher", (int(shape[0]), int(shape[1])),
           lambda lk: FastDraw(lk, backend, shape, sparse, specs))


class FastVerify:
    """One verify configuration: fp32 target [B, k+1, V] on one device, q None or of
    one width and kind, no greedy flags or a bool tensor of them (``greedy``)."""

    __slots__ = ("launcher", "backend", "b", "k", "v", "specs", "lazy", "bk", "qshape", "g",
                 "greedy", "gshape")

    def __init__(self, launcher, backend, b, k, v, w, specs, lazy, greedy):
        self.launcher, self.backend, self.b, self.k, self.v = launcher, backend, b, k, v
        self.specs, self.lazy, self.greedy = specs, lazy, greedy
        self.bk, self.qshape, self.gshape = (b, k), (b, k, w), (b,)
        self.g = None  # check=False: the pointer of _device's cached zero greedy flags

    def __call__(self, target, draft, q, keys, out, greedy):
        if not target.is_contiguous() or not self.launcher.valid():
            return None
        torch = _ga._TORCH
        didx = target.get_device()
        on = _ga._on
        if not on(draft, didx, torch) or draft.dtype != torch.int32 or draft.shape != self.bk:
            return None
        qc = qi = None
        if q is not None:  # the key fixed q's width: its shape is (B, k, width)
            qc, qi = q._counts, q._ids
            if (q._vocab_size != self.v or qc.shape != self.qshape or not on(qc, didx, torch)
                    or (qi is not None and not on(qi, didx, torch))):
                return None
            qc = qc.data_ptr()
            qi = None if qi is None else qi.data_ptr()
        dev = target.device
        if self.greedy:  # a contiguous bool tensor (B,) on the target's device: its bytes
            if (not on(greedy, didx, torch) or greedy.dtype != torch.bool
                    or greedy.shape != self.gshape):
                return None
            g = greedy.data_ptr()
        else:
            g = self.g
            if g is None and not self.lazy:  # _ZEROS_U8's tensors are never dropped
                g = _ga._ZEROS_U8.get((dev, self.b))
                if g is None:
                    return None
                g = self.g = g.data_ptr()
        k = device_keys(keys, self.b)
        if k is None:
            return None
        accepted, tokens, status = _ga._outputs(out, dev, self.specs)
        _launch(self.backend, dev, self.launcher.run, target.data_ptr(), draft.data_ptr(), qc,
                qi, g, k[0], k[1], accepted.data_ptr(), tokens.data_ptr(), status.data_ptr())
        return trusted_verdict(accepted, tokens, status)


def verify_key(target, q, backend, lazy, greedy=False):
    """The cache key of a verify call (check False / "lazy"; ``greedy``: a tensor of greedy
    flags given), or None."""
    if q is None:
        qk = None
    elif type(q) is Dyadic and type(q._counts) is _ga._TORCH.Tensor:
        qk = (q._counts.shape[-1], q._ids is not None)
    else:
        return None
    return (backend, lazy, target.shape, target.dtype, target.device, qk, greedy)


def verify(key, target, draft, q, keys, out, greedy=None):
    fv = _VERIFY.get(key)
    return None if fv is None else fv(target, draft, q, keys, out, greedy)


def remember_verify(key, be, backend, b, k1, v, q, lazy, specs, greedy=False):
    """After a successful full-path verify: an entry for ``key`` where the backend has a
    launcher for this configuration (``greedy``: greedy flags given, which the full path
    sends to the two-launch kernels even with check="lazy"); called inside the call's
    device context."""
    w = 0 if q is None else int(q._counts.shape[-1])
    _store(_VERIFY, key, be, "verify_launcher", (b, k1, v, w, lazy and not greedy, greedy),
           lambda lk: FastVerify(lk, backend, b, k1 - 1, v, w, specs, lazy and not greedy,
                                 greedy))
