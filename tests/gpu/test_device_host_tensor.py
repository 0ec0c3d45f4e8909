"""dyadic._gpu_arrays._host_tensor: host data to a torch tensor without torch's warning about
non-writable NumPy arrays (a Dyadic's fields are read-only; the GPU path copies them to the
device).  torch warns once per process, so each check runs in a fresh interpreter."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from dyadic import _gpu_arrays  # noqa: E402

_SCRIPT = textwrap.dedent("""
    import warnings
    import numpy as np
    import torch
    from dyadic import _gpu_arrays
    a = np.arange(7, dtype=np.uint32)
    a.flags.writeable = False
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        t = {call}
    print(sum("not writable" in str(x.message) for x in w))
""")


def _warnings(call):
    out = subprocess.run([sys.executable, "-c", _SCRIPT.format(call=call)], check=True,
                         capture_output=True, text=True).stdout
    return int(out.split()[-1])


def test_read_only_array_gives_no_warning():
    assert _warnings("torch.as_tensor(a)") == 1  # the warning this helper avoids
    assert _warnings("_gpu_arrays._host_tensor(a)") == 0


@pytest.mark.parametrize("dtype", [np.uint32, np.int32, np.int64, np.bool_, np.float32])
def test_values_and_dtype_are_kept(dtype):
    a = (np.arange(12) % 3).astype(dtype).reshape(3, 4)
    a.flags.writeable = False
    t = _gpu_arrays._host_tensor(a)
    assert t.shape == (3, 4) and t.is_contiguous()
    assert t.dtype == torch.as_tensor(np.ascontiguousarray(a).copy()).dtype
    np.testing.assert_array_equal(t.numpy(), a)


def test_read_only_array_is_copied_writable_one_shared():
    ro = np.zeros(4, dtype=np.int32)
    ro.flags.writeable = False
    t = _gpu_arrays._host_tensor(ro)
    t[0] = 5  # the copy is writable and does not touch the caller's array
    assert ro[0] == 0
    rw = np.zeros(4, dtype=np.int32)
    _gpu_arrays._host_tensor(rw)[1] = 7  # writable input: shared, as torch.as_tensor
    assert rw[1] == 7


def test_non_numpy_input_passes_to_as_tensor():
    t = _gpu_arrays._host_tensor([1, 2, 3])
    assert t.tolist() == [1, 2, 3]
    u = torch.arange(3)
    assert _gpu_arrays._host_tensor(u) is u or _gpu_arrays._host_tensor(u).data_ptr() == u.data_ptr()
