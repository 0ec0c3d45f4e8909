"""Worker side of tests/distributed/test_distributed_faults.py: every fault case in one process group.

Each rank runs the same list of cases in the same order.  A case makes one rank
(or every rank) fail in a chosen way: a bad input seen by one rank, an
exception of any type injected before a chosen collective of a call, replicated
arguments that differ, a shard whose rows do not sum to 2**24, a rank that left
an earlier call without its collectives, ranks calling different operations.
The outcome of each case on each rank (exception type and message, seconds) is
sent to the parent as soon as the case ends; the parent checks that every rank
raised the same error within the time limit.  After every failing case a normal call checks that the group
still works and that its result equals the unsharded call.  The last case kills
one rank in the middle of a call.
"""

import hashlib
import os
import time
import traceback
from datetime import timedelta

import numpy as np

V = 12
B = 3
K = 2


def _digest(*arrays):
    h = hashlib.sha1()
    for a in arrays:
        a = np.ascontiguousarray(np.asarray(a))
        h.update(str((a.dtype.str, a.shape)).encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


class _Patch:
    """Replace ``obj.name`` for the duration of a with-block (this process only)."""

    def __init__(self, obj, name, value, active=True):
        self.obj, self.name, self.value, self.active = obj, name, value, active

    def __enter__(self):
        self.old = getattr(self.obj, self.name)
        if self.active:
            setattr(self.obj, self.name, self.value)
        return self

    def __exit__(self, *exc):
        setattr(self.obj, self.name, self.old)
        return False


def _raiser(exc):
    def f(*args, **kwargs):
        raise exc
    return f


class _FailBefore:
    """Raise ``exc`` on ``rank`` just before the ``index``-th data collective of a call
    (``Comm.all_gather`` / ``Comm.all_reduce``: 1 = the first after the header; the
    closing round is the last); with ``kill``, the process exits there instead."""

    def __init__(self, comm_cls, rank, my_rank, index, exc, kill=False):
        self.cls, self.active, self.index, self.exc, self.kill = (
            comm_cls, rank == my_rank, index, exc, kill)
        self.count = 0

    def _wrap(self, method):
        def wrapped(comm, *args, **kwargs):
            self.count += 1
            if self.active and self.count == self.index:
                if self.kill:
                    os._exit(17)
                raise self.exc
            return method(comm, *args, **kwargs)
        return wrapped

    def __enter__(self):
        self.old = (self.cls.all_gather, self.cls.all_reduce)
        self.cls.all_gather = self._wrap(self.old[0])
        self.cls.all_reduce = self._wrap(self.old[1])
        return self

    def __exit__(self, *exc):
        self.cls.all_gather, self.cls.all_reduce = self.old
        return False


def _count_data_rounds(comm_cls, fn):
    """How many data collectives (closing round included) ``fn`` runs."""
    with _FailBefore(comm_cls, -1, 0, 0, None) as fb:
        fn()
    return fb.count


class Inputs:
    def __init__(self, rank, world, backend):
        import dyadic

        self.rank, self.world, self.backend = rank, world, backend
        rng = np.random.default_rng(7)
        self.lo, self.hi = V * rank // world, V * (rank + 1) // world
        self.x = rng.normal(0, 2, (B, V)).astype(np.float32)
        self.keys = dyadic.Keys(seed=5, round=1, position=40)
        self.temp = np.array([1.0, 0.7, 1.3])
        w = rng.random((B, K + 1, V)) + 0.05
        self.target = (w / w.sum(-1, keepdims=True)).astype(np.float32)
        toks, q = dyadic.propose(np.log(self.target[:, :K]).reshape(B * K, V)
                                 + rng.normal(0, 1, (B * K, V)).astype(np.float32),
                                 dyadic.Keys(seed=9), top_k=None, backend=backend)
        self.draft = np.asarray(toks).reshape(B, K)
        self.qd = dyadic.Dyadic(np.asarray(q.counts).reshape(B, K, V), None, vocab_size=V)

    def local_x(self):
        return np.ascontiguousarray(self.x[:, self.lo:self.hi])

    def local_t(self):
        return np.ascontiguousarray(self.target[..., self.lo:self.hi])

    def shard(self, counts=None):
        import dyadic.distributed as dd
        c = np.asarray(self.qd.counts)[..., self.lo:self.hi] if counts is None else counts
        return dd.DyadicShard(np.ascontiguousarray(c), self.lo, V)

    def propose(self, top_k=32, policy="standard", **kw):
        import dyadic.distributed as dd
        kw.setdefault("temperature", self.temp)
        kw.setdefault("logits", self.local_x())
        x = kw.pop("logits")
        return dd.propose(x, kw.pop("keys", self.keys), vocab_offset=self.lo, vocab_size=V,
                          top_k=top_k, policy=policy, **kw)

    def verify(self, q="shard", **kw):
        import dyadic.distributed as dd
        q = {"shard": self.shard(), "dense": self.qd, "none": None}.get(q, q) \
            if isinstance(q, str) else q
        kw.setdefault("greedy", np.array([False, True, False]))
        t = kw.pop("target", self.local_t())
        return dd.verify(t, kw.pop("draft", self.draft), q, kw.pop("keys", self.keys),
                         vocab_offset=self.lo, vocab_size=V, **kw)

    def healthy(self):
        """A normal sparse propose and a sharded-q verify, compared with the unsharded calls."""
        import dyadic
        tok, q = self.propose()
        et, eq = dyadic.propose(self.x, self.keys, temperature=self.temp, top_k=32,
                                backend=self.backend)
        got = _digest(tok, q.counts, q.ids)
        exp = _digest(et, eq.counts, eq.ids)
        vd = self.verify()
        ev = dyadic.verify(self.target, self.draft, self.qd, self.keys,
                           greedy=np.array([False, True, False]), backend=self.backend)
        if got != exp or _digest(vd.accepted, vd.tokens) != _digest(ev.accepted, ev.tokens):
            return "mismatch"
        return "ok"


def _outcome(fn):
    t0 = time.perf_counter()
    try:
        value = fn()
        out = ("ok", value if isinstance(value, str) else "")
    except BaseException as exc:  # noqa: BLE001 - the outcome is the point
        out = (type(exc).__name__, str(exc))
    return out, time.perf_counter() - t0


def cases(inp):
    """(name, fn, expectation) in the same order on every rank; fn runs the case on this rank.

    expectation: (exception type name, substrings of the message), checked by the parent.
    """
    from dyadic.distributed import _comm, _core
    import torch

    rank, world = inp.rank, inp.world
    last = world - 1
    C = _comm.Comm
    out = []

    def add(name, fn, etype, *subs):
        out.append((name, fn, (etype, subs)))

    # -- 1. failures while preparing the inputs, on one rank
    add("meta tensor logits (last rank)",
        lambda: inp.propose(logits=torch.empty((B, inp.hi - inp.lo), device="meta")
                            if rank == last else inp.local_x()),
        "TypeError", "logits", "meta")

    def overflow():
        with _Patch(_core, "_crc", lambda *a: 1 << 70, active=rank == 1):
            inp.propose()
    add("OverflowError packing the header (rank 1)", overflow,
        "DistributedError", "rank 1 failed in propose", "OverflowError")

    def prep_keyerror():
        with _Patch(_core, "_prep_verify", _raiser(KeyError("injected")), active=rank == 0):
            inp.verify()
    add("KeyError preparing verify (rank 0)", prep_keyerror,
        "DistributedError", "rank 0 failed in verify", "KeyError: 'injected'")

    # -- 2. an exception of any type before every data collective of each kind of call
    kinds = [
        ("propose top_k=32", lambda: inp.propose()),
        ("propose top_k=32 check=False", lambda: inp.propose(check=False)),
        ("propose dense standard", lambda: inp.propose(top_k=None)),
        ("propose dense floor-first", lambda: inp.propose(top_k=None, policy="floor-first")),
        ("propose dense all greedy", lambda: inp.propose(top_k=None, temperature=0.0)),
        ("verify shard q", lambda: inp.verify()),
        ("verify dense q check=False", lambda: inp.verify(q="dense", check=False)),
        ("verify all greedy", lambda: inp.verify(q="none", greedy=np.ones(B, bool))),
    ]
    types = [ZeroDivisionError, MemoryError, KeyError, OverflowError, RuntimeError,
             AttributeError, IndexError]
    j = 0
    for label, fn in kinds:
        n = _count_data_rounds(C, fn)
        for index in range(1, n + 1):
            who = (index + j) % world
            et = types[j % len(types)]
            j += 1

            def run(fn=fn, who=who, index=index, et=et):
                with _FailBefore(C, who, rank, index, et(f"injected before round {index}")):
                    fn()
            add(f"{label}: {et.__name__} before data round {index}/{n} (rank {who})", run,
                "DistributedError", f"rank {who} failed in {label.split()[0]}",
                f"{et.__name__}: ", "injected before round")

    # ValueError / TypeError mid-call keep their type and message on every rank
    def mid_value():
        with _FailBefore(C, 1, rank, 2, ValueError("target: row 9: injected rule")):
            inp.verify()
    add("ValueError before round 2 (rank 1)", mid_value, "ValueError", "target: row 9: injected")

    def mid_type():
        with _Patch(_core._host_kernels(), "dense_weights",
                    _raiser(TypeError("injected weights")), active=rank == last):
            inp.propose(top_k=None)
    add("TypeError in the dense weights (last rank)", mid_type, "TypeError", "injected weights")

    # local work after the last data round: building the outputs
    def output_fail():
        with _Patch(_core, "_output", _raiser(MemoryError("injected output")),
                    active=rank == 0):
            inp.propose()
    add("MemoryError building the outputs (rank 0)", output_fail,
        "DistributedError", "rank 0 failed in propose", "MemoryError: injected output")

    # a failure in work every rank does on gathered data, on one rank only
    def merged_fail():
        with _Patch(_core._host_kernels(), "merge", _raiser(ArithmeticError("injected merge")),
                    active=rank == last):
            inp.propose()
    add("ArithmeticError in the merged allocation (last rank)", merged_fail,
        "DistributedError", f"rank {last} failed in propose", "ArithmeticError")

    # -- 3. replicated arguments that differ
    add("check differs (propose)", lambda: inp.propose(check=rank == 0), "ValueError", "check")
    add("check differs (verify)", lambda: inp.verify(check=rank != last), "ValueError", "check")
    add("temperature differs", lambda: inp.propose(
        temperature=inp.temp + (0.5 if rank == last else 0)), "ValueError", "temperature")
    add("top_k differs", lambda: inp.propose(top_k=4 if rank else 3), "ValueError", "top_k")
    add("policy differs", lambda: inp.propose(
        policy="floor-first" if rank == 1 else "standard"), "ValueError", "policy")
    add("greedy differs", lambda: inp.verify(greedy=np.array([False, rank == 0, False])),
        "ValueError", "greedy")
    add("draft differs", lambda: inp.verify(
        q="none", draft=inp.draft + (rank == last) * (inp.draft < V - 1)), "ValueError", "draft")
    add("check not a bool (rank 1)", lambda: inp.propose(check="yes" if rank == 1 else True),
        "ValueError", "check: expected True or False")

    # -- 4. shard counts
    def shard_sum():
        c = np.asarray(inp.qd.counts)[..., inp.lo:inp.hi].copy()
        if rank == last:
            hit = np.flatnonzero(c[1, 0])
            c[1, 0, hit[0]] -= 1
        inp.verify(q=inp.shard(c))
    add("shard rows do not sum to 2**24 (last rank)", shard_sum, "ValueError",
        "q.counts: row 2: counts must sum to exactly 2**24 over the shards")

    def shard_unvalidated():
        import dyadic.distributed as dd
        q = inp.shard()
        if rank == 1:  # bypasses the constructor: verify validates what it receives
            q = object.__new__(dd.DyadicShard)
            c = np.asarray(inp.qd.counts)[..., inp.lo:inp.hi].astype(np.int64)
            c[0, 0, 0] = -5
            _core._shard_fields(q, c, inp.lo, V, "standard")
        inp.verify(q=q)
    add("unvalidated int64 shard (rank 1)", shard_unvalidated, "TypeError",
        "q.counts: dtype int64; expected uint32")

    def shard_too_big():
        import dyadic.distributed as dd
        q = inp.shard()
        if rank == 0:
            q = object.__new__(dd.DyadicShard)
            c = np.asarray(inp.qd.counts)[..., inp.lo:inp.hi].copy()
            c[1, 1, 0] = 2**31
            _core._shard_fields(q, c, inp.lo, V, "standard")
        inp.verify(q=q)
    add("unvalidated shard count 2**31 (rank 0)", shard_too_big, "ValueError",
        "q.counts: row 3: each count must be <= 2**24")

    # -- 5. ranks out of step
    def left_early():
        if rank == 1:  # rank 1 leaves a call without its collectives, then makes the next
            with _Patch(torch.distributed, "all_gather",
                        _raiser(RuntimeError("injected transport failure"))):
                first = _outcome(inp.propose)[0]
            assert first[0] == "DistributedError" and "process group failed" in first[1], first
        inp.propose()
    add("a rank left a call early (rank 1)", left_early, "DistributedError",
        "out of step", "call numbers by rank")

    def different_ops():
        if rank == 0:
            inp.propose()
        else:
            inp.verify()
    add("propose on rank 0, verify elsewhere", different_ops, "DistributedError",
        "out of step", "operations by rank")
    return out


def worker(rank, world, port, backend, queue, pg_timeout):
    import torch
    import torch.distributed as dist

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    try:
        # A short process-group timeout: a hang surfaces as an error in seconds.  The
        # killed-rank case does not rely on it (the peers see the closed sockets).
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, timeout=timedelta(seconds=pg_timeout))
        inp = Inputs(rank, world, backend)
        healthy = ("ok", ("ok",))
        queue.put((rank, "case", ("healthy at start",) + _outcome(inp.healthy) + (healthy,)))
        for name, fn, expect in cases(inp):
            queue.put((rank, "case", (name,) + _outcome(fn) + (expect,)))
            queue.put((rank, "case", (name + " / next call",) + _outcome(inp.healthy)
                       + (healthy,)))
        # the last case: the last rank dies before the second data round of a verify
        from dyadic.distributed import _comm
        last = world - 1
        if rank == last:
            queue.put((rank, "done", None))
            queue.close()
            queue.join_thread()
        with _FailBefore(_comm.Comm, last, rank, 2, None, kill=True):
            got, sec = _outcome(inp.verify)
        queue.put((rank, "case", ("a rank killed mid-call", got, sec,
                                  ("DistributedError", ("process group failed",)))))
        queue.put((rank, "done", None))
    except BaseException:  # noqa: BLE001 - reported to the parent test
        queue.put((rank, "crash", traceback.format_exc()))
