"""dyadic/bench/gpu.py without a GPU: its CLI, its cases (built on the host backend, each
call run once: the arguments and out= buffers are well-formed), error rows, the script
form, and the asv GPU benchmark's skip.  Nothing is timed here."""

import importlib
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import dyadic  # noqa: E402
from dyadic.bench import gpu  # noqa: E402
from dyadic.bench.inputs import host_backend  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "dyadic", "bench", "gpu.py")


def test_parse():
    a = gpu.parse([])
    assert (a.batch, a.vocab, a.k, a.reps, a.label) == ([1, 4, 16, 64], 129280, 5, 200, "run")
    a = gpu.parse(["--batch", "2,8", "--vocab", "1000", "--k", "3", "--reps", "7",
                   "--out", "d", "--label", "old"])
    assert (a.batch, a.vocab, a.k, a.reps, a.out, a.label) == ([2, 8], 1000, 3, 7, "d", "old")


def test_case_selection():
    assert gpu.selects("verify_k5_dense", "verify_k5_dense_lazy_close_cold")
    assert gpu.selects("=verify_k5_dense", "verify_k5_dense")
    assert not gpu.selects("=verify_k5_dense", "verify_k5_dense_lazy")
    assert not gpu.selects("", "verify_k5_dense")


def test_cases_run_once_on_the_host_backend(monkeypatch):
    monkeypatch.setattr(gpu, "L2_BYTES", 1)  # two input sets per cold case
    B, V, k = 3, 300, 4
    inp = gpu.Inputs(B, V, k, device="cpu", backend=host_backend())
    cs = gpu.cases(inp)
    names = [c.name for c in cs]
    assert len(set(names)) == len(names)
    assert {"trivial_kernel", "propose_top32_bf16", "propose_top32_bf16_top_p",
            "propose_dense_bf16", "propose_dense_bf16_top_p",
            "propose_dense_bf16_floor_first", "allocate_dense_f32", "allocate_top32_f32",
            "draw_top32", "verify_k4_dense", "verify_k4_dense_lazy", "verify_k4_dense_checked",
            "verify_k4_top32", "verify_k4_top32_lazy", "verify_k4_top32_checked",
            "verify_k4_dense_greedy", "torch_top32_proposal", "torch_verify_k4_dense"} | {
            f"verify_k4_{q}{tag}_{w}_cold" for q in ("dense", "top32") for tag in ("", "_lazy")
            for w in ("close", "indep")} | {
            "verify_k4_dense_close_cold_ragged", "verify_k4_dense_lazy_close_cold_ragged"} | {
            f"verify_k4_logits_{q}{tag}_close_cold" for q in ("dense", "top32")
            for tag in ("", "_lazy")} | {
            "verify_k4_logits_dense_close_cold_ragged",
            "verify_k4_logits_dense_lazy_close_cold_ragged"} == set(names)
    assert sorted(c.name for c in cs if not c.eager) == sorted(n for n in names if "cold" in n)
    assert [c.name for c in cs if not c.graph] == ["verify_k4_dense_checked",
                                                    "verify_k4_top32_checked"]
    for c in cs:
        fn = c.make()
        assert getattr(fn, "calls", 1) == (2 if "cold" in c.name else 1)
        r = fn()
        if isinstance(r, dyadic.Verdict):
            assert r.tokens.shape == (B, k + 1)
            assert r.status is None or not r.status.any(), c.name  # valid inputs
        elif isinstance(r, tuple) and isinstance(r[1], dyadic.Dyadic):  # propose
            assert ((r[0] >= 0) & (r[0] < V)).all(), c.name
            assert (r[1].counts.to(torch.int64).sum(-1) == dyadic.TOTAL).all(), c.name
        elif isinstance(r, dyadic.Dyadic):  # allocate
            assert (r.counts.to(torch.int64).sum(-1) == dyadic.TOTAL).all(), c.name
    assert (inp.draft_dense >= 0).all() and (inp.draft_dense < V).all()


def test_a_failing_case_records_errors():
    def boom():
        raise ValueError("no input")
    row = gpu.measure(gpu.Case("bad", boom, 4.2e6, True), 1, 3, "x")
    assert row == {"label": "x", "B": 1, "case": "bad", "graph_dev_us": "error: ValueError: "
                   "no input", "eager_host_us": "error: ValueError: no input", "floor_us": 1.0}
    row = gpu.measure(gpu.Case("sync", lambda: (lambda: None), None, False), 1, 3, "x")
    assert row["graph_dev_us"].startswith("n/a") and row["floor_us"] is None
    assert "us" in gpu.markdown([row]).splitlines()[0]
    row = gpu.measure(gpu.Case("bad", boom, None, True), 1, 3, "x", kernel_reps=2)
    assert row["kernel_us"] == "error: ValueError: no input"
    if not torch.cuda.is_available():  # the profiled invocations need the device
        row = gpu.measure(gpu.Case("host", lambda: (lambda: None), None, False), 1, 3, "x",
                          kernel_reps=2)
        assert row["kernel_us"].startswith("error: ")


class _Event:
    def __init__(self, name, us, device_type=None):
        self.name, self.device_time = name, us
        self.device_type = torch.autograd.DeviceType.CUDA if device_type is None else device_type


def test_kernel_metrics_per_call():
    cpu = torch.autograd.DeviceType.CPU
    events = [_Event("hist", 10.0), _Event("hist", 30.0), _Event("hist", 20.0),
              _Event("resolve", 4.0), _Event("resolve", 6.0), _Event("resolve", 5.0),
              _Event("resolve", 100.0), _Event("resolve", 5.0), _Event("resolve", 7.0),
              _Event("verify", 999.0, cpu)]  # a host event: not a kernel
    m = gpu.kernel_metrics(events, calls=3)
    assert m == {"kernel_us hist": 20.0, "launches hist": 1.0,
                 "kernel_us resolve": 11.0, "launches resolve": 2.0}  # median 5.5 x 2


def test_kernel_table_in_markdown():
    row = {"label": "x", "B": 4, "case": "c", "graph_dev_us": 1.0, "eager_host_us": 2.0,
           "floor_us": None, "kernel_us k1": 3.5, "launches k1": 1.0}
    md = gpu.markdown([row])
    assert "| 4 | c | k1 | 3.5 | 1.0 |" in md
    bad = dict(row, **{"kernel_us": "error: RuntimeError: no profiler"})
    del bad["kernel_us k1"], bad["launches k1"]
    assert "| 4 | c | - | error: RuntimeError: no profiler | - |" in gpu.markdown([bad])
    assert "kernel" not in gpu.markdown([{k: row[k] for k in list(row)[:6]}])
    assert gpu.parse(["--kernels", "5"]).kernels == 5 and gpu.parse([]).kernels == 0


def test_no_module_outside_the_package():
    dyadic.available_backends()
    assert gpu.outside_modules() == []


def test_script_form():
    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, SCRIPT, "--help"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0 and "--label" in r.stdout, r.stderr
    if not torch.cuda.is_available():
        r = subprocess.run([sys.executable, SCRIPT, "--batch", "1"], capture_output=True,
                           text=True, env=env, timeout=120)
        assert r.returncode == 2 and "needs a CUDA GPU" in r.stderr


def test_asv_gpu_benchmark_skips_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the benchmark runs under asv")
    sys.path.insert(0, os.path.join(ROOT, "asv_bench"))
    try:
        mod = importlib.import_module("benchmarks.bench_gpu")
    finally:
        sys.path.pop(0)
    with pytest.raises(NotImplementedError):
        mod.GraphReplay().setup("propose_top32_bf16", 1)


def test_asv_gpu_cases_are_bench_cases():
    sys.path.insert(0, os.path.join(ROOT, "asv_bench"))
    try:
        mod = importlib.import_module("benchmarks.bench_gpu")
    finally:
        sys.path.pop(0)
    names = {c.name for c in gpu.cases(gpu.Inputs(1, device="cpu", backend=host_backend()))}
    assert set(mod.CASES) <= names, sorted(set(mod.CASES) - names)
