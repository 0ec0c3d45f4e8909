"""python -m dyadic.bench kernel-ab without a GPU: which kernels it may swap (parameter
lists read from the sources), how it compares two sides' outputs, its errors."""

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import dyadic  # noqa: E402
from dyadic.backends.cuda.cupy import routes, runtime  # noqa: E402
from dyadic.bench import kernel_ab  # noqa: E402
from dyadic.bench.__main__ import main as bench_main  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SOURCE = '''
/* a kernel in a comment is not one: extern "C" __global__ void ghost(int a) */
extern "C" __global__ void __launch_bounds__(256, 4) first(
    const void* x, int dt,  /* the dtype code */
    u64* out) {
  if (dt) f(x, (int)dt);
}
// extern "C" __global__ void ghost2(int b)
extern "C" __global__ void second(int a, const int* (b)) { }
static __device__ void helper(int a) { }
'''


def _tree(tmp_path, name, text):
    kdir = tmp_path / name / "backends" / "cuda" / "kernels"
    kdir.mkdir(parents=True)
    (tmp_path / name / "backends" / "include").mkdir()
    (kdir / "kernels.cu").write_text('#include "k.cuh"\n')
    (kdir / "k.cuh").write_text(text)
    return str(tmp_path / name), str(kdir)


def test_signatures_read_parameter_lists(tmp_path):
    _, kdir = _tree(tmp_path, "t", SOURCE)
    sigs = kernel_ab.signatures(kdir)
    assert sigs == {"first": "const void* x, int dt, u64* out",
                    "second": "int a, const int* (b)"}


def test_every_kernel_of_a_route_has_a_signature():
    sigs = kernel_ab.signatures(runtime.KERNEL_DIR)
    shapes = [("verify", dict(batch=b, v=129280, nsm=132, k1=6, greedy=False, lazy=True,
                              logits=True, bf16=True)) for b in (1, 64)]
    shapes += [("verify", dict(batch=4, v=129280, nsm=132, k1=6, greedy=g, lazy=lz))
               for g in (False, True) for lz in (False, True)]
    shapes += [("propose", dict(batch=4, v=129280, nsm=132, top_k=tk, x16=True, bias=False,
                                aligned=True, filtered=f, bf16=True))
               for tk in (32, None) for f in (False, True)]
    for primitive, shape in shapes:
        for name in routes.kernel_names(primitive, **shape):
            assert name in sigs, (primitive, shape, name)
    assert "const void* x, int dt" in sigs["logits_hist"]


def test_swap_plan_keeps_what_the_old_tree_cannot_launch():
    new = {"a": "int x", "b": "int x, int y", "c": "int x"}
    old = {"a": "int x", "b": "int x"}
    swap, kept = kernel_ab.swap_plan(["a", "b", "c", "void at::native::copy"], old, new)
    assert swap == ["a"]
    assert kept == {"b": "its parameter list differs", "c": "not in the old tree"}


def test_outputs_compared_array_by_array():
    keys = dyadic.Keys(seed=np.arange(2, dtype=np.uint64))
    logits = np.random.default_rng(1).standard_normal((2, 50)).astype(np.float32)
    a = dyadic.propose(logits, keys, top_k=8)
    b = dyadic.propose(logits, keys, top_k=8)
    assert kernel_ab.same_outputs(a, b)
    assert len(kernel_ab.arrays(a)) == 3  # tokens, then q's counts and ids
    tokens = np.array(a[0])
    tokens[0] += 1
    assert not kernel_ab.same_outputs(a, (tokens, a[1]))
    t = torch.arange(6).reshape(2, 3)
    assert kernel_ab.same_outputs((t, None), (t.clone(), None))
    assert not kernel_ab.same_outputs(t, t + 1)
    assert not kernel_ab.same_outputs(t, t.to(torch.int32))  # dtype
    assert not kernel_ab.same_outputs(t, t.reshape(3, 2))  # shape
    assert not kernel_ab.same_outputs((t, t), (t,))  # count
    assert not kernel_ab.same_outputs(None, None)  # nothing compared is not "the same"


def test_verdict_fields_are_compared():
    class V:  # a Verdict's fields
        def __init__(self, tokens):
            self.accepted, self.tokens, self.status = (torch.zeros(2, dtype=torch.int32),
                                                       tokens, None)
    t = torch.tensor([[1, 2, -1], [3, -1, -1]], dtype=torch.int32)
    assert kernel_ab.same_outputs(V(t), V(t.clone()))
    u = t.clone()
    u[1, 0] = 4
    assert not kernel_ab.same_outputs(V(t), V(u))


def test_kernel_sum():
    m = {"kernel_us a": 1.25, "launches a": 2.0, "kernel_us b": 3.5}
    assert kernel_ab.with_sum(m)["kernel_sum_us"] == 4.75


def test_errors_before_any_gpu_work(tmp_path, capsys):
    assert bench_main(["kernel-ab", str(tmp_path)]) == 2
    assert "not a dyadic source tree" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        kernel_ab.parse([ROOT, "--rounds", "0"])
    if not torch.cuda.is_available():
        assert bench_main(["kernel-ab", ROOT]) == 2
        assert "needs a CUDA GPU" in capsys.readouterr().err


def test_replacing_launchers_drops_the_plans(monkeypatch):
    from dyadic import _device
    from dyadic.backends.cuda.cupy import plans
    monkeypatch.setattr(runtime, "device_id", lambda: 0)
    monkeypatch.setattr(runtime, "_KERNELS", {(0, "a"): "old a", (0, "b"): "old b"})
    monkeypatch.setattr(plans, "PLANS", {"plan": "made with old a"})
    monkeypatch.setattr(_device, "_CALLS", {"call": "made with old a"})
    runtime.replace_kernels({"a": "new a"})
    assert runtime._KERNELS == {(0, "a"): "new a", (0, "b"): "old b"}
    assert plans.PLANS == {} and _device._CALLS == {}
