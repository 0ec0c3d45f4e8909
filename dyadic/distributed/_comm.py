"""The only transport: torch.distributed collectives on the caller's process group.

gloo groups exchange CPU tensors, NCCL groups CUDA tensors (on the current
device).  Every exchange goes through ``all_gather`` / ``all_reduce`` here so
that the bytes each rank contributes are counted.
"""

import numpy as np

_ERR_MSG_BYTES = 1024
_ERR_TYPES = {1: ValueError, 2: TypeError, 3: RuntimeError}


class Comm:
    def __init__(self, group):
        import torch
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("dyadic.distributed: torch.distributed is not initialised "
                               "(call torch.distributed.init_process_group first)")
        self.torch, self.dist, self.group = torch, dist, group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        if dist.get_backend(group) == "nccl":
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.device = torch.device("cpu")
        self.bytes_sent = 0
        self.collectives = 0

    def _tensor(self, arr):
        return self.torch.from_numpy(np.ascontiguousarray(arr)).to(self.device)

    def all_gather(self, arr):
        """NumPy array (same shape and dtype on every rank) -> [world, *shape] NumPy."""
        arr = np.ascontiguousarray(arr)
        t = self._tensor(arr)
        out = [self.torch.empty_like(t) for _ in range(self.world)]
        self.dist.all_gather(out, t, group=self.group)
        self.bytes_sent += arr.nbytes
        self.collectives += 1
        return np.stack([o.cpu().numpy() for o in out]) if out else arr[None]

    def all_reduce(self, arr, op="sum"):
        arr = np.ascontiguousarray(arr)
        t = self._tensor(arr)
        red = {"sum": self.dist.ReduceOp.SUM, "max": self.dist.ReduceOp.MAX,
               "min": self.dist.ReduceOp.MIN}[op]
        self.dist.all_reduce(t, op=red, group=self.group)
        self.bytes_sent += arr.nbytes
        self.collectives += 1
        return t.cpu().numpy()

    def agree(self, error, header):
        """Exchange a fixed-size header; if any rank failed, every rank raises its error.

        ``error``: None or the exception this rank hit while preparing its inputs.
        The error of the lowest failing rank is raised on every rank (same type,
        same message), so no rank is left waiting in a later collective.
        """
        code = 0
        if error is not None:
            code = 1 if isinstance(error, ValueError) else 2 if isinstance(error, TypeError) else 3
        arr = np.array([code] + [int(h) for h in header], dtype=np.int64)
        g = self.all_gather(arr)
        bad = np.flatnonzero(g[:, 0])
        if bad.size:
            msg = np.zeros(_ERR_MSG_BYTES, dtype=np.uint8)
            if error is not None:
                raw = f"{error}".encode()[:_ERR_MSG_BYTES]
                msg[:len(raw)] = np.frombuffer(raw, dtype=np.uint8)
            msgs = self.all_gather(msg)
            r = int(bad[0])
            text = bytes(msgs[r]).rstrip(b"\0").decode(errors="replace")
            raise _ERR_TYPES[int(g[r, 0])](text)
        return g[:, 1:]
