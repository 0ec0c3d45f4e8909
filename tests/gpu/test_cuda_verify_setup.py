"""backends/cuda/cupy_backend without a GPU: the depth limit of the cuda verify kernels is
refused with its message before anything touches the device (_verify_setup), the lazy
verify's choice of kernel by grid size (_vf_kernel), where verify without greedy
requests takes one launch (_vone_tile) and how host key fields are packed for their one
upload (_keys)."""

import numpy as np
import pytest

from dyadic.backends.cuda import cupy_backend


@pytest.mark.parametrize("lazy_or_full", ["verify", "verify_lazy"])
def test_too_deep_draft_is_refused(lazy_or_full):
    k = cupy_backend._MAX_K_VERIFY + 1
    target = np.zeros((2, k + 1, 8), dtype=np.float32)
    draft = np.zeros((2, k), dtype=np.int32)
    be = cupy_backend.CupyBackend()
    args = (target, draft, None, None) + (() if lazy_or_full == "verify_lazy" else (None,))
    with pytest.raises(ValueError, match=rf"draft: backend 'cuda' verifies at most "
                                         rf"{cupy_backend._MAX_K_VERIFY} draft tokens per "
                                         rf"request, got k={k}"):
        getattr(be, lazy_or_full)(*args, 0, 0, 0, 0, None, None, None)


def test_deepest_draft_passes_the_limit():
    """k = the limit is not refused by the limit (without a device it fails later)."""
    k = cupy_backend._MAX_K_VERIFY
    target = np.zeros((1, k + 1, 8), dtype=np.float32)
    try:
        cupy_backend._verify_setup(target, None, 0, 0, 0, 0, (), ())
    except Exception as exc:  # noqa: BLE001 - no CuPy / no GPU here: any error but the limit
        assert "verifies at most" not in str(exc)


@pytest.mark.parametrize("batch, kernel", [(1, "dc_vfused"), (4, "dc_vfused"),
                                           (16, "dc_vfused"), (64, "dc_vfused_r64")])
def test_lazy_kernel_by_grid(batch, kernel, monkeypatch):
    """The tiles of dc_vfused at V = 129280 on 132 SMs, and the 4-blocks-per-SM build only
    where the grid does not fit 3 blocks per SM (B = 64: 8 tiles, 512 blocks > 396)."""
    monkeypatch.setattr(cupy_backend, "_VF_KERNEL", "")
    v, nsm = 129280, 132
    vt = cupy_backend._vf_tile(v, batch, nsm)
    nt = -(-v // vt)
    assert vt % 1024 == 0 and 2048 <= vt <= 32768 and nt <= 128
    assert cupy_backend._vf_kernel(nt, batch, nsm) == kernel
    monkeypatch.setattr(cupy_backend, "_VF_KERNEL", "dc_vfused")
    assert cupy_backend._vf_kernel(nt, batch, nsm) == "dc_vfused"


@pytest.mark.parametrize("batch, k1, v, vt", [
    (1, 6, 129280, 2048),   # 64 tiles per row: 1 + 6 x 64 = 385 blocks <= 396
    (2, 6, 129280, 4096), (4, 6, 129280, 8192),
    (8, 6, 129280, "vf"),   # one wave would need tiles of 16384 ids: dc_vfused's tiles
    (32, 6, 129280, "vf"),  # 32 x 6 x 129280 elements: the largest batch taken there
    (33, 6, 129280, 0), (64, 6, 129280, 0),  # dc_v1 + dc_v2 (they read less)
    (16, 6, 32000, "vf"), (64, 2, 111, 1024),
    (1, 9, 4097, 0),        # k + 1 > 8
    (1, 2, 128 * 32768 + 1, 0)])  # beyond dc_vfused's vocabularies
def test_one_launch_verify_by_grid(batch, k1, v, vt, monkeypatch):
    """dc_vone (check=False / True verify without greedy requests in one launch): the
    largest tiles that fit its grid of batch x (1 + k1 x tiles) blocks in one wave at 3
    blocks per SM (132 SMs) if they have at most 8192 ids, else dc_vfused's tiles up to
    batch x k1 x V = 32 x 6 x 129280; DYADIC_CUDA_VONE=0 never, =1 with dc_vfused's tiles."""
    monkeypatch.setattr(cupy_backend, "_VONE_MODE", "auto")
    got = cupy_backend._vone_tile(v, batch, k1, 132)
    if vt == "vf":
        assert got == cupy_backend._vf_tile(v, batch, 132) and batch * k1 * v <= 32 * 6 * 129280
    else:
        assert got == vt
    if vt and vt != "vf":
        nt = -(-v // vt)
        assert vt % 1024 == 0 and batch * (1 + k1 * nt) <= 3 * 132 and nt <= 128
    monkeypatch.setattr(cupy_backend, "_VONE_MODE", "0")
    assert cupy_backend._vone_tile(v, batch, k1, 132) == 0
    monkeypatch.setattr(cupy_backend, "_VONE_MODE", "1")
    forced = 0 if k1 > 8 or v > cupy_backend._VF_MAXV else cupy_backend._vf_tile(v, batch, 132)
    assert cupy_backend._vone_tile(v, batch, k1, 132) == forced


@pytest.mark.parametrize("batch", [1, 3])
def test_host_keys_packed_in_one_upload(batch):
    """Host key fields (NumPy, as Keys.broadcast gives them, or of length 1) go up as one
    [4, B] uint64 array: row j is field j cast to uint64 and broadcast; the pointers are its
    rows and the format says four 8-byte fields of length B."""
    seen = []

    def call(a):
        seen.append(a.copy())
        return 0x10000

    fields = (np.array([2**64 - 1] * batch, dtype=np.uint64)[:batch],
              (np.arange(batch) + 2**32 - batch).astype(np.uint32),
              np.array([7], dtype=np.uint32), np.arange(batch, dtype=np.int64))
    ptrs, fmt = cupy_backend._keys(call, *fields, batch)
    (packed,) = seen
    assert packed.dtype == np.uint64 and packed.shape == (4, batch)
    for row, f in zip(packed, fields):
        assert row.tolist() == np.broadcast_to(f.astype(np.uint64), (batch,)).tolist()
    assert [int(p) for p in ptrs] == [0x10000 + 8 * batch * j for j in range(4)]
    assert fmt == 0b01010101
