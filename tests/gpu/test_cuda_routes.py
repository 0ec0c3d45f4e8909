"""The cuda backend's routing table and host-side rules, without a GPU.

backends/cuda/cupy/routes.py decides which kernels serve a call from its shape alone;
this is the one test that names kernels.  The parity tests choose their shapes from
this table so that every kernel is compared with the CPU backend (the file named in
each row's comment).  Also: the tiles respect the kernels' limits, drafts deeper than the
verify kernels take are refused before anything touches the device, host key fields
go up in one packed upload, and key arrays the kernels cannot read (a length other than 1
or B, words other than 4- or 8-byte integers) are refused by args.keys, the backend's
one check of them.
"""

import numpy as np
import pytest

from dyadic.backends.cuda.cupy import args, routes

NSM = 132  # the H200's SMs
V = 129280

ROUTES = [
    # (primitive, shape, kernels launched)
    # tests/gpu/test_gpu_topk_small_k.py
    ("propose", dict(batch=1, v=V, top_k=32), ("topk_onepass",)),
    ("propose", dict(batch=4, v=V, top_k=32), ("topk_onepass_wide",)),
    ("propose", dict(batch=64, v=V, top_k=32, bias=True), ("topk_onepass",)),
    ("allocate", dict(batch=1, v=V, top_k=32), ("topk_onepass",)),
    # tests/gpu/test_gpu_topk_16bit_logits.py
    ("propose", dict(batch=1, v=V, top_k=32, x16=True), ("topk_onepass_packed8k",)),
    ("propose", dict(batch=16, v=V, top_k=32, x16=True), ("topk_onepass_packed8k",)),
    ("propose", dict(batch=20, v=V, top_k=32, x16=True), ("topk_onepass_packed16k",)),
    ("propose", dict(batch=40, v=V, top_k=32, x16=True), ("topk_onepass_packed32k",)),
    ("propose", dict(batch=100001, v=128, top_k=32, x16=True), ("topk_onepass_packed32k",)),
    ("propose", dict(batch=1, v=V, top_k=32, x16=True, aligned=False), ("topk_onepass_wide",)),
    ("propose", dict(batch=1, v=V, top_k=32, x16=True, bias=True), ("topk_onepass",)),
    # tests/gpu/test_gpu_parity.py (top_k > 32), tests/gpu/test_gpu_large_batch.py
    ("propose", dict(batch=4, v=V, top_k=64), ("topk_select",)),
    ("allocate", dict(batch=1, v=V, top_k=33), ("topk_select",)),
    # tests/gpu/test_gpu_filtered_alloc.py: top_p / min_p / per-row top_k (SHAPES)
    ("propose", dict(batch=2, v=V, top_k=32, x16=True), ("topk_onepass_packed8k",)),
    ("propose", dict(batch=20, v=V, top_k=16, x16=True), ("topk_onepass_packed16k",)),
    ("allocate", dict(batch=40, v=V, top_k=8, x16=True, logits=True),
     ("topk_onepass_packed32k",)),
    ("propose", dict(batch=8, v=V, top_k=32), ("topk_onepass_wide",)),
    ("propose", dict(batch=4, v=8000, top_k=32), ("topk_onepass",)),
    ("propose", dict(batch=3, v=20000, top_k=64, x16=True), ("topk_select",)),
    # tests/gpu/test_gpu_dense_alloc.py
    ("allocate", dict(batch=64, v=V, top_k=None), ("dense_max", "dense_sum", "dense_floor",
                                                   "dense_mark")),
    ("propose", dict(batch=1, v=V, top_k=None), ("dense_max", "dense_sum", "dense_floor",
                                                 "dense_mark", "draw_rows")),
    # tests/gpu/test_gpu_filtered_alloc.py: top_p / min_p on a dense support
    ("propose", dict(batch=6, v=V, top_k=None, filtered=True),
     ("logits_max", "logits_hist", "logits_resolve", "filter_mask", "dense_max", "dense_sum",
      "dense_floor", "dense_mark", "draw_rows", "filter_status")),
    ("allocate", dict(batch=6, v=V, top_k=None, filtered=True, logits=True),
     ("logits_max", "logits_hist", "logits_resolve", "filter_mask", "dense_max", "dense_sum",
      "dense_floor", "dense_mark", "filter_status")),
    ("propose", dict(batch=64, v=V, top_k=None, filtered=True, bf16=True),
     ("logits_max", "logits_table", "logits_hist", "logits_resolve", "filter_mask",
      "dense_max", "dense_sum", "dense_floor", "dense_mark", "draw_rows", "filter_status")),
    ("draw", dict(batch=8, v=V), ("draw_rows",)),
    # tests/gpu/test_gpu_verify_one_launch.py
    ("verify", dict(batch=1, v=V, k1=6), ("verify_one_launch",)),
    ("verify", dict(batch=32, v=V, k1=6), ("verify_one_launch",)),
    ("verify", dict(batch=4, v=1, k1=8), ("verify_one_launch",)),
    ("verify", dict(batch=33, v=V, k1=6), ("verify_chain", "verify_residual")),
    ("verify", dict(batch=64, v=V, k1=6), ("verify_chain", "verify_residual")),
    ("verify", dict(batch=1, v=4097, k1=9), ("verify_chain", "verify_residual")),
    ("verify", dict(batch=1, v=V, k1=6, greedy=True), ("verify_chain", "verify_residual")),
    # tests/gpu/test_gpu_verify_lazy.py
    ("verify", dict(batch=1, v=V, k1=6, lazy=True), ("verify_lazy",)),
    ("verify", dict(batch=16, v=V, k1=6, lazy=True), ("verify_lazy",)),
    ("verify", dict(batch=64, v=V, k1=6, lazy=True), ("verify_lazy_r64",)),
    ("verify", dict(batch=4, v=V, k1=6, lazy=True, greedy=True),
     ("verify_chain", "verify_residual")),
    ("verify", dict(batch=1, v=128 * 32768 + 1, k1=2, lazy=True),
     ("verify_chain", "verify_residual")),
    # tests/gpu/test_gpu_ragged.py: num_drafts does not change the route
    ("verify", dict(batch=1, v=V, k1=6, ragged=True), ("verify_one_launch",)),
    ("verify", dict(batch=4, v=V, k1=6, ragged=True), ("verify_one_launch",)),
    ("verify", dict(batch=64, v=V, k1=6, ragged=True), ("verify_chain", "verify_residual")),
    ("verify", dict(batch=16, v=V, k1=6, lazy=True, ragged=True), ("verify_lazy",)),
    ("verify", dict(batch=64, v=V, k1=6, lazy=True, ragged=True), ("verify_lazy_r64",)),
    ("verify", dict(batch=4, v=V, k1=6, lazy=True, ragged=True, greedy=True),
     ("verify_chain", "verify_residual")),
    # tests/gpu/test_gpu_verify_logits.py: a second logits_resolve only with a top_k (a
    # top-p cut in an earlier bucket than the top-k cut)
    ("verify", dict(batch=4, v=V, k1=6, logits=True),
     ("logits_max", "logits_hist", "logits_resolve", "logits_resolve", "logits_one_launch")),
    # logits_one_launch while 1 + (k + 1) x tiles blocks a request fit one wave (B <= 4 at
    # k = 5 on 132 SMs), else logits_chain + logits_residual
    ("verify", dict(batch=1, v=V, k1=6, logits=True, top_k=False),
     ("logits_max", "logits_hist", "logits_resolve", "logits_one_launch")),
    ("verify", dict(batch=5, v=V, k1=6, logits=True, top_k=False),
     ("logits_max", "logits_hist", "logits_resolve", "logits_chain", "logits_residual")),
    ("verify", dict(batch=64, v=V, k1=6, lazy=True, logits=True, top_k=False),
     ("logits_max", "logits_hist", "logits_resolve", "logits_chain", "logits_residual")),
    # bfloat16 logits: the value tables in logits_table over at most 128 rows, else in
    # logits_max (test_gpu_verify_logits.py: test_real_vocabulary_bf16 at 24 rows,
    # test_residual_tiles_with_many_kept_tokens at 192)
    ("verify", dict(batch=4, v=V, k1=6, logits=True, bf16=True, top_k=False),
     ("logits_max", "logits_table", "logits_hist", "logits_resolve", "logits_one_launch")),
    ("verify", dict(batch=64, v=V, k1=2, logits=True, bf16=True),
     ("logits_max", "logits_table", "logits_hist", "logits_resolve", "logits_resolve",
      "logits_chain", "logits_residual")),
    ("verify", dict(batch=22, v=V, k1=6, logits=True, bf16=True, top_k=False),
     ("logits_max", "logits_hist_groups", "logits_resolve", "logits_chain", "logits_residual")),
    # over more than 128 rows of bfloat16 logits logits_max counts the tiles and
    # logits_hist_groups takes the counts (test_residual_tiles_with_many_kept_tokens,
    # test_bf16_tiles_of_one_row_in_different_ranges at B = 64)
    ("verify", dict(batch=64, v=V, k1=3, logits=True, bf16=True),
     ("logits_max", "logits_hist_groups", "logits_resolve", "logits_resolve", "logits_chain",
      "logits_residual")),
    ("verify", dict(batch=21, v=V, k1=6, logits=True, bf16=True, top_k=False),
     ("logits_max", "logits_table", "logits_hist", "logits_resolve", "logits_chain",
      "logits_residual")),
]


@pytest.mark.parametrize("primitive, shape, kernels", ROUTES)
def test_routing_table(primitive, shape, kernels):
    assert routes.kernel_names(primitive, nsm=NSM, **shape) == kernels


@pytest.mark.parametrize("batch", [1, 2, 4, 8, 16, 32, 64])
@pytest.mark.parametrize("k1", [1, 6])
def test_logits_residual_grid_is_one_wave_where_the_tile_cap_allows(batch, k1):
    """logits_residual keeps 3 blocks per SM resident: its tiles give at most one wave of
    blocks over the batch's residual rows unless they are at the tile cap."""
    _, rt = routes.logits_tiles(V, batch, k1, NSM)
    assert rt % 1024 == 0 and rt <= routes.LOGITS_RESIDUAL_MAX_TILE
    assert batch * -(-V // rt) <= routes.LOGITS_RESIDUAL_PER_SM * NSM or (
        rt == routes.LOGITS_RESIDUAL_MAX_TILE)


@pytest.mark.parametrize("batch", [1, 2, 4, 16, 64, 65536])
@pytest.mark.parametrize("v", [1, 111, 4097, 32000, V, routes.LAZY_MAX_V])
def test_lazy_tiles_fit_the_kernel(batch, v):
    """verify_lazy's tiles: multiples of 1024 ids, at most 32768, at most 128 per row."""
    vt = routes.lazy_tile(v, batch, NSM)
    assert vt % 1024 == 0 and 1024 <= vt <= 32768 and -(-v // vt) <= 128


@pytest.mark.parametrize("batch", [1, 2, 4, 5, 16, 64])
@pytest.mark.parametrize("k1", [1, 2, 6, 9, 17])
@pytest.mark.parametrize("v", [1, 1000, 4097, 32000, V, 1 << 20])
def test_logits_one_launch_tiles_fit_the_kernel(batch, k1, v):
    """logits_one_launch: tiles of a multiple of 1024 ids, at most
    LOGITS_RESIDUAL_MAX_TILE (its last block holds one in shared memory), and only where
    1 + k1 x tiles blocks a request fit one wave at 3 blocks per SM."""
    rt = routes.logits_one_launch_tile(v, batch, k1, NSM)
    if rt == 0:
        return
    nrt = -(-v // rt)
    assert rt % 1024 == 0 and rt <= routes.LOGITS_RESIDUAL_MAX_TILE
    assert batch * (1 + k1 * nrt) <= routes.LOGITS_ONE_LAUNCH_PER_SM * NSM


def test_logits_one_launch_taken_at_small_batches():
    """At V = 129280 and k = 5 on 132 SMs: one launch up to B = 4, two launches from 5."""
    taken = [b for b in range(1, 65) if routes.logits_one_launch_tile(V, b, 6, NSM)]
    assert taken == [1, 2, 3, 4]


@pytest.mark.parametrize("batch", [1, 2, 4, 8, 32, 64])
@pytest.mark.parametrize("k1", [1, 2, 6, 8, 9])
@pytest.mark.parametrize("v", [1, 111, 4097, V, routes.LAZY_MAX_V + 1])
def test_one_launch_tiles_fit_the_kernel(batch, k1, v):
    """verify_one_launch: k + 1 <= 8 rows, V within the tile records; its own tiles only
    where its grid fits one wave at 3 blocks per SM, else verify_lazy's tiles."""
    vt = routes.one_launch_tile(v, batch, k1, NSM)
    if k1 > routes.ONE_LAUNCH_MAX_K1 or v > routes.LAZY_MAX_V:
        assert vt == 0
        return
    if vt == 0:
        assert batch * k1 * v > routes.ONE_LAUNCH_MAX_ELEMENTS
        return
    nt = -(-v // vt)
    assert vt % 1024 == 0 and nt <= 128
    assert (vt <= routes.ONE_LAUNCH_MAX_TILE and batch * (1 + k1 * nt) <= 3 * NSM) or (
        vt == routes.lazy_tile(v, batch, NSM))


@pytest.mark.parametrize("batch", [1, 4, 16, 21, 22, 64, 256, 2048])
@pytest.mark.parametrize("bf16", [True, False])
def test_logits_hist_groups(batch, bf16):
    """logits_hist's blocks per row: a tile each unless the call's tiles are counted; then
    between 1 and the tiles, as many as fit one wave of LOGITS_HIST_PER_SM per SM."""
    v, k1 = 129280, 6
    rows = batch * k1
    tile, _ = routes.logits_tiles(v, batch, k1, NSM)
    nt = -(-v // tile)
    ng = routes.logits_hist_groups(nt, rows, NSM, bf16)
    if not routes.logits_counted(rows, bf16):
        assert ng == nt
    else:
        assert 1 <= ng <= nt
        assert ng == 1 or ng * rows <= routes.LOGITS_HIST_PER_SM * NSM


def test_the_value_table_constants_agree_with_the_kernels():
    """The plan launches logits_table exactly where logits_max leaves the tables to it
    (LG_TABLE_ROWS), over a grid of LG_TE / 256 blocks a row, the tables it allocates
    hold LG_TABW words a row, and its longest tile fits the value cut's tile read
    (LG_VROWS): the Python copies of the kernel source's constants."""
    import glob
    import os
    import re
    from dyadic.backends.cuda.cupy import plans, runtime
    src = "".join(open(f).read() for f in sorted(
        glob.glob(os.path.join(runtime.KERNEL_DIR, "*logits*.cuh"))))

    def define(name):
        return int(re.search(r"^#define %s \(?(\d+)" % name, src, re.M).group(1))
    assert routes.LOGITS_TABLE_ROWS == define("LG_TABLE_ROWS")
    assert plans.LG_TE == 2 * define("LG_BIN") * 128  # LG_TE = 2 x LG_BIN x 128
    # a row's value table: LG_TE entries of W, key (8 bytes each) and bucket (2), in words
    entry = int(re.search(r"^#define LG_TABW \(LG_TE \* (\d+) / 8\)", src, re.M).group(1))
    assert plans.LG_TABW == plans.LG_TE * entry // 8 == plans.LG_TE * (8 + 8 + 2) // 8
    # logits_hist's value cut reads a tile as at most LG_VROWS rows of 256 words of 8
    # tokens: every tile of the passes fits
    assert define("LG_VROWS") * 256 * 8 == routes.LOGITS_MAX_TILE
    # a tile's record: LG_TE 16-bit counts, the header, LG_OTH 16-bit listed tokens
    assert plans.LG_TCW == plans.LG_TE // 2 + 1 + define("LG_OTH") // 2
    # a residual tile keeps up to LG_RL listed tokens (the plan's scratch holds as many)
    assert plans.LG_RL == define("LG_RL")
    # its counts are 16 bits: a tile holds fewer than 65536 tokens
    assert routes.LOGITS_MAX_TILE < 1 << 16
    # logits_max counts a call's tiles exactly where routes says (lg_counted)
    assert re.search(r"return dt == 2 && !greedy && rows > LG_TABLE_ROWS;", src)
    assert routes.logits_counted(routes.LOGITS_TABLE_ROWS + 1, True)
    assert not routes.logits_counted(routes.LOGITS_TABLE_ROWS, True)
    assert not routes.logits_counted(10**6, False)
    assert routes.logits_table_launched(routes.LOGITS_TABLE_ROWS, True)
    assert not routes.logits_table_launched(routes.LOGITS_TABLE_ROWS + 1, True)
    assert not routes.logits_table_launched(1, False)


@pytest.mark.parametrize("rows", [1, 65535, 65536, 100001, 2**31 - 1])
def test_row_grid_covers_every_row(rows):
    """Rows over grid y and z, each at most 65535, with fewer than z rows past the end."""
    nx, y, z = routes.rgrid(7, rows)
    assert nx == 7 and y <= routes.GRID_YZ and z <= routes.GRID_YZ
    assert rows <= y * z < rows + z


@pytest.mark.parametrize("method", ["verify", "verify_plain", "verify_lazy"])
def test_too_deep_draft_is_refused(method):
    from dyadic.backends.cuda.cupy import CupyBackend
    k = args.MAX_K_VERIFY + 1
    target = np.zeros((2, k + 1, 8), dtype=np.float32)
    draft = np.zeros((2, k), dtype=np.int32)
    greedy = () if method == "verify_lazy" else (np.zeros(2, np.uint8),)
    with pytest.raises(ValueError, match=rf"draft: backend 'cuda' verifies at most "
                                         rf"{args.MAX_K_VERIFY} draft tokens per "
                                         rf"request, got k={k}"):
        getattr(CupyBackend(), method)(target, draft, None, None, *greedy, 0, 0, 0, 0,
                                       None, None, None)


def test_deepest_draft_passes_the_limit():
    """k = the limit is not refused by the limit (without a device it fails later)."""
    k = args.MAX_K_VERIFY
    target = np.zeros((1, k + 1, 8), dtype=np.float32)
    try:
        args.verify_setup(target, None, 0, 0, 0, 0, (), ())
    except Exception as exc:  # noqa: BLE001 - no CuPy / no GPU here: any error but the limit
        assert "verifies at most" not in str(exc)


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
    ptrs, fmt = args.keys(call, *fields, batch)
    (packed,) = seen
    assert packed.dtype == np.uint64 and packed.shape == (4, batch)
    for row, f in zip(packed, fields):
        assert row.tolist() == np.broadcast_to(f.astype(np.uint64), (batch,)).tolist()
    assert [int(p) for p in ptrs] == [0x10000 + 8 * batch * j for j in range(4)]
    assert fmt == 0b01010101


class _DeviceArray:
    """A stand-in device array: ``__cuda_array_interface__`` only (no memory behind it;
    args.keys reads no data)."""

    def __init__(self, shape, typestr, ptr=0x2000, strides=None):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (ptr, False),
                                         "strides": strides, "version": 3}


def _no_upload(a):
    raise AssertionError("nothing is uploaded for device key arrays")


@pytest.mark.parametrize("batch", [1, 3])
def test_device_key_arrays_read_in_place(batch):
    """Device key arrays: their own pointers; per field 2 format bits, bit 0 for 8-byte
    words, bit 1 for a length-1 field of a batch other than 1."""
    fields = (_DeviceArray((batch,), "<u8", 0x1000), _DeviceArray((1,), "<i4", 0x2000),
              _DeviceArray((batch,), "<u4", 0x3000), _DeviceArray((1,), "<i8", 0x4000))
    ptrs, fmt = args.keys(_no_upload, *fields, batch)
    assert ptrs == [0x1000, 0x2000, 0x3000, 0x4000]
    one = 0b10 if batch != 1 else 0
    assert fmt == 0b01 | one << 2 | 0b00 << 4 | (0b01 | one) << 6


BAD_KEY_ARRAYS = [  # (array for a batch of 3, exception, message)
    (_DeviceArray((3,), "<f4"), TypeError, "dtype float32 is not supported; device key arrays "
                                           "need 4- or 8-byte integers"),
    (_DeviceArray((3,), "<f8"), TypeError, "dtype float64 is not supported"),
    (_DeviceArray((3,), "<i2"), TypeError, "dtype int16 is not supported"),
    (_DeviceArray((3,), "|b1"), TypeError, "dtype bool is not supported"),
    (_DeviceArray((2,), "<i8"), ValueError, "length 2 does not match the batch 3"),
    (_DeviceArray((4,), "<u4"), ValueError, "length 4 does not match the batch 3"),
    (_DeviceArray((3,), "<i8", strides=(16,)), ValueError, r"strides \(16,\); device key "
                                                           "arrays must be contiguous"),
    (np.zeros(3, np.float32), TypeError, "dtype float32 is not an integer dtype"),
    (np.zeros(2, np.uint64), ValueError, "length 2 does not match the batch 3"),
    ([1, 2, 3], TypeError, "expected a device array or a NumPy array, got list"),
]


@pytest.mark.parametrize("field", range(4))
@pytest.mark.parametrize("bad,exc,msg", BAD_KEY_ARRAYS)
def test_backend_refuses_key_arrays_it_cannot_read(field, bad, exc, msg):
    """args.keys (the cuda backend's only check of key arrays) refuses, naming the field,
    every key array the kernels could not read as 1 or B integer words of 4 or 8 bytes,
    before anything is uploaded."""
    fields = [_DeviceArray((3,), "<i8", 0x1000 * (j + 1)) for j in range(4)]
    fields[field] = bad
    name = args.KEY_FIELDS[field]
    with pytest.raises(exc, match=f"keys.{name}: {msg}"):
        args.keys(_no_upload, *fields, 3)


def test_host_and_device_key_fields_together():
    """NumPy fields beside device ones go up in one upload (one uint64 row each); the
    device ones are read in place."""
    seen = []

    def call(a):
        seen.append(a.copy())
        return 0x10000

    fields = (np.array([5], np.uint64), _DeviceArray((3,), "<i4", 0x2000),
              np.array([1, 2, 3], np.uint32), _DeviceArray((1,), "<u8", 0x4000))
    ptrs, fmt = args.keys(call, *fields, 3)
    (packed,) = seen
    assert packed.tolist() == [[5, 5, 5], [1, 2, 3]]
    assert ptrs == [0x10000, 0x2000, 0x10000 + 8 * 3, 0x4000]
    assert fmt == 0b01 | 0b00 << 2 | 0b01 << 4 | 0b11 << 6


def test_backend_refuses_host_torch_key_tensors():
    """A CPU tensor given to the backend directly is refused (the kernels would read its
    host address); dyadic.propose / draw / verify validate such fields as host data."""
    torch = pytest.importorskip("torch")
    fields = [torch.zeros(3, dtype=torch.int64) for _ in range(4)]
    with pytest.raises(TypeError, match="keys.seed: a cpu tensor"):
        args.keys(_no_upload, *fields, 3)
