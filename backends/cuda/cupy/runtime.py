"""CuPy runtime of the cuda backend: the compiled kernel module, kernels, scratch
buffers, device properties and streams, per device.

The kernels (``backends/cuda/kernels/kernels.cu`` and the headers it includes) are
compiled at first use by NVRTC with ``--fmad=false`` and the shared integer core of
``backends/include``.  ``DYADIC_CUDA_PROF=1`` adds ``-lineinfo`` (source lines for
Nsight) and ``-DDC_PROF`` (the kernels' %globaltimer stamps in the module global
``dc_prof``); nothing else changes.  Launches go through ``launch.py``
(``cuLaunchKernel`` via ctypes; ``DYADIC_CUDA_LAUNCH=cupy``: CuPy's launch).

Scratch buffers are shared by the calls on one device: do not run two dyadic calls
concurrently on different streams of the same device.
"""

import hashlib
import os

from ...._backend import BackendUnavailable
from . import launch

_HERE = os.path.dirname(os.path.abspath(__file__))
KERNEL_DIR = os.path.join(os.path.dirname(_HERE), "kernels")
PROFILE = os.environ.get("DYADIC_CUDA_PROF") == "1"

_CUPY = []  # [cupy] once imported (a function-level import costs ~0.5 us per call)
_MODULES = {}
_KERNELS = {}
_SCRATCH = {}
_NSM = {}
_EXT_STREAMS = {}
_GET_STREAM = []  # [cupy.cuda.get_current_stream]
_LAUNCH_READY = []


def cupy():
    global device_id
    if not _CUPY:
        import cupy as cp
        _CUPY.append(cp)
        # the hot paths call device_id() once or twice per call: from now on it is
        # cupy.cuda.runtime.getDevice itself (the same result, no Python frame)
        device_id = cp.cuda.runtime.getDevice
    return _CUPY[0]


def device_id():
    """The current CUDA device (CuPy's view; replaced by cupy.cuda.runtime.getDevice
    once CuPy is loaded: call it as ``runtime.device_id()``)."""
    return cupy().cuda.runtime.getDevice()


def include_dir():
    """dyadic.backends.INCLUDE_DIR: the shared integer core (dyadic_core.h)."""
    return os.path.join(os.path.dirname(os.path.dirname(_HERE)), "include")


def source(kernel_dir=None, include=None):
    """kernels.cu of ``kernel_dir`` (default KERNEL_DIR), after a first line holding the
    SHA-256 of every header it can include (the kernel directory's ``.cuh`` files and the
    shared integer core of ``include``, default include_dir()).  CuPy's on-disk kernel
    cache keys on the source text and the options, not on the files an ``#include`` reads:
    without the digest, a changed header (a new dyadic version, an edited tree) would load
    the binary compiled from the old one."""
    kernel_dir = KERNEL_DIR if kernel_dir is None else kernel_dir
    include = include_dir() if include is None else include
    digest = hashlib.sha256()
    for folder in (kernel_dir, include):
        for name in sorted(os.listdir(folder)):
            if name.endswith((".cuh", ".h")):
                with open(os.path.join(folder, name), "rb") as f:
                    digest.update(name.encode() + b"\0" + f.read() + b"\0")
    with open(os.path.join(kernel_dir, "kernels.cu")) as f:
        return f"// headers sha256 {digest.hexdigest()}\n" + f.read()


def compile_module(kernel_dir=None, include=None):
    """A compiled RawModule of the kernels of ``kernel_dir`` with the integer core of
    ``include`` (default: this package's, KERNEL_DIR and include_dir()), built with the
    options of module().  Another source tree's folders give its kernels, for an A/B in
    one process (dyadic.bench kernel-ab)."""
    kernel_dir = KERNEL_DIR if kernel_dir is None else kernel_dir
    include = include_dir() if include is None else include
    mod = cupy().RawModule(code=source(kernel_dir, include), options=(
        "--fmad=false", "--ftz=false", "--prec-div=true", "--prec-sqrt=true", "--std=c++17",
        "-I" + include, "-I" + kernel_dir) + (("-lineinfo", "-DDC_PROF") if PROFILE else ()))
    mod.compile()
    return mod


#: The oldest compute capability (major * 10 + minor) the kernels compile for: they use
#: sm_90's packed 16-bit maximum (``max.u16x2``, topk_onepass_packed.cuh) and sm_80's
#: warp reductions (``__reduce_add_sync`` and its kin).
MIN_COMPUTE_CAPABILITY = 90


def compute_capability(dev):
    """Device ``dev``'s compute capability as major * 10 + minor, or None where CuPy
    does not say."""
    try:
        return int(cupy().cuda.Device(dev).compute_capability)
    except Exception:  # noqa: BLE001 - unknown here: the compiler decides
        return None


def check_device(dev):
    """BackendUnavailable for a device older than MIN_COMPUTE_CAPABILITY, before NVRTC
    or ptxas fails on the kernels (a device whose capability CuPy does not report is
    left to the compiler)."""
    cc = compute_capability(dev)
    if cc is not None and cc < MIN_COMPUTE_CAPABILITY:
        need = MIN_COMPUTE_CAPABILITY
        raise BackendUnavailable(
            f"backend 'cuda': device {dev} has compute capability {cc // 10}.{cc % 10}; "
            f"its kernels need {need // 10}.{need % 10} or later (instructions of sm_{need})")


def module(dev=None):
    """The compiled RawModule of device ``dev`` (default: the current one), compiled
    once per device; BackendUnavailable on a device older than MIN_COMPUTE_CAPABILITY."""
    cupy()  # device_id is CuPy's from here on
    if dev is None:
        dev = device_id()
    mod = _MODULES.get(dev)
    if mod is None:
        check_device(dev)
        mod = _MODULES[dev] = compile_module()
    return mod


def current_stream_ptr():
    """The raw handle of CuPy's current stream (the launch stream)."""
    if not _GET_STREAM:
        _GET_STREAM.append(cupy().cuda.get_current_stream)
    return _GET_STREAM[0]().ptr


def _make_context_current():
    rt = cupy().cuda.runtime
    rt.setDevice(rt.getDevice())  # CUDA 12: initialises and binds the primary context


def _launch_setup():
    if not _LAUNCH_READY:
        cp = cupy()
        launch.configure(ndarray=cp.ndarray, current_stream=current_stream_ptr,
                         on_invalid_context=_make_context_current, wrap_stream=external_stream)
        launch.load()
        _LAUNCH_READY.append(True)


def launch_mode():
    """How kernels are launched in this process: 'driver (...)' or 'cupy (why)'."""
    _launch_setup()
    return launch.describe()


def kernel(name):
    """The launcher (launch.Kernel) of kernel ``name`` on the current device."""
    dev = device_id()
    fn = _KERNELS.get((dev, name))
    if fn is None:
        fn = _KERNELS[(dev, name)] = launcher(module(dev), name)
    return fn


def launcher(mod, name):
    """A launcher (launch.Kernel) of kernel ``name`` of the compiled module ``mod``."""
    _launch_setup()
    return launch.Kernel(mod.get_function(name), name)


def replace_kernels(launchers):
    """Makes ``launchers`` ({name: launch.Kernel}) the launchers of those kernels on the
    current device, and drops every plan made so far (plans.PLANS, dyadic._device._CALLS:
    a plan keeps the launchers it was made with), so the next call plans with them.  For
    dyadic.bench kernel-ab and timeline, which time other kernels under this tree's
    plans."""
    from ...._device import _CALLS
    from .plans import PLANS
    dev = device_id()
    for name, fn in launchers.items():
        _KERNELS[(dev, name)] = fn
    PLANS.clear()
    _CALLS.clear()


def scratch(name, nbytes):
    """A device buffer of at least ``nbytes`` zeroed bytes, cached per (device, name);
    grown (a new zeroed buffer), never shrunk.  Kernels that keep state in one leave
    it zero when they end."""
    cp = cupy()
    key = (device_id(), name)
    buf = _SCRATCH.get(key)
    if buf is None or buf.nbytes < nbytes:
        buf = cp.zeros(max(int(nbytes), 8) // 8 + 1, dtype=cp.uint64)
        _SCRATCH[key] = buf
    return buf


def num_sms():
    """Streaming multiprocessors of the current device."""
    dev = device_id()
    n = _NSM.get(dev)
    if n is None:
        n = int(cupy().cuda.runtime.getDeviceProperties(dev)["multiProcessorCount"])
        _NSM[dev] = n
    return n


class _StreamHandle:
    """A raw CUDA stream handle under the CUDA stream protocol (``__cuda_stream__``
    returns ``(version 0, handle)``), for ``cupy.cuda.Stream.from_external``."""
    __slots__ = ("handle",)

    def __init__(self, handle):
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


def _wrap_stream(cp, handle):
    """A CuPy stream object over a raw handle: ``Stream.from_external`` (CuPy >= 14, which
    deprecates ``ExternalStream``) when it takes the protocol object and gives back the
    same handle, else ``ExternalStream`` (older CuPy), without its deprecation warning."""
    from_external = getattr(cp.cuda.Stream, "from_external", None)
    if from_external is not None:
        try:
            st = from_external(_StreamHandle(handle))
        except (TypeError, ValueError, AttributeError):
            st = None
        if st is not None and int(st.ptr) == handle:
            return st
    import warnings
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "ExternalStream is deprecated", DeprecationWarning)
        return cp.cuda.ExternalStream(handle)


def external_stream(handle):
    """A cached CuPy stream object of a raw stream handle (made once per handle)."""
    st = _EXT_STREAMS.get(handle)
    if st is None:
        st = _wrap_stream(cupy(), handle)
        _EXT_STREAMS[handle] = st
    return st
