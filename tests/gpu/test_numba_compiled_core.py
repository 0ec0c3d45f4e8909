"""backend="numba": its integer core compiled by numba (not the simulator) == the reference.

The CUDA simulator runs the device functions as Python on NumPy scalars, so a
hazard that only exists in compiled code (numba's typing: a signed/unsigned mix
promoted to float64, ``float(float32)`` typed as float32) never shows in CI.
``test_compiled_core`` imports backends/cuda/numba/core.py in a fresh
interpreter (this process runs the simulator: tests/conftest.py) with
``numba.cuda.jit(device=True)`` returning ``numba.njit``, so its pure-arithmetic
device functions compile on the CPU (same typing rules as ``cuda.jit``), and
compares every function with ``dyadic.reference`` on adversarial values, bit
for bit.

``test_fuzz_seed7_case22_length1_keys``: the reproducer of
``python -m dyadic.fuzz --backends cpu,cuda,numba --seed 7`` on an H200
(tests/data/fuzz-seed7-case22-verify.npz, B=2, keys of length 1).  On a GPU
dyadic/_device.py hands length-1 device key arrays to the backend as they
are (the cuda backend broadcasts them); the numba kernels read ``seed[b]``
etc., out of bounds for b >= 1 (garbage keys on the GPU, IndexError in the
simulator).  The backend is called the way dyadic/_device.py calls it.
"""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import dyadic
from dyadic import _backend

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CASE = os.path.join(REPO, "tests", "data", "fuzz-seed7-case22-verify.npz")

try:
    import numba  # noqa: F401
    HAVE_NUMBA = True
except ImportError:  # pragma: no cover
    HAVE_NUMBA = False

SCRIPT = textwrap.dedent(r'''
    import io, os, sys
    import numpy as np
    sys.path.insert(0, REPO)
    import numba
    import numba.cuda
    from numba.core.registry import CPUDispatcher

    _cuda_jit = numba.cuda.jit

    def _jit_on_cpu(*args, **kwargs):
        """cuda.jit(device=True) -> numba.njit; kernels and the rest unchanged."""
        if not args and kwargs == {"device": True}:
            return numba.njit
        return _cuda_jit(*args, **kwargs)

    numba.cuda.jit = _jit_on_cpu
    from backends.cuda.numba import core as C
    from dyadic import _spec
    from dyadic.reference import fixedpoint, philox, sampling

    assert isinstance(C.mul64, CPUDispatcher), "core not compiled on the CPU"
    U = np.uint64
    M64 = (1 << 64) - 1
    rng = np.random.default_rng(20240607)
    fails = []

    def eq(name, got, want):
        if got != want:
            fails.append(f"{name}: compiled {got!r} != reference {want!r}")

    def h(x):
        return (int(x[0]) << 64) | int(x[1])

    def split(n):
        return U(n >> 64), U(n & M64)

    edge = [0, 1, 2, 3, (1 << 24) - 1, 1 << 24, (1 << 31) - 1, 1 << 31, (1 << 32) - 1, 1 << 32,
            (1 << 32) + 1, 1 << 52, (1 << 53) - 1, 1 << 53, (1 << 53) + 1, 1 << 61, (1 << 62) - 1,
            1 << 62, (1 << 62) + 1, (1 << 63) - 1, 1 << 63, (1 << 63) + 1, M64 - 1, M64]
    vals = edge + [int(x) for x in rng.integers(0, 1 << 64, size=40, dtype=np.uint64)]

    # 64 x 64 -> 128, 128-bit add / sub / compare
    for a in vals:
        for b in vals[::3]:
            eq(f"mul64({a}, {b})", h(C.mul64(U(a), U(b))), a * b)
            ah, al = split(a * b)
            bh, bl = split(b * a + b)
            eq(f"add128({a}*{b}, {b}*{a}+{b})", h(C.add128(ah, al, bh, bl)), (2 * a * b + b) % (1 << 128))
            eq(f"lt128({a}*{b}, {b}*{a}+{b})", bool(C.lt128(ah, al, bh, bl)), a * b < a * b + b)
            eq(f"sub128({a}*{b}+{b}, {a}*{b})", h(C.sub128(bh, bl, ah, al)), b)
        eq(f"bitlen64({a})", int(C.bitlen64(U(a))), a.bit_length())

    # 128-bit N by a count (the acceptance split N = P_d 2**24 = a c + b)
    counts = [1, 2, 3, 1886, 4095745, 6024942, 10752274, 12681471, 16775330, (1 << 24) - 1,
              1 << 24, (1 << 32) - 1]
    nums = [1 << 85, (1 << 62) << 24, (((1 << 62) - 1) << 24), ((1 << 61) + 12345) << 24,
            (1 << 128) - 1, 1 << 127, 0, 1] + [int(x) << 24 for x in rng.integers(0, 1 << 62, 8)]
    for n in nums:
        for c in counts:
            q, r = divmod(n, c)
            got = C.divmod128_small(U(n >> 64), U(n & M64), U(c))
            eq(f"divmod128_small({n}, {c})", (h(got[:2]), int(got[2])), (q, r))

    for m in [1, 0x7FFFFF, 0x800000, 0xFFFFFF, (1 << 39) - 1]:
        for s in range(-70, 64 - m.bit_length() + 1):
            eq(f"shift_floor({m}, {s})", int(C.shift_floor(U(m), s)), fixedpoint.shift_floor(m, s))

    # Philox at extreme key fields
    keysets = [(3794376869396575988, 4294967295, 3651960046, 4294967290),
               (M64, (1 << 32) - 1, (1 << 32) - 1, (1 << 32) - 1), (0, 0, 0, 0),
               (1 << 63, 1 << 31, 1 << 31, (1 << 32) - 2)]
    for (sd, ge, ro, po) in keysets:
        for dom in (1, 2, 3):
            for idx in (0, 1, 2, _spec.MAX_DRAW_INDEX):
                got = tuple(int(w) for w in C.draw_block(U(sd), U(ge), U(ro), U(po), dom, idx))
                eq(f"draw_block({sd},{ge},{ro},{po},{dom},{idx})", got,
                   philox.block((sd, ge, ro), po, dom, idx))

    # uniform_below: masks of 0..128 bits (n = 2**62 is the all-0.5 target total)
    ns = [1, 2, 3, 1 << 24, (1 << 62) - 1, 1 << 62, (1 << 62) + 1, (1 << 63) - 1, 1 << 63,
          (1 << 63) + 1, M64, 1 << 64, (1 << 64) + 1, 1 << 65, (1 << 65) + 3, 1 << 127,
          (1 << 127) + 1, (1 << 128) - 1, (1 << 62) - (1 << 52), (1 << 62) + (1 << 52)]
    for (sd, ge, ro, po) in keysets:
        for n in ns:
            for dom, start in ((2, 0), (3, 0), (2, 5)):
                want = philox.uniform_below(n, (sd, ge, ro), po, dom, start)
                vh, vl, nxt, ok = C.uniform_below(U(n >> 64), U(n & M64), U(sd), U(ge), U(ro),
                                                  U(po), dom, start)
                eq(f"uniform_below({n}, {sd},{ge},{ro},{po}, {dom}, {start})",
                   (bool(ok), h((vh, vl)), int(nxt)), (True,) + want)

    # the acceptance decision (this case's numbers, then random ones)
    sd, ge, ro, po = keysets[0]
    for p in [1 << 61, (1 << 61) - 1, 1 << 62, 0, 1, (1 << 62) - (1 << 40)]:
        for total in [1 << 62, (1 << 62) - (1 << 52), (1 << 62) + (1 << 52), (1 << 62) + 1]:
            for c in counts[:-1]:
                for i in range(3):
                    got = C.accept_decision(U(p), U(total), U(c), U(sd), U(ge), U(ro),
                                            U(po + i), _spec.DOMAIN_ACCEPTANCE)
                    eq(f"accept_decision({p},{total},{c},pos+{i})", (bool(got[0]), bool(got[1])),
                       (sampling.accept(p, total, c, (sd, ge, ro), po + i), True))
    for _ in range(300):
        p = int(rng.integers(0, 1 << 62))
        total = (1 << 62) + int(rng.integers(-(1 << 52), 1 << 52))
        c = int(rng.integers(1, (1 << 24) + 1))
        ks = [int(x) for x in rng.integers(0, 1 << 32, 3)]
        s64 = int(rng.integers(0, 1 << 64, dtype=np.uint64))
        got = C.accept_decision(U(p), U(total), U(c), U(s64), U(ks[0]), U(ks[1]), U(ks[2]), 2)
        eq(f"accept_decision({p},{total},{c},{s64},{ks})", bool(got[0]),
           sampling.accept(p, total, c, (s64, ks[0], ks[1]), ks[2]))

    # key fields: length B or 1 (broadcast), unsigned or signed words
    def key_arrays(sd, ge, ro, po, n, signed):
        s = np.full(n, sd, dtype=np.uint64)
        o = [np.full(n, x, dtype=np.uint32) for x in (ge, ro, po)]
        if signed:
            s, o = s.view(np.int64), [a.view(np.int32) for a in o]
        return (s, *o)
    for (sd, ge, ro, po) in keysets:
        for n in (1, 2):
            for signed in (False, True):
                arrs = key_arrays(sd, ge, ro, po, n, signed)
                for b in (0, 1):
                    eq(f"key_words(len {n}, signed {signed}, b {b})",
                       tuple(int(x) for x in C.key_words(*arrs, b)), (sd, ge, ro, po))

    # fuzz seed 7 case 22 at the core level: length-1 keys, rows b = 0, 1
    z = np.load(CASE_PATH)
    tbits = z["a:target"].view(np.uint32)
    qc, draft = z["a:q_counts"], z["a:draft"]
    key = (z["a:seed"], z["a:generation"], z["a:round"], z["a:position"])
    for signed in (False, True):
        arrs = key if not signed else (key[0].view(np.int64),) + tuple(a.view(np.int32) for a in key[1:])
        for b in range(tbits.shape[0]):
            sd_, ge_, ro_, po_ = C.key_words(*arrs, b)
            ref_keys = (int(key[0][0]), int(key[1][0]), int(key[2][0]))
            acc = draft.shape[1]
            want = sampling.verify_row([list(map(int, r)) for r in tbits[b]], list(map(int, draft[b])),
                                       [list(map(int, r)) for r in qc[b]], ref_keys,
                                       int(key[3][0]), False)[1]
            for i in range(draft.shape[1]):
                d = int(draft[b, i])
                total = sum(int(C.target_fixed(U(x))[0]) for x in tbits[b, i])
                pd, bad = C.target_fixed(U(tbits[b, i, d]))
                ok, good = C.accept_decision(pd, U(total), U(qc[b, i, d]), sd_, ge_, ro_,
                                             po_ + U(i), _spec.DOMAIN_ACCEPTANCE)
                assert good and not bad
                if not ok:
                    acc = i
                    break
            eq(f"case22 row {b} accepted (signed keys {signed})", acc, want)
            eq(f"case22 row {b} accepted (known)", want, 2)

    # conversions
    bits = [0, 1, 0x7FFFFF, 0x800000, 0x3F000000, 0x3F800000, 0x3F7FFFFF, 0x33800000, 0x00000001,
            0x80000000] + [int(x) for x in rng.integers(0, 0x3F800001, 50)]
    for b in bits:
        p, inv = C.target_fixed(U(b))
        m, e = fixedpoint.f32_mant_exp(b & 0x7FFFFFFF)
        eq(f"target_fixed({b:#x})", (int(p), bool(inv)), (fixedpoint.shift_floor(m, e + 62), False))
        mm, ee = C.f32_mant_exp(U(b & 0x7FFFFFFF))
        eq(f"f32_mant_exp({b:#x})", (int(mm), int(ee)), (m, e))
    for b in (0x3F800001, 0x7F800000, 0x7FC00000, 0xBF000000):
        eq(f"target_fixed({b:#x}) invalid", bool(C.target_fixed(U(b))[1]), True)
    for f in [0, 1, 255, 256, 0xFFFFFFFF, 0x80000000] + [int(x) for x in rng.integers(0, 1 << 32, 50)]:
        eq(f"exp2_neg_q62({f})", int(C.exp2_neg_q62(U(f))), fixedpoint.exp2_neg_q62(f))
    ts = [0.0, 5e-324, 2.0 ** -40, 1e-10, 0.5, 1.0, 2.0 ** 0.5, 22.18070977791825, 31.999999999999996,
          32.0, float("inf")] + [float(x) for x in rng.uniform(0, 33, 60)]
    for t in ts:
        eq(f"weight_from_gap({t!r})", int(C.weight_from_gap(t)), fixedpoint.weight_from_gap(t))
    zs = [0.0, -0.0, 5e-324, -5e-324, 2.2250738585072014e-308, 1.0, -1.0, 1.5, 1e308, -1e308,
          float("inf"), float("-inf")] + [float(x) for x in rng.normal(0, 30, 40)]
    import struct
    def ref_key(z):
        (u,) = struct.unpack("<Q", struct.pack("<d", z))
        if z == 0.0:
            return 1 << 63
        return (M64 - u) if u >> 63 else (u | (1 << 63))
    for z_ in zs:
        eq(f"f64_key({z_!r})", int(C.f64_key(z_)), ref_key(z_))

    # typing: no floating-point value in the integer functions
    for name in ("philox", "draw_block", "mul64", "add128", "sub128", "lt128", "divmod128_small",
                 "bitlen64", "shift_floor", "uniform_below", "accept_decision", "key_words",
                 "exp2_neg_q62", "f32_mant_exp", "target_fixed"):
        disp = getattr(C, name)
        assert disp.overloads, name
        for sig, ov in disp.overloads.items():
            fl = sorted({f"{k}: {v}" for k, v in ov.fndesc.typemap.items() if "float" in str(v)})
            if fl:
                fails.append(f"{name}{sig} has floating-point values: {fl[:6]}")

    if fails:
        print(f"{len(fails)} mismatches", *fails[:40], sep="\n")
        sys.exit(1)
    print("compiled core == reference")
''')


@pytest.mark.skipif(not HAVE_NUMBA, reason="numba not installed")
def test_compiled_core():
    env = dict(os.environ)
    env.pop("NUMBA_ENABLE_CUDASIM", None)  # the decorator is numba.njit either way
    src = f"REPO = {REPO!r}\nCASE_PATH = {CASE!r}\n" + SCRIPT
    proc = subprocess.run([sys.executable, "-c", src], env=env, capture_output=True, text=True,
                          timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]
    assert "compiled core == reference" in proc.stdout


def _numba_backend():
    from test_numba_sim import NUMBA, WHY
    if NUMBA is None:
        pytest.skip(str(WHY))
    return NUMBA


def _case():
    z = np.load(CASE)
    return {k[2:]: z[k] for k in z.files if k.startswith("a:")}


@pytest.mark.parametrize("signed", [False, True])
def test_fuzz_seed7_case22_length1_keys(signed):
    """verify with length-1 key arrays (as dyadic/_device.py passes device keys)."""
    be = _numba_backend()
    a = _case()
    keys = [a["seed"], a["generation"], a["round"], a["position"]]
    if signed:  # torch has int64 / int32 key tensors
        keys = [keys[0].view(np.int64)] + [k.view(np.int32) for k in keys[1:]]
    bsz, k1, _ = a["target"].shape
    ref = dyadic.verify(a["target"], a["draft"],
                        dyadic.Dyadic(a["q_counts"], None, vocab_size=a["target"].shape[2],
                                      policy="external"),
                        dyadic.Keys(seed=int(a["seed"][0]), generation=int(a["generation"][0]),
                                    round=int(a["round"][0]), position=int(a["position"][0])),
                        backend="reference")
    np.testing.assert_array_equal(ref.accepted, [2, 2])
    np.testing.assert_array_equal(ref.tokens, [[0, 1, 0], [0, 1, 0]])
    acc = np.full(bsz, 7, np.int32)
    tok = np.full((bsz, k1), 7, np.int32)
    st = np.full(bsz, 7, np.int32)
    be.verify(a["target"], a["draft"].astype(np.int32), a["q_counts"], None,
              np.zeros(bsz, np.uint8), *keys, acc, tok, st)
    np.testing.assert_array_equal(st, 0)
    np.testing.assert_array_equal(acc, ref.accepted)
    np.testing.assert_array_equal(tok, ref.tokens)


def test_length1_keys_draw_and_propose():
    """draw and propose read the keys the same way (length 1 == broadcast)."""
    be = _numba_backend()
    ref = _backend.get("reference")
    rng = np.random.default_rng(22)
    bsz, v = 3, 5
    one = (np.array([3794376869396575988], np.uint64), np.array([4294967295], np.uint32),
           np.array([3651960046], np.uint32), np.array([4294967290], np.uint32))
    full = tuple(np.repeat(k, bsz) for k in one)
    x = (rng.normal(size=(bsz, v)) * 2).astype(np.float32)
    temp = np.ones(bsz)
    outs = []
    for b_, keys in ((be, one), (ref, full)):
        tok = np.full(bsz, 7, np.int32)
        counts = np.zeros((bsz, v), np.uint32)
        st = np.full(bsz, 7, np.int32)
        b_.propose(x, None, temp, 0, 0, *keys, tok, counts, None, st)
        dtok = np.full(bsz, 7, np.int32)
        b_.draw(counts, None, *keys, dtok)
        outs.append((tok, counts, st, dtok))
    for got, want in zip(*outs):
        np.testing.assert_array_equal(got, want)
