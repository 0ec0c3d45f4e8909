"""Numba-CUDA kernels of the ``numba`` backend (one block per row).

Rows are on the grid's x dimension and each block walks rows
``blockIdx.x, blockIdx.x + gridDim.x, ...`` (a grid-stride loop), so any batch
size works whatever grid the host launches; the per-row scratch arrays have
one row per block (indexed by ``blockIdx.x``), not one per batch row.

Every id read from the data is checked in the kernel before it addresses
memory, and a row that breaks a rule fails closed (outputs -1), in the order of
``dyadic.reference.sampling.verify_row``: target rows (TARGET_*), draft ids in
[0, V) (DRAFT_OUT_OF_RANGE, greedy requests too), then for non-greedy requests
the q rows (Q_INVALID: a sparse row breaking a Dyadic rule, a dense count above
2**24 at a draft), q_i(d_i) > 0 (Q_ZERO_AT_DRAFT), and a dense row that the
residual reads in full must sum to 2**24 (Q_INVALID); with num_drafts, first the
request's count in [0, k] (NUM_DRAFTS_INVALID), then those rules on its rows only.
``draw_kernel`` gives -1 for a sparse row that is not a Dyadic row over [0, 2**24).  A failed allocate /
propose row gets counts 0, ids PAD_ID and token -1 besides its status.

``alloc_kernel`` does allocate and propose: validation and the row maximum
(block reductions), integer weights, top-k support (radix select on an
order-preserving key, ties to the lowest id by a block scan), the integer sum,
floor + largest remainders (radix select on the remainders) or floor-first,
the sparse compaction (block scan) and the proposal draw (chunk scan).
``verify_kernel`` checks all k+1 target rows (128-bit sums), walks the
acceptance chain, and builds the residual only for the row that needs it.
Scratch rows live in global memory (one row per block of the grid).
"""

import math

from numba import cuda

from dyadic import _spec, _status

from .core import (
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
DRAFT_OUT_OF_RANGE, Q_INVALID = _status.DRAFT_OUT_OF_RANGE, _status.Q_INVALID
NUM_DRAFTS_INVALID = _status.NUM_DRAFTS_INVALID
MAX_ID = _spec.MAX_VOCAB  # a sparse id of any Dyadic lies in [0, MAX_VOCAB)
U31 = U(31)


@cuda.jit
def philox_kernel(counters, keys, rounds, out):
    i = np.int64(cuda.grid(1))
    stride = np.int64(cuda.gridsize(1))
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


@cuda.jit(device=True)
def alloc_fail(counts, ids, sparse, tokens, do_draw, status, b, st, tid, tpb):
    """A failed allocate / propose row: status st, counts 0, ids PAD_ID, token -1."""
    for j in range(tid, counts.shape[1], tpb):
        counts[b, j] = 0
        if sparse:
            ids[b, j] = PAD_ID
    if tid == 0:
        status[b] = st
        if do_draw:
            tokens[b] = -1


@cuda.jit(device=True)
def alloc_row(xf, xbits, bias, has_bias, temp, logits, policy, top_k, do_draw,
              seed, gen, rnd, pos, tokens, counts, ids, sparse, status, W, KEY, CNT,
              b, s, sh_k, sh_i, sh_h, sh_l, sh_hist, sh_misc, tid, tpb):
    """Row b of alloc_kernel; s is the block's scratch row of W, KEY and CNT."""
    n = KEY.shape[1]

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
                KEY[s, v] = key
                if z > -math.inf and key > best_k:
                    best_k = key
                    best_i = v
        else:
            bits = U(xbits[b, v])
            code = prob_code(bits)
            if code == 0:
                key = bits & F32_MAG
                KEY[s, v] = key
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
        alloc_fail(counts, ids, sparse, tokens, do_draw, status, b, st, tid, tpb)
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
            W[s, v] = weight_from_gap(zmax - z)
    else:
        _, emax = f32_mant_exp(U(xbits[b, arg]) & F32_MAG)
        for v in range(tid, n, tpb):
            m, e = f32_mant_exp(U(xbits[b, v]) & F32_MAG)
            W[s, v] = shift_floor(m, e - emax + 15) if m > U0 else U0
    cuda.syncthreads()

    # top-k support: weights outside it become 0 (same allocation, see allocation.py)
    if top_k > 0 and top_k < n:
        thr, take = radix_select(KEY, s, n, top_k, sh_hist, sh_misc, tid, tpb)
        apply_select(KEY, W, s, n, thr, take, 0, sh_h, sh_l, tid, tpb)

    # S = sum of weights (< 2**63)
    sh_, sl_ = U0, U0
    for v in range(tid, n, tpb):
        sl_ = sl_ + W[s, v]  # a thread's partial sum of < 2**63 weights cannot wrap
    s_h, s_l = block_sum128(U0, sl_, sh_h, sh_l, tid, tpb)
    if s_l == U0:
        alloc_fail(counts, ids, sparse, tokens, do_draw, status, b, X_ZERO_MASS, tid, tpb)
        return

    # floor and remainders
    base_sum = U0
    for v in range(tid, n, tpb):
        p = W[s, v] << U24
        q = p // s_l
        CNT[s, v] = q
        KEY[s, v] = p - q * s_l
        base_sum = base_sum + q
    bh, bl = block_sum128(U0, base_sum, sh_h, sh_l, tid, tpb)
    if bh != U0 or bl > TOTAL or bl == U0:
        alloc_fail(counts, ids, sparse, tokens, do_draw, status, b, ALLOC_INCONSISTENT, tid, tpb)
        return
    remaining = TOTAL - bl
    if remaining > U0:
        if policy == 0:
            thr, take = radix_select(KEY, s, n, np.int64(remaining), sh_hist, sh_misc, tid, tpb)
            apply_select(KEY, CNT, s, n, thr, take, 1, sh_h, sh_l, tid, tpb)
        else:
            if tid == 0:
                CNT[s, arg] = CNT[s, arg] + remaining
            cuda.syncthreads()

    # final check: counts sum to exactly 2**24
    csum = U0
    nnz = U0
    for v in range(tid, n, tpb):
        csum = csum + CNT[s, v]
    ch, cl = block_sum128(U0, csum, sh_h, sh_l, tid, tpb)
    if ch != U0 or cl != TOTAL:
        alloc_fail(counts, ids, sparse, tokens, do_draw, status, b, ALLOC_INCONSISTENT, tid, tpb)
        return

    # outputs
    if sparse:
        lo, hi = chunk_of(n, tid, tpb)
        for v in range(lo, hi):
            if CNT[s, v] > U0:
                nnz += U1
        _, off = block_exscan128(U0, nnz, sh_h, sh_l, tid, tpb)
        _, total_nnz = block_sum128(U0, nnz, sh_h, sh_l, tid, tpb)
        if total_nnz > U(width):  # more support than the output row holds: refuse
            alloc_fail(counts, ids, sparse, tokens, do_draw, status, b, ALLOC_INCONSISTENT,
                       tid, tpb)
            return
        j = np.int64(off)
        for v in range(lo, hi):
            c = CNT[s, v]
            if c > U0:
                ids[b, j] = v
                counts[b, j] = c
                j += 1
        for j in range(np.int64(total_nnz) + tid, width, tpb):
            ids[b, j] = PAD_ID
            counts[b, j] = 0
    else:
        for v in range(tid, n, tpb):
            counts[b, v] = CNT[s, v]
    if do_draw:
        ks, kg, kr, kp = key_words(seed, gen, rnd, pos, b)
        r = draw_block(ks, kg, kr, kp, DOMAIN_PROPOSAL, 0)[0] >> U8
        tok = first_exceeding(CNT, CNT, False, s, n, U0, r, sh_h, sh_l, sh_k, sh_i, tid, tpb)
        if tid == 0:
            tokens[b] = tok
    if tid == 0:
        status[b] = 0


@cuda.jit
def alloc_kernel(xf, xbits, bias, has_bias, temp, logits, policy, top_k, do_draw,
                 seed, gen, rnd, pos, tokens, counts, ids, sparse, status, W, KEY, CNT):
    tid = cuda.threadIdx.x
    tpb = cuda.blockDim.x
    sh_k = cuda.shared.array(MAX_TPB, np.uint64)
    sh_i = cuda.shared.array(MAX_TPB, np.int64)
    sh_h = cuda.shared.array(MAX_TPB, np.uint64)
    sh_l = cuda.shared.array(MAX_TPB, np.uint64)
    sh_hist = cuda.shared.array(256, np.int32)
    sh_misc = cuda.shared.array(4, np.int64)
    s = np.int64(cuda.blockIdx.x)
    b = s
    while b < status.shape[0]:
        alloc_row(xf, xbits, bias, has_bias, temp, logits, policy, top_k, do_draw,
                  seed, gen, rnd, pos, tokens, counts, ids, sparse, status, W, KEY, CNT,
                  b, s, sh_k, sh_i, sh_h, sh_l, sh_hist, sh_misc, tid, tpb)
        cuda.syncthreads()
        b += np.int64(cuda.gridDim.x)


@cuda.jit(device=True)
def sparse_entry_bad(t, c, prev, j, hi):
    """Whether entry j (id t, count c; prev = id of entry j - 1) breaks a rule of a
    sparse Dyadic row over [0, hi): valid ids strictly ascending in [0, hi), then
    padding (PAD_ID, count 0) to the end of the row.  Testing every entry against
    its predecessor tests the whole row."""
    if t == PAD_ID:
        return c != U0
    if t < 0 or t >= hi:
        return True
    return j > 0 and (prev == PAD_ID or prev >= t)  # padding before it, or not ascending


@cuda.jit(device=True)
def sparse_verdict(bad, csum, sh_k, sh_i, sh_h, sh_l, tid, tpb):
    """1 if any thread saw a bad entry or the counts do not sum to 2**24, else 0
    (block-wide; counts are unsigned, so a count above 2**24 fails the sum)."""
    k, _ = block_argmax(bad, 0, sh_k, sh_i, tid, tpb)
    ch, cl = block_sum128(U0, csum, sh_h, sh_l, tid, tpb)
    if k != U0 or ch != U0 or cl != TOTAL:
        return U1
    return U0


@cuda.jit(device=True)
def draw_row_bad(counts, ids, b, sh_k, sh_i, sh_h, sh_l, tid, tpb):
    """sparse_verdict of sparse row b of draw (ids bounded by MAX_ID: draw has no V)."""
    bad = U0
    csum = U0
    for j in range(tid, ids.shape[1], tpb):
        c = U(counts[b, j])
        csum = csum + c  # < W * 2**32 <= 2**56: no wrap
        if sparse_entry_bad(ids[b, j], c, ids[b, j - 1] if j > 0 else PAD_ID, j, MAX_ID):
            bad = U1
    return sparse_verdict(bad, csum, sh_k, sh_i, sh_h, sh_l, tid, tpb)


@cuda.jit(device=True)
def draw_row(counts, ids, sparse, seed, gen, rnd, pos, tokens, b, sh_k, sh_i, sh_h, sh_l,
             tid, tpb):
    ks, kg, kr, kp = key_words(seed, gen, rnd, pos, b)
    r = draw_block(ks, kg, kr, kp, DOMAIN_PROPOSAL, 0)[0] >> U8
    j = first_exceeding(counts, counts, False, b, counts.shape[1], U0, r,
                        sh_h, sh_l, sh_k, sh_i, tid, tpb)
    bad = U0
    if sparse:
        bad = draw_row_bad(counts, ids, b, sh_k, sh_i, sh_h, sh_l, tid, tpb)
    if tid == 0:
        if j < 0 or bad != U0:
            tokens[b] = -1
        elif sparse:
            tokens[b] = ids[b, j]
        else:
            tokens[b] = j


@cuda.jit
def draw_kernel(counts, ids, sparse, seed, gen, rnd, pos, tokens):
    tid = cuda.threadIdx.x
    tpb = cuda.blockDim.x
    sh_k = cuda.shared.array(MAX_TPB, np.uint64)
    sh_i = cuda.shared.array(MAX_TPB, np.int64)
    sh_h = cuda.shared.array(MAX_TPB, np.uint64)
    sh_l = cuda.shared.array(MAX_TPB, np.uint64)
    b = np.int64(cuda.blockIdx.x)
    while b < tokens.shape[0]:
        draw_row(counts, ids, sparse, seed, gen, rnd, pos, tokens, b, sh_k, sh_i, sh_h, sh_l,
                 tid, tpb)
        cuda.syncthreads()
        b += np.int64(cuda.gridDim.x)


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


@cuda.jit(device=True)
def q_row_bad(qc, qi, b, i, n, sh_k, sh_i, sh_h, sh_l, tid, tpb):
    """sparse_verdict of sparse q row (b, i) over [0, n)."""
    bad = U0
    csum = U0
    for j in range(tid, qc.shape[2], tpb):
        c = U(qc[b, i, j])
        csum = csum + c  # < W * 2**32 <= 2**56: no wrap
        if sparse_entry_bad(qi[b, i, j], c, qi[b, i, j - 1] if j > 0 else PAD_ID, j, n):
            bad = U1
    return sparse_verdict(bad, csum, sh_k, sh_i, sh_h, sh_l, tid, tpb)


@cuda.jit(device=True)
def verify_row(tbits, draft, qc, qi, qmode, greedy, seed, gen, rnd, pos,
               accepted, tokens, status, TOT, RH, RL, QD, b, s,
               sh_k, sh_i, sh_h, sh_l, sh_misc, tid, tpb, nd, has_nd):
    """Request b of verify_kernel; s is the block's scratch row of TOT, RH, RL, QD.
    With ``has_nd`` the request verifies its first nd[b] drafts (target rows
    0..nd[b]; nothing beyond is read); nd[b] outside [0, k] fails it closed
    (NUM_DRAFTS_INVALID) before anything else is read."""
    k1 = tbits.shape[1]  # the width of the request's tokens
    k = k1 - 1
    n = tbits.shape[2]
    g = greedy[b] != 0
    sd, ge, ro, p0 = key_words(seed, gen, rnd, pos, b)

    st = 0
    if has_nd != 0:
        nb = np.int64(nd[b])
        if nb < 0 or nb > k:
            st = NUM_DRAFTS_INVALID
        else:
            k = nb
    # every target row used: valid values, sum within tolerance (exact, 128-bit)
    for i in range(k + 1 if st == 0 else 0):
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
            TOT[s, i] = tl
    # then, in this order (sampling.verify_row): every draft id in [0, V), greedy
    # requests too; for non-greedy requests every q row (a sparse row in full, a dense
    # row at its draft: a count <= 2**24), then q_i(d_i) > 0.  Nothing is read at a
    # draft id or addressed by a q id before its check.
    if st == 0:
        for i in range(k):
            d = draft[b, i]
            if d < 0 or d >= n:
                st = DRAFT_OUT_OF_RANGE
                break
    if st == 0 and not g and qmode != 0:
        for i in range(k):
            if qmode == 1:
                bad = U(qc[b, i, draft[b, i]]) > TOTAL
            else:
                bad = q_row_bad(qc, qi, b, i, n, sh_k, sh_i, sh_h, sh_l, tid, tpb) != U0
            if bad:
                st = Q_INVALID
                break
    if st == 0 and not g:
        for i in range(k):
            if q_at(qc, qi, qmode, b, i, draft[b, i], sh_k, sh_i, tid, tpb) == U0:
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
            total = TOT[s, i]
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
        total = TOT[s, i]
        if qmode == 2:
            for v in range(tid, n, tpb):
                QD[s, v] = 0
            cuda.syncthreads()
            for j in range(tid, qc.shape[2], tpb):
                t_id = qi[b, i, j]
                if t_id >= 0 and t_id < n:  # padding is skipped
                    QD[s, t_id] = qc[b, i, j]
            cuda.syncthreads()
        sh_, sl_ = U0, U0
        qsum = U0
        for v in range(tid, n, tpb):
            p, _ = target_fixed(U(tbits[b, i, v]))
            if qmode == 0:
                c = TOTAL if v == d else U0
            elif qmode == 1:
                c = U(qc[b, i, v])
                qsum = qsum + c  # < V * 2**32 <= 2**56: no wrap
            else:
                c = U(QD[s, v])
            mh, ml = mul64(c, total)
            ph = p >> U40
            pl = p << U24
            if lt128(mh, ml, ph, pl):
                rh, rl = sub128(ph, pl, mh, ml)
            else:
                rh, rl = U0, U0
            RH[s, v] = rh
            RL[s, v] = rl
            sh_, sl_ = add128(sh_, sl_, rh, rl)
        s_h, s_l = block_sum128(sh_, sl_, sh_h, sh_l, tid, tpb)
        if qmode == 1:
            # the residual reads the dense row in full: it must be a Dyadic row
            qh, ql = block_sum128(U0, qsum, sh_h, sh_l, tid, tpb)
            if qh != U0 or ql != TOTAL:
                st = Q_INVALID
                break
        tok = draw_from(RH, RL, True, s, n, s_h, s_l, sd, ge, ro, p0 + U(i),
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
                RL[s, v] = p
            cuda.syncthreads()
            tok = draw_from(RL, RL, False, s, n, U0, TOT[s, k], sd, ge, ro, p0 + U(k),
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


@cuda.jit
def verify_kernel(tbits, draft, qc, qi, qmode, greedy, seed, gen, rnd, pos,
                  accepted, tokens, status, TOT, RH, RL, QD, nd, has_nd):
    tid = cuda.threadIdx.x
    tpb = cuda.blockDim.x
    sh_k = cuda.shared.array(MAX_TPB, np.uint64)
    sh_i = cuda.shared.array(MAX_TPB, np.int64)
    sh_h = cuda.shared.array(MAX_TPB, np.uint64)
    sh_l = cuda.shared.array(MAX_TPB, np.uint64)
    sh_misc = cuda.shared.array(4, np.uint64)
    s = np.int64(cuda.blockIdx.x)
    b = s
    while b < status.shape[0]:
        verify_row(tbits, draft, qc, qi, qmode, greedy, seed, gen, rnd, pos,
                   accepted, tokens, status, TOT, RH, RL, QD, b, s,
                   sh_k, sh_i, sh_h, sh_l, sh_misc, tid, tpb, nd, has_nd)
        cuda.syncthreads()
        b += np.int64(cuda.gridDim.x)


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
