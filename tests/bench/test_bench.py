"""The benchmark harnesses run (no timing assertions: speed is measured by benchmarks only)."""

import importlib
import json
import os
import sys

import pytest

import dyadic

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_side_by_side_tiny_run(tmp_path, capsys):
    from dyadic.bench.__main__ import parse
    from dyadic.bench.run import main_run

    cfg = parse(["--vocab", "97", "--batch", "1,3", "--k", "2", "--top-k", "8", "--repeats", "2",
                 "--out", str(tmp_path), "--quiet", "--no-plot"])
    assert main_run(cfg) == 0
    out = capsys.readouterr().out
    data = json.loads((tmp_path / "bench.json").read_text())
    impls = {r["impl"] for r in data["results"]}
    assert {"numpy"} <= impls
    assert any(i.startswith("dyadic-") for i in impls)
    prims = {r["primitive"] for r in data["results"]}
    assert prims == {"propose", "verify", "allocate", "draw"}
    for r in data["results"]:
        assert r["min_s"] <= r["median_s"] <= r["max_s"]
    md = (tmp_path / "bench.md").read_text()
    assert md.count("\n| ") == len(data["results"]) + 1
    assert "median" in out


def test_alternatives_do_the_job():
    """The plain pipelines return tokens in range and allocations summing to 2**24."""
    import numpy as np

    from dyadic.bench import alternatives
    from dyadic.bench.inputs import Inputs

    a = alternatives.numpy_allocate(Inputs("allocate", 3, 50))()
    assert (a.sum(axis=1) == 1 << 24).all()
    t = alternatives.numpy_propose(Inputs("propose", 3, 50, top_k=4))()
    assert ((t >= 0) & (t < 50)).all()
    n, tok = alternatives.numpy_verify(Inputs("verify", 3, 50, k=2))()
    assert ((n >= 0) & (n <= 2)).all() and ((tok >= 0) & (tok < 50)).all()
    pytest.importorskip("torch")
    b = alternatives.torch_allocate(Inputs("allocate", 3, 50))().numpy()
    assert (b.astype(np.int64).sum(axis=1) == 1 << 24).all()
    assert (b == a).all()


def _asv_modules():
    sys.path.insert(0, os.path.join(ROOT, "asv_bench"))
    try:
        names = ["bench_allocate", "bench_draw", "bench_propose", "bench_verify", "bench_philox"]
        return [importlib.import_module(f"benchmarks.{n}") for n in names]
    finally:
        sys.path.pop(0)


def test_asv_benchmarks_run_once_on_cpu():
    """Every asv benchmark method runs for (cpu, 32000, 1): a broken benchmark fails here too."""
    if "cpu" not in dyadic.available_backends():
        pytest.skip("the cpu backend is not built here")
    ran = 0
    for mod in _asv_modules():
        for name in dir(mod):
            cls = getattr(mod, name)
            if not isinstance(cls, type) or cls.__module__ != mod.__name__:
                continue
            methods = [m for m in dir(cls) if m.startswith(("time_", "peakmem_"))]
            if not methods:
                continue
            obj = cls()
            try:
                obj.setup("cpu", 32000, 1)
            except NotImplementedError:
                continue
            for m in methods:
                getattr(obj, m)("cpu", 32000, 1)
                ran += 1
    assert ran >= 10
