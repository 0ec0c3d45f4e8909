"""Numba-CUDA kernels of the ``numba`` backend (one block per row).

``alloc_kernel`` does allocate and propose: validation and the row maximum
(block reductions), integer weights, top-k support (radix select on an
order-preserving key, ties to the lowest id by a block scan), the integer sum,
floor + largest remainders (radix select on the remainders) or floor-first,
the sparse compaction (block scan) and the proposal draw (chunk scan).
``verify_kernel`` checks all k+1 target rows (128-bit sums), walks the
acceptance chain, and builds the residual only for the row that needs it.
Scratch rows live in global memory (one row per block).
"""

import math

from numba import cuda

from dyadic import _spec, _status

from .numba_core import (
    U, F32_INF, F32_MAG, MAX_TPB, TARGET_ONE, TARGET_TOL, TOTAL, U0, U1, U24, U40, U8,
    accept_decision, add128, apply_select, block_argmax, block_exscan128, block_sum128, chunk_of,
    draw_block, effective_logit, f32_mant_exp, f64_key, first_exceeding, key_words, lt128, mul64,
    philox, radix_select, shift_floor, sub128, target_fixed, uniform_below, weight_from_gap)

import numpy as np

DOMAIN_PROPOSAL = _spec.DOMAIN_PROPOSAL
DOMAIN_ACCEPTANCE = _spec.DOMAIN_ACCEPTANCE
DOMAIN_CORRECTION = _spec.DOMAIN_CORRECTION
PAD_ID = _spec.PAD_ID
TOTAL_INT = _spec.TOTAL
X_NAN, X_POSINF, X_NEGATIVE = _status.X_NAN, _status.X_POSINF, _status.X_NEGATIVE
X_ZERO_MASS, ALLOC_INCONSISTENT = _status.X_ZERO_MASS, _status.ALLOC_INCONSISTENT
TARGET_INVALID_VALUE, TARGET_SUM = _status.TARGET_INVALID_VALUE, _status.TARGET_SUM
Q_ZERO_AT_DRAFT, RNG_EXHAUSTED = _status.Q_ZERO_AT_DRAFT, _status.RNG_EXHAUSTED
U31 = U(31)


@cuda.jit
def philox_kernel(counters, keys, rounds, out):
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < counters.shape[0]:
        c0, c1, c2, c3 = philox(U(counters[i, 0]), U(counters[i, 1]), U(counters[i, 2]),
                                U(counters[i, 3]), U(keys[i, 0]), U(keys[i, 1]), rounds)
        out[i, 0] = c0
        out[i, 1] = c1
        out[i, 2] = c2
        out[i, 3] = c3
        i += stride


@cuda.jit(device=True)
def logit_code(z):
    if z != z:
        return X_NAN
    if z == math.inf:
        return X_POSINF
    return 0


@cuda.jit(device=True)
def prob_code(bits):
    mag = bits & F32_MAG
    if mag > F32_INF:
        return X_NAN
    if bits == F32_INF:
        return X_POSINF
    if (bits >> U31) > U0 and mag > U0:
        return X_NEGATIVE
    return 0


@cuda.jit
def alloc_kernel(xf, xbits, bias, has_bias, temp, logits, policy, top_k, do_draw,
                 seed, gen, rnd, pos, tokens, counts, ids, sparse, status, W, KEY, CNT):
    b = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    tpb = cuda.blockDim.x
    n = KEY.shape[1]
    sh_k = cuda.shared.array(MAX_TPB, np.uint64)
    sh_i = cuda.shared.array(MAX_TPB, np.int64)
    sh_h = cuda.shared.array(MAX_TPB, np.uint64)
    sh_l = cuda.shared.array(MAX_TPB, np.uint64)
    sh_hist = cuda.shared.array(256, np.int32)
    sh_misc = cuda.shared.array(4, np.int64)

    t = np.float64(temp[b])
    zero_temp = do_draw != 0 and t == 0.0
    tt = 1.0 if zero_temp else t
    brow = b if bias.shape[0] > 1 else 0

    # pass 1: first invalid element, argmax (largest key, lowest id), rank keys
    bad_idx = n
    best_k = U0
    best_i = n
    for v in range(tid, n, tpb):
        if logits:
            z = effective_logit(xf, bias, has_bias, b, brow, v, tt)
            code = logit_code(z)
            if code == 0:
                key = f64_key(z)
                KEY[b, v] = key
                if z > -math.inf and key > best_k:
                    best_k = key
                    best_i = v
        else:
            bits = U(xbits[b, v])
            code = prob_code(bits)
            if code == 0:
                key = bits & F32_MAG
                KEY[b, v] = key
                if key > best_k:
                    best_k = key
                    best_i = v
        if code != 0 and bad_idx == n:
            bad_idx = v
    bk, bi = block_argmax(U1 if bad_idx < n else U0, bad_idx, sh_k, sh_i, tid, tpb)
    st = 0
    if bk == U1:
        if logits:
            st = logit_code(effective_logit(xf, bias, has_bias, b, brow, bi, tt))
        else:
            st = prob_code(U(xbits[b, bi]))
    arg = -1
    if st == 0:
        mk, arg = block_argmax(best_k, best_i, sh_k, sh_i, tid, tpb)
        if arg >= n:
            st = X_ZERO_MASS
    if st != 0:
        if tid == 0:
            status[b] = st
            if do_draw:
                tokens[b] = -1
        return

    width = counts.shape[1]
    if zero_temp:  # argmax, point mass, no draw
        if sparse:
            for j in range(tid, width, tpb):
                ids[b, j] = arg if j == 0 else PAD_ID
                counts[b, j] = TOTAL_INT if j == 0 else 0
        else:
            for j in range(tid, width, tpb):
                counts[b, j] = TOTAL_INT if j == arg else 0
        if tid == 0:
            tokens[b] = arg
            status[b] = 0
        return

    # pass 2: integer weights
    if logits:
        zmax = effective_logit(xf, bias, has_bias, b, brow, arg, tt)
        for v in range(tid, n, tpb):
            z = effective_logit(xf, bias, has_bias, b, brow, v, tt)
            W[b, v] = weight_from_gap(zmax - z)
    else:
        _, emax = f32_mant_exp(U(xbits[b, arg]) & F32_MAG)
        for v in range(tid, n, tpb):
            m, e = f32_mant_exp(U(xbits[b, v]) & F32_MAG)
            W[b, v] = shift_floor(m, e - emax + 15) if m > U0 else U0
    cuda.syncthreads()

    # top-k support: weights outside it become 0 (same allocation, see allocation.py)
    if top_k > 0 and top_k < n:
        thr, take = radix_select(KEY, b, n, top_k, sh_hist, sh_misc, tid, tpb)
        apply_select(KEY, W, b, n, thr, take, 0, sh_h, sh_l, tid, tpb)

    # S = sum of weights (< 2**63)
    sh_, sl_ = U0, U0
    for v in range(tid, n, tpb):
        sl_ = sl_ + W[b, v]  # a thread's partial sum of < 2**63 weights cannot wrap
    s_h, s_l = block_sum128(U0, sl_, sh_h, sh_l, tid, tpb)
    if s_l == U0:
        if tid == 0:
            status[b] = X_ZERO_MASS
            if do_draw:
                tokens[b] = -1
        return

    # floor and remainders
    base_sum = U0
    for v in range(tid, n, tpb):
        p = W[b, v] << U24
        q = p // s_l
        CNT[b, v] = q
        KEY[b, v] = p - q * s_l
        base_sum = base_sum + q
    bh, bl = block_sum128(U0, base_sum, sh_h, sh_l, tid, tpb)
    if bh != U0 or bl > TOTAL or bl == U0:
        if tid == 0:
            status[b] = ALLOC_INCONSISTENT
            if do_draw:
                tokens[b] = -1
        return
    remaining = TOTAL - bl
    if remaining > U0:
        if policy == 0:
            thr, take = radix_select(KEY, b, n, np.int64(remaining), sh_hist, sh_misc, tid, tpb)
            apply_select(KEY, CNT, b, n, thr, take, 1, sh_h, sh_l, tid, tpb)
        else:
            if tid == 0:
                CNT[b, arg] = CNT[b, arg] + remaining
            cuda.syncthreads()

    # final check: counts sum to exactly 2**24
    csum = U0
    nnz = U0
    for v in range(tid, n, tpb):
        csum = csum + CNT[b, v]
    ch, cl = block_sum128(U0, csum, sh_h, sh_l, tid, tpb)
    if ch != U0 or cl != TOTAL:
        if tid == 0:
            status[b] = ALLOC_INCONSISTENT
            if do_draw:
                tokens[b] = -1
        return

    # outputs
    if sparse:
        lo, hi = chunk_of(n, tid, tpb)
        for v in range(lo, hi):
            if CNT[b, v] > U0:
                nnz += U1
        _, off = block_exscan128(U0, nnz, sh_h, sh_l, tid, tpb)
        _, total_nnz = block_sum128(U0, nnz, sh_h, sh_l, tid, tpb)
        j = np.int64(off)
        for v in range(lo, hi):
            c = CNT[b, v]
            if c > U0:
                ids[b, j] = v
                counts[b, j] = c
                j += 1
        for j in range(np.int64(total_nnz) + tid, width, tpb):
            ids[b, j] = PAD_ID
            counts[b, j] = 0
    else:
        for v in range(tid, n, tpb):
            counts[b, v] = CNT[b, v]
    if do_draw:
        ks, kg, kr, kp = key_words(seed, gen, rnd, pos, b)
        r = draw_block(ks, kg, kr, kp, DOMAIN_PROPOSAL, 0)[0] >> U8
        tok = first_exceeding(CNT, CNT, False, b, n, U0, r, sh_h, sh_l, sh_k, sh_i, tid, tpb)
        if tid == 0:
            tokens[b] = tok
    if tid == 0:
        status[b] = 0


@cuda.jit
def draw_kernel(counts, ids, sparse, seed, gen, rnd, pos, tokens):
    b = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    tpb = cuda.blockDim.x
    sh_k = cuda.shared.array(MAX_TPB, np.uint64)
    sh_i = cuda.shared.array(MAX_TPB, np.int64)
    sh_h = cuda.shared.array(MAX_TPB, np.uint64)
    sh_l = cuda.shared.array(MAX_TPB, np.uint64)
    ks, kg, kr, kp = key_words(seed, gen, rnd, pos, b)
    r = draw_block(ks, kg, kr, kp, DOMAIN_PROPOSAL, 0)[0] >> U8
    j = first_exceeding(counts, counts, False, b, counts.shape[1], U0, r,
                        sh_h, sh_l, sh_k, sh_i, tid, tpb)
    if tid == 0:
        if j < 0:
            tokens[b] = -1
        elif sparse:
            tokens[b] = ids[b, j]
        else:
            tokens[b] = j


@cuda.jit(device=True)
def row_argmax(tbits, b, i, n, sh_k, sh_i, tid, tpb):
    """first_argmax of target row (b, i): largest magnitude, lowest id."""
    best_k = U0
    best_i = n
    for v in range(tid, n, tpb):
        mag = U(tbits[b, i, v]) & F32_MAG
        if mag > best_k or best_i == n:
            best_k = mag
            best_i = v
    _, arg = block_argmax(best_k, best_i, sh_k, sh_i, tid, tpb)
    return arg


@cuda.jit(device=True)
def q_at(qc, qi, qmode, b, i, d, sh_k, sh_i, tid, tpb):
    """q_i(d) as a count: dense lookup, sparse search (ids ascending), or point mass."""
    if qmode == 0:
        return TOTAL
    if qmode == 1:
        return U(qc[b, i, d])
    wq = qc.shape[2]
    found = -1
    for j in range(tid, wq, tpb):
        if qi[b, i, j] == d:
            found = j
    k, j = block_argmax(U1 if found >= 0 else U0, found, sh_k, sh_i, tid, tpb)
    if k == U0:
        return U0
    return U(qc[b, i, j])


@cuda.jit
def verify_kernel(tbits, draft, qc, qi, qmode, greedy, seed, gen, rnd, pos,
                  accepted, tokens, status, TOT, RH, RL, QD):
    b = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    tpb = cuda.blockDim.x
    k1 = tbits.shape[1]
    k = k1 - 1
    n = tbits.shape[2]
    sh_k = cuda.shared.array(MAX_TPB, np.uint64)
    sh_i = cuda.shared.array(MAX_TPB, np.int64)
    sh_h = cuda.shared.array(MAX_TPB, np.uint64)
    sh_l = cuda.shared.array(MAX_TPB, np.uint64)
    sh_misc = cuda.shared.array(4, np.uint64)
    g = greedy[b] != 0
    sd, ge, ro, p0 = key_words(seed, gen, rnd, pos, b)

    # every target row: valid values, sum within tolerance (exact, 128-bit)
    st = 0
    for i in range(k1):
        bad = U0
        ah, al = U0, U0
        for v in range(tid, n, tpb):
            p, inv = target_fixed(U(tbits[b, i, v]))
            if inv:
                bad = U1
            ah, al = add128(ah, al, U0, p)
        bk, _ = block_argmax(bad, 0, sh_k, sh_i, tid, tpb)
        th, tl = block_sum128(ah, al, sh_h, sh_l, tid, tpb)
        if bk != U0:
            st = TARGET_INVALID_VALUE
            break
        if lt128(th, tl, U0, TARGET_ONE):
            dh, dl = sub128(U0, TARGET_ONE, th, tl)
        else:
            dh, dl = sub128(th, tl, U0, TARGET_ONE)
        if dh != U0 or dl > TARGET_TOL:
            st = TARGET_SUM
            break
        if tid == 0:
            TOT[b, i] = tl
    if st == 0:
        for i in range(k):
            d = draft[b, i]
            # a draft id outside [0, V) fails the request closed before any read at it
            # (check=False on device arrays; the host path raises first)
            if d < 0 or d >= n:
                st = Q_ZERO_AT_DRAFT
                break
            if not g and q_at(qc, qi, qmode, b, i, d, sh_k, sh_i, tid, tpb) == U0:
                st = Q_ZERO_AT_DRAFT
                break
    if st != 0:
        if tid == 0:
            status[b] = st
            accepted[b] = 0
        for j in range(tid, k1, tpb):
            tokens[b, j] = -1
        return
    cuda.syncthreads()

    acc = k
    tok = -1
    for i in range(k):
        d = draft[b, i]
        if g:
            best = row_argmax(tbits, b, i, n, sh_k, sh_i, tid, tpb)
            if d == best:
                continue
            acc = i
            tok = best
            break
        # acceptance test (thread 0), result broadcast through shared memory
        c = q_at(qc, qi, qmode, b, i, d, sh_k, sh_i, tid, tpb)
        if tid == 0:
            total = TOT[b, i]
            pd, _ = target_fixed(U(tbits[b, i, d]))
            acc_ok, rng_ok = accept_decision(pd, total, c, sd, ge, ro, p0 + U(i),
                                             DOMAIN_ACCEPTANCE)
            sh_misc[0] = U1 if acc_ok else U0
            sh_misc[1] = U1 if rng_ok else U0
        cuda.syncthreads()
        ok = sh_misc[0]
        rng = sh_misc[1]
        cuda.syncthreads()
        if rng == U0:
            st = RNG_EXHAUSTED
            break
        if ok == U1:
            continue
        acc = i
        # residual R_v = max(P_v 2^24 - c_v T, 0) over the full vocabulary
        total = TOT[b, i]
        if qmode == 2:
            for v in range(tid, n, tpb):
                QD[b, v] = 0
            cuda.syncthreads()
            for j in range(tid, qc.shape[2], tpb):
                t_id = qi[b, i, j]
                if t_id >= 0:
                    QD[b, t_id] = qc[b, i, j]
            cuda.syncthreads()
        sh_, sl_ = U0, U0
        for v in range(tid, n, tpb):
            p, _ = target_fixed(U(tbits[b, i, v]))
            if qmode == 0:
                c = TOTAL if v == d else U0
            elif qmode == 1:
                c = U(qc[b, i, v])
            else:
                c = U(QD[b, v])
            mh, ml = mul64(c, total)
            ph = p >> U40
            pl = p << U24
            if lt128(mh, ml, ph, pl):
                rh, rl = sub128(ph, pl, mh, ml)
            else:
                rh, rl = U0, U0
            RH[b, v] = rh
            RL[b, v] = rl
            sh_, sl_ = add128(sh_, sl_, rh, rl)
        s_h, s_l = block_sum128(sh_, sl_, sh_h, sh_l, tid, tpb)
        tok = draw_from(RH, RL, True, b, n, s_h, s_l, sd, ge, ro, p0 + U(i),
                        sh_h, sh_l, sh_k, sh_i, sh_misc, tid, tpb)
        if tok < 0:
            st = RNG_EXHAUSTED
        break
    if st == 0 and acc == k:
        if g:
            tok = row_argmax(tbits, b, k, n, sh_k, sh_i, tid, tpb)
        else:
            for v in range(tid, n, tpb):
                p, _ = target_fixed(U(tbits[b, k, v]))
                RL[b, v] = p
            cuda.syncthreads()
            tok = draw_from(RL, RL, False, b, n, U0, TOT[b, k], sd, ge, ro, p0 + U(k),
                            sh_h, sh_l, sh_k, sh_i, sh_misc, tid, tpb)
            if tok < 0:
                st = RNG_EXHAUSTED
    if st != 0:
        if tid == 0:
            status[b] = st
            accepted[b] = 0
        for j in range(tid, k1, tpb):
            tokens[b, j] = -1
        return
    for j in range(tid, k1, tpb):
        if j < acc:
            tokens[b, j] = draft[b, j]
        elif j == acc:
            tokens[b, j] = tok
        else:
            tokens[b, j] = -1
    if tid == 0:
        accepted[b] = acc
        status[b] = 0


@cuda.jit(device=True)
def draw_from(wh, wl, use_hi, b, n, s_h, s_l, sd, ge, ro, p, sh_h, sh_l, sh_k, sh_i,
              sh_misc, tid, tpb):
    """Token with probability w_v / s (domain CORRECTION): thread 0 draws the
    uniform, the block finds the first running sum above it; -1 if RNG ran out."""
    cuda.syncthreads()
    if tid == 0:
        xh, xl, _, good = uniform_below(s_h, s_l, sd, ge, ro, p, DOMAIN_CORRECTION, 0)
        sh_misc[0] = xh
        sh_misc[1] = xl
        sh_misc[2] = U1 if good else U0
    cuda.syncthreads()
    xh = sh_misc[0]
    xl = sh_misc[1]
    good = sh_misc[2]
    cuda.syncthreads()
    if good == U0:
        return -1
    return first_exceeding(wh, wl, use_hi, b, n, xh, xl, sh_h, sh_l, sh_k, sh_i, tid, tpb)
