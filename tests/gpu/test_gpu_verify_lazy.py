"""verify(check="lazy") on the CUDA backend (CupyBackend.verify_lazy).

GPU tests (skip without CuPy + torch CUDA): on valid input the lazy path
equals backend="cpu" bit for bit; cases built to make many acceptance tests
ambiguous (the exact row total is needed) exercise the exact path; invalid
data in a row the decisions read fails closed with the status of
check=False; invalid data in rows that are not read changes nothing; CUDA
graph capture and replay.

CPU tests (always run): the row-total band [T_LO, T_HI] against the
reference's validity rule, and the soundness of ``lazy_class`` (a Python
model of lz_classify in backends/cuda/verify_lazy.cuh) against the
reference's ``accept``: whenever it says "accepted" or "rejected", the
reference decides so for every valid T tried.
"""

import numpy as np
import pytest

import dyadic
from dyadic._types import trusted_dyadic
from dyadic import _spec, _status
from dyadic.bench.timing import capture_graph
from dyadic.reference import fixedpoint, philox, sampling

from conftest import cuda_torch, random_target as _target

ONE = 1 << _spec.TARGET_BITS
TOL = ONE >> _spec.TARGET_TOL_BITS
T_LO, T_HI = ONE - TOL, ONE + TOL  # the valid row totals, inclusive
ACC, REJ, AMB = "acc", "rej", "amb"


# ------------------------------------------------------------ Python model
def _band(lo, hi, a, b, count, keys, pos):
    """dy_accept for every T in [lo, hi] (uniform_below_63: the same mask for all T)."""
    mask = (1 << 63) - 1
    for idx in range(_spec.MAX_DRAW_INDEX + 1):
        w = philox.block(keys, pos, _spec.DOMAIN_ACCEPTANCE, idx)
        x = (w[0] | (w[1] << 32)) & mask
        if x < lo:  # V1 = x for every T of the band
            if x != a:
                return ACC if x < a else REJ
            v2, _ = philox.uniform_below(count, keys, pos, _spec.DOMAIN_ACCEPTANCE, idx + 1)
            return ACC if v2 < b else REJ
        if x < hi:
            return AMB
    return AMB


def lazy_class(p_fixed, count, keys, pos):
    """The decision of sampling.accept(p_fixed, T, count) for every valid T:
    ACC / REJ when the same for all T in [T_LO, T_HI], else AMB (lz_classify)."""
    n = p_fixed << _spec.TOTAL_BITS
    if n >= T_HI * count:
        return ACC
    a, b = divmod(n, count)
    lo, dec = T_LO, None
    if n >= T_LO * count:  # always for T <= a, the draw decides above
        lo, dec = a + 1, ACC
    d = _band(lo, T_HI, a, b, count, keys, pos)
    if d == AMB or (dec is not None and d != dec):
        return AMB
    return d


def _row_with_total(total):
    """float32 bits of a row whose exact fixed-point total is ``total`` (powers of two)."""
    return [int(np.float32(2.0 ** (j - _spec.TARGET_BITS)).view(np.uint32))
            for j in range(total.bit_length()) if total >> j & 1]


# ------------------------------------------------------------------ CPU tests
def test_total_band_matches_reference():
    assert (T_LO - 1).bit_length() == 62 and (ONE - 1).bit_length() == 62
    assert ONE.bit_length() == 63 and (T_HI - 1).bit_length() == 63
    for t, ok in ((T_LO, True), (T_HI, True), (ONE, True), (T_LO - 1, False), (T_HI + 1, False),
                  (ONE + 12345, True), (ONE - 12345, True)):
        st, _, total = fixedpoint.target_row_fixed(_row_with_total(t))
        assert (st == _status.OK) == ok, t
        if ok:
            assert total == t


def test_lazy_class_sound():
    rng = np.random.default_rng(4)
    ts = [T_LO, T_LO + 1, ONE - 1, ONE, ONE + 1, ONE + 2, T_HI - 1, T_HI]
    seen = {ACC: 0, REJ: 0, AMB: 0}
    for it in range(1500):
        keys = tuple(int(rng.integers(0, n)) for n in (2**63, 2**32, 2**32))
        pos = int(rng.integers(0, 2**31))
        if it % 10 == 9:  # the first acceptance draw inside the band: ambiguous
            keys, pos = _keys_with_draw_in_band(rng)
        count = int(rng.integers(1, 1 << 24)) if it % 3 else 1 << 24
        kind = it % 5
        if kind == 0:  # p(d) = q(d): P 2^24 = 2^62 c (A = 2^62)
            count = 1 << int(rng.integers(0, 25))
            p_fixed = ONE * count >> 24
        elif kind == 1:  # A = P 2^24 / c inside the band
            p_fixed = min(ONE, (int(rng.integers(T_LO, T_HI, dtype=np.uint64)) * count) >> 24)
        else:  # acceptance ratio ~ P 2^24 / (2^62 c) in [0, 1.5)
            p_fixed = min(ONE, int(rng.random() * 1.5 * count * 2.0**38))
        cl = lazy_class(p_fixed, count, keys, pos)
        seen[cl] += 1
        a = (p_fixed << 24) // count
        tt = ts + [int(rng.integers(T_LO, T_HI + 1, dtype=np.uint64)) for _ in range(4)]
        tt += [t for t in (a - 1, a, a + 1, a + 2) if T_LO <= t <= T_HI]
        dec = {sampling.accept(p_fixed, t, count, keys, pos) for t in tt}
        if cl != AMB:
            assert dec == {cl == ACC}, (p_fixed, count, keys, pos)
    assert seen[ACC] > 300 and seen[REJ] > 150 and seen[AMB] > 50, seen


def _seed_with_band_draw(rng, gen, rnd, pos):
    """A seed whose first acceptance draw at ``pos`` (low 63 bits) lies in [T_LO, T_HI)."""
    while True:
        seed = int(rng.integers(0, 2**63))
        w = philox.block((seed, gen, rnd), pos, _spec.DOMAIN_ACCEPTANCE, 0)
        if T_LO <= (w[0] | (w[1] << 32)) & ((1 << 63) - 1) < T_HI:
            return seed


def _keys_with_draw_in_band(rng):
    """(keys, position) whose first acceptance draw (low 63 bits) lies in [T_LO, T_HI)."""
    while True:
        keys = tuple(int(rng.integers(0, n)) for n in (2**63, 2**32, 2**32))
        pos = int(rng.integers(0, 2**31))
        w = philox.block(keys, pos, _spec.DOMAIN_ACCEPTANCE, 0)
        if T_LO <= (w[0] | (w[1] << 32)) & ((1 << 63) - 1) < T_HI:
            return keys, pos


def test_lazy_class_p_equals_q_mostly_sure():
    """p(d) = q(d) (e.g. p(d) = 1 with a point-mass q): always for T <= 2^62, so
    usually decided without the row total (accepted unless the draw says otherwise)."""
    rng = np.random.default_rng(6)
    cls = [lazy_class(ONE, 1 << 24, (int(rng.integers(0, 2**63)), 0, 0), 9) for _ in range(400)]
    assert cls.count(AMB) < 280 and cls.count(ACC) > 120


def test_lazy_class_rarely_ambiguous():
    """Acceptance ratios spread over (0, 1): the fixed-mask draw of uniform_below_63
    leaves a test undecided only when a draw lands in the band (about 2^-9), so
    well under 1% of such tests need the row total."""
    rng = np.random.default_rng(8)
    cls = []
    for _ in range(2000):
        count = int(rng.integers(1, 1 << 24))
        p_fixed = int(rng.random() * 0.98 * count * 2.0**38)
        keys = (int(rng.integers(0, 2**63)), int(rng.integers(0, 2**32)), 0)
        cls.append(lazy_class(p_fixed, count, keys, int(rng.integers(0, 2**31))))
    assert cls.count(AMB) <= 20 and cls.count(ACC) > 400 and cls.count(REJ) > 400


def _pfix(bits):
    """floor(p * 2^62) of one valid float32 (bits)."""
    m, e = fixedpoint.f32_mant_exp(bits & 0x7FFFFFFF)
    return fixedpoint.shift_floor(m, e + _spec.TARGET_BITS)


def lazy_verify_model(target_bits, draft, q_rows, keys, position):
    """The lazy verify's reads as a Python model (verify_lazy): (status, accepted, tokens, rows read in full)."""
    k = len(draft)
    cls = []
    for i, d in enumerate(draft):
        bits = target_bits[i][d]
        c = _spec.TOTAL if q_rows is None else q_rows[i][d]
        if not (bits <= 0x3F800000 or bits == 0x80000000):
            cls.append((None, _status.TARGET_INVALID_VALUE, 0, c))
        elif c == 0:
            cls.append((None, _status.Q_ZERO_AT_DRAFT, 0, c))
        else:
            pf = _pfix(bits)
            cls.append((lazy_class(pf, c, keys, position + i), 0, pf, c))
    read, tokens = [], []
    for i in range(k + 1):
        if i < k:
            cl, code, pf, c = cls[i]
            if cl is None:
                return code, 0, None, read
            if cl == ACC:
                tokens.append(draft[i])
                continue
        st, fixed, total = fixedpoint.target_row_fixed(target_bits[i])
        read.append(i)
        if st:
            return st, 0, None, read
        if i == k:
            return _status.OK, k, tokens + [sampling.draw_weighted(fixed, keys, position + k)], read
        if cl == AMB and sampling.accept(pf, total, c, keys, position + i):
            tokens.append(draft[i])
            continue
        qd = q_rows[i] if q_rows is not None else [_spec.TOTAL * (v == draft[i])
                                                    for v in range(len(fixed))]
        tok = sampling.draw_weighted(sampling.residual(fixed, total, qd), keys, position + i)
        return _status.OK, i, tokens + [tok] + [-1] * (k - i), read


def test_lazy_model_equals_reference():
    """The lazy design (classes, candidate rows, exact walk) == verify_row on valid input."""
    rng = np.random.default_rng(8)
    kinds = {ACC: 0, REJ: 0, AMB: 0}
    nread = 0
    for it in range(300):
        v, k = int(rng.integers(2, 12)), int(rng.integers(0, 6))
        p = rng.random((k + 1, v))
        draft = [int(x) for x in rng.integers(0, v, size=k)]
        q_rows = None
        if it % 2:
            qw = rng.random((k, v)) + 0.01
            qw[np.arange(k), draft] += qw.sum(-1) * rng.random(k)
            qa = dyadic.allocate(qw.astype(np.float32), backend="reference")
            q_rows = [[int(c) for c in row] for row in np.asarray(qa.counts)]
        for i, d in enumerate(draft):  # acceptance ~ U(0, 1.2)
            c = _spec.TOTAL if q_rows is None else q_rows[i][d]
            p[i, d] = 0
            p[i] *= max(0.0, 1 - min(1.0, rng.random() * 1.2 * c / _spec.TOTAL)) / p[i].sum()
            p[i, d] = 1 - p[i].sum()
        bits = []
        for i in range(k + 1):  # totals on both sides of 2^62, inside the band
            row = (p[i] / p[i].sum() * [1 - 2**-11, 1 + 2**-11, 1.0][(it + i) % 3])
            bits.append([int(x) for x in np.minimum(row, 1).astype(np.float32).view(np.uint32)])
        if any(fixedpoint.target_row_fixed(r)[0] for r in bits):
            continue
        keys = (int(rng.integers(0, 2**63)), 1, 2)
        pos = int(rng.integers(0, 2**20))
        if it % 3 == 0:  # the first test's draw inside the band: ambiguous
            keys, pos = _keys_with_draw_in_band(rng)
        ref = sampling.verify_row(bits, draft, q_rows, keys, pos, False)
        st, acc, toks, read = lazy_verify_model(bits, draft, q_rows, keys, pos)
        assert (st, acc, toks) == ref
        nread += len(read)
        for i, d in enumerate(draft[:acc + 1] if acc < k else draft):
            pf = _pfix(bits[i][d])
            c = _spec.TOTAL if q_rows is None else q_rows[i][d]
            kinds[lazy_class(pf, c, keys, pos + i)] += 1
    print("lazy model:", kinds, "rows read", nread)
    assert min(kinds.values()) > 20, kinds


_HARNESS = r"""
#include <stdio.h>
#include <stdint.h>
#include "dyadic_core.h"
typedef unsigned long long u64;
typedef unsigned int u32;
#define DC_FN static inline
struct DcKey { u64 seed; u32 gen, rnd, pos; };
#define LZ_CLASSIFY_ONLY
#include "verify_classify.cuh"
int main() {
  unsigned long long P, seed; unsigned c, gen, rnd, pos;
  while (scanf("%llu %u %llu %u %u %u", &P, &c, &seed, &gen, &rnd, &pos) == 6) {
    DcKey k; k.seed = seed; k.gen = gen; k.rnd = rnd; k.pos = pos;
    printf("%d\n", lz_classify(P, c, k, pos));
  }
  return 0;
}
"""


def test_lz_classify_c_equals_model(tmp_path):
    """lz_classify of verify_classify.cuh, compiled for the host, == lazy_class."""
    import shutil
    import subprocess

    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    from dyadic.backends.cuda.cupy import runtime
    src, exe = tmp_path / "lz.cpp", tmp_path / "lz"
    src.write_text(_HARNESS)
    subprocess.run([cxx, "-O1", "-std=c++17", "-I", runtime.include_dir(), "-I",
                    runtime.KERNEL_DIR, str(src),
                    "-o", str(exe)], check=True)
    rng = np.random.default_rng(12)
    cases = []
    for it in range(3000):
        keys = tuple(int(rng.integers(0, n)) for n in (2**63, 2**32, 2**32))
        pos = int(rng.integers(0, 2**32))
        count = int(rng.integers(1, 1 << 24)) if it % 3 else 1 << 24
        if it % 7 == 0:
            count = int(rng.integers(1, 2**32))
        kind = it % 5
        if kind == 0:
            count = 1 << int(rng.integers(0, 25))
            p_fixed = ONE * count >> 24
        elif kind == 1:
            p_fixed = min(ONE, (int(rng.integers(T_LO, T_HI, dtype=np.uint64)) * count) >> 24)
        else:
            p_fixed = min(ONE, int(rng.random() * 1.5 * count * 2.0**38))
        cases.append((p_fixed, count, keys, pos))
    inp = "".join(f"{p} {c} {k[0]} {k[1]} {k[2]} {pos}\n" for p, c, k, pos in cases)
    out = subprocess.run([str(exe)], input=inp, capture_output=True, text=True,
                         check=True).stdout.split()
    names = {0: ACC, 1: REJ, 2: AMB}
    assert len(out) == len(cases)
    for (p, c, k, pos), o in zip(cases, out):
        assert names[int(o)] == lazy_class(p, c, k, pos), (p, c, k, pos)


# verify_lazy's per-id rule (verify_lazy.cuh, vf_elem): whether R_v > 0, i.e.
# P * 2^24 > c * T, is the same for every valid row total T, decided with two shifts.
THI24, TLO24 = (1 << 38) + (1 << 28), (1 << 38) - (1 << 28)
SEL, NOT, UND = "selected", "not selected", "undecided"


def fused_class(p_fixed, count):
    """vf_elem's decision: SEL / NOT when R_v > 0 is the same for every T in
    [T_LO, T_HI], else UND (also every count >= 2^25, an invalid count)."""
    if count >= 1 << 25:
        return UND
    hi, lo = p_fixed > count * THI24, p_fixed > count * TLO24
    return SEL if hi else (NOT if not lo else UND)


def test_fused_thresholds_are_the_band_ends():
    assert THI24 << _spec.TOTAL_BITS == T_HI and TLO24 << _spec.TOTAL_BITS == T_LO
    assert (((1 << 25) - 1) * THI24) < 1 << 64  # no overflow in the kernel's u64 product


def test_fused_class_sound():
    """Whenever vf_elem decides, the exact selection agrees for every valid T tried
    (both band ends, 2^62, random T); undecided ids are decided both ways somewhere."""
    rng = np.random.default_rng(23)
    cases = []
    for _ in range(4000):
        c = int(rng.choice([0, 1, 2, 3, int(rng.integers(1, 1 << 24)), 1 << 24,
                            (1 << 25) - 1, 1 << 25, int(rng.integers(1 << 25, 1 << 32))]))
        base = c * (1 << 38)
        p = int(rng.choice([0, 1, base, base + c * (1 << 28), base - c * (1 << 28),
                            base + c * (1 << 28) + 1, base - c * (1 << 28) + 1,
                            int(rng.integers(0, ONE + 1)), min(ONE, base + int(rng.integers(-c * (1 << 29) - 1, c * (1 << 29) + 2)))]))
        cases.append((max(0, min(ONE, p)), c))
    undecided_seen = 0
    for p, c in cases:
        cls = fused_class(p, c)
        ts = [T_LO, T_HI, ONE] + [int(t) for t in rng.integers(T_LO, T_HI + 1, size=4)]
        sel = {p << _spec.TOTAL_BITS > c * t for t in ts}
        if cls == SEL:
            assert sel == {True}, (p, c)
        elif cls == NOT:
            assert sel == {False}, (p, c)
        else:
            undecided_seen += 1
            if c < 1 << 25:  # a genuine band case: the band ends decide differently
                assert (p << _spec.TOTAL_BITS > c * T_LO) and not (p << _spec.TOTAL_BITS > c * T_HI)
    assert undecided_seen > 100


# ------------------------------------------------------------------ GPU side
@pytest.fixture(scope="module")
def _cuda_dev():
    cuda_torch()
    return "cuda"


@pytest.fixture
def cuda(_cuda_dev):
    yield _cuda_dev


def _eq(a, b):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _np(t):
    return t.cpu().numpy() if hasattr(t, "cpu") else np.asarray(t)


def _fixed(row):
    """Exact floor(p * 2^62) of float32 values (uint64)."""
    return (row.astype(np.float64) * 2.0**62).astype(np.uint64)


def _count_at(q, b, i, d):
    if q is None:
        return 1 << 24
    if q.ids is None:
        return int(np.asarray(q.counts)[b, i, d])
    ids, cnt = np.asarray(q.ids)[b, i], np.asarray(q.counts)[b, i]
    hit = np.flatnonzero(ids == d)
    return int(cnt[hit[-1]]) if hit.size else 0


def _lazy(p, draft, q, keys, **kw):
    torch = pytest.importorskip("torch")
    return dyadic.verify(torch.from_numpy(p).cuda(), torch.from_numpy(draft).cuda(), q, keys,
                         backend="cuda", **kw)


def _same_as_cpu(p, draft, q, keys):
    r1 = _lazy(p, draft, q, keys, check="lazy")
    r2 = dyadic.verify(p, draft, q, keys, backend="cpu")
    _eq(_np(r1.status), np.zeros(p.shape[0], dtype=np.int32))
    _eq(_np(r1.accepted), r2.accepted)
    _eq(_np(r1.tokens), r2.tokens)
    r3 = _lazy(p, draft, q, keys, check=False)  # the full path, same results
    _eq(_np(r3.tokens), r2.tokens)
    return r2


def _draft_q(rng, p, qkind, k):
    b, _, v = p.shape
    if qkind == "point":
        draft = np.argmax(p[:, :k], axis=-1).astype(np.int32)
        draft[:, -1:] = rng.integers(0, v, size=(b, 1))
        return draft, None
    logits = np.log(np.maximum(p[:, :k], 1e-30)).reshape(b * k, v) + \
        rng.standard_normal((b * k, v)).astype(np.float32) * 0.5
    top_k = None if qkind == "dense" else 32
    kq = dyadic.Keys(seed=11, position=np.arange(b * k))
    draft, q = dyadic.propose(logits.astype(np.float32), kq, top_k=top_k, backend="cpu")
    q = dyadic.Dyadic(np.asarray(q.counts).reshape(b, k, -1),
                      None if q.ids is None else np.asarray(q.ids).reshape(b, k, -1), vocab_size=v)
    return np.asarray(draft).reshape(b, k).astype(np.int32), q


VS = [1, 2, 111, 4097, 32000, 129280]


@pytest.mark.gpu
@pytest.mark.parametrize("v", VS)
@pytest.mark.parametrize("b", [1, 3, 64])
@pytest.mark.parametrize("k", [1, 5, 8])
@pytest.mark.parametrize("qkind", ["dense", "sparse", "point"])
def test_lazy_parity(cuda, v, b, k, qkind):
    if v * b * (k + 1) > 3_000_000:
        b = max(1, 3_000_000 // (v * (k + 1)))
    _random_case_same_as_cpu(np.random.default_rng(v + 7 * b + 31 * k), b, k, v, qkind, 1)


def _random_case_same_as_cpu(rng, b, k, v, qkind, generation):
    """A random target / draft / q case and two keys: lazy == CPU == check=False."""
    p = _target(rng, b, k + 1, v)
    draft, q = _draft_q(rng, p, qkind, k)
    for rep in range(2):
        keys = dyadic.Keys(seed=rng.integers(0, 2**63, size=b), generation=generation,
                           round=rep, position=rng.integers(0, 2**20, size=b))
        _same_as_cpu(p, draft, q, keys)


def _forced_case(rng, b, k, v, qkind):
    """Rows where each draft has acceptance probability ~1/2 (many ambiguous
    tests) and row totals on both sides of 2^62 (scaled by 1 -+ 2^-11)."""
    p = _target(rng, b, k + 1, v)
    draft = rng.integers(0, v, size=(b, k)).astype(np.int32)
    q = None
    if qkind != "point":
        w = rng.random((b * k, v)).astype(np.float32)
        w[np.arange(b * k), draft.reshape(-1)] = w.sum(-1)  # q(d) ~ 1/2
        q = dyadic.allocate(w, top_k=None if qkind == "dense" else 32, backend="cpu")
        ids = None if q.ids is None else np.asarray(q.ids).reshape(b, k, -1)
        q = dyadic.Dyadic(np.asarray(q.counts).reshape(b, k, -1), ids, vocab_size=v)
    for r in range(b):
        for i in range(k):
            c = _count_at(q, r, i, int(draft[r, i]))
            pd = 0.5 * c / 2**24  # acceptance ~ 1/2
            row = p[r, i].astype(np.float64)
            row[draft[r, i]] = 0
            row *= (1 - pd) / row.sum()
            row[draft[r, i]] = pd
            p[r, i] = row.astype(np.float32)
        for i in range(k + 1):
            s = [1 - 2**-11, 1 + 2**-11, 1.0][(r + i) % 3]
            p[r, i] = np.minimum(p[r, i] * np.float32(s), np.float32(1))
    return p, draft, q


def _totals(p):
    return [[int(_fixed(p[r, i]).sum(dtype=np.uint64)) for i in range(p.shape[1])]
            for r in range(p.shape[0])]


def _chain(p, tot, draft, q, r, keys3, pos):
    """[(lazy class, exact decision)] along request r's chain."""
    out = []
    for i in range(draft.shape[1]):
        d = int(draft[r, i])
        pf = int(_fixed(p[r, i, d:d + 1])[0])
        c = _count_at(q, r, i, d)
        ok = sampling.accept(pf, tot[r][i], c, keys3, pos + i)
        out.append((lazy_class(pf, c, keys3, pos + i), ok))
        if not ok:
            break
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("v,b", [(4097, 64), (129280, 16), (111, 64)])
@pytest.mark.parametrize("qkind", ["point", "dense", "sparse"])
def test_lazy_forced_ambiguous(cuda, v, b, qkind):
    k = 5
    rng = np.random.default_rng(v + b)
    p, draft, q = _forced_case(rng, b, k, v, qkind)
    tot = _totals(p)
    assert all(abs(t - ONE) <= TOL for row in tot for t in row)
    assert any(t < ONE for row in tot for t in row) and any(t > ONE for row in tot for t in row)
    gen, rnd = 5, 9
    pos = rng.integers(0, 2**20, size=b)
    # per request, seeds whose chain has the wanted shape: ambiguous-accepted then more
    # tests, ambiguous-rejected, all accepted (bonus) after an ambiguous test.  A test is
    # ambiguous when its first acceptance draw lands in the band (about 2^-10): the
    # search draws seeds with that property at test 0, then checks the chain's shape.
    wants = [lambda ch: len(ch) > 1 and ch[0] == (AMB, True),
             lambda ch: ch[0] == (AMB, False),
             lambda ch: len(ch) == k and ch[-1][1] and ch[0][0] == AMB]
    seeds = np.zeros(b, dtype=np.uint64)
    got = [0] * len(wants)
    for r in range(b):
        want = wants[r % len(wants)]
        for _ in range(400):
            seed = _seed_with_band_draw(rng, gen, rnd, int(pos[r]))
            if want(_chain(p, tot, draft, q, r, (seed, gen, rnd), int(pos[r]))):
                got[r % len(wants)] += 1
                break
        seeds[r] = seed
    assert min(got) > 0, got
    keys = dyadic.Keys(seed=seeds, generation=gen, round=rnd, position=pos)
    _same_as_cpu(p, draft, q, keys)


@pytest.mark.gpu
def test_lazy_invalid_read_rows_fail_closed(cuda):
    """A rule broken on data the decisions read: the status of check=False, tokens -1."""
    rng = np.random.default_rng(17)
    b, k, v = 6, 3, 5000
    p = _target(rng, b, k + 1, v)
    draft = rng.integers(1, v, size=(b, k)).astype(np.int32)
    seeds = rng.integers(0, 2**63, size=b)
    keys = dyadic.Keys(seed=seeds, position=100)
    p[0, 0, draft[0, 0]] = np.nan  # request 0: NaN at p(d_0)
    p[1, 0, draft[1, 0]] = 0  # request 1: surely rejected (p(d_0) = 0): row 0 is the
    p[1, 0] *= np.float32(0.5)  # residual row, its total is off -> TARGET_SUM
    p[3, 0, draft[3, 0]] = 0  # request 3: the residual row holds +inf
    p[3, 0, 7] = np.inf
    r_lazy = _lazy(p, draft, None, keys, check="lazy")
    r_full = _lazy(p, draft, None, keys, check=False)
    st_l, st_f = _np(r_lazy.status), _np(r_full.status)
    assert st_l[0] == st_f[0] == _status.TARGET_INVALID_VALUE
    assert st_l[1] == st_f[1] == _status.TARGET_SUM
    assert st_l[3] == st_f[3] == _status.TARGET_INVALID_VALUE
    for r in (0, 1, 3):
        assert _np(r_lazy.tokens)[r].tolist() == [-1] * (k + 1)
        assert int(_np(r_lazy.accepted)[r]) == 0
    good = [2, 4, 5]  # the other requests equal the CPU backend
    r2 = dyadic.verify(p[good], draft[good], None, dyadic.Keys(seed=seeds[good], position=100),
                       backend="cpu")
    _eq(st_l[good], np.zeros(3, dtype=np.int32))
    _eq(_np(r_lazy.tokens)[good], r2.tokens)
    _eq(_np(r_lazy.accepted)[good], r2.accepted)
    # q(d_0) = 0 (dense and sparse q): Q_ZERO_AT_DRAFT in both modes
    w = rng.random((3 * k, v)).astype(np.float32)
    w[:, 0] = 0
    for top_k in (None, 32):
        q = dyadic.allocate(w, top_k=top_k, backend="cpu")
        q = dyadic.Dyadic(np.asarray(q.counts).reshape(3, k, -1),
                          None if q.ids is None else np.asarray(q.ids).reshape(3, k, -1),
                          vocab_size=v)
        d2 = np.asarray([[int(np.asarray(q.ids)[r, i, 0]) if q.ids is not None else 1
                          for i in range(k)] for r in range(3)], dtype=np.int32)
        d2[1, 0] = 0
        kk = dyadic.Keys(seed=np.asarray([1, 2, 3], dtype=np.uint64), position=0)
        for mode in ("lazy", False):
            r = _lazy(p[good], d2, q, kk, check=mode)
            assert int(_np(r.status)[1]) == _status.Q_ZERO_AT_DRAFT
            assert _np(r.tokens)[1].tolist() == [-1] * (k + 1)


@pytest.mark.gpu
@pytest.mark.parametrize("qkind", ["point", "dense"])
def test_lazy_ambiguous_row_invalid_sum(cuda, qkind):
    """An ambiguous test needs its row's exact total: a bad total fails closed."""
    rng = np.random.default_rng(23)
    b, k, v = 8, 3, 3000
    p, draft, q = _forced_case(rng, b, k, v, qkind)
    tot = _totals(p)
    pos = rng.integers(0, 2**20, size=b)
    seeds = np.zeros(b, dtype=np.uint64)
    for r in range(b):
        for _ in range(100):
            seed = _seed_with_band_draw(rng, 0, 0, int(pos[r]))
            if _chain(p, tot, draft, q, r, (seed, 0, 0), int(pos[r]))[0][0] == AMB:
                break
        seeds[r] = seed
    bad = [0, 3, 5]
    for r in bad:  # row 0's other entries scaled: total out of the band, p(d_0) unchanged
        d = draft[r, 0]
        keep = p[r, 0, d]
        p[r, 0] *= np.float32(0.9)
        p[r, 0, d] = keep
    keys = dyadic.Keys(seed=seeds, position=pos)
    r_lazy = _lazy(p, draft, q, keys, check="lazy")
    r_full = _lazy(p, draft, q, keys, check=False)
    for r in bad:
        assert int(_np(r_lazy.status)[r]) == int(_np(r_full.status)[r]) == _status.TARGET_SUM
        assert _np(r_lazy.tokens)[r].tolist() == [-1] * (k + 1)
    good = [r for r in range(b) if r not in bad]
    qg = None if q is None else dyadic.Dyadic(np.asarray(q.counts)[good], None, vocab_size=v)
    r2 = dyadic.verify(p[good], draft[good], qg,
                       dyadic.Keys(seed=seeds[good], position=pos[good]), backend="cpu")
    _eq(_np(r_lazy.tokens)[good], r2.tokens)
    _eq(_np(r_lazy.accepted)[good], r2.accepted)


@pytest.mark.gpu
def test_lazy_unread_rows_not_examined(cuda):
    """Invalid data in rows the chain does not read changes nothing."""
    rng = np.random.default_rng(29)
    b, k, v = 4, 4, 4096
    p = _target(rng, b, k + 1, v)
    draft = rng.integers(0, v, size=(b, k)).astype(np.int32)
    # dense q with q(d) = 2^23 and p(d) = 0.9: surely accepted for every valid T
    w = np.ones((b * k, v), dtype=np.float32)
    w[np.arange(b * k), draft.reshape(-1)] = v - 1  # q(d) = 1/2
    q = dyadic.allocate(w, backend="cpu")
    q = dyadic.Dyadic(np.asarray(q.counts).reshape(b, k, v), None, vocab_size=v)
    c0 = np.asarray(q.counts)[0, 0, draft[0, 0]]
    assert c0 == 1 << 23
    for r in range(b):
        for i in range(k):
            row = p[r, i].astype(np.float64)
            row[draft[r, i]] = 0
            row *= 0.1 / row.sum()
            row[draft[r, i]] = 0.9
            p[r, i] = row.astype(np.float32)
    # request 0: test 1 surely rejected (p(d_1) = 0): rows 2.. are never read
    p[0, 1, draft[0, 1]] = 0
    p[0, 1] /= p[0, 1].sum(dtype=np.float64)
    clean = p.copy()
    p[0, 2, 5] = np.nan
    p[0, 3] *= 0.5
    p[0, 4, :] = np.inf
    # request 1: accepted rows 0..3 (sure): other entries of the accepted rows are not read
    p[1, 0, (draft[1, 0] + 1) % v] = np.nan
    p[1, 2] *= np.float32(0.5)
    p[1, 2, draft[1, 2]] = clean[1, 2, draft[1, 2]]
    keys = dyadic.Keys(seed=rng.integers(0, 2**63, size=b), position=3)
    r = _lazy(p, draft, q, keys, check="lazy")
    r2 = dyadic.verify(clean, draft, q, keys, backend="cpu")
    _eq(_np(r.status), np.zeros(b, dtype=np.int32))
    assert int(r2.accepted[0]) == 1 and int(r2.accepted[1]) == k
    _eq(_np(r.tokens), r2.tokens)
    _eq(_np(r.accepted), r2.accepted)


@pytest.mark.gpu
@pytest.mark.parametrize("qkind", ["point", "sparse"])
def test_lazy_cuda_graph_replay(cuda, qkind):
    import torch
    rng = np.random.default_rng(31)
    b, k, v = 64, 5, 129280
    dev = "cuda"
    tgt = torch.zeros(b, k + 1, v, dtype=torch.float32, device=dev)
    draft = torch.zeros(b, k, dtype=torch.int32, device=dev)
    seed = torch.zeros(b, dtype=torch.int64, device=dev)
    pos = torch.zeros(b, dtype=torch.int32, device=dev)
    keys = dyadic.Keys(seed=seed, generation=torch.zeros(b, dtype=torch.int32, device=dev),
                       round=torch.zeros(b, dtype=torch.int32, device=dev), position=pos)
    qdev = None
    if qkind == "sparse":
        qc = torch.zeros(b, k, 32, dtype=torch.int32, device=dev)
        qi = torch.zeros(b, k, 32, dtype=torch.int32, device=dev)
        # all-zero rows: not a valid q (the kernels fail such rows closed)
        qdev = trusted_dyadic(qc.view(torch.uint32), qi, v, "standard")
    out = {"accepted": torch.empty(b, dtype=torch.int32, device=dev),
           "tokens": torch.empty(b, k + 1, dtype=torch.int32, device=dev),
           "status": torch.empty(b, dtype=torch.int32, device=dev)}
    host = {}

    def fill():
        p, d, q = _forced_case(rng, b, k, v, "point" if qkind == "point" else "sparse")
        tgt.copy_(torch.from_numpy(p))
        draft.copy_(torch.from_numpy(d))
        if q is not None:
            qc.copy_(torch.from_numpy(np.asarray(q.counts).view(np.int32).copy()))
            qi.copy_(torch.from_numpy(np.asarray(q.ids).copy()))
        seed.copy_(torch.from_numpy(rng.integers(0, 2**62, size=b)))
        pos.copy_(torch.from_numpy(rng.integers(0, 2**30, size=b).astype(np.int32)))
        host.update(p=p, d=d, q=q)

    def step():
        dyadic.verify(tgt, draft, qdev, keys, backend=cuda, check="lazy", out=out)

    fill()
    replay = capture_graph(step)
    for _ in range(3):
        fill()
        replay()
        torch.cuda.synchronize()
        hk = dyadic.Keys(seed=seed.cpu().numpy().astype(np.uint64), position=pos.cpu().numpy())
        r2 = dyadic.verify(host["p"], host["d"], host["q"], hk, backend="cpu")
        _eq(out["status"].cpu().numpy(), np.zeros(b, dtype=np.int32))
        _eq(out["tokens"].cpu().numpy(), r2.tokens)
        _eq(out["accepted"].cpu().numpy(), r2.accepted)


def _near_q_case(rng, b, k, v, qkind):
    """Target rows equal to q's probabilities up to a relative 2^-11 noise (every id
    with c_v > 0 is AMBIGUOUS for the residual selection of verify_lazy: its selection
    depends on the exact row total), the draft token at half its q mass (acceptance
    ~ 1/2, so about half the requests draw from such a residual row)."""
    w = rng.random((b * k, v)).astype(np.float32) + np.float32(0.05)
    q = dyadic.allocate(w, top_k=None if qkind == "dense" else 32, backend="cpu")
    counts = np.asarray(q.counts).reshape(b, k, -1)
    ids = None if q.ids is None else np.asarray(q.ids).reshape(b, k, -1)
    q = dyadic.Dyadic(counts, ids, vocab_size=v)
    p = np.zeros((b, k + 1, v), dtype=np.float64)
    draft = np.zeros((b, k), dtype=np.int32)
    for r in range(b):
        for i in range(k):
            c = counts[r, i].astype(np.float64)
            idx = np.arange(v) if ids is None else ids[r, i]
            p[r, i, idx] = c / 2**24 * (1 + (rng.random(c.size) * 2 - 1) * 2.0**-11)
            j = int(np.argmin(np.where(c > 0, c, np.inf)))
            draft[r, i] = idx[j]
            p[r, i, idx[j]] = c[j] / 2**25
            # the half mass taken from the draft goes to one other id (outside the support
            # when sparse, else the largest count): the row still sums to ~1
            e = int(np.argmax(c)) if ids is None else int(np.setdiff1d(np.arange(v), idx)[0])
            p[r, i, e] += c[j] / 2**25
        p[r, k] = _target(rng, 1, 1, v)[0, 0]
    return p.astype(np.float32), draft, q


@pytest.mark.gpu
@pytest.mark.parametrize("v,b", [(4097, 16), (129280, 8), (111, 16)])
@pytest.mark.parametrize("qkind", ["dense", "sparse"])
def test_lazy_residual_row_near_q(cuda, v, b, qkind):
    """Residual rows whose selection R_v > 0 is undecided without the exact total for
    almost every id (verify_lazy's dirty chunks, summed again by the last block)."""
    k = 3
    rng = np.random.default_rng(v + 5 * b)
    p, draft, q = _near_q_case(rng, b, k, v, qkind)
    tot = _totals(p)
    assert all(abs(t - ONE) <= TOL for row in tot for t in row)
    rejected = 0
    for rep in range(3):
        keys = dyadic.Keys(seed=rng.integers(0, 2**63, size=b), generation=3, round=rep,
                           position=rng.integers(0, 2**20, size=b))
        r2 = _same_as_cpu(p, draft, q, keys)
        rejected += int((np.asarray(r2.accepted) < k).sum())
    assert rejected >= 3, rejected  # residual rows were drawn from


@pytest.mark.gpu
@pytest.mark.parametrize("qkind", ["dense", "sparse"])
def test_lazy_parity_full_batch(cuda, qkind):
    """B = 64 at V = 129280 (the benchmark's shape): verify_lazy's largest tiles (16384 ids,
    256 chunks per tile: the chunk search takes two passes of its warp)."""
    b, k, v = 64, 5, 129280
    rng = np.random.default_rng(64 + len(qkind))
    p = _target(rng, b, k + 1, v)
    draft, q = _draft_q(rng, p, qkind, k)
    keys = dyadic.Keys(seed=rng.integers(0, 2**63, size=b), generation=2, round=1,
                       position=rng.integers(0, 2**20, size=b))
    _same_as_cpu(p, draft, q, keys)


@pytest.mark.gpu
@pytest.mark.parametrize("v", [131072, 131073, 200003])
@pytest.mark.parametrize("qkind", ["dense", "sparse", "point"])
def test_lazy_parity_search_paths(cuda, v, qkind):
    """Vocabularies past the benchmark's (2**17, 2**17 + 1, a prime above 2**17: more than
    2048 chunks of 64 ids, a last tile of one id): verify_lazy equals the CPU backend."""
    _random_case_same_as_cpu(np.random.default_rng(v + len(qkind)), 2, 3, v, qkind, 3)
