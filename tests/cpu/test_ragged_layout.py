"""dyadic.ragged: vLLM's flat layout (cu_num_draft_tokens = cumsum(n), no leading zero)
to and from verify's padded layout, NumPy and torch CPU (CUDA tensors:
tests/gpu/test_gpu_ragged.py), round trips, errors, and the end-to-end use: a flat
batch padded, verified with num_drafts and unpadded equals every request verified
alone."""

import numpy as np
import pytest

import dyadic
from dyadic import Keys, ragged

from conftest import random_target

N = np.array([2, 0, 3, 1, 3], dtype=np.int32)
CU = np.cumsum(N).astype(np.int32)  # vLLM: np.cumsum(num_draft_tokens, dtype=np.int32)


def _libs():
    out = [np]
    try:
        import torch
        out.append(torch)
    except ImportError:  # pragma: no cover
        pass
    return out


def _as(lib, a):
    return a if lib is np else lib.from_numpy(np.ascontiguousarray(a))


def _np(a):
    return a if isinstance(a, np.ndarray) else a.numpy()


@pytest.mark.parametrize("lib", _libs(), ids=lambda m: m.__name__)
def test_pad_unpad_round_trip(lib, rng):
    flat = rng.integers(0, 1000, (int(CU[-1]), 4)).astype(np.int64)
    padded = ragged.pad(_as(lib, flat), _as(lib, CU), 3, fill=-1)
    assert tuple(padded.shape) == (5, 3, 4)
    p = _np(padded)
    starts = CU - N
    for b in range(5):
        np.testing.assert_array_equal(p[b, :N[b]], flat[starts[b]:CU[b]])
        assert (p[b, N[b]:] == -1).all()
    back = ragged.unpad(padded, _as(lib, N))
    np.testing.assert_array_equal(_np(back), flat)
    np.testing.assert_array_equal(_np(ragged.lengths(_as(lib, CU))), N)


@pytest.mark.parametrize("lib", _libs(), ids=lambda m: m.__name__)
def test_sampled_layout_and_bonus_rows(lib, rng):
    """The [N + B, V] layout (cu_num_sampled_tokens = cumsum(n + 1), bonus last) and the
    separate [N, V] + [B, V] layout give the same padded target."""
    v = 6
    drafts = rng.random((int(CU[-1]), v)).astype(np.float32)
    bonus = rng.random((5, v)).astype(np.float32)
    sampled = np.concatenate([np.concatenate([drafts[c - n:c], bonus[b:b + 1]])
                              for b, (c, n) in enumerate(zip(CU, N))])
    cu_sampled = np.cumsum(N + 1).astype(np.int32)
    a = ragged.pad(_as(lib, sampled), _as(lib, cu_sampled), 4)
    t = ragged.pad_target(_as(lib, drafts), _as(lib, bonus), _as(lib, CU), 3)
    np.testing.assert_array_equal(_np(a), _np(t))
    for b in range(5):
        np.testing.assert_array_equal(_np(t)[b, N[b]], bonus[b])


def test_empty_batches_and_zero_width():
    assert ragged.pad(np.zeros(0, np.int32), np.zeros(0, np.int32), 3).shape == (0, 3)
    z = ragged.pad(np.zeros(0, np.int32), np.zeros(2, np.int32), 2, fill=7)
    assert z.tolist() == [[7, 7], [7, 7]]
    assert ragged.unpad(np.zeros((2, 0)), np.zeros(2, np.int64)).shape == (0,)


def test_errors_name_the_argument_and_row():
    flat = np.arange(9)
    with pytest.raises(ValueError, match="cu_lengths: row 2: a request holds more than "
                                         "width = 2 entries"):
        ragged.pad(flat, CU, 2)
    with pytest.raises(ValueError, match="cu_lengths: the last cumulative count 9 must "
                                         "equal the number of flat rows 8"):
        ragged.pad(flat[:8], CU, 3)
    with pytest.raises(ValueError, match="cu_lengths: row 1: cumulative counts must be "
                                         ">= 0 and non-decreasing"):
        ragged.pad(flat, np.array([4, 3, 9]), 5)
    with pytest.raises(TypeError, match="cu_lengths: dtype float64 is not an integer dtype"):
        ragged.pad(flat, CU.astype(np.float64), 3)
    with pytest.raises(ValueError, match=r"cu_lengths: expected a 1-D array \[B\]"):
        ragged.pad(flat, CU[None], 3)
    with pytest.raises(ValueError, match=r"lengths: row 3: a length must be in \[0, W\] = "
                                         r"\[0, 3\]"):
        ragged.unpad(np.zeros((5, 3)), np.array([0, 1, 2, 4, 0]))
    with pytest.raises(ValueError, match=r"lengths: shape \(4,\) must be \(B,\) = \(5,\)"):
        ragged.unpad(np.zeros((5, 3)), N[:4])
    with pytest.raises(TypeError, match="values: expected a NumPy array or a torch tensor"):
        ragged.pad([1, 2], CU, 3)
    with pytest.raises(ValueError, match=r"bonus: shape \(4, 6\) must be \(B, V\) = \(5, 6\)"):
        ragged.pad_target(np.zeros((9, 6), np.float32), np.zeros((4, 6), np.float32), CU, 3)


def test_unchecked_pad_never_reads_out_of_bounds():
    """check=False: inconsistent counts give unspecified values, from inside values."""
    flat = np.arange(9)
    out = ragged.pad(flat, np.array([4, 3, 40]), 5, check=False)
    assert out.shape == (3, 5)
    assert set(out[out != 0].tolist()) <= set(flat.tolist())


@pytest.mark.parametrize("sparse", [True, False])
def test_pad_q_is_a_valid_dyadic(sparse, rng):
    v = 11
    q = dyadic.allocate(rng.random((int(CU[-1]), v)).astype(np.float32),
                        top_k=4 if sparse else None)
    pq = ragged.pad_q(q, CU, 3)
    assert pq.batch_shape == (5, 3) and pq.vocab_size == v and pq.is_sparse == sparse
    # the rules of a user-built Dyadic hold for every row, padding included
    dyadic.Dyadic(np.array(pq.counts), None if pq.ids is None else np.array(pq.ids),
                  vocab_size=v)
    flat_counts = ragged.unpad(np.asarray(pq.counts), N)
    np.testing.assert_array_equal(flat_counts, np.asarray(q.counts))


def test_vllm_flat_batch_end_to_end(rng):
    """Flat drafts, q rows, target and bonus rows -> pad -> verify(num_drafts) -> unpad:
    each request's emitted tokens equal the request verified alone."""
    v, k = 17, 3
    b = len(N)
    target_flat = random_target(rng, 1, int(CU[-1]), v)[0]
    bonus = random_target(rng, 1, b, v)[0]
    q_flat = dyadic.allocate(rng.standard_normal((int(CU[-1]), v)).astype(np.float32),
                             logits=True, top_k=5)
    draft_flat = np.asarray(q_flat.ids)[:, 0].copy()
    keys = Keys(seed=np.arange(b, dtype=np.uint64) + 11, position=np.arange(b, dtype=np.uint32))
    res = dyadic.verify(ragged.pad_target(target_flat, bonus, CU, k),
                        ragged.pad(draft_flat, CU, k, fill=-1), ragged.pad_q(q_flat, CU, k),
                        keys, num_drafts=ragged.lengths(CU))
    emitted = ragged.unpad(res.tokens, res.accepted + 1)
    off = 0
    for r in range(b):
        n, s = int(N[r]), int(CU[r] - N[r])
        rows = np.concatenate([target_flat[s:s + n], bonus[r:r + 1]])[None]
        q = None if n == 0 else dyadic.Dyadic(np.asarray(q_flat.counts)[s:s + n][None],
                                              np.asarray(q_flat.ids)[s:s + n][None],
                                              vocab_size=v)
        one = dyadic.verify(rows, draft_flat[s:s + n][None], q,
                            Keys(seed=np.uint64(r + 11), position=r))
        m = int(one.accepted[0]) + 1
        np.testing.assert_array_equal(emitted[off:off + m], one.tokens[0, :m])
        off += m
    assert off == emitted.shape[0]
