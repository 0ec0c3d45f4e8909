"""Worker side of tests/distributed/test_distributed.py: many parity cases in one process group.

Every rank builds the same full-vocabulary inputs from a seeded generator,
takes its slice, calls dyadic.distributed and compares with the unsharded
dyadic call (backend ``cpu`` when available, else ``reference``).  The outcome
of each case (result digest or error text) is returned so the test can check
that every rank agrees.
"""

import hashlib
import os
import traceback
from datetime import timedelta

import numpy as np


def _splits(v, world, rng, permute):
    """A few contiguous splits: even, random uneven, one with an empty shard."""
    out = []
    even = np.linspace(0, v, world + 1).astype(int)
    out.append(even)
    cuts = np.sort(rng.integers(0, v + 1, world - 1))
    out.append(np.concatenate([[0], cuts, [v]]))
    if world >= 2:
        e = even.copy()
        e[1] = 0  # rank 0 empty
        out.append(e)
    res = []
    for b in out:
        perm = rng.permutation(world) if permute else np.arange(world)
        res.append([(int(b[perm[r]]), int(b[perm[r] + 1])) for r in range(world)])
    return res


# How a rank's shard reaches dyadic.distributed: NumPy (default), or CUDA tensors on the
# current GPU (worker(device="cuda-shard"): the device path of the shard kernels).  With
# CHECK_BACKEND set (worker(device="cuda-shard")), every case that succeeds is also
# compared with the unsharded call on that backend.
_LOCAL = [None]
CHECK_BACKEND = [None]


def _loc(a):
    """This rank's slice as the sharded call receives it."""
    a = np.ascontiguousarray(a)
    return a if _LOCAL[0] is None else _LOCAL[0](a)


def _host(a):
    if hasattr(a, "detach"):  # torch (CPU or CUDA)
        return a.detach().cpu().numpy()
    return np.asarray(a)


def _digest(*arrays):
    h = hashlib.sha1()
    for a in arrays:
        a = np.ascontiguousarray(_host(a))
        h.update(str((a.dtype.str, a.shape)).encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


def _outcome(fn):
    try:
        return ("ok", fn())
    except (ValueError, TypeError) as exc:
        return (type(exc).__name__, str(exc))


def _bias_row(rng, v):
    """A bias [V]: N(0, 1), about a fifth of it -inf."""
    bias = rng.normal(0, 1, v).astype(np.float32)
    bias[rng.random(v) < 0.2] = -np.inf
    return bias


def _shard_masked(x, split, world, rng):
    """A copy of the logits x [B, V]; for V >= 7, three times in ten one whole shard of
    ``split`` at -inf."""
    xm = x.copy()
    if x.shape[1] >= 7 and rng.random() < 0.3:
        s_lo, s_hi = split[int(rng.integers(0, world))]
        xm[:, s_lo:s_hi] = -np.inf
    return xm


def _logits(rng, b, v, kind):
    if kind == "random":
        x = rng.normal(0, 3, (b, v))
    elif kind == "ties":
        x = rng.integers(-2, 2, (b, v)).astype(float)
    elif kind == "flat":
        x = np.zeros((b, v))
    elif kind == "wide":
        x = rng.normal(0, 40, (b, v))
    return x.astype(np.float32)


def propose_cases(rank, world, rng_seed, backend, n_cases):
    import dyadic
    import dyadic.distributed as dd

    results, fails = [], []
    rng = np.random.default_rng(rng_seed)
    case = 0
    for v in (1, 7, 50, 260):
        for kind in ("random", "ties", "flat", "wide"):
            for top_k in (None, 1, 32):
                for policy in ("standard", "floor-first"):
                    case += 1
                    if n_cases and case > n_cases:
                        return results, fails
                    b = 3
                    x = _logits(rng, b, v, kind)
                    bias = _bias_row(rng, v) if rng.random() < 0.4 else None
                    temp = np.array([1.0, 0.0, 0.7])[:b] if rng.random() < 0.5 else 1.3
                    keys = dyadic.Keys(seed=int(rng.integers(0, 2**63)), round=3,
                                       position=int(rng.integers(0, 1000)))
                    for split in _splits(v, world, rng, permute=bool(case % 2)):
                        lo, hi = split[rank]
                        xm = _shard_masked(x, split, world, rng)
                        if v >= 2 and rng.random() < 0.15:  # a bad value somewhere
                            xm[int(rng.integers(0, b)), int(rng.integers(0, v))] = \
                                np.nan if rng.random() < 0.5 else np.inf
                        if v >= 2 and rng.random() < 0.1:  # one row fully masked
                            xm[0, :] = -np.inf
                        exp = _outcome(lambda: _prop_digest(dyadic.propose(
                            xm, keys, temperature=temp, bias=bias, top_k=top_k, policy=policy,
                            backend=backend)))
                        got = _outcome(lambda: _prop_digest(_gather_dense(dd.propose(
                            _loc(xm[:, lo:hi]), keys, vocab_offset=lo,
                            vocab_size=v, temperature=temp,
                            bias=None if bias is None else _loc(bias[lo:hi]), top_k=top_k,
                            policy=policy), rank, world)))
                        results.append(got)
                        if got != exp:
                            fails.append(f"propose case {case} v={v} {kind} top_k={top_k} "
                                         f"{policy} split={split}: got {got} expected {exp}")
                        if CHECK_BACKEND[0] and exp[0] == "ok":
                            other = _outcome(lambda: _prop_digest(dyadic.propose(
                                xm, keys, temperature=temp, bias=bias, top_k=top_k,
                                policy=policy, backend=CHECK_BACKEND[0])))
                            if got != other:
                                fails.append(f"propose case {case} v={v} {kind} top_k={top_k} "
                                             f"{policy} split={split}: got {got}, unsharded "
                                             f"{CHECK_BACKEND[0]} {other}")
    return results, fails


def _verdict(res):
    return _digest(_host(res.accepted), _host(res.tokens)) + " acc=" + str(
        _host(res.accepted).tolist())


def _prop_digest(res):
    tokens, q = res
    ids = q.ids if q.ids is not None else np.zeros(0)
    return _digest(_host(tokens), _host(q.counts), _host(ids))


def _gather_dense(res, rank, world):
    """Dense q comes back as this rank's shard: gather the shards to compare."""
    import torch
    import torch.distributed as dist

    import dyadic
    import dyadic.distributed as dd

    tokens, q = res
    if not isinstance(q, dd.DyadicShard):
        return tokens, q
    parts = [None] * world
    dist.all_gather_object(parts, (q.vocab_offset, _host(q.counts)))
    parts.sort(key=lambda p: p[0])
    full = np.concatenate([p[1] for p in parts], axis=-1)
    return tokens, dyadic.Dyadic(full, None, vocab_size=q.vocab_size, policy=q.policy)


def _target(rng, b, k1, v, kind):
    if kind == "peaked":
        w = np.exp(rng.normal(0, 4, (b, k1, v)))
    elif kind == "sparse":
        w = rng.random((b, k1, v)) * (rng.random((b, k1, v)) < 0.2)
        w[..., 0] += 1e-3
    else:
        w = rng.random((b, k1, v))
    p = (w / w.sum(-1, keepdims=True)).astype(np.float32)
    return p


def verify_cases(rank, world, rng_seed, backend, n_cases):
    import dyadic
    import dyadic.distributed as dd

    results, fails = [], []
    rng = np.random.default_rng(rng_seed + 1)
    case = 0
    for v in (1, 5, 40, 200):
        for tkind in ("uniform", "peaked", "sparse"):
            for qmode in ("none", "sparse", "dense", "shard", "close"):
                case += 1
                if n_cases and case > n_cases:
                    return results, fails
                b, k = 4, 3
                keys = dyadic.Keys(seed=int(rng.integers(0, 2**63)), generation=1,
                                   position=int(rng.integers(0, 1000)))
                target = _target(rng, b, k + 1, v, tkind)
                logits = np.log(np.maximum(target[:, :k], 1e-30)).astype(np.float32)
                if qmode == "close":  # q close to p: mostly accepted, bonus draws
                    top_k = None
                else:
                    logits = logits + rng.normal(0, 2, logits.shape).astype(np.float32)
                    top_k = 32 if qmode == "sparse" else None
                toks, q = dyadic.propose(logits.reshape(b * k, v), dyadic.Keys(seed=5),
                                         top_k=top_k, backend=backend)
                draft = np.asarray(toks).reshape(b, k)
                qd = dyadic.Dyadic(np.asarray(q.counts).reshape(b, k, -1),
                                   None if q.ids is None else np.asarray(q.ids).reshape(b, k, -1),
                                   vocab_size=v)
                if qmode == "none":
                    qd = None
                    draft = rng.integers(0, v, (b, k))
                greedy = rng.random(b) < 0.3
                if v >= 2 and rng.random() < 0.1:
                    target[1, 2, int(rng.integers(0, v))] = np.nan
                if v >= 2 and rng.random() < 0.1:
                    target[2, 0] *= 1.01
                if qmode == "sparse" and rng.random() < 0.1 and v > 32:
                    draft[3, 0] = int(np.setdiff1d(np.arange(v), np.asarray(qd.ids)[3, 0])[0])
                    greedy[3] = False
                exp = _outcome(lambda: _verdict(dyadic.verify(
                    target, draft, qd, keys, greedy=greedy, backend=backend)))
                for split in _splits(v, world, rng, permute=bool(case % 2)):
                    lo, hi = split[rank]
                    qloc = qd
                    if qmode == "shard":
                        qloc = dd.DyadicShard(_loc(np.asarray(qd.counts)[..., lo:hi]), lo, v)
                    got = _outcome(lambda: _verdict(dd.verify(
                        _loc(target[..., lo:hi]), draft, qloc, keys,
                        vocab_offset=lo, vocab_size=v, greedy=greedy)))
                    results.append(got)
                    if got != exp:
                        fails.append(f"verify case {case} v={v} {tkind} {qmode} split={split}: "
                                     f"got {got} expected {exp}")
                    if CHECK_BACKEND[0] and exp[0] == "ok":
                        other = _outcome(lambda: _verdict(dyadic.verify(
                            target, draft, qd, keys, greedy=greedy,
                            backend=CHECK_BACKEND[0])))
                        if got != other:
                            fails.append(f"verify case {case} v={v} {tkind} {qmode} "
                                         f"split={split}: got {got}, unsharded "
                                         f"{CHECK_BACKEND[0]} {other}")
    return results, fails


def error_cases(rank, world, backend):
    """Inputs that fail on one rank only: every rank must raise the same error."""
    import dyadic
    import dyadic.distributed as dd

    out = []
    v = 12
    x = np.zeros((2, v), np.float32)
    lo, hi = v * rank // world, v * (rank + 1) // world
    keys = dyadic.Keys(seed=1)
    # structural error on the last rank only: a bias of the wrong length
    bias = np.zeros(hi - lo + (1 if rank == world - 1 else 0), np.float32)
    out.append(_outcome(lambda: dd.propose(_loc(x[:, lo:hi]), keys, vocab_offset=lo, vocab_size=v,
                                           bias=bias)))
    # a wrong offset on rank 0: slices do not tile
    out.append(_outcome(lambda: dd.propose(_loc(x[:, lo:hi]), keys, vocab_offset=lo + (rank == 0),
                                           vocab_size=v)))
    # keys that differ on one rank
    out.append(_outcome(lambda: dd.propose(_loc(x[:, lo:hi]), dyadic.Keys(seed=1 + (rank == 1)),
                                           vocab_offset=lo, vocab_size=v)))
    # a data error only the last rank sees
    xl = x[:, lo:hi].copy()
    if rank == world - 1:
        xl[1, -1] = np.nan
    out.append(_outcome(lambda: dd.propose(_loc(xl), keys, vocab_offset=lo, vocab_size=v)))
    # verify: a target dtype error on rank 0 only
    t = np.full((2, 2, v), 1.0 / v, np.float32)
    tl = t[..., lo:hi].astype(np.float64 if rank == 0 else np.float32)
    out.append(_outcome(lambda: dd.verify(_loc(tl), np.zeros((2, 1), np.int64), None, keys,
                                          vocab_offset=lo, vocab_size=v)))
    # the call after failures still works (no collective left dangling)
    out.append(_outcome(lambda: _digest(dd.propose(_loc(x[:, lo:hi]), keys, vocab_offset=lo,
                                                   vocab_size=v)[0])))
    return out


def dense_cases(rank, world, rng_seed, n_cases):
    """Dense propose with this rank's slice as a CUDA tensor (the device path): tokens and
    the gathered q against the unsharded ``backend="cuda"`` and ``backend="cpu"`` calls
    and against the same case with NumPy shards (the host path), with the same
    collectives and bytes; rows with a bad value raise the unsharded call's error.
    Returns (outcomes, fails, how many dense calls ran on CuPy / on NumPy)."""
    import torch

    import dyadic
    import dyadic.distributed as dd
    from dyadic.distributed import _core

    ran = {"cupy": 0, "numpy": 0}
    inner = _core._propose_dense

    def spy(comm, xp, *args):
        ran[xp.__name__] += 1
        return inner(comm, xp, *args)

    _core._propose_dense = spy
    results, fails = [], []
    rng = np.random.default_rng(rng_seed)
    case = 0
    try:
        for v in (1, 7, 300, 5000):
            for b in (1, 3, 8):
                for policy in ("standard", "floor-first"):
                    case += 1
                    if n_cases and case > n_cases:
                        return results, fails, ran
                    kind = ("random", "ties", "flat", "wide")[case % 4]
                    x = _logits(rng, b, v, kind)
                    bias = None
                    if case % 3 == 1:
                        bias = _bias_row(rng, v)
                    elif case % 3 == 2:
                        bias = rng.normal(0, 1, (b, v)).astype(np.float32)
                    temp = rng.choice([0.0, 0.7, 1.0, 1.3, 40.0], size=b)
                    if case % 5 == 0:
                        temp[:] = 0.0  # every row greedy
                    keys = dyadic.Keys(seed=int(rng.integers(0, 2**63)), round=1,
                                       position=rng.integers(0, 2**31, size=b))
                    for split in _splits(v, world, rng, permute=bool(case % 2)):
                        lo, hi = split[rank]
                        xm = _shard_masked(x, split, world, rng)
                        bad = v >= 2 and b >= 2 and rng.random() < 0.2
                        if bad:  # a bad value in row 1 (its owner alone sees it)
                            xm[1, int(rng.integers(0, v))] = np.nan if case % 2 else np.inf
                        kw = dict(temperature=temp, top_k=None, policy=policy)
                        exp = {be: _outcome(lambda: _prop_digest(dyadic.propose(
                            xm, keys, bias=bias, backend=be, **kw))) for be in ("cpu", "cuda")}

                        def sharded(to_local):
                            bl = None if bias is None else to_local(
                                np.ascontiguousarray(bias[..., lo:hi]))
                            out = dd.propose(to_local(np.ascontiguousarray(xm[:, lo:hi])), keys,
                                             vocab_offset=lo, vocab_size=v, bias=bl, **kw)
                            return out, dd.last_exchange

                        kinds = []

                        def on_device():
                            (tokens, q), st = sharded(lambda a: torch.from_numpy(a).cuda())
                            kinds.append((tokens.is_cuda, tokens.dtype, q.counts.is_cuda,
                                          q.counts.dtype))
                            return (_prop_digest(_gather_dense((tokens, q), rank, world)),
                                    st.collectives, st.bytes_sent)

                        def on_host():
                            res, st = sharded(lambda a: a)
                            return (_prop_digest(_gather_dense(res, rank, world)),
                                    st.collectives, st.bytes_sent)

                        before = ran["cupy"]
                        got = _outcome(on_device)
                        host = _outcome(on_host)
                        results.append((got[0], got[1][0] if got[0] == "ok" else got[1]))
                        what = (f"dense case {case} v={v} b={b} {kind} {policy} "
                                f"bias={None if bias is None else bias.shape} split={split}")
                        if got[0] == "ok" and ran["cupy"] != before + 1:
                            fails.append(f"{what}: the CUDA shard did not take the device path")
                        if kinds and kinds[0] != (True, torch.int32, True, torch.uint32):
                            fails.append(f"{what}: outputs (tokens on CUDA, dtype, counts on "
                                         f"CUDA, dtype) = {kinds[0]}; expected CUDA int32 / "
                                         f"uint32 tensors")
                        if got != host:
                            fails.append(f"{what}: device {got}, host shards {host}")
                        for be, e in exp.items():
                            mine = (got[0], got[1][0] if got[0] == "ok" else got[1])
                            if mine != e:
                                fails.append(f"{what}: got {mine}, unsharded {be} {e}")
                        if bad and got[0] != "ValueError":
                            fails.append(f"{what}: a bad row did not raise: {got}")
    finally:
        _core._propose_dense = inner
    return results, fails, ran


def dense_worker(rank, world, port, backend, queue, n_cases, device):
    """dense_cases on gloo ranks sharing GPU 0 (the arguments of ``worker``)."""
    import torch
    import torch.distributed as dist

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    try:
        torch.cuda.set_device(0)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, timeout=timedelta(seconds=60))
        res, fails, ran = dense_cases(rank, world, 4321 + world, n_cases)
        queue.put((rank, "done", {"dense": res, "fails": fails, "ran": ran}))
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - reported to the parent test
        queue.put((rank, "crash", traceback.format_exc()))


def worker(rank, world, port, backend, queue, n_cases, device):
    import torch
    import torch.distributed as dist

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    try:
        if device == "cuda":
            torch.cuda.set_device(rank)
        if device == "cuda-shard":  # gloo ranks sharing one GPU, shards as CUDA tensors
            torch.cuda.set_device(0)
            _LOCAL[0] = lambda a: torch.from_numpy(a).cuda()
            CHECK_BACKEND[0] = "cuda"
        dist.init_process_group("nccl" if device == "cuda" else "gloo",
                                init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, timeout=timedelta(seconds=60))
        res_p, fail_p = propose_cases(rank, world, 1234 + world, backend, n_cases)
        res_v, fail_v = verify_cases(rank, world, 99 + world, backend, n_cases)
        errs = error_cases(rank, world, backend)
        import dyadic.distributed as dd
        stats = dd.last_exchange
        on_device = None
        if device == "cuda-shard":  # whether the device path served the CUDA shards
            from dyadic.distributed import _core
            on_device = _core._device_kernels(torch.zeros(1, device="cuda")) is not None
        queue.put((rank, "done", {"propose": res_p, "verify": res_v, "errors": errs,
                                  "fails": fail_p + fail_v, "stats": repr(stats),
                                  "on_device": on_device}))
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - reported to the parent test
        queue.put((rank, "crash", traceback.format_exc()))
