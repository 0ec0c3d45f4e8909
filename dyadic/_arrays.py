"""NumPy / torch (CPU) arrays in and out, without importing torch.

Inputs are viewed as NumPy arrays without copying where the dtype allows
(torch CPU tensors through ``Tensor.numpy()``, which shares memory); outputs
are returned as the kind of the primary input.  bfloat16 and float16 values
convert exactly to float32 (documented input conversion).
"""

import sys

import numpy as np


def is_torch(x):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def is_gpu_array(x):
    """True for CUDA arrays (cupy, torch CUDA, __cuda_array_interface__)."""
    if is_torch(x):
        return x.device.type == "cuda"
    if isinstance(x, np.ndarray):
        return False
    return hasattr(x, "__cuda_array_interface__")


def dtype_name(x):
    """The dtype's bare name ('float64' for NumPy and torch alike): error messages
    must not depend on the array library (every backend raises the same text)."""
    return str(x.dtype).replace("torch.", "")


def unsupported_float(name, x):
    return TypeError(f"{name}: dtype {dtype_name(x)} not supported; expected float32, float16 "
                     f"or bfloat16 (convert explicitly: dyadic never rounds inputs)")


def kind_of(x):
    return "torch" if is_torch(x) else "numpy"


def to_host(x):
    """A NumPy copy of a device array (torch CUDA, CuPy, CAI); NumPy/torch CPU as is.

    Used where a small or explicitly host-side step (validation of a
    user-built ``Dyadic``, ``to_dense``, ``probs``, ``stack``) meets device
    data; it synchronises.  The hot paths never call it.
    """
    if is_torch(x):
        return x.detach().cpu().numpy()
    if hasattr(x, "__cuda_array_interface__"):
        if hasattr(x, "get"):  # CuPy
            return x.get()
        import numba.cuda  # any other CAI producer
        return numba.cuda.as_cuda_array(x).copy_to_host()
    return x


def like(array, original):
    """NumPy ``array`` as the kind and device of ``original`` (torch, CuPy, NumPy)."""
    if is_torch(original):
        t = sys.modules["torch"].from_numpy(np.ascontiguousarray(array))
        return t if original.device.type == "cpu" else t.to(original.device)
    if hasattr(original, "__cuda_array_interface__") and "cupy" in sys.modules:
        return sys.modules["cupy"].asarray(array)
    return array


def float_to_numpy(x, name):
    """A float array as NumPy float32 (exact for float16 / bfloat16 inputs)."""
    if is_torch(x):
        torch = sys.modules["torch"]
        if _torch_device_type(x, name) != "cpu":
            raise TypeError(f"{name}: a {x.device.type} tensor needs a GPU backend "
                            f"(backend='cuda' or 'numba'); backend='cpu' takes CPU tensors")
        x = x.detach()
        if x.dtype == torch.bfloat16:
            bits = x.contiguous().view(torch.int16).numpy().view(np.uint16)
            return (bits.astype(np.uint32) << 16).view(np.float32)
        if x.dtype in (torch.float32, torch.float16):
            return x.numpy().astype(np.float32, copy=False)
        raise unsupported_float(name, x)
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name}: expected a NumPy array or a torch tensor, got "
                        f"{type(x).__name__}")
    if x.dtype in (np.float32, np.float16):
        return x.astype(np.float32, copy=False)
    raise unsupported_float(name, x)


def int_to_numpy(x, name, *, host_copy=False):
    """An integer array as NumPy; device arrays raise unless ``host_copy``."""
    if host_copy and is_gpu_array(x):
        x = to_host(x)
    if is_torch(x):
        if _torch_device_type(x, name) != "cpu":
            raise TypeError(f"{name}: a {x.device.type} tensor needs a GPU backend")
        x = x.detach().numpy()
    if isinstance(x, (list, tuple)):
        x = np.asarray(x)
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name}: expected an integer array, got {type(x).__name__}")
    if x.dtype.kind not in "iu":
        raise TypeError(f"{name}: dtype {dtype_name(x)} is not an integer dtype")
    return x


def _torch_device_type(x, name):
    """x's device type, refusing tensors without data (``meta``) and unknown devices."""
    kind = x.device.type
    if kind not in ("cpu", "cuda"):
        raise TypeError(f"{name}: a {kind} tensor has no data dyadic can read; expected a "
                        f"CPU tensor (backend 'cpu' / 'reference') or a CUDA tensor "
                        f"(backend 'cuda' / 'numba')")
    return kind


def owned_copy(x, name):
    """(a private copy of integer array ``x`` of the same kind and device, a NumPy view
    or copy of it on the host).  The caller's array is never shared or modified."""
    if is_torch(x):
        _torch_device_type(x, name)
        if x.is_floating_point() or x.is_complex() or str(x.dtype) == "torch.bool":
            raise TypeError(f"{name}: dtype {dtype_name(x)} is not an integer dtype")
        own = x.detach().clone(memory_format=sys.modules["torch"].contiguous_format)
        host = own.numpy() if own.device.type == "cpu" else own.cpu().numpy()
        return own, host
    if hasattr(x, "__cuda_array_interface__"):
        if hasattr(x, "get") and "cupy" in sys.modules:  # CuPy
            own = sys.modules["cupy"].ascontiguousarray(x).copy()
            return own, own.get()
        host = np.array(to_host(x), copy=True)
        return host, host
    own = np.array(int_to_numpy(x, name), copy=True, order="C")
    return own, own


def take_rows(a, flat, width, batch_shape):
    """Rows ``flat`` (int64 NumPy indices into ``a.reshape(-1, width)``) as a new array of
    ``a``'s kind and device, shape ``batch_shape + (width,)``."""
    shape = tuple(batch_shape) + (width,)
    if is_torch(a):
        torch = sys.modules["torch"]
        idx = torch.from_numpy(np.ascontiguousarray(flat)).to(a.device)
        return a.reshape(-1, width).index_select(0, idx).reshape(shape)
    if hasattr(a, "__cuda_array_interface__") and "cupy" in sys.modules:
        cp = sys.modules["cupy"]
        return cp.asarray(a).reshape(-1, width)[cp.asarray(flat)].reshape(shape)
    return np.ascontiguousarray(np.asarray(a).reshape(-1, width)[flat].reshape(shape))


def bool_to_numpy(x, name):
    if is_torch(x):
        _torch_device_type(x, name)
        x = x.detach().cpu().numpy()
    x = np.asarray(x)
    if x.dtype != np.bool_:
        raise TypeError(f"{name}: dtype {dtype_name(x)} is not bool")
    return x


def out_view(x, name, shape, dtype):
    """A caller's preallocated output (NumPy array or torch CPU tensor) as a writeable
    NumPy view of exactly ``shape`` and ``dtype``, C-contiguous."""
    if is_torch(x):
        if _torch_device_type(x, name) != "cpu":
            raise TypeError(f"{name}: a {x.device.type} tensor is an output of the GPU "
                            f"backends; this call runs on the host")
        if x.requires_grad:
            raise ValueError(f"{name}: a tensor that requires grad cannot be written")
        view = x.detach().numpy()
    elif isinstance(x, np.ndarray):
        view = x
    else:
        raise TypeError(f"{name}: expected a NumPy array or a torch CPU tensor, got "
                        f"{type(x).__name__}")
    if view.dtype != np.dtype(dtype) or view.shape != tuple(shape):
        raise ValueError(f"{name}: expected {np.dtype(dtype).name} {tuple(shape)}, got "
                         f"{dtype_name(x)} {tuple(view.shape)}")
    if not view.flags.c_contiguous or not view.flags.writeable:
        raise ValueError(f"{name}: must be C-contiguous and writeable")
    return view


def output(array, kind):
    """Return a freshly computed NumPy array as ``kind`` (zero-copy for torch)."""
    if kind == "torch":
        return sys.modules["torch"].from_numpy(array)
    return array
