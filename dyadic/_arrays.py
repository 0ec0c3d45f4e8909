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
        if x.device.type != "cpu":
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
        if x.device.type != "cpu":
            raise TypeError(f"{name}: a {x.device.type} tensor needs a GPU backend")
        x = x.detach().numpy()
    if isinstance(x, (list, tuple)):
        x = np.asarray(x)
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name}: expected an integer array, got {type(x).__name__}")
    if x.dtype.kind not in "iu":
        raise TypeError(f"{name}: dtype {dtype_name(x)} is not an integer dtype")
    return x


def bool_to_numpy(x, name):
    if is_torch(x):
        x = x.detach().cpu().numpy()
    x = np.asarray(x)
    if x.dtype != np.bool_:
        raise TypeError(f"{name}: dtype {dtype_name(x)} is not bool")
    return x


def output(array, kind):
    """Return a freshly computed NumPy array as ``kind`` (zero-copy for torch)."""
    if kind == "torch":
        return sys.modules["torch"].from_numpy(array)
    return array
