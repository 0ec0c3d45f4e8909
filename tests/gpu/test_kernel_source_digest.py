"""backends/cuda/cupy/runtime.source without a GPU: CuPy caches compiled modules on disk
by their source text, so the text handed to it must change whenever any header that
kernels.cu includes changes (else a new dyadic version would run the old binary)."""

import os
import shutil

from dyadic.backends.cuda.cupy import runtime


def _copy_tree(tmp_path):
    kernels = tmp_path / "kernels"
    include = tmp_path / "include"
    shutil.copytree(runtime.KERNEL_DIR, kernels)
    shutil.copytree(runtime.include_dir(), include)
    return kernels, include


def test_source_is_kernels_cu_after_a_header_digest():
    text = runtime.source()
    first, rest = text.split("\n", 1)
    assert first.startswith("// headers sha256 ") and len(first.split()[-1]) == 64
    with open(os.path.join(runtime.KERNEL_DIR, "kernels.cu")) as f:
        assert rest == f.read()


def test_source_changes_with_every_header(tmp_path, monkeypatch):
    kernels, include = _copy_tree(tmp_path)
    monkeypatch.setattr(runtime, "KERNEL_DIR", str(kernels))
    monkeypatch.setattr(runtime, "include_dir", lambda: str(include))
    base = runtime.source()
    assert base == runtime.source()  # a pure function of the files
    headers = sorted(kernels.glob("*.cuh")) + sorted(include.glob("*.h"))
    assert any(h.name == "dyadic_core.h" for h in headers)
    seen = {base}
    for h in headers:
        old = h.read_bytes()
        h.write_bytes(old + b"\n")
        seen.add(runtime.source())
        h.write_bytes(old)
    assert len(seen) == len(headers) + 1
    assert runtime.source() == base
