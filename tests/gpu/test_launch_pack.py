"""backends/cuda/cupy/launch.py without a GPU: argument slots, the kernelParams array, the
driver call, errors and the CuPy fallback, against a stub driver (no CUDA needed)."""

import ctypes

import numpy as np
import pytest

from dyadic.backends.cuda.cupy import launch


class _Ptr:
    def __init__(self, ptr):
        self.ptr = ptr


class FakeND:
    """Stands for cupy.ndarray: ``.data.ptr`` is the device pointer."""

    def __init__(self, ptr):
        self.data = _Ptr(ptr)


class FakeFunction:
    """Stands for CuPy's Function: ``.ptr`` the CUfunction, calling it CuPy's launch."""

    def __init__(self, ptr=0x7000):
        self.ptr = ptr
        self.calls = []

    def __call__(self, grid, block, args, stream=None):
        self.calls.append((grid, block, args, stream))


class StubDriver:
    """cuLaunchKernel / cuGetErrorName with the driver's argument conventions."""

    def __init__(self, rc=0, name=b"CUDA_ERROR_ILLEGAL_ADDRESS"):
        self.rc = list(rc) if isinstance(rc, (list, tuple)) else [rc]
        self.name = name
        self.launches = []
        self.on_launch = None
        self.read40 = False

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        rec = {"f": f.value, "grid": (gx, gy, gz), "block": (bx, by, bz), "smem": smem,
               "stream": stream.value or 0, "params": params.value, "extra": extra}
        if self.on_launch is not None:
            self.on_launch(rec)
        rec["words"] = _words(params.value, 16)  # the slots hold >= 16 words
        rec["n40"] = _words(params.value, 40) if self.read40 else None
        self.launches.append(rec)
        return self.rc.pop(0) if len(self.rc) > 1 else self.rc[0]

    def cuGetErrorName(self, rc, out):
        out._obj.value = self.name
        return 0


def _words(params, n):
    """The 8-byte words kernelParams[0..n) point at (unsigned)."""
    pp = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
    return [ctypes.c_uint64.from_address(pp[i]).value for i in range(n)]


def _int32_at(params, i):
    pp = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
    return ctypes.c_int32.from_address(pp[i]).value


@pytest.fixture
def stub():
    saved = (dict(launch._STATE), launch._ND, launch._CURRENT_STREAM,
             launch._ON_INVALID_CONTEXT, launch.MODE, launch._WRAP_STREAM)
    drv = StubDriver()
    launch.set_driver(drv)
    launch.configure(ndarray=FakeND, current_stream=lambda: 0x5150)
    launch.MODE = "driver"
    try:
        yield drv
    finally:
        launch._STATE.clear()
        launch._STATE.update(saved[0])
        (launch._ND, launch._CURRENT_STREAM, launch._ON_INVALID_CONTEXT, launch.MODE,
         launch._WRAP_STREAM) = saved[1:]
        launch._STREAM_ARGS.clear()


def test_fill_fast_path_words():
    saved = launch._ND
    launch.configure(ndarray=FakeND)
    try:
        buf = (ctypes.c_uint64 * 8)()
        args = (np.int32(-5), np.uint64(2**40 + 3), FakeND(0xDEAD0000), 7, np.int32(2**31 - 1),
                np.uint32(2**32 - 1))
        assert launch.fill(buf, args) == 6
        assert ctypes.c_int32.from_buffer(buf, 0).value == -5  # the 4 bytes the kernel reads
        assert list(buf[1:6]) == [2**40 + 3, 0xDEAD0000, 7, 2**31 - 1, 2**32 - 1]
    finally:
        launch._ND = saved


def test_fill_slow_path_words():
    saved = launch._ND
    launch.configure(ndarray=FakeND)
    try:
        buf = (ctypes.c_uint64 * 8)()
        args = (np.uint64(2**64 - 1), None, 1.5, np.float32(1.5), np.bool_(True), np.int32(-1),
                FakeND(0x1000))
        launch.fill(buf, args)
        assert buf[0] == 2**64 - 1
        assert buf[1] == 0
        assert buf[2] == int(np.array(1.5, dtype=np.float64).view(np.uint64))
        assert ctypes.c_uint32.from_buffer(buf, 24).value == int(
            np.array(1.5, dtype=np.float32).view(np.uint32))
        assert buf[4] == 1
        assert ctypes.c_int32.from_buffer(buf, 40).value == -1
        assert buf[6] == 0x1000
        with pytest.raises(TypeError, match="unsupported kernel argument"):
            launch.fill(buf, (object(),), "dc_x")
    finally:
        launch._ND = saved


def test_launch_passes_dims_stream_and_params(stub):
    k = launch.Kernel(FakeFunction(0x7000), "dc_test")
    args = (np.uint64(0x10000), np.int32(-3), FakeND(0x20000), np.int32(129280))
    k((5, 4), (256,), args)
    rec = stub.launches[-1]
    assert rec["f"] == 0x7000
    assert rec["grid"] == (5, 4, 1) and rec["block"] == (256, 1, 1) and rec["smem"] == 0
    assert rec["stream"] == 0x5150  # the current stream (configure)
    assert rec["extra"] is None
    assert rec["words"][0] == 0x10000 and rec["words"][2] == 0x20000
    assert _int32_at(rec["params"], 1) == -3 and _int32_at(rec["params"], 3) == 129280
    k((1,), (32, 2, 2), args[:2], stream=0xABC)
    rec = stub.launches[-1]
    assert rec["grid"] == (1, 1, 1) and rec["block"] == (32, 2, 2) and rec["stream"] == 0xABC
    k((1,), (32,), args, stream=0)  # the legacy default stream: NULL
    assert stub.launches[-1]["stream"] == 0


def test_slots_reused_and_reentrant(stub):
    k = launch.Kernel(FakeFunction(), "dc_test")
    k((1,), (1,), (np.int32(1), np.uint64(11)))
    k((1,), (1,), (np.int32(2), np.uint64(22)))
    assert stub.launches[0]["params"] == stub.launches[1]["params"]  # one slot set, reused
    seen = []

    def inner(rec):  # another launch of the same kernel while this one holds its slots
        if not seen:
            seen.append(_words(rec["params"], 2))
            k((1,), (1,), (np.int32(3), np.uint64(33)))
            seen.append(_words(rec["params"], 2))
    stub.on_launch = inner
    k((1,), (1,), (np.int32(4), np.uint64(44)))
    stub.on_launch = None
    assert seen[0] == seen[1] == [4, 44]  # the inner launch used other slots
    assert stub.launches[-2]["words"][:2] == [3, 33]


def test_more_args_than_slots(stub):
    k = launch.Kernel(FakeFunction(), "dc_test")
    args = tuple(np.int32(i) for i in range(40))
    stub.read40 = True
    k((1,), (1,), args)
    assert stub.launches[-1]["n40"] == list(range(40))


def test_error_raises_with_name(stub):
    stub.rc = [700]
    k = launch.Kernel(FakeFunction(), "topk_select")
    with pytest.raises(RuntimeError, match="topk_select.*CUDA_ERROR_ILLEGAL_ADDRESS"):
        k((1,), (1,), (np.int32(0),))


def test_invalid_context_retried_once(stub):
    calls = []
    launch.configure(on_invalid_context=lambda: calls.append(1))
    stub.rc = [launch.CUDA_ERROR_INVALID_CONTEXT, 0]
    k = launch.Kernel(FakeFunction(), "dc_test")
    k((2,), (3,), (np.int32(9),))
    assert calls == [1] and len(stub.launches) == 2
    assert stub.launches[1]["grid"] == (2, 1, 1) and stub.launches[1]["words"][0] == 9


def test_cupy_mode_and_no_driver_fall_back(stub):
    fn = FakeFunction()
    k = launch.Kernel(fn, "dc_test")
    args = (np.int32(1), FakeND(0x30))
    launch.MODE = "cupy"
    k((1,), (64,), args)
    assert fn.calls == [((1,), (64,), args, None)] and not stub.launches
    assert launch.describe().startswith("cupy")
    launch.MODE = "driver"
    assert launch.describe().startswith("driver")
    launch.set_driver(None)
    k((2,), (64,), args)
    assert len(fn.calls) == 2 and not stub.launches
    assert not launch.active()


def test_real_ctypes_marshalling(stub):
    """A ctypes function pointer with the driver's prototype receives the same values
    (dims as unsigned ints, pointers as void*), NumPy dims included."""
    got = []
    proto = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *([ctypes.c_uint] * 7),
                             ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)

    def cb(f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        got.append((f, (gx, gy, gz), (bx, by, bz), smem, stream, extra, _words(params, 3)))
        return 0
    fp = proto(cb)

    class Lib:
        cuLaunchKernel = fp
    launch.set_driver(Lib())
    k = launch.Kernel(FakeFunction(0x9000), "dc_test")
    k((np.int64(7), 3), (256,), (np.uint64(0xFFFF0000), np.int32(-2), FakeND(0x40)),
      stream=0x77)
    f, grid, block, smem, stream, extra, words = got[-1]
    assert f == 0x9000 and grid == (7, 3, 1) and block == (256, 1, 1) and smem == 0
    assert stream == 0x77 and extra is None
    assert words[0] == 0xFFFF0000 and words[1] & 0xFFFFFFFF == 0xFFFFFFFE and words[2] == 0x40


def test_cupy_fallback_wraps_an_explicit_stream(stub):
    """MODE "cupy": CuPy's launch gets the stream object made by the configured wrapper
    (runtime.external_stream: Stream.from_external on CuPy >= 14, not the deprecated
    ExternalStream); without a stream, CuPy's current stream (no stream argument)."""
    made = []

    def wrap(handle):
        made.append(handle)
        return ("stream object", handle)
    launch.configure(wrap_stream=wrap)
    launch.MODE = "cupy"
    fn = FakeFunction(0x9100)
    k = launch.Kernel(fn, "dc_test")
    k((2,), (64,), (np.int32(1),), stream=0xABC)
    k((2,), (64,), (np.int32(1),))
    assert made == [0xABC]
    assert fn.calls[0][3] == ("stream object", 0xABC)
    assert fn.calls[1][3] is None
    assert stub.launches == []  # nothing went through the driver


def _bound_case():
    """A kernel, fixed arguments of every kind and three per-call words (Vars)."""
    fn = FakeFunction(0x7100)
    k = launch.Kernel(fn, "dc_bound")
    x, kf, vec = launch.Var("x"), launch.Var("kfmt", np.int32), launch.Var("vec", np.int32)
    fixed = (np.int32(-7), np.uint64(2**40 + 5), FakeND(0xBEEF00), 12345)
    args = (x, fixed[0], fixed[1], kf, fixed[2], fixed[3], vec)
    return fn, k, launch.Bound(k, (6, 2), (256,), args), fixed


def _bound_launch(b, x, kf, vec, stream=None):
    s = b.take()
    s.w[b.pos["x"]], s.w[b.pos["kfmt"]], s.w[b.pos["vec"]] = x, kf, vec
    b.launch(s, stream)


def test_bound_same_launch_as_kernel_call(stub):
    _, k, b, (i32, u64, nd, py) = _bound_case()
    assert b.pos == {"x": 0, "kfmt": 3, "vec": 6}
    for x, kf, vec in ((0xA000, 5, 1), (0xB010, 0, 0), (2**63 - 8, 255, 1)):
        _bound_launch(b, x, kf, vec)
        k((6, 2), (256,), (x, i32, u64, np.int32(kf), nd, py, np.int32(vec)))
        got, want = stub.launches[-2], stub.launches[-1]
        for field in ("f", "grid", "block", "smem", "stream", "extra"):
            assert got[field] == want[field], field
        assert got["words"][:7] == want["words"][:7]
        assert _int32_at(got["params"], 1) == -7
    _bound_launch(b, 0xC000, 1, 0, stream=0xABC)
    assert stub.launches[-1]["stream"] == 0xABC


def test_bound_slots_keep_fixed_words_and_are_reentrant(stub):
    _, _, b, _ = _bound_case()
    _bound_launch(b, 0x1000, 1, 1)
    _bound_launch(b, 0x2000, 2, 0)
    assert stub.launches[0]["params"] == stub.launches[1]["params"]  # one slot set, reused
    assert stub.launches[1]["words"][:7] == [0x2000, 2**64 - 7, 2**40 + 5, 2, 0xBEEF00, 12345, 0]
    s1 = b.take()
    s2 = b.take()  # a second caller while the first holds its slots
    assert s1 is not s2 and list(s2.buf[1:3]) == [2**64 - 7, 2**40 + 5]


def test_bound_rejects_two_vars_of_one_name():
    k = launch.Kernel(FakeFunction(), "dc_bound")
    with pytest.raises(ValueError, match="dc_bound: two per-call arguments with one name"):
        launch.Bound(k, (1,), (1,), (launch.Var("x"), np.int32(1), launch.Var("x")))


def test_bound_error_raises_with_name(stub):
    stub.rc = [700]
    _, _, b, _ = _bound_case()
    with pytest.raises(RuntimeError, match="dc_bound.*CUDA_ERROR_ILLEGAL_ADDRESS"):
        _bound_launch(b, 0x1000, 0, 0)


def test_bound_cupy_fallback_gets_the_full_arguments(stub):
    fn, _, b, (i32, u64, nd, py) = _bound_case()
    launch.MODE = "cupy"
    _bound_launch(b, 0xD000, 3, 1, stream=None)
    assert not stub.launches
    grid, block, args, stream = fn.calls[-1]
    assert grid == (6, 2, 1) and block == (256, 1, 1) and stream is None
    assert args[0] == 0xD000 and type(args[0]) is int
    assert args[1] is i32 and args[2] is u64 and args[4] is nd and args[5] == py
    assert type(args[3]) is np.int32 and args[3] == 3
    assert type(args[6]) is np.int32 and args[6] == 1
