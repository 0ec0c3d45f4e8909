"""Which kernels serve a call, and their tiles: pure functions of the call's shape.

Every function here depends only on its arguments (the number of SMs is one), so the
routing table is testable without a GPU (tests/gpu/test_cuda_routes.py) and the same
configuration always takes the same kernels.  Results never depend on the route: every
route computes the reference's integers bit for bit (tests/gpu/test_gpu_parity.py);
the routes differ only in speed.  docs/architecture.md gives the table in prose.

Routes (kernel names of backends/cuda/kernels/):

- top-k allocate / propose, top_k <= ONEPASS_MAX_K: one launch of ``topk_onepass``
  (tiles of 4096 ids) where its grid is small or a bias is added to logits, else
  ``topk_onepass_wide`` (tiles of up to 8192 ids); for bfloat16 / float16 logits
  without bias on 16-byte loads ``topk_onepass_packed8k / 16k / 32k`` in the wide
  kernel's place.  top_k > ONEPASS_MAX_K: ``topk_select``.  With top_p / min_p / a
  per-row top_k the same kernels (their last block applies the filters).
- dense allocate / propose: ``dense_max``, ``dense_sum``, ``dense_floor``,
  ``dense_mark`` (then ``draw_rows`` for propose).  With top_p / min_p (no bias):
  ``logits_max``, ``logits_table`` (as verify's), ``logits_hist`` (as verify's),
  ``logits_resolve``, ``filter_mask``, the dense kernels over the masked copy,
  ``filter_status``.
- draw: ``draw_rows``.
- verify (check=False / True) without greedy requests: ``verify_one_launch`` where
  its grid fits (one_launch_tile), else ``verify_chain`` + ``verify_residual``; with
  greedy requests always the two launches (num_drafts does not change the route).
- verify, check="lazy", without greedy requests: ``verify_lazy`` (``verify_lazy_r64``
  when its grid exceeds one wave at 3 blocks per SM) for V <= LAZY_MAX_V; above, the
  check=False route (the contract allows it: results on valid input are identical).
- verify(logits=True), every check mode: ``logits_max``, ``logits_table`` (bfloat16
  logits over at most LOGITS_TABLE_ROWS rows), ``logits_hist`` (``logits_hist_groups``
  over more bfloat16 rows: logits_counted),
  ``logits_resolve`` (twice; once when the call gives no top_k), then
  ``logits_one_launch`` where its grid fits (logits_one_launch_tile), else
  ``logits_chain`` + ``logits_residual``.  A logits target is processed in full before any decision (its
  maximum, total and cuts depend on every token), so check="lazy" validates every row it
  uses, as check=False.
"""

# --- top-k -----------------------------------------------------------------------------
#: top_k up to this takes the one-launch kernels (their per-lane support of a warp).
ONEPASS_MAX_K = 32
#: threads of a one-pass block, ids per thread of topk_onepass / topk_onepass_wide
#: (PK_NT, PK_EPT, PW_EPT of topk_onepass*.cuh).
ONEPASS_THREADS = 512
ONEPASS_EPT = 8
WIDE_EPT = 16
#: candidate slots per tile (PK_CAP): a row's R tiles give R * 128 candidates, which the
#: last block merges from shared memory (at most ONEPASS_THREADS * ONEPASS_EPT).
ONEPASS_CAP = 128
#: grids of at most this many blocks take topk_onepass (B = 1 at V = 129280: 32 tiles);
#: larger grids take the wide kernel, whose halved tile count is faster there.
ONEPASS_SMALL_GRID = 32
#: the packed kernels' tiles; the smallest whose grid fits one wave of 2 blocks per SM
#: is taken, else the largest.
PACKED_TILES = (8192, 16384, 32768)
PACKED_KERNELS = ("topk_onepass_packed8k", "topk_onepass_packed16k", "topk_onepass_packed32k")
#: topk_select: tiles of 2048 ids; rank counting (top_k <= 64) up to batch 16, radix
#: select above (the faster of the two at each batch on the H200; the same results).
SELECT_TILE = 2048
SELECT_RANK_MAX_K = 64
SELECT_RANK_MAX_BATCH = 16
#: the largest sparse width of a filtered call (top_p / min_p / per-row top_k): the last
#: block ranks its support by counting, top_k**2 / 256 comparisons per thread.
FILTER_MAX_K = 1024

# --- verify ----------------------------------------------------------------------------
#: the one-launch verify kernels' tile records hold at most 128 tiles of at most 32768 ids.
LAZY_MAX_V = 128 * 32768
#: verify_one_launch takes k + 1 <= 8 rows per request (VA_MAXK1 of its kernel).
ONE_LAUNCH_MAX_K1 = 8
#: verify_one_launch's own tiles are used up to this size; beyond, verify_lazy's tiles
#: while B x (k + 1) x V <= ONE_LAUNCH_MAX_ELEMENTS (it reads every q row too: from about
#: B = 32 at k = 5, V = 129280 the two launches are faster).
ONE_LAUNCH_MAX_TILE = 8192
ONE_LAUNCH_MAX_ELEMENTS = 32 * 6 * 129280
#: verify_lazy's tiles: about 3 blocks per SM over the whole grid (one wave at the
#: kernel's register cap), at least 2048 ids (fewer tile records for the last block at
#: B = 1), at most 16384 (the fastest cap at B = 64).
LAZY_BLOCKS_PER_SM = 3
LAZY_MIN_TILE = 2048
LAZY_MAX_TILE = 16384
#: batches up to this prefetch the first tile of row 0 in verify_lazy.
LAZY_PREFETCH_MAX_BATCH = 16
#: entries of a row's list of ids whose selection needs the exact total (more: their
#: 64-id chunks are summed again in full; the results do not depend on it).
LAZY_LIST_CAP = 2048
#: verify_chain / verify_residual tiles: >= ~4 blocks per SM, at most 16384 / 8192 ids.
CHAIN_MAX_TILE = 16384
RESIDUAL_MAX_TILE = 8192

#: verify(logits=True): tiles of the per-row passes (~LOGITS_FEW_ROWS_PER_SM blocks per SM
#: over at most LOGITS_FEW_ROWS rows, else ~LOGITS_ROWS_PER_SM, and at most
#: LOGITS_MAX_TILE ids: a block has a cost besides its tokens, zeroing and merging a
#: 2048-bucket histogram into its row's and reading the 4096-value table, so past one
#: request's rows fewer, longer tiles take less time) and of the residual row
#: (~LOGITS_RESIDUAL_PER_SM blocks per SM, the most logits_residual keeps resident, so
#: that its grid is one wave where the tile cap allows; at most LOGITS_RESIDUAL_MAX_TILE:
#: its last block holds one tile in shared memory).
#: verify(logits=True) and the filtered dense allocate / propose over bfloat16 logits: over
#: at most LOGITS_TABLE_ROWS rows the rows' value tables are filled by ``logits_table``
#: (an entry a thread, over every SM), over more by logits_max's tails (each table on one
#: SM, the tails overlapping the other rows' passes).  LG_TABLE_ROWS of logits_common.cuh.
LOGITS_TABLE_ROWS = 128
LOGITS_MAX_TILE = 32768  # < 65536: logits_hist stores a tile's counts per value in 16 bits
LOGITS_FEW_ROWS = 8
LOGITS_FEW_ROWS_PER_SM = 4
LOGITS_ROWS_PER_SM = 2
LOGITS_RESIDUAL_MAX_TILE = 8192
LOGITS_RESIDUAL_PER_SM = 3  # logits_residual's __launch_bounds__(256, 3)
#: logits_one_launch (logits_chain's block and every row's residual tile pass in one grid)
#: while 1 + (k + 1) x tiles blocks a request fit one wave at this many blocks per SM
#: (its registers and shared memory allow 3), with tiles of at most
#: LOGITS_RESIDUAL_MAX_TILE ids; beyond, summing every row's tiles costs more than the
#: chain's launch it overlaps.
LOGITS_ONE_LAUNCH_PER_SM = 3

#: the largest grid y and z dimension.
GRID_YZ = 65535


def rgrid(nx, rows):
    """The grid (nx, y, z) of a kernel with one row (request) per grid y index and nx
    blocks per row: rows over y and z (each at most 65535; dc_grid_row in the kernels),
    z = ceil(rows / 65535), y = ceil(rows / z): the y * z - rows < z extra blocks of each
    x end at once (the kernel's row count argument)."""
    if rows <= GRID_YZ:
        return (nx, rows, 1)
    z = -(-rows // GRID_YZ)
    return (nx, -(-rows // z), z)


def ceil_1024(n):
    """``n`` rounded up to a multiple of 1024 (the kernels' tiles)."""
    return -(-n // 1024) * 1024


def tile_for(v, rows, nsm, cap, per_sm=4):
    """A tile length (a multiple of 1024, at most ``cap``) giving ~``per_sm`` blocks per
    SM over ``rows`` rows of ``v`` ids."""
    want = max(1, int(-(-per_sm * nsm // max(rows, 1))))
    return max(1024, min(cap, ceil_1024(-(-v // want))))


def one_wave_tile(v, per_row, min_tile, cap):
    """The tile of a one-launch grid whose requests have room for ``per_row`` tiles a row:
    the most tiles a row (at most ``per_row``, each of at least ``min_tile`` ids), their
    length rounded up to a multiple of 1024; 0 where not one fits (``per_row`` < 1) or
    that length passes ``cap``."""
    if per_row < 1:
        return 0
    t = ceil_1024(-(-v // min(-(-v // min_tile), per_row)))
    return t if t <= cap else 0


# --- allocate / propose ----------------------------------------------------------------
def alloc_route(top_k, batch, v, bias_on_logits, packed16):
    """The kernel family of an allocate / propose: "onepass", "wide", "select" or
    "dense".  ``bias_on_logits``: a bias is added to logits (topk_onepass_wide reads no
    bias); ``packed16``: 16-bit logits without bias (the wide kernels at every batch,
    where the packed kernels take over).  A call with top_p / min_p / a per-row top_k
    takes the route of the same call without them: every sparse kernel's last block
    applies the filters to its ranked support."""
    if not top_k:
        return "dense"
    if top_k > ONEPASS_MAX_K:
        return "select"
    tiles = -(-v // (ONEPASS_THREADS * ONEPASS_EPT))
    wide_fits = -(-v // (ONEPASS_THREADS * WIDE_EPT)) * ONEPASS_CAP <= ONEPASS_THREADS * ONEPASS_EPT
    if (not bias_on_logits and (batch * tiles > ONEPASS_SMALL_GRID or packed16) and wide_fits):
        return "wide"
    if tiles * ONEPASS_CAP <= ONEPASS_THREADS * ONEPASS_EPT:
        return "onepass"
    return "select"


def onepass_tile(route, v):
    """The tile length of topk_onepass ("onepass") or topk_onepass_wide ("wide")."""
    if route == "onepass":
        return ONEPASS_THREADS * ONEPASS_EPT
    return ONEPASS_THREADS * WIDE_EPT


def packed_choice(batch, v, nsm):
    """The index into PACKED_TILES / PACKED_KERNELS of the packed kernel taken: the
    smallest tile whose grid fits one wave of 2 blocks per SM, else the largest."""
    for i, tile in enumerate(PACKED_TILES):
        if -(-v // tile) * batch <= 2 * nsm:
            return i
    return len(PACKED_TILES) - 1


def wide_vector_loads(v, x16):
    """Whether topk_onepass_wide / the packed kernels can read x's rows in 16-byte words:
    V a multiple of 8 ids (4 for float32); x's pointer 16-byte aligned is checked per call."""
    return v % (8 if x16 else 4) == 0


def packed_taken(x16, bias, logits):
    """16-bit logits without bias take the packed kernels in topk_onepass_wide's place
    (on 16-byte loads)."""
    return bool(x16 and not bias and logits)


def select_rank_counting(top_k, batch):
    """True where topk_select ranks by counting (else radix select)."""
    return top_k <= SELECT_RANK_MAX_K and batch <= SELECT_RANK_MAX_BATCH


def dense_tile(v, batch, nsm):
    """The dense kernels' tile: one wave of <= 4 blocks per SM (64 registers each)."""
    want = max(1, (4 * nsm) // max(batch, 1))
    return max(1024, ceil_1024(-(-v // want)))


# --- verify ----------------------------------------------------------------------------
def verify_route(batch, k1, v, nsm, greedy, lazy):
    """The verify kernels of a call: "lazy" (verify_lazy / _r64), "one_launch" or
    "two_launch" (verify_chain + verify_residual).  ``greedy``: greedy flags given.
    num_drafts does not enter: every route reads it and skips the rows beyond a
    request's count."""
    if greedy:
        return "two_launch"
    if lazy and v <= LAZY_MAX_V:
        return "lazy"
    return "one_launch" if one_launch_tile(v, batch, k1, nsm) else "two_launch"


def lazy_tile(v, batch, nsm):
    """verify_lazy's tile length: about LAZY_BLOCKS_PER_SM blocks per SM, at least
    LAZY_MIN_TILE ids, at most LAZY_MAX_TILE, and at most 128 tiles per row."""
    return max(LAZY_MIN_TILE, tile_for(v, batch, nsm, LAZY_MAX_TILE, LAZY_BLOCKS_PER_SM),
               -(-v // (128 * 1024)) * 1024)


def lazy_kernel(ntiles, batch, nsm):
    """verify_lazy (80 registers, 3 blocks per SM) while its grid fits one wave at 3
    blocks per SM, else verify_lazy_r64 (64 registers, 4 blocks per SM): each the faster
    of the two where it is taken."""
    return "verify_lazy_r64" if ntiles * batch > 3 * nsm else "verify_lazy"


def one_launch_tile(v, batch, k1, nsm):
    """verify_one_launch's tile length, or 0 where the two launches are taken: the most
    tiles per row, of at least LAZY_MIN_TILE ids, with 1 + (k + 1) x tiles blocks per
    request within one wave at 3 blocks per SM, if that makes tiles of at most
    ONE_LAUNCH_MAX_TILE ids; else verify_lazy's tiles while B x (k + 1) x V <=
    ONE_LAUNCH_MAX_ELEMENTS."""
    if k1 > ONE_LAUNCH_MAX_K1 or v > LAZY_MAX_V:
        return 0
    vt = one_wave_tile(v, min((3 * nsm // batch - 1) // k1, 128), LAZY_MIN_TILE,
                       ONE_LAUNCH_MAX_TILE)
    if vt:
        return vt
    return lazy_tile(v, batch, nsm) if batch * k1 * v <= ONE_LAUNCH_MAX_ELEMENTS else 0


def chain_tiles(v, batch, k1, nsm):
    """(verify_chain's tile, verify_residual's tile)."""
    return (tile_for(v, batch * k1, nsm, CHAIN_MAX_TILE),
            tile_for(v, batch, nsm, RESIDUAL_MAX_TILE))


def logits_tiles(v, batch, k1, nsm):
    """(the per-row passes' tile, logits_residual's tile) of verify(logits=True) over
    ``batch`` requests of ``k1`` target rows (allocate / propose with top_p / min_p: k1 =
    1)."""
    rows = batch * k1
    per_sm = LOGITS_FEW_ROWS_PER_SM if rows <= LOGITS_FEW_ROWS else LOGITS_ROWS_PER_SM
    return (tile_for(v, rows, nsm, LOGITS_MAX_TILE, per_sm),
            tile_for(v, batch, nsm, LOGITS_RESIDUAL_MAX_TILE, LOGITS_RESIDUAL_PER_SM))


def logits_one_launch_tile(v, batch, k1, nsm):
    """logits_one_launch's tile length over ``batch`` requests of ``k1`` target rows, or 0
    where logits_chain + logits_residual are taken: the most tiles per row (a multiple of
    1024 ids each) with 1 + k1 x tiles blocks a request within one wave at
    LOGITS_ONE_LAUNCH_PER_SM blocks per SM, if that makes tiles of at most
    LOGITS_RESIDUAL_MAX_TILE ids."""
    return one_wave_tile(v, (LOGITS_ONE_LAUNCH_PER_SM * nsm // max(batch, 1) - 1) // k1, 1024,
                         LOGITS_RESIDUAL_MAX_TILE)


#: Over more than LOGITS_TABLE_ROWS rows of bfloat16 logits logits_max counts each
#: sampled tile per value as it reads it (lg_counted) and logits_hist reads those counts
#: instead of the logits: a block then takes the counts of several tiles, as many blocks
#: a row as LOGITS_HIST_PER_SM blocks per SM give over the rows (one wave).  Over fewer
#: rows the count costs logits_max more than it saves logits_hist.
LOGITS_HIST_PER_SM = 4


def logits_counted(rows, bf16):
    """Whether logits_max counts the tiles of a call over ``rows`` rows of logits (bf16:
    bfloat16, the only ones counted); lg_counted of logits_max.cuh."""
    return bool(bf16) and rows > LOGITS_TABLE_ROWS


def logits_hist_groups(nt, rows, nsm, bf16):
    """logits_hist's blocks per row (groups of consecutive tiles) over ``rows`` rows of
    ``nt`` tiles: a tile each unless logits_max counts them (logits_counted; the kernel
    is then ``logits_hist_groups``)."""
    if not logits_counted(rows, bf16):
        return nt
    return max(1, min(nt, LOGITS_HIST_PER_SM * nsm // rows))


def logits_table_launched(rows, bf16):
    """Whether ``logits_table`` fills the value tables of ``rows`` rows of logits (bf16:
    bfloat16 logits, the only ones with tables)."""
    return bool(bf16) and rows <= LOGITS_TABLE_ROWS


def logits_rows_kernels(rows, bf16):
    """The kernels before logits_resolve over ``rows`` rows of logits."""
    table = ("logits_table",) if logits_table_launched(rows, bf16) else ()
    hist = "logits_hist_groups" if logits_counted(rows, bf16) else "logits_hist"
    return ("logits_max",) + table + (hist,)


def kernel_names(primitive, **shape):
    """The kernels a call launches, in order (the routing table): ``primitive`` one of
    "allocate", "propose", "draw", "verify"; ``shape``: batch, v, nsm and top_k, x16
    (16-bit logits), bias, aligned (a 16-byte aligned x pointer), filtered (top_p /
    min_p / a per-row top_k: only a dense support's kernels differ) and bf16 (bfloat16
    logits, with filtered) for allocate / propose; k1, greedy, lazy, ragged (num_drafts
    given: the same kernels as without), logits (a logits target), bf16 (a bfloat16
    target, with logits) and top_k (with logits: a top_k given, default True) for verify."""
    b, v, nsm = shape["batch"], shape["v"], shape["nsm"]
    if primitive == "draw":
        return ("draw_rows",)
    if primitive in ("allocate", "propose"):
        logits = primitive == "propose" or shape.get("logits", False)
        bias, x16 = shape.get("bias", False), shape.get("x16", False)
        route = alloc_route(shape.get("top_k") or 0, b, v, bias and logits,
                            not bias and logits and x16)
        if route == "dense":
            names = ("dense_max", "dense_sum", "dense_floor", "dense_mark")
            names += ("draw_rows",) if primitive == "propose" else ()
            if shape.get("filtered", False):
                names = logits_rows_kernels(b, shape.get("bf16", False)) + (
                    "logits_resolve", "filter_mask") + names + ("filter_status",)
            return names
        if route == "select":
            return ("topk_select",)
        if (route == "wide" and packed_taken(x16, bias, logits) and shape.get("aligned", True)
                and wide_vector_loads(v, x16)):
            return (PACKED_KERNELS[packed_choice(b, v, nsm)],)
        return ("topk_onepass" if route == "onepass" else "topk_onepass_wide",)
    if shape.get("logits", False):
        resolve = ("logits_resolve",) * (2 if shape.get("top_k", True) else 1)
        last = (("logits_one_launch",) if logits_one_launch_tile(v, b, shape["k1"], nsm)
                else ("logits_chain", "logits_residual"))
        return logits_rows_kernels(b * shape["k1"], shape.get("bf16", False)) + resolve + last
    route = verify_route(b, shape["k1"], v, nsm, shape.get("greedy", False),
                         shape.get("lazy", False))
    if route == "lazy":
        return (lazy_kernel(-(-v // lazy_tile(v, b, nsm)), b, nsm),)
    if route == "one_launch":
        return ("verify_one_launch",)
    return ("verify_chain", "verify_residual")
