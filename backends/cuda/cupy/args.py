"""Host-side argument handling of the cuda backend: device pointers of torch / CuPy /
``__cuda_array_interface__`` arrays (NumPy arrays are copied to the device and results
back), key fields, dtype codes and the structural (shape) rules of verify.

A kernel argument is an 8-byte word: pointers and flags as Python ints, int
parameters as np.int32 (``I32[v]``)."""

import sys

import numpy as np

from . import runtime
from ...._backend import KEY_FIELDS

MAX_K_VERIFY = 63  # the verify kernels' largest draft depth

_TENSOR = []  # [torch.Tensor] once torch has been imported by someone
_TT = type("_NoTensor", (), {})  # torch.Tensor once seen: exact-type checks on the hot path
_KEY_WORD = {}  # torch integer dtype of 4 or 8 bytes -> its key format bit 0 (1: 8-byte words)


def _is_torch(a):
    global _TT
    if not _TENSOR:
        torch = sys.modules.get("torch")
        if torch is None:
            return False
        _TENSOR.append(torch.Tensor)
        _TT = torch.Tensor
        for dt, bit in (("int32", 0), ("uint32", 0), ("int64", 1), ("uint64", 1)):
            if hasattr(torch, dt):
                _KEY_WORD[getattr(torch, dt)] = bit
    return isinstance(a, _TENSOR[0])


DT_CODES = {"float32": 0, "float16": 1, "bfloat16": 2}
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
    cp = runtime.cupy()
    if isinstance(a, cp.ndarray):
        return a.data.ptr
    return a.__cuda_array_interface__["data"][0]


NULL = 0  # a null pointer word
NO_KEYS = [NULL] * 4  # key pointers of allocate (no draw)


class Int32s(dict):
    """``I32[v]``: np.int32(v), made once per value (constructing an np.int32 costs
    ~0.3-0.7 us, a dict lookup ~30 ns; a launch has ~10 such arguments).  Bounded."""

    def __missing__(self, v):
        if len(self) > 4096:
            self.clear()
        i = self[v] = np.int32(v)
        return i


I32 = Int32s()




class Call:
    """Moves NumPy arguments to the device and results back; device arrays pass through.

    ``call(a)`` is the device pointer of ``a`` as a Python int (a kernel argument: 8
    bytes; no NumPy scalar per argument), ``NULL`` for None.
    No __init__ (made per backend call): the lists are made at the first upload."""

    back = keep = ()  # [(device copy, NumPy output)], [device copies] once something moved

    def __call__(self, a, out=False):
        if type(a) is _TT:  # the hot path: a pointer, nothing else
            return a.data_ptr()
        if a is None:
            return NULL
        if _is_torch(a):
            return a.data_ptr()
        if isinstance(a, np.ndarray):
            cp = runtime.cupy()
            d = self.hold(cp.asarray(a))
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
        return tuple([NULL if a is None else a.data_ptr() for a in arrays])

    def hold(self, d):
        """Keep device array ``d`` alive as long as this call (returns it)."""
        if not self.keep:
            self.keep, self.back = [], []
        self.keep.append(d)
        return d

    def finish(self):
        if self.back:
            for d, a in self.back:
                a[...] = d.get()


def keys(call, seed, generation, round_, position, batch):
    """Pointers and the format word of the four key arrays: the cuda path's one check of
    them (dyadic._device passes CUDA tensors as the caller gave them).

    The kernels read entry ``row`` of a field (entry 0 of a length-1 one) in place, so a
    device array (CUDA torch tensor, CuPy, ``__cuda_array_interface__``) must hold
    integers of 4 or 8 bytes (TypeError) and have 1 or ``batch`` entries (ValueError),
    each naming ``keys.<field>``; a strided torch tensor is copied contiguous, another
    strided array refused.  NumPy fields (integers, 1 or ``batch`` entries) go up in one
    upload, a uint64 row of ``batch`` words each.  ``fmt``: two bits per field (field j
    at bit 2j): bit 0 set for 8-byte words, bit 1 for a length-1 field of a batch other
    than 1 (broadcast)."""
    tt = _TT
    if (type(seed) is tt and type(generation) is tt and type(round_) is tt
            and type(position) is tt):  # the hot path: torch tensors, tested side by side
        kw = _KEY_WORD
        try:
            w0, w1, w2, w3 = (kw[seed.dtype], kw[generation.dtype], kw[round_.dtype],
                              kw[position.dtype])
        except KeyError:  # a dtype of another size or kind: refused field by field
            return _keys_each(call, (seed, generation, round_, position), batch)
        n0, n1, n2, n3 = seed.numel(), generation.numel(), round_.numel(), position.numel()
        if ((n0 == batch or n0 == 1) and (n1 == batch or n1 == 1)
                and (n2 == batch or n2 == 1) and (n3 == batch or n3 == 1)
                and seed.is_cuda and generation.is_cuda and round_.is_cuda and position.is_cuda
                # a tensor of one entry is contiguous whatever its strides
                and (n0 == 1 or seed.is_contiguous()) and (n1 == 1 or generation.is_contiguous())
                and (n2 == 1 or round_.is_contiguous())
                and (n3 == 1 or position.is_contiguous())):
            one = 2 if batch != 1 else 0  # the broadcast bit of a length-1 field
            return ([seed.data_ptr(), generation.data_ptr(), round_.data_ptr(),
                     position.data_ptr()],
                    (w0 | (one if n0 == 1 else 0)) | (w1 | (one if n1 == 1 else 0)) << 2
                    | (w2 | (one if n2 == 1 else 0)) << 4 | (w3 | (one if n3 == 1 else 0)) << 6)
    return _keys_each(call, (seed, generation, round_, position), batch)


def _keys_each(call, fields, batch):
    """``keys`` field by field: the first rule a field breaks raises; NumPy fields are
    packed into one upload."""
    ptrs, fmt, host = [NULL] * 4, 0, []
    for j, a in enumerate(fields):
        name = KEY_FIELDS[j]
        if isinstance(a, np.ndarray):
            if a.dtype.kind not in "iu":
                raise TypeError(f"keys.{name}: dtype {a.dtype.name} is not an integer dtype")
            if a.size not in (1, batch):
                raise ValueError(f"keys.{name}: length {a.size} does not match the batch "
                                 f"{batch} (a key array has 1 or B entries)")
            host.append(j)
            continue
        cai = None
        if _is_torch(a):
            if not a.is_cuda:
                raise TypeError(f"keys.{name}: a {a.device.type} tensor; the kernels read "
                                f"key tensors on the GPU (NumPy arrays are copied there)")
            word, n, dtype = _KEY_WORD.get(a.dtype), a.numel(), dtype_name(a)
        else:
            cai = getattr(a, "__cuda_array_interface__", None)
            if cai is None:
                raise TypeError(f"keys.{name}: expected a device array or a NumPy array, got "
                                f"{type(a).__name__}")
            dt = np.dtype(cai["typestr"])
            word = int(dt.itemsize == 8) if dt.kind in "iu" and dt.itemsize in (4, 8) else None
            n, dtype = _prod(cai["shape"]), dt.name
        if word is None:
            raise TypeError(f"keys.{name}: dtype {dtype} is not supported; device key arrays "
                            f"need 4- or 8-byte integers")
        if n not in (1, batch):
            raise ValueError(f"keys.{name}: length {n} does not match the batch {batch} (a "
                             f"key array has 1 or B entries)")
        if cai is None:
            if not a.is_contiguous():  # the kernels read n consecutive words
                a = call.hold(a.contiguous())
            ptrs[j] = a.data_ptr()
        else:
            strides = cai.get("strides")
            if strides is not None and not _contiguous(cai["shape"], strides, dt.itemsize):
                raise ValueError(f"keys.{name}: strides {tuple(strides)}; device key arrays "
                                 f"must be contiguous")
            ptrs[j] = int(cai["data"][0])
        fmt |= (word | (2 if n == 1 and batch != 1 else 0)) << (2 * j)
    if host:
        packed = np.empty((len(host), batch), dtype=np.uint64)
        for i, j in enumerate(host):
            a = fields[j]
            packed[i] = a if a.ndim < 2 else a.reshape(-1)  # cast and broadcast by the
            # assignment (one NumPy call per field; astype and broadcast_to are slower)
        base = int(call(packed))
        for i, j in enumerate(host):
            ptrs[j] = base + 8 * batch * i
            fmt |= 1 << (2 * j)  # 8-byte words, one per row
    return ptrs, fmt


def _prod(shape):
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _contiguous(shape, strides, itemsize):
    """An array of ``shape`` and ``strides`` (bytes) is C-contiguous (a dimension of
    size 1 may have any stride)."""
    step = itemsize
    for d, s in zip(reversed(shape), reversed(strides)):
        if d != 1 and s != step:
            return False
        step *= int(d)
    return True


def x_code(x):
    if type(x) is _TT:
        code = _X_CODES.get(x.dtype)
        if code is not None:
            return code
    name = dtype_name(x)
    if name not in DT_CODES:
        raise TypeError(f"x: dtype {name} not supported; expected float32, float16 or bfloat16")
    if type(x) is _TT:
        _X_CODES[x.dtype] = np.int32(DT_CODES[name])
    return np.int32(DT_CODES[name])


def verify_setup(target, q_counts, seed, generation, round, position, ins, outs):
    """What every verify launch starts with: (batch, k, V, q width, the Call, key pointers,
    key format, the pointers of ``ins``, the pointers of ``outs``); drafts deeper than the
    kernels take are refused here, and so is every shape the kernels would index beyond
    (verify_shapes: ``ins`` = target, draft, q counts, q ids[, greedy], ``outs`` =
    accepted, tokens, status)."""
    batch, k1, v = target.shape  # Python ints (torch.Size, NumPy and CuPy shapes)
    k = k1 - 1
    if k > MAX_K_VERIFY:
        raise ValueError(f"draft: backend 'cuda' verifies at most {MAX_K_VERIFY} draft "
                         f"tokens per request, got k={k}")
    verify_shapes(batch, k, v, ins, outs)
    call = Call()
    w = 0 if q_counts is None else int(q_counts.shape[-1])
    kptrs, kfmt = keys(call, seed, generation, round, position, batch)
    return batch, k, v, w, call, kptrs, kfmt, call.many(ins), call.many(outs, True)


def shape_of(a):
    if a is None:
        return None
    sh = getattr(a, "shape", None)
    return tuple(a.__cuda_array_interface__["shape"]) if sh is None else tuple(sh)


def verify_shapes(batch, k, v, ins, outs):
    """verify's structural rules on the arrays the kernels index (ValueError naming the
    array): draft [B, k]; q counts [B, k, W] with ids of the same shape, or a dense row
    of V counts (W = V: the kernels read a dense row at ids < V only); greedy flags [B];
    accepted [B], tokens [B, k+1], status [B].  The kernels' own checks cover the
    values (draft ids, sparse q rows)."""
    qc, qi = ins[2], ins[3]
    for name, a, shape in (("draft", ins[1], (batch, k)), ("accepted", outs[0], (batch,)),
                           ("tokens", outs[1], (batch, k + 1)), ("status", outs[2], (batch,)),
                           ("greedy", ins[4] if len(ins) > 4 else None, (batch,))):
        if (a is not None or name != "greedy") and shape_of(a) != shape:
            raise ValueError(f"{name}: shape {shape_of(a)} must be {shape}")
    if qc is None:
        if qi is not None:
            raise ValueError("q_ids: given without q_counts")
        return
    sc = shape_of(qc)
    if len(sc) != 3 or sc[:2] != (batch, k):
        raise ValueError(f"q_counts: shape {sc} must be (B, k, W) = ({batch}, {k}, W)")
    if qi is None:
        if sc[2] != v:
            raise ValueError(f"q_counts: a dense q row has {sc[2]} counts; it must have the "
                             f"target's vocabulary V = {v}")
    elif shape_of(qi) != sc:
        raise ValueError(f"q_ids: shape {shape_of(qi)} must be q_counts' {sc}")




def num_drafts(call, nd, batch):
    """The pointer of verify's ``num_drafts`` (int32 [B], device or NumPy: ValueError
    naming the array otherwise).  Its values are the kernels' to check (each count
    outside [0, k] fails its request closed: NUM_DRAFTS_INVALID)."""
    if shape_of(nd) != (batch,):
        raise ValueError(f"num_drafts: shape {shape_of(nd)} must be ({batch},)")
    dt = getattr(nd, "dtype", None)
    if dt is None or not str(dt).endswith("int32") or str(dt).endswith("uint32"):
        raise ValueError(f"num_drafts: dtype {dt} must be int32")
    return call(nd)


_PARAM_SPECS = (("temperature", 8, "float64"), ("top_k", 8, "int64"), ("top_p", 4, "float32"),
                ("min_p", 4, "float32"))


def logits_params(call, temperature, top_k, top_p, min_p, batch):
    """The pointers of verify(logits=True)'s parameter arrays: temperature float64, top_k
    int64, top_p / min_p float32 (read as bit patterns), each of shape (B,), device or
    NumPy (ValueError / TypeError naming the array otherwise: the kernels read entry b of
    each for every request b).  Their values are the kernels' to check."""
    out = []
    for (name, size, dtype), a in zip(_PARAM_SPECS, (temperature, top_k, top_p, min_p)):
        if shape_of(a) != (batch,):
            raise ValueError(f"{name}: shape {shape_of(a)} must be ({batch},)")
        dt = dtype_name(a)
        if dt != dtype:
            raise TypeError(f"{name}: dtype {dt} must be {dtype}")
        out.append(call(a))
    return tuple(out)
