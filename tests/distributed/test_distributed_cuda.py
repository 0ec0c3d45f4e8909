"""Sharded propose/verify with every rank's shard a CUDA tensor: the device path
(backends/cuda/cupy/shard.py) == the unsharded call, bit for bit.

gloo ranks sharing one GPU (gloo carries the CUDA tensors of the collectives
through the host itself), each running every case of
tests/distributed/_distributed_cases.py with its slices as CUDA tensors: each
result is compared with the unsharded ``backend="cpu"`` call (results and
error texts) and, where it succeeds, with the unsharded ``backend="cuda"``
call; the outcomes are compared with those of the same cases with NumPy shards
(the host kernels); errors that one rank sees are raised identically on every
rank.  Dense propose has cases of its own (test_gloo_cuda_dense_propose: 2 - 4
ranks, several batch sizes, greedy rows, both policies, bias on and off, rows
with a bad value), each checked to run on the device.  Skips without torch, a
CUDA GPU or the cuda backend (CuPy).
"""

import os
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch is an optional dependency of "
                            "dyadic.distributed")

sys.path.insert(0, os.path.dirname(__file__))
import _distributed_cases as cases  # noqa: E402
import test_distributed as td  # noqa: E402

import dyadic  # noqa: E402


def _cuda_ready():
    if not torch.cuda.is_available():
        return "needs a CUDA GPU"
    if "cuda" not in dyadic.available_backends():
        return "needs the cuda backend (CuPy and an NVIDIA GPU)"
    return None


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_cuda_ready() is not None,
                                                  reason=str(_cuda_ready()))]


@pytest.mark.parametrize("world", [2, 3])
def test_gloo_cuda_shards(world):
    res = td._run(world, device="cuda-shard")
    assert all(res[r]["on_device"] for r in range(world)), \
        "the CUDA shards did not take the device path"
    td._check(res, world)
    host = td._run(world)  # the same cases with NumPy shards (the host kernels)
    for key in ("propose", "verify", "errors"):
        assert res[0][key] == host[0][key], f"device and host shards differ on {key}"


@pytest.mark.parametrize("world", [2, 3, 4])
def test_gloo_cuda_dense_propose(world):
    """Dense propose with CUDA shards runs on the device (CuPy, the CUDA shard kernels) and
    equals, bit for bit, the unsharded cuda and cpu calls and the same call with NumPy
    shards (with the same collectives and bytes); a row with NaN / +inf on one rank
    raises the unsharded call's ValueError on every rank."""
    res = td._run(world, device="cuda-shard", target=cases.dense_worker)
    for r in range(world):
        assert not res[r]["fails"], "\n".join(res[r]["fails"][:10])
        assert res[r]["dense"] == res[0]["dense"], f"rank {r} disagrees with rank 0"
    outcomes = [k for k, _ in res[0]["dense"]]
    assert outcomes.count("ok") > 50 and outcomes.count("ValueError") > 0
    assert res[0]["ran"]["cupy"] >= outcomes.count("ok")
