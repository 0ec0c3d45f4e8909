"""Faults in sharded calls (dyadic.distributed) are agreed: every rank raises the same error.

One process group per world size (2 and 3 gloo ranks on 127.0.0.1) runs every
case of tests/distributed/_distributed_faults.py in order: a bad input on one rank (a meta
tensor), an exception of any type on one rank while preparing a call or before
each data collective of each kind of call (and while building the outputs),
replicated arguments that differ (check, temperature, top_k, policy, greedy,
draft), shard counts that break a rule, a rank that left a call without its
collectives, ranks calling different operations, and last a rank killed in the
middle of a call.  For each case every rank must raise the same error type and
message within MAX_SECONDS, and the next call must work and equal the unsharded
call (the ranks are still in step).

Time limits: the process groups use a PG_TIMEOUT-second timeout (a hang inside a
collective becomes an error in seconds, not after torch's default 30 minutes;
the killed rank's peers fail at once because its sockets close, not through
this timeout), and each job is killed after JOB_TIMEOUT seconds, which fails the
test.
"""

import os
import socket
import sys
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is an optional dependency "
                            "(pip install torch==2.13.0) needed by dyadic.distributed")

sys.path.insert(0, os.path.dirname(__file__))
import _distributed_faults as faults  # noqa: E402

import dyadic  # noqa: E402

MAX_SECONDS = 5.0
PG_TIMEOUT = 15
JOB_TIMEOUT = 150


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _backend():
    return "cpu" if "cpu" in dyadic.available_backends() else "reference"


def _run(world):
    """Every rank's case records, in order; the ranks that did not finish within
    JOB_TIMEOUT (a hang) are reported with the cases that ended before it."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=faults.worker,
                         args=(r, world, port, _backend(), queue, PG_TIMEOUT), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    res = {r: [] for r in range(world)}
    done, crashes = set(), {}
    deadline = time.monotonic() + JOB_TIMEOUT
    try:
        while len(done) < world:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                rank, kind, data = queue.get(timeout=left)
            except Exception:  # noqa: BLE001 - queue.Empty: the deadline passed
                break
            if kind == "case":
                res[rank].append(data)
            else:
                done.add(rank)
                if kind == "crash":
                    crashes[rank] = data
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join(timeout=10)
    assert not crashes, f"worker crashed: {crashes}"
    hung = sorted(set(range(world)) - done)
    return res, hung


def _check(res, hung, world):
    killed = world - 1
    n = max(len(r) for r in res.values())
    problems = []
    for i in range(n):
        ranks = [r for r in range(world) if i < len(res[r])]
        name, _, _, (etype, subs) = res[ranks[0]][i]
        got = {r: res[r][i][1] for r in ranks}
        secs = {r: res[r][i][2] for r in ranks}
        assert all(res[r][i][0] == name for r in ranks), "ranks ran different cases"
        if name == "a rank killed mid-call":
            same = len({g[0] for g in got.values()}) == 1  # messages name the reporting rank
            expected = set(range(world)) - {killed}
        else:
            same = len(set(got.values())) == 1
            expected = set(range(world))
        ok = (same and set(ranks) == expected
              and all(g[0] == etype and all(s in g[1] for s in subs) for g in got.values())
              and max(secs.values()) < MAX_SECONDS)
        if not ok:
            problems.append(f"{name}: expected {etype} with {subs} on ranks {sorted(expected)}; "
                            f"got { {r: (g[0], g[1][:300]) for r, g in got.items()} } in "
                            f"{ {r: round(s, 2) for r, s in secs.items()} } s")
    if hung:
        problems.append(f"ranks {hung} did not finish within {JOB_TIMEOUT}s (a hang); the "
                        f"last case each rank finished: "
                        f"{ {r: res[r][-1][0] if res[r] else None for r in range(world)} }")
    assert not problems, f"world {world}: {len(problems)} problems in {n} cases:\n" + \
        "\n".join(problems[:25])
    names = [c[0] for c in res[0]]
    assert sum("data round" in m for m in names) >= 2 * 25  # every round of every call kind
    assert names[-1] == "a rank killed mid-call"


@pytest.mark.parametrize("world", [2, 3])
def test_faults_agreed(world):
    _check(*_run(world), world)


def test_shard_constructor_validates():
    import dyadic.distributed as dd

    good = np.zeros((2, 3), np.uint32)
    good[:, 0] = 1 << 24
    s = dd.DyadicShard(good, 0, 5)
    assert s.batch_shape == (2,) and s.vocab_offset == 0 and s.vocab_size == 5
    good[0, 0] = 7  # the shard holds its own read-only copy
    assert int(s.counts[0, 0]) == 1 << 24 and not s.counts.flags.writeable
    with pytest.raises(AttributeError, match="immutable"):
        s.counts = good
    neg = np.array([[-1, 1 << 24]], np.int64)
    with pytest.raises(TypeError, match=r"counts: dtype int64; expected uint32"):
        dd.DyadicShard(neg, 0, 4)
    big = np.array([[0, 0], [(1 << 24) + 1, 0]], np.uint32)
    with pytest.raises(ValueError, match=r"counts: row 1: each count must be <= 2\*\*24"):
        dd.DyadicShard(big, 0, 4)
    over = np.array([[1 << 23, (1 << 23) + 1]], np.uint32)
    with pytest.raises(ValueError, match=r"counts: row 0: the shard's counts sum to more"):
        dd.DyadicShard(over, 0, 4)
    with pytest.raises(ValueError, match=r"vocab_offset: local ids \[3, 5\) are not inside"):
        dd.DyadicShard(np.zeros((1, 2), np.uint32), 3, 4)
    with pytest.raises(TypeError, match="vocab_offset: expected an int"):
        dd.DyadicShard(np.zeros((1, 2), np.uint32), 1.0, 4)
    with pytest.raises(ValueError, match="vocab_size"):
        dd.DyadicShard(np.zeros((1, 2), np.uint32), 0, 0)
    with pytest.raises(ValueError, match="policy"):
        dd.DyadicShard(good, 0, 5, policy="nope")
    assert dd.DyadicShard(np.zeros((2, 0), np.uint32), 5, 5).batch_shape == (2,)  # empty shard
    t = torch.from_numpy(np.array([[1 << 24, 0]], np.uint32))
    assert dd.DyadicShard(t, 0, 2).counts.data_ptr() != t.data_ptr()
