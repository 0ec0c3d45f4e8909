"""Vocabulary-sharded propose / verify (docs/distributed.md explains the design).

Every rank holds a contiguous slice [vocab_offset, vocab_offset + n) of the
vocabulary.  Ranks exchange only small, exact integer summaries through
``Comm`` (``_comm`` holds the protocol that keeps the ranks of a call in
step); every decision that needs global information is a pure function of
data that all ranks hold identically after a collective, so every rank takes
it identically, and the result equals the unsharded reference bit for bit.

Each rank's local work runs in the CPU backend's shard kernels
(``backends/cpu/_shard.pyx`` over ``backends/include/dyadic_shard.h``): the
shard's top-k candidates, the merge / allocation / draw on the gathered
candidates, the dense weights, the target summaries, validation and
acceptance, the residual masses, the correction draw and the owner's search.
A CUDA shard stays on its GPU when the cuda backend (CuPy) loads: the same
functions of ``backends/cuda/cupy/shard.py`` (NVRTC over the same
``dyadic_shard.h``) on CuPy arrays, the collectives on CUDA tensors; without
CuPy it is copied to the host.  Propose (``_propose``, top-k and dense) is one
implementation over an array module ``xp``, NumPy with the CPU kernels for host
shards, CuPy with the CUDA kernels for CUDA shards, and so is the dense
allocation after the weights (floors, remainders, radix histograms, tie
counts, the draw's owner search: array code on exact uint64 / int64); verify
has a device function of its own (``_verify_device``).  On the device,
besides each collective's failure flag, a dense propose reads back the
candidates' statuses (B int32), the weight sums (B x 2 int64) and the floor
sums (B int64): replicated per-row values from which every rank plans the
following rounds.

Collectives of a successful call (a failed call adds one error round;
docs/distributed.md says why each is needed):

* propose with ``top_k``: 3 (header, candidates, closing).
* dense propose: header, candidates, weight sums, floor sums (with the first
  radix histogram), one histogram per further radix digit (standard policy,
  8 bits a digit), tie counts, count sums, the owner's token, closing: 8 plus
  the radix digits; 3 when every row is greedy.
* verify: header, round-1 summaries, residual / bonus masses and the owner's
  token (when a row is not greedy), closing: 5; 3 when every row is greedy.

Two of them are agreements: the header (fixed size, ``_comm.HEADER_WORDS``
int64 per rank: call number, operation, error code, every replicated
argument) and the closing round (max of the failure flag and, with
``check=True``, of the tokens and their negation), which follows all of the
call's local work, outputs included.  Every other collective carries a
one-element failure flag.  So an exception on any rank, of any type, anywhere
in a call makes every rank raise the same error after the next collective
(``_comm.Comm.fail``), and a rank that left an earlier call without its
collectives is caught by the call numbers of the next header.
"""

import contextlib
import zlib
from dataclasses import dataclass

import numpy as np

from .. import _arrays, _backend, _spec, _status, _validate
from .._types import Dyadic, Keys, Verdict, trusted_dyadic
from ._comm import Comm, close_plan, gather_plan, reduce_plan

TOTAL = _spec.TOTAL
U64 = np.uint64
_POLICY_NAMES = {code: name for name, code in _spec.POLICY_CODES.items()}


@dataclass(frozen=True)
class ExchangeStats:
    """What the last sharded call sent (per rank, summed over its collectives)."""

    op: str
    collectives: int
    bytes_sent: int
    rows: int
    positions: int

    @property
    def bytes_per_position(self):
        """Bytes this rank contributed per request per position."""
        return self.bytes_sent / max(1, self.rows * self.positions)


last_exchange = None


class DyadicShard:
    """This rank's slice of a dense dyadic q: counts [..., n] for ids [offset, offset + n).

    Parameters
    ----------
    counts : uint32 array [..., n] (NumPy, torch CPU or CUDA)
        Ticket counts of ids ``vocab_offset + j``; each entry and each row's sum
        over the shard are <= 2**24.  ``n`` may be 0 (an empty shard).
    vocab_offset, vocab_size : int
        The slice's first global id and the full V (1 <= V <= 2**24,
        0 <= vocab_offset <= vocab_offset + n <= V).
    policy : "standard", "floor-first" or "external".

    The concatenation over ranks (in id order) is the dense ``Dyadic`` that the
    unsharded call returns; ``verify`` takes the shard directly and checks that
    every row sums to exactly 2**24 over the shards (every rank raises the same
    ``ValueError`` otherwise).  The constructor copies ``counts`` and validates
    the copy (``ValueError`` / ``TypeError`` naming the argument, the row and
    the rule); the stored NumPy array is read-only and the shard is immutable.
    ``verify`` validates the counts it receives again (one pass), so no shard
    reaches the arithmetic unchecked.
    """

    __slots__ = ("_counts", "_vocab_offset", "_vocab_size", "_policy")

    def __init__(self, counts, vocab_offset, vocab_size, policy="standard"):
        _validate.dyadic_policy(policy)
        own, host = _arrays.owned_copy(counts, "counts")
        n = host.shape[-1] if host.ndim else 0
        off, v = _offset_size(vocab_offset, vocab_size, n)
        _shard_rows(np, host, "counts")
        _shard_fields(self, own, off, v, policy)

    @classmethod
    def _of(cls, counts, vocab_offset, vocab_size, policy):
        """A shard of counts this module computed (uint32, valid by construction)."""
        s = object.__new__(cls)
        _shard_fields(s, counts, int(vocab_offset), int(vocab_size), policy)
        return s

    def __setattr__(self, name, value):
        raise AttributeError("DyadicShard is immutable")

    @property
    def counts(self):
        """uint32 [..., n] ticket counts of ids [vocab_offset, vocab_offset + n)."""
        return self._counts

    @property
    def vocab_offset(self):
        return self._vocab_offset

    @property
    def vocab_size(self):
        return self._vocab_size

    @property
    def policy(self):
        return self._policy

    @property
    def batch_shape(self):
        return tuple(self._counts.shape[:-1])

    def __repr__(self):
        return (f"DyadicShard(batch_shape={self.batch_shape}, ids [{self.vocab_offset}, "
                f"{self.vocab_offset + self._counts.shape[-1]}) of {self.vocab_size})")


def _shard_fields(s, counts, off, v, policy):
    if isinstance(counts, np.ndarray):
        counts.flags.writeable = False
    object.__setattr__(s, "_counts", counts)
    object.__setattr__(s, "_vocab_offset", off)
    object.__setattr__(s, "_vocab_size", v)
    object.__setattr__(s, "_policy", policy)


def _shard_rows(xp, c, name):
    """Row rules of a shard's counts c [..., n]: uint32, every entry and every row's sum
    over the shard <= 2**24 (the rows' sums over all shards are checked in verify).

    c is a NumPy array (``xp`` NumPy) or a CUDA tensor (``xp`` CuPy: the dtype is checked
    on the tensor, the rules on a CuPy view of it, with one read of the per-row flags).
    Returns c as a C-contiguous uint32 ``xp`` array (the same memory where it is one).
    """
    if c.ndim < 1:
        raise ValueError(f"{name}: expected shape [..., n], got a scalar")
    if _arrays.dtype_name(c) != "uint32":
        raise TypeError(f"{name}: dtype {_arrays.dtype_name(c)}; expected uint32")
    if xp is np:
        c = np.ascontiguousarray(c)
    else:
        c = xp.ascontiguousarray(xp.asarray(c.contiguous()))
    if c.size:
        rows = c.reshape(-1, c.shape[-1])
        flags = _host(xp, xp.stack([(rows > TOTAL).any(axis=1),
                                    rows.astype(U64).sum(axis=1) > TOTAL]))
        _first_bad(flags[0], name, "each count must be <= 2**24")
        _first_bad(flags[1], name, "the shard's counts sum to more than 2**24")
    return c


def _first_bad(mask, name, rule):
    bad = np.flatnonzero(mask)
    if bad.size:
        raise ValueError(f"{name}: row {int(bad[0])}: {rule}")


# ----------------------------------------------------------------------------- helpers

def _host_kernels():
    """The CPU backend's per-shard kernels (backends/cpu/_shard.pyx over
    backends/include/dyadic_shard.h); BackendUnavailable naming what to install."""
    _backend.get("cpu")
    from ..backends.cpu import _shard
    return _shard


def _crc(*arrays):
    c = 0
    for a in arrays:
        if a is None:
            c = zlib.crc32(b"none", c)
        else:
            a = np.ascontiguousarray(a)
            c = zlib.crc32(str((a.dtype.str, a.shape)).encode(), c)
            c = zlib.crc32(a.tobytes(), c)
    return c


def _float_local(x, name):
    if _arrays.is_torch(x) and x.device.type == "cuda":
        x = x.detach().cpu()
    return _arrays.float_to_numpy(x, name)


def _int_local(x, name):
    if _arrays.is_torch(x) and x.device.type == "cuda":
        x = x.detach().cpu()
    return _arrays.int_to_numpy(x, name)


def _output(arr, like):
    if _arrays.is_torch(like):
        import torch
        return torch.from_numpy(arr).to(like.device)
    return arr


def _to(xp, a, dtype=None):
    """A host array for ``xp``'s kernels: NumPy keeps it (cast to ``dtype`` if given), CuPy
    uploads it (``_up``)."""
    if xp is np:
        return a if dtype is None else a.astype(dtype, copy=False)
    return _up(xp, a, dtype)


def _result(xp, arr, like):
    """An ``xp`` result as the caller's kind of array: a NumPy one as ``like`` is
    (``_output``), a CuPy one as a torch CUDA tensor of the same memory (``_out_dev``)."""
    return _output(arr, like) if xp is np else _out_dev(arr)


def _raise_rows(xp, *statuses):
    """The per-row status words of a stage (B int32 ``xp`` arrays each; CuPy: one read for
    all): the first array with a non-zero row raises the unsharded call's error for its
    first row."""
    if xp is np:
        host = statuses
    elif len(statuses) > 1:
        host = xp.asnumpy(xp.stack(statuses))
    else:
        host = [xp.asnumpy(statuses[0])]
    for st in host:
        _status.raise_for_status(st, lambda i: i)


def _keys(keys, batch, extra=0):
    if not isinstance(keys, Keys):
        raise TypeError(f"keys: expected dyadic.Keys, got {type(keys).__name__}")
    return keys.broadcast(batch, position_extra=extra)


def _offset_size(vocab_offset, vocab_size, n):
    for name, v in (("vocab_offset", vocab_offset), ("vocab_size", vocab_size)):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{name}: expected an int, got {type(v).__name__}")
    _validate.vocab(int(vocab_size), "vocab_size")
    if not 0 <= vocab_offset <= vocab_offset + n <= vocab_size:
        raise ValueError(f"vocab_offset: local ids [{vocab_offset}, {vocab_offset + n}) are "
                         f"not inside [0, {vocab_size})")
    return int(vocab_offset), int(vocab_size)


# replicated arguments in the header: (name, True for a CRC32 of the value)
_PROPOSE_FIELDS = (("vocab_size", False), ("batch size", False), ("top_k", False),
                   ("policy", False), ("whether a bias is given", False),
                   ("temperature", True), ("keys", True), ("check", False))
_VERIFY_FIELDS = (("vocab_size", False), ("batch size", False), ("k", False),
                  ("the kind of q", False), ("draft", True), ("q", True), ("greedy", True),
                  ("keys", True), ("check", False))


def _layout(hdr, fields):
    """Check the gathered headers; returns the shard order (ranks by offset) and offsets.

    hdr[:, 0] = offset, hdr[:, 1] = n, hdr[:, 2:] must agree on every rank.
    """
    for j, (name, digest) in enumerate(fields):
        col = hdr[:, 2 + j]
        if (col != col[0]).any():
            what = "CRC32 of dtype, shape and values" if digest else "values"
            raise ValueError(f"distributed: ranks disagree on {name} "
                             f"({what} by rank: {col.tolist()})")
    v = int(hdr[0, 2])
    order = [r for r in sorted(range(hdr.shape[0]), key=lambda r: (hdr[r, 0], r))
             if hdr[r, 1] > 0]
    pos = 0
    for r in order:
        if hdr[r, 0] != pos:
            raise ValueError(f"distributed: the ranks' vocabulary slices (offset, size) "
                             f"{[(int(a), int(b)) for a, b in hdr[:, :2]]} do not tile "
                             f"[0, {v}) contiguously")
        pos += int(hdr[r, 1])
    if pos != v:
        raise ValueError(f"distributed: the ranks' vocabulary slices (offset, size) "
                         f"{[(int(a), int(b)) for a, b in hdr[:, :2]]} cover {pos} ids, "
                         f"not vocab_size={v}")
    return order, [int(hdr[r, 0]) for r in order]


def _finish(comm, op, rows, positions):
    global last_exchange
    last_exchange = ExchangeStats(op, comm.collectives, comm.bytes_sent, rows, positions)


# ----------------------------------------------------------------------------- propose

def _prep_propose(local_logits, keys, vocab_offset, vocab_size, temperature, bias, top_k,
                  policy, check, cp=None):
    """The checked arguments of a sharded propose, in the order of the unsharded call's
    checks: the shard's logits (and bias) as C-contiguous float32 NumPy arrays, or with
    ``cp`` (CuPy) on the device (a CUDA bias stays there, a host one is uploaded)."""
    code = _validate.policy(policy)
    check = _validate.check_mode(check)
    x = _float_local(local_logits, "logits") if cp is None else _float_dev(cp, local_logits,
                                                                            "logits")
    if x.ndim != 2:
        raise ValueError(f"logits: expected the local shape [B, n], got {tuple(x.shape)}")
    batch, n = x.shape
    off, v = _offset_size(vocab_offset, vocab_size, n)
    b2 = None
    if bias is not None:
        b = _float_local(bias, "bias") if cp is None else _float_any(cp, bias, "bias")
        if tuple(b.shape[-1:]) != (n,):
            raise ValueError(f"bias: last dimension {tuple(b.shape[-1:])} does not match the "
                             f"local vocabulary slice {n}")
        if b.ndim == 1:
            b2 = b.reshape(1, n)
        elif tuple(b.shape) == tuple(x.shape):
            b2 = b
        else:
            raise ValueError(f"bias: shape {tuple(b.shape)} must be ({n},) or equal to logits' "
                             f"{tuple(x.shape)}")
        b2 = (np if cp is None else cp).ascontiguousarray(b2)
    temp = _validate.temperature(temperature, batch, allow_zero=True)
    width = _validate.top_k(top_k, v)
    kb = _keys(keys, batch)
    if cp is None:
        x = np.ascontiguousarray(x)
    return x, b2, temp, code, width, kb, off, v, check


def propose(local_logits, keys, *, vocab_offset, vocab_size, group=None, temperature=1.0,
            bias=None, top_k=32, policy="standard", check=True):
    """Sharded ``dyadic.propose``: identical tokens and q on every rank.

    Parameters
    ----------
    local_logits : float32/float16/bfloat16 [B, n]
        This rank's logits for global ids [vocab_offset, vocab_offset + n).
    keys, temperature, top_k, policy : as in ``dyadic.propose`` (identical on
        every rank; checked).
    bias : this rank's slice of the bias ([n] or [B, n]), or None.
    vocab_offset, vocab_size : the slice's first global id and the full V.
    group : torch.distributed process group (default: the default group).
    The local math runs in the shard kernels (there is no ``backend``
    argument): on the GPU for a CUDA tensor when the cuda backend (CuPy)
    loads (top-k and dense), else in the CPU backend's kernels on the host
    (CUDA tensors copied there), so the compiled CPU backend is required on
    that path (``BackendUnavailable`` otherwise, on every rank).
    check : True or False (identical on every rank; checked).  True: the
        closing round also compares the sampled tokens and fails on every rank
        if ranks disagree.

    Returns
    -------
    (tokens int32 [B], q): q is the same sparse ``Dyadic`` on every rank
    (``top_k`` given), or this rank's ``DyadicShard`` of the dense q.
    ``dyadic.distributed.last_exchange`` records the bytes sent.

    Raises
    ------
    On every rank, the same error: ``ValueError`` / ``TypeError`` (as the
    unsharded call, whichever rank saw the bad input), ``ValueError`` naming a
    replicated argument the ranks disagree on, ``DistributedError`` for any
    other exception on any rank (naming the rank, the original type and
    message) and for ranks out of step.
    """
    comm = Comm(group, "propose")
    try:
        dk = _device_kernels(local_logits)
        scope = contextlib.nullcontext() if dk is None else _device_scope(dk[0], local_logits)
        with scope:
            return _propose(comm, dk, local_logits, keys, vocab_offset, vocab_size, temperature,
                            bias, top_k, policy, check)
    except BaseException as exc:
        comm.fail(exc)


def _propose(comm, dk, local_logits, keys, vocab_offset, vocab_size, temperature, bias, top_k,
             policy, check):
    """propose on this rank's shard, over an array module ``xp``: NumPy with the CPU
    backend's shard kernels when ``dk`` is None (a CUDA tensor is copied to the host),
    else CuPy with the CUDA shard kernels, ``dk`` = (cupy, backends/cuda/cupy/shard.py).
    The checks, collectives, their sizes and their order are the same either way; the
    replicated arguments (temperature, greedy, keys) are host arrays (the header hashes
    them), uploaded for the CUDA kernels.

    Returns (tokens int32 [B], q): NumPy arrays or tensors on ``local_logits``' device
    (host shards), torch CUDA tensors (CUDA shards); q a ``Dyadic`` (``top_k`` given) or a
    ``DyadicShard``.
    """
    cp = None if dk is None else dk[0]
    xp = np if cp is None else cp
    x, b2, temp, code, width, kb, off, v, check = _prep_propose(
        local_logits, keys, vocab_offset, vocab_size, temperature, bias, top_k, policy, check,
        cp)
    batch, n = x.shape
    if cp is not None:
        comm.on_device(cp)
    hdr = comm.header(off, n, [v, batch, width or 0, code, b2 is not None, _crc(temp),
                               _crc(*kb), check])
    order, _ = _layout(hdr, _PROPOSE_FIELDS)
    greedy = temp == 0
    live = not greedy.all()
    kcand = width or 1
    ncol = 3 if b2 is not None else 2
    closing = close_plan(batch if check else 0)
    comm.plan(gather_plan((batch, 1 + kcand * ncol), np.int32))

    t_eff = _to(xp, np.where(greedy, 1.0, temp), np.float64)  # float64 [B]
    greedy_u8 = _to(xp, greedy, np.uint8)  # uint8 [B]
    kx = tuple(_to(xp, a) for a in kb)  # seed, gen, rnd, pos
    sk = _host_kernels() if dk is None else dk[1]
    payload = xp.empty((batch, 1 + kcand * ncol), dtype=np.int32)
    sk.topk(x, b2, t_eff, greedy_u8, kcand, off, v, payload)
    after = closing if width or not live else reduce_plan((batch, 2), "sum")
    g = xp.ascontiguousarray(comm.all_gather(payload, then=after)[order])

    policy_name = _POLICY_NAMES[code]
    if width:
        # merge, allocation and draw: identical on every rank
        tokens = xp.empty(batch, dtype=np.int32)
        counts = xp.empty((batch, width), dtype=np.uint32)
        ids = xp.empty((batch, width), dtype=np.int32)
        status = xp.empty(batch, dtype=np.int32)
        alloc_status = xp.empty(batch, dtype=np.int32)
        sk.merge(g, b2 is not None, kcand, t_eff, greedy_u8, code, v, width, *kx,
                 tokens, counts, ids, status, alloc_status)
        _raise_rows(xp, status, alloc_status)
        q = trusted_dyadic(_result(xp, counts, local_logits), _result(xp, ids, local_logits),
                           v, policy_name)
    else:
        tokens, counts = _propose_dense(comm, xp, sk, x, b2, t_eff, greedy, code, kx, off,
                                        order, g, closing)
        q = DyadicShard._of(_result(xp, counts, local_logits), off, v, policy_name)
    out = _result(xp, tokens.astype(np.int32), local_logits)
    comm.close(tokens if check else None)  # int32 or int64 [B]: compared as int64
    _finish(comm, "propose", batch, 1)
    return out, q


# ----------------------------------------------------------------------------- dense propose
#
# One implementation for both kinds of shard: ``xp`` is NumPy with the CPU shard kernels
# (host shards) or CuPy with the CUDA shard kernels (CUDA shards).  Every per-row step is
# array code over [B, n] / [S, B] arrays in exact uint64 / int64 (every operand typed,
# since uint64 mixed with int64 promotes to float64).  What steers the collectives
# (which rounds follow, how many radix digits) is decided on the host from replicated
# per-row scalars that every rank holds after a collective: the weight sums and the
# floor sums (on the device, one read of each).

I64 = np.int64


def _host(xp, a):
    """A small replicated array on the host (CuPy: one read of the device)."""
    return a if xp is np else xp.asnumpy(a)


def _f32_bits_to_f64(xp, bits):
    """float32 bit patterns (int32 [...]) as binary64, exactly as the host's conversion
    (subnormals, signed zeros, infinities kept; a NaN quiet), by integer operations: no
    float32 conversion instruction, which flushes subnormals under -ftz on the device,
    takes part."""
    b = bits.astype(np.uint32).astype(U64)
    sign = (b >> U64(31)) << U64(63)
    e = (b >> U64(23)) & U64(0xFF)
    m = b & U64(0x7FFFFF)
    normal = sign | ((e + U64(896)) << U64(52)) | (m << U64(29))
    quiet = xp.where(m != U64(0), U64(1 << 51), U64(0))  # a NaN comes out quiet, as on the CPU
    special = sign | U64(0x7FF0000000000000) | quiet | (m << U64(29))
    z = xp.where(e == U64(0xFF), special, xp.where(e == U64(0), sign, normal)).view(np.float64)
    sub = m.astype(np.float64) * 2.0 ** -149  # m < 2**23: exact, a normal binary64
    sub = xp.where(sign != U64(0), -sub, sub)
    return xp.where((e == U64(0)) & (m != U64(0)), sub, z)


def _merge_top1(xp, g, t_eff, has_bias):
    """Every row's global maximum z, its lowest global id and a status, from the gathered
    top-1 candidates g int32 [S, B, 1 + c] (shards in id order): (zmax float64 [B], arg
    int64 [B], status int32 [B]).  status: the first shard's non-zero payload status,
    else X_ZERO_MASS when no shard has a candidate above -inf.  zmax is the z of the
    argmax candidate itself (a zero keeps its sign)."""
    nshards, batch = g.shape[:2]
    ids = g[:, :, 3 if has_bias else 2].astype(I64)
    keep = ids >= I64(0)
    with np.errstate(all="ignore"):
        z = _f32_bits_to_f64(xp, g[:, :, 1])
        if has_bias:
            z = z + _f32_bits_to_f64(xp, g[:, :, 2])
        z = xp.where(keep, z / t_eff[None, :], -np.inf)
    top = z.max(axis=0)
    arg = xp.where(keep & (z == top[None, :]), ids, I64(1 << 62)).min(axis=0)
    zmax = xp.full(batch, -np.inf, dtype=np.float64)
    status = xp.zeros(batch, dtype=np.int32)
    for s in range(nshards - 1, -1, -1):
        zmax = xp.where(ids[s] == arg, z[s], zmax)
        status = xp.where(g[s, :, 0] != 0, g[s, :, 0], status)
    zero = ~(top > -np.inf)
    status = xp.where((status == 0) & zero, np.int32(_status.X_ZERO_MASS), status)
    return zmax, arg, status


def _propose_dense(comm, xp, sk, x, b2, t_eff, greedy, code, keys, off, order, g, closing):
    """Dense propose after the candidates round (planned on entry: the weight-sum round
    when a row is not greedy, else the closing round): (tokens int64 [B], counts uint32
    [B, n]) as ``xp`` arrays.  x, b2, t_eff, keys: ``xp`` arrays as the kernels ``sk``
    take them; greedy: host bool [B]; g: the gathered candidates in id order."""
    zmax, arg, status = _merge_top1(xp, g, t_eff, b2 is not None)
    _status.raise_for_status(_host(xp, status), lambda i: i)
    counts, status = _dense_counts(comm, xp, sk, x, b2, t_eff, zmax, arg, greedy, code, off,
                                   order)
    _status.raise_for_status(status, lambda i: i)
    if greedy.all():
        return arg, counts
    drawn = _dense_draw(comm, xp, sk, counts, xp.asarray(~greedy), keys, off, order, closing)
    return xp.where(xp.asarray(greedy), arg, drawn), counts


def _dense_counts(comm, xp, sk, x, b2, t_eff, zmax, arg, greedy, code, off, order):
    """This shard's dense counts (uint32 [B, n], ``xp``) and the rows' statuses (int32
    [B], host: X_ZERO_MASS, ALLOC_INCONSISTENT); greedy rows one-hot at the argmax.

    Planned on entry: the weight-sum round when a row is not greedy (else the
    closing round, and no collective happens here); leaves the draw's count-sum
    round planned.
    """
    batch, n = x.shape
    status = np.zeros(batch, dtype=np.int32)
    counts = xp.zeros((batch, n), dtype=U64)
    if not greedy.all():
        counts = _dense_alloc(comm, xp, sk, x, b2, t_eff, zmax, arg, greedy, code, off, order,
                              status)
    if greedy.any():  # a greedy row's counts are 0 so far: 2**24 at the argmax
        counts = _add_at(xp, counts, arg - I64(off),
                         xp.where(xp.asarray(greedy), U64(TOTAL), U64(0)))
    return counts.astype(np.uint32), status


def _add_at(xp, c, col, val):
    """c[b, col[b]] += val[b] (uint64) for the rows whose column col[b] (a local id, int64)
    lies in [0, n); returns c."""
    batch, n = c.shape
    if n == 0:
        return c
    inside = (col >= I64(0)) & (col < I64(n))
    c[xp.arange(batch), xp.where(inside, col, I64(0))] += xp.where(inside, val, U64(0))
    return c


def _dense_alloc(comm, xp, sk, x, b2, t_eff, zmax, arg, greedy, code, off, order, status):
    """The counts (uint64 [B, n]) of the rows that are not greedy (0 elsewhere): weights,
    floors and remainders, then the remaining tickets by the policy.  Sets ``status``
    (host) of rows whose weights sum to 0 or whose floor sum is inconsistent."""
    batch, n = x.shape
    draw_sums = gather_plan((batch,))
    standard = code == _spec.POLICY_CODES[_spec.POLICY_STANDARD]
    live = ~greedy
    w = xp.empty((batch, n), dtype=U64)
    wsum = xp.empty((batch, 2), dtype=U64)
    sk.dense_weights(x, b2, t_eff, zmax, xp.asarray(live.astype(np.uint8)), w, wsum)
    tot = _host(xp, comm.all_reduce(wsum.astype(I64), "sum"))
    s_tot = (tot[:, 0].astype(U64) << U64(32)) + tot[:, 1].astype(U64)  # exact: S <= 2**63
    status[live & (s_tot == 0)] = _status.X_ZERO_MASS
    live &= s_tot > 0
    width = 1 + (256 if standard else 0)
    comm.plan(reduce_plan((batch, width), "sum") if live.any() else draw_sums)
    base, rem = _floors(xp, w, s_tot, live)
    base_sum = base.sum(axis=1, dtype=U64).astype(I64)
    # global floor sum (and, for the standard policy, the first radix histogram)
    top = max([int(s).bit_length() for s in s_tot[live]] + [1])
    digit0 = (top - 1) // 8
    pay = xp.zeros((batch, width), dtype=I64)
    pay[:, 0] = base_sum
    if standard:
        pay[:, 1:] = _digit_hist(xp, rem, 8 * digit0, xp.asarray(live)[:, None])
    red = comm.all_reduce(pay, "sum") if live.any() else pay
    remaining = I64(TOTAL) - _host(xp, red[:, 0]).astype(I64)
    bad = live & ((remaining < 0) | (remaining >= TOTAL))
    status[bad] = _status.ALLOC_INCONSISTENT
    live &= ~bad
    need = np.where(live, remaining, I64(0))
    # A positive need stays positive through the radix digits (each digit keeps the
    # tickets still owed to values equal to the prefix), so the histogram rounds are
    # the digits below digit0 when any row still owes tickets, else none.
    radix = standard and bool((need > 0).any())
    hist_plan = reduce_plan((batch, 256), "sum")
    extra_plan = gather_plan((batch, 3)) if live.any() else draw_sums
    comm.plan(hist_plan if radix and digit0 > 0 else extra_plan)
    if not live.any():
        return xp.zeros((batch, n), dtype=U64)
    thr = xp.zeros(batch, dtype=U64)
    if radix:
        thr = _radix_threshold(comm, xp, rem, red[:, 1:], xp.asarray(need), digit0, hist_plan,
                               extra_plan)
    # after the last digit, thr is the threshold value: need[r] values equal to it are
    # still to be taken (lowest global ids first), every larger one is in.  Rows without
    # a threshold compare with 2**64 - 1, which no remainder reaches (rem < S <= 2**63).
    live_x = xp.asarray(live)
    ties_rows = live & (remaining > 0) if standard else np.zeros(batch, dtype=bool)
    thr = xp.where(xp.asarray(ties_rows), thr, U64(2**64 - 1))
    eq = rem == thr[:, None]
    gt = rem > thr[:, None]
    extra = xp.zeros((batch, 3), dtype=I64)  # ties, above, base sum (per shard)
    extra[:, 0] = xp.count_nonzero(eq, axis=1)
    extra[:, 1] = xp.count_nonzero(gt, axis=1)
    extra[:, 2] = xp.where(live_x, base_sum, I64(0))
    g = comm.all_gather(extra, then=draw_sums)[order]
    left = xp.asarray(np.where(live, remaining, I64(0)))
    c = base
    if standard:
        c += gt
        if comm.rank in order:
            c += _ties_taken(xp, eq, g, left, order.index(comm.rank))
    else:  # floor-first: the argmax owner adds the remaining tickets
        c = _add_at(xp, c, arg - I64(off), left.astype(U64))
    if bad.any():  # rows that raise: their counts are not used
        c = xp.where(live_x[:, None], c, U64(0))
    return c


def _floors(xp, w, s_tot, live):
    """(base, rem) = (floor(w 2**24 / S), w 2**24 mod S) (uint64 [B, n]) of the live rows,
    0 elsewhere; exact (w <= 2**39).  Consumes ``w``: rem is computed in its memory.  Row
    by row, so that the divisor is a scalar: NumPy divides by a scalar through a
    precomputed reciprocal, several times faster than by a broadcast array."""
    rem = w
    rem <<= U64(_spec.TOTAL_BITS)
    base = xp.empty_like(rem)
    dead = np.flatnonzero(~live)
    if dead.size:
        rem[xp.asarray(dead)] = U64(0)
        base[xp.asarray(dead)] = U64(0)
    for r in np.flatnonzero(live):
        s = U64(s_tot[r])
        xp.floor_divide(rem[r], s, out=base[r])
        rem[r] -= base[r] * s
    return base, rem


def _digit_hist(xp, rem, shift, sel):
    """int64 [B, 256]: per row, how many remainders selected by ``sel`` (bool [B, 1]: whole
    rows, or [B, n]) have each 8-bit digit (rem >> shift) & 0xFF.  NumPy: bincount row by
    row; CuPy: atomic additions of the selection flags per (row, digit) (cupy.add.at,
    or cupyx.scatter_add before CuPy 12; cupy.bincount and boolean indexing would read
    the device)."""
    batch, n = rem.shape
    if xp is np:
        hist = np.zeros((batch, 256), dtype=I64)
        for r in np.flatnonzero(sel.any(axis=1)):
            vals = rem[r] if sel.shape[1] == 1 else rem[r][sel[r]]
            hist[r] = np.bincount(((vals >> U64(shift)) & U64(0xFF)).astype(np.intp),
                                  minlength=256)
        return hist
    if n == 0:
        return xp.zeros((batch, 256), dtype=I64)
    key = ((rem >> U64(shift)) & U64(0xFF)) | (xp.arange(batch, dtype=U64) << U64(8))[:, None]
    flags = xp.broadcast_to(sel, rem.shape).astype(U64)
    hist = xp.zeros(batch * 256, dtype=U64)
    if hasattr(xp.add, "at"):  # CuPy >= 12: ufunc.at, atomic additions
        xp.add.at(hist, key.reshape(-1).astype(I64), flags.reshape(-1))
    else:
        import cupyx
        cupyx.scatter_add(hist, key.reshape(-1).astype(I64), flags.reshape(-1))
    return hist.astype(I64).reshape(batch, 256)


def _radix_threshold(comm, xp, rem, hist, need, digit0, hist_plan, extra_plan):
    """Every row's need[r]-th largest remainder (rows with need[r] > 0; 0 elsewhere) by an
    exact radix select, 8 bits a digit from digit0 down: ``hist`` is the all-reduced
    histogram of digit0; each further digit's histogram (of the remainders that match
    the prefix so far) is all-reduced in a round of its own."""
    prefix = xp.zeros(rem.shape[0], dtype=U64)
    for d in range(digit0, -1, -1):
        if d < digit0:
            # the remainders whose digits above d are the prefix's: [lo, lo + 2**(8d+8));
            # rows that owe nothing get the empty range [0, 0)
            owes = need > I64(0)
            lo = xp.where(owes, (prefix >> U64(8 * d + 8)) << U64(8 * d + 8), U64(0))
            hi = xp.where(owes, lo + U64(1 << (8 * d + 8)), U64(0))
            sel = (rem >= lo[:, None]) & (rem < hi[:, None])
            hist = comm.all_reduce(_digit_hist(xp, rem, 8 * d, sel), "sum",
                                   then=hist_plan if d else extra_plan)
        need, prefix = _radix_digit(xp, hist, need, prefix, d)
    return prefix


def _radix_digit(xp, hist, need, prefix, d):
    """One digit of the radix select for the rows with need > 0: the largest digit t whose
    count from the top (sum of hist[t:]) reaches need; then need -= the count above t
    and prefix |= t << 8d."""
    batch = hist.shape[0]
    upto = xp.cumsum(hist[:, ::-1], axis=1)[:, ::-1]  # upto[:, t] = sum(hist[:, t:])
    above = xp.concatenate([upto[:, 1:], xp.zeros((batch, 1), dtype=I64)], axis=1)
    t = xp.count_nonzero(upto >= need[:, None], axis=1).astype(I64) - I64(1)
    ok = (need > I64(0)) & (t >= I64(0))
    t = xp.maximum(t, I64(0))
    acc = xp.take_along_axis(above, t[:, None], axis=1)[:, 0]
    need = xp.where(ok, need - acc, need)
    prefix = xp.where(ok, prefix | (t.astype(U64) << U64(8 * d)), prefix)
    return need, prefix


def _ties_taken(xp, eq, g, left, mine):
    """bool [B, n]: the ties (eq: remainders equal to the threshold) this shard gives +1.
    Of a row's left - (every shard's count above the threshold) ties still owed, the
    lowest global ids get them: shard by shard in id order (g int64 [S, B, 3]: ties,
    above, base sum of each shard), within a shard in id order; mine: this shard's
    index in g."""
    ties = g[:, :, 0]
    owed = left - g[:, :, 1].sum(axis=0) - ties[:mine].sum(axis=0)
    take = xp.minimum(xp.maximum(owed, I64(0)), ties[mine])
    # the take-th tie is at the first column where the running tie count exceeds take - 1
    upto = xp.where(take > I64(0), _first_over(xp, eq, take - I64(1)) + I64(1), I64(0))
    return eq & (xp.arange(eq.shape[1], dtype=I64)[None, :] < upto[:, None])


def _first_over(xp, v, target, block=256):
    """int64 [B]: per row, the index of the first entry of v (non-negative integers or
    bool, [B, n]) at which the running sum exceeds target[b] (n if none), i.e. how many
    leading running sums are <= target[b]: exact block sums, then the running sum within
    the one block that passes target[b]."""
    batch, n = v.shape
    if n == 0:
        return xp.zeros(batch, dtype=I64)
    nb, full = -(-n // block), n // block
    sums = v[:, :full * block].reshape(batch, full, block).sum(axis=2, dtype=I64)
    if full < nb:
        sums = xp.concatenate([sums, v[:, full * block:].sum(axis=1, dtype=I64)[:, None]], axis=1)
    ends = xp.cumsum(sums, axis=1)  # running sums at the blocks' ends
    at = xp.minimum(xp.count_nonzero(ends <= target[:, None], axis=1).astype(I64), I64(nb - 1))
    start = xp.take_along_axis(ends, xp.maximum(at - I64(1), I64(0))[:, None], axis=1)[:, 0]
    start = xp.where(at > I64(0), start, I64(0))
    cols = at[:, None] * I64(block) + xp.arange(block, dtype=I64)[None, :]
    inside = cols < I64(n)
    inner = xp.take_along_axis(v, xp.where(inside, cols, I64(0)), axis=1).astype(I64)
    inner = xp.cumsum(xp.where(inside, inner, I64(0)), axis=1)
    within = xp.count_nonzero(inner <= (target - start)[:, None], axis=1).astype(I64)
    return xp.minimum(at * I64(block) + within, I64(n))


def _dense_draw(comm, xp, sk, counts, live, keys, off, order, closing):
    """The tokens of the rows with ``live`` (int64 [B], -1 elsewhere), planned on entry:
    the count-sum round.  The ticket's owner is the first shard whose cumulative count
    exceeds it; the owner finds the token by first-exceeding within its ids, and an
    all-reduce (max) gives every rank the global id."""
    batch, n = counts.shape
    g = comm.all_gather(counts.sum(axis=1, dtype=I64), then=reduce_plan((batch,), "max"))[order]
    tickets = xp.empty(batch, dtype=I64)
    sk.proposal_tickets(*keys, tickets)
    cum = xp.cumsum(g, axis=0)
    # the first shard whose cumulative count exceeds the ticket (counts are >= 0, so cum
    # is non-decreasing over the shards); shard 0 if none does (every row sums to 2**24)
    owner = xp.count_nonzero(cum <= tickets[None, :], axis=0).astype(I64)
    owner = xp.where(owner < I64(len(order)), owner, I64(0))
    rows = xp.arange(batch)
    before = (cum - g)[owner, rows]
    mine = live & (xp.asarray(np.asarray(order, dtype=I64))[owner] == I64(comm.rank))
    local = _first_over(xp, counts, tickets - before)
    red = comm.all_reduce(xp.where(mine, local + I64(off), I64(-1)), "max", then=closing)
    return xp.where(live, red, I64(-1))


# ----------------------------------------------------------------------------- verify

def _prep_verify(local_target, draft, q, keys, vocab_offset, vocab_size, greedy, check,
                 cp=None):
    """The checked arguments of a sharded verify, in the order of the unsharded call's
    checks: the shard's target (and a ``DyadicShard`` q's counts) as C-contiguous NumPy
    arrays, or with ``cp`` (CuPy) on the device; the replicated arguments (draft, a
    replicated q, greedy, keys) on the host either way (the header hashes them)."""
    check = _validate.check_mode(check)
    _validate.target_dtype(local_target)
    if cp is None:
        t = np.ascontiguousarray(_float_local(local_target, "target"))
    else:
        t = cp.ascontiguousarray(cp.asarray(local_target.detach().contiguous()))
    if t.ndim != 3:
        raise ValueError(f"target: expected the local shape [B, k+1, n], got {tuple(t.shape)}")
    batch, k1, n = t.shape
    if k1 < 1:
        raise ValueError("target: needs k+1 >= 1 rows per request")
    off, v = _offset_size(vocab_offset, vocab_size, n)
    d = _int_local(draft, "draft")
    if d.shape != (batch, k1 - 1):
        raise ValueError(f"draft: shape {d.shape} must be (B, k) = {(batch, k1 - 1)} to match "
                         f"target")
    bad = ((d < 0) | (d >= v)).any(axis=1) if d.size else np.zeros(batch, bool)
    if bad.any():
        raise ValueError(f"draft: row {int(np.flatnonzero(bad)[0])}: token ids must be in "
                         f"[0, {v})")
    d = np.ascontiguousarray(d.astype(np.int64))
    qkind, qc, qi = 0, None, None
    if isinstance(q, DyadicShard):
        on_dev = cp is not None and _arrays.is_torch(q.counts) and q.counts.device.type == "cuda"
        qc = q.counts.detach() if on_dev else _int_local(q.counts, "q.counts")
        if (tuple(qc.shape) != (batch, k1 - 1, n) or q.vocab_offset != off
                or q.vocab_size != v):
            raise ValueError(f"q: shard shape {tuple(qc.shape)} / offset {q.vocab_offset} / "
                             f"vocab_size {q.vocab_size} must be {(batch, k1 - 1, n)} / {off} / "
                             f"{v}")
        if on_dev:
            qc = _shard_rows(cp, qc, "q.counts")
        else:
            qc = _shard_rows(np, qc, "q.counts")
            if cp is not None:
                qc = _up(cp, qc)
        qkind = 3
    elif isinstance(q, Dyadic):
        if q.batch_shape != (batch, k1 - 1):
            raise ValueError(f"q: batch shape {q.batch_shape} must be (B, k) = "
                             f"{(batch, k1 - 1)}")
        if q.vocab_size != v:
            raise ValueError(f"q: vocab_size {q.vocab_size} does not match {v}")
        qc = np.ascontiguousarray(_int_local(q.counts, "q.counts"), dtype=np.uint32)
        qkind = 2
        if q.ids is not None:
            qi = np.ascontiguousarray(_int_local(q.ids, "q.ids"), dtype=np.int32)
            qkind = 1
    elif q is not None:
        raise TypeError(f"q: expected a dyadic.Dyadic, a dyadic.distributed.DyadicShard or None "
                        f"(point-mass q), got {type(q).__name__}")
    if greedy is None:
        g = np.zeros(batch, dtype=bool)
    else:
        g = _arrays.bool_to_numpy(greedy, "greedy")
        if g.shape != (batch,):
            raise ValueError(f"greedy: shape {g.shape} must be (B,) = ({batch},)")
    kb = _keys(keys, batch, extra=k1 - 1)
    return t, d, qkind, qc, qi, g, kb, off, v, check


def _q_at_drafts(qkind, qc, qi, d, gf):
    """q(d) uint32 [B, k] at every draft: from the gathered owner counts (a sharded q) or
    the replicated q (sparse: the first matching id, else 0)."""
    k = d.shape[1]
    if qkind == 0:
        return np.full(d.shape, TOTAL, dtype=np.uint32)
    if qkind == 3:
        return gf[:, :, :k, 7].sum(axis=0).astype(np.uint32)
    if qkind == 2:
        return np.take_along_axis(qc, d[..., None], axis=2)[..., 0].astype(np.uint32)
    hit = qi == d[..., None]
    at = np.take_along_axis(qc, hit.argmax(axis=2)[..., None], axis=2)[..., 0]
    return np.where(hit.any(axis=2), at, 0).astype(np.uint32)


def _q_kernel_args(qkind, qc, qi, d, off):
    """(q_dense, q_offset, q_counts, q_ids) of the residual kernels for each kind of q."""
    if qkind == 0:  # point mass at the draft: the sparse row (d, 2**24)
        return (None, 0, np.full(d.shape + (1,), TOTAL, dtype=np.uint32),
                np.ascontiguousarray(d[..., None], dtype=np.int32))
    if qkind == 3:
        return qc, 0, None, None
    if qkind == 2:
        return qc, off, None, None
    return None, 0, qc, qi


def verify(local_target, draft, q, keys, *, vocab_offset, vocab_size, group=None, greedy=None,
           check=True):
    """Sharded ``dyadic.verify``: the same ``Verdict`` on every rank.

    Parameters
    ----------
    local_target : float32 [B, k+1, n]
        This rank's target probabilities for ids [vocab_offset, vocab_offset + n).
    draft : integer [B, k] (global ids, identical on every rank).
    q : the q the drafts were drawn from: a ``Dyadic`` over the full vocabulary
        (sparse or dense, identical on every rank), this rank's ``DyadicShard``
        of a dense q (as returned by ``dyadic.distributed.propose``), or None
        (point-mass q).
    keys, greedy : as in ``dyadic.verify`` (identical on every rank; checked).
    check : True or False (identical on every rank; checked).  True: the
        closing round also compares the tokens and fails on every rank if
        ranks disagree.

    Returns
    -------
    ``Verdict``: accepted int32 [B], tokens int32 [B, k+1] (-1 after the
    emitted tokens), identical on every rank.

    Raises
    ------
    On every rank, the same error, as ``propose`` does.
    """
    comm = Comm(group, "verify")
    try:
        dk = _device_kernels(local_target)
        if dk is not None:
            with _device_scope(dk[0], local_target):
                return _verify_device(comm, dk, local_target, draft, q, keys, vocab_offset,
                                      vocab_size, greedy, check)
        return _verify(comm, local_target, draft, q, keys, vocab_offset, vocab_size, greedy,
                       check)
    except BaseException as exc:
        comm.fail(exc)


def _verify(comm, local_target, draft, q, keys, vocab_offset, vocab_size, greedy, check):
    t, d, qkind, qc, qi, g, kb, off, v, check = _prep_verify(
        local_target, draft, q, keys, vocab_offset, vocab_size, greedy, check)
    qrep = None if qkind in (0, 3) else (qc, qi)
    hdr = comm.header(off, t.shape[2], [v, t.shape[0], t.shape[1], qkind, _crc(d),
                                        _crc(*(qrep or (None,))), _crc(g), _crc(*kb), check])
    order, offsets = _layout(hdr, _VERIFY_FIELDS)
    batch, k1, n = t.shape
    k = k1 - 1
    seed, gen, rnd, pos = kb
    live = not g.all()
    closing = close_plan(batch * k1 if check else 0)
    comm.plan(gather_plan((batch, k1, 9)))

    # round 1: per (row, position) exact summaries of this shard
    sk = _host_kernels()
    f = np.empty((batch, k1, 9), dtype=np.int64)
    status = np.empty(batch, dtype=np.int32)
    g8 = g.astype(np.uint8)
    sk.target_summary(t, d, qc if qkind == 3 else None, g8, off, v, f, status)
    _status.raise_for_status(status)
    gf = np.ascontiguousarray(
        comm.all_gather(f, then=gather_plan((batch, 3)) if live else closing)[order])

    if qkind == 3:
        qsum = gf[:, :, :k, 8].sum(axis=0)
        bad = np.argwhere(qsum != TOTAL)
        if bad.size:
            b0, i0 = (int(z) for z in bad[0])
            raise ValueError(f"q.counts: row {b0 * k + i0}: counts must sum to exactly 2**24 "
                             f"over the shards (they sum to {int(qsum[b0, i0])})")
    cd = _q_at_drafts(qkind, qc, qi, d, gf)
    # validation and acceptance: pure functions of (T, P_d, c_d, argmax, keys) that every
    # rank now holds
    total = np.empty((batch, k1), dtype=np.uint64)
    pd = np.empty((batch, k), dtype=np.uint64)
    best = np.empty((batch, k1), dtype=np.int32)
    sk.verify_check(gf, cd, g8, total, pd, best, status)
    _status.raise_for_status(status)
    accepted = np.empty(batch, dtype=np.int32)
    tokens = np.empty((batch, k1), dtype=np.int32)
    draw_at = np.empty(batch, dtype=np.int32)
    sk.verify_accept(d, cd, total, pd, best, g8, seed, gen, rnd, pos, accepted, tokens, draw_at,
                     status)
    _status.raise_for_status(status)
    rows = np.flatnonzero(draw_at >= 0)
    if bool(rows.size) != live:
        raise AssertionError("dyadic.distributed: internal error: rows to draw do not match "
                             "the planned rounds")

    if rows.size:
        # round 2: this shard's exact mass of the distribution to draw from
        qargs = _q_kernel_args(qkind, qc, qi, d, off)
        mass = np.empty((batch, 3), dtype=np.int64)
        sk.residual_mass(t, draw_at, *qargs, off, total, mass)
        gm = comm.all_gather(mass, then=reduce_plan((batch,), "max"))
        gm = np.ascontiguousarray(gm[order])
        # X = uniform_below(total mass) and its owner: the first shard whose cumulative
        # mass exceeds X (a zero-mass shard never does); the same on every rank
        owner = np.empty(batch, dtype=np.int32)
        rel_hi, rel_lo = np.empty(batch, dtype=np.uint64), np.empty(batch, dtype=np.uint64)
        sk.correction_pick(gm, draw_at, seed, gen, rnd, pos, owner, rel_hi, rel_lo, status)
        if (owner == -2).any():  # the reference's uniform_below refuses n = 0 the same way
            raise ValueError("uniform_below: n=0 out of range [1, 2**128)")
        _status.raise_for_status(status)
        ranks = np.asarray(order, dtype=np.int64)[np.maximum(owner, 0)]
        mine = np.where((owner >= 0) & (ranks == comm.rank), draw_at, -1).astype(np.int32)
        local = np.empty(batch, dtype=np.int64)
        sk.residual_find(t, mine, *qargs, off, total, rel_hi, rel_lo, local)
        if ((mine >= 0) & (local < 0)).any():
            raise AssertionError("dyadic.distributed: internal error: draw beyond the "
                                 "shard's mass")
        # round 3: the owner's token to everyone
        red = comm.all_reduce(local, "max", then=closing)
        tokens[rows, draw_at[rows]] = red[rows]
    verdict = Verdict(_output(accepted, local_target), _output(tokens, local_target))
    comm.close(tokens if check else None)
    _finish(comm, "verify", batch, k1)
    return verdict


# ----------------------------------------------------------------------------- device

def _device_kernels(x):
    """(cupy, the CUDA shard kernels of backends/cuda/cupy/shard.py) when ``x`` is a CUDA
    tensor and the cuda backend loads; None otherwise (the host kernels run, on a host
    copy of a CUDA shard)."""
    if not (_arrays.is_torch(x) and x.device.type == "cuda"):
        return None
    try:
        _backend.get("cuda")
    except _backend.BackendUnavailable:
        return None
    from ..backends.cuda.cupy import runtime, shard
    return runtime.cupy(), shard


def _device_scope(cp, t):
    """The tensor's device current, and CuPy's launches on torch's current stream of that
    device (the stream the collectives and the caller's tensors are ordered on)."""
    import torch

    from ..backends.cuda.cupy import runtime
    scope = contextlib.ExitStack()
    scope.enter_context(cp.cuda.Device(t.device.index))
    handle = torch.cuda.current_stream(t.device).cuda_stream
    scope.enter_context(runtime.external_stream(handle))
    return scope


def _float_dev(cp, x, name):
    """A CUDA float tensor as a C-contiguous CuPy float32 array (float16 / bfloat16
    widened exactly by torch; the same memory for float32)."""
    import torch
    x = x.detach()
    if x.dtype in (torch.float16, torch.bfloat16):
        x = x.to(torch.float32)
    elif x.dtype != torch.float32:
        raise _arrays.unsupported_float(name, x)
    return cp.ascontiguousarray(cp.asarray(x.contiguous()))


def _float_any(cp, x, name):
    """A float argument on the device: CUDA tensors stay there, host arrays are uploaded."""
    if _arrays.is_torch(x) and x.device.type == "cuda":
        return _float_dev(cp, x, name)
    return cp.asarray(np.ascontiguousarray(_float_local(x, name)))


def _up(cp, a, dtype=None):
    """Host array -> C-contiguous CuPy array (an upload; nothing comes back)."""
    return cp.asarray(np.ascontiguousarray(a if dtype is None else np.asarray(a, dtype=dtype)))


def _out_dev(arr):
    """A CuPy result as a torch CUDA tensor (the same memory)."""
    import torch
    return torch.from_dlpack(arr)


def _verify_device(comm, dk, local_target, draft, q, keys, vocab_offset, vocab_size, greedy,
                   check):
    """verify with this rank's shard on the device (the host path's steps and checks in
    the same order; the shard kernels of backends/cuda/cupy/shard.py).  Replicated
    arguments (draft, a replicated q, greedy, keys) are read on the host for the
    header's CRC32s, and uploaded."""
    cp, sk = dk
    t, d, qkind, qc, qi, g, kb, off, v, check = _prep_verify(
        local_target, draft, q, keys, vocab_offset, vocab_size, greedy, check, cp)
    batch, k1, n = t.shape
    qdev = qc if qkind == 3 else None
    comm.on_device(cp)
    qrep = None if qkind in (0, 3) else (qc, qi)
    hdr = comm.header(off, n, [v, batch, k1, qkind, _crc(d), _crc(*(qrep or (None,))), _crc(g),
                               _crc(*kb), check])
    order, _ = _layout(hdr, _VERIFY_FIELDS)
    k = k1 - 1
    live = not g.all()
    closing = close_plan(batch * k1 if check else 0)
    comm.plan(gather_plan((batch, k1, 9)))

    # round 1: per (row, position) exact summaries of this shard
    d_dev = _up(cp, d)
    g8 = _up(cp, g, np.uint8)
    seed, gen, rnd, pos = (_up(cp, a) for a in kb)
    f = cp.empty((batch, k1, 9), dtype=np.int64)
    status = cp.empty(batch, dtype=np.int32)
    sk.target_summary(t, d_dev, qdev if qkind == 3 else None, g8, off, v, f, status)
    _raise_rows(cp, status)
    gf = cp.ascontiguousarray(
        comm.all_gather(f, then=gather_plan((batch, 3)) if live else closing)[order])

    if qkind == 3:
        qsum = gf[:, :, :k, 8].sum(axis=0)
        badq = cp.asnumpy(qsum != TOTAL)
        if badq.any():
            b0, i0 = (int(z) for z in np.argwhere(badq)[0])
            raise ValueError(f"q.counts: row {b0 * k + i0}: counts must sum to exactly 2**24 "
                             f"over the shards (they sum to {int(qsum[b0, i0])})")
        cd = cp.ascontiguousarray(gf[:, :, :k, 7].sum(axis=0).astype(np.uint32))
    else:  # a replicated q (or none): q(d) from the host copies the header hashed
        cd = _up(cp, _q_at_drafts(qkind, qc, qi, d, None), np.uint32)
    # validation and acceptance: pure functions of (T, P_d, c_d, argmax, keys) that every
    # rank now holds (the acceptance of a row that fails validation is not used)
    total = cp.empty((batch, k1), dtype=np.uint64)
    pd = cp.empty((batch, k), dtype=np.uint64)
    best = cp.empty((batch, k1), dtype=np.int32)
    status_acc = cp.empty(batch, dtype=np.int32)
    sk.verify_check(gf, cd, g8, total, pd, best, status)
    accepted = cp.empty(batch, dtype=np.int32)
    tokens = cp.empty((batch, k1), dtype=np.int32)
    draw_at = cp.empty(batch, dtype=np.int32)
    sk.verify_accept(d_dev, cd, total, pd, best, g8, seed, gen, rnd, pos, accepted, tokens,
                     draw_at, status_acc)
    _raise_rows(cp, status, status_acc)

    if live:
        # round 2: this shard's exact mass of the distribution to draw from
        if qkind == 0:  # point mass at the draft: the sparse row (d, 2**24)
            qargs = (None, 0, cp.full((batch, k, 1), TOTAL, dtype=np.uint32),
                     cp.ascontiguousarray(d_dev[..., None].astype(np.int32)))
        elif qkind == 3:
            qargs = (qdev, 0, None, None)
        elif qkind == 2:
            qargs = (_up(cp, qc), off, None, None)
        else:
            qargs = (None, 0, _up(cp, qc), _up(cp, qi))
        mass = cp.empty((batch, 3), dtype=np.int64)
        sk.residual_mass(t, draw_at, *qargs, off, total, mass)
        gm = cp.ascontiguousarray(
            comm.all_gather(mass, then=reduce_plan((batch,), "max"))[order])
        # X = uniform_below(total mass) and its owner: the first shard whose cumulative
        # mass exceeds X (a zero-mass shard never does); the same on every rank
        owner = cp.empty(batch, dtype=np.int32)
        rel_hi = cp.empty(batch, dtype=np.uint64)
        rel_lo = cp.empty(batch, dtype=np.uint64)
        sk.correction_pick(gm, draw_at, seed, gen, rnd, pos, owner, rel_hi, rel_lo, status)
        flags = cp.asnumpy(cp.stack([status, (owner == -2).astype(np.int32)]))
        if flags[1].any():  # the reference's uniform_below refuses n = 0 the same way
            raise ValueError("uniform_below: n=0 out of range [1, 2**128)")
        _status.raise_for_status(flags[0], lambda i: i)
        ranks = _up(cp, order, np.int64)[cp.maximum(owner, 0)]
        mine = cp.where((owner >= 0) & (ranks == comm.rank), draw_at, -1).astype(np.int32)
        local = cp.empty(batch, dtype=np.int64)
        sk.residual_find(t, mine, *qargs, off, total, rel_hi, rel_lo, local)
        if bool(((mine >= 0) & (local < 0)).any()):
            raise AssertionError("dyadic.distributed: internal error: draw beyond the "
                                 "shard's mass")
        # round 3: the owner's token to everyone
        red = comm.all_reduce(local, "max", then=closing)
        rows = cp.arange(batch)
        at = cp.maximum(draw_at, 0)
        tokens[rows, at] = cp.where(draw_at >= 0, red.astype(np.int32), tokens[rows, at])
    verdict = Verdict(_out_dev(accepted), _out_dev(tokens))
    comm.close(tokens if check else None)
    _finish(comm, "verify", batch, k1)
    return verdict
