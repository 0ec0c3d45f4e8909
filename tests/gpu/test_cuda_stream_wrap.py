"""backends/cuda/cupy/runtime._wrap_stream without a GPU (fake CuPy modules): which CuPy
stream object wraps torch's raw stream handle.

CuPy >= 14: ``Stream.from_external`` with an object under the CUDA stream protocol
(``__cuda_stream__() -> (0, handle)``), kept only when it reports the same handle;
otherwise, and on CuPy without ``from_external``, ``ExternalStream(handle)`` with its
deprecation warning filtered (no other warning is hidden)."""

import types
import warnings

import pytest

from dyadic.backends.cuda.cupy import runtime

H = 0x5A5A00


class _Stream:
    def __init__(self, ptr):
        self.ptr = ptr


def _fake_cupy(from_external=None, deprecated=True, extra_warning=None):
    made = []

    class Stream:
        pass

    if from_external is not None:
        Stream.from_external = staticmethod(from_external)

    def external(handle):
        made.append(handle)
        if deprecated:
            warnings.warn("ExternalStream is deprecated. Use Stream.from_external() instead",
                          DeprecationWarning)
        if extra_warning:
            warnings.warn(extra_warning, UserWarning)
        return ("external", handle)

    cuda = types.SimpleNamespace(Stream=Stream, ExternalStream=external)
    return types.SimpleNamespace(cuda=cuda), made


def test_from_external_gets_the_protocol_object():
    seen = []

    def fe(obj):
        seen.append(obj.__cuda_stream__())
        return _Stream(obj.__cuda_stream__()[1])
    cp, made = _fake_cupy(fe)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        st = runtime._wrap_stream(cp, H)
    assert st.ptr == H and seen == [(0, H)] and made == []


@pytest.mark.parametrize("failure", ["raises", "other handle"])
def test_external_stream_when_from_external_does_not_fit(failure):
    def fe(obj):
        if failure == "raises":
            raise TypeError("__cuda_stream__ must return a 2-tuple")
        return _Stream(obj.__cuda_stream__()[1] + 8)
    cp, made = _fake_cupy(fe)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        st = runtime._wrap_stream(cp, H)
    assert st == ("external", H) and made == [H]


def test_older_cupy_external_stream_without_its_warning_only():
    cp, made = _fake_cupy(None, extra_warning="something else")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        st = runtime._wrap_stream(cp, H)
    assert st == ("external", H) and made == [H]
    assert [str(x.message) for x in w] == ["something else"]
