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
A CUDA shard of a top-k propose or of verify stays on its GPU: the same
functions of ``backends/cuda/cupy/shard.py`` (NVRTC over the same
``dyadic_shard.h``) on CuPy arrays, the collectives on CUDA tensors
(``_propose_device`` / ``_verify_device``; without CuPy, and for dense
propose, it is copied to the host).  The dense allocation's floors, remainders and radix histograms are
NumPy on exact uint64 limbs.

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


def _effective_logits(x, b, temperature):
    """z = (x + b) / T in binary64 (the documented conversion), rows of ``x``
    (float32 [B, n]); ``b`` None or float32 [1 or B, n]; T float64 [B]."""
    with np.errstate(all="ignore"):
        z = x.astype(np.float64)
        if b is not None:
            z = z + b.astype(np.float64)
        return z / temperature[:, None]


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
        _shard_rows(host, "counts")
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


def _shard_rows(c, name):
    """Row rules of a shard's host counts [..., n]: uint32, every entry and every row's
    sum over the shard <= 2**24 (the rows' sums over all shards are checked in verify)."""
    if c.ndim < 1:
        raise ValueError(f"{name}: expected shape [..., n], got a scalar")
    if c.dtype != np.uint32:
        raise TypeError(f"{name}: dtype {_arrays.dtype_name(c)}; expected uint32")
    if c.size == 0:
        return
    rows = c.reshape(-1, c.shape[-1])
    _first_bad((rows > TOTAL).any(axis=1), name, "each count must be <= 2**24")
    _first_bad(rows.astype(np.uint64).sum(axis=1) > TOTAL, name,
               "the shard's counts sum to more than 2**24")


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


def _local_top(z, k):
    """Local indices of the k largest z (ties: lowest index), in no particular order."""
    n = z.shape[0]
    if n <= k:
        return np.arange(n)
    kth = np.partition(z, n - k)[n - k]
    gt = np.flatnonzero(z > kth)
    eq = np.flatnonzero(z == kth)[:k - gt.size]
    return np.concatenate([gt, eq])


def _row_status(z):
    bad = np.isnan(z) | (z == np.inf)
    if not bad.any():
        return 0
    return _status.X_NAN if np.isnan(z[int(np.argmax(bad))]) else _status.X_POSINF


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
    argument): on the GPU for a CUDA tensor with ``top_k`` given when the
    cuda backend (CuPy) loads, else in the CPU backend's kernels on the host
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
        dk = _device_kernels(local_logits) if top_k is not None else None
        if dk is not None:
            with _device_scope(dk[0], local_logits):
                return _propose_device(comm, dk, local_logits, keys, vocab_offset, vocab_size,
                                       temperature, bias, top_k, policy, check)
        return _propose(comm, local_logits, keys, vocab_offset, vocab_size, temperature, bias,
                        top_k, policy, check)
    except BaseException as exc:
        comm.fail(exc)


def _propose(comm, local_logits, keys, vocab_offset, vocab_size, temperature, bias, top_k,
             policy, check):
    x, b2, temp, code, width, kb, off, v, check = _prep_propose(
        local_logits, keys, vocab_offset, vocab_size, temperature, bias, top_k, policy, check)
    batch, n = x.shape
    hdr = comm.header(off, n, [v, batch, width or 0, code, b2 is not None, _crc(temp),
                               _crc(*kb), check])
    order, offsets = _layout(hdr, _PROPOSE_FIELDS)
    seed, gen, rnd, pos = kb
    greedy = temp == 0
    live = not greedy.all()
    kcand = width or 1
    ncol = 3 if b2 is not None else 2
    closing = close_plan(batch if check else 0)
    comm.plan(gather_plan((batch, 1 + kcand * ncol), np.int32))

    t_eff = np.where(greedy, 1.0, temp)
    greedy_u8 = greedy.astype(np.uint8)
    sk = _host_kernels()
    payload = np.empty((batch, 1 + kcand * ncol), dtype=np.int32)
    sk.topk(x, b2, t_eff, greedy_u8, kcand, off, v, payload)
    after = closing if width or not live else reduce_plan((batch, 2), "sum")
    g = np.ascontiguousarray(comm.all_gather(payload, then=after)[order])

    policy_name = _POLICY_NAMES[code]
    if width:
        # merge, allocation and draw: identical on every rank
        tokens = np.empty(batch, dtype=np.int32)
        counts = np.empty((batch, width), dtype=np.uint32)
        ids = np.empty((batch, width), dtype=np.int32)
        status = np.empty(batch, dtype=np.int32)
        alloc_status = np.empty(batch, dtype=np.int32)
        sk.merge(g, b2 is not None, kcand, t_eff, greedy_u8, code, v, width, seed, gen, rnd, pos,
                 tokens, counts, ids, status, alloc_status)
        _status.raise_for_status(status, lambda i: i)
        _status.raise_for_status(alloc_status, lambda i: i)
        q = trusted_dyadic(_output(counts, local_logits), _output(ids, local_logits), v,
                           policy_name)
        tokens = tokens.astype(np.int64)
    else:
        tokens = np.full(batch, -1, dtype=np.int64)
        status = np.zeros(batch, dtype=np.int32)
        merged = _merge_top1(g, t_eff, b2 is not None, status)
        _status.raise_for_status(status, lambda i: i)
        counts = _dense_counts(comm, x, b2, t_eff, merged, greedy, code, off, order, status)
        _status.raise_for_status(status, lambda i: i)
        if live:
            _dense_draw(comm, counts, greedy, kb, off, order, tokens, closing)
        for r in range(batch):
            if greedy[r]:
                tokens[r] = merged[r][1][0]
        q = DyadicShard._of(_output(counts, local_logits), off, v, policy_name)
    out = _output(tokens.astype(np.int32), local_logits)
    comm.close(tokens if check else None)
    _finish(comm, "propose", batch, 1)
    return out, q


def _merge_top1(g, t_eff, has_bias, status):
    """Dense propose: every row's (z sorted descending, global ids) of the gathered top-1
    candidates (g int32 [S, B, 1 + c]), or None for a failed row (status set)."""
    ncol = 3 if has_bias else 2
    merged = []
    for r in range(g.shape[1]):
        st = next((int(s) for s in g[:, r, 0] if s), 0)
        if st:
            status[r] = st
            merged.append(None)
            continue
        cx = g[:, r, 1]
        cg = g[:, r, ncol]
        keep = cg >= 0
        cb = g[:, r, 2][keep].view(np.float32)[None] if has_bias else None
        cz = _effective_logits(cx[keep].view(np.float32)[None], cb, t_eff[r:r + 1])[0]
        cg = cg[keep].astype(np.int64)
        o = np.lexsort((cg, -cz))
        cz, cg = cz[o], cg[o]
        if cz.size == 0 or cz[0] == -np.inf:
            status[r] = _status.X_ZERO_MASS
            merged.append(None)
            continue
        merged.append((cz, cg))
    return merged


def _dense_counts(comm, x, b2, t_eff, merged, greedy, code, off, order, status):
    """This shard's dense counts (uint32 [B, n]); greedy rows one-hot at the argmax.

    Planned on entry: the weight-sum round when a row is not greedy (else the
    closing round, and no collective happens here); leaves the draw's count-sum
    round planned.
    """
    batch, n = x.shape
    counts = np.zeros((batch, n), dtype=np.uint64)
    live = [r for r in range(batch) if not greedy[r]]
    draw_sums = gather_plan((batch,))
    standard = code == _spec.POLICY_CODES[_spec.POLICY_STANDARD]
    if live:
        zmax = np.array([merged[r][0][0] if not greedy[r] else 0.0 for r in range(batch)])
        w = np.empty((batch, n), dtype=np.uint64)
        wsum = np.empty((batch, 2), dtype=np.uint64)
        _host_kernels().dense_weights(x, b2, t_eff, zmax, (~greedy).astype(np.uint8), w, wsum)
        sums = wsum.astype(np.int64)
        tot = comm.all_reduce(sums, "sum")
        s_tot = {r: (int(tot[r, 0]) << 32) + int(tot[r, 1]) for r in live}
        live = [r for r in live if s_tot[r] > 0]
        comm.plan(reduce_plan((batch, 1 + (256 if standard else 0)), "sum") if live
                  else draw_sums)
        for r in s_tot:
            if s_tot[r] <= 0:
                status[r] = _status.X_ZERO_MASS
        base, rem = {}, {}
        for r in live:
            mw = w[r] << U64(_spec.TOTAL_BITS)
            base[r], rem[r] = mw // U64(s_tot[r]), mw % U64(s_tot[r])
        base_sum = np.zeros(batch, dtype=np.int64)
        for r in live:
            base_sum[r] = int(base[r].sum(dtype=U64))
        need = {}
        prefix = {r: 0 for r in live}
        # global floor sum (and, for the standard policy, the first radix histogram)
        top = max([s_tot[r].bit_length() for r in live] + [1])
        digit0 = (top - 1) // 8 if standard else -1
        pay = np.zeros((batch, 1 + (256 if standard else 0)), dtype=np.int64)
        pay[:, 0] = base_sum
        if standard:
            for r in live:
                pay[r, 1:] = np.bincount(
                    ((rem[r] >> U64(8 * digit0)) & U64(0xFF)).astype(np.intp), minlength=256)
        red = comm.all_reduce(pay, "sum") if live else pay
        for r in live:
            remaining = TOTAL - int(red[r, 0])
            if not 0 <= remaining < TOTAL:
                status[r] = _status.ALLOC_INCONSISTENT
            need[r] = remaining
        live = [r for r in live if not status[r]]
        # A positive need stays positive through the radix digits (each digit keeps the
        # tickets still owed to values equal to the prefix), so the histogram rounds are
        # the digits below digit0 when any row still owes tickets, else none.
        radix = standard and any(need[r] for r in live)
        hist_plan = reduce_plan((batch, 256), "sum")
        extra_plan = gather_plan((batch, 3)) if live else draw_sums
        comm.plan(hist_plan if radix and digit0 > 0 else extra_plan)
        if radix:
            # radix select of the `remaining`-th largest remainder, 8 bits per round
            hist = red[:, 1:]
            for d in range(digit0, -1, -1):
                if d < digit0:
                    hist = np.zeros((batch, 256), dtype=np.int64)
                    for r in live:
                        if need[r]:
                            sel = (rem[r] >> U64(8 * d + 8)) == U64(prefix[r] >> (8 * d + 8))
                            hist[r] = np.bincount(
                                ((rem[r][sel] >> U64(8 * d)) & U64(0xFF)).astype(np.intp),
                                minlength=256)
                    hist = comm.all_reduce(hist, "sum", then=hist_plan if d else extra_plan)
                for r in live:
                    if not need[r]:
                        continue
                    acc = 0
                    for t in range(255, -1, -1):
                        h = int(hist[r, t])
                        if acc + h >= need[r]:
                            need[r] -= acc
                            prefix[r] |= t << (8 * d)
                            break
                        acc += h
        # after the last digit, prefix is the threshold value: need[r] values equal
        # to it are still to be taken (lowest global ids first), every larger one is in
        extra = np.zeros((batch, 3), dtype=np.int64)  # ties, above, base sum (per shard)
        thr = {}
        for r in live:
            extra[r, 2] = base_sum[r]
            if standard and TOTAL - int(red[r, 0]) > 0:
                thr[r] = prefix[r]
                extra[r, 0] = int((rem[r] == U64(thr[r])).sum())
                extra[r, 1] = int((rem[r] > U64(thr[r])).sum())
        g = comm.all_gather(extra, then=draw_sums)[order] if live else None
        for r in live:
            c = base[r].copy()
            if standard and r in thr:
                c += (rem[r] > U64(thr[r])).astype(U64)
                above = int(g[:, r, 1].sum())
                ties_left = TOTAL - int(red[r, 0]) - above
                for s, rank_ties in enumerate(g[:, r, 0].tolist()):
                    take = max(0, min(rank_ties, ties_left))
                    if order[s] == comm.rank and take:
                        tie_idx = np.flatnonzero(rem[r] == U64(thr[r]))[:take]
                        c[tie_idx] += U64(1)
                    ties_left -= take
            elif not standard:
                arg = int(merged[r][1][0])
                if off <= arg < off + n:
                    c[arg - off] += U64(TOTAL - int(red[r, 0]))
            counts[r] = c
    for r in range(batch):
        if greedy[r] and merged[r] is not None:
            arg = int(merged[r][1][0])
            if off <= arg < off + n:
                counts[r, arg - off] = TOTAL
    return counts.astype(np.uint32)


def _dense_draw(comm, counts, greedy, kb, off, order, tokens, closing):
    """Tokens of the rows that are not greedy (planned on entry: the count-sum round)."""
    batch, n = counts.shape
    sums = counts.astype(np.int64).sum(axis=1)
    g = comm.all_gather(sums, then=reduce_plan((batch,), "max"))[order]
    tickets = np.empty(batch, dtype=np.int64)
    _host_kernels().proposal_tickets(*kb, tickets)
    live = ~np.asarray(greedy, dtype=bool)
    # the owner of row r: the first shard whose cumulative count exceeds the ticket
    cum = np.cumsum(g, axis=0)
    owner = (cum > tickets[None, :]).argmax(axis=0)
    mine = live & (np.asarray(order)[owner] == comm.rank)
    local = np.full(batch, -1, dtype=np.int64)
    for r in np.flatnonzero(mine):
        before = int(cum[owner[r], r] - g[owner[r], r])
        cs = np.cumsum(counts[r].astype(np.int64))
        local[r] = off + int(np.searchsorted(cs, int(tickets[r]) - before, side="right"))
    red = comm.all_reduce(local, "max", then=closing)
    tokens[live] = red[live]


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
            qc = _shard_rows_dev(cp, qc, "q.counts")
        else:
            _shard_rows(qc, "q.counts")
            qc = np.ascontiguousarray(qc, dtype=np.uint32)
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


def _raise_dev(cp, *statuses):
    """The per-row status words of a stage (B int32 each, one read for all): the first
    array with a non-zero row raises the unsharded call's error for its first row."""
    host = cp.asnumpy(cp.stack(statuses)) if len(statuses) > 1 else [cp.asnumpy(statuses[0])]
    for st in host:
        _status.raise_for_status(st, lambda i: i)


def _propose_device(comm, dk, local_logits, keys, vocab_offset, vocab_size, temperature, bias,
                    top_k, policy, check):
    """Sparse propose with this rank's shard on the device (the host path's steps and
    checks in the same order; the shard kernels of backends/cuda/cupy/shard.py)."""
    cp, sk = dk
    x, b2, temp, code, width, kb, off, v, check = _prep_propose(
        local_logits, keys, vocab_offset, vocab_size, temperature, bias, top_k, policy, check,
        cp)
    batch, n = x.shape
    comm.on_device(cp)
    hdr = comm.header(off, n, [v, batch, width, code, b2 is not None, _crc(temp), _crc(*kb),
                               check])
    order, _ = _layout(hdr, _PROPOSE_FIELDS)
    greedy = temp == 0
    ncol = 3 if b2 is not None else 2
    closing = close_plan(batch if check else 0)
    comm.plan(gather_plan((batch, 1 + width * ncol), np.int32))

    t_eff = _up(cp, np.where(greedy, 1.0, temp), np.float64)
    greedy_u8 = _up(cp, greedy, np.uint8)
    seed, gen, rnd, pos = (_up(cp, a) for a in kb)
    payload = cp.empty((batch, 1 + width * ncol), dtype=np.int32)
    sk.topk(x, b2, t_eff, greedy_u8, width, off, v, payload)
    g = cp.ascontiguousarray(comm.all_gather(payload, then=closing)[order])
    # merge, allocation and draw: identical on every rank
    tokens = cp.empty(batch, dtype=np.int32)
    counts = cp.empty((batch, width), dtype=np.uint32)
    ids = cp.empty((batch, width), dtype=np.int32)
    status = cp.empty(batch, dtype=np.int32)
    alloc_status = cp.empty(batch, dtype=np.int32)
    sk.merge(g, b2 is not None, width, t_eff, greedy_u8, code, v, width, seed, gen, rnd, pos,
             tokens, counts, ids, status, alloc_status)
    _raise_dev(cp, status, alloc_status)
    q = trusted_dyadic(_out_dev(counts), _out_dev(ids), v, _POLICY_NAMES[code])
    out = _out_dev(tokens)
    comm.close(tokens if check else None)
    _finish(comm, "propose", batch, 1)
    return out, q


def _shard_rows_dev(cp, counts, name):
    """``_shard_rows`` of a DyadicShard's counts held as a CUDA tensor: the dtype, then the
    row rules (one read of the per-row flags); returns them as a CuPy array (the same
    memory where contiguous)."""
    import torch
    if counts.dtype != torch.uint32:
        raise TypeError(f"{name}: dtype {_arrays.dtype_name(counts)}; expected uint32")
    c = cp.ascontiguousarray(cp.asarray(counts.contiguous()))
    if c.size:
        rows = c.reshape(-1, c.shape[-1])
        flags = cp.asnumpy(cp.stack([(rows > TOTAL).any(axis=1),
                                     rows.astype(np.uint64).sum(axis=1) > TOTAL]))
        _first_bad(flags[0], name, "each count must be <= 2**24")
        _first_bad(flags[1], name, "the shard's counts sum to more than 2**24")
    return c


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
    _raise_dev(cp, status)
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
    _raise_dev(cp, status, status_acc)

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
