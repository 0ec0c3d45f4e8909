"""Vocabulary-sharded propose / verify (docs/distributed.md explains the design).

Every rank holds a contiguous slice [vocab_offset, vocab_offset + n) of the
vocabulary.  Ranks exchange only small, exact integer summaries through
``Comm`` (``_comm`` holds the protocol that keeps the ranks of a call in
step); every decision that needs global information is a pure function of
data that all ranks hold identically after a collective, so every rank takes
it identically, and the result equals the unsharded reference bit for bit.

Collectives of a successful call (a failed call adds one error round):

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

import zlib
from dataclasses import dataclass

import numpy as np

from .. import _arrays, _spec, _status, _validate
from .._types import Dyadic, Keys, Verdict, trusted_dyadic
from ..reference import allocation, philox, sampling
from ..reference.fixedpoint import weight_from_gap
from . import _intmath as im
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
                  policy, check):
    code = _validate.policy(policy)
    check = _validate.check_mode(check)
    x = _float_local(local_logits, "logits")
    if x.ndim != 2:
        raise ValueError(f"logits: expected the local shape [B, n], got {x.shape}")
    batch, n = x.shape
    off, v = _offset_size(vocab_offset, vocab_size, n)
    b2 = None
    if bias is not None:
        b = _float_local(bias, "bias")
        if b.shape[-1:] != (n,):
            raise ValueError(f"bias: last dimension {b.shape[-1:]} does not match the local "
                             f"vocabulary slice {n}")
        if b.ndim == 1:
            b2 = b.reshape(1, n)
        elif b.shape == x.shape:
            b2 = b
        else:
            raise ValueError(f"bias: shape {b.shape} must be ({n},) or equal to logits' "
                             f"{x.shape}")
        b2 = np.ascontiguousarray(b2)
    temp = _validate.temperature(temperature, batch, allow_zero=True)
    width = _validate.top_k(top_k, v)
    kb = _keys(keys, batch)
    return np.ascontiguousarray(x), b2, temp, code, width, kb, off, v, check


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
    The local math is vectorised NumPy on the host plus the reference's row
    helpers on the merged candidates (there is no ``backend`` argument: no
    backend kernel runs here, whatever the tensors' device).
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
    z = im.effective_logits(x, None if b2 is None else np.broadcast_to(b2, x.shape), t_eff)
    payload = np.full((batch, 1 + kcand * ncol), -1, dtype=np.int32)
    xbits = x.view(np.int32)
    bbits = None if b2 is None else np.broadcast_to(b2, x.shape).view(np.int32)
    for r in range(batch):
        st = _row_status(z[r])
        payload[r, 0] = st
        if st:
            continue
        idx = _local_top(z[r], 1 if greedy[r] else kcand)
        m = idx.size
        payload[r, 1:1 + m] = xbits[r, idx]
        if bbits is not None:
            payload[r, 1 + kcand:1 + kcand + m] = bbits[r, idx]
        payload[r, 1 + (ncol - 1) * kcand:1 + (ncol - 1) * kcand + m] = idx + off
    after = closing if width or not live else reduce_plan((batch, 2), "sum")
    g = comm.all_gather(payload, then=after)[order]

    # merge: identical on every rank
    status = np.zeros(batch, dtype=np.int32)
    merged = []
    for r in range(batch):
        st = next((int(s) for s in g[:, r, 0] if s), 0)
        if st:
            status[r] = st
            merged.append(None)
            continue
        cx = g[:, r, 1:1 + kcand].reshape(-1)
        cg = g[:, r, 1 + (ncol - 1) * kcand:1 + ncol * kcand].reshape(-1)
        keep = cg >= 0
        cx = cx[keep].view(np.float32)
        cb = None
        if bbits is not None:
            cb = g[:, r, 1 + kcand:1 + 2 * kcand].reshape(-1)[keep].view(np.float32)[None]
        cz = im.effective_logits(cx[None], cb, t_eff[r:r + 1])[0]
        cg = cg[keep].astype(np.int64)
        o = np.lexsort((cg, -cz))
        cz, cg = cz[o], cg[o]
        if cz.size == 0 or cz[0] == -np.inf:
            status[r] = _status.X_ZERO_MASS
            merged.append(None)
            continue
        merged.append((cz, cg))
    _status.raise_for_status(status, lambda i: i)

    policy_name = _POLICY_NAMES[code]
    tokens = np.full(batch, -1, dtype=np.int64)
    if width:
        counts = np.zeros((batch, width), dtype=np.uint32)
        ids = np.full((batch, width), _spec.PAD_ID, dtype=np.int32)
        for r in range(batch):
            cz, cg = merged[r]
            if greedy[r]:
                row = [(int(cg[0]), TOTAL)]
                tokens[r] = cg[0]
            else:
                sup_z, sup_g = cz[:width], cg[:width].tolist()
                zmax = float(sup_z[0])
                w = {gid: weight_from_gap(zmax - float(zz)) for gid, zz in zip(sup_g, sup_z)}
                support = sorted(sup_g)
                st, c = allocation.allocate_weights(w, support, policy_name, sup_g[0])
                if st:
                    status[r] = st
                    continue
                row = [(i, c[i]) for i in support if c[i]]
                tokens[r] = sampling.draw_row(row, (int(seed[r]), int(gen[r]), int(rnd[r])),
                                              int(pos[r]))
            for j, (i, c) in enumerate(row):
                ids[r, j], counts[r, j] = i, c
        _status.raise_for_status(status, lambda i: i)
        q = trusted_dyadic(_output(counts, local_logits), _output(ids, local_logits), v,
                           policy_name)
    else:
        counts = _dense_counts(comm, z, merged, greedy, code, off, order, status)
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


def _dense_counts(comm, z, merged, greedy, code, off, order, status):
    """This shard's dense counts (uint32 [B, n]); greedy rows one-hot at the argmax.

    Planned on entry: the weight-sum round when a row is not greedy (else the
    closing round, and no collective happens here); leaves the draw's count-sum
    round planned.
    """
    batch, n = z.shape
    counts = np.zeros((batch, n), dtype=np.uint64)
    live = [r for r in range(batch) if not greedy[r]]
    draw_sums = gather_plan((batch,))
    standard = code == _spec.POLICY_CODES[_spec.POLICY_STANDARD]
    if live:
        w = {}
        sums = np.zeros((batch, 2), dtype=np.int64)
        for r in live:
            w[r] = im.weights_from_gap(merged[r][0][0] - z[r])
            sums[r] = [int((w[r] >> U64(32)).sum(dtype=U64)),
                       int((w[r] & im.M32).sum(dtype=U64))]
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
    seed, gen, rnd, pos = kb
    sums = counts.astype(np.int64).sum(axis=1)
    g = comm.all_gather(sums, then=reduce_plan((batch,), "max"))[order]
    local = np.full(batch, -1, dtype=np.int64)
    for r in range(batch):
        if greedy[r]:
            continue
        ticket = philox.proposal_ticket((int(seed[r]), int(gen[r]), int(rnd[r])), int(pos[r]))
        acc = 0
        for s, m in enumerate(g[:, r].tolist()):
            if acc + m > ticket:
                if order[s] == comm.rank:
                    cs = np.cumsum(counts[r].astype(np.int64))
                    local[r] = off + int(np.searchsorted(cs, ticket - acc, side="right"))
                break
            acc += m
    red = comm.all_reduce(local, "max", then=closing)
    live = ~np.asarray(greedy, dtype=bool)
    tokens[live] = red[live]


# ----------------------------------------------------------------------------- verify

def _prep_verify(local_target, draft, q, keys, vocab_offset, vocab_size, greedy, check):
    check = _validate.check_mode(check)
    _validate.target_dtype(local_target)
    t = _float_local(local_target, "target")
    if t.ndim != 3:
        raise ValueError(f"target: expected the local shape [B, k+1, n], got {t.shape}")
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
    d = d.astype(np.int64)
    qkind, qc, qi = 0, None, None
    if isinstance(q, DyadicShard):
        qc = _int_local(q.counts, "q.counts")
        if qc.shape != (batch, k1 - 1, n) or q.vocab_offset != off or q.vocab_size != v:
            raise ValueError(f"q: shard shape {qc.shape} / offset {q.vocab_offset} / vocab_size "
                             f"{q.vocab_size} must be {(batch, k1 - 1, n)} / {off} / {v}")
        _shard_rows(qc, "q.counts")
        qkind = 3
    elif isinstance(q, Dyadic):
        if q.batch_shape != (batch, k1 - 1):
            raise ValueError(f"q: batch shape {q.batch_shape} must be (B, k) = "
                             f"{(batch, k1 - 1)}")
        if q.vocab_size != v:
            raise ValueError(f"q: vocab_size {q.vocab_size} does not match {v}")
        qc = _int_local(q.counts, "q.counts")
        qkind = 2
        if q.ids is not None:
            qi = _int_local(q.ids, "q.ids")
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
    return np.ascontiguousarray(t), d, qkind, qc, qi, g, kb, off, v, check


def _q_local(qkind, qc, qi, d, b, i, off, n):
    """Dense local counts (uint64 [n]) of q at (b, i), or None for all zero."""
    if qkind == 0:
        c = np.zeros(n, dtype=np.uint64)
        if off <= d[b, i] < off + n:
            c[d[b, i] - off] = TOTAL
        return c
    if qkind == 3:
        return qc[b, i].astype(np.uint64)
    if qkind == 2:
        return qc[b, i, off:off + n].astype(np.uint64)
    c = np.zeros(n, dtype=np.uint64)
    ids, cnt = qi[b, i], qc[b, i]
    m = (ids >= off) & (ids < off + n)
    c[ids[m] - off] = cnt[m]
    return c


def _q_at(qkind, qc, qi, b, i, d):
    if qkind == 0:
        return TOTAL
    if qkind == 2:
        return int(qc[b, i, d])
    hit = np.flatnonzero(qi[b, i] == d)
    return int(qc[b, i, hit[0]]) if hit.size else 0


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
    p, invalid, mag = im.target_fixed(t.view(np.uint32))
    f = np.zeros((batch, k1, 9), dtype=np.int64)
    f[:, :, 0] = invalid.any(axis=2) if n else 0
    if n:
        f[:, :, 1] = (p >> U64(32)).sum(axis=2, dtype=U64).astype(np.int64)
        f[:, :, 2] = (p & im.M32).sum(axis=2, dtype=U64).astype(np.int64)
        f[:, :, 3] = mag.max(axis=2).astype(np.int64)
        f[:, :, 4] = mag.argmax(axis=2).astype(np.int64) + off
    else:
        f[:, :, 3] = -1
        f[:, :, 4] = -1
    for b in range(batch):
        for i in range(k):
            di = int(d[b, i])
            if off <= di < off + n:
                pd = int(p[b, i, di - off])
                f[b, i, 5], f[b, i, 6] = pd >> 32, pd & 0xFFFFFFFF
                if qkind == 3:
                    f[b, i, 7] = int(qc[b, i, di - off])
            if qkind == 3:
                f[b, i, 8] = int(qc[b, i].sum(dtype=np.uint64))
    gf = comm.all_gather(f, then=gather_plan((batch, 3)) if live else closing)[order]

    one = 1 << _spec.TARGET_BITS
    tol = one >> _spec.TARGET_TOL_BITS
    status = np.zeros(batch, dtype=np.int32)
    total = [[0] * k1 for _ in range(batch)]
    pd_all = [[0] * k for _ in range(batch)]
    cd_all = [[0] * k for _ in range(batch)]
    best = [[0] * k1 for _ in range(batch)]
    if qkind == 3:
        qsum = gf[:, :, :k, 8].sum(axis=0)
        bad = np.argwhere(qsum != TOTAL)
        if bad.size:
            b0, i0 = (int(z) for z in bad[0])
            raise ValueError(f"q.counts: row {b0 * k + i0}: counts must sum to exactly 2**24 "
                             f"over the shards (they sum to {int(qsum[b0, i0])})")
    for b in range(batch):
        for i in range(k1):
            total[b][i] = sum((int(h) << 32) + int(lo) for h, lo in gf[:, b, i, 1:3].tolist())
            mags = gf[:, b, i, 3]
            best[b][i] = int(gf[int(np.argmax(mags)), b, i, 4])  # shards in id order
        for i in range(k1):
            if gf[:, b, i, 0].any():
                status[b] = _status.TARGET_INVALID_VALUE
                break
            if abs(total[b][i] - one) > tol:
                status[b] = _status.TARGET_SUM
                break
        if status[b]:
            continue
        for i in range(k):
            pd_all[b][i] = sum((int(h) << 32) + int(lo) for h, lo in gf[:, b, i, 5:7].tolist())
            cd_all[b][i] = (int(gf[:, b, i, 7].sum()) if qkind == 3
                            else _q_at(qkind, qc, qi, b, i, int(d[b, i])))
            if not g[b] and cd_all[b][i] == 0:
                status[b] = _status.Q_ZERO_AT_DRAFT
                break
    _status.raise_for_status(status)

    # acceptance: a pure function of (P_d, T, c_d, keys) that every rank now holds
    accepted = np.zeros(batch, dtype=np.int32)
    tokens = np.full((batch, k1), -1, dtype=np.int64)
    draw_at = {}
    for b in range(batch):
        key3 = (int(seed[b]), int(gen[b]), int(rnd[b]))
        j = k
        for i in range(k):
            if g[b]:
                ok = int(d[b, i]) == best[b][i]
            else:
                try:
                    ok = sampling.accept(pd_all[b][i], total[b][i], cd_all[b][i], key3,
                                         int(pos[b]) + i)
                except RuntimeError:
                    status[b] = _status.RNG_EXHAUSTED
                    break
            if not ok:
                j = i
                break
            tokens[b, i] = d[b, i]
        if status[b]:
            continue
        accepted[b] = j
        if g[b]:
            tokens[b, j] = best[b][j]
        else:
            draw_at[b] = j
    _status.raise_for_status(status)
    if bool(draw_at) != live:
        raise AssertionError("dyadic.distributed: internal error: rows to draw do not match "
                             "the planned rounds")

    if draw_at:
        # round 2: this shard's exact mass of the distribution to draw from
        limbs = {}
        mass = np.zeros((batch, 3), dtype=np.int64)
        for b, j in draw_at.items():
            if j < k:
                hi, lo = im.residual_limbs(p[b, j], _q_local(qkind, qc, qi, d, b, j, off, n),
                                           total[b][j])
            else:
                hi, lo = None, p[b, j]  # bonus: draw from P itself
            limbs[b] = (hi, lo)
            mass[b] = [int((lo & im.M32).sum(dtype=U64)), int((lo >> U64(32)).sum(dtype=U64)),
                       0 if hi is None else int(hi.sum(dtype=U64))]
        gm = comm.all_gather(mass, then=reduce_plan((batch,), "max"))[order]
        local = np.full(batch, -1, dtype=np.int64)
        for b, j in draw_at.items():
            shard = [int(a) + (int(c) << 32) + (int(e) << 64) for a, c, e in gm[:, b].tolist()]
            key3 = (int(seed[b]), int(gen[b]), int(rnd[b]))
            try:
                x, _ = philox.uniform_below(sum(shard), key3, int(pos[b]) + j,
                                            _spec.DOMAIN_CORRECTION, 0)
            except RuntimeError:
                status[b] = _status.RNG_EXHAUSTED
                continue
            acc = 0
            for s, m in enumerate(shard):
                if acc + m > x:  # a zero-mass shard can never satisfy this
                    if order[s] == comm.rank:
                        hi, lo = limbs[b]
                        local[b] = off + im.first_exceeding_limbs(hi, lo, x - acc)
                    break
                acc += m
        _status.raise_for_status(status)
        # round 3: the owner's token to everyone
        red = comm.all_reduce(local, "max", then=closing)
        for b, j in draw_at.items():
            tokens[b, j] = red[b]
    verdict = Verdict(_output(accepted, local_target),
                      _output(tokens.astype(np.int32), local_target))
    comm.close(tokens if check else None)
    _finish(comm, "verify", batch, k1)
    return verdict
