"""Ragged draft batches: vLLM-style flat arrays to and from verify's padded layout.

``dyadic.verify(..., num_drafts=n)`` takes a padded batch: ``draft [B, k]``,
``target [B, k+1, V]``, ``q`` of batch shape ``(B, k)``, request b using its first
``n_b`` drafts and target rows ``0..n_b`` (row ``n_b`` gives the bonus token).
vLLM's rejection sampler (v1, ``SpecDecodeMetadata``) holds the same batch flat:

- ``draft_token_ids [N]``, ``N = sum(n_b)``: the drafts of request 0, then of
  request 1, ...;
- ``cu_num_draft_tokens [B]`` = ``cumsum(n_b)``: inclusive cumulative counts with
  **no leading zero** (request b's drafts are ``[cu[b] - n_b, cu[b])``);
- the target probabilities of the draft positions ``[N, V]`` and the bonus rows
  ``[B, V]`` apart (``target_logits_indices`` / ``bonus_logits_indices``), or all
  sampled positions together ``[N + B, V]`` with ``cu_num_sampled_tokens =
  cumsum(n_b + 1)`` (request b's ``n_b + 1`` rows contiguous, the bonus row last);
- the draft probabilities ``[N, V]`` (None for a greedy drafter);
- the output ``[B, max_spec_len + 1]``: the accepted drafts, the correction or
  bonus token, then -1 (``PLACEHOLDER_TOKEN_ID``): exactly ``Verdict.tokens`` with
  ``k = max_spec_len``.

Mapping (k the largest ``n_b``, or vLLM's ``max_spec_len``)::

    n      = ragged.lengths(cu_num_draft_tokens)
    draft  = ragged.pad(draft_token_ids, cu_num_draft_tokens, k)               # [B, k]
    target = ragged.pad_target(target_probs, bonus_probs, cu_num_draft_tokens, k)
    # or, from the [N + B, V] layout: ragged.pad(probs, cu_num_sampled_tokens, k + 1)
    q      = ragged.pad_q(q_flat, cu_num_draft_tokens, k)                     # Dyadic (B, k)
    res    = dyadic.verify(target, draft, q, keys, num_drafts=n, ...)
    flat   = ragged.unpad(res.tokens, res.accepted + 1)                       # emitted tokens

Every function is vectorised (no Python loop over requests) and takes NumPy arrays
or torch tensors (CPU or CUDA), returning the same kind on the same device.
``pad`` / ``pad_target`` / ``pad_q`` with ``check=False`` never synchronise a CUDA
device (no data-dependent shapes; indices are clamped, so inconsistent lengths give
unspecified values, never an out-of-bounds read); ``check=True`` (default) reads the
lengths on the host and raises ValueError naming the argument, the request and the
rule.  ``unpad``'s output length is data-dependent (a synchronisation on CUDA).

Compatibility guarantee: pure data movement; no value is converted, rounded or
renormalised.
"""

import sys

import numpy as np

from . import _arrays, _spec
from ._types import Dyadic, trusted_dyadic


def _lib(x, name):
    """torch for a torch tensor, NumPy for a NumPy array (TypeError otherwise)."""
    if _arrays.is_torch(x):
        return sys.modules["torch"]
    if isinstance(x, np.ndarray):
        return np
    raise TypeError(f"{name}: expected a NumPy array or a torch tensor, got "
                    f"{type(x).__name__}")


def _int_vector(x, name):
    lib = _lib(x, name)
    if lib is np:
        if x.dtype.kind not in "iu":
            raise TypeError(f"{name}: dtype {_arrays.dtype_name(x)} is not an integer dtype")
    elif x.is_floating_point() or x.is_complex() or x.dtype == lib.bool:
        raise TypeError(f"{name}: dtype {_arrays.dtype_name(x)} is not an integer dtype")
    if x.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D array [B], got shape {tuple(x.shape)}")
    return lib


def _width(width, name):
    if isinstance(width, (bool, np.bool_)) or not isinstance(width, (int, np.integer)):
        raise TypeError(f"{name}: expected an int, got {type(width).__name__} {width!r}")
    if width < 0:
        raise ValueError(f"{name}: must be >= 0, got {width}")
    return int(width)


def _host(x):
    return x if isinstance(x, np.ndarray) else x.detach().cpu().numpy()


def _first_bad(mask, name, rule):
    bad = np.flatnonzero(mask)
    if bad.size:
        raise ValueError(f"{name}: row {int(bad[0])}: {rule}")


def _as_int64(x, lib):
    return x.astype(np.int64) if lib is np else x.to(lib.int64)


def lengths(cu_lengths):
    """The per-request counts ``n [B]`` of inclusive cumulative counts ``cu [B]``
    (vLLM's ``cu_num_draft_tokens``: ``cumsum(n)``, no leading zero): ``n[0] = cu[0]``,
    ``n[b] = cu[b] - cu[b-1]``.  int64, the kind and device of ``cu_lengths``.  No check
    (``pad`` checks them)."""
    lib = _int_vector(cu_lengths, "cu_lengths")
    cu = _as_int64(cu_lengths, lib)
    if lib is np:
        return np.diff(cu, prepend=np.int64(0))
    return lib.diff(cu, prepend=cu.new_zeros(1))


def _check_cu(cu, n_rows, width, name):
    """Host check of cumulative counts against the flat length and the padded width."""
    cu = _host(cu).astype(np.int64)
    n = np.diff(cu, prepend=np.int64(0))
    _first_bad(n < 0, name, "cumulative counts must be >= 0 and non-decreasing")
    _first_bad(n > width, name, f"a request holds more than width = {width} entries")
    total = int(cu[-1]) if cu.size else 0
    if total != n_rows:
        raise ValueError(f"{name}: the last cumulative count {total} must equal the number "
                         f"of flat rows {n_rows}")


def pad(values, cu_lengths, width, *, fill=0, check=True):
    """Flat rows to the padded layout: ``out[b, j] = values[cu[b] - n_b + j]`` for
    ``j < n_b``, ``fill`` beyond.

    Parameters
    ----------
    values : array [N, ...] (NumPy or torch, any dtype)
        The rows of every request, request by request (vLLM's flat draft ids, the
        target rows of the draft positions, or all ``n_b + 1`` sampled rows).
    cu_lengths : integer array [B]
        Inclusive cumulative counts (``cumsum(n)``, no leading zero; vLLM's
        ``cu_num_draft_tokens`` / ``cu_num_sampled_tokens``), same kind and device.
    width : int
        The padded width (``k`` for drafts, ``k + 1`` for target rows).
    fill : scalar
        The value of padding entries (never read by ``verify``).
    check : bool
        True: ValueError for counts that decrease, exceed ``width`` or do not add up
        to N (reads ``cu_lengths`` on the host).  False: no check and no
        synchronisation (indices are clamped into ``values``).

    Returns an array ``[B, width, ...]`` of ``values``' dtype, kind and device.
    """
    lib = _lib(values, "values")
    if _int_vector(cu_lengths, "cu_lengths") is not lib:
        raise TypeError("cu_lengths: must be the same kind of array as values")
    width = _width(width, "width")
    if values.ndim < 1:
        raise ValueError("values: expected an array [N, ...], got a scalar")
    n_rows, tail, b = int(values.shape[0]), tuple(values.shape[1:]), int(cu_lengths.shape[0])
    if check:
        _check_cu(cu_lengths, n_rows, width, "cu_lengths")
    n = lengths(cu_lengths)
    cu = _as_int64(cu_lengths, lib)
    if lib is np:
        cols = np.arange(width, dtype=np.int64)
        if n_rows == 0:
            return np.full((b, width) + tail, fill, dtype=values.dtype)
        idx = np.clip((cu - n)[:, None] + cols[None, :], 0, n_rows - 1)
        used = (cols[None, :] < n[:, None]).reshape((b, width) + (1,) * len(tail))
        return np.where(used, values[idx], np.asarray(fill, dtype=values.dtype))
    torch = lib
    cols = torch.arange(width, dtype=torch.int64, device=values.device)
    if n_rows == 0:
        return torch.full((b, width) + tail, fill, dtype=values.dtype, device=values.device)
    idx = ((cu - n)[:, None] + cols[None, :]).clamp(0, n_rows - 1)
    used = (cols[None, :] < n[:, None]).reshape((b, width) + (1,) * len(tail))
    return values[idx].masked_fill(~used, fill)


def pad_target(target, bonus, cu_num_draft_tokens, k, *, fill=0.0, check=True):
    """vLLM's separate target rows to verify's ``target [B, k+1, V]``: request b's
    ``n_b`` draft-position rows ``target[cu[b] - n_b : cu[b]]`` at rows ``0..n_b-1``,
    its bonus row ``bonus[b]`` at row ``n_b`` (the row ``verify`` draws the bonus
    token from), ``fill`` beyond.

    target : float [N, V]; bonus : float [B, V] of the same dtype, kind and device;
    cu_num_draft_tokens : integer [B] (``cumsum(n)``, no leading zero); k : int >= 0
    with ``n_b <= k``.  ``check`` as in ``pad``.  Returns float [B, k+1, V].
    """
    lib = _lib(target, "target")
    if _lib(bonus, "bonus") is not lib:
        raise TypeError("bonus: must be the same kind of array as target")
    k = _width(k, "k")
    if target.ndim != 2 or bonus.ndim != 2:
        raise ValueError(f"target, bonus: expected [N, V] and [B, V], got "
                         f"{tuple(target.shape)} and {tuple(bonus.shape)}")
    b = int(cu_num_draft_tokens.shape[0])
    if tuple(bonus.shape) != (b, int(target.shape[1])):
        raise ValueError(f"bonus: shape {tuple(bonus.shape)} must be (B, V) = "
                         f"({b}, {int(target.shape[1])})")
    if bonus.dtype != target.dtype:
        raise TypeError(f"bonus: dtype {_arrays.dtype_name(bonus)} must be target's "
                        f"{_arrays.dtype_name(target)}")
    out = pad(target, cu_num_draft_tokens, k + 1, fill=fill, check=check)
    n = lengths(cu_num_draft_tokens)
    if lib is np:
        out[np.arange(b), np.clip(n, 0, k)] = bonus
    else:
        rows = lib.arange(b, dtype=lib.int64, device=target.device)
        out[rows, n.clamp(0, k)] = bonus
    return out


def pad_q(q, cu_num_draft_tokens, k, *, check=True):
    """A flat ``Dyadic`` of batch shape ``(N,)`` (the q rows of the drafts, request by
    request) as the ``Dyadic`` of batch shape ``(B, k)`` that ``verify`` takes:
    request b's rows at ``0..n_b-1``; each padding row is the point mass at id 0
    (a valid row, so the result is a valid Dyadic; ``verify`` never reads it).
    Same vocabulary, policy, sparseness, kind and device.  ``check`` as in ``pad``."""
    if not isinstance(q, Dyadic):
        raise TypeError(f"q: expected a dyadic.Dyadic, got {type(q).__name__}")
    if len(q.batch_shape) != 1:
        raise ValueError(f"q: batch shape {q.batch_shape} must be (N,) (flat rows)")
    k = _width(k, "k")
    counts, ids = q.counts, q.ids
    lib = _lib(counts, "q.counts")
    if lib is not np:
        if _int_vector(cu_num_draft_tokens, "cu_num_draft_tokens") is np:
            cu_num_draft_tokens = lib.as_tensor(cu_num_draft_tokens, device=counts.device)
        counts = counts.view(lib.int32)  # the same bits (counts <= 2**24): int32 ops
    pc = pad(counts, cu_num_draft_tokens, k, fill=0, check=check)
    n = lengths(cu_num_draft_tokens)
    if lib is np:
        pad_rows = np.arange(k)[None, :] >= n[:, None]
    else:
        pad_rows = lib.arange(k, device=counts.device)[None, :] >= n[:, None]
    # the point mass at id 0: a dense row (TOTAL, 0, ...), a sparse row ids (0, -1, ...)
    pc[..., 0][pad_rows] = _spec.TOTAL
    pi = None
    if ids is not None:
        pi = pad(ids, cu_num_draft_tokens, k, fill=_spec.PAD_ID, check=check)
        pi[..., 0][pad_rows] = 0
    if lib is np:
        pc = np.ascontiguousarray(pc)
        pi = None if pi is None else np.ascontiguousarray(pi)
    else:
        pc = pc.contiguous().view(lib.uint32)
        pi = None if pi is None else pi.contiguous()
    return trusted_dyadic(pc, pi, q.vocab_size, q.policy)


def unpad(padded, lengths_, *, check=True):
    """The padded layout back to flat rows: ``padded[b, :n_b]`` for every b, request
    by request (e.g. ``unpad(verdict.tokens, verdict.accepted + 1)``: the emitted
    tokens of every request, flat).

    padded : array [B, W, ...]; lengths_ : integer [B] in [0, W] (same kind and
    device).  ``check`` True raises ValueError for a length outside [0, W] (reads the
    lengths on the host); False clamps them.  Returns ``[sum(n), ...]``.
    """
    lib = _lib(padded, "padded")
    if _int_vector(lengths_, "lengths") is not lib:
        raise TypeError("lengths: must be the same kind of array as padded")
    if padded.ndim < 2:
        raise ValueError(f"padded: expected an array [B, W, ...], got shape "
                         f"{tuple(padded.shape)}")
    b, w = int(padded.shape[0]), int(padded.shape[1])
    if int(lengths_.shape[0]) != b:
        raise ValueError(f"lengths: shape {tuple(lengths_.shape)} must be (B,) = ({b},)")
    if check:
        n = _host(lengths_).astype(np.int64)
        _first_bad((n < 0) | (n > w), "lengths", f"a length must be in [0, W] = [0, {w}]")
    if lib is np:
        used = np.arange(w)[None, :] < lengths_[:, None]
    else:
        used = lib.arange(w, device=padded.device)[None, :] < lengths_[:, None]
    return padded[used]


__all__ = ["lengths", "pad", "pad_target", "pad_q", "unpad"]
