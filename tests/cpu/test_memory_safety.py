"""Hostile routes to a kernel, each run in a subprocess: a crash fails the test.

Every case builds its inputs only through public API (no private constructors) the way
a careless or hostile caller could, then calls draw / verify.  Each call must either
raise ValueError / TypeError / IndexError (or the wire's WireError) or return exactly
what the same call returns on untouched inputs; the process must exit normally.  The
vocabulary reaches 2**24 on the cpu backend; the reference and the numba simulator run
the same cases at small vocabularies; cuda runs them with device tensors on a GPU.
"""

import os
import subprocess
import sys
import textwrap

import pytest

import dyadic

PRELUDE = textwrap.dedent("""
    import numpy as np, dyadic, sys
    from dyadic import Dyadic, Keys
    BACKEND, V = sys.argv[1], int(sys.argv[2])
    TOTAL = 1 << 24
    REFUSED = (ValueError, TypeError, IndexError)
    torch = None
    if BACKEND == "cuda":
        import torch
    def dev(x):
        return x if torch is None else torch.as_tensor(np.ascontiguousarray(x)).cuda()
    def host(x):
        return np.asarray(x) if torch is None or isinstance(x, np.ndarray) else x.cpu().numpy()
    def point_target(b, k1, v, hot=0):
        p = np.zeros((b, k1, v), np.float32)
        p[..., hot] = 1.0
        return p
    def refused(fn):
        try:
            fn()
        except REFUSED:
            return True
        return False
""")

CASES = {
    # indexing with an Ellipsis selects batch rows: never a Dyadic narrower than V
    "ellipsis_index": """
        c = np.zeros((1, 2, V), np.uint32)
        c[..., 1] = TOTAL
        q = Dyadic(dev(c))
        for index in [(Ellipsis, slice(None, 1)), (Ellipsis, 0), (Ellipsis,),
                      (Ellipsis, slice(V - 1, None)), (0, Ellipsis)]:
            try:
                qi = q[index]
            except IndexError:
                continue
            assert qi.width == V and qi.vocab_size == V, (index, qi)
            flat = qi.counts.reshape(-1, V)
            toks = dyadic.draw(Dyadic(flat), Keys(7), backend=BACKEND)
            assert (host(toks) == 1).all()
        q1 = q[..., :1]
        p = point_target(1, 2, V, hot=1)
        r = dyadic.verify(dev(p), dev(np.ones((1, 1), np.int32)), q1, Keys(3), backend=BACKEND)
        assert host(r.tokens).tolist() == [[1, 1]]
    """,
    # the caller's buffers refilled with hostile values after Dyadic(...) validated them
    "refilled_buffers": """
        base_c = np.zeros((2, 9), np.uint32)
        base_i = np.full((2, 9), -1, np.int32)
        base_c[:, 1] = base_c[:, 2] = TOTAL // 2
        base_i[:, 1], base_i[:, 2] = 0, V - 1
        view_c, view_i = base_c[:, 1:5], base_i[:, 1:5]   # views whose base stays writeable
        src_c, src_i = (view_c, view_i) if torch is None else (dev(view_c), dev(view_i))
        q = Dyadic(src_c, src_i, vocab_size=V)
        keys = Keys(seed=[11, 12])
        before = host(dyadic.draw(q, keys, backend=BACKEND)).tolist()
        p = point_target(2, 2, V, hot=V - 1)
        draft = dev(np.zeros((2, 1), np.int32))
        qk = dyadic.stack([q], axis=1)
        v_before = host(dyadic.verify(dev(p), draft, qk, keys, backend=BACKEND).tokens).tolist()
        hostile = [(1 << 30), -(1 << 30), V, 2 * V + 5][:2 if BACKEND == "numba" else 4]
        for h in hostile:
            base_i[:, 1:5] = h
            base_c[:, 1:5] = 0xFFFFFFFF
            if torch is not None:
                src_i.fill_(h)
                src_c.fill_(-1)  # all bits set
            assert host(dyadic.draw(q, keys, backend=BACKEND)).tolist() == before
            got = host(dyadic.verify(dev(p), draft, qk, keys, backend=BACKEND).tokens).tolist()
            assert got == v_before, (h, got, v_before)
        assert base_c.flags.writeable and view_c.flags.writeable  # never made read-only
    """,
    # a wire Reply carrying a bad sparse payload (with a matching checksum) never
    # becomes a Dyadic
    "wire_reply_payload": """
        from dyadic import wire
        for bad_id in [V, V + 7, (1 << 31) - 1, 1 << 40, -5]:
            half = TOTAL // 2
            checksum = (half * (2 * 0 + 1) + half * (2 * bad_id + 1)) % (1 << 32)
            try:
                reply = wire.Reply(session=1, generation=0, round=0, attempt=0,
                                   context_version=0, slots=(0,),
                                   sampled=np.zeros((1, 1), np.int64),
                                   representation=np.full((1, 1), 2, np.uint8),
                                   n_entries=np.full((1, 1), 2, np.uint32),
                                   checksums=np.full((1, 1), checksum, np.uint32),
                                   values=np.array([0.5, 0.5], np.float32),
                                   ids=np.array([0, bad_id], np.int64), vocab_size=V)
                q = reply.to_dyadic()
            except (ValueError, TypeError, OverflowError, wire.WireError):
                continue
            raise AssertionError(f"a Reply with id {bad_id} was turned into a Dyadic")
    """,
    # hand-made arrays that break a rule: refused at construction
    "constructor_rules": """
        ids = np.array([[0, V]], np.int32)
        counts = np.array([[TOTAL // 2, TOTAL // 2]], np.uint32)
        assert refused(lambda: Dyadic(dev(counts), dev(ids), vocab_size=V))
        assert refused(lambda: Dyadic(dev(counts), dev(ids), vocab_size=V + 0.5))
        assert refused(lambda: Dyadic(dev(np.full((1, 3), TOTAL, np.uint32))))
        assert refused(lambda: Dyadic(dev(counts), dev(np.array([[5, 5]], np.int32)),
                                      vocab_size=V))
        dense = Dyadic(dev(np.eye(1, V, dtype=np.uint32) * TOTAL))
        p = point_target(1, 2, V)
        r = dyadic.verify(dev(p), dev(np.zeros((1, 1), np.int32)), dyadic.stack([dense], axis=1),
                          Keys(1), backend=BACKEND)
        assert host(r.tokens).tolist() == [[0, 0]]
    """,
    # check=False with draft ids that index nothing: the request fails closed
    "hostile_drafts": """
        q = dyadic.stack([Dyadic(dev(np.eye(2, V, dtype=np.uint32) * TOTAL))], axis=1)
        p = point_target(2, 2, V)
        for bad in [-1, V, (1 << 31) - 1, -(1 << 31)]:
            draft = np.array([[0], [bad]], np.int64 if torch is None else np.int32)
            r = dyadic.verify(dev(p), dev(draft), q, Keys(seed=[1, 2]), backend=BACKEND,
                              check=False)
            assert host(r.status).tolist() == [0, 13], (bad, host(r.status))
            assert host(r.tokens)[1].tolist() == [-1, -1]
            assert refused(lambda: dyadic.verify(dev(p), dev(draft), q, Keys(seed=[1, 2]),
                                                 backend=BACKEND))
    """,
}

SIZES = {"cpu": [257, 1 << 24], "reference": [257], "numba": [64], "cuda": [257, 1 << 24]}


def _params():
    out = []
    for backend, sizes in SIZES.items():
        for v in sizes:
            for name in CASES:
                marks = [pytest.mark.slow] if v > 4096 and backend != "cpu" else []
                out.append(pytest.param(backend, v, name, marks=marks,
                                        id=f"{backend}-V{v}-{name}"))
    return out


def _available(backend):
    if backend == "cuda":
        if "cuda" not in dyadic.available_backends():
            return False
        try:
            import torch
        except ImportError:
            return False
        return torch.cuda.is_available()
    return backend in dyadic.available_backends()


@pytest.mark.parametrize("backend, v, case", _params())
def test_hostile_route_is_refused_or_exact(backend, v, case):
    if not _available(backend):
        pytest.skip(f"backend {backend!r} unavailable here")
    code = PRELUDE + textwrap.dedent(CASES[case]) + "\nprint('SAFE')\n"
    env = dict(os.environ)
    proc = subprocess.run([sys.executable, "-c", code, backend, str(v)], capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0 and "SAFE" in proc.stdout, (
        f"exit {proc.returncode}\nstdout:\n{proc.stdout[-2000:]}\nstderr:\n{proc.stderr[-4000:]}")
