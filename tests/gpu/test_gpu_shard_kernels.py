"""The CUDA shard kernels (backends/cuda/cupy/shard.py over backends/cuda/kernels/shard.cu)
against the CPU's (backends/cpu/_shard.pyx over backends/include/dyadic_shard.h), bit
for bit, function by function, on the same random and adversarial inputs (single
process, no torch.distributed).  Skips without CuPy and a GPU, or without the
compiled CPU backend.
"""

import numpy as np
import pytest

import dyadic
from dyadic import _backend, _spec

from conftest import _load

pytestmark = pytest.mark.gpu
TOTAL = _spec.TOTAL


@pytest.fixture(scope="module")
def mods():
    be, why = _load("cuda")
    if be is None:
        pytest.skip(why)
    try:
        _backend.get("cpu")
    except _backend.BackendUnavailable as exc:
        pytest.skip(f"cpu backend unavailable: {exc}")
    import cupy as cp

    from dyadic.backends.cpu import _shard as hk
    from dyadic.backends.cuda.cupy import shard as dk
    return cp, hk, dk


def _keys(b, seed=3, position=11, extra=0):
    return dyadic.Keys(seed=seed, generation=2, round=5, position=position).broadcast(
        b, position_extra=extra)


def _c(a):
    return np.ascontiguousarray(a)


def _logits(rng, b, v, kind):
    if kind == "ties":
        x = rng.integers(-2, 2, (b, v)).astype(np.float32)
    elif kind == "subnormal":  # float32 subnormals and signed zeros (-ftz must not flush them)
        x = (rng.integers(-40, 40, (b, v)) * np.float32(1e-44)).astype(np.float32)
        x[:, ::7] = -0.0
    else:
        x = rng.normal(0, 3, (b, v)).astype(np.float32)
    if kind == "neginf":
        x[0] = -np.inf
        x[1, : max(v - 2, 0)] = -np.inf
    if kind == "bad" and v > 2:
        x[0, v // 2] = np.nan
        x[0, v - 1] = np.inf
        x[1, 1] = np.inf
        x[1, v - 1] = np.nan
    return x


def _bias(rng, kind, b, v, scale=1.0):
    """None ("none"), a bias [1, V] of N(0, 1) with about a fifth -inf ("one"), or one
    [B, V] of N(0, scale) ("rows")."""
    if kind == "one":
        bias = rng.normal(0, 1, (1, v)).astype(np.float32)
        bias[0, rng.random(v) < 0.2] = -np.inf
        return bias
    if kind == "rows":
        return rng.normal(0, scale, (b, v)).astype(np.float32)
    return None


def _eq(cp, a, b, what):
    np.testing.assert_array_equal(cp.asnumpy(b), a, err_msg=what)


@pytest.mark.parametrize("kind", ["random", "ties", "subnormal", "neginf", "bad"])
@pytest.mark.parametrize("v", [1, 7, 300, 5000])
def test_topk_merge(mods, kind, v):
    cp, hk, dk = mods
    rng = np.random.default_rng(v * 7 + len(kind))
    b = 4
    x = _logits(rng, b, v, kind)
    temp = np.array([1.0, 0.7, 1.0, 1.3])
    greedy = np.array([0, 0, 1, 0], np.uint8)
    cuts = [0] + sorted(rng.integers(0, v + 1, 2).tolist()) + [v]
    for bias_kind in ("none", "one", "rows"):
        bias = _bias(rng, bias_kind, b, v)
        ncol = 2 if bias is None else 3
        for k in (1, 5, 32, v + 3):
            gh, gd = [], []
            for s in range(len(cuts) - 1):
                lo, hi = cuts[s], cuts[s + 1]
                xs = _c(x[:, lo:hi])
                bs = None if bias is None else _c(bias[:, lo:hi])
                ph = np.empty((b, 1 + k * ncol), np.int32)
                hk.topk(xs, bs, temp, greedy, k, lo, v, ph)
                pd = cp.empty((b, 1 + k * ncol), cp.int32)
                dk.topk(cp.asarray(xs), None if bs is None else cp.asarray(bs), cp.asarray(temp),
                        cp.asarray(greedy), k, lo, v, pd)
                _eq(cp, ph, pd, f"topk k={k} shard {lo}:{hi} bias={bias_kind}")
                gh.append(ph)
                gd.append(pd)
            g = _c(np.stack(gh))
            seed, gen, rnd, pos = _keys(b)
            for policy in (0, 1):
                width = min(k, v)
                outs_h = [np.empty(b, np.int32), np.empty((b, width), np.uint32),
                          np.empty((b, width), np.int32), np.empty(b, np.int32),
                          np.empty(b, np.int32)]
                outs_d = [cp.empty(b, cp.int32), cp.empty((b, width), cp.uint32),
                          cp.empty((b, width), cp.int32), cp.empty(b, cp.int32),
                          cp.empty(b, cp.int32)]
                hk.merge(g, bias is not None, k, temp, greedy, policy, v, width, seed, gen, rnd,
                         pos, *outs_h)
                dk.merge(cp.asarray(g), bias is not None, k, cp.asarray(temp),
                         cp.asarray(greedy), policy, v, width, cp.asarray(_c(seed)),
                         cp.asarray(_c(gen)), cp.asarray(_c(rnd)), cp.asarray(_c(pos)), *outs_d)
                for name, a, d in zip(("tokens", "counts", "ids", "status", "alloc_status"),
                                      outs_h, outs_d):
                    _eq(cp, a, d, f"merge {name} k={k} policy={policy} bias={bias_kind}")


def _z_max(x, bias, temp):
    """Every row's largest z = (x + b) / T in binary64 (NaN-free rows), as the sharded
    propose's merge finds it: the dense weights' gaps zmax - z are then >= 0."""
    z = x.astype(np.float64)
    if bias is not None:
        z = z + bias.astype(np.float64)
    with np.errstate(all="ignore"):
        z = z / temp[:, None]
    return z.max(axis=1) if z.shape[1] else np.full(z.shape[0], -np.inf)


@pytest.mark.parametrize("kind", ["random", "ties", "subnormal", "neginf", "wide"])
@pytest.mark.parametrize("v", [1, 7, 300, 5000, 70000])
def test_dense_weights(mods, kind, v):
    """dense_weights (sh_dense_weights: several blocks per row, each thread the header's
    loop over a segment) == the CPU's, weights and limb sums, on every shard of a split:
    random and adversarial rows (-inf rows and masks, ties, float32 subnormals and signed
    zeros, huge and tiny temperatures, bias [1, n] / [B, n] with -inf entries), zmax the
    row's global maximum z or above it (every gap >= 0), unflagged rows zero."""
    cp, hk, dk = mods
    rng = np.random.default_rng(v * 3 + len(kind))
    b = 6
    x = _logits(rng, b, v, "random" if kind == "wide" else kind)
    if kind == "wide":
        x = (x * 30).astype(np.float32)
    temps = (np.array([1.0, 0.7, 1e-300, 1e300, 3.0, 1.0]),
             np.array([1.3, 1.0, 1.0, 0.25, 1e-30, 7.0]))
    rows = np.array([1, 1, 1, 0, 1, 1], np.uint8)
    cuts = [0] + sorted(rng.integers(0, v + 1, 2).tolist()) + [v]
    for bias_kind in ("none", "one", "rows"):
        bias = _bias(rng, bias_kind, b, v, scale=2.0)
        for temp in temps:
            zmax = _z_max(x, None if bias is None else np.broadcast_to(bias, x.shape), temp)
            for lift in (0.0, 0.5):
                zm = zmax + lift
                parts = []
                for s in range(len(cuts) - 1):
                    lo, hi = cuts[s], cuts[s + 1]
                    xs = _c(x[:, lo:hi])
                    bs = None if bias is None else _c(bias[:, lo:hi])
                    wh, sh = np.empty((b, hi - lo), np.uint64), np.empty((b, 2), np.uint64)
                    wd, sd = cp.empty((b, hi - lo), cp.uint64), cp.empty((b, 2), cp.uint64)
                    hk.dense_weights(xs, bs, temp, zm, rows, wh, sh)
                    dk.dense_weights(cp.asarray(xs), None if bs is None else cp.asarray(bs),
                                     cp.asarray(temp), cp.asarray(zm), cp.asarray(rows), wd, sd)
                    what = f"shard {lo}:{hi} bias={bias_kind} T={temp.tolist()} lift={lift}"
                    _eq(cp, wh, wd, "dense weights " + what)
                    _eq(cp, sh, sd, "dense weight sums " + what)
                    parts.append(wh)
                # the gap 0 at the row's argmax gives the largest weight, 2**39; a zmax above
                # every z gives less; unflagged rows and rows without a finite z: none
                w = np.concatenate(parts, axis=1)
                top = w.max(axis=1)
                live = (rows == 1) & np.isfinite(zmax)
                assert (top[~live] == 0).all()
                exact = live & (zm == zmax)
                assert (top[exact] == 2**39).all()
                assert (top[live & ~exact] < 2**39).all()
    with pytest.raises(ValueError, match="bias"):
        dk.dense_weights(cp.zeros((2, 4), cp.float32), cp.zeros((3, 4), cp.float32),
                         cp.ones(2), cp.zeros(2), cp.ones(2, cp.uint8),
                         cp.empty((2, 4), cp.uint64), cp.empty((2, 2), cp.uint64))
    with pytest.raises(TypeError, match="dtype"):
        dk.dense_weights(cp.zeros((2, 4), cp.float32), None, cp.ones(2), cp.zeros(2),
                         cp.ones(2, cp.uint8), cp.empty((2, 4), cp.int64),
                         cp.empty((2, 2), cp.uint64))


def _target(rng, b, k1, v, kind):
    if kind == "peaked":
        w = np.exp(rng.normal(0, 4, (b, k1, v)))
    elif kind == "sparse":
        w = rng.random((b, k1, v)) * (rng.random((b, k1, v)) < 0.2)
        w[..., 0] += 1e-3
    else:
        w = rng.random((b, k1, v))
    p = (w / w.sum(-1, keepdims=True)).astype(np.float32)
    if kind == "bad" and v > 3:
        p[0, 1, 2] = np.nan
        p[1, 0, 1] = -0.0
        p[2, 2, 0] = 1.5
        p[3, 0, v - 1] = -1e-3
    return p


def _q_rows(rng, b, k, v):
    """A dense q [b, k, v] of valid rows (2**24 each) and its sparse form (ascending ids)."""
    dense = np.zeros((b, k, v), np.uint32)
    width = min(v, 6)
    qc = np.zeros((b, k, width), np.uint32)
    qi = np.full((b, k, width), -1, np.int32)
    for r in range(b):
        for i in range(k):
            m = int(rng.integers(1, width + 1))
            ids = np.sort(rng.choice(v, m, replace=False))
            c = rng.multinomial(TOTAL - m, np.ones(m) / m) + 1
            dense[r, i, ids] = c
            qc[r, i, :m] = c
            qi[r, i, :m] = ids
    return dense, qc, qi


@pytest.mark.parametrize("kind", ["uniform", "peaked", "sparse", "bad"])
@pytest.mark.parametrize("v", [1, 5, 300, 5000])
def test_verify_kernels(mods, kind, v):
    cp, hk, dk = mods
    rng = np.random.default_rng(v * 13 + len(kind))
    b, k = 4, 3
    k1 = k + 1
    t = _target(rng, b, k1, v, kind)
    draft = rng.integers(0, v, (b, k)).astype(np.int64)
    dense, qc, qi = _q_rows(rng, b, k, v)
    for r in range(b):  # drafts mostly in q's support
        for i in range(k):
            if rng.random() < 0.8:
                draft[r, i] = qi[r, i, 0]
    greedy = np.array([0, 1, 0, 0], np.uint8)
    seed, gen, rnd, pos = _keys(b, extra=k)
    cuts = [0] + sorted(rng.integers(0, v + 1, 2).tolist()) + [v]
    fs, masses = [], []
    # round 1 per shard, with the sharded q and with none; hostile draft ids fail closed
    for s in range(len(cuts) - 1):
        lo, hi = cuts[s], cuts[s + 1]
        ts = _c(t[..., lo:hi])
        for qs in (None, _c(dense[..., lo:hi])):
            for dr in (draft, np.where(np.arange(k) == 1, v, draft), np.full((b, k), -2)):
                dr = _c(dr.astype(np.int64))
                fh, sth = np.empty((b, k1, 9), np.int64), np.empty(b, np.int32)
                fd, std = cp.empty((b, k1, 9), cp.int64), cp.empty(b, cp.int32)
                hk.target_summary(ts, dr, qs, greedy, lo, v, fh, sth)
                dk.target_summary(cp.asarray(ts), cp.asarray(dr),
                                  None if qs is None else cp.asarray(qs), cp.asarray(greedy), lo,
                                  v, fd, std)
                _eq(cp, fh, fd, f"summary shard {lo}:{hi} q={qs is not None}")
                _eq(cp, sth, std, "summary status")
        fh = np.empty((b, k1, 9), np.int64)
        hk.target_summary(ts, draft, _c(dense[..., lo:hi]), greedy, lo, v, fh,
                          np.empty(b, np.int32))
        fs.append(fh)
    gf = _c(np.stack(fs))
    cd = _c(gf[:, :, :k, 7].sum(axis=0).astype(np.uint32))
    h = [np.empty((b, k1), np.uint64), np.empty((b, k), np.uint64), np.empty((b, k1), np.int32),
         np.empty(b, np.int32)]
    d = [cp.empty((b, k1), cp.uint64), cp.empty((b, k), cp.uint64), cp.empty((b, k1), cp.int32),
         cp.empty(b, cp.int32)]
    hk.verify_check(gf, cd, greedy, *h)
    dk.verify_check(cp.asarray(gf), cp.asarray(cd), cp.asarray(greedy), *d)
    ok = h[3] == 0
    for name, a, x in zip(("total", "best", "status"), (h[0], h[2], h[3]), (d[0], d[2], d[3])):
        _eq(cp, a, x, f"verify_check {name}")
    _eq(cp, h[1][ok], d[1][cp.asarray(ok)], "verify_check pd (validated rows)")
    total, pd, best = h[0], h[1], h[2]
    total[~ok] = 1 << 62
    pd[~ok] = 0
    ha = [np.empty(b, np.int32), np.empty((b, k1), np.int32), np.empty(b, np.int32),
          np.empty(b, np.int32)]
    da = [cp.empty(b, cp.int32), cp.empty((b, k1), cp.int32), cp.empty(b, cp.int32),
          cp.empty(b, cp.int32)]
    cd1 = np.maximum(cd, 1).astype(np.uint32)
    hk.verify_accept(draft, cd1, total, pd, best, greedy, seed, gen, rnd, pos, *ha)
    dk.verify_accept(cp.asarray(draft), cp.asarray(cd1), cp.asarray(total), cp.asarray(pd),
                     cp.asarray(best), cp.asarray(greedy), *(cp.asarray(_c(a)) for a in
                                                               (seed, gen, rnd, pos)), *da)
    for name, a, x in zip(("accepted", "tokens", "draw_at", "status"), ha, da):
        _eq(cp, a, x, f"verify_accept {name}")
    # round 2: every draw position (residual at j < k, bonus at k), every kind of q
    for draw_at in (np.array([0, -1, 2, 3], np.int32), np.array([3, 1, -1, 0], np.int32)):
        for qform in ("dense-shard", "dense-full", "sparse", "point", "none"):
            masses = []
            for s in range(len(cuts) - 1):
                lo, hi = cuts[s], cuts[s + 1]
                ts = _c(t[..., lo:hi])
                if qform == "dense-shard":
                    qa = (_c(dense[..., lo:hi]), 0, None, None)
                elif qform == "dense-full":
                    qa = (dense, lo, None, None)
                elif qform == "sparse":
                    qa = (None, 0, qc, qi)
                elif qform == "point":
                    qa = (None, 0, np.full((b, k, 1), TOTAL, np.uint32),
                          _c(draft[..., None].astype(np.int32)))
                else:
                    qa = (None, 0, None, None)
                qad = tuple(cp.asarray(a) if isinstance(a, np.ndarray) else a for a in qa)
                mh = np.empty((b, 3), np.int64)
                md = cp.empty((b, 3), cp.int64)
                hk.residual_mass(ts, draw_at, *qa, lo, total, mh)
                dk.residual_mass(cp.asarray(ts), cp.asarray(draw_at), *qad, lo,
                                 cp.asarray(total), md)
                _eq(cp, mh, md, f"residual_mass {qform} shard {lo}:{hi}")
                masses.append(mh)
                # the owner's search at targets below, at and above the shard's mass
                m = (mh[:, 0].astype(object) + (mh[:, 1].astype(object) << 32)
                     + (mh[:, 2].astype(object) << 64))
                for frac in (0.0, 0.37, 0.999, 1.0):
                    xs = [int(int(mm) * frac) for mm in m]
                    xs = [x_ - 1 if frac == 1.0 and x_ > 0 else x_ for x_ in xs]
                    xh = np.array([x_ >> 64 for x_ in xs], np.uint64)
                    xl = np.array([x_ & (2**64 - 1) for x_ in xs], np.uint64)
                    th = np.empty(b, np.int64)
                    td = cp.empty(b, cp.int64)
                    hk.residual_find(ts, draw_at, *qa, lo, total, xh, xl, th)
                    dk.residual_find(cp.asarray(ts), cp.asarray(draw_at), *qad, lo,
                                     cp.asarray(total), cp.asarray(xh), cp.asarray(xl), td)
                    _eq(cp, th, td, f"residual_find {qform} shard {lo}:{hi} frac={frac}")
            gm = _c(np.stack(masses))
            ho = [np.empty(b, np.int32), np.empty(b, np.uint64), np.empty(b, np.uint64),
                  np.empty(b, np.int32)]
            do = [cp.empty(b, cp.int32), cp.empty(b, cp.uint64), cp.empty(b, cp.uint64),
                  cp.empty(b, cp.int32)]
            hk.correction_pick(gm, draw_at, seed, gen, rnd, pos, *ho)
            dk.correction_pick(cp.asarray(gm), cp.asarray(draw_at),
                               *(cp.asarray(_c(a)) for a in (seed, gen, rnd, pos)), *do)
            for name, a, x in zip(("owner", "rel_hi", "rel_lo", "status"), ho, do):
                _eq(cp, a, x, f"correction_pick {name} {qform}")


def test_tickets_and_zero_mass(mods):
    cp, hk, dk = mods
    b = 64
    seed, gen, rnd, pos = _keys(b, seed=12345)
    th, td = np.empty(b, np.int64), cp.empty(b, cp.int64)
    hk.proposal_tickets(seed, gen, rnd, pos, th)
    dk.proposal_tickets(*(cp.asarray(_c(a)) for a in (seed, gen, rnd, pos)), td)
    _eq(cp, th, td, "proposal tickets")
    # zero-mass shards and a zero total: the pick reports -2
    mass = np.zeros((3, b, 3), np.int64)
    mass[1, ::2, 0] = 5
    mass[2, ::3, 2] = 1
    draw_at = np.zeros(b, np.int32)
    ho = [np.empty(b, np.int32), np.empty(b, np.uint64), np.empty(b, np.uint64),
          np.empty(b, np.int32)]
    do = [cp.empty(b, cp.int32), cp.empty(b, cp.uint64), cp.empty(b, cp.uint64),
          cp.empty(b, cp.int32)]
    hk.correction_pick(mass, draw_at, seed, gen, rnd, pos, *ho)
    dk.correction_pick(cp.asarray(mass), cp.asarray(draw_at),
                       *(cp.asarray(_c(a)) for a in (seed, gen, rnd, pos)), *do)
    for name, a, x in zip(("owner", "rel_hi", "rel_lo", "status"), ho, do):
        _eq(cp, a, x, f"correction_pick {name}")
    assert (ho[0] == -2).any() and (ho[0] >= 0).any()


def test_hostile_ids_fail_closed(mods):
    """Candidate ids outside [0, V) in gathered payloads and a shard outside [0, V): a
    status, the same as the CPU's, never an out-of-range access."""
    cp, hk, dk = mods
    b, k, v = 3, 4, 50
    g = np.full((2, b, 1 + 2 * k), -1, np.int32)
    g[:, :, 0] = 0
    g[0, :, 1] = np.float32(1.0).view(np.int32)
    g[0, 0, 1 + k] = v + 7  # id >= V
    g[0, 1, 1 + k] = 2**31 - 1
    g[0, 2, 1 + k] = 3
    temp = np.ones(b)
    greedy = np.zeros(b, np.uint8)
    seed, gen, rnd, pos = _keys(b)
    outs_h = [np.empty(b, np.int32), np.empty((b, k), np.uint32), np.empty((b, k), np.int32),
              np.empty(b, np.int32), np.empty(b, np.int32)]
    outs_d = [cp.empty(b, cp.int32), cp.empty((b, k), cp.uint32), cp.empty((b, k), cp.int32),
              cp.empty(b, cp.int32), cp.empty(b, cp.int32)]
    hk.merge(g, False, k, temp, greedy, 0, v, k, seed, gen, rnd, pos, *outs_h)
    dk.merge(cp.asarray(g), False, k, cp.asarray(temp), cp.asarray(greedy), 0, v, k,
             *(cp.asarray(_c(a)) for a in (seed, gen, rnd, pos)), *outs_d)
    for a, x in zip(outs_h, outs_d):
        _eq(cp, a, x, "merge with hostile ids")
    assert outs_h[3][0] == 17 and outs_h[3][1] == 17 and outs_h[3][2] == 0
    with pytest.raises(ValueError, match="vocab_offset"):
        dk.topk(cp.zeros((1, 4), cp.float32), None, cp.ones(1), cp.zeros(1, cp.uint8), 2, 48, v,
                cp.empty((1, 5), cp.int32))
    with pytest.raises(TypeError, match="dtype"):
        dk.topk(cp.zeros((1, 4), cp.float64), None, cp.ones(1), cp.zeros(1, cp.uint8), 2, 0, v,
                cp.empty((1, 5), cp.int32))
