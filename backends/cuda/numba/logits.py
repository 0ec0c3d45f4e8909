"""Numba-CUDA kernel of ``verify(..., logits=True)`` for the ``numba`` backend.

One thread per request (a grid-stride loop over requests; the scratch rows
belong to a thread slot, not to a request): the thread checks the request's
parameters, builds the processed target of each row (docs/semantics.md,
section 2 "Target logits"; dyadic/reference/target_logits.py) in its scratch
row and decides the request as dyadic/reference/sampling.verify_fixed_rows.
The processed target of a row is built once to check every row in order and
again where a decision reads it (the rows are not all kept: the scratch is
three rows of V words per slot).  The selections are the C core's
(backends/include/dyadic_core.h: dy_select_top, dy_select_mass): MSD radix
passes on 8-bit digits over the order keys of z.  Correctness, not speed, is
this backend's job.

Every id read from the data is checked before it addresses memory: draft ids
in [0, V), sparse q rows in full (ids strictly ascending in [0, V), padding
last, counts summing to 2**24), a dense q count at a draft <= 2**24, a dense q
row summing to 2**24 where the residual reads it.  A request breaking a rule
fails closed (status, accepted 0, tokens -1); the check order is that of
``target_logits.verify_row_logits`` (with ``num_drafts``, a count outside [0, k]
first, then the request cut to its depth: nothing beyond is read).
"""

import math

import numpy as np
from numba import cuda

from dyadic import _spec, _status

from .core import (U, U0, U1, U24, U40, F32_MAG, F32_ONE, TOTAL, accept_decision, add128,
                   device, draw_block, f32_mant_exp, f64_key, key_words, lt128, mul64, sub128,
                   uniform_below, weight_from_gap)

U8 = U(8)
U255 = U(255)
TOTAL_INT = _spec.TOTAL
DOMAIN_PROPOSAL = _spec.DOMAIN_PROPOSAL
X_NAN, X_POSINF, X_ZERO_MASS = _status.X_NAN, _status.X_POSINF, _status.X_ZERO_MASS
U39 = U(_spec.WEIGHT_BITS)
NEG_ZERO_F32 = U(0x80000000)
DOMAIN_ACCEPTANCE = _spec.DOMAIN_ACCEPTANCE
DOMAIN_CORRECTION = _spec.DOMAIN_CORRECTION
PAD_ID = _spec.PAD_ID
TARGET_INVALID_VALUE = _status.TARGET_INVALID_VALUE
TARGET_ZERO_MASS = _status.TARGET_ZERO_MASS
TEMPERATURE_INVALID = _status.TEMPERATURE_INVALID
TOP_K_INVALID = _status.TOP_K_INVALID
TOP_P_INVALID = _status.TOP_P_INVALID
MIN_P_INVALID = _status.MIN_P_INVALID
DRAFT_OUT_OF_RANGE = _status.DRAFT_OUT_OF_RANGE
Q_INVALID = _status.Q_INVALID
Q_ZERO_AT_DRAFT = _status.Q_ZERO_AT_DRAFT
RNG_EXHAUSTED = _status.RNG_EXHAUSTED
NUM_DRAFTS_INVALID = _status.NUM_DRAFTS_INVALID
ALLOC_INCONSISTENT = _status.ALLOC_INCONSISTENT
MAX_SLOTS = 64  # threads (and scratch rows of 3 x 8 + 2 x 4 bytes per token) of one launch


@device
def f32_ceil24(bits):
    """ceil(f * 2**24) of a finite float32 f >= 0 given as bits (uint64)."""
    m, e = f32_mant_exp(bits & F32_MAG)
    s = e + 24
    if s >= 0:
        if s < 40:
            return m << U(s)
        return U0
    if s <= -40:
        return U1 if m > U0 else U0
    return (m + ((U1 << U(-s)) - U1)) >> U(-s)


@device
def params_status(t, top_k, pbits, mbits):
    """target_logits.params_status (top_p / min_p as float32 bits in uint64)."""
    if not (t >= 0.0 and t < math.inf):
        return TEMPERATURE_INVALID
    if top_k < 0:
        return TOP_K_INVALID
    if not (pbits >= U1 and pbits <= F32_ONE):
        return TOP_P_INVALID
    if not (mbits <= F32_ONE or mbits == NEG_ZERO_F32):
        return MIN_P_INVALID
    return 0


@device
def logits_argmax(xf, b, i, n):
    """(status, argmax) of row (b, i) by float value, ties to the lowest id."""
    best = 0.0
    arg = -1
    for v in range(n):
        x = np.float64(xf[b, i, v])
        if x != x or x == math.inf:
            return TARGET_INVALID_VALUE, -1
        if x == -math.inf:
            continue
        if arg < 0 or x > best:
            best = x
            arg = v
    if arg < 0:
        return TARGET_ZERO_MASS, -1
    return 0, arg


@device
def radix_prefix(KEY, ID, P, s, n, need, weighted, IDX, hist):
    """The k largest keys (``weighted`` False, need = k) or the shortest prefix of
    mass ``need`` (``weighted``: masses P[s, ID[s, j]]) over KEY[s, :n] in the
    order key descending, position ascending.  Returns (tau, rest): every key
    above tau is in, and the first positions with key == tau up to a count
    (mass) of rest."""
    sh = 56
    prefix = U0
    m = n
    have_idx = False
    while True:
        for d in range(256):
            hist[d] = U0
        for ii in range(m):
            j = IDX[s, ii] if have_idx else ii
            w = P[s, ID[s, j]] if weighted else U1
            hist[np.int64((KEY[s, j] >> U(sh)) & U255)] += w
        acc = U0
        d = 255
        while d > 0:
            if acc + hist[d] >= need:
                break
            acc += hist[d]
            d -= 1
        need = need - acc
        prefix = prefix | (U(d) << U(sh))
        m2 = 0
        for ii in range(m):
            j = IDX[s, ii] if have_idx else ii
            if ((KEY[s, j] >> U(sh)) & U255) == U(d):
                IDX[s, m2] = j
                m2 += 1
        m = m2
        have_idx = True
        if sh == 0:
            break
        sh -= 8
    return prefix, need


@device
def z_of(xf, bias, has_bias, brow, b, i, v, t):
    """z = (x + bias) / t in binary64 (fixedpoint.effective_logit); np.float64, not
    float(): compiled numba types float(float32) as float32."""
    x = np.float64(xf[b, i, v])
    if has_bias:
        x = x + np.float64(bias[brow, v])
    return x / t


@device
def processed_row(xf, b, i, n, t, top_k, pbits, mbits, P, KEY, ID, IDX, hist, s,
                  bias, has_bias, brow):
    """(status, sum W, argmax) of row (b, i) at temperature t > 0; P[s, :n] receives
    the kept weights (target_logits.weights_row; z with the bias row ``brow`` of
    ``bias`` when ``has_bias``: allocate / propose)."""
    zmax = -math.inf
    arg = -1
    for v in range(n):
        z = z_of(xf, bias, has_bias, brow, b, i, v, t)
        if not z < math.inf:
            return TARGET_INVALID_VALUE, U0, -1
        if z > zmax:
            zmax = z
            arg = v
    if not zmax > -math.inf:
        return TARGET_ZERO_MASS, U0, -1
    mpw = f32_ceil24(mbits) << U39
    cnt = 0
    for v in range(n):
        z = z_of(xf, bias, has_bias, brow, b, i, v, t)
        w = weight_from_gap(zmax - z)
        P[s, v] = U0
        if z > -math.inf and (w << U24) >= mpw:
            KEY[s, cnt] = f64_key(z)
            ID[s, cnt] = v
            P[s, v] = w
            cnt += 1
    if top_k > 0 and top_k < cnt:
        tau, need = radix_prefix(KEY, ID, P, s, cnt, U(top_k), False, IDX, hist)
        ties = U0
        m = 0
        for j in range(cnt):
            kj = KEY[s, j]
            keep = kj > tau
            if kj == tau and ties < need:
                ties += U1
                keep = True
            if keep:
                KEY[s, m] = kj
                ID[s, m] = ID[s, j]
                m += 1
            else:
                P[s, ID[s, j]] = U0
        cnt = m
    u = f32_ceil24(pbits)
    if u < TOTAL:
        ts = U0
        for j in range(cnt):
            ts += P[s, ID[s, j]]
        h, l = mul64(u, ts)
        h, l = add128(h, l, U0, TOTAL - U1)
        need = (h << U40) | (l >> U24)
        m = 0
        for j in range(cnt):
            if P[s, ID[s, j]] > U0:
                KEY[s, m] = KEY[s, j]
                ID[s, m] = ID[s, j]
                m += 1
        cnt = m
        tau, rest = radix_prefix(KEY, ID, P, s, cnt, need, True, IDX, hist)
        cum = U0
        for j in range(cnt):
            kj = KEY[s, j]
            if kj > tau:
                continue
            if kj == tau and cum < rest:
                cum += P[s, ID[s, j]]
                continue
            P[s, ID[s, j]] = U0
    total = U0
    for v in range(n):
        total += P[s, v]
    return 0, total, arg


@device
def bitlen(x):
    n = 0
    while x > U0:
        x = x >> U1
        n += 1
    return n


@device
def target_of(xf, b, i, n, g, t, top_k, pbits, mbits, P, KEY, ID, IDX, hist, s):
    """(status, T, argmax) of row (b, i): greedy rows by logits_argmax (T = 1); else
    the kept weights scaled into [2**62, 2**63] (target_logits.processed_row)."""
    if g:
        st, arg = logits_argmax(xf, b, i, n)
        return st, U1, arg
    # no bias: xf[b] stands for it ([k+1, V], never read), a 2-D array as the bias of
    # allocate, so that compiled numba types z_of's unused bias branch
    st, total, arg = processed_row(xf, b, i, n, t, top_k, pbits, mbits, P, KEY, ID, IDX, hist,
                                   s, xf[b], False, 0)
    if st != 0:
        return st, total, arg
    sh = 62 - (bitlen(total) - 1)
    if sh > 0:
        for v in range(n):
            P[s, v] = P[s, v] << U(sh)
        total = total << U(sh)
    return st, total, arg


@device
def sparse_valid(qc, qi, b, i, n):
    """A sparse q row is a Dyadic row over [0, n) (sampling.sparse_row_valid)."""
    prev = -1
    pad = False
    total = U0
    for j in range(qc.shape[2]):
        t_id = np.int64(qi[b, i, j])
        c = U(qc[b, i, j])
        if t_id == PAD_ID:
            if c > U0:
                return False
            pad = True
            continue
        if pad or t_id <= prev or t_id >= n or c > TOTAL:
            return False
        prev = t_id
        total += c
    return total == TOTAL


@device
def q_count(qc, qi, qmode, b, i, v, d):
    """q count at token v of draft step i (q rows already checked)."""
    if qmode == 0:
        return TOTAL if v == d else U0
    if qmode == 1:
        return U(qc[b, i, v])
    for j in range(qc.shape[2]):
        if np.int64(qi[b, i, j]) == v:
            return U(qc[b, i, j])
    return U0


@device
def residual_at(p, c, total):
    """R = max(P 2**24 - c T, 0) as (hi, lo)."""
    ph = p >> U40
    pl = p << U24
    mh, ml = mul64(c, total)
    if lt128(mh, ml, ph, pl):
        return sub128(ph, pl, mh, ml)
    return U0, U0


@device
def verify_request(xf, draft, qc, qi, qmode, greedy, temp, topk, topp, minp, seed, gen, rnd,
                   pos, accepted, tokens, status, P, KEY, ID, IDX, hist, b, s, nd, ragged):
    k1_all = xf.shape[1]
    n = xf.shape[2]
    for j in range(k1_all):
        tokens[b, j] = -1
    accepted[b] = 0
    k = k1_all - 1
    if ragged:  # num_drafts: the request is cut to depth n_b, checked before any read
        nb = np.int64(nd[b])
        if nb < 0 or nb > k:
            status[b] = NUM_DRAFTS_INVALID
            return
        k = nb
    k1 = k + 1
    sd, ge, ro, p0 = key_words(seed, gen, rnd, pos, b)
    t = np.float64(temp[b])
    tk = np.int64(topk[b])
    pbits = U(topp[b])
    mbits = U(minp[b])
    st = params_status(t, tk, pbits, mbits)
    g = greedy[b] != 0 or t == 0.0
    if st == 0:
        for i in range(k1):
            st, _, _ = target_of(xf, b, i, n, g, t, tk, pbits, mbits, P, KEY, ID, IDX, hist, s)
            if st != 0:
                break
    if st == 0:
        for i in range(k):
            d = np.int64(draft[b, i])
            if d < 0 or d >= n:
                st = DRAFT_OUT_OF_RANGE
                break
    if st == 0 and not g and qmode != 0:
        for i in range(k):
            if qmode == 1:
                bad = U(qc[b, i, np.int64(draft[b, i])]) > TOTAL
            else:
                bad = not sparse_valid(qc, qi, b, i, n)
            if bad:
                st = Q_INVALID
                break
    if st == 0 and not g:
        for i in range(k):
            d = np.int64(draft[b, i])
            if q_count(qc, qi, qmode, b, i, d, d) == U0:
                st = Q_ZERO_AT_DRAFT
                break
    if st != 0:
        status[b] = st
        return
    acc = k
    tok = -1
    for i in range(k):
        d = np.int64(draft[b, i])
        _, total, arg = target_of(xf, b, i, n, g, t, tk, pbits, mbits, P, KEY, ID, IDX, hist,
                                  s)
        if g:
            if d == arg:
                continue
            acc = i
            tok = arg
            break
        c = q_count(qc, qi, qmode, b, i, d, d)
        ok, rng_ok = accept_decision(P[s, d], total, c, sd, ge, ro, p0 + U(i),
                                     DOMAIN_ACCEPTANCE)
        if not rng_ok:
            st = RNG_EXHAUSTED
            break
        if ok:
            continue
        acc = i
        if qmode == 1:
            qsum = U0
            for v in range(n):
                qsum += U(qc[b, i, v])
            if qsum != TOTAL:
                st = Q_INVALID
                break
        sh_, sl_ = U0, U0
        for v in range(n):
            rh, rl = residual_at(P[s, v], q_count(qc, qi, qmode, b, i, v, d), total)
            sh_, sl_ = add128(sh_, sl_, rh, rl)
        if sh_ == U0 and sl_ == U0:
            st = ALLOC_INCONSISTENT
            break
        xh, xl, _, good = uniform_below(sh_, sl_, sd, ge, ro, p0 + U(i), DOMAIN_CORRECTION, 0)
        if not good:
            st = RNG_EXHAUSTED
            break
        ah, al = U0, U0
        for v in range(n):
            rh, rl = residual_at(P[s, v], q_count(qc, qi, qmode, b, i, v, d), total)
            ah, al = add128(ah, al, rh, rl)
            if lt128(xh, xl, ah, al):
                tok = v
                break
        if tok < 0:
            st = ALLOC_INCONSISTENT
        break
    if st == 0 and acc == k:
        _, total, arg = target_of(xf, b, k, n, g, t, tk, pbits, mbits, P, KEY, ID, IDX, hist,
                                  s)
        if g:
            tok = arg
        else:
            _, xl, _, good = uniform_below(U0, total, sd, ge, ro, p0 + U(k), DOMAIN_CORRECTION,
                                           0)
            if not good:
                st = RNG_EXHAUSTED
            else:
                run = U0
                for v in range(n):
                    run += P[s, v]
                    if run > xl:
                        tok = v
                        break
    if st != 0:
        status[b] = st
        for j in range(k1_all):
            tokens[b, j] = -1
        return
    for j in range(k1):
        if j < acc:
            tokens[b, j] = draft[b, j]
        elif j == acc:
            tokens[b, j] = tok
    accepted[b] = acc
    status[b] = 0


@cuda.jit
def verify_logits_kernel(xf, draft, qc, qi, qmode, greedy, temp, topk, topp, minp, seed, gen,
                         rnd, pos, accepted, tokens, status, P, KEY, ID, IDX, nd, ragged):
    s = np.int64(cuda.grid(1))
    slots = np.int64(P.shape[0])
    if s >= slots:
        return
    hist = cuda.local.array(256, np.uint64)
    b = s
    while b < status.shape[0]:
        verify_request(xf, draft, qc, qi, qmode, greedy, temp, topk, topp, minp, seed, gen,
                       rnd, pos, accepted, tokens, status, P, KEY, ID, IDX, hist, b, s, nd,
                       ragged)
        b += slots


# ---------------------------------------------------------------- allocate / propose with filters


@device
def allocate_on(P, KEY, ID, IDX, hist, s, n, policy, argpos, counts, b):
    """Floor + largest remainders (policy 0) or floor-first over the n candidates
    (weights P[s, ID[s, j]]), counts in counts[b, :n] (allocation.allocate_weights,
    the C core's dy_alloc_weights)."""
    total = U0
    for j in range(n):
        total += P[s, ID[s, j]]
    if total == U0:
        return X_ZERO_MASS
    sumbase = U0
    for j in range(n):
        w = P[s, ID[s, j]] << U24
        q = w // total
        counts[b, j] = q
        KEY[s, j] = w - q * total
        sumbase += q
    if sumbase > TOTAL or sumbase == U0:
        return ALLOC_INCONSISTENT
    remaining = TOTAL - sumbase
    if remaining == U0:
        return 0
    if policy == 0:
        if remaining > U(n):
            return ALLOC_INCONSISTENT
        tau, need = radix_prefix(KEY, ID, P, s, n, remaining, False, IDX, hist)
        ties = U0
        for j in range(n):
            kj = KEY[s, j]
            if kj > tau:
                counts[b, j] = counts[b, j] + 1
            elif kj == tau and ties < need:
                ties += U1
                counts[b, j] = counts[b, j] + 1
    else:
        counts[b, argpos] = counts[b, argpos] + remaining
    return 0


@device
def filtered_row(xf, bias, has_bias, temp, topk, topp, minp, policy, width, do_draw, seed, gen,
                 rnd, pos, tokens, counts, ids, P, KEY, ID, IDX, hist, b, s):
    """Row b of allocate / propose with top_p / min_p; returns its status
    (allocation.allocate_filtered_row, the C core's dy_allocate_filtered_row /
    dy_propose_filtered_row)."""
    n = xf.shape[2]
    brow = b if bias.shape[0] > 1 else 0
    t = np.float64(temp[b])
    tk = np.int64(topk[b])
    if tk < 0 or (width > 0 and tk < 1):
        return TOP_K_INVALID
    if width > 0 and tk > width:
        tk = np.int64(width)
    pbits = U(topp[b])
    mbits = U(minp[b])
    st = params_status(1.0, tk, pbits, mbits)
    if st != 0:
        return st
    greedy = do_draw != 0 and t == 0.0
    tz = 1.0 if greedy else t
    zmax = -math.inf
    arg = -1
    for v in range(n):
        z = z_of(xf, bias, has_bias, brow, b, 0, v, tz)
        if z != z:
            return X_NAN
        if z == math.inf:
            return X_POSINF
        if z > zmax:
            zmax = z
            arg = v
    if arg < 0:
        return X_ZERO_MASS
    if greedy:
        w_ = width if width > 0 else n
        for j in range(w_):
            counts[b, j] = 0
            if width > 0:
                ids[b, j] = PAD_ID
        if width > 0:
            counts[b, 0] = TOTAL_INT
            ids[b, 0] = arg
        else:
            counts[b, arg] = TOTAL_INT
        tokens[b] = arg
        return 0
    st, _, arg = processed_row(xf, b, 0, n, t, tk, pbits, mbits, P, KEY, ID, IDX, hist, s,
                               bias, has_bias, brow)
    if st != 0:
        return ALLOC_INCONSISTENT  # unreachable after the checks above
    if width == 0:
        for v in range(n):
            ID[s, v] = v
        st = allocate_on(P, KEY, ID, IDX, hist, s, n, policy, arg, counts, b)
        if st != 0:
            return st
    else:
        m = 0
        argpos = 0
        for v in range(n):
            if P[s, v] > U0:
                if m == width:
                    return ALLOC_INCONSISTENT  # unreachable: top_k <= width
                if v == arg:
                    argpos = m
                ID[s, m] = v
                m += 1
        st = allocate_on(P, KEY, ID, IDX, hist, s, m, policy, argpos, counts, b)
        if st != 0:
            return st
        o = 0
        for j in range(m):
            c = counts[b, j]
            if c > 0:
                counts[b, o] = c
                ids[b, o] = ID[s, j]
                o += 1
        for j in range(o, width):
            counts[b, j] = 0
            ids[b, j] = PAD_ID
    if do_draw != 0:
        sd, ge, ro, p0 = key_words(seed, gen, rnd, pos, b)
        w0, _, _, _ = draw_block(sd, ge, ro, p0, DOMAIN_PROPOSAL, 0)
        r = w0 >> U8
        run = U0
        w_ = width if width > 0 else n
        for j in range(w_):
            run += U(counts[b, j])
            if run > r:
                tokens[b] = ids[b, j] if width > 0 else j
                break
    return 0


@cuda.jit
def alloc_filtered_kernel(xf, bias, has_bias, temp, topk, topp, minp, policy, width, do_draw,
                          seed, gen, rnd, pos, tokens, counts, ids, status, P, KEY, ID, IDX):
    s = np.int64(cuda.grid(1))
    slots = np.int64(P.shape[0])
    if s >= slots:
        return
    hist = cuda.local.array(256, np.uint64)
    b = s
    while b < status.shape[0]:
        if do_draw != 0:
            tokens[b] = -1
        st = filtered_row(xf, bias, has_bias, temp, topk, topp, minp, policy, width, do_draw,
                          seed, gen, rnd, pos, tokens, counts, ids, P, KEY, ID, IDX, hist, b, s)
        status[b] = st
        if st != 0:
            for j in range(counts.shape[1]):
                counts[b, j] = 0
                if width > 0:
                    ids[b, j] = PAD_ID
            if do_draw != 0:
                tokens[b] = -1
        b += slots
