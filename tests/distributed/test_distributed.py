"""Sharded propose/verify (dyadic.distributed) == unsharded, bit for bit.

One process group per world size (2, 3, 4 gloo ranks on 127.0.0.1); each
rank runs every case of tests/distributed/_distributed_cases.py (random and adversarial:
uneven and permuted splits, an empty shard, a fully masked shard, ties across
shard boundaries, both policies, top_k None/1/32, sparse/dense/sharded/None q,
greedy rows, data errors) and compares with the unsharded call.  Errors that
only one rank sees must be raised identically on every rank.  Everything has
a timeout: a hang fails the test instead of blocking the suite.
"""

import os
import socket
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is an optional dependency "
                            "(pip install torch==2.13.0) needed by dyadic.distributed")

sys.path.insert(0, os.path.dirname(__file__))
import _distributed_cases as cases  # noqa: E402

import dyadic  # noqa: E402

TIMEOUT = 240


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _backend():
    return "cpu" if "cpu" in dyadic.available_backends() else "reference"


def _run(world, device="cpu", n_cases=0, target=None):
    """Run ``target`` (default: cases.worker) on ``world`` spawned gloo / NCCL ranks;
    returns each rank's result dict."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=target or cases.worker,
                         args=(r, world, port, _backend(), queue, n_cases, device), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    out = {}
    try:
        for _ in range(world):
            rank, kind, data = queue.get(timeout=TIMEOUT)
            out[rank] = (kind, data)
    except Exception as exc:  # queue.Empty: some rank hung or died
        pytest.fail(f"world {world}: ranks {sorted(set(range(world)) - set(out))} did not "
                    f"finish within {TIMEOUT}s ({type(exc).__name__})")
    finally:
        for p in procs:
            p.join(timeout=20)
            if p.is_alive():
                p.kill()
    crashes = {r: d for r, (k, d) in out.items() if k == "crash"}
    assert not crashes, f"worker crashed: {crashes}"
    return {r: d for r, (_, d) in out.items()}


def _check(res, world):
    r0 = res[0]
    for r in range(world):
        assert not res[r]["fails"], "\n".join(res[r]["fails"][:10])
        # every rank saw the same outcome (result digest or error text) for every case
        for key in ("propose", "verify", "errors"):
            assert res[r][key] == r0[key], f"rank {r} disagrees with rank 0 on {key}"
    errs = r0["errors"]
    assert errs[0][0] == "ValueError" and "bias" in errs[0][1]
    assert errs[1][0] == "ValueError" and "tile" in errs[1][1]
    assert errs[2][0] == "ValueError" and "keys" in errs[2][1]
    assert errs[3] == ("ValueError", dyadic._status.message(1, 1))
    assert errs[4][0] == "TypeError" and "float32" in errs[4][1]
    assert errs[5][0] == "ok"
    ok_p = sum(k == "ok" for k, _ in r0["propose"])
    ok_v = sum(k == "ok" for k, _ in r0["verify"])
    assert ok_p > 100 and ok_v > 100  # most cases ran to a result, not to an error
    accepted = [m.split("acc=")[1] for k, m in r0["verify"] if k == "ok"]
    flat = [int(a) for s in accepted for a in s.strip("[]").split(",")]
    assert set(flat) >= {0, 1, 3}  # rejections (correction draws) and bonus draws happened


@pytest.mark.parametrize("world", [2, 3, 4])
def test_gloo_parity(world):
    _check(_run(world), world)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="NCCL parity needs a machine with >= 2 CUDA GPUs")
@pytest.mark.parametrize("world", [2, 4, 8])
def test_nccl_parity(world):
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} GPUs, found {torch.cuda.device_count()}")
    _check(_run(world, device="cuda"), world)


def test_import_dyadic_does_not_import_torch():
    import subprocess
    code = "import sys, dyadic; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.strip() == "False", out.stderr


