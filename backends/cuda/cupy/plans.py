"""Launch plans of the cuda backend: the one cache every launch goes through.

A plan is made once per launch configuration (device, shapes, dtypes, the route of
routes.py) and holds the kernels, grids, scratch buffers and every fixed argument word,
packed once into argument slots (launch.Bound).  A call writes only its per-call words
(pointers of its arrays, the key format, the 16-byte-load flags) and launches.  The
CupyBackend methods find their plan with ``get(key, make)``; there is no other launch
path.

Kernel parameter lists are those of backends/cuda/kernels/*.cuh, in order.
"""

import numpy as np

from . import launch, routes, runtime
from .args import I32, NULL

PLANS = {}  # launch configuration -> plan
MAX_PLANS = 1024  # cleared when full (a plan is rebuilt in microseconds)

_VAR = launch.Var


def get(key, make, *args):
    """The plan of ``key`` (a tuple led by the device id), made by ``make(*args)`` on
    first use."""
    plan = PLANS.get(key)
    if plan is None:
        if len(PLANS) >= MAX_PLANS:
            PLANS.clear()
        plan = PLANS[key] = make(*args)
    return plan


class _Launch:
    """One kernel launch with fixed words and per-call words (launch.Var).

    ``go(*params, stream=None)`` takes the per-call words of the plan family,
    ``params`` (parameter names: those of the Vars, ``kptrs`` the four key pointers
    key0..key3), writes those the kernel takes into its slots (one store each; the others
    are skipped) and launches on ``stream`` (a raw handle; None: the current stream).
    Every Var of ``args`` must be named in ``params``.
    """

    __slots__ = ("bound", "go", "buffers")

    def __init__(self, kernel, grid, block, args, params, buffers=()):
        self.bound = b = launch.Bound(kernel, grid, block, args)
        self.buffers = buffers  # the scratch arrays behind fixed pointer words, kept alive
        words = {n: n for n in params if n != "kptrs"}
        if "kptrs" in params:
            words.update((f"key{i}", f"kptrs[{i}]") for i in range(4))
        missing = sorted(set(b.pos) - set(words))
        if missing:
            raise ValueError(f"{kernel.name}: per-call arguments {missing} not in {params}")
        # go() written out for these slots: one store per per-call word, no loop
        stores = "".join(f"    w[{i}] = {words[n]}\n" for n, i in b.pos.items())
        ns = {"pop": b._free.pop, "take": b.take, "launch": b.launch}
        exec(f"def go({', '.join(params)}, stream=None):\n"
             f"    try:\n        s = pop()\n    except IndexError:\n        s = take()\n"
             f"    w = s.w\n{stores}    launch(s, stream)\n", ns)
        self.go = ns["go"]


def _ptrs(bufs):
    return tuple(int(b.data.ptr) for b in bufs)


# --- allocate / propose ----------------------------------------------------------------
_ALLOC_PARAMS = ("x", "bias", "temp", "kptrs", "kfmt", "tokens", "counts", "ids", "status",
                 "vec", "cvec", "ftopk", "ftopp", "fminp")
_KEYVARS = tuple(_VAR("key%d" % i) for i in range(4))
_KFMT = _VAR("kfmt", np.int32)


def _row_inputs(x_code, bias_code, bias_rows, logits, greedy_ok, v, has_bias):
    """The per-row input words (RowIn of common.cuh): x, its dtype code, bias, its code
    and rows, temperature, logits, greedy_ok, V."""
    return (_VAR("x"), I32[x_code], _VAR("bias") if has_bias else NULL, I32[bias_code],
            I32[bias_rows], _VAR("temp"), I32[int(logits)], I32[int(greedy_ok)], I32[v])


class OnePassTopK:
    """topk_onepass / topk_onepass_wide / topk_onepass_packed*: one launch, grid (R, B),
    the last block of a row merges the tiles' candidates, allocates and draws.
    ``filtered``: the last block first checks the row's top_k / top_p / min_p (as
    SelectTopK) and keeps the prefix of the support's ranking that they keep."""

    def __init__(self, route, batch, v, k, x_code, bias_code, bias_rows, logits, greedy_ok,
                 policy, do_draw, filtered=False):
        wide = route == "wide"
        self.wide, self.v, self.x16 = wide, v, x_code != 0
        tile = routes.onepass_tile(route, v)
        r = -(-v // tile)
        bufs = (runtime.scratch("pk_cand_key", 8 * batch * r * routes.ONEPASS_CAP),
                runtime.scratch("pk_cand_id", 4 * batch * r * routes.ONEPASS_CAP),
                runtime.scratch("pk_blk_bad", 8 * batch * r),
                runtime.scratch("pk_counters", 4 * batch))
        common = _row_inputs(x_code, bias_code, bias_rows, logits, greedy_ok, v,
                             bias_code or bias_rows)
        outs = tuple(_VAR(n) for n in ("tokens", "counts", "ids", "status"))

        def make(name, r, tile, vec):
            args = (common + (I32[k], np.int32(r), np.int32(tile), I32[policy], I32[do_draw],
                              *_KEYVARS, _KFMT) + _ptrs(bufs) + outs
                    + ((I32[int(vec)],) if wide else ()) + (I32[batch], I32[int(filtered)])
                    + tuple(_VAR(n) for n in ("ftopk", "ftopp", "fminp")))
            return _Launch(runtime.kernel(name), routes.rgrid(r, batch),
                           (routes.ONEPASS_THREADS,), args, _ALLOC_PARAMS, bufs)

        name = "topk_onepass_wide" if wide else "topk_onepass"
        self.plain = make(name, r, tile, False)
        self.aligned = self.plain
        # 16-byte loads where x is 16-byte aligned (checked per call); 16-bit logits
        # without bias then take the packed kernels
        self.vec_ok = wide and routes.wide_vector_loads(v, self.x16)
        if self.vec_ok:
            if routes.packed_taken(self.x16, bias_code or bias_rows, logits):
                i = routes.packed_choice(batch, v, runtime.num_sms())
                tile_p = routes.PACKED_TILES[i]
                self.aligned = make(routes.PACKED_KERNELS[i], -(-v // tile_p), tile_p, True)
            else:
                self.aligned = make(name, r, tile, True)

    def launch(self, x, bias, temp, kptrs, kfmt, tokens, counts, ids, status, ftopk=0,
               ftopp=0, fminp=0):
        vec = self.vec_ok and x % 16 == 0
        (self.aligned if vec else self.plain).go(x, bias, temp, kptrs, kfmt, tokens, counts,
                                                 ids, status, vec, 0, ftopk, ftopp, fminp)


class SelectTopK:
    """topk_select (top_k > 32): grid (ceil(V / 2048), B),
    per-tile radix select or rank counting, the last block of a row merges, allocates and
    draws.  ``filtered``: the last block first checks the row's top_k / top_p / min_p
    (``ftopk`` int64 [B] or 0: top_k for every row; ``ftopp`` / ``fminp`` float32 [B])
    and keeps the prefix of the support's ranking that they keep."""

    def __init__(self, batch, v, k, x_code, bias_code, bias_rows, logits, greedy_ok, policy,
                 do_draw, filtered=False):
        kc = min(k, routes.SELECT_TILE)
        nt = -(-v // routes.SELECT_TILE)
        n = batch * nt * kc
        bufs = (runtime.scratch("cand_key", 8 * n), runtime.scratch("cand_id", 4 * n),
                runtime.scratch("tile_bad", 8 * batch * nt), runtime.scratch("counters", 4 * batch),
                runtime.scratch("sup_id", 4 * batch * k), runtime.scratch("sup_key", 8 * batch * k),
                runtime.scratch("sup_rem", 8 * batch * k), runtime.scratch("sup_cnt", 4 * batch * k))
        rank = routes.select_rank_counting(k, batch)
        args = (_row_inputs(x_code, bias_code, bias_rows, logits, greedy_ok, v,
                            bias_code or bias_rows)
                + (I32[k], I32[kc], I32[nt], I32[policy], I32[do_draw], I32[2 if rank else 0],
                   *_KEYVARS, _KFMT) + _ptrs(bufs)
                + tuple(_VAR(n) for n in ("tokens", "counts", "ids", "status")) + (I32[batch],)
                + (I32[int(filtered)],) + tuple(_VAR(n) for n in ("ftopk", "ftopp", "fminp")))
        self.run = _Launch(runtime.kernel("topk_select"), routes.rgrid(nt, batch), (256,), args,
                           _ALLOC_PARAMS, bufs)

    def launch(self, x, bias, temp, kptrs, kfmt, tokens, counts, ids, status, ftopk=0,
               ftopp=0, fminp=0):
        self.run.go(x, bias, temp, kptrs, kfmt, tokens, counts, ids, status, 0, 0, ftopk, ftopp,
                    fminp)


# dense_* state sizes (DA_RS / DA_CAP / DA_NB of dense.cuh)
_DA_RS, _DA_CAP, _DA_NB = 144, 2048, 2048


class Dense:
    """dense_max, dense_sum, dense_floor, dense_mark (grid (tiles, B): exact integer
    atomics into a per-row state that dense_mark's last block zeroes), then draw_rows
    for propose.  The state is zero between calls (no memset): graph-capturable."""

    def __init__(self, batch, v, x_code, bias_code, bias_rows, logits, greedy_ok, policy,
                 do_draw):
        dt = routes.dense_tile(v, batch, runtime.num_sms())
        nt = -(-v // dt)
        bufs = (runtime.scratch("da_state", 8 * batch * _DA_RS),
                runtime.scratch("da_cand_r", 8 * batch * _DA_CAP),
                runtime.scratch("da_cand_i", 4 * batch * _DA_CAP),
                runtime.scratch("da_fine", 4 * batch * nt * _DA_NB))
        state, cand_r, cand_i, fine = _ptrs(bufs)
        base = _row_inputs(x_code, bias_code, bias_rows, logits, greedy_ok, v,
                           bias_code or bias_rows) + (np.int32(dt), _VAR("vec", np.int32))
        pol, rows = I32[policy], I32[batch]
        grid = routes.rgrid(nt, batch)
        self.x16, self.v = x_code != 0, v
        self.steps = tuple(_Launch(runtime.kernel(name), grid, (256,), base + tail, _ALLOC_PARAMS,
                                   bufs) for name, tail in (
            ("dense_max", (state, rows)), ("dense_sum", (state, rows)),
            ("dense_floor", (pol, fine, state, rows)),
            ("dense_mark", (pol, state, cand_r, cand_i, _VAR("counts"), _VAR("cvec", np.int32),
                            _VAR("status"), rows))))
        self.draw = None
        if do_draw:
            self.draw = _Launch(runtime.kernel("draw_rows"), (batch,), (256,),
                                (_VAR("counts"), NULL, I32[v], *_KEYVARS, _KFMT,
                                 _VAR("tokens")), _ALLOC_PARAMS)
        self.gos = tuple(step.go for step in self.steps + ((self.draw,) if do_draw else ()))

    def launch(self, x, bias, temp, kptrs, kfmt, tokens, counts, ids, status, stream=None):
        v = self.v
        vec = not self.x16 and v % 4 == 0 and x % 16 == 0  # 16-byte loads of float32 x
        cvec = v % 4 == 0 and counts % 16 == 0  # 16-byte stores of the counts
        if stream is None:
            stream = launch.current_stream()  # read once for the launches
        for go in self.gos:
            go(x, bias, temp, kptrs, kfmt, tokens, counts, ids, status, vec, cvec, 0, 0, 0, stream)


LG_TE = 4096  # value-table entries of a row (logits_common.cuh)
LG_TABW = LG_TE * 18 // 8  # u64 words of a row's value table: W, key (u64), bucket (u16)
LG_TCW = LG_TE // 2 + 1 + 31  # u32 words of a tile's record: counts, header, LG_OTH = 62 tokens
LG_RL = 128  # listed tokens a residual tile keeps with their weights (logits_common.cuh)


def _logits_rows_bufs(rows, nt, x_code):
    """The scratch of logits_max / logits_hist / logits_resolve over ``rows`` rows of
    ``nt`` tiles (shared by name with every plan that runs them): part_key, part_id,
    part_bad, rec, cnt, hcnt, hmass, cand_key, cand_id, cand_n, vtab, tcnt."""
    nb = cap = 2048  # LG_NB, LG_CAP of logits_common.cuh
    # bfloat16 logits only: the rows' value tables (LG_TABW words a row) and their tiles'
    # records, counts per value (LG_TCW words a tile)
    bf16 = int(x_code) == 2
    vtab = 8 * LG_TABW * rows if bf16 else 8
    tcnt = 4 * LG_TCW * rows * nt if bf16 else 8
    return (runtime.scratch("lg_part_key", 8 * rows * nt),
            runtime.scratch("lg_part_id", 4 * rows * nt),
            runtime.scratch("lg_part_bad", 4 * rows * nt),
            runtime.scratch("lg_rec", 8 * 16 * rows), runtime.scratch("lg_cnt", 4 * rows),
            runtime.scratch("lg_hcnt", 4 * rows * nb), runtime.scratch("lg_hmass", 8 * rows * nb),
            runtime.scratch("lg_cand_key", 8 * rows * cap),
            runtime.scratch("lg_cand_id", 4 * rows * cap), runtime.scratch("lg_cand_n", 4 * rows),
            runtime.scratch("lg_vtab", vtab), runtime.scratch("lg_tcnt", tcnt))


def _logits_rows_steps(head, rows, x_code, tile, nt, bufs, names, resolves):
    """The launches of logits_max, logits_table (routes.logits_table_launched),
    logits_hist and ``resolves`` x logits_resolve over ``rows`` rows of logits of dtype
    code ``x_code`` (``head``: the kernels' leading words; ``bufs``: _logits_rows_bufs,
    then the plan's other buffers, all kept alive by the first launch)."""
    pkey, pid, pbad, rec, cnt, hcnt, hmass, ckey, cid, cn, tab, tcnt = _ptrs(bufs[:12])
    grid = routes.rgrid(nt, rows)
    tail = (I32[nt], np.int32(tile))
    resolve = _Launch(runtime.kernel("logits_resolve"), grid, (256,), head + tail + (
        rec, cnt, hcnt, hmass, ckey, cid, cn, tab), names)
    table = ()
    if routes.logits_table_launched(rows, int(x_code) == 2):
        table = (_Launch(runtime.kernel("logits_table"), routes.rgrid(LG_TE // 256, rows),
                         (256,), head + (rec, tab), names),)
    hist_in = head + tail + (rec, cnt, hcnt, hmass, tab, tcnt)
    if routes.logits_counted(rows, int(x_code) == 2):
        ng = routes.logits_hist_groups(nt, rows, runtime.num_sms(), True)
        hist = _Launch(runtime.kernel("logits_hist_groups"), routes.rgrid(ng, rows), (256,),
                       hist_in + (I32[ng],), names)
    else:
        hist = _Launch(runtime.kernel("logits_hist"), grid, (256,), hist_in, names)
    return (_Launch(runtime.kernel("logits_max"), grid, (256,), head + tail + (
                pkey, pid, pbad, rec, cnt, hcnt, hmass, cn, tab, tcnt), names, bufs),) + table + (
            hist,) + (resolve,) * resolves


class DenseFiltered:
    """allocate / propose with top_p / min_p on a dense support (logits_filter.cuh):
    logits_max, logits_hist and logits_resolve over the B rows as requests of depth 0
    (top_k 0 on every row: a zero scratch buffer, never written), filter_mask into a
    scratch copy of x with every token off the kept set at -inf, the Dense plan's
    launches over that copy, filter_status."""

    def __init__(self, batch, v, x_code, greedy_ok, policy, do_draw):
        tile, _ = routes.logits_tiles(v, batch, 1, runtime.num_sms())
        nt = -(-v // tile)
        xm = runtime.scratch("lf_xm", (4 if int(x_code) == 0 else 2) * batch * v)
        topk0 = runtime.scratch("lf_topk0", 8 * batch)
        bufs = _logits_rows_bufs(batch, nt, x_code) + (xm, topk0)
        self.xm = int(xm.data.ptr)
        params = (_VAR("temp"), int(topk0.data.ptr), _VAR("ftopp"), _VAR("fminp"))
        head = (_VAR("x"), I32[int(x_code)], *params, NULL, NULL, I32[batch], I32[0], I32[v])
        grid = routes.rgrid(nt, batch)
        rec, tab = _ptrs(bufs[3:4] + bufs[10:11])
        self.steps = _logits_rows_steps(head, batch, x_code, tile, nt, bufs, _ALLOC_PARAMS,
                                        1) + (
            _Launch(runtime.kernel("filter_mask"), grid, (256,), (
                _VAR("x"), I32[int(x_code)], *params, I32[batch], I32[v], np.int32(tile), rec,
                tab, self.xm), _ALLOC_PARAMS),)
        self.fix = _Launch(runtime.kernel("filter_status"), (-(-batch // 256),), (256,),
                           (_VAR("ftopp"), _VAR("fminp"), I32[batch], _VAR("status")),
                           _ALLOC_PARAMS)
        self.dense = Dense(batch, v, x_code, 0, 0, True, greedy_ok, policy, do_draw)

    def launch(self, x, bias, temp, kptrs, kfmt, tokens, counts, ids, status, ftopk=0,
               ftopp=0, fminp=0):
        stream = launch.current_stream()  # read once for the launches
        for step in self.steps:
            step.go(x, 0, temp, kptrs, kfmt, tokens, counts, ids, status, 0, 0, ftopk, ftopp,
                    fminp, stream)
        self.dense.launch(self.xm, 0, temp, kptrs, kfmt, tokens, counts, ids, status, stream)
        self.fix.go(x, 0, temp, kptrs, kfmt, tokens, counts, ids, status, 0, 0, ftopk, ftopp,
                    fminp, stream)


def alloc_plan(dev, batch, v, top_k, x_code, bias_code, bias_rows, logits, greedy_ok, policy,
               do_draw, filtered=False):
    """The plan of an allocate (do_draw 0, greedy_ok 0) or propose (1, 1); ``filtered``:
    with top_p / min_p / per-row top_k (logits; a dense support without bias:
    DenseFiltered, else the sparse route's plan applies them)."""
    key = ("alloc", dev, batch, v, top_k, x_code, bias_code, bias_rows, logits, policy,
           do_draw, filtered)
    plan = PLANS.get(key)
    if plan is None:
        has_bias = bool(bias_code or bias_rows)
        route = routes.alloc_route(top_k, batch, v, has_bias and logits,
                                   not has_bias and logits and x_code != 0)
        if route == "dense" and filtered:
            make, args = DenseFiltered, (batch, v, x_code, greedy_ok, policy, do_draw)
        elif route == "dense":
            make, args = Dense, (batch, v, x_code, bias_code, bias_rows, logits, greedy_ok,
                                 policy, do_draw)
        elif route == "select":
            make, args = SelectTopK, (batch, v, top_k, x_code, bias_code, bias_rows, logits,
                                      greedy_ok, policy, do_draw, filtered)
        else:
            make, args = OnePassTopK, (route, batch, v, top_k, x_code, bias_code, bias_rows,
                                       logits, greedy_ok, policy, do_draw, filtered)
        plan = get(key, make, *args)
    return plan


# --- draw ------------------------------------------------------------------------------
class Draw:
    """draw_rows: one block per row; counts [B, W], ids [B, W] or null."""

    PARAMS = ("counts", "ids", "kptrs", "kfmt", "tokens")

    def __init__(self, batch, w):
        self.run = _Launch(runtime.kernel("draw_rows"), (batch,), (256,),
                           (_VAR("counts"), _VAR("ids"), I32[w], *_KEYVARS, _KFMT,
                            _VAR("tokens")), self.PARAMS)
        #: ``launch(counts, ids, kptrs, kfmt, tokens)``: the launch itself (no per-call
        #: choice to make)
        self.launch = self.run.go


def draw_plan(dev, batch, w):
    key = ("draw", dev, batch, w)
    plan = PLANS.get(key)
    return plan if plan is not None else get(key, Draw, batch, w)


# --- verify ----------------------------------------------------------------------------
_VERIFY_PARAMS = ("t", "d", "qc", "qi", "g", "kptrs", "kfmt", "a", "tk", "st", "vec", "vec_q",
                  "nd")
_VIN = tuple(_VAR(n) for n in ("t", "d", "qc", "qi"))
_VOUT = tuple(_VAR(n) for n in ("a", "tk", "st"))
_VVEC, _VVECQ = _VAR("vec", np.int32), _VAR("vec_q", np.int32)
_VND = _VAR("nd")  # num_drafts (int32 [B]) or 0: every request has k drafts


class TwoLaunchVerify:
    """verify_chain (per (row, tile) sums; the last block of a request validates and walks
    the chain) then verify_residual (the residual or bonus draw over many blocks).  With
    num_drafts (``nd``) a request's rows beyond its count are skipped."""

    def __init__(self, batch, k1, v, w, nsm, greedy):
        rows, k = batch * k1, k1 - 1
        vt, rt = routes.chain_tiles(v, batch, k1, nsm)
        nt1, nrt = -(-v // vt), -(-v // rt)
        bufs = (runtime.scratch("part_lo", 8 * rows * nt1), runtime.scratch("part_hi", 8 * rows * nt1),
                runtime.scratch("part_max", 8 * rows * nt1), runtime.scratch("part_bad", 4 * rows * nt1),
                runtime.scratch("res_row", 4 * batch), runtime.scratch("res_T", 8 * batch),
                runtime.scratch("rpart", 16 * batch * nrt), runtime.scratch("vcnt", 4 * batch),
                runtime.scratch("rcnt", 4 * batch))
        plo, phi, pmax, pbad, res_row, res_t, rpart, vcnt, rcnt = _ptrs(bufs)
        w32, k32, v32 = I32[w], I32[k], I32[v]
        self.v = v
        # greedy flags (uint8 [B]) per call, or zero flags (a scratch buffer nothing writes)
        self.no_flags = None if greedy else runtime.scratch("no_greedy_flags", batch)
        flags = _VAR("g") if greedy else int(self.no_flags.data.ptr)
        self.chain = _Launch(runtime.kernel("verify_chain"), routes.rgrid(nt1, rows), (256,), (
            *_VIN, w32, flags, I32[batch], k32, v32, np.int32(nt1), plo, phi, pmax, pbad,
            *_KEYVARS, _KFMT, res_row, res_t, *_VOUT, vcnt, np.int32(vt), _VVEC, _VND),
            _VERIFY_PARAMS, bufs)
        self.residual = _Launch(runtime.kernel("verify_residual"), routes.rgrid(nrt, batch),
                                (256,), (*_VIN, w32, k32, v32, np.int32(nrt), *_KEYVARS, _KFMT,
                                         res_row, res_t, rpart, *_VOUT, rcnt, np.int32(rt),
                                         _VVEC, _VVECQ, I32[batch], _VND), _VERIFY_PARAMS)

    def launch(self, t, d, qc, qi, g, kptrs, kfmt, a, tk, st, nd=0):
        v = self.v
        vec_t = v % 4 == 0 and t % 16 == 0
        vec_q = bool(qc) and not qi and v % 4 == 0 and qc % 16 == 0
        stream = launch.current_stream()  # read once for the two launches
        self.chain.go(t, d, qc, qi, g, kptrs, kfmt, a, tk, st, vec_t, vec_q, nd, stream)
        self.residual.go(t, d, qc, qi, g, kptrs, kfmt, a, tk, st, vec_t, vec_q, nd, stream)


def _row_lists(batch, k1, nt, v):
    """verify_lazy's / verify_one_launch's per-row scratch: tile records (6 u64 per
    request, row and tile), 64-id chunk records, the ambiguous-id lists and counters."""
    return (runtime.scratch("vf_tpart", 8 * 6 * batch * k1 * nt),
            runtime.scratch("vf_rchunk", 16 * batch * k1 * ((v + 63) // 64)),
            runtime.scratch("vf_alist", 16 * batch * k1 * min(routes.LAZY_LIST_CAP, v)),
            runtime.scratch("vf_acnt", 4 * batch * k1))


class _OneKernelVerify:
    """Shared by LazyVerify and OneLaunchVerify: one launch, 16-byte loads of the target
    rows (and of dense q rows) where aligned."""

    def launch(self, t, d, qc, qi, g, kptrs, kfmt, a, tk, st, nd=0):
        vec = self.v4 and t % 16 == 0
        vec_q = vec and bool(qc) and not qi and qc % 16 == 0
        self.run.go(t, d, qc, qi, g, kptrs, kfmt, a, tk, st, vec, vec_q, nd)


class LazyVerify(_OneKernelVerify):
    """verify_lazy / verify_lazy_r64 (check="lazy"): the tests, the candidate rows' totals
    and chunk sums, the walk and the residual / bonus draw in one launch; with num_drafts
    (``nd``) a request's tests and bonus row follow its count."""

    def __init__(self, batch, k1, v, w, nsm, greedy=False):
        vt = routes.lazy_tile(v, batch, nsm)
        nt = -(-v // vt)
        bufs = _row_lists(batch, k1, nt, v) + (runtime.scratch("vf_cnt", 4 * batch),)
        self.v4 = v % 4 == 0
        self.run = _Launch(runtime.kernel(routes.lazy_kernel(nt, batch, nsm)),
                           routes.rgrid(nt, batch), (256,), (
            *_VIN, I32[w], I32[k1 - 1], I32[v], I32[nt], *_KEYVARS, _KFMT, *_ptrs(bufs[:4]),
            I32[min(routes.LAZY_LIST_CAP, v)], *_VOUT, _ptrs(bufs[4:])[0], I32[vt],
            I32[int(batch <= routes.LAZY_PREFETCH_MAX_BATCH)], _VVEC, _VVECQ, I32[batch], _VND),
            _VERIFY_PARAMS, bufs)


class OneLaunchVerify(_OneKernelVerify):
    """verify_one_launch (check=False / True, no greedy request): the tests in block 0 of
    each request, every used row's tiles, the full validation, the walk and the draw; with
    num_drafts (``nd``) a request's rows beyond its count are not read."""

    def __init__(self, batch, k1, v, w, nsm, greedy=False):
        vt = routes.one_launch_tile(v, batch, k1, nsm)
        nt = -(-v // vt)
        bufs = _row_lists(batch, k1, nt, v) + (runtime.scratch("vone_cnt", 4 * batch),
                                               runtime.scratch("vone_tests", 4 * 64 * batch))
        cnt, tz = _ptrs(bufs[4:])
        self.v4 = v % 4 == 0
        self.run = _Launch(runtime.kernel("verify_one_launch"), routes.rgrid(1 + k1 * nt, batch),
                           (256,), (
            *_VIN, I32[w], I32[k1 - 1], I32[v], I32[nt], *_KEYVARS, _KFMT, *_ptrs(bufs[:4]),
            I32[min(routes.LAZY_LIST_CAP, v)], *_VOUT, cnt, tz, I32[vt], _VVEC, _VVECQ,
            I32[batch], _VND), _VERIFY_PARAMS, bufs)


class LogitsVerify:
    """verify(logits=True): logits_max, logits_table (routes.logits_table_launched),
    logits_hist, logits_resolve (twice; once when
    ``top_k`` is False: only a top-p cut in an earlier bucket than a top-k cut takes the
    second launch) over (tile, row) grids, then logits_one_launch (1 + (k + 1) x tiles,
    request) where routes.logits_one_launch_tile gives a tile, else logits_chain (one block
    per request) and logits_residual (tile, request).  Per-call words: the target, the four parameter arrays (float64
    temperature, int64 top_k, float32 top_p and min_p as bit patterns), the greedy
    flags or 0, num_drafts or 0, the draft, q, keys and outputs."""

    PARAMS = ("t", "temp", "topk", "topp", "minp", "g", "nd", "d", "qc", "qi", "kptrs", "kfmt",
              "a", "tk", "st")

    def __init__(self, batch, k1, v, w, nsm, x_code, top_k=True):
        rows, k = batch * k1, k1 - 1
        tile, rt = routes.logits_tiles(v, batch, k1, nsm)
        one = routes.logits_one_launch_tile(v, batch, k1, nsm)
        rt = one or rt
        nt, nrt = -(-v // tile), -(-v // rt)
        slots = batch * nrt * (k1 if one else 1)  # residual tiles: of every row, or one a request
        bufs = _logits_rows_bufs(rows, nt, x_code) + (
            runtime.scratch("lg_res_row", 4 * batch), runtime.scratch("lg_rpart", 16 * slots),
            runtime.scratch("lg_rcnt", 4 * batch),
            # each residual tile's listed tokens with their weights (LG_RL a tile) and count
            runtime.scratch("lg_rl_w", 16 * LG_RL * slots),
            runtime.scratch("lg_rl_id", 4 * LG_RL * slots),
            runtime.scratch("lg_rl_n", 4 * slots))
        rec, tab, res_row, rpart, rcnt, rl_w, rl_id, rl_n = _ptrs(
            bufs[3:4] + bufs[10:11] + bufs[12:])
        head = (_VAR("t"), I32[int(x_code)], *(_VAR(n) for n in ("temp", "topk", "topp", "minp",
                                                                 "g", "nd")),
                I32[batch], I32[k], I32[v])
        q_in = (_VAR("d"), _VAR("qc"), _VAR("qi"), I32[w], *_KEYVARS, _KFMT)
        names = self.PARAMS
        res_args = head + (I32[nrt], np.int32(rt)) + q_in + (rec, tab, res_row, rpart, rcnt,
                                                            *_VOUT, rl_w, rl_id, rl_n)
        if one:
            last = (_Launch(runtime.kernel("logits_one_launch"), routes.rgrid(1 + k1 * nrt, batch),
                            (256,), res_args, names),)
        else:
            last = (
                _Launch(runtime.kernel("logits_chain"), routes.rgrid(1, batch), (256,),
                        head + q_in + (rec, tab, res_row, *_VOUT), names),
                _Launch(runtime.kernel("logits_residual"), routes.rgrid(nrt, batch), (256,),
                        res_args, names))
        self.steps = _logits_rows_steps(head, rows, x_code, tile, nt, bufs, names,
                                        2 if top_k else 1) + last

    def launch(self, t, temp, topk, topp, minp, g, nd, d, qc, qi, kptrs, kfmt, a, tk, st):
        stream = launch.current_stream()  # read once for the launches
        for step in self.steps:
            step.go(t, temp, topk, topp, minp, g, nd, d, qc, qi, kptrs, kfmt, a, tk, st, stream)


def logits_verify_plan(dev, batch, k1, v, w, x_code, top_k=True):
    """The plan of a verify(logits=True) call (target dtype code ``x_code``; ``top_k``:
    the call gives a top_k)."""
    key = ("verify_logits", dev, batch, k1, v, w, int(x_code), bool(top_k))
    plan = PLANS.get(key)
    if plan is None:
        plan = get(key, LogitsVerify, batch, k1, v, w, runtime.num_sms(), x_code, bool(top_k))
    return plan


_VERIFY_KINDS = {"lazy": LazyVerify, "one_launch": OneLaunchVerify,
                 "two_launch": TwoLaunchVerify}


def verify_plan(dev, batch, k1, v, w, greedy, lazy):
    """The plan of a verify call (``greedy``: greedy flags given; ``lazy``: check="lazy");
    num_drafts, when given, is a launch argument of the same plan."""
    key = ("verify", dev, batch, k1, v, w, greedy, lazy)
    plan = PLANS.get(key)
    if plan is None:
        nsm = runtime.num_sms()
        route = routes.verify_route(batch, k1, v, nsm, greedy, lazy)
        plan = get(key, _VERIFY_KINDS[route], batch, k1, v, w, nsm, greedy)
    return plan
