"""The cuda backend refuses a GPU older than its kernels, without a GPU: a stand-in for
CuPy reports a device's compute capability, and runtime.module raises
BackendUnavailable before NVRTC would fail on the kernels."""

import pytest

from dyadic._backend import BackendUnavailable
from dyadic.backends.cuda.cupy import runtime


class _Device:
    def __init__(self, cc):
        self.cc = cc

    @property
    def compute_capability(self):
        if self.cc is None:
            raise AttributeError("compute_capability")
        return self.cc


class _FakeCupy:
    """cupy.cuda.Device(dev).compute_capability, as CuPy spells it ('75', '90')."""

    def __init__(self, cc):
        self.cuda = type("cuda", (), {"Device": staticmethod(lambda dev: _Device(cc))})


@pytest.fixture
def fake_cupy(monkeypatch):
    compiled = []
    monkeypatch.setattr(runtime, "_CUPY", [None])
    monkeypatch.setattr(runtime, "_MODULES", {})
    monkeypatch.setattr(runtime, "compile_module", lambda: compiled.append(1) or "module")

    def use(cc):
        runtime._CUPY[0] = _FakeCupy(cc)
        return compiled
    return use


@pytest.mark.parametrize("cc", ["61", "70", "75", "80", "86", "89"])
def test_older_device_is_refused_before_compiling(fake_cupy, cc):
    compiled = fake_cupy(cc)
    with pytest.raises(BackendUnavailable,
                       match=rf"device 3 has compute capability {cc[0]}\.{cc[1]}; "
                             r"its kernels need 9\.0 or later"):
        runtime.module(3)
    assert compiled == [] and runtime._MODULES == {}


@pytest.mark.parametrize("cc", ["90", "100", "120"])
def test_supported_device_compiles_once(fake_cupy, cc):
    compiled = fake_cupy(cc)
    assert runtime.module(1) == "module" and runtime.module(1) == "module"
    assert compiled == [1]


def test_unreported_capability_is_left_to_the_compiler(fake_cupy):
    compiled = fake_cupy(None)
    assert runtime.compute_capability(0) is None
    assert runtime.module(0) == "module" and compiled == [1]
