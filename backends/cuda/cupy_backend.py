"""backend="cuda": CUDA C kernels compiled at first use by NVRTC through CuPy.

The kernels (``dyadic_kernels.cu`` and the headers it includes) are compiled
with ``--fmad=false`` and the shared exponential table of ``backends/include``;
every decision is integer arithmetic, so the results equal the reference bit
for bit.  CuPy appends ``-ftz=true`` to every NVRTC compile (cupy#9576), so
the kernels use no float32 arithmetic, comparison or f32 -> f64 conversion
(``dc_f2d`` widens by bits, so subnormal logits are not flushed).
Modules and scratch buffers are cached per device.  Launches go through
``cuLaunchKernel`` via ctypes (``launch.py``; DYADIC_CUDA_LAUNCH=cupy: CuPy).

Arrays: every Protocol method takes NumPy arrays (copied to the device and
back) or device arrays (torch CUDA tensors, CuPy arrays, anything with
``__cuda_array_interface__``), which are used in place, zero-copy, on CuPy's
current stream (``dyadic._device`` makes that the caller's stream).  Device
``x`` may be float32, float16 or bfloat16 (read in the kernel; exact).  Key
arrays may have 4- or 8-byte integer words and length B or 1.

Launch structure:
- top-k allocate / propose, top_k <= 32: ONE launch of ``pk_topk2``
  (``propose_fast.cuh``, grid (ceil(V / 4096), B)) or, without bias and from
  about B = 2 at V = 129280, ``pk_topk3`` (``propose_wide.cuh``, grid
  (ceil(V / 8192), B)); for bfloat16 / float16 logits without bias at every
  batch, ``pk_topk4`` / ``4w`` / ``4x`` (``propose_packed.cuh``: pk_topk3 on
  packed 16-bit keys, tiles of 8192 / 16384 / 32768 ids, the smallest whose
  grid fits one wave; DYADIC_CUDA_PK4); DYADIC_CUDA_PK=auto (default) / 2 / 3 / 0
  (``dc_topk``): per-thread coarse keys in registers, a bound from the
  warps' sorted maxima, survivors kept; the last block of the row (atomic
  counter after a release fence, ``dc_elect_last``) merges the candidates and runs the
  allocation and the draw in one warp (pk_topk4*: each tile writes its K best in rank
  order and the last block merges these sorted runs in a tree of warp merges).  top_k > 32: ``dc_topk``, grid
  (ceil(V / 2048), B), radix select / rank counting per tile, same merge
  pattern.  No block waits for another.
- dense allocate / propose: ``da2_max``, ``da2_sum``, ``da2_floor``, ``da2_mark``
  (``dense_alloc2.cuh`` / ``dense_alloc.cuh``, grid (tiles, B), exact integer atomics into a per-row
  state that the last block of ``da2_mark`` zeroes, a remainder-digit
  histogram and an exact boundary-bin resolution; DYADIC_CUDA_DENSE=mb: the
  multi-block dd_* kernels, =old: dc_dense), then ``dc_draw`` for propose.
- verify without greedy requests (check=False / True), small and middle batches
  (B x (k + 1) x V <= 32 x 6 x 129280, k + 1 <= 8; _vone_tile): ONE launch of
  ``dc_vone`` (verify_fused.cuh): block 0 of each request classifies the k
  tests as dc_vfused's blocks do and stores them, the other blocks run
  dc_vfused's tile pass for every row of the request (row totals, validity,
  residual chunk sums), and the last block validates as (1) below (every row
  in order, then every draft), walks the chain and draws as dc_vfused does.
  DYADIC_CUDA_VONE=0 / 1 / auto.
- verify otherwise, two launches: (1) partial sums per (row, tile) reading every target
  row once; the last block of each request (atomic counter) runs the totals,
  the status and the acceptance chain (``dy_accept``) in one warp.  (2) the
  single residual (or bonus) draw per request, spread over many blocks:
  per-tile 128-bit residual sums; the last block of the request draws X below
  the total, finds the tile by a prefix over the tile sums and the
  first-exceeding id inside that tile.  DYADIC_CUDA_VERIFY=split runs the
  same work as four launches.
- verify_lazy (check="lazy", no greedy rows), one launch by default: dc_vfused
  (verify_fused.cuh) classifies as (1) below, then sums the candidate rows'
  totals and their residual chunk sums in ONE pass (whether R_v > 0 is the
  same for every valid T except for a few ids, listed and added with the
  exact T by the last block), walks the chain and draws as (2) below.
  DYADIC_CUDA_LAZY=2 (and vocabularies above _VF_MAXV): two launches: (1) dc_vlazy2,
  grid (tiles, B): every block classifies the k acceptance tests of its
  request for every valid row total T (|T - 2^62| <= 2^52) at once:
  accepted for all, rejected for all, or ambiguous (reading only P(d_i) and
  c_i(d_i)); it then sums its tile of the candidate rows only (the ambiguous
  rows before the first sure rejection, plus that row or the bonus row); the
  last block of the request gets their exact T and validity and walks the
  chain exactly (dy_accept where ambiguous).  (2) dc_vres2: the residual (or
  bonus) row, 64-id chunk sums beside the tile sums, so the last block finds
  the token with one warp.  See verify_lazy.cuh for why the decision is not
  monotone in T (ambiguous ~ alpha (1 - alpha) per test, not 2^-9).

The scalar integer work (128-bit arithmetic, Philox, uniform_below, weights,
target fixed point, acceptance split, residual, status codes) is the shared
core ``backends/include/dyadic_core.h``, the same source as the CPU backend;
``dyadic_cuda.cuh`` holds only the parallel primitives.

Any batch size: a kernel with one row (request) per grid y index is launched on
grid (x, y, z) with the rows over y and z (_rgrid; dc_grid_row in the kernels: both
dimensions are limited to 65535), and the blocks past the last row end at once.

The kernels check every id they address memory with (draft ids, sparse q ids; a
sparse draw row) and fail that row closed with its status (dyadic._device's docstring
gives the order); the host refuses the shapes they would index beyond (_verify_shapes,
key arrays of a length other than 1 or B).

Scratch buffers are shared by the calls on one device: do not run two dyadic
calls concurrently on different streams of the same device.
"""

import os
import sys

import numpy as np

from ..._backend import Backend

_HERE = os.path.dirname(os.path.abspath(__file__))
_TILE = 2048
_VTILE = 4096
_RTILE = 4096
_MAX_K_VERIFY = 63
_KSMALL = 64  # top_k <= 64: rank-counting top-K (DC_KSMALL); larger: radix select
_FAST_MAX_BATCH = 16  # rank-counting top-K up to this batch, radix select above
# DYADIC_CUDA_TOPK=radix / =rank forces one top-k path for every batch (A/B runs)
_TOPK_MODE = os.environ.get("DYADIC_CUDA_TOPK", "")
# DYADIC_CUDA_TOPK_STAGE=1: in the rank-counting path the last block of a row stages the
# candidates in shared memory (one batch of loads) and keeps the K support entries in shared
# memory.  Default on (the faster of the two on the H200, docs/performance.md; the same
# results); DYADIC_CUDA_TOPK_STAGE=0 turns it off.
_TOPK_STAGE = os.environ.get("DYADIC_CUDA_TOPK_STAGE", "1") == "1"
# DYADIC_CUDA_VERIFY=old: the 4096-tile two-launch verify; =split: the same in four launches
# (A/B runs).  Default: dc_v1 + dc_v2 (runtime tiles, 16-byte loads, one reduction per tile).
_VERIFY_MODE = os.environ.get("DYADIC_CUDA_VERIFY", "")
# Dense allocate / propose.  Default "da2": the da2_* kernels (dense_alloc2.cuh: four launches,
# no [B, V] scratch, pipelined 16-byte loads, evict-first counts stores): the fastest dense
# path on the H200 (docs/performance.md).  DYADIC_CUDA_DENSE=mb: the multi-block dd_*
# kernels; =old: dc_dense, one block per row.
_DENSE_MODE = os.environ.get("DYADIC_CUDA_DENSE", "da2")
# verify_lazy in two launches: dc_vlazy2 + dc_vres2 (verify_lazy2.cuh: 64-id chunk sums, a
# one-warp search in the last block).
# v2 tuning (A/B runs): stage-1 tile cap (a multiple of 1024) and the largest batch with the
# stage-1 prefetch (row 0's first tile words before the classification, L2 prefetch of q).
_LAZY_VT = int(os.environ.get("DYADIC_CUDA_LAZY_VT", "16384"))
_LAZY_PRE = int(os.environ.get("DYADIC_CUDA_LAZY_PRE", "16"))
# DYADIC_CUDA_LAZY=fused (default): dc_vfused, one launch (verify_fused.cuh: the residual
# row's total and its chunk sums in one pass, the selection decided for every valid total,
# undecided ids listed and added with the exact total by the last block); =2: dc_vlazy2 +
# dc_vres2.  The fused kernel takes vocabularies up to _VF_MAXV (<= 128 tiles of <= 32768 ids).
# On the H200 the fused kernel is the faster of the two from B = 4 on and close at B = 1
# (docs/performance.md).
_LAZY_MODE = os.environ.get("DYADIC_CUDA_LAZY", "fused")
# Tiles: about _VF_BPS blocks per SM over the whole grid (one wave at the kernel's register
# cap of 3 blocks per SM), multiples of 1024 ids, at most _VF_VTCAP (<= 32768: VF_MAXCT).
# The cap 16384: on the H200 the fastest of 8192 / 16384 / 32768 at B = 64, the three about
# equal at smaller batches; 6 blocks per SM is slower, and a tile count rounded down to fit
# one wave or an L2 prefetch of each row two loop iterations ahead gains nothing
# (docs/performance.md).
_VF_VTCAP = int(os.environ.get("DYADIC_CUDA_VF_VT", "16384"))
# dc_vfused (80 registers, 3 blocks per SM) while the grid fits one wave at 3 blocks per SM,
# else dc_vfused_r64 (the same code at 64 registers, 4 blocks per SM, some spills): on the
# H200 each is the faster of the two where it is taken (docs/performance.md).
# DYADIC_CUDA_VF_KERNEL forces one.
_VF_KERNEL = os.environ.get("DYADIC_CUDA_VF_KERNEL", "")
# at least 2048 ids per tile (B = 1 at V = 129280: 64 tiles instead of 127, fewer tile
# records for the last block: faster on the H200; B = 4 already has 64 tiles).
_VF_MINT = int(os.environ.get("DYADIC_CUDA_VF_MINT", "2048"))
_VF_BPS = float(os.environ.get("DYADIC_CUDA_VF_BPS", "3"))
# verify (check=False / True) without greedy requests in one launch: dc_vone (verify_fused.cuh:
# dc_vfused's tiles for every row, the tests in a block of their own, dc_v1's validation in
# the last block) in place of dc_v1 + dc_v2, for k + 1 <= 8 and V <= _VF_MAXV: with the
# largest tiles that fit its grid of B x (1 + (k + 1) x tiles) blocks in one wave at 3
# blocks per SM, if they have at most _VONE_VTMAX ids, else with dc_vfused's tiles while
# B x (k + 1) x V <= _VONE_MAXELEM (dc_vone reads every q row too: at B = 64 the two
# launches are faster).  _VONE_MAXELEM is B = 32 at k = 5, V = 129280: up to there dc_vone
# is the faster on the H200 (docs/performance.md).
# DYADIC_CUDA_VONE=0 never takes it, =1 whenever k + 1 <= 8 (dc_vfused's tiles; for tests).
_VONE_MODE = os.environ.get("DYADIC_CUDA_VONE", "auto")
_VONE_MAXK1 = 8  # VA_MAXK1
_VONE_VTMAX = int(os.environ.get("DYADIC_CUDA_VONE_VT", "8192"))
_VONE_MAXELEM = int(os.environ.get("DYADIC_CUDA_VONE_MAXELEM", str(32 * 6 * 129280)))
_VF_MAXV = 128 * 32768
# entries of a row's list of ids whose selection needs the exact total (more: their 64-id
# chunks are summed again in full); DYADIC_CUDA_VF_ACAP=0 sends every such id that way.
_VF_ACAP = int(os.environ.get("DYADIC_CUDA_VF_ACAP", "2048"))
# DYADIC_CUDA_DENSE_RECIP=1: dd_floor divides by the row reciprocal (exact, corrected);
# NOT YET GPU-TESTED, off by default.
_DENSE_RECIP = os.environ.get("DYADIC_CUDA_DENSE_RECIP", "0") == "1"
# top_k <= _PK_KMAX: the one-launch pk_topk* kernels, faster than dc_topk on the H200
# (docs/performance.md); larger top_k: dc_topk.
_PK_KMAX = 32
_PK_NT = 512
_PK_EPT = 8  # PK_EPT of propose_fast.cuh: ids per thread; the tile and R * K are <= _PK_NT * _PK_EPT
# "0": dc_topk, "2": pk_topk2, "3": pk_topk3 (propose_wide.cuh: tiles of 8192
# ids, 16 per thread; only without bias, else pk_topk2), "auto" (default): pk_topk2 where
# its grid has at most _PK_SMALL blocks (B x ceil(V / 4096): B = 1 at V = 129280), else
# pk_topk3: on the H200 each is the faster of the two where auto takes it; tiles of 16384
# (32 ids per thread, one block per SM) and two or four sub-tiles of 8192 with one running
# bound are slower than pk_topk3's tiles (docs/performance.md).
_PK_MODE = os.environ.get("DYADIC_CUDA_PK", "auto")
# pk_topk4 / pk_topk4w / pk_topk4x (propose_packed.cuh): pk_topk3's tile phase on packed
# 16-bit keys, tiles of 8192 / 16384 / 32768 ids, taken in pk_topk3's place for bfloat16 /
# float16 logits without bias on 16-byte loads (and for those, auto routes every batch to
# the wide kernels).  DYADIC_CUDA_PK4: "auto" (default) the smallest tile whose grid fits
# one wave of two blocks per SM, else the largest; 1 / 2 / 3 force one; 0 pk_topk3.
# On the H200 the auto choice is faster than pk_topk3 and, at B = 1, pk_topk2 at every
# batch (docs/performance.md).
_PK4 = os.environ.get("DYADIC_CUDA_PK4", "auto")
_PK4 = -1 if _PK4 == "auto" else int(_PK4)
_PK4_CHUNKS = (8192, 16384, 32768)  # pk_topk4 / 4w / 4x: PK_NT * 16 / 32 / 64 ids
_PK_SMALL = 32
_PK_CAP = 128  # PK_CAP of propose_fast.cuh (pk_topk2's candidate slots per tile)
_PK3_EPT = 16  # PW_EPT of propose_wide.cuh: pk_topk3's tile is at most _PK_NT * _PK3_EPT ids
_PK3_CHUNK = int(os.environ.get("DYADIC_CUDA_PK3_CHUNK", "0"))  # A/B: force pk_topk3's tile
_DD_RS = 2064  # u64 words of per-row state (DD_RS in dyadic_kernels.cu)
_DD_PASSES = 5  # dd_pass launches: 12-bit digits, <= 6 per 64-bit remainder, first in dd_floor

_MODULES = {}
_FUNCS = {}
_SCRATCH = {}
_STAGE_ONLY = 0  # benchmark only: 1 / 2 launches just that verify stage (results invalid)
_PLANS = {}  # (kind, device, shape...) -> launch plan (tiles, scratch, kernels)


_CUPY = []  # [cupy] once imported (a function-level import costs ~0.5 us per call)


def _cupy():
    global _device_id
    if not _CUPY:
        import cupy
        _CUPY.append(cupy)
        # the hot paths call _device_id() once or twice per call: from now on it is
        # cupy.cuda.runtime.getDevice itself (the same result, no Python frame)
        _device_id = cupy.cuda.runtime.getDevice
    return _CUPY[0]


def _include_dir():
    """dyadic.backends.INCLUDE_DIR: the shared integer core (dyadic_core.h)."""
    try:
        from .. import INCLUDE_DIR
        return INCLUDE_DIR
    except ImportError:  # loaded outside the package
        return os.path.join(os.path.dirname(_HERE), "include")


def _source():
    with open(os.path.join(_HERE, "dyadic_kernels.cu")) as f:
        return f.read()


def _device_id():
    """The current CUDA device (replaced by cupy.cuda.runtime.getDevice in _cupy())."""
    return _cupy().cuda.runtime.getDevice()


def module(dev=None):
    """The compiled RawModule of the current device (compiled once per device)."""
    cp = _cupy()
    if dev is None:
        dev = _device_id()
    mod = _MODULES.get(dev)
    if mod is None:
        mod = cp.RawModule(code=_source(), options=(
            "--fmad=false", "--ftz=false", "--prec-div=true", "--prec-sqrt=true", "--std=c++17",
            "-I" + _include_dir(), "-I" + _HERE)
            + (("-lineinfo",) if os.environ.get("DYADIC_CUDA_LINEINFO") == "1" else ())
            + (("-DDC_PROF",) if os.environ.get("DYADIC_CUDA_PROF") == "1" else ()))
        mod.compile()
        _MODULES[dev] = mod
    return mod


# Launch path: backends/cuda/launch.py calls the driver's cuLaunchKernel through ctypes
# with the CUfunction CuPy loaded and 8-byte argument slots reused per kernel (CuPy's
# Function.__call__ built a CPointer object for each of the ~35 arguments of a launch).
# The stream is CuPy's current stream (dyadic._device makes it the caller's torch stream).
# DYADIC_CUDA_LAUNCH=cupy, or a libcuda that cannot be loaded: CuPy's launch.
# ``_kernel(name)(grid, block, args)`` takes np.int32 / np.uint64 / cupy.ndarray args.
# The launchers of the repeat-call fast path (propose_launcher, allocate_launcher,
# draw_launcher, verify_launcher) hold launch.Bound objects instead: the fixed words are
# packed once per slot set and a call writes only its per-call words (launch.Var), with
# the argument order from the same functions as the full path (_pk_args, _vone_args, ...).
try:
    from . import launch as _launch
except ImportError:  # loaded outside the package
    import importlib.util as _ilu
    _spec_l = _ilu.spec_from_file_location("dyadic_cuda_launch", os.path.join(_HERE, "launch.py"))
    _launch = _ilu.module_from_spec(_spec_l)
    _spec_l.loader.exec_module(_launch)

_LAUNCH_READY = []


_GET_STREAM = []  # [cupy.cuda.get_current_stream]


def _current_stream_ptr():
    """The raw handle of CuPy's current stream (the launch stream when none is given)."""
    if not _GET_STREAM:
        _GET_STREAM.append(_cupy().cuda.get_current_stream)
    return _GET_STREAM[0]().ptr


def device_id():
    """The current CUDA device index (CuPy's view): dyadic._gpu_arrays enters torch's
    device only when it differs."""
    return _device_id()


def current_stream_ptr():
    """The raw handle of CuPy's current stream: dyadic._gpu_arrays makes torch's
    stream current only when it differs."""
    return _current_stream_ptr()


def _make_context_current():
    rt = _cupy().cuda.runtime
    rt.setDevice(rt.getDevice())  # CUDA 12: initialises and binds the primary context


def _launch_setup():
    if not _LAUNCH_READY:
        cp = _cupy()
        _launch.configure(ndarray=cp.ndarray, current_stream=_current_stream_ptr,
                          on_invalid_context=_make_context_current,
                          wrap_stream=external_stream)
        _launch.load()
        _LAUNCH_READY.append(True)


def launch_mode():
    """How kernels are launched in this process: 'driver (...)' or 'cupy (why)'."""
    _launch_setup()
    return _launch.describe()


def _kernel(name):
    """The kernel's launcher, cached per device (no lookups per call)."""
    dev = _device_id()
    fn = _FUNCS.get((dev, name))
    if fn is None:
        _launch_setup()
        fn = _launch.Kernel(module(dev).get_function(name), name)
        _FUNCS[(dev, name)] = fn
    return fn


def scratch(name, nbytes, zero=False):
    """A cached device buffer of at least ``nbytes`` (grown, never shrunk)."""
    cp = _cupy()
    key = (_device_id(), name)
    buf = _SCRATCH.get(key)
    if buf is None or buf.nbytes < nbytes:
        buf = cp.zeros(max(int(nbytes), 8) // 8 + 1, dtype=cp.uint64)
        _SCRATCH[key] = buf
    return buf


_NSM = {}


def _num_sms():
    dev = _device_id()
    n = _NSM.get(dev)
    if n is None:
        n = int(_cupy().cuda.runtime.getDeviceProperties(dev)["multiProcessorCount"])
        _NSM[dev] = n
    return n


def _vf_kernel(nt, batch, nsm):
    """The lazy verify kernel for a grid of nt x batch blocks on nsm SMs (_VF_KERNEL)."""
    return _VF_KERNEL or ("dc_vfused_r64" if nt * batch > 3 * nsm else "dc_vfused")


def _vf_tile(v, batch, nsm):
    """dc_vfused's tile length: about _VF_BPS blocks per SM, at least _VF_MINT ids, at most
    _VF_VTCAP, and at most VF_MAXT = 128 tiles per row."""
    return max(_VF_MINT, _tile_for(v, batch, nsm, _VF_VTCAP, _VF_BPS),
               -(-v // (128 * 1024)) * 1024)


def _vone_tile(v, batch, k1, nsm):
    """dc_vone's tile length, or 0 where dc_v1 + dc_v2 are taken (_VONE_MODE).  auto: the
    most tiles per row, of at least _VF_MINT ids, with 1 + (k + 1) x tiles blocks per
    request within one wave at 3 blocks per SM, if that makes tiles of at most
    _VONE_VTMAX ids; else dc_vfused's tiles while B x (k + 1) x V <= _VONE_MAXELEM."""
    if k1 > _VONE_MAXK1 or v > _VF_MAXV or _VONE_MODE == "0":
        return 0
    if _VONE_MODE == "1":
        return _vf_tile(v, batch, nsm)
    per_row = (3 * nsm // batch - 1) // k1
    if per_row >= 1:
        nt = min(-(-v // _VF_MINT), per_row, 128)
        vt = -(-(-(-v // nt)) // 1024) * 1024
        if vt <= _VONE_VTMAX:
            return vt
    return _vf_tile(v, batch, nsm) if batch * k1 * v <= _VONE_MAXELEM else 0


_GRID_YZ = 65535  # the largest grid y and z


def _rgrid(nx, rows):
    """The grid (nx, y, z) of a kernel with one row (request) per grid y index and nx
    blocks per row: rows over y and z (each at most 65535; dc_grid_row in the kernel),
    z = ceil(rows / 65535), y = ceil(rows / z): y * z - rows < z blocks of each x lie past
    the last row and end at once (the kernel's row count argument)."""
    if rows <= _GRID_YZ:
        return (nx, rows, 1)
    z = -(-rows // _GRID_YZ)
    return (nx, -(-rows // z), z)


def _tile_for(v, rows, nsm, cap, per_sm=4):
    """Tile length (a multiple of 1024, at most cap) giving >= ~per_sm blocks per SM."""
    want = max(1, int(-(-per_sm * nsm // max(rows, 1))))
    t = -(-v // want)
    t = -(-t // 1024) * 1024
    return max(1024, min(cap, t))


_EXT_STREAMS = {}


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
        st = _wrap_stream(_cupy(), handle)
        _EXT_STREAMS[handle] = st
    return st


_TENSOR = []  # [torch.Tensor] once torch has been imported by someone
_TT = type("_NoTensor", (), {})  # torch.Tensor once seen: exact-type checks on the hot path


def _is_torch(a):
    global _TT
    if not _TENSOR:
        torch = sys.modules.get("torch")
        if torch is None:
            return False
        _TENSOR.append(torch.Tensor)
        _TT = torch.Tensor
    return isinstance(a, _TENSOR[0])


_DT_CODES = {"float32": 0, "float16": 1, "bfloat16": 2}
_DT_NAMES = {}  # torch dtype -> bare name
_X_CODES = {}  # torch dtype -> np.int32 code (supported float dtypes only)


def dtype_name(a):
    if type(a) is _TT or _is_torch(a):
        dt = a.dtype
        name = _DT_NAMES.get(dt)
        if name is None:
            name = str(dt).replace("torch.", "")
            _DT_NAMES[dt] = name
        return name
    if hasattr(a, "__cuda_array_interface__") and not hasattr(a, "dtype"):
        return np.dtype(a.__cuda_array_interface__["typestr"]).name
    return np.dtype(a.dtype).name


def _ptr(a):
    if type(a) is _TT:
        return a.data_ptr()
    if a is None:
        return 0
    if _is_torch(a):
        return a.data_ptr()
    cp = _cupy()
    if isinstance(a, cp.ndarray):
        return a.data.ptr
    return a.__cuda_array_interface__["data"][0]


_NULL = np.uint64(0)
_U64 = np.uint64
_NO_KEYS = [_NULL] * 4  # key pointers of allocate (no draw)


class _Int32s(dict):
    """``_I32[v]``: np.int32(v), made once per value (constructing an np.int32 costs
    ~0.3-0.7 us, a dict lookup ~30 ns; a launch has ~10 such arguments).  Bounded."""

    def __missing__(self, v):
        if len(self) > 4096:
            self.clear()
        i = self[v] = np.int32(v)
        return i


_I32 = _Int32s()


def _launch_plan(kernel, grid, block, buffers):
    """What the hot paths keep per launch plan: the kernel, its grid and block as
    3-tuples (Kernel.launch), the scratch ``buffers`` (kept here so that they stay
    allocated: ``scratch`` may replace a cached buffer by a larger one) and their device
    pointers as ints (no cupy.ndarray conversion per launch)."""
    return (kernel, (*grid, 1, 1)[:3], (*block, 1, 1)[:3], tuple(buffers),
            tuple(int(b.data.ptr) for b in buffers))


class _Call:
    """Moves NumPy arguments to the device and results back; device arrays pass through.

    ``call(a)`` is the device pointer of ``a`` as a Python int (a kernel argument: 8
    bytes in both launch paths; no NumPy scalar per argument), ``_NULL`` for None.
    No __init__ (made per backend call): the lists are made at the first upload."""

    back = keep = ()  # [(device copy, NumPy output)], [device copies] once something moved

    def __call__(self, a, out=False):
        if type(a) is _TT:  # the hot path: a pointer, nothing else
            return a.data_ptr()
        if a is None:
            return _NULL
        if _is_torch(a):
            return a.data_ptr()
        if isinstance(a, np.ndarray):
            cp = _cupy()
            d = cp.asarray(a)
            if not self.keep:
                self.keep, self.back = [], []
            self.keep.append(d)
            if out:
                self.back.append((d, a))
            return d.data.ptr
        return int(_ptr(a))

    def many(self, arrays, out=False):
        """``tuple(self(a, out) for a in arrays)``; torch tensors and None without a call
        of ``self`` each (the hot path)."""
        tt = _TT
        for a in arrays:
            if type(a) is not tt and a is not None:
                return tuple([self(a, out) for a in arrays])
        return tuple([_NULL if a is None else a.data_ptr() for a in arrays])

    def finish(self):
        if self.back:
            for d, a in self.back:
                a[...] = d.get()


def _count(a):
    """The number of entries of a device (or host) array."""
    shape = getattr(a, "shape", None)
    if shape is None:
        shape = a.__cuda_array_interface__["shape"]
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _itemsize(a):
    if _is_torch(a):
        return a.element_size()
    if hasattr(a, "itemsize"):
        return int(a.itemsize)
    return np.dtype(a.__cuda_array_interface__["typestr"]).itemsize


def _keys(call, seed, generation, round_, position, batch):
    """Pointers and the format word of the four key arrays."""
    tt = _TT
    fmt, j = 0, 0
    for a in (seed, generation, round_, position):  # hot path: torch tensors (1-D)
        if type(a) is not tt:
            break
        size = a.element_size()
        if size == 8:
            f = 1
        elif size == 4:
            f = 0
        else:
            break
        n = a.numel()
        if n != batch:  # length 1: broadcast; any other length: the checks below
            if n != 1:
                break
            f |= 2
        fmt |= f << j
        j += 2
    else:
        return list(map(tt.data_ptr, (seed, generation, round_, position))), fmt
    host = [isinstance(a, np.ndarray) for a in (seed, generation, round_, position)]
    if all(host):
        packed = np.empty((4, batch), dtype=np.uint64)
        for j, a in enumerate((seed, generation, round_, position)):
            packed[j] = a  # cast and broadcast by the assignment (one NumPy call per
            # field; astype and broadcast_to are much slower)
        base = call(packed)
        ptrs = [np.uint64(int(base) + 8 * batch * j) for j in range(4)]
        return ptrs, 0b01010101
    ptrs, fmt = [], 0
    for j, a in enumerate((seed, generation, round_, position)):
        n = a.numel() if _is_torch(a) else _count(a)
        if n not in (1, batch):  # the kernels read entry `row` (or 0 when broadcast)
            raise ValueError(f"keys: {('seed', 'generation', 'round', 'position')[j]} has {n} "
                             f"entries; expected 1 or the batch {batch}")
        if _is_torch(a):  # hot path
            size = a.element_size()
            f = (1 if size == 8 else 0) | (2 if n == 1 and batch != 1 else 0)
            if size in (4, 8):
                fmt |= f << (2 * j)
                ptrs.append(np.uint64(a.data_ptr()))
                continue
        size = _itemsize(a)
        if size not in (4, 8):
            raise TypeError(f"keys: device key arrays need 4- or 8-byte integers, got {size} bytes")
        f = (1 if size == 8 else 0) | (2 if n == 1 and batch != 1 else 0)
        fmt |= f << (2 * j)
        ptrs.append(call(a))
    return ptrs, fmt


def _x_code(x):
    if type(x) is _TT:
        code = _X_CODES.get(x.dtype)
        if code is not None:
            return code
    name = dtype_name(x)
    if name not in _DT_CODES:
        raise TypeError(f"x: dtype {name} not supported; expected float32, float16 or bfloat16")
    if type(x) is _TT:
        _X_CODES[x.dtype] = np.int32(_DT_CODES[name])
    return np.int32(_DT_CODES[name])


def _verify_setup(target, q_counts, seed, generation, round, position, ins, outs):
    """What both verify paths start with: (batch, k, V, q width, the _Call, key pointers,
    key format, the pointers of ``ins``, the pointers of ``outs``); drafts deeper than the
    kernels take are refused here, and so is every shape the kernels would index beyond
    (_verify_shapes: ``ins`` = target, draft, q counts, q ids[, greedy], ``outs`` =
    accepted, tokens, status)."""
    batch, k1, v = target.shape  # Python ints (torch.Size, NumPy and CuPy shapes)
    k = k1 - 1
    if k > _MAX_K_VERIFY:
        raise ValueError(f"draft: backend 'cuda' verifies at most {_MAX_K_VERIFY} draft "
                         f"tokens per request, got k={k}")
    _verify_shapes(batch, k, v, ins, outs)
    call = _Call()
    w = 0 if q_counts is None else int(q_counts.shape[-1])
    kptrs, kfmt = _keys(call, seed, generation, round, position, batch)
    return batch, k, v, w, call, kptrs, kfmt, call.many(ins), call.many(outs, True)


def _shape_of(a):
    if a is None:
        return None
    sh = getattr(a, "shape", None)
    return tuple(a.__cuda_array_interface__["shape"]) if sh is None else tuple(sh)


def _verify_shapes(batch, k, v, ins, outs):
    """verify's structural rules on the arrays the kernels index (ValueError naming the
    array): draft [B, k]; q counts [B, k, W] with ids of the same shape, or a dense row
    of V counts (W = V: the kernels read a dense row at ids < V only); greedy flags [B];
    accepted [B], tokens [B, k+1], status [B].  The kernels' own checks cover the
    values (draft ids, sparse q rows)."""
    qc, qi = ins[2], ins[3]
    for name, a, shape in (("draft", ins[1], (batch, k)), ("accepted", outs[0], (batch,)),
                           ("tokens", outs[1], (batch, k + 1)), ("status", outs[2], (batch,)),
                           ("greedy", ins[4] if len(ins) > 4 else None, (batch,))):
        if (a is not None or name != "greedy") and _shape_of(a) != shape:
            raise ValueError(f"{name}: shape {_shape_of(a)} must be {shape}")
    if qc is None:
        if qi is not None:
            raise ValueError("q_ids: given without q_counts")
        return
    sc = _shape_of(qc)
    if len(sc) != 3 or sc[:2] != (batch, k):
        raise ValueError(f"q_counts: shape {sc} must be (B, k, W) = ({batch}, {k}, W)")
    if qi is None:
        if sc[2] != v:
            raise ValueError(f"q_counts: a dense q row has {sc[2]} counts; it must have the "
                             f"target's vocabulary V = {v}")
    elif _shape_of(qi) != sc:
        raise ValueError(f"q_ids: shape {_shape_of(qi)} must be q_counts' {sc}")


def _pk_route(top_k, bias_ok, batch, v, packed_ok=False):
    """Which one-launch top-k kernel takes an allocate / propose: True pk_topk3 (or
    pk_topk4*, see _pk_run), False pk_topk2, None neither (top_k None or > PK_KMAX,
    DYADIC_CUDA_PK=0, or too many tiles).  ``bias_ok``: no bias, or weights (pk_topk3
    reads no bias of logits); ``packed_ok``: 16-bit logits without bias (auto then takes
    the wide kernels at every batch)."""
    if not top_k or int(top_k) > _PK_KMAX:
        return None
    pk_tiles = -(-v // (_PK_NT * _PK_EPT))
    if (bias_ok and (_PK_MODE == "3" or (_PK_MODE == "auto" and (
            batch * pk_tiles > _PK_SMALL or (packed_ok and _PK4))))
            and -(-v // (_PK_NT * _PK3_EPT)) * _PK_CAP <= _PK_NT * _PK_EPT):
        return True
    if _PK_MODE != "0" and pk_tiles * _PK_CAP <= _PK_NT * _PK_EPT:
        return False
    return None


def _pk_vec(wide, x_ptr, code, v):
    """pk_topk3 / pk_topk4*'s 16-byte loads: x's pointer 16-byte aligned and V a multiple
    of 8 ids (4 for float32, x code 0); checked per call, the plan is per shape."""
    return wide and x_ptr % 16 == 0 and v % (4 if code == 0 else 8) == 0


def _pk_variant(plan, common, vec):
    """(r32, chunk32, kernel, grid) of a pk launch: pk_topk4 / 4w / 4x (the plan's packed
    variants, [0] its auto choice) for 16-bit logits (x code 1 / 2) without bias on 16-byte
    loads, else the plan's pk_topk2 / pk_topk3."""
    r32, chunk32, fn, grid, _, _, _, _, packed = plan
    if vec and _PK4 and common[1] != 0 and common[2] is _NULL and common[6]:
        return packed[max(_PK4, 0)]
    return r32, chunk32, fn, grid


def _pk_args(plan, variant, common, k, policy, do_draw, kptrs, kfmt32, outs, vec32):
    """A pk launch's arguments: ``common``, the variant's tile words, the key pointers and
    format, the plan's scratch, ``outs``, then ``vec32`` (None: pk_topk2, no such word),
    then the row count (the plan's)."""
    args = (common + (_I32[k], variant[0], variant[1], _I32[policy], _I32[do_draw], *kptrs,
                      kfmt32) + plan[6] + tuple(outs))
    return (args if vec32 is None else args + (vec32,)) + (plan[7],)


def _pk_run(plan, wide, common, k, policy, do_draw, kptrs, kfmt, outs):
    """One launch of pk_topk2 / pk_topk3 / pk_topk4* (plan: CupyBackend._pk_plan) with the
    arguments ``common`` (x, its dtype code, bias, its code and rows, temperature, logits,
    greedy_ok, V), the key pointers and format, and ``outs`` (tokens, counts, ids, status
    pointers)."""
    vec = _pk_vec(wide, common[0], common[1], common[8])
    variant = _pk_variant(plan, common, vec)
    variant[2].launch(variant[3], plan[4], _pk_args(plan, variant, common, k, policy, do_draw,
                                                    kptrs, _I32[kfmt], outs,
                                                    _I32[int(vec)] if wide else None))


# Per-call words of the fast path's launches (launch.Bound): the arguments that change from
# call to call of one cached configuration (pointers of the inputs, outputs and key fields,
# the key format, the 16-byte-load flags); everything else is packed once per Bound.
_VAR = _launch.Var
_VX, _VTEMP = _VAR("x"), _VAR("temp")
_VKEYS = tuple(_VAR("key%d" % i) for i in range(4))
_VKFMT = _VAR("kfmt", np.int32)
_VOUTS = tuple(_VAR("out%d" % i) for i in range(4))
_VVEC, _VVECQ = _VAR("vec", np.int32), _VAR("vec_q", np.int32)


def _pk_fast(plan, wide, head, tail, k, policy, do_draw, code, v):
    """``run(x_ptr, temp_ptr, kptrs, kfmt, outs)``: _pk_run's launch for x without bias
    (``head`` / ``tail``: _common_parts), through launch.Bound (one per variant: without
    and with 16-byte loads); the same kernel, grid and words."""
    common = (_VX, *head, _VTEMP, *tail)

    def bound(vec):
        var = _pk_variant(plan, common, vec)
        return _launch.Bound(var[2], var[3], plan[4], _pk_args(
            plan, var, common, k, policy, do_draw, _VKEYS, _VKFMT, _VOUTS,
            _VVEC if wide else None))

    vec_ok = _pk_vec(wide, 0, code, v)  # with an aligned pointer
    plain = bound(False)
    aligned = bound(True) if vec_ok else plain
    p = plain.pos
    ix, it, kf, iv = p["x"], p["temp"], p["kfmt"], p.get("vec")
    k0, k1, k2, k3 = (p[a.name] for a in _VKEYS)
    o0, o1, o2, o3 = (p[a.name] for a in _VOUTS)

    def run(x_ptr, temp_ptr, kptrs, kfmt, outs):
        vec = vec_ok and x_ptr % 16 == 0
        b = aligned if vec else plain
        s = b.take()
        w = s.w
        w[ix] = x_ptr
        w[it] = temp_ptr
        w[k0], w[k1], w[k2], w[k3] = kptrs
        w[kf] = kfmt
        w[o0], w[o1], w[o2], w[o3] = outs
        if iv is not None:
            w[iv] = vec
        b.launch(s)

    return run


def _common_parts(code, logits, greedy_ok, v):
    """The arguments _alloc's launches share around x's and the temperature's pointers,
    for x of dtype ``code`` without bias: ``(x, *head, temperature, *tail)`` is _alloc's
    ``common`` (x, its code, bias, its code and rows, temperature, logits, greedy_ok, V)."""
    return ((code, _NULL, _I32[0], _I32[0]),
            (_I32[int(bool(logits))], _I32[int(bool(greedy_ok))], _I32[v]))


def _da_vec(code, x_ptr, v, cnt):
    """_dense_da's (vec, cvec) flags: 16-byte loads of float32 x (code 0, V % 4 == 0, x
    16-byte aligned) and 16-byte stores of the counts (V % 4 == 0, counts aligned)."""
    return code == 0 and v % 4 == 0 and x_ptr % 16 == 0, v % 4 == 0 and cnt % 16 == 0


def _da_launches(plan, common, policy, vec32, cnt, cvec32, st):
    """The (kernel, arguments) of da2_max, da2_sum, da2_floor, da2_mark (plan:
    CupyBackend._da_plan; ``common`` as _pk_run's)."""
    dt, nti, state, cand_r, cand_i, fine, kmax, ksum, kfloor, kmark, kdraw, batch = plan
    base = common + (dt, vec32)
    pol, rows = _I32[policy], _I32[batch]
    return ((kmax, base + (state, rows)), (ksum, base + (state, rows)),
            (kfloor, base + (pol, fine, state, rows)),
            (kmark, base + (pol, state, cand_r, cand_i, cnt, cvec32, st, rows)))


def _draw_args(counts, ids, w32, kptrs, kfmt32, tokens):
    """dc_draw's arguments (counts, ids: pointers, ids null for dense rows)."""
    return (counts, ids, w32, *kptrs, kfmt32, tokens)


def _da_run(plan, common, v, policy, do_draw, kptrs, kfmt, cnt, st, tk):
    """The launches of _dense_da (plan: CupyBackend._da_plan) with the arguments ``common``
    (as _pk_run's), the key pointers and format, and the counts / status / tokens pointers
    (tokens _NULL without a draw)."""
    vec, cvec = _da_vec(int(common[1]), int(common[0]), v, int(cnt))
    grid, blk = _rgrid(plan[1], plan[11]), (256,)
    for kern, args in _da_launches(plan, common, policy, _I32[vec], cnt, _I32[cvec], st):
        kern(grid, blk, args)
    if do_draw:
        plan[10]((plan[11],), (256,), _draw_args(cnt, _NULL, common[8], kptrs, _I32[kfmt], tk))


def _da_fast(plan, head, tail, policy, code, v):
    """``run(x_ptr, temp_ptr, counts, ids, status)``: _da_run's four launches for x without
    bias and no draw (``head`` / ``tail``: _common_parts), through launch.Bound."""
    grid = _rgrid(plan[1], plan[11])
    bounds = [_launch.Bound(kern, grid, (256,), args) for kern, args in _da_launches(
        plan, (_VX, *head, _VTEMP, *tail), policy, _VVEC, _VCNT, _VCVEC, _VST)]
    ix, it, iv = (bounds[0].pos[n] for n in ("x", "temp", "vec"))  # the same in all four
    pm = bounds[3].pos
    ic, icv, ist = pm["counts"], pm["cvec"], pm["st"]
    mark = bounds[3]

    def run(x_ptr, temp_ptr, counts, ids, status):
        vec, cvec = _da_vec(code, x_ptr, v, counts)
        for b in bounds:
            s = b.take()
            w = s.w
            w[ix] = x_ptr
            w[it] = temp_ptr
            w[iv] = vec
            if b is mark:  # da2_mark writes the counts and the status
                w[ic] = counts
                w[icv] = cvec
                w[ist] = status
            b.launch(s)

    return run


def _v12_args(plan, t, d, qc, qi, w, g, batch, k, v, kptrs, kfmt32, a, tk, st, vec_t32,
              vec_q32):
    """dc_v1's and dc_v2's arguments (plan: CupyBackend._v12_plan; pointers)."""
    (nt1, vt, nrt2, rt, k1fn, grid1, block, _, ptrs, k2fn, grid2) = plan
    plo, phi, pmax, pbad, res_row, res_t, rpart, vcnt, rcnt = ptrs
    v32, w32, k32 = _I32[v], _I32[w], _I32[k]
    return ((t, d, qc, qi, w32, g, _I32[batch], k32, v32, nt1, plo, phi, pmax, pbad, *kptrs,
             kfmt32, res_row, res_t, a, tk, st, vcnt, vt, vec_t32),
            (t, d, qc, qi, w32, k32, v32, nrt2, *kptrs, kfmt32, res_row, res_t, rpart, a, tk,
             st, rcnt, rt, vec_t32, vec_q32, _I32[batch]))


def _v12_vec(t, qc, qi, v):
    """dc_v1 / dc_v2's (vec_t, vec_q): 16-byte loads of the target rows (V % 4 == 0, target
    16-byte aligned) and of dense q rows (qc aligned, no ids); pointers, null 0."""
    return v % 4 == 0 and t % 16 == 0, bool(qc) and not qi and v % 4 == 0 and qc % 16 == 0


def _v12_run(plan, t, d, qc, qi, w, g, batch, k, v, kptrs, kfmt, a, tk, st):
    """dc_v1 then dc_v2 (plan: CupyBackend._v12_plan); every array argument a pointer."""
    vec_t, vec_q = _v12_vec(int(t), int(qc), int(qi), v)
    a1, a2 = _v12_args(plan, t, d, qc, qi, w, g, batch, k, v, kptrs, _I32[kfmt], a, tk, st,
                       _I32[vec_t], _I32[vec_q])
    if _STAGE_ONLY != 2:
        plan[4].launch(plan[5], plan[6], a1)
    if _STAGE_ONLY != 1:
        plan[9].launch(plan[10], plan[6], a2)


def _vf_vec(t, qc, qi, v):
    """dc_vfused's / dc_vone's (vec, vec_q): 16-byte loads of the target rows (V % 4
    == 0, 16-byte aligned target), and of the dense q rows too (qc 16-byte aligned, no
    ids); t, qc, qi are pointers (null: 0)."""
    vec = v % 4 == 0 and t % 16 == 0
    return vec, vec and bool(qc) and not qi and qc % 16 == 0


def _vf_acap(v):
    """Entries of a row's list of ambiguous ids (dc_vfused, dc_vone): _VF_ACAP, at most V
    (a row lists each of its ids at most once: a list of V entries never fills, and the
    results do not depend on the capacity; the lists of large batches at small V stay
    small)."""
    return min(_VF_ACAP, v)


def _vf_row_buffers(batch, k1, nt, v):
    """The per-row scratch of dc_vfused and dc_vone: tile records (6 u64 per request, row
    and tile), 64-id chunk records, the ambiguous-id lists and their counters."""
    return (scratch("vf_tpart", 8 * 6 * batch * k1 * nt),
            scratch("vf_rchunk", 16 * batch * k1 * ((v + 63) // 64)),
            scratch("vf_alist", 16 * batch * k1 * _vf_acap(v)),
            scratch("vf_acnt", 4 * batch * k1))


def _vf_args(plan, t, d, qc, qi, w, kptrs, kfmt32, a, tk, st, k, v, vec32, vec_q32):
    """dc_vfused's arguments (plan: CupyBackend._vf_plan; pointers)."""
    vt, nt32, acap, pre, rows, kern, grid, block, _, ptrs = plan
    tpart, rchunk, alist, acnt, cnt = ptrs
    return (t, d, qc, qi, _I32[w], _I32[k], _I32[v], nt32, *kptrs, kfmt32, tpart, rchunk,
            alist, acnt, acap, a, tk, st, cnt, vt, pre, vec32, vec_q32, rows)


def _vone_args(plan, t, d, qc, qi, w, kptrs, kfmt32, a, tk, st, k, v, vec32, vec_q32):
    """dc_vone's arguments (plan: CupyBackend._vone_plan; pointers)."""
    vt, nt32, acap, rows, kern, grid, block, _, ptrs = plan
    tpart, rchunk, alist, acnt, cnt, tz = ptrs
    return (t, d, qc, qi, _I32[w], _I32[k], _I32[v], nt32, *kptrs, kfmt32, tpart, rchunk,
            alist, acnt, acap, a, tk, st, cnt, tz, vt, vec32, vec_q32, rows)


def _vf_run(plan, t, d, qc, qi, w, kptrs, kfmt, a, tk, st, k, v):
    """One launch of dc_vfused (plan: CupyBackend._vf_plan); every array a pointer."""
    vec, vec_q = _vf_vec(int(t), int(qc), int(qi), v)
    plan[5].launch(plan[6], plan[7], _vf_args(plan, t, d, qc, qi, w, kptrs, _I32[kfmt], a, tk,
                                              st, k, v, _I32[vec], _I32[vec_q]))


def _vone_run(plan, t, d, qc, qi, w, kptrs, kfmt, a, tk, st, k, v):
    """One launch of dc_vone (plan: CupyBackend._vone_plan); every array a pointer."""
    vec, vec_q = _vf_vec(int(t), int(qc), int(qi), v)
    plan[4].launch(plan[5], plan[6], _vone_args(plan, t, d, qc, qi, w, kptrs, _I32[kfmt], a,
                                                tk, st, k, v, _I32[vec], _I32[vec_q]))


def _one_launch_run(go, v):
    """The fast launcher's ``run(t, d, qc, qi, g, kptrs, kfmt, a, tk, st)`` of dc_vfused and
    dc_vone (``go``: _verify_fast's): absent q fields as null words, no greedy word, their
    16-byte-load flags (_vf_vec)."""
    def run(t, d, qc, qi, g, kptrs, kfmt, a, tk, st):
        qc, qi = qc or 0, qi or 0
        go(t, d, qc, qi, 0, kptrs, kfmt, a, tk, st, *_vf_vec(t, qc, qi, v))

    return run


# the fast path's per-call words of verify, dense allocate and draw (besides _VKEYS, _VKFMT)
_VT, _VD, _VQC, _VQI, _VG = (_VAR(n) for n in ("t", "d", "qc", "qi", "g"))
_VA, _VTK, _VST = _VAR("a"), _VAR("tk"), _VAR("st")
_VCNT, _VCVEC, _VIDS = _VAR("counts"), _VAR("cvec", np.int32), _VAR("ids")


def _verify_fast(kernel, grid, block, args):
    """``go(t, d, qc, qi, g, kptrs, kfmt, a, tk, st, vec, vec_q)``: one verify launch with
    the per-call words of ``args`` (_VT ... _VST, _VKEYS, _VKFMT; _VG, _VVEC, _VVECQ where
    the kernel has them) written, through launch.Bound."""
    b = _launch.Bound(kernel, grid, block, args)
    p = b.pos
    it, id_, iqc, iqi, ikf, ia, itk, ist = (p[n] for n in ("t", "d", "qc", "qi", "kfmt", "a",
                                                         "tk", "st"))
    k0, k1, k2, k3 = (p[a.name] for a in _VKEYS)
    ig, iv, ivq = p.get("g"), p.get("vec"), p.get("vec_q")

    def go(t, d, qc, qi, g, kptrs, kfmt, a, tk, st, vec, vec_q):
        s = b.take()
        w = s.w
        w[it] = t
        w[id_] = d
        w[iqc] = qc
        w[iqi] = qi
        w[k0], w[k1], w[k2], w[k3] = kptrs
        w[ikf] = kfmt
        w[ia] = a
        w[itk] = tk
        w[ist] = st
        if ig is not None:
            w[ig] = g
        if iv is not None:
            w[iv] = vec
        if ivq is not None:
            w[ivq] = vec_q
        b.launch(s)

    return go


class _Launcher:
    """``run``: the launch(es) of one primitive for a cached configuration; ``valid()``:
    its plan is still the one in _PLANS under ``key``."""

    __slots__ = ("run", "key", "plan")

    def __init__(self, run, key, plan):
        self.run, self.key, self.plan = run, key, plan

    def valid(self):
        return _PLANS.get(self.key) is self.plan


class CupyBackend(Backend):
    name = "cuda"
    has_lazy_verify = True
    has_launchers = True
    #: x / bias may be float16 or bfloat16 device arrays (read in the kernels).
    reads_half_precision = True
    #: propose / verify with check=False and out= launch only kernels on the
    #: caller's stream: they can be captured in a torch.cuda.CUDAGraph.
    graph_capturable = True

    def usable(self):
        try:
            cp = _cupy()
            return cp.cuda.runtime.getDeviceCount() > 0
        except Exception:  # noqa: BLE001 - no driver / no device means unusable
            return False

    # -------------------------------------------------------------- philox
    def philox4x32(self, counters, keys, rounds, out):
        call = _Call()
        n = int(counters.shape[0])
        args = (call(counters), call(keys), np.int32(rounds), np.int32(n), call(out, True))
        _kernel("dc_philox")(((n + 255) // 256,), (256,), args)
        call.finish()

    # ------------------------------------------------------- allocate/propose
    def _alloc(self, x, bias, temperature, logits, greedy_ok, policy, top_k, keys, tokens,
               counts, ids, status):
        call = _Call()
        shape = x.shape
        batch, v = int(shape[0]), int(shape[1])
        dev = _device_id()
        x_ptr, temp_ptr = call.many((x, temperature))
        x_code = _x_code(x)  # x's dtype error first, then bias's (as before)
        if bias is None:
            bias_ptr, bias_code, bias_rows = _NULL, _I32[0], _I32[0]
        else:
            bias_ptr, bias_code, bias_rows = call(bias), _x_code(bias), _I32[int(bias.shape[0])]
        common = (x_ptr, x_code, bias_ptr, bias_code, bias_rows, temp_ptr,
                  _I32[bool(logits)], _I32[greedy_ok], _I32[v])
        do_draw = tokens is not None
        if do_draw:
            kptrs, kfmt = _keys(call, *keys, batch)
        else:
            kptrs, kfmt = _NO_KEYS, 0
        wide = _pk_route(top_k, bias is None or not logits, batch, v,
                         bias is None and logits and int(x_code) != 0)
        if wide is not None:
            plan = self._pk_plan(wide, batch, v, int(top_k), dev)
            _pk_run(plan, wide, common, int(top_k), policy, do_draw, kptrs, kfmt,
                    call.many((tokens, counts, ids, status), True))
        elif top_k:
            k = int(top_k)
            kc = min(k, _TILE)
            ntiles = (v + _TILE - 1) // _TILE
            pk = ("topk", dev, batch, v, k)
            bufs = _PLANS.get(pk)
            if bufs is None:  # scratch buffers cached per (device, shape): no lookups per call
                n = batch * ntiles * kc
                bufs = (scratch("cand_key", 8 * n), scratch("cand_id", 4 * n),
                        scratch("tile_bad", 8 * batch * ntiles), scratch("counters", 4 * batch),
                        scratch("sup_id", 4 * batch * k), scratch("sup_key", 8 * batch * k),
                        scratch("sup_rem", 8 * batch * k), scratch("sup_cnt", 4 * batch * k))
                _PLANS[pk] = bufs
            cand_key, cand_id, tile_bad, counters, sup_id, sup_key, sup_rem, sup_cnt = bufs
            # Rank-counting top-K up to _FAST_MAX_BATCH rows, the radix select above: the
            # faster of the two at each batch on the H200 (docs/performance.md).  Both give
            # the same results (DYADIC_CUDA_TOPK forces one for the parity tests).
            fast = k <= _KSMALL and (_TOPK_MODE == "rank"
                                     or (_TOPK_MODE != "radix" and batch <= _FAST_MAX_BATCH))
            args = common + (_I32[k], _I32[kc], _I32[ntiles], _I32[policy], _I32[do_draw],
                             _I32[(2 if _TOPK_STAGE else 1) if fast else 0],
                             *kptrs, _I32[kfmt], cand_key, cand_id,
                             tile_bad, counters, sup_id, sup_key, sup_rem, sup_cnt,
                             call(tokens, True), call(counts, True), call(ids, True),
                             call(status, True), _I32[batch])
            _kernel("dc_topk")(_rgrid(ntiles, batch), (256,), args)
        elif _DENSE_MODE == "mb":
            self._dense_mb(common, batch, v, policy, do_draw, kptrs, kfmt, call, tokens, counts,
                           status)
        elif _DENSE_MODE != "old":
            self._dense_da(common, batch, v, policy, do_draw, kptrs, kfmt, call, tokens, counts,
                           status)
        else:
            sc = scratch("dense", 8 * batch * v)
            args = common + (np.int32(policy), np.int32(do_draw), *kptrs, np.int32(kfmt), sc,
                             call(tokens, True), call(counts, True), call(status, True))
            _kernel("dc_dense")((batch,), (1024,), args)
        if call.back:  # NumPy outputs to copy back
            call.finish()

    def _pk_plan(self, wide, batch, v, k, dev):
        """The launch plan of pk_topk2 (wide False: DYADIC_CUDA_PK=2, or auto on small grids
        or with bias; tiles of PK_NT * PK_EPT ids) or pk_topk3 (wide: propose_wide.cuh,
        tiles of up to PK_NT * 16 ids, _PK3_CHUNK forces one), grid (R, B), R * PK_CAP
        candidate slots per row; cached per (kind, device, B, V, K) in _PLANS."""
        pk = ("pk3" if wide else "pk2", dev, batch, v, k)
        plan = _PLANS.get(pk)
        if plan is None:
            chunk = _PK_NT * _PK_EPT
            if wide:
                cap = _PK_NT * _PK3_EPT
                chunk = min(-(-(_PK3_CHUNK or cap) // 8) * 8, cap)
                if -(-v // chunk) * _PK_CAP > _PK_NT * _PK_EPT:
                    chunk = cap
            r = -(-v // chunk)
            packed = None
            if wide:  # [auto choice, pk_topk4, 4w, 4x] (_PK3_CHUNK: pk_topk3's tiles)
                packed = []
                for name, cw in zip(("pk_topk4", "pk_topk4w", "pk_topk4x"),
                                    (chunk,) + _PK4_CHUNKS[1:]):
                    cw = chunk if _PK3_CHUNK else cw
                    rw = -(-v // cw)
                    packed.append((np.int32(rw), np.int32(cw), _kernel(name), _rgrid(rw, batch)))
                fits = [p for p in packed if int(p[0]) * batch <= 2 * _num_sms()]
                packed = tuple([fits[0] if fits else packed[-1]] + packed)
            plan = (np.int32(r), np.int32(chunk)) + _launch_plan(
                _kernel("pk_topk3" if wide else "pk_topk2"), _rgrid(r, batch), (_PK_NT,),
                (scratch("pk2_cand_key", 8 * batch * r * _PK_CAP),
                 scratch("pk2_cand_id", 4 * batch * r * _PK_CAP),
                 scratch("pk_blk_bad", 8 * batch * r), scratch("pk_counters", 4 * batch))) + (
                _I32[batch], packed)
            _PLANS[pk] = plan
        return plan

    def _topk_launcher(self, batch, v, code, top_k, policy, logits, do_draw):
        """The one-launch top-k path (pk_topk2 / 3 / 4*) of _alloc for torch x [B, V] (x
        dtype ``code``) without bias: ``(run, key, plan)`` with ``run(x_ptr, temp_ptr,
        kptrs, kfmt, outs)`` (``outs``: tokens, counts, ids, status pointers), None where
        _alloc takes another path."""
        wide = _pk_route(top_k, True, batch, v, bool(logits) and int(code) != 0)
        if wide is None:
            return None
        k, dev = int(top_k), _device_id()
        plan = self._pk_plan(wide, batch, v, k, dev)
        head, tail = _common_parts(code, logits, do_draw, v)
        run = _pk_fast(plan, wide, head, tail, k, policy, int(do_draw), int(code), v)
        return run, ("pk3" if wide else "pk2", dev, batch, v, k), plan

    def propose_launcher(self, batch, v, x_dtype, top_k, policy):
        """A launcher for eager propose calls shaped like this one: torch logits [B, V] of
        ``x_dtype``, no bias, top_k on the one-launch path (pk_topk2 / pk_topk3 /
        pk_topk4*), a draw; None for any other call.  ``launcher.run(x_ptr, temp_ptr,
        kptrs, kfmt, outs)`` makes the launch the full path makes (``outs``: tokens, counts,
        ids, status pointers); ``launcher.valid()`` is False once the plan it uses has left
        _PLANS (cleared by A/B switches and tests)."""
        code = _X_CODES.get(x_dtype)
        made = None if code is None else self._topk_launcher(batch, v, code, top_k, policy,
                                                             True, True)
        return None if made is None else _Launcher(*made)

    def allocate_launcher(self, batch, v, x_dtype, top_k, policy, logits):
        """The same for eager allocate calls (logits or weights, no bias; top_k 0: dense,
        da2_* in four launches): no draw, ``launcher.run(x_ptr, temp_ptr, counts, ids,
        status)`` (pointers; ids None for dense)."""
        code = _X_CODES.get(x_dtype)
        if code is None:
            return None
        if not top_k:
            if _DENSE_MODE in ("mb", "old"):
                return None
            dev = _device_id()
            plan = self._da_plan(batch, v, dev)
            head, tail = _common_parts(code, logits, False, v)
            return _Launcher(_da_fast(plan, head, tail, policy, int(code), v),
                             ("dense_da", dev, batch, v), plan)
        made = self._topk_launcher(batch, v, code, top_k, policy, logits, False)
        if made is None:
            return None
        inner, key, plan = made

        def run(x_ptr, temp_ptr, counts, ids, status):
            inner(x_ptr, temp_ptr, _NO_KEYS, 0, (_NULL, counts, ids, status))

        return _Launcher(run, key, plan)

    def draw_launcher(self, batch, w):
        """A launcher for eager draw calls on torch counts [B, w] (ids [B, w] or None):
        ``launcher.run(counts, ids, kptrs, kfmt, tokens)`` (pointers, None for no ids)
        launches dc_draw as ``draw`` does."""
        dev = _device_id()
        key = ("draw", dev)
        plan = _PLANS.get(key)
        if plan is None:
            plan = _PLANS[key] = (_kernel("dc_draw"),)
        b = _launch.Bound(plan[0], (batch,), (256,),
                          _draw_args(_VCNT, _VIDS, _I32[w], _VKEYS, _VKFMT, _VTK))
        p = b.pos
        ic, ii, ikf, itk = p["counts"], p["ids"], p["kfmt"], p["tk"]
        k0, k1, k2, k3 = (p[a.name] for a in _VKEYS)

        def run(counts, ids, kptrs, kfmt, tokens):
            s = b.take()
            w = s.w
            w[ic] = counts
            w[ii] = 0 if ids is None else ids
            w[k0], w[k1], w[k2], w[k3] = kptrs
            w[ikf] = kfmt
            w[itk] = tokens
            b.launch(s)

        return _Launcher(run, key, plan)

    # dense allocate / propose, default path: DA_RS / DA_CAP / DA_NB of dense_alloc.cuh
    _DA_RS = 144
    _DA_CAP = 2048
    _DA_NB = 2048

    def _dense_da(self, common, batch, v, policy, do_draw, kptrs, kfmt, call, tokens, counts,
                  status):
        """Dense allocate / propose in four launches (da2_* in dense_alloc2.cuh).

        da2_max, da2_sum, da2_floor (digit histogram; the last block of a row finds the
        boundary bin), da2_mark (counts written once; the last block of a row resolves
        the boundary bin exactly and zeroes the row state).  The state is zero between
        calls (no memset), so the sequence can be captured in a CUDA graph.  Every
        pointer is computed before the first launch: a failure in between would leave
        the state dirty.
        """
        plan = self._da_plan(batch, v, _device_id())
        _da_run(plan, common, v, policy, do_draw, kptrs, kfmt, call(counts, True),
                call(status, True), call(tokens, True) if do_draw else _NULL)

    def _da_plan(self, batch, v, dev):
        """_dense_da's launch plan (tiles, scratch, kernels), cached per (device, B, V)."""
        pk = ("dense_da", dev, batch, v)
        plan = _PLANS.get(pk)
        if plan is None:
            # tiles: one wave of <= 4 blocks per SM (the kernels are bounded to 64 registers)
            want = max(1, (4 * _num_sms()) // max(batch, 1))
            dt = -(-v // want)
            dt = max(1024, -(-dt // 1024) * 1024)
            nti = (v + dt - 1) // dt
            plan = (np.int32(dt), nti, scratch("da_state", 8 * batch * self._DA_RS),
                    scratch("da_cand_r", 8 * batch * self._DA_CAP),
                    scratch("da_cand_i", 4 * batch * self._DA_CAP),
                    scratch("da_fine", 4 * batch * nti * self._DA_NB),
                    *(_kernel("da2_" + n) for n in ("max", "sum", "floor", "mark")),
                    _kernel("dc_draw"), batch)
            _PLANS[pk] = plan
        return plan

    def _dense_mb(self, common, batch, v, policy, do_draw, kptrs, kfmt, call, tokens, counts,
                  status):
        """Dense allocate / propose over many blocks per row (see dd_* in the kernels)."""
        cp = _cupy()
        dev = _device_id()
        pk = ("dense", dev, batch, v)
        plan = _PLANS.get(pk)
        if plan is None:
            dt = _tile_for(v, batch, _num_sms(), 16384)
            nti = (v + dt - 1) // dt
            plan = (np.int32(dt), nti, np.int32(nti), scratch("dd_state", 8 * batch * _DD_RS),
                    scratch("dense", 8 * batch * v), scratch("dd_tile_eq", 4 * batch * nti),
                    _kernel("dd_max"), _kernel("dd_sum"), _kernel("dd_floor"), _kernel("dd_pass"),
                    _kernel("dd_tiecnt"), _kernel("dd_mark"), _kernel("dc_draw"),
                    8 * batch * _DD_RS)
            _PLANS[pk] = plan
        dt, nti, nti32, state, sc, teq, kmax, ksum, kfloor, kpass, ktie, kmark, kdraw, sbytes = plan
        cp.cuda.runtime.memsetAsync(state.data.ptr, 0, sbytes, cp.cuda.get_current_stream().ptr)
        grid, blk, rows = _rgrid(nti, batch), (256,), _I32[batch]
        v32 = common[8]
        kmax(grid, blk, common + (dt, state, rows))
        ksum(grid, blk, common + (dt, state, rows))
        cnt = call(counts, True)
        kfloor(grid, blk, common + (dt, np.int32(policy), state, sc, cnt, call(status, True),
                                    np.int32(_DENSE_RECIP), rows))
        if policy == 0:
            for _ in range(_DD_PASSES):
                kpass(grid, blk, (v32, dt, state, sc, rows))
            ktie(grid, blk, (v32, dt, nti32, state, sc, teq, rows))
            kmark(grid, blk, (v32, dt, nti32, state, sc, teq, cnt, rows))
        if do_draw:
            kdraw((batch,), (256,), (cnt, _NULL, v32, *kptrs, np.int32(kfmt), call(tokens, True)))

    def allocate(self, x, bias, temperature, logits, policy, top_k, counts, ids, status):
        self._alloc(x, bias, temperature, logits, 0, policy, top_k, None, None, counts, ids,
                    status)

    def propose(self, x, bias, temperature, policy, top_k, seed, generation, round, position,
                tokens, counts, ids, status):
        self._alloc(x, bias, temperature, True, 1, policy, top_k,
                    (seed, generation, round, position), tokens, counts, ids, status)

    # ----------------------------------------------------------------- draw
    def draw(self, counts, ids, seed, generation, round, position, tokens):
        call = _Call()
        batch, w = int(counts.shape[0]), int(counts.shape[1])
        if ids is not None and _shape_of(ids) != _shape_of(counts):
            raise ValueError(f"ids: shape {_shape_of(ids)} must be counts' {_shape_of(counts)}")
        if _shape_of(tokens) != (batch,):
            raise ValueError(f"tokens: shape {_shape_of(tokens)} must be ({batch},)")
        kptrs, kfmt = _keys(call, seed, generation, round, position, batch)
        args = (call(counts), call(ids), _I32[w], *kptrs, _I32[kfmt], call(tokens, True))
        _kernel("dc_draw").launch((batch, 1, 1), (256, 1, 1), args)
        if call.back:  # NumPy outputs to copy back
            call.finish()

    # --------------------------------------------------------------- verify
    def verify(self, target, draft, q_counts, q_ids, greedy, seed, generation, round,
               position, accepted, tokens, status):
        batch, k, v, w, call, kptrs, kfmt, (t, d, qc, qi, g), (a, tk, st) = _verify_setup(
            target, q_counts, seed, generation, round, position,
            (target, draft, q_counts, q_ids, greedy), (accepted, tokens, status))
        k1 = k + 1
        rows = batch * k1
        v32, w32, k32 = _I32[v], _I32[w], _I32[k]
        if _VERIFY_MODE not in ("split", "old"):
            _v12_run(self._v12_plan(batch, k1, v), t, d, qc, qi, w, g, batch, k, v, kptrs,
                     kfmt, a, tk, st)
            if call.back:  # NumPy outputs to copy back
                call.finish()
            return
        ntiles = (v + _VTILE - 1) // _VTILE
        nrt = (v + _RTILE - 1) // _RTILE
        part_lo = scratch("part_lo", 8 * rows * ntiles)
        part_hi = scratch("part_hi", 8 * rows * ntiles)
        part_max = scratch("part_max", 8 * rows * ntiles)
        part_bad = scratch("part_bad", 4 * rows * ntiles)
        res_row = scratch("res_row", 4 * batch)
        res_t = scratch("res_T", 8 * batch)
        rpart = scratch("rpart", 16 * batch * nrt)
        chain_args = (t, d, qc, qi, w32, g, np.int32(batch), k32, v32, np.int32(ntiles), part_lo,
                      part_hi, part_max, part_bad, *kptrs, np.int32(kfmt), res_row, res_t, a, tk,
                      st)
        draw_args = (t, d, qc, qi, w32, k32, v32, np.int32(nrt), *kptrs, np.int32(kfmt),
                     res_row, res_t, rpart, a, tk, st)
        if _VERIFY_MODE == "split":  # four launches (A/B runs)
            _kernel("dc_vpart")((rows, ntiles), (256,),
                                (t, v32, np.int32(ntiles), part_lo, part_hi, part_max, part_bad))
            _kernel("dc_vchain")((batch,), (32,), chain_args)
            _kernel("dc_vrpart")(_rgrid(nrt, batch), (256,),
                                 (t, d, qc, qi, w32, k32, v32, np.int32(nrt), res_row, res_t,
                                  rpart, np.int32(batch)))
            _kernel("dc_vrdraw")((batch,), (256,), draw_args)
        else:  # two launches: the last block of each request chains / draws
            vcnt = scratch("vcnt", 4 * batch)
            rcnt = scratch("rcnt", 4 * batch)
            _kernel("dc_vpart_chain")((rows, ntiles), (256,), chain_args + (vcnt,))
            _kernel("dc_vresid_fused")(_rgrid(nrt, batch), (256,),
                                       draw_args + (rcnt, np.int32(batch)))
        if call.back:  # NumPy outputs to copy back
            call.finish()

    def _v12_plan(self, batch, k1, v):
        """dc_v1 + dc_v2 (the bandwidth path): runtime tiles (>= ~4 blocks per SM), 16-byte
        loads, one block reduction per tile; residual tiles spread over many blocks.  The
        launch plan (tiles, scratch buffers) is cached per (device, shape)."""
        dev = _device_id()
        rows = batch * k1
        pk = ("verify", dev, batch, k1, v)
        plan = _PLANS.get(pk)
        if plan is None:
            nsm = _num_sms()
            vt = _tile_for(v, rows, nsm, 16384)
            nt1 = (v + vt - 1) // vt
            rt = _tile_for(v, batch, nsm, 8192)
            nrt2 = (v + rt - 1) // rt
            plan = ((np.int32(nt1), np.int32(vt), np.int32(nrt2), np.int32(rt))
                    + _launch_plan(_kernel("dc_v1"), _rgrid(nt1, rows), (256,), (
                        scratch("part_lo", 8 * rows * nt1), scratch("part_hi", 8 * rows * nt1),
                        scratch("part_max", 8 * rows * nt1),
                        scratch("part_bad", 4 * rows * nt1), scratch("res_row", 4 * batch),
                        scratch("res_T", 8 * batch), scratch("rpart", 16 * batch * nrt2),
                        scratch("vcnt", 4 * batch), scratch("rcnt", 4 * batch)))
                    + (_kernel("dc_v2"), _rgrid(nrt2, batch)))
            _PLANS[pk] = plan
        return plan

    def verify_launcher(self, batch, k1, v, w, lazy, greedy=False):
        """A launcher for eager verify calls shaped like this one (target [B, k+1, V], q of
        width ``w``), with ``check=False`` (dc_vone where _vone_tile takes it, else dc_v1 +
        dc_v2) or ``"lazy"`` (dc_vfused); with greedy flags (``greedy``) always dc_v1 +
        dc_v2, as ``verify``: ``launcher.run(t, d, qc, qi, g, kptrs, kfmt, a, tk, st)``
        (pointers, None for an absent q field; ``g``, the greedy flags' bytes, unused by
        dc_vone and the lazy kernel) makes the launches the full path makes; None where the
        full path takes another route (A/B switches, V beyond the fused kernel)."""
        k = k1 - 1
        if k > _MAX_K_VERIFY:
            return None
        if lazy and not greedy:
            if _LAZY_MODE != "fused" or v > _VF_MAXV:
                return None
            dev = _device_id()
            plan = self._vf_plan(batch, k1, v, dev)
            go = _verify_fast(plan[5], plan[6], plan[7], _vf_args(
                plan, _VT, _VD, _VQC, _VQI, w, _VKEYS, _VKFMT, _VA, _VTK, _VST, k, v, _VVEC,
                _VVECQ))

            return _Launcher(_one_launch_run(go, v), ("verify_lazy_fused", dev, batch, k1, v),
                             plan)
        if _VERIFY_MODE in ("split", "old"):
            return None
        dev = _device_id()
        one = not greedy and self._vone_plan(batch, k1, v, dev)
        if one:
            go = _verify_fast(one[4], one[5], one[6], _vone_args(
                one, _VT, _VD, _VQC, _VQI, w, _VKEYS, _VKFMT, _VA, _VTK, _VST, k, v, _VVEC,
                _VVECQ))

            return _Launcher(_one_launch_run(go, v), ("verify_one", dev, batch, k1, v), one)
        plan = self._v12_plan(batch, k1, v)
        a1, a2 = _v12_args(plan, _VT, _VD, _VQC, _VQI, w, _VG, batch, k, v, _VKEYS, _VKFMT,
                           _VA, _VTK, _VST, _VVEC, _VVECQ)
        go1 = _verify_fast(plan[4], plan[5], plan[6], a1)
        go2 = _verify_fast(plan[9], plan[10], plan[6], a2)

        def run(t, d, qc, qi, g, kptrs, kfmt, a, tk, st):
            qc, qi = qc or 0, qi or 0
            vec_t, vec_q = _v12_vec(t, qc, qi, v)
            if _STAGE_ONLY != 2:
                go1(t, d, qc, qi, g, kptrs, kfmt, a, tk, st, vec_t, vec_q)
            if _STAGE_ONLY != 1:
                go2(t, d, qc, qi, g, kptrs, kfmt, a, tk, st, vec_t, vec_q)

        return _Launcher(run, ("verify", _device_id(), batch, k1, v), plan)

    def verify_plain(self, target, draft, q_counts, q_ids, greedy, seed, generation, round,
                     position, accepted, tokens, status):
        """verify with no greedy request (``greedy``: their zero flags, for dc_v1): dc_vone
        (verify_fused.cuh: one launch) where its grid is small, else as ``verify``."""
        batch, k1, v = target.shape
        one = _VERIFY_MODE not in ("split", "old") and self._vone_plan(batch, k1, v, _device_id())
        if one:
            batch, k, v, w, call, kptrs, kfmt, (t, d, qc, qi), (a, tk, st) = _verify_setup(
                target, q_counts, seed, generation, round, position,
                (target, draft, q_counts, q_ids), (accepted, tokens, status))
            _vone_run(one, t, d, qc, qi, w, kptrs, kfmt, a, tk, st, k, v)
            if call.back:  # NumPy outputs to copy back
                call.finish()
            return
        self.verify(target, draft, q_counts, q_ids, greedy, seed, generation, round, position,
                    accepted, tokens, status)

    def verify_lazy(self, target, draft, q_counts, q_ids, seed, generation, round, position,
                    accepted, tokens, status):
        """verify with check="lazy" (no greedy rows): dc_vfused (verify_fused.cuh), or
        dc_vlazy2 + dc_vres2 (verify_lazy*.cuh) with DYADIC_CUDA_LAZY=2 or a larger V."""
        batch, k, v, w, call, kptrs, kfmt, (t, d, qc, qi), (a, tk, st) = _verify_setup(
            target, q_counts, seed, generation, round, position,
            (target, draft, q_counts, q_ids), (accepted, tokens, status))
        if _LAZY_MODE == "fused" and v <= _VF_MAXV:
            _vf_run(self._vf_plan(batch, k + 1, v, _device_id()), t, d, qc, qi, w, kptrs, kfmt,
                    a, tk, st, k, v)
        else:
            self._verify_lazy_v2(t, d, qc, qi, w, kptrs, kfmt, a, tk, st, batch, k, v,
                                 _device_id())
        call.finish()

    def _vf_plan(self, batch, k1, v, dev):
        """dc_vfused's launch plan (verify_fused.cuh: the tests, the candidate rows' totals
        and chunk sums, the walk and the residual / bonus draw in one launch)."""
        pk = ("verify_lazy_fused", dev, batch, k1, v)
        plan = _PLANS.get(pk)
        if plan is None:
            vt = _vf_tile(v, batch, _num_sms())
            nt = (v + vt - 1) // vt  # <= 128 for v <= _VF_MAXV
            plan = ((_I32[vt], _I32[nt], _I32[_vf_acap(v)], _I32[batch <= _LAZY_PRE],
                     _I32[batch])
                    + _launch_plan(_kernel(_vf_kernel(nt, batch, _num_sms())),
                                   _rgrid(nt, batch), (256,),
                                   _vf_row_buffers(batch, k1, nt, v)
                                   + (scratch("vf_cnt", 4 * batch),)))
            _PLANS[pk] = plan
        return plan

    def _vone_plan(self, batch, k1, v, dev):
        """dc_vone's launch plan (verify_fused.cuh: the tests in block 0 of each request,
        every row's tiles, dc_v1's validation, the walk and the residual / bonus draw in one
        launch), or False where dc_v1 + dc_v2 are taken (_vone_tile)."""
        pk = ("verify_one", dev, batch, k1, v)
        plan = _PLANS.get(pk)
        if plan is None:
            vt = _vone_tile(v, batch, k1, _num_sms())
            plan = False
            if vt:
                nt = (v + vt - 1) // vt
                plan = ((_I32[vt], _I32[nt], _I32[_vf_acap(v)], _I32[batch])
                        + _launch_plan(_kernel("dc_vone"), _rgrid(1 + k1 * nt, batch), (256,),
                                       _vf_row_buffers(batch, k1, nt, v)
                                       + (scratch("vone_cnt", 4 * batch),
                                          scratch("vone_tests", 4 * 64 * batch))))  # VA_TZW
            _PLANS[pk] = plan
        return plan

    def _verify_lazy_v2(self, t, d, qc, qi, w, kptrs, kfmt, a, tk, st, batch, k, v, dev):
        """dc_vlazy2 (classification, candidate-row sums) + dc_vres2 (residual / bonus draw)."""
        k1 = k + 1
        pk = ("verify_lazy_v2", dev, batch, k1, v)
        plan = _PLANS.get(pk)
        if plan is None:
            nsm = _num_sms()
            vt = _tile_for(v, batch, nsm, max(1024, min(16384, _LAZY_VT // 1024 * 1024)))
            nt = (v + vt - 1) // vt
            rt = _tile_for(v, batch, nsm, 8192)  # <= 8192: <= 128 chunks of 64 ids per tile
            nrt = (v + rt - 1) // rt
            nch = (v + 63) // 64
            n = batch * k1 * nt
            plan = (np.int32(vt), np.int32(nt), nt, np.int32(rt), np.int32(nrt), nrt,
                    scratch("lz_part_lo", 8 * n), scratch("lz_part_hi", 8 * n),
                    scratch("lz_part_bad", 4 * n), scratch("lz_res_row", 4 * batch),
                    scratch("lz_res_T", 8 * batch), scratch("lz2_rpart", 16 * batch * nrt),
                    scratch("lz2_rchunk", 16 * batch * nch), scratch("lz_cnt", 4 * batch),
                    scratch("lz2_rcnt", 4 * batch), _kernel("dc_vlazy2"), _kernel("dc_vres2"),
                    np.int32(batch <= _LAZY_PRE))  # small batches: row-0 / q-row prefetch
            _PLANS[pk] = plan
        (vt, nt32, nt, rt, nrt32, nrt, plo, phi, pbad, res_row, res_t, rpart, rchunk, cnt, rcnt,
         ka, kb, pre) = plan
        vec_t = v % 4 == 0 and int(t) % 16 == 0
        vec_q = qc is not _NULL and qi is _NULL and v % 4 == 0 and int(qc) % 16 == 0
        v32, w32, k32 = np.int32(v), np.int32(w), np.int32(k)
        rows = np.int32(batch)
        ka(_rgrid(nt, batch), (256,),
           (t, d, qc, qi, w32, k32, v32, nt32, *kptrs, np.int32(kfmt), plo, phi, pbad, res_row,
            res_t, a, tk, st, cnt, vt, np.int32(vec_t), pre, rows))
        kb(_rgrid(nrt, batch), (256,),
           (t, d, qc, qi, w32, k32, v32, nrt32, *kptrs, np.int32(kfmt), res_row, res_t, rpart,
            rchunk, a, tk, st, rcnt, rt, np.int32(vec_t), np.int32(vec_q), rows))
