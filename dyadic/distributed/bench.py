"""Time per position and bytes exchanged: sharded (gloo, N ranks) vs unsharded.

    python -m dyadic.distributed.bench [--world 2 4] [--vocab 129280] [--batch 8]
    python -m dyadic.distributed.bench --dist nccl --world 2   # one process per GPU
    python -m dyadic.distributed.bench --dist gloo --shards cuda --world 2   # one GPU

Each rank is a spawned process on 127.0.0.1 (gloo: CPU tensors; nccl: rank r
on cuda:r with its shard as a CUDA tensor; gloo with ``--shards cuda``: every
rank's shard a CUDA tensor on GPU 0, the collectives' tensors on the device
too).  CUDA shards take the device path (the CUDA shard kernels, and for
dense propose the allocation's array code on CuPy); ``--host-kernels``
measures the fallback route instead (the ranks copy CUDA shards to the host
and run the CPU shard kernels and NumPy, as without CuPy).  The unsharded
baseline is ``dyadic.propose`` / ``dyadic.verify`` on the full vocabulary in
one process (backend ``cpu``, and with CUDA shards also ``cuda`` on one GPU).
Times are medians per call divided by the positions in the call (B for
propose, B * (k+1) for verify).
"""

import argparse
import socket
import statistics
import time
from datetime import timedelta

import numpy as np


def _inputs(v, b, k):
    import dyadic
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, (b, v)).astype(np.float32)
    w = np.exp(rng.normal(0, 3, (b, k + 1, v)))
    target = (w / w.sum(-1, keepdims=True)).astype(np.float32)
    dl = (np.log(target[:, :k]) + rng.normal(0, 1, (b, k, v))).astype(np.float32)
    toks, q = dyadic.propose(dl.reshape(b * k, v), dyadic.Keys(seed=3), top_k=32)
    qd = dyadic.Dyadic(q.counts.reshape(b, k, -1), q.ids.reshape(b, k, -1), vocab_size=v)
    return logits, target, toks.reshape(b, k), qd


def _time(fn, reps):
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _synced(fn, on_gpu):
    if not on_gpu:
        return fn
    import torch

    def run():
        fn()
        torch.cuda.synchronize()
    return run


def _cases(v, b, k):
    return [("propose top_k=32", "propose", dict(top_k=32), b),
            ("propose dense standard", "propose", dict(top_k=None), b),
            ("propose dense floor-first", "propose", dict(top_k=None, policy="floor-first"), b),
            ("verify k=5 sparse q", "verify", {}, b * (k + 1))]


def _worker(rank, world, port, v, b, k, reps, queue, dist_backend="gloo", shards="host",
            host_kernels=False):
    import torch
    import torch.distributed as dist

    import dyadic
    import dyadic.distributed as dd

    if host_kernels:  # the fallback route measured: CUDA shards copied to the host
        from dyadic.distributed import _core
        _core._device_kernels = lambda x: None

    torch.set_num_threads(1)
    on_gpu = dist_backend == "nccl" or shards == "cuda"
    if on_gpu:
        torch.cuda.set_device(rank if dist_backend == "nccl" else 0)
    dist.init_process_group(dist_backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=120))
    logits, target, draft, q = _inputs(v, b, k)
    if on_gpu:
        logits, target = torch.from_numpy(logits).cuda(), torch.from_numpy(target).cuda()
    lo, hi = v * rank // world, v * (rank + 1) // world
    keys = dyadic.Keys(seed=11, position=7)
    out = []
    for name, op, kw, positions in _cases(v, b, k):
        if op == "propose":
            x = logits[:, lo:hi].contiguous() if on_gpu else \
                np.ascontiguousarray(logits[:, lo:hi])
            fn = lambda: dd.propose(x, keys, vocab_offset=lo, vocab_size=v, **kw)  # noqa: E731
        else:
            t = target[..., lo:hi].contiguous() if on_gpu else \
                np.ascontiguousarray(target[..., lo:hi])
            fn = lambda: dd.verify(t, draft, q, keys, vocab_offset=lo, vocab_size=v)  # noqa: E731
        dist.barrier()
        sec = _time(_synced(fn, on_gpu), reps)
        st = dd.last_exchange
        out.append((name, sec / positions, st.bytes_sent / positions, st.collectives))
    queue.put((rank, out))
    dist.destroy_process_group()


def main(argv=None):
    import torch.multiprocessing as mp

    import dyadic

    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--vocab", type=int, default=129280)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dist", choices=["gloo", "nccl"], default="gloo",
                    help="torch.distributed backend (nccl: one process per GPU)")
    ap.add_argument("--shards", choices=["host", "cuda"], default="host",
                    help="gloo: the ranks' shards as NumPy arrays (host) or CUDA tensors on "
                         "GPU 0 (nccl: always CUDA tensors, one GPU per rank)")
    ap.add_argument("--host-kernels", action="store_true",
                    help="CUDA shards copied to the host for the CPU shard kernels "
                         "(the route taken without CuPy)")
    a = ap.parse_args(argv)
    v, b, k = a.vocab, a.batch, a.k
    on_gpu = a.dist == "nccl" or a.shards == "cuda"
    avail = dyadic.available_backends()
    baselines = ["cpu" if "cpu" in avail else "reference"]
    if on_gpu and "cuda" in avail:
        baselines.append("cuda")
    logits, target, draft, q = _inputs(v, b, k)
    keys = dyadic.Keys(seed=11, position=7)
    print(f"V={v} B={b} k={k}; dist={a.dist}; shards={'cuda' if on_gpu else 'host'}"
          f"{' (host kernels)' if a.host_kernels else ''}; times are per position "
          f"(median of {a.reps})")
    print(f"{'case':28s} {'ranks':>12s} {'us/pos':>10s} {'B sent/rank/pos':>16s} {'collectives':>11s}")
    for base in baselines:
        lg, tg = logits, target
        if base == "cuda":
            import torch
            lg, tg = torch.from_numpy(logits).cuda(), torch.from_numpy(target).cuda()
        for name, op, kw, positions in _cases(v, b, k):
            if op == "propose":
                fn = lambda: dyadic.propose(lg, keys, backend=base, **kw)  # noqa: E731
            else:
                fn = lambda: dyadic.verify(tg, draft, q, keys, backend=base)  # noqa: E731
            fn = _synced(fn, base == "cuda")
            try:
                us = f"{1e6 * _time(fn, a.reps) / positions:10.1f}"
            except Exception as exc:  # noqa: BLE001 - a baseline failure must not hide the rest
                us = f"failed: {type(exc).__name__}: {str(exc)[:80]}"
            print(f"{name:28s} {'1 (' + base + ')':>12s} {us} {'0':>16s} {'0':>11s}")
    ctx = mp.get_context("spawn")
    for world in a.world:
        queue = ctx.Queue()
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        procs = [ctx.Process(target=_worker, args=(r, world, port, v, b, k, a.reps, queue, a.dist,
                                                   a.shards, a.host_kernels))
                 for r in range(world)]
        for p in procs:
            p.start()
        res = dict(queue.get(timeout=600) for _ in range(world))
        for p in procs:
            p.join(30)
        for i, (name, _, _, _) in enumerate(_cases(v, b, k)):
            sec = max(res[r][i][1] for r in res)
            byt = res[0][i][2]
            print(f"{name:28s} {str(world) + ' ' + a.dist:>12s} {1e6 * sec:10.1f} {byt:16.1f} "
                  f"{res[0][i][3]:11d}")


if __name__ == "__main__":
    main()
