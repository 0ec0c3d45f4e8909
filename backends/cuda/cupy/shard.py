"""Per-shard work of dyadic.distributed on the device: the functions of
``backends/cpu/_shard.pyx`` with the same names, arguments and results (bit for
bit), on CuPy arrays, over the kernels of ``backends/cuda/kernels/shard.cu``.

Each function works on a whole batch of one rank: the arrays of this rank's
shard (ids [offset, offset + n) of a vocabulary of size V) or the arrays
gathered from every rank (shards in id order, axis 0).  Inputs are
C-contiguous CuPy arrays of the stated dtypes on the current device, outputs
are preallocated CuPy arrays; dtypes and shapes are checked here (TypeError /
ValueError naming the array, from host metadata only: nothing is read back
from the device).  Launches go to CuPy's current stream.  The kernels never
trust these checks for memory safety: every id they index memory with is
bounds-checked there (a bad row gets a status code or its defaults).

One difference from the host functions: ``residual_mass`` / ``residual_find``
do not read ``draw_at`` on the host, so a draw position outside [-1, k]
(never produced by ``verify_accept``) is not a ValueError here; the kernels
leave such a row at its defaults (mass 0, token -1).
"""

import hashlib
import os

import numpy as np

from . import runtime

THREADS = 256  # SH_THREADS of shard.cu
_MAX_VOCAB = 1 << 24
_SOURCE = os.path.join(runtime.KERNEL_DIR, "shard.cu")
_MODULES = {}
_FUNCS = {}
_DUMMY = {}


def source():
    """shard.cu after a first line holding the SHA-256 of it and of every header it can
    include (the shared integer core): CuPy's kernel cache keys on the source text."""
    digest = hashlib.sha256()
    folder = runtime.include_dir()
    for path in [_SOURCE] + [os.path.join(folder, n) for n in sorted(os.listdir(folder))
                             if n.endswith(".h")]:
        with open(path, "rb") as f:
            digest.update(os.path.basename(path).encode() + b"\0" + f.read() + b"\0")
    with open(_SOURCE) as f:
        return f"// shard sha256 {digest.hexdigest()}\n" + f.read()


def module():
    """The compiled shard module of the current device (compiled once per device)."""
    cp = runtime.cupy()
    dev = runtime.device_id()
    mod = _MODULES.get(dev)
    if mod is None:
        mod = cp.RawModule(code=source(), options=(
            "--fmad=false", "--ftz=false", "--prec-div=true", "--prec-sqrt=true",
            "--std=c++17", "-I" + runtime.include_dir(), "-I" + runtime.KERNEL_DIR))
        mod.compile()
        _MODULES[dev] = mod
    return mod


def _fn(name):
    dev = runtime.device_id()
    fn = _FUNCS.get((dev, name))
    if fn is None:
        fn = module().get_function(name)
        _FUNCS[(dev, name)] = fn
    return fn


def _dummy():
    """A one-word device array passed where a kernel's optional input is absent."""
    dev = runtime.device_id()
    d = _DUMMY.get(dev)
    if d is None:
        d = runtime.cupy().zeros(2, dtype=np.uint64)
        _DUMMY[dev] = d
    return d


def _arr(name, a, dtype, shape=None, ndim=None):
    cp = runtime.cupy()
    if not isinstance(a, cp.ndarray):
        raise TypeError(f"{name}: expected a CuPy array, got {type(a).__name__}")
    if a.dtype != np.dtype(dtype):
        raise TypeError(f"{name}: dtype {a.dtype}; expected {np.dtype(dtype)}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name}: must be C-contiguous")
    if a.device.id != runtime.device_id():
        raise ValueError(f"{name}: on device {a.device.id}, not the current device "
                         f"{runtime.device_id()}")
    if ndim is not None and a.ndim != ndim:
        raise ValueError(f"{name}: shape {a.shape} must have {ndim} dimensions")
    if shape is not None and tuple(a.shape) != tuple(shape):
        raise ValueError(f"{name}: shape {tuple(a.shape)} must be {tuple(shape)}")
    return a


def _shard(offset, n, vocab):
    if not (1 <= vocab <= _MAX_VOCAB and 0 <= offset and 0 <= n and offset + n <= vocab):
        raise ValueError(f"vocab_offset: shard [{offset}, {offset + n}) is not inside "
                         f"[0, {vocab}) (vocab_size in [1, 2**24])")


def _rows(B, per=128):
    return ((B + per - 1) // per,), (per,)


def _i32(v):
    return np.int32(v)


def _u32(v):
    return np.uint32(v)


def _u64(v):
    return np.uint64(v)


def _bias(bias, B, n):
    """(array or dummy, has_bias, bias_rows) of an optional float32 [1 or B, n] bias."""
    if bias is None:
        return _dummy(), 0, 0
    _arr("bias", bias, np.float32, ndim=2)
    nb = bias.shape[0]
    if (nb != 1 and nb != B) or bias.shape[1] != n:
        raise ValueError(f"bias: shape ({nb}, {bias.shape[1]}) must be (1, {n}) or ({B}, {n})")
    return bias, 1, nb


def topk(x, bias, temperature, greedy, k, offset, vocab, payload):
    """This rank's candidates, one payload row per request (dy_shard_topk_row).

    x: float32 [B, n] logits of ids [offset, offset + n); bias: float32 [1 or
    B, n] or None; temperature: float64 [B] (1.0 for greedy rows); greedy:
    uint8 [B] (a greedy row sends its top 1).  payload: int32 [B, 1 + k * c]
    with c = 3 with a bias else 2: status, then k x bits, (k bias bits,) k
    global ids; unused entries -1."""
    cp = runtime.cupy()
    _arr("x", x, np.float32, ndim=2)
    B, n = x.shape
    ncol = 2 if bias is None else 3
    _shard(offset, n, vocab)
    if k < 1:
        raise ValueError(f"top_k: {k} must be >= 1")
    _arr("temperature", temperature, np.float64, (B,))
    _arr("greedy", greedy, np.uint8, (B,))
    _arr("payload", payload, np.int32, (B, 1 + k * ncol))
    bv, has_bias, nb = _bias(bias, B, n)
    if B == 0:
        return
    keys = cp.empty(B * max(n, 1), dtype=np.uint64)
    _fn("sh_topk")((B,), (THREADS,), (
        x, bv, _i32(has_bias), _i32(nb), temperature, greedy, _i32(k), _u32(n), _u32(offset),
        _u32(vocab), _i32(ncol), payload, keys, _i32(B)))


def merge(g, has_bias, k, temperature, greedy, policy, vocab, width, seed, generation, round,
          position, tokens, counts, ids, status, alloc_status):
    """Every rank's merge of the gathered payloads g: int32 [S, B, 1 + k * c]
    (shards in id order) into the sparse q and the tokens (dy_shard_merge_row).

    status [B]: the first shard's non-zero payload status, else the merge's
    X_ZERO_MASS / SHARD_INVALID; alloc_status [B]: the allocation's status
    (rows whose status is set have no allocation).  tokens int32 [B],
    counts uint32 [B, width], ids int32 [B, width]."""
    cp = runtime.cupy()
    _arr("g", g, np.int32, ndim=3)
    S, B = g.shape[0], g.shape[1]
    ncol = 3 if has_bias else 2
    _arr("g", g, np.int32, (S, B, 1 + k * ncol))
    if not 1 <= vocab <= _MAX_VOCAB or not 1 <= width <= vocab or k < 1:
        raise ValueError(f"width: {width} must be in [1, vocab_size={vocab}] and k={k} >= 1")
    if policy not in (0, 1):
        raise ValueError(f"policy: unknown policy code {policy!r}")
    for name, arr, dt in (("temperature", temperature, np.float64), ("greedy", greedy, np.uint8),
                          ("seed", seed, np.uint64), ("generation", generation, np.uint32),
                          ("round", round, np.uint32), ("position", position, np.uint32),
                          ("tokens", tokens, np.int32), ("status", status, np.int32),
                          ("alloc_status", alloc_status, np.int32)):
        _arr(name, arr, dt, (B,))
    _arr("counts", counts, np.uint32, (B, width))
    _arr("ids", ids, np.int32, (B, width))
    if B == 0:
        return
    m = S * k
    ws_words = 3 * width + 2 * ((width + 1) // 2)
    cand = cp.empty(B * 3 * max(m, 1), dtype=np.int32)
    ws = cp.empty(B * ws_words, dtype=np.uint64)
    _fn("sh_merge")(*_rows(B), (
        g, _i32(S), _i32(B), _i32(bool(has_bias)), _i32(k), temperature, greedy, _i32(policy),
        _u32(vocab), _u32(width), seed, generation, round, position, tokens, counts, ids, status,
        alloc_status, cand, ws, _u64(ws_words)))


def dense_weights(x, bias, temperature, zmax, rows, w, sums):
    """Dense propose: the integer weights of this shard's rows with rows[b] != 0
    (dy_shard_dense_weights): x float32 [B, n], bias float32 [1 or B, n] or
    None, temperature float64 [B], zmax float64 [B] (the global maximum z: at
    least every z of a flagged row); w uint64 [B, n], sums uint64 [B, 2] (sums
    of w >> 32 and w & (2**32 - 1)); rows without a flag get zeros."""
    _arr("x", x, np.float32, ndim=2)
    B, n = x.shape
    for name, arr, dt in (("temperature", temperature, np.float64), ("zmax", zmax, np.float64),
                          ("rows", rows, np.uint8)):
        _arr(name, arr, dt, (B,))
    _arr("w", w, np.uint64, (B, n))
    _arr("sums", sums, np.uint64, (B, 2))
    bv, has_bias, nb = _bias(bias, B, n)
    sums.fill(0)
    if B == 0 or n == 0:
        return
    # grid (B, blocks per row): about 16 ids per thread, at most 64 blocks per row
    by = max(1, min((n + 16 * THREADS - 1) // (16 * THREADS), 64))
    _fn("sh_dense_weights")((B, by), (THREADS,), (
        x, bv, _i32(has_bias), _i32(nb), temperature, zmax, rows, _i32(B), _u32(n), w, sums))


def target_summary(target, draft, qshard, greedy, offset, vocab, f, status):
    """Round-1 summaries of this shard (dy_shard_target_summary) for every
    (request, position): target float32 [B, k+1, n], draft int64 [B, k]
    (global ids), qshard uint32 [B, k, n] (this rank's DyadicShard counts) or
    None, greedy uint8 [B] (the argmax fields are computed for greedy requests
    only); f int64 [B, k+1, 9]; status int32 [B] (a bad draft id or shard)."""
    cp = runtime.cupy()
    _arr("target", target, np.float32, ndim=3)
    B, K1, n = target.shape
    K = K1 - 1
    _shard(offset, n, vocab)
    if K1 < 1:
        raise ValueError("target: needs k+1 >= 1 rows per request")
    _arr("draft", draft, np.int64, (B, K))
    _arr("f", f, np.int64, (B, K1, 9))
    _arr("status", status, np.int32, (B,))
    _arr("greedy", greedy, np.uint8, (B,))
    if qshard is not None:
        _arr("qshard", qshard, np.uint32, (B, K, n))
    if B == 0:
        return
    st = cp.empty((B, K1), dtype=np.int32)
    _fn("sh_target_summary")((B * K1,), (THREADS,), (
        target.view(np.uint32), draft, _dummy() if qshard is None else qshard,
        _i32(qshard is not None), greedy, _i32(B), _i32(K1), _u32(n), _u32(offset), _u32(vocab),
        f, st))
    # each request's first non-zero status over its positions (as the host loop keeps)
    nz = st != 0
    first = nz.argmax(axis=1)
    status[...] = cp.where(nz.any(axis=1), st[cp.arange(B), first], 0).astype(np.int32)


def verify_check(gf, cd, greedy, total, pd, best, status):
    """Validation on the gathered summaries gf int64 [S, B, k+1, 9]
    (dy_shard_verify_check): cd uint32 [B, k] = q(d); outputs T uint64
    [B, k+1], P_d uint64 [B, k], the global argmax int32 [B, k+1], status."""
    _arr("gf", gf, np.int64, ndim=4)
    S, B, K1 = gf.shape[:3]
    K = K1 - 1
    if S < 1 or K1 < 1 or gf.shape[3] != 9:
        raise ValueError(f"gf: shape {gf.shape} must be (S >= 1, B, k+1, 9)")
    _arr("cd", cd, np.uint32, (B, K))
    _arr("greedy", greedy, np.uint8, (B,))
    _arr("total", total, np.uint64, (B, K1))
    _arr("pd", pd, np.uint64, (B, K))
    _arr("best", best, np.int32, (B, K1))
    _arr("status", status, np.int32, (B,))
    if B == 0:
        return
    _fn("sh_verify_check")(*_rows(B), (gf, _i32(S), _i32(B), _i32(K1), cd, greedy, total, pd,
                                       best, status))


def verify_accept(draft, cd, total, pd, best, greedy, seed, generation, round, position,
                  accepted, tokens, draw_at, status):
    """Acceptance of validated requests (dy_shard_verify_accept): accepted
    int32 [B], tokens int32 [B, k+1], draw_at int32 [B] (the position whose
    token is drawn from the residual / P, -1 for greedy rows), status."""
    _arr("draft", draft, np.int64, ndim=2)
    B, K = draft.shape
    K1 = K + 1
    _arr("cd", cd, np.uint32, (B, K))
    _arr("total", total, np.uint64, (B, K1))
    _arr("pd", pd, np.uint64, (B, K))
    _arr("best", best, np.int32, (B, K1))
    _arr("tokens", tokens, np.int32, (B, K1))
    for name, arr, dt in (("greedy", greedy, np.uint8), ("seed", seed, np.uint64),
                          ("generation", generation, np.uint32), ("round", round, np.uint32),
                          ("position", position, np.uint32), ("accepted", accepted, np.int32),
                          ("draw_at", draw_at, np.int32), ("status", status, np.int32)):
        _arr(name, arr, dt, (B,))
    if B == 0:
        return
    _fn("sh_verify_accept")(*_rows(B), (draft, cd, total, pd, best, greedy, seed, generation,
                                        round, position, _i32(B), _i32(K), accepted, tokens,
                                        draw_at, status))


def _q_args(q_dense, q_offset, q_counts, q_ids, B, K, n):
    if q_dense is not None:
        if q_counts is not None or q_ids is not None:
            raise ValueError("q: pass a dense q or a sparse q, not both")
        _arr("q_dense", q_dense, np.uint32, ndim=3)
        if q_dense.shape[:2] != (B, K) or not (0 <= q_offset and q_offset + n <= q_dense.shape[2]):
            raise ValueError(f"q_dense: shape {q_dense.shape} must be ({B}, {K}, W) with "
                             f"q_offset + n = {q_offset + n} <= W")
    elif (q_counts is None) != (q_ids is None):
        raise ValueError("q_counts, q_ids: give both (sparse q) or neither")
    elif q_counts is not None:
        _arr("q_counts", q_counts, np.uint32, ndim=3)
        _arr("q_ids", q_ids, np.int32, ndim=3)
        if q_counts.shape[:2] != (B, K) or q_ids.shape != q_counts.shape:
            raise ValueError(f"q_counts, q_ids: shapes {q_counts.shape}, {q_ids.shape} must be "
                             f"({B}, {K}, w) and equal")


def _q_launch_args(target, draw_at, q_dense, q_offset, q_counts, q_ids, offset):
    """(qmode, q_dense or dummy, W, q_offset, qloc or dummy) of the residual kernels; a
    sparse q is expanded to this shard's dense rows first (sh_q_local)."""
    cp = runtime.cupy()
    B, K1, n = target.shape
    K = K1 - 1
    if q_dense is not None:
        return 1, q_dense, q_dense.shape[2], q_offset, _dummy()
    if q_counts is None or q_counts.shape[2] == 0 or n == 0 or K == 0:
        return 0, _dummy(), 0, 0, _dummy()
    qloc = cp.empty(B * n, dtype=np.uint32)
    _fn("sh_q_local")((B,), (THREADS,), (draw_at, q_counts, q_ids, _i32(q_counts.shape[2]),
                                         _i32(B), _i32(K), _u32(offset), _u32(n), qloc))
    return 2, _dummy(), 0, 0, qloc


def residual_mass(target, draw_at, q_dense, q_offset, q_counts, q_ids, offset, total, mass):
    """Round-2 masses of this shard (dy_shard_residual_mass) for the requests
    with draw_at[b] = j >= 0: the residual at j < k, P at j = k.

    target float32 [B, k+1, n]; q: dense uint32 [B, k, W] read at columns
    [q_offset, q_offset + n), or sparse q_counts uint32 / q_ids int32
    [B, k, w] (global ids), or neither (q = 0).  total uint64 [B, k+1]; mass
    int64 [B, 3] (0 for rows without a draw)."""
    _arr("target", target, np.float32, ndim=3)
    B, K1, n = target.shape
    K = K1 - 1
    _q_args(q_dense, q_offset, q_counts, q_ids, B, K, n)
    _shard(offset, n, max(offset + n, 1))
    _arr("draw_at", draw_at, np.int32, (B,))
    _arr("total", total, np.uint64, (B, K1))
    _arr("mass", mass, np.int64, (B, 3))
    if B == 0:
        return
    qmode, qd, W, qo, qloc = _q_launch_args(target, draw_at, q_dense, q_offset, q_counts, q_ids,
                                            offset)
    _fn("sh_residual_mass")((B,), (THREADS,), (
        target.view(np.uint32), draw_at, _i32(qmode), qd, _u64(W), _u64(qo), qloc, total,
        _i32(B), _i32(K), _u32(n), mass))


def residual_find(target, draw_at, q_dense, q_offset, q_counts, q_ids, offset, total, x_hi,
                  x_lo, token):
    """The owner's token (dy_shard_residual_find): for the rows with
    draw_at[b] = j >= 0, token[b] = offset + the first local id whose running
    mass exceeds x = x_hi * 2**64 + x_lo (-1 if the shard's mass is <= x);
    -1 for rows without a draw.  Arguments as residual_mass; token int64 [B]."""
    _arr("target", target, np.float32, ndim=3)
    B, K1, n = target.shape
    K = K1 - 1
    _q_args(q_dense, q_offset, q_counts, q_ids, B, K, n)
    _shard(offset, n, max(offset + n, 1))
    _arr("total", total, np.uint64, (B, K1))
    for name, arr, dt in (("draw_at", draw_at, np.int32), ("x_hi", x_hi, np.uint64),
                          ("x_lo", x_lo, np.uint64), ("token", token, np.int64)):
        _arr(name, arr, dt, (B,))
    if B == 0:
        return
    qmode, qd, W, qo, qloc = _q_launch_args(target, draw_at, q_dense, q_offset, q_counts, q_ids,
                                            offset)
    _fn("sh_residual_find")((B,), (THREADS,), (
        target.view(np.uint32), draw_at, _i32(qmode), qd, _u64(W), _u64(qo), qloc, total, x_hi,
        x_lo, _i32(B), _i32(K), _u32(n), _u32(offset), token))


def correction_pick(mass, draw_at, seed, generation, round, position, owner, rel_hi, rel_lo,
                    status):
    """The correction draw of every request with draw_at[b] = j >= 0 from the
    gathered masses int64 [S, B, 3] (dy_shard_correction_pick at position[b] + j):
    owner int32 [B] (the shard index in id order; -1 without a draw, -2 when
    the total mass is 0), X minus the mass before the owner as rel_hi * 2**64
    + rel_lo, status int32 [B] (RNG_EXHAUSTED)."""
    _arr("mass", mass, np.int64, ndim=3)
    S, B = mass.shape[0], mass.shape[1]
    if S < 1 or mass.shape[2] != 3:
        raise ValueError(f"mass: shape {mass.shape} must be (S >= 1, B, 3)")
    for name, arr, dt in (("draw_at", draw_at, np.int32), ("seed", seed, np.uint64),
                          ("generation", generation, np.uint32), ("round", round, np.uint32),
                          ("position", position, np.uint32), ("owner", owner, np.int32),
                          ("rel_hi", rel_hi, np.uint64), ("rel_lo", rel_lo, np.uint64),
                          ("status", status, np.int32)):
        _arr(name, arr, dt, (B,))
    if B == 0:
        return
    _fn("sh_correction_pick")(*_rows(B), (mass, _i32(S), _i32(B), draw_at, seed, generation,
                                          round, position, owner, rel_hi, rel_lo, status))


def proposal_tickets(seed, generation, round, position, out):
    """philox.proposal_ticket per row (dy_proposal_ticket); out int64 [B]."""
    _arr("seed", seed, np.uint64, ndim=1)
    B = seed.shape[0]
    for name, arr, dt in (("generation", generation, np.uint32), ("round", round, np.uint32),
                          ("position", position, np.uint32), ("out", out, np.int64)):
        _arr(name, arr, dt, (B,))
    if B == 0:
        return
    _fn("sh_proposal_tickets")(*_rows(B), (seed, generation, round, position, _i32(B), out))
