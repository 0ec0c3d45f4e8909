"""Kernel launches straight through the CUDA driver: ``cuLaunchKernel`` via ctypes.

CuPy's ``Function.__call__`` converts every argument to a CPointer object
(~35-40 per launch here), which dominated the eager host time.  ``Kernel``
calls ``cuLaunchKernel(f, grid, block, 0, stream, kernelParams, NULL)``
directly:

- ``f`` is the CUfunction handle CuPy already loaded (``Function.ptr``);
- ``stream`` is a raw stream handle: the one passed in, else CuPy's current
  stream (``dyadic._device`` makes that the caller's torch stream);
- ``kernelParams`` points at one 8-byte slot per argument: ``np.int32`` and
  other integers are written sign-extended (the driver reads the parameter's
  size from the kernel image: 4 bytes of a little-endian slot are the int32),
  pointers (``np.uint64``, ``cupy.ndarray`` -> ``.data.ptr``) as 64-bit words.
  Floats are written as their bit patterns (float -> float64, like CuPy).

The slots are preallocated per kernel and reused: the driver copies the
parameters before ``cuLaunchKernel`` returns.  A free list makes concurrent
use from several threads safe (a second slot is made when one is busy).
No allocation on the device, no synchronisation: launches can be captured in
a CUDA graph.  A non-zero CUresult raises RuntimeError with the error's name.

``MODE = "cupy"`` (environment ``DYADIC_CUDA_LAUNCH=cupy``) launches through
CuPy instead; so does every launch when ``libcuda.so.1`` cannot be loaded.
``MODE`` is read at every launch, so a process can compare both paths.
"""

import ctypes
import os
import struct
import sys

#: "driver" (cuLaunchKernel via ctypes, the default) or "cupy" (CuPy's launch).
MODE = "cupy" if os.environ.get("DYADIC_CUDA_LAUNCH", "").strip().lower() == "cupy" else "driver"

_MASK64 = (1 << 64) - 1
CUDA_ERROR_INVALID_CONTEXT = 201

_STATE = {"lib": None, "why": None, "loaded": False}
_ND = type("_NoNdarray", (), {})  # cupy.ndarray once configure() ran


def _cupy_current_stream():
    import cupy
    return cupy.cuda.get_current_stream().ptr


_CURRENT_STREAM = _cupy_current_stream  # () -> raw handle of the current stream (configure())


def _cupy_external_stream(handle):
    import cupy
    return cupy.cuda.ExternalStream(handle)


# raw handle -> CuPy stream object, for the CuPy fallback with an explicit stream
# (configure(): runtime.external_stream, which avoids CuPy 14's deprecated class)
_WRAP_STREAM = _cupy_external_stream
_ON_INVALID_CONTEXT = None  # () -> None: make the device's primary context current
_SIGNED = {}  # n -> struct.Struct("=nq")
_UNSIGNED = {}  # n -> struct.Struct("=nQ")
_STREAM_ARGS = {}  # raw handle -> ctypes.c_void_p (bounded)


class _Driver:
    """The two driver entry points we use, from a loaded libcuda (or a test stub)."""

    def __init__(self, lib):
        self.launch = lib.cuLaunchKernel
        self.error_name_fn = getattr(lib, "cuGetErrorName", None)
        try:  # ctypes functions: C int result; arguments are converted per call (no argtypes:
            self.launch.restype = ctypes.c_int  # pointers go as c_void_p, dims as C ints)
        except AttributeError:
            pass

    def error_name(self, rc):
        fn = self.error_name_fn
        if fn is None:
            return f"CUresult {rc}"
        try:
            s = ctypes.c_char_p()
            if fn(int(rc), ctypes.byref(s)) == 0 and s.value:
                return s.value.decode()
        except Exception:  # noqa: BLE001 - the name is only for the message
            pass
        return f"CUresult {rc}"


def load(libname="libcuda.so.1"):
    """Load the driver once; returns the _Driver or None (then CuPy launches)."""
    if not _STATE["loaded"]:
        _STATE["loaded"] = True
        if sys.byteorder != "little":
            _STATE["why"] = "big-endian host (the 8-byte argument slots assume little-endian)"
        else:
            try:
                _STATE["lib"] = _Driver(ctypes.CDLL(libname))
            except (OSError, AttributeError) as e:
                _STATE["why"] = f"{libname} not loadable: {e}"[:200]
    return _STATE["lib"]


def set_driver(lib):
    """Use ``lib`` (an object with cuLaunchKernel / cuGetErrorName, e.g. a test stub)
    as the driver; None: no driver (CuPy launches)."""
    _STATE["loaded"] = True
    _STATE["lib"] = None if lib is None else _Driver(lib)
    _STATE["why"] = None if lib is not None else "no driver set"


def configure(ndarray=None, current_stream=None, on_invalid_context=None, wrap_stream=None):
    """Tell the launcher CuPy's ndarray type, how to read the current stream handle, how
    to make the current device's context current and how to wrap a raw stream handle in
    a CuPy stream object for the CuPy fallback (called by runtime.py)."""
    global _ND, _CURRENT_STREAM, _ON_INVALID_CONTEXT, _WRAP_STREAM
    if ndarray is not None:
        _ND = ndarray
    if current_stream is not None:
        _CURRENT_STREAM = current_stream
    if on_invalid_context is not None:
        _ON_INVALID_CONTEXT = on_invalid_context
    if wrap_stream is not None:
        _WRAP_STREAM = wrap_stream


def active():
    """True when launches go through cuLaunchKernel (MODE "driver" and a driver)."""
    return MODE != "cupy" and load() is not None


def current_stream():
    """The raw handle of the current stream, for several launches in a row on it (each
    given it as ``stream``: read once); None where launches go through CuPy (MODE
    "cupy", no driver), which reads its current stream itself."""
    if _STATE["lib"] is None or MODE == "cupy":
        return None
    return _CURRENT_STREAM()


def describe():
    if MODE == "cupy":
        return "cupy (launch.MODE = 'cupy', e.g. DYADIC_CUDA_LAUNCH=cupy)"
    if load() is None:
        return "cupy (" + str(_STATE["why"]) + ")"
    extra = _STATE.get("nohandle")
    return "driver (cuLaunchKernel via ctypes)" + (f"; {extra}" if extra else "")


def _struct(table, code, n):
    s = table.get(n)
    if s is None:
        s = struct.Struct("=%d%s" % (n, code))
        table[n] = s
    return s


def _stream_arg(handle):
    h = _STREAM_ARGS.get(handle)
    if h is None:
        if len(_STREAM_ARGS) > 256:
            _STREAM_ARGS.clear()
        h = ctypes.c_void_p(int(handle) or None)
        _STREAM_ARGS[handle] = h
    return h


def slot_value(a, kernel="kernel"):
    """One argument as the unsigned 64-bit word written into its slot."""
    import numpy as np

    if a is None:
        return 0
    if isinstance(a, _ND):
        return int(a.data.ptr)
    if isinstance(a, (bool, np.bool_)):
        return int(bool(a))
    if isinstance(a, (int, np.integer)):
        return int(a) & _MASK64
    if isinstance(a, (float, np.float64)):
        return struct.unpack("=Q", struct.pack("=d", float(a)))[0]
    if isinstance(a, np.float32):
        return int(np.asarray(a).view(np.uint32))
    if isinstance(a, np.float16):
        return int(np.asarray(a).view(np.uint16))
    cai = getattr(a, "__cuda_array_interface__", None)
    if cai is not None:
        return int(cai["data"][0])
    if hasattr(a, "data_ptr"):  # torch tensors
        return int(a.data_ptr())
    raise TypeError(f"{kernel}: unsupported kernel argument of type {type(a).__name__}")


def fill(buf, args, kernel="kernel"):
    """Write ``args`` into the 8-byte slots of ``buf`` (a writable buffer of >= 8 * len
    bytes): signed 64-bit words on the fast path (np.int32 sign-extended, pointers
    < 2**63), the unsigned words of ``slot_value`` otherwise."""
    nd = _ND
    vals = [a.data.ptr if type(a) is nd else a for a in args]
    n = len(vals)
    try:
        (_SIGNED.get(n) or _struct(_SIGNED, "q", n)).pack_into(buf, 0, *vals)
    except (struct.error, TypeError, OverflowError):
        (_UNSIGNED.get(n) or _struct(_UNSIGNED, "Q", n)).pack_into(
            buf, 0, *[slot_value(a, kernel) for a in args])
    return n


class _Slots:
    """n 8-byte argument slots and the array of pointers to them (kernelParams); ``w``
    views the slots as unsigned 64-bit words (``w[i] = value`` writes slot i)."""

    __slots__ = ("cap", "buf", "ptrs", "arg", "w")

    def __init__(self, cap):
        self.cap = cap
        self.buf = (ctypes.c_uint64 * cap)()
        base = ctypes.addressof(self.buf)
        self.ptrs = (ctypes.c_void_p * cap)(*[base + 8 * i for i in range(cap)])
        self.arg = ctypes.c_void_p(ctypes.addressof(self.ptrs))
        self.w = memoryview(self.buf).cast("B").cast("Q")


def _handle_of(func):
    """The CUfunction handle of a CuPy kernel object, or None.

    ``RawModule.get_function`` returns a RawKernel (CuPy >= 8); its ``kernel``
    attribute is the loaded ``cupy.cuda.function.Function``, whose ``ptr`` is the
    handle (the RawKernel itself has no ``ptr`` in CuPy 14: reading only ``func.ptr``
    would send every launch down CuPy's path)."""
    for obj in (func, getattr(func, "kernel", None)):
        h = getattr(obj, "ptr", None)
        if isinstance(h, int) and h:
            return h
    return None


def _dims(dims3):
    """Launch dimensions for messages: the 3-tuple without its trailing 1s."""
    d = tuple(dims3[:3])
    while len(d) > 1 and d[-1] == 1:
        d = d[:-1]
    return d


class Kernel:
    """``kernel(grid, block, args, stream=None)``: one launch of a CUfunction.

    ``func``: CuPy's Function (``func.ptr`` is the CUfunction handle; calling it is
    the CuPy fallback).  ``args``: np.int32 / np.uint64 / Python ints / cupy.ndarray
    (and floats).  ``stream``: a raw stream handle; None: the current stream."""

    __slots__ = ("name", "func", "handle", "_free")

    def __init__(self, func, name="kernel", handle=None):
        self.name = name
        self.func = func
        h = _handle_of(func) if handle is None else handle
        self.handle = None if h is None else ctypes.c_void_p(int(h))
        if h is None:
            _STATE["nohandle"] = f"{name}: the CuPy function has no .ptr (CuPy launches it)"
        self._free = []

    def __call__(self, grid, block, args, stream=None):
        if (_STATE["lib"] is None or MODE == "cupy" or self.handle is None) and self.uses_cupy():
            return self._cupy(grid, block, args, stream)
        nd = _ND
        self.launch((*grid, 1, 1)[:3], (*block, 1, 1)[:3],
                    [a.data.ptr if type(a) is nd else a for a in args], stream)

    def uses_cupy(self):
        """True when this kernel launches through CuPy (MODE "cupy", no driver, no handle)."""
        if _STATE["lib"] is None or MODE == "cupy" or self.handle is None:
            return _STATE["loaded"] or MODE == "cupy" or self.handle is None or load() is None
        return False

    def launch(self, grid3, block3, args, stream=None):
        """``__call__`` for callers that did its conversions (the hot paths of
        plans.py): ``grid3`` / ``block3`` padded to 3 entries, ``args`` without
        cupy.ndarray (pointers as ints)."""
        lib = _STATE["lib"]
        if lib is None or MODE == "cupy" or self.handle is None:  # one test, then the
            if self.uses_cupy():  # common path runs straight through
                return self._cupy(grid3, block3, args, stream)
            lib = _STATE["lib"]
        n = len(args)
        try:
            slots = self._free.pop()
        except IndexError:
            slots = _Slots(max(n, 16))
        if slots.cap < n:
            slots = _Slots(n)
        try:
            (_SIGNED.get(n) or _struct(_SIGNED, "q", n)).pack_into(slots.buf, 0, *args)
        except (struct.error, TypeError, OverflowError):
            (_UNSIGNED.get(n) or _struct(_UNSIGNED, "Q", n)).pack_into(
                slots.buf, 0, *[slot_value(a, self.name) for a in args])
        self._go(lib, grid3, block3, slots, stream, self._free)

    def _go(self, lib, grid3, block3, slots, stream, free):
        """cuLaunchKernel with the filled ``slots`` on ``stream`` (None: the current
        stream); the slots go back to ``free`` (once the driver has copied them)."""
        if stream is None:
            stream = _CURRENT_STREAM()
        st = _STREAM_ARGS.get(stream)
        if st is None:
            st = _stream_arg(stream)
        g0, g1, g2 = grid3
        b0, b1, b2 = block3
        try:
            rc = lib.launch(self.handle, g0, g1, g2, b0, b1, b2, 0, st, slots.arg, None)
        except ctypes.ArgumentError:  # numpy integers as dimensions: _retry as plain ints
            rc = None
        if rc != 0:
            rc = self._retry(lib, rc, grid3, block3, st, slots)
        free.append(slots)
        if rc:
            raise RuntimeError(f"cuLaunchKernel({self.name}) failed: {lib.error_name(rc)} "
                               f"({rc}); grid {_dims(grid3)}, block {_dims(block3)}")

    def _retry(self, lib, rc, grid3, block3, st, slots):
        """The launch again where a retry can succeed, else ``rc`` unchanged: dimensions
        ctypes refused (``rc`` None: numpy integers) as plain ints, and
        CUDA_ERROR_INVALID_CONTEXT (a thread that never touched the runtime) once, after
        making the device's primary context current."""
        if rc is not None:
            if rc != CUDA_ERROR_INVALID_CONTEXT or _ON_INVALID_CONTEXT is None:
                return rc
            _ON_INVALID_CONTEXT()
        g0, g1, g2 = (int(d) for d in grid3)
        b0, b1, b2 = (int(d) for d in block3)
        return lib.launch(self.handle, g0, g1, g2, b0, b1, b2, 0, st, slots.arg, None)

    def _cupy(self, grid, block, args, stream):
        if stream is None:
            return self.func(grid, block, args)
        return self.func(grid, block, args, stream=_WRAP_STREAM(int(stream)))


class Var:
    """A per-call argument in the ``args`` of a ``Bound``: ``name`` finds its slot
    (``Bound.pos[name]``), ``fallback`` makes the value CuPy's launch passes from the
    slot's word (``int``: a pointer or 64-bit word; ``np.int32`` for an ``int``
    parameter)."""

    __slots__ = ("name", "fallback")

    def __init__(self, name, fallback=int):
        self.name, self.fallback = name, fallback


class Bound:
    """One launch of ``kernel`` whose grid, block and arguments are fixed except the
    ``Var`` ones: the repeat-call fast path's launches.

    ``s = bound.take()`` gives argument slots that already hold every fixed word
    (packed once, when the slots were made); the caller writes each per-call word,
    ``s.w[bound.pos[name]] = value`` (unsigned 64-bit: pointers, flags, small
    non-negative integers), then ``bound.launch(s)`` launches on the current stream and
    takes the slots back.  The same words reach the kernel as ``kernel(grid, block,
    args)`` with the values in place of the Vars (tests/gpu/test_launch_pack.py).  Without
    the driver (MODE "cupy", no libcuda, no handle) ``launch`` passes exactly those
    arguments to CuPy's launch, each Var's value made by its ``fallback``.  Slots are
    taken from a free list: concurrent calls from several threads get separate slots.
    """

    __slots__ = ("kernel", "grid3", "block3", "args", "pos", "_n", "_free")

    def __init__(self, kernel, grid, block, args):
        self.kernel = kernel
        self.grid3 = tuple(int(d) for d in (*grid, 1, 1)[:3])
        self.block3 = tuple(int(d) for d in (*block, 1, 1)[:3])
        self.args = tuple(args)
        self.pos = {a.name: i for i, a in enumerate(self.args) if type(a) is Var}
        if len(self.pos) != sum(type(a) is Var for a in self.args):
            raise ValueError(f"{kernel.name}: two per-call arguments with one name")
        self._n = len(self.args)
        self._free = []

    def take(self):
        """Argument slots holding the fixed words (the Vars' slots hold stale words)."""
        try:
            return self._free.pop()
        except IndexError:
            slots = _Slots(max(self._n, 16))
            fill(slots.buf, [0 if type(a) is Var else a for a in self.args], self.kernel.name)
            return slots

    def launch(self, slots, stream=None):
        """Launch with ``slots`` (from ``take``, per-call words written) on ``stream``
        (a raw handle; None: the current stream)."""
        k = self.kernel
        lib = _STATE["lib"]
        if lib is None or MODE == "cupy" or k.handle is None:
            if k.uses_cupy():
                w = slots.w
                args = [a.fallback(w[i]) if type(a) is Var else a for i, a in enumerate(self.args)]
                self._free.append(slots)
                return k._cupy(self.grid3, self.block3, args, stream)
            lib = _STATE["lib"]
        k._go(lib, self.grid3, self.block3, slots, stream, self._free)


__all__ = ["Bound", "Kernel", "MODE", "Var", "active", "configure", "current_stream", "describe",
           "fill", "load", "set_driver", "slot_value"]
