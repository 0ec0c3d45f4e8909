"""The only transport (torch.distributed collectives on the caller's process group) and
the agreement protocol that keeps the ranks of a sharded call in step.

gloo groups exchange CPU tensors, NCCL groups CUDA tensors (on the current
device); a call whose shard is on the device (``Comm.on_device``) exchanges
its data rounds as CUDA tensors on either (gloo copies them through the host
itself) and gets CuPy arrays back, with no copy to the host but the failure
flags (one element per rank and collective).  Every exchange goes through
``Comm`` so that the bytes and collectives each rank contributes are counted.
Every collective is one ``all_gather``; an all-reduce (sum or max of
integers) is the all_gather of the same per-rank array reduced identically on
every rank.

Protocol of one call (``docs/distributed.md``, "Errors and agreement"):

* **Header**: one all_gather of ``HEADER_WORDS`` int64 per rank, the same size
  for every operation: protocol tag, error code, the group's call number, the
  operation, this rank's vocabulary offset and slice size, and the replicated
  arguments (small integers as they are, arrays as a CRC32 of dtype, shape and
  bytes).  Every rank checks the gathered table in the same order: protocol,
  call number and operation (``DistributedError``), error codes (error
  round), then the caller checks the replicated arguments and the slices.
* **Data rounds**: each all_gather / all_reduce carries one extra element of
  the payload's dtype, this rank's failure flag (0 or 1; summed or maxed, it
  is non-zero on every rank as soon as one rank sets it).
* **Closing round**: one all_reduce (max) of the flag and, with ``check``, of
  the tokens and their negation; it follows all of the call's local work
  (outputs included), so an exception anywhere in the call is agreed.
* **Error round** (only after a set flag or error code): one all_gather of a
  fixed-size record (error code, ``ERR_MSG_BYTES`` of message); every rank
  raises the error of the lowest failing rank: ``ValueError`` / ``TypeError``
  with its message, anything else as ``DistributedError`` naming the rank,
  the original type and message.

A rank that fails between two collectives still takes part in the next one:
before the local work that precedes a collective, the call declares that
collective's kind, shape and dtype (``plan``, or ``then=`` of the previous
collective); ``fail`` sends it with the flag set and zeros as payload, then
joins the error round.  Where no collective is planned (the header checks,
the few decisions that choose the next collective, after the closing round)
the code is a pure function of gathered data, so it raises identically on
every rank and the exception propagates as it is.
"""

import weakref

import numpy as np

ERR_MSG_BYTES = 1024
PROTOCOL = 0x6479616469630001  # "dyadic" and the protocol version (1)
HEADER_FIXED = 6
HEADER_FIELDS = 10
HEADER_WORDS = HEADER_FIXED + HEADER_FIELDS
_OPS = {"propose": 1, "verify": 2}
_OP_NAMES = {v: k for k, v in _OPS.items()}
_CODE_VALUE, _CODE_TYPE, _CODE_OTHER = 1, 2, 3
_ERR_HEAD = 16  # error record: int64 code, int64 reserved, then the message bytes

# call number of the last call on each process group (this process's count)
_calls = weakref.WeakKeyDictionary()


class DistributedError(RuntimeError):
    """A sharded call failed on some rank, or the ranks are out of step; raised on every rank.

    Attributes: ``rank`` (the failing rank in the group, or None), ``op``
    ("propose" / "verify"), ``call`` (the call number on the group) and
    ``error_type`` (the name of the original exception class, or None).
    """

    def __init__(self, message, *, rank=None, op=None, call=None, error_type=None):
        super().__init__(message)
        self.rank, self.op, self.call, self.error_type = rank, op, call, error_type


def _code(exc):
    if isinstance(exc, ValueError):
        return _CODE_VALUE
    if isinstance(exc, TypeError):
        return _CODE_TYPE
    return _CODE_OTHER


def gather_plan(shape, dtype=np.int64):
    return ("gather", tuple(int(s) for s in shape), np.dtype(dtype), None)


def reduce_plan(shape, op, dtype=np.int64):
    return ("reduce", tuple(int(s) for s in shape), np.dtype(dtype), op)


def close_plan(n_tokens):
    """The closing round for ``n_tokens`` checked tokens (0: the flag only)."""
    return reduce_plan((2 * int(n_tokens),), "max")


_HEADER = gather_plan((HEADER_WORDS,))


def _dtype(arr):
    return arr.dtype if hasattr(arr, "dtype") else np.asarray(arr).dtype


class Comm:
    """One sharded call on ``group``: its collectives, its plan and its call number."""

    def __init__(self, group, op):
        import torch
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("dyadic.distributed: torch.distributed is not initialised "
                               "(call torch.distributed.init_process_group first)")
        self.torch, self.dist, self.group, self.op = torch, dist, group, op
        pg = dist.group.WORLD if group is None else group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        if self.rank < 0:
            raise ValueError("group: this process is not a member of the process group")
        if dist.get_backend(group) == "nccl":
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.device = torch.device("cpu")
        self.bytes_sent = 0
        self.collectives = 0
        self._pg = pg
        self.call = _calls.get(pg, 0) + 1
        _calls[pg] = self.call
        self._plan = _HEADER
        self.cupy = None  # the CuPy module once the call's data rounds are on the device

    def on_device(self, cupy):
        """From now on the data rounds (and a failure's stand-in payload) are CuPy arrays
        on the current CUDA device."""
        self.cupy = cupy

    def _xp(self, arr):
        cp = self.cupy
        return cp if cp is not None and isinstance(arr, cp.ndarray) else np

    # ------------------------------------------------------------------ transport

    def _run(self, kind, flat, op):
        """One collective on a 1-D NumPy array; [world, len] (gather) or [len] (reduce)."""
        self._plan = None
        try:
            dev = not isinstance(flat, np.ndarray)
            # a CuPy array: the same memory as a CUDA tensor (DLPack, same stream)
            t = (self.torch.from_dlpack(flat) if dev
                 else self.torch.from_numpy(flat).to(self.device))
            # A reduction is carried by the same all_gather, then reduced on every rank
            # (exact: integer sums and maxima do not depend on the order): each rank
            # sends the same bytes, and gloo's all_reduce of a few hundred bytes costs
            # about three times its all_gather.
            out = [self.torch.empty_like(t) for _ in range(self.world)]
            self.dist.all_gather(out, t, group=self.group)
            if dev:
                res = self.cupy.from_dlpack(self.torch.stack(out))
            else:
                res = np.stack([o.cpu().numpy() for o in out])
            if kind == "reduce":
                res = res.sum(axis=0) if op == "sum" else res.max(axis=0)
        except Exception as exc:
            raise DistributedError(
                f"dyadic.distributed: {self.op} (call {self.call} on this process group): "
                f"the process group failed on rank {self.rank}: {type(exc).__name__}: {exc}",
                rank=self.rank, op=self.op, call=self.call,
                error_type=type(exc).__name__) from exc
        self.bytes_sent += flat.nbytes
        self.collectives += 1
        return res

    def plan(self, plan):
        """Declare the next collective (``gather_plan`` / ``reduce_plan`` / ``close_plan``)."""
        self._plan = plan

    def all_gather(self, arr, then=None):
        """NumPy array (same shape and dtype on every rank) -> [world, *shape] NumPy.

        ``then``: the plan of the collective after this one (None: decided later).
        """
        return self._data(gather_plan(np.shape(arr), _dtype(arr)), arr, then)

    def all_reduce(self, arr, op="sum", then=None):
        """Element-wise ``op`` ("sum" or "max") of an integer array over the ranks."""
        return self._data(reduce_plan(np.shape(arr), op, _dtype(arr)), arr, then)

    def _data(self, plan, arr, then):
        if plan != self._plan:
            raise AssertionError(f"dyadic.distributed: internal error: collective {plan} where "
                                 f"{self._plan} was planned")
        kind, shape, dtype, op = plan
        xp = self._xp(arr)
        flat = xp.zeros(int(np.prod(shape)) + 1, dtype=dtype)
        flat[:-1] = xp.asarray(arr).reshape(-1)
        res = self._run(kind, flat, op)
        self._plan = then
        # the failure flags: on the device, the one read back to the host per collective
        flags = res[..., -1]
        if (flags if xp is np else self.cupy.asnumpy(flags)).any():
            self._plan = None
            self._error_round(None)
        if kind == "gather":
            return res[:, :-1].reshape((self.world,) + shape)
        return res[:-1].reshape(shape)

    # ------------------------------------------------------------------ agreement

    def header(self, offset, size, fields, error=None):
        """The call's first collective; returns the gathered [world, 2 + HEADER_FIELDS] table
        (offset, size, fields) after the protocol, call-number and error checks."""
        if self._plan != _HEADER:
            raise AssertionError("dyadic.distributed: internal error: header out of order")
        rec = np.zeros(HEADER_WORDS, dtype=np.int64)
        rec[0], rec[2], rec[3] = PROTOCOL, self.call, _OPS[self.op]
        if error is not None:
            rec[1] = _code(error)
        else:
            if len(fields) > HEADER_FIELDS:
                raise AssertionError("dyadic.distributed: internal error: header too long")
            vals = [int(offset), int(size)] + [int(f) for f in fields]
            rec[4:4 + len(vals)] = vals
        table = self._run("gather", rec, None)
        if (table[:, 0] != PROTOCOL).any():
            raise DistributedError(
                f"dyadic.distributed: the ranks run different versions of the sharded protocol "
                f"(tags by rank: {[hex(int(t) & (2**64 - 1)) for t in table[:, 0]]})",
                op=self.op, call=self.call)
        calls, ops = table[:, 2], table[:, 3]
        if (calls != calls[0]).any() or (ops != ops[0]).any():
            _calls[self._pg] = max(int(calls.max()), self.call)
            names = [_OP_NAMES.get(int(o), f"op {int(o)}") for o in ops]
            raise DistributedError(
                f"dyadic.distributed: the ranks are out of step on this process group: call "
                f"numbers by rank {calls.tolist()}, operations by rank {names} (a rank left an "
                f"earlier call without its collectives, or ranks called different operations); "
                f"every rank raises, and the call numbers continue from {int(calls.max())}",
                op=self.op, call=self.call)
        if table[:, 1].any():
            self._error_round(error)
        return table[:, 4:]

    def fail(self, exc):
        """This rank hit ``exc`` during the call: make every rank raise the agreed error.

        Always raises.  With a collective planned, this rank performs it with its
        failure flag set (the header: with its error code), then the error round.
        Without one (header checks, decisions on gathered data, transport failures,
        errors already agreed) ``exc`` propagates as it is.
        """
        plan = self._plan
        if plan is None:
            raise exc
        if plan == _HEADER:
            self.header(0, 0, (), error=exc)
            raise AssertionError("dyadic.distributed: internal error: header error not agreed")
        kind, shape, dtype, op = plan
        flat = np.zeros(int(np.prod(shape)) + 1, dtype=dtype)
        flat[-1] = 1
        if self.cupy is not None:  # the same kind of tensor as the peers send
            try:
                flat = self.cupy.asarray(flat)
            except Exception:  # noqa: BLE001 - a broken device: send from the host
                pass
        self._run(kind, flat, op)
        self._error_round(exc)

    def _error_round(self, exc):
        """Every rank calls this after the same collective; raises the agreed error."""
        rec = np.zeros(_ERR_HEAD + ERR_MSG_BYTES, dtype=np.uint8)
        if exc is not None:
            code = _code(exc)
            try:
                text = str(exc) if code != _CODE_OTHER else f"{type(exc).__name__}: {exc}"
            except Exception:  # noqa: BLE001 - an unprintable exception still has a type
                text = f"{type(exc).__name__}: (message unavailable)"
            raw = text.encode("utf-8", "replace")[:ERR_MSG_BYTES]
            rec[:8] = np.array([code], dtype="<i8").view(np.uint8)
            rec[_ERR_HEAD:_ERR_HEAD + len(raw)] = np.frombuffer(raw, dtype=np.uint8)
        table = self._run("gather", rec, None)
        codes = np.ascontiguousarray(table[:, :8]).view("<i8")[:, 0]
        bad = np.flatnonzero(codes)
        if not bad.size:
            err = DistributedError(f"dyadic.distributed: {self.op} (call {self.call}): a rank "
                                   f"signalled a failure without an error record",
                                   op=self.op, call=self.call)
        else:
            r = int(bad[0])
            code = int(codes[r])
            text = bytes(table[r, _ERR_HEAD:]).rstrip(b"\0").decode("utf-8", "replace")
            if code == _CODE_VALUE:
                err = ValueError(text)
            elif code == _CODE_TYPE:
                err = TypeError(text)
            else:
                err = DistributedError(
                    f"dyadic.distributed: rank {r} failed in {self.op} (call {self.call} on "
                    f"this process group): {text}", rank=r, op=self.op, call=self.call,
                    error_type=text.split(":", 1)[0])
        if exc is not None and not isinstance(exc, Exception):
            raise exc  # KeyboardInterrupt, SystemExit: the peers raise, this rank stops
        raise err from exc

    def close(self, tokens):
        """The closing round (planned as ``close_plan(tokens.size or 0)``); with ``tokens``
        (int64, the check) fails on every rank if the ranks hold different tokens."""
        xp = np if tokens is None else self._xp(tokens)
        flat = (np.zeros(0, dtype=np.int64) if tokens is None
                else xp.asarray(tokens, dtype=np.int64).reshape(-1))
        m = self.all_reduce(xp.concatenate([flat, -flat]), "max")
        if not bool((m[:flat.size] == -m[flat.size:]).all()):
            raise DistributedError("dyadic.distributed: ranks computed different tokens "
                                   "(non-identical replicated inputs?)",
                                   op=self.op, call=self.call)
