"""vLLM's rejection-sampler layout in and out, dyadic's exact verification in between.

vLLM (v1) verifies a batch of B requests whose drafts are held flat:

- ``draft_token_ids [N]``: the drafts of request 0, then of request 1, ...
  (``SpecDecodeMetadata.draft_token_ids``), ``N = sum(n_b)``;
- ``num_draft_tokens`` (a list ``[B]``) and ``cu_num_draft_tokens`` (``[B]``,
  ``cumsum(n)``, inclusive, no leading zero: request b's drafts are
  ``[cu[b] - n_b, cu[b])``);
- the target logits of the sampled positions ``[N + B, V]`` (the ``logits``
  ``RejectionSampler.forward`` receives, computed at
  ``SpecDecodeMetadata.logits_indices``): request by request, its ``n_b``
  draft-position rows, then its bonus row (``target_logits_indices`` picks the
  former, ``bonus_logits_indices = cumsum(n + 1) - 1`` the latter);
- the output ``int32 [B, max_spec_len + 1]``: the accepted drafts, the
  recovered (at the first rejection) or bonus token, then -1
  (``PLACEHOLDER_TOKEN_ID``).

``rejection_sample`` takes these arrays, pads them with ``dyadic.ragged`` and
runs one ``dyadic.verify(..., num_drafts=n, logits=True)`` (no Python loop over
requests).  Each request's target rows are processed exactly from its logits
(temperature, min-p, top-k, top-p: docs/semantics.md section 2 "Target logits");
a request with temperature 0 is verified greedily on the argmax of its logits;
the others by the exact rejection rule of section 5 against the ``q`` each draft
was drawn from.  The bonus token is drawn by dyadic from the bonus row (domain
CORRECTION at ``position + n_b``), so vLLM's separately sampled
``bonus_token_ids`` are not an input.

The draft distributions are a ``dyadic.Dyadic`` recorded when the drafts were
drawn (``dyadic.propose``), or None for point-mass drafts (greedy, n-gram,
suffix).  vLLM's float ``draft_probs`` are refused: exactness holds against the
distribution each draft was actually drawn from, and floats rounded into a
``Dyadic`` after the fact are a different distribution, so verification against
them would not preserve the target.

The layout (lengths, their sum, array shapes) is structural and always checked
(ValueError / TypeError naming the argument and the request); ``check`` governs
the data rules exactly as in ``dyadic.verify``.  docs/integrations.md (vLLM) shows
where the call goes in vLLM's sampler.

Where the call runs: where ``target_logits`` is.

- Host arrays (NumPy, torch CPU tensors): backends "cpu", "reference" and
  "numba" ("cuda" takes them too, copying them to the GPU and the output back).
  A CUDA array among the other inputs raises TypeError naming it.
- A torch CUDA tensor: backend "cuda" or "numba".  The flat arrays are padded on
  that device (``dyadic.ragged``, no Python loop) and ``dyadic.verify`` runs its CUDA
  kernels on the caller's current stream; the output is a CUDA tensor on that
  device.  The other inputs may be on that device or on the host: host ones
  (draft ids, ``draft_probs``, sampling parameters, key fields) are copied to it;
  ``bonus_logits`` and ``out`` must be CUDA tensors on it.  A CUDA array on
  another device, or one that is not a torch tensor, raises TypeError naming it
  (the draft counts excepted: they are read on the host wherever they are).

  The draft counts are read on the host: the output width, the padded layout and
  the layout checks depend on them, so a CUDA ``cu_num_draft_tokens`` costs one
  device-to-host copy of B integers (a synchronisation); a ``num_draft_tokens``
  list costs none.  Nothing else is read on the host with ``check=False``: a
  device draft id is never interpreted there, and an id outside [0, V) fails its
  request closed in the kernels (status DRAFT_OUT_OF_RANGE; never clamped; an id
  int32 cannot hold is passed as -1, as the host path does).  ``check=True``
  validates the draft ids and reads the status on a host copy, as
  ``dyadic.verify`` does.

Compatibility guarantee: the output is ``dyadic.verify``'s ``tokens`` on the
padded batch, bit for bit: a pure function of the input bits, the sampling
parameters and each request's key fields, identical on every backend that
implements ``verify(logits=True)`` ("cpu", "reference", "numba" for host arrays;
"cuda" and "numba" for CUDA tensors: the same call with every input copied to the host gives
the same tokens on "cpu"), and independent of the other requests in the batch and
of the request's index.
"""

import sys

import numpy as np

from .. import _arrays, _backend, ragged
from .._api import verify
from .._types import Dyadic, Keys

PLACEHOLDER_TOKEN_ID = -1  # vLLM's filler after a request's last emitted token


def rejection_sample(*, draft_token_ids, target_logits, draft_probs, keys, temperature,
                     num_draft_tokens=None, cu_num_draft_tokens=None, max_spec_len=None,
                     bonus_logits=None, top_k=None, top_p=None, min_p=None,
                     backend="cpu", check=True, out=None):
    """Verify a vLLM-layout batch of ragged drafts; return vLLM's output tokens.

    Parameters (keyword-only)
    ----------
    draft_token_ids : integer [N] (NumPy or torch; CUDA with a CUDA target_logits)
        The flat drafts, request by request (``SpecDecodeMetadata.draft_token_ids``).
    target_logits : float32 / float16 / bfloat16 [N + B, V] (NumPy float32 / float16,
        a torch CPU tensor, or a torch CUDA tensor with backend "cuda")
        The target's logits at the sampled positions, request by request: request
        b's ``n_b`` draft-position rows, then its bonus row (the ``logits`` vLLM
        hands ``RejectionSampler.forward``, after its logits processors: penalties,
        bad words, allowed token ids).  With ``bonus_logits``: only the
        draft-position rows ``[N, V]`` (``logits[target_logits_indices]``).
    draft_probs : dyadic.Dyadic or None
        The q each draft was drawn from, recorded at draft time: batch shape
        ``(N,)`` (flat, one row per draft, request by request) or
        ``(B, max_spec_len)`` (padded; rows beyond a request's drafts are never
        read).  None: point-mass q at each draft (greedy or n-gram drafters).  A
        float array (vLLM's ``draft_probs``) raises TypeError: see the module
        docstring.  Its counts / ids may live on target_logits' CUDA device.
    keys : dyadic.Keys over the B requests
        Per request: seed, generation, round and ``position``, the absolute
        position of its first draft (draft i at ``position + i``, the bonus at
        ``position + n_b``); the same fields the drafts were proposed with.
    temperature : float or float array [B]
        Required (vLLM's ``sampling_metadata.temperature``; 0.0 for an all-greedy
        batch, whose vLLM temperature is None).  0 verifies the request greedily.
    num_draft_tokens : list or integer array [B], optional
        ``n_b`` per request (vLLM's list).
    cu_num_draft_tokens : integer array [B], optional
        ``cumsum(n)`` (vLLM's tensor; a CUDA tensor is copied to the host: the
        counts are read there).  At least one of the two is required; when both
        are given they must agree.
    max_spec_len : int, optional
        The output has ``max_spec_len + 1`` columns; >= every ``n_b``.  Default:
        the width of a padded ``draft_probs``, else ``max(n)`` (vLLM's
        ``SpecDecodeMetadata.max_spec_len``).
    bonus_logits : array [B, V], optional
        The bonus rows apart (``logits[bonus_logits_indices]``), same dtype, kind
        and device as ``target_logits``.
    top_k, top_p, min_p : scalar or array [B], optional
        As in ``dyadic.verify(logits=True)`` (vLLM's ``sampling_metadata.top_k``
        / ``top_p`` map directly: a top_k of V or more and a top_p of 1 are off).
        Arrays (and ``temperature``, the key fields) may be CUDA tensors [B] with a
        CUDA target_logits.
    backend : str
        "cpu", "reference" or "numba" for host arrays; "cuda" or "numba" for CUDA
        tensors (the backends with ``verify(logits=True)`` on those arrays; "cuda" also
        takes host arrays, through copies).
    check : bool
        As in ``dyadic.verify``: True raises ValueError naming the request and the
        rule; False fails a bad request closed (its row all -1, its status in
        ``out["status"]`` when given) and leaves the others unchanged.
    out : dict, optional
        Preallocated ``tokens`` int32 [B, max_spec_len + 1], ``accepted`` int32
        [B], ``status`` int32 [B] (any subset), written as ``dyadic.verify`` writes
        them; CUDA tensors on target_logits' device for a CUDA call.

    Returns
    -------
    int32 [B, max_spec_len + 1], the kind and device of ``target_logits``: request
    b's accepted drafts, then its recovered or bonus token, then -1.

    Placement (module docstring): a CUDA ``target_logits`` runs on its device with
    backend "cuda", host inputs copied there; the draft counts are read on the host
    (one device-to-host copy of B integers for a CUDA ``cu_num_draft_tokens``).

    Examples
    --------
    >>> import numpy as np, dyadic
    >>> from dyadic.integrations.vllm import rejection_sample
    >>> logits = np.full((3, 4), -9.0, np.float32)   # B=2: n = [1, 0]
    >>> logits[[0, 1, 2], [2, 3, 1]] = 9.0           # rows: req 0 draft, req 0 bonus, req 1 bonus
    >>> rejection_sample(draft_token_ids=np.array([2]), num_draft_tokens=[1, 0],
    ...                  target_logits=logits, draft_probs=None,
    ...                  keys=dyadic.Keys(seed=np.array([7, 8]), position=np.array([10, 4])),
    ...                  temperature=0.0).tolist()
    [[2, 3], [1, -1]]
    """
    q = _refuse_float_q(draft_probs)
    dev = _call_device(target_logits, backend)
    ids = _flat_ids(draft_token_ids, dev)
    n = _draft_counts(num_draft_tokens, cu_num_draft_tokens)
    b, n_total = int(n.shape[0]), int(ids.shape[0])
    if int(n.sum()) != n_total:
        raise ValueError(f"draft_token_ids: length {n_total} must equal the total number of "
                         f"drafts sum(num_draft_tokens) = {int(n.sum())}")
    k = _spec_len(max_spec_len, n, q, b)
    if temperature is None:
        raise TypeError("temperature: required, a float or a float array [B] (vLLM's "
                        "sampling_metadata.temperature; 0.0 for an all-greedy batch)")
    _check_placement(dev, q, keys, dict(temperature=temperature, top_k=top_k, top_p=top_p,
                                        min_p=min_p), out)
    if dev is not None:
        ids = _device_ids(ids, dev)
    cu = _Cumulative(np.cumsum(n))
    draft = ragged.pad(ids, cu.like(ids), k, check=False)
    if q is not None and q.batch_shape == (n_total,):
        q = ragged.pad_q(q, cu.like(q.counts), k, check=False)
    target = _padded_target(target_logits, bonus_logits, n, cu, k, n_total)
    verdict = verify(target, draft, q, keys, num_drafts=n, logits=True, temperature=temperature,
                     top_k=top_k, top_p=top_p, min_p=min_p, backend=backend, check=check,
                     out=out)
    return verdict.tokens


def _refuse_float_q(draft_probs):
    """``draft_probs`` as a Dyadic or None; anything else raises TypeError saying why."""
    if draft_probs is None or isinstance(draft_probs, Dyadic):
        return draft_probs
    floating = (isinstance(draft_probs, np.ndarray) and draft_probs.dtype.kind in "fc") or (
        _arrays.is_torch(draft_probs) and (draft_probs.is_floating_point()
                                           or draft_probs.is_complex()))
    if floating:
        raise TypeError(
            "draft_probs: float draft probabilities are refused. Verification is exact only "
            "against the distribution each draft was drawn from; rounding floats into a "
            "dyadic.Dyadic after the fact gives a different q, and verifying against it "
            "does not preserve the target distribution. Record q at draft time (draw the "
            "drafts with dyadic.propose and keep the Dyadic it returns) and pass that "
            "Dyadic here, or None for point-mass (greedy, n-gram) drafts")
    raise TypeError(f"draft_probs: expected a dyadic.Dyadic recorded at draft time "
                    f"(dyadic.propose) or None, got {type(draft_probs).__name__}")


def _call_device(target_logits, backend):
    """The torch device of a CUDA ``target_logits`` (the call runs there), None for host
    arrays.  A CUDA tensor needs a GPU backend; a CUDA array that is not a torch tensor
    is refused (``dyadic.ragged`` pads NumPy arrays and torch tensors)."""
    if not _arrays.is_gpu_array(target_logits):
        return None
    if not _arrays.is_torch(target_logits):
        raise TypeError(f"target_logits: a CUDA {type(target_logits).__name__} is not "
                        f"supported; pass a torch CUDA tensor (backend 'cuda') or a host array")
    if backend not in _backend.GPU_BACKENDS:
        raise TypeError(f"target_logits: a CUDA tensor needs backend 'cuda' or 'numba', got "
                        f"{backend!r} "
                        f"(backends 'cpu', 'reference' and 'numba' take host arrays: NumPy or "
                        f"torch CPU tensors)")
    return target_logits.device


def _check_place(x, name, dev):
    """A host value passes; a CUDA array must be a torch tensor on ``dev`` (TypeError
    naming ``name`` otherwise, and always on a host call: ``dev`` None)."""
    if not _arrays.is_gpu_array(x):
        return
    if dev is None:
        raise TypeError(f"{name}: a CUDA array, but target_logits is on the host; pass every "
                        f"array on the host (backends 'cpu', 'reference', 'numba'), or "
                        f"target_logits as a CUDA tensor with backend 'cuda'")
    if not _arrays.is_torch(x):
        raise TypeError(f"{name}: a CUDA {type(x).__name__} is not supported; pass a torch "
                        f"tensor on {dev} or a host array")
    if x.device != dev:
        raise TypeError(f"{name}: on {x.device}, but target_logits is on {dev}; pass it on "
                        f"{dev} or on the host")


_OUTPUTS = ("accepted", "status", "tokens")


def _check_placement(dev, q, keys, params, out):
    """Every input besides target_logits, bonus_logits, the draft ids and the counts on
    the host or on ``dev`` (see ``_check_place``); on a CUDA call the ``out`` buffers
    are torch tensors on ``dev`` (the kernels write them)."""
    if q is not None:
        _check_place(q.counts, "draft_probs", dev)
        _check_place(q.ids, "draft_probs", dev)
    if isinstance(keys, Keys):
        for field in ("seed", "generation", "round", "position"):
            _check_place(getattr(keys, field), f"keys.{field}", dev)
    for name, value in params.items():
        _check_place(value, name, dev)
    if dev is None or out is None:
        return  # a host call's out= is checked by dyadic.verify
    if not isinstance(out, dict):
        raise TypeError(f"out: expected a dict of preallocated outputs, got "
                        f"{type(out).__name__}")
    unknown = sorted(set(out) - set(_OUTPUTS))
    if unknown:
        raise ValueError(f"out: unknown output(s) {unknown}; this call writes "
                         f"{list(_OUTPUTS)}")
    for name, buf in out.items():
        if buf is not None and not (_arrays.is_torch(buf) and buf.device == dev):
            got = (f"a tensor on {buf.device}" if _arrays.is_torch(buf)
                   else f"a {type(buf).__name__}")
            raise TypeError(f"out[{name!r}]: expected a torch tensor on {dev} "
                            f"(target_logits' device; the kernels write it), got {got}")


def _flat_ids(draft_token_ids, dev):
    """``draft_token_ids`` checked as a 1-D integer NumPy array or torch tensor (CUDA:
    on ``dev`` only; its values are not read here)."""
    if isinstance(draft_token_ids, (list, tuple)):
        raise TypeError("draft_token_ids: expected a NumPy array or a torch tensor [N], "
                        "got a Python sequence")
    if _arrays.is_gpu_array(draft_token_ids):
        _check_place(draft_token_ids, "draft_token_ids", dev)
        x = draft_token_ids
        if x.is_floating_point() or x.is_complex() or _arrays.dtype_name(x) == "bool":
            raise TypeError(f"draft_token_ids: dtype {_arrays.dtype_name(x)} is not an "
                            f"integer dtype")
    else:
        _arrays.int_to_numpy(draft_token_ids, "draft_token_ids")  # dtype and device rules
    if draft_token_ids.ndim != 1:
        raise ValueError(f"draft_token_ids: expected a 1-D array [N], got shape "
                         f"{tuple(draft_token_ids.shape)}")
    return draft_token_ids


_INT32_MAX = 0x7FFFFFFF


def _device_ids(ids, dev):
    """The flat draft ids as an int32 tensor on ``dev``, values unchanged: the kernels
    check them against [0, V) (check=False: DRAFT_OUT_OF_RANGE for the request), so
    nothing is clamped.  An id that int32 cannot hold becomes -1 (out of range too, as
    on the host path), never another id.  Device ids are converted on the device
    (never read on the host); host ids on the host, then copied up."""
    torch = sys.modules["torch"]
    if not _arrays.is_gpu_array(ids):
        host = _arrays.int_to_numpy(ids, "draft_token_ids").astype(np.int64)
        host = np.where((host < 0) | (host > _INT32_MAX), -1, host).astype(np.int32)
        return torch.from_numpy(host).to(dev)
    if ids.dtype == torch.int32:
        return ids
    wide = ids.to(torch.int64)  # uint64 ids above the int64 range wrap negative: -1 below
    return wide.masked_fill((wide < 0) | (wide > _INT32_MAX), -1).to(torch.int32)


def _int_rows(x, name):
    """A list / NumPy array / torch tensor of counts as NumPy int64 [B] (a device tensor
    is copied to the host)."""
    if isinstance(x, (list, tuple)):
        x = np.asarray(x)
        if x.size == 0:
            x = x.astype(np.int64)
    a = _arrays.int_to_numpy(x, name, host_copy=True)
    if a.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D array [B], got shape {a.shape}")
    if a.dtype.kind == "u" and a.size and int(a.max()) > np.iinfo(np.int64).max:
        raise ValueError(f"{name}: value {int(a.max())} does not fit int64")
    return a.astype(np.int64)


def _first_bad(mask, name, rule):
    bad = np.flatnonzero(mask)
    if bad.size:
        raise ValueError(f"{name}: row {int(bad[0])}: {rule}")


def _draft_counts(num_draft_tokens, cu_num_draft_tokens):
    """The per-request draft counts n (NumPy int64 [B]) from either vLLM form."""
    if num_draft_tokens is None and cu_num_draft_tokens is None:
        raise TypeError("num_draft_tokens / cu_num_draft_tokens: give at least one")
    n = None
    if num_draft_tokens is not None:
        n = _int_rows(num_draft_tokens, "num_draft_tokens")
        _first_bad(n < 0, "num_draft_tokens", "a request's number of drafts must be >= 0")
    if cu_num_draft_tokens is not None:
        cu = _int_rows(cu_num_draft_tokens, "cu_num_draft_tokens")
        from_cu = np.diff(cu, prepend=np.int64(0))
        _first_bad(from_cu < 0, "cu_num_draft_tokens",
                   "cumulative counts (cumsum of the draft counts, no leading zero) must be "
                   ">= 0 and non-decreasing")
        if n is not None:
            if n.shape != from_cu.shape:
                raise ValueError(f"cu_num_draft_tokens: shape {from_cu.shape} must match "
                                 f"num_draft_tokens {n.shape}")
            _first_bad(n != from_cu, "cu_num_draft_tokens",
                       "does not match num_draft_tokens (cu[b] must be n[0] + ... + n[b])")
        n = from_cu
    return n


def _spec_len(max_spec_len, n, q, b):
    """The padded draft width k (the output has k + 1 columns)."""
    longest = int(n.max()) if n.size else 0
    padded = q is not None and len(q.batch_shape) == 2
    if max_spec_len is None:
        k = q.batch_shape[1] if padded else longest
    else:
        if isinstance(max_spec_len, (bool, np.bool_)) or not isinstance(
                max_spec_len, (int, np.integer)):
            raise TypeError(f"max_spec_len: expected an int, got "
                            f"{type(max_spec_len).__name__}")
        k = int(max_spec_len)
    where = " (the padded width of draft_probs)" if padded and max_spec_len is None else ""
    _first_bad(n > k, "num_draft_tokens",
               f"a request's number of drafts exceeds max_spec_len = {k}{where}")
    if q is not None:
        flat = (int(n.sum()),)
        if q.batch_shape not in (flat, (b, k)):
            raise ValueError(f"draft_probs: batch shape {q.batch_shape} must be (N,) = {flat} "
                             f"(one row per flat draft) or (B, max_spec_len) = {(b, k)}")
    return k


class _Cumulative:
    """The inclusive cumulative draft counts ``cu`` (NumPy int64 [B]) in the kind and on
    the device of each array they index (what ``dyadic.ragged`` requires), each device
    copy made once per call."""

    def __init__(self, cu):
        self.host, self._on = cu, {}

    def like(self, ref, plus=None):
        """``cu`` (``cu + plus`` with ``plus`` a NumPy int64 [B]) as ``ref``'s kind and
        device."""
        a = self.host if plus is None else self.host + plus
        if not _arrays.is_torch(ref):
            return a
        torch = sys.modules["torch"]
        if ref.device.type == "cpu":
            return torch.from_numpy(a)
        key = (ref.device, plus is None)
        if key not in self._on:
            self._on[key] = torch.from_numpy(a).to(ref.device)
        return self._on[key]


def _padded_target(target_logits, bonus_logits, n, cu, k, n_total):
    """vLLM's target rows as verify's ``[B, k+1, V]`` (request b's bonus row at row n_b)."""
    if not (isinstance(target_logits, np.ndarray) or _arrays.is_torch(target_logits)):
        raise TypeError(f"target_logits: expected a NumPy array or a torch tensor, got "
                        f"{type(target_logits).__name__}")
    if target_logits.ndim != 2:
        raise ValueError(f"target_logits: expected [rows, V], got shape "
                         f"{tuple(target_logits.shape)}")
    b, rows, v = int(n.shape[0]), int(target_logits.shape[0]), int(target_logits.shape[1])
    if bonus_logits is None:
        if rows != n_total + b:
            raise ValueError(
                f"target_logits: {rows} rows, expected N + B = {n_total} + {b} = {n_total + b} "
                f"(each request's draft rows, then its bonus row); pass the bonus rows apart "
                f"as bonus_logits when target_logits holds the {n_total} draft rows only")
        sampled = cu.like(target_logits, plus=np.arange(1, b + 1))  # cumsum(n + 1)
        return ragged.pad(target_logits, sampled, k + 1, check=False)
    if rows != n_total:
        raise ValueError(f"target_logits: {rows} rows, expected N = {n_total} (the draft rows; "
                         f"bonus_logits holds the bonus rows)")
    if type(bonus_logits) is not type(target_logits):
        raise TypeError("bonus_logits: must be the same kind of array as target_logits")
    if _arrays.is_torch(target_logits) and bonus_logits.device != target_logits.device:
        raise TypeError(f"bonus_logits: on {bonus_logits.device}, but target_logits is on "
                        f"{target_logits.device}; both must be on the same device")
    if tuple(bonus_logits.shape) != (b, v):
        raise ValueError(f"bonus_logits: shape {tuple(bonus_logits.shape)} must be (B, V) = "
                         f"({b}, {v})")
    if bonus_logits.dtype != target_logits.dtype:
        raise TypeError(f"bonus_logits: dtype {_arrays.dtype_name(bonus_logits)} must be "
                        f"target_logits' {_arrays.dtype_name(target_logits)}")
    return ragged.pad_target(target_logits, bonus_logits, cu.like(target_logits), k,
                             check=False)


__all__ = ["PLACEHOLDER_TOKEN_ID", "rejection_sample"]
