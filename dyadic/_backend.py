"""The backend interface (what every backend implements) and the lazy registry.

A backend receives C-contiguous arrays and preallocated outputs, writes
results and per-row status codes, and never raises for bad data.  The CPU
and reference kernels bounds-check every id they address memory with and
fail a bad row closed (status code, outputs -1 / counts 0) whether or not
the Python layer validated it (docs/semantics.md, section 6); a shape
mismatch is structural and raises ValueError naming the array.
Shapes: B rows, V vocabulary, W sparse width (or V), k draft depth.
Keys arrive as four arrays: from the host path of length B, seed (uint64),
generation, round, position (uint32); from dyadic._device NumPy arrays of that
kind or device arrays as the caller gave them, which the backend checks itself
(integers of 4 or 8 bytes, length B or 1: a length-1 field broadcasts).
"""

import importlib
import sys

import numpy as np


class Backend:
    """Every method and capability a backend provides; subclasses override the kernels.

    Capabilities (class attributes): ``reads_half_precision`` (the GPU path may hand
    float16 / bfloat16 logits as they are instead of widening them to float32),
    ``has_lazy_verify`` (``verify_lazy`` reads only what the decisions need),
    ``has_logits_verify`` (``verify_logits``: verification from target logits and
    per-request sampling parameters), ``has_logits_filters`` (``allocate_filtered``
    / ``propose_filtered``: allocation on the support kept by min-p, top-k and top-p),
    ``device_logits_verify`` (``verify_logits_runner``: verify from logits on device
    arrays, dyadic._device), ``device_logits_filters`` (``alloc_runner(...,
    filtered=True)``: allocate / propose with top_p / min_p / per-row top_k on device
    arrays), ``graph_capturable`` (check=False calls with device
    keys and ``out=`` launch only kernels on the caller's stream: capturable in a
    CUDA graph).  The defaults here are the plain behaviour: a backend
    is a checklist of the kernels below.
    """

    name = "?"
    reads_half_precision = False
    has_lazy_verify = False
    has_logits_verify = False
    has_logits_filters = False
    device_logits_verify = False
    device_logits_filters = False
    graph_capturable = False

    def usable(self):
        """True when the backend can run here (a device is present, the simulator is on)."""
        return True

    def philox4x32(self, counters, keys, rounds, out):
        """counters uint32 [N, 4], keys uint32 [N, 2] -> out uint32 [N, 4]."""
        raise NotImplementedError

    def allocate(self, x, bias, temperature, logits, policy, top_k, counts, ids, status):
        """x float32 [B, V]; bias float32 [1 or B, V] or None; temperature
        float64 [B]; logits bool; policy int (``_spec.POLICY_CODES``); top_k
        int (0 = dense). Writes counts uint32 [B, W], ids int32 [B, W] (sparse
        only, else None) and status int32 [B]."""
        raise NotImplementedError

    def propose(self, x, bias, temperature, policy, top_k, seed, generation, round, position,
                tokens, counts, ids, status):
        """allocate on logits + draw; temperature 0 rows: argmax, point mass,
        no draw. Writes tokens int32 [B], counts, ids, status."""
        raise NotImplementedError

    def allocate_filtered(self, x, bias, temperature, top_k, top_p, min_p, policy, width,
                          counts, ids, status):
        """``allocate`` on logits whose support is the kept set of min-p, top-k and top-p
        (only where ``has_logits_filters``): top_k int64 [B] (0: no top-k filter),
        top_p / min_p float32 [B]; width the sparse width (0: dense, counts [B, V]).
        A row with a parameter out of range fails closed (TOP_K_INVALID,
        TOP_P_INVALID, MIN_P_INVALID)."""
        raise NotImplementedError(f"backend {self.name!r} has no top_p / min_p allocation")

    def propose_filtered(self, x, bias, temperature, top_k, top_p, min_p, policy, width, seed,
                         generation, round, position, tokens, counts, ids, status):
        """``allocate_filtered`` + the draw of ``propose`` (temperature 0 rows: argmax,
        point mass, no draw; their top_k / top_p / min_p are checked, not applied)."""
        raise NotImplementedError(f"backend {self.name!r} has no top_p / min_p proposal")

    def draw(self, counts, ids, seed, generation, round, position, tokens):
        """counts uint32 [B, W], ids int32 [B, W] or None -> tokens int32 [B]."""
        raise NotImplementedError

    def verify(self, target, draft, q_counts, q_ids, greedy, seed, generation, round,
               position, accepted, tokens, status, num_drafts=None):
        """target float32 [B, k+1, V]; draft int32 [B, k]; q_counts uint32
        [B, k, W] or None (point-mass q); q_ids int32 [B, k, W] or None
        (dense); greedy uint8 [B]; num_drafts int32 [B] or None (every request
        has k drafts; else request b verifies draft[b, :n_b], and an n_b outside
        [0, k] fails it closed with NUM_DRAFTS_INVALID). Writes accepted int32
        [B], tokens int32 [B, k+1], status int32 [B]."""
        raise NotImplementedError

    def verify_plain(self, target, draft, q_counts, q_ids, greedy, seed, generation, round,
                     position, accepted, tokens, status, num_drafts=None):
        """``verify`` where no request is greedy (``greedy`` all zero): a backend may
        take a route that never reads the flags.  Same results as ``verify``."""
        self.verify(target, draft, q_counts, q_ids, greedy, seed, generation, round,
                    position, accepted, tokens, status, num_drafts)

    def verify_lazy(self, target, draft, q_counts, q_ids, seed, generation, round, position,
                    accepted, tokens, status, num_drafts=None):
        """``verify`` with ``check="lazy"`` and no greedy request (only where
        ``has_lazy_verify``): reads the target only where the decisions need it."""
        raise NotImplementedError(f"backend {self.name!r} has no lazy verify")

    def verify_logits(self, target, draft, q_counts, q_ids, greedy, temperature, top_k, top_p,
                      min_p, seed, generation, round, position, accepted, tokens, status,
                      num_drafts=None):
        """``verify`` on target logits (only where ``has_logits_verify``): target float32
        logits [B, k+1, V]; temperature float64 [B] (0: greedy request); top_k int64
        [B] (0: off); top_p float32 [B] (1: off); min_p float32 [B] (0: off);
        num_drafts as ``verify``.  Each target row becomes the processed integer
        target of docs/semantics.md ("Target logits"); a request with a parameter
        out of range fails closed with TEMPERATURE_INVALID / TOP_K_INVALID /
        TOP_P_INVALID / MIN_P_INVALID."""
        raise NotImplementedError(f"backend {self.name!r} has no verify from logits")

    # Runners: what dyadic._device's call plans call for device arrays, made once per
    # call configuration (on the call's device).  The defaults call the kernels above,
    # with the key fields through ``device_keys``.
    def alloc_runner(self, batch, v, x_dtype, top_k, policy, logits, propose, filtered=False):
        """``run(x, bias, temperature, keys, tokens, counts, ids, status)`` for allocate
        (``propose`` False: keys and tokens None) or propose calls of this shape (x
        [batch, v] of ``x_dtype``, the torch dtype); ``keys`` the four key arrays.
        ``filtered`` (only where ``device_logits_filters``; logits, ``top_k`` the sparse
        width, 0 for dense counts): ``run`` takes three more arguments, the rows' top_k
        (int64 [B], or None: ``top_k`` for every row), top_p and min_p (float32 [B]),
        device tensors whose values the kernels check (TOP_K_INVALID, TOP_P_INVALID,
        MIN_P_INVALID).  A backend without kernels for a configuration raises
        BackendUnavailable when the runner is made."""
        if filtered:
            return self._filtered_runner(batch, top_k, policy, propose)
        if propose:
            def run(x, bias, temp, keys, tokens, counts, ids, status):
                self.propose(x, bias, temp, policy, top_k, *device_keys(keys), tokens, counts,
                             ids, status)
        else:
            def run(x, bias, temp, keys, tokens, counts, ids, status):
                self.allocate(x, bias, temp, logits, policy, top_k, counts, ids, status)
        return run

    def _filtered_runner(self, batch, width, policy, propose):
        """The default ``alloc_runner(..., filtered=True)``: ``allocate_filtered`` /
        ``propose_filtered`` on the device arrays (``width`` 0: dense counts), a
        uniform top_k as a host array [B] of ``width``."""
        if not self.has_logits_filters:
            raise NotImplementedError(f"backend {self.name!r} has no top_p / min_p kernels")
        uniform = np.full(batch, width, dtype=np.int64)
        if propose:
            def run(x, bias, temp, keys, tokens, counts, ids, status, ftopk, ftopp, fminp):
                self.propose_filtered(x, bias, temp, uniform if ftopk is None else ftopk,
                                      ftopp, fminp, policy, width, *device_keys(keys), tokens,
                                      counts, ids, status)
        else:
            def run(x, bias, temp, keys, tokens, counts, ids, status, ftopk, ftopp, fminp):
                self.allocate_filtered(x, bias, temp, uniform if ftopk is None else ftopk,
                                       ftopp, fminp, policy, width, counts, ids, status)
        return run

    def draw_runner(self, batch, width):
        """``run(counts, ids, keys, tokens)`` for draw calls of this shape."""
        def run(counts, ids, keys, tokens):
            self.draw(counts, ids, *device_keys(keys), tokens)
        return run

    def verify_runner(self, batch, k1, v, width, greedy, lazy, ragged=False):
        """``run(target, draft, q_counts, q_ids, greedy_flags, keys, accepted, tokens,
        status, num_drafts=None)`` for verify calls of this shape: ``greedy`` flags given
        (``verify``), else ``lazy`` and a lazy kernel (``verify_lazy``), else
        ``verify_plain`` (the flags all zero).  ``ragged``: num_drafts (int32 [B]) is
        given to every call of the runner.  ``greedy_flags``: one byte per request, a
        contiguous bool or uint8 tensor [B] (the kernel methods get uint8: ``flag_bytes``)."""
        if greedy:
            method = self.verify
        elif lazy and self.has_lazy_verify:
            def run(t, d, qc, qi, g, keys, a, tk, st, nd=None):
                self.verify_lazy(t, d, qc, qi, *device_keys(keys), a, tk, st, nd)
            return run
        else:
            method = self.verify_plain

        def run(t, d, qc, qi, g, keys, a, tk, st, nd=None):
            method(t, d, qc, qi, flag_bytes(g), *device_keys(keys), a, tk, st, nd)
        return run

    def verify_logits_runner(self, batch, k1, v, width, x_dtype, top_k=True):
        """``run(target, draft, q_counts, q_ids, greedy_flags, params, keys, accepted,
        tokens, status, num_drafts=None)`` for verify(logits=True) calls of this shape on
        device arrays (only where ``device_logits_verify``): target logits [batch, k1, v]
        of ``x_dtype`` (torch float32 / float16 / bfloat16), ``params`` the four
        parameter tensors of ``verify_logits`` (top_p / min_p float32), ``greedy_flags`` as
        ``verify_runner``'s.  ``top_k`` False: the calls give no top_k (every row's top_k
        tensor entry is 0), so a backend may leave out work for top-k cuts."""
        def run(t, d, qc, qi, g, params, keys, a, tk, st, nd=None):
            self.verify_logits(t, d, qc, qi, flag_bytes(g), *params, *device_keys(keys), a, tk,
                               st, nd)
        return run


KEY_FIELDS = ("seed", "generation", "round", "position")
_KEY_DTYPES = frozenset(("int32", "uint32", "int64", "uint64"))


def flag_bytes(g):
    """Greedy flags of a device call (dyadic._device: a contiguous bool or uint8 torch
    tensor [B]) as the uint8 array the kernel methods take: a bool tensor viewed as its
    bytes (no copy)."""
    torch = sys.modules["torch"]  # imported by whoever made the tensor
    return g.view(torch.uint8) if g.dtype == torch.bool else g


def device_keys(keys):
    """The key fields of a device call (dyadic._device) as the kernel methods of the
    default runners take them: NumPy arrays (from ``Keys.broadcast``) as they are; a
    device array must hold integers of 4 or 8 bytes (TypeError naming ``keys.<field>``)
    and is passed 1-D (a view of another shape; the kernel methods check the lengths)."""
    out = []
    for name, a in zip(KEY_FIELDS, keys):
        if not isinstance(a, np.ndarray):
            dtype = str(a.dtype).replace("torch.", "")
            if dtype not in _KEY_DTYPES:
                raise TypeError(f"keys.{name}: dtype {dtype} is not supported; device key "
                                f"arrays need 4- or 8-byte integers")
            if len(a.shape) != 1:
                a = a.reshape(-1)
        out.append(a)
    return out


#: Backends that run on a CUDA device (and take dyadic/_device.py for device arrays).
GPU_BACKENDS = ("cuda", "numba")

_REGISTRY = {
    "cpu": ("dyadic.backends.cpu.backend", "CpuBackend",
            "the compiled CPU extension is missing: reinstall dyadic (pip install .)"),
    "reference": ("dyadic.reference.backend", "ReferenceBackend", ""),
    "cuda": ("dyadic.backends.cuda.cupy", "CupyBackend",
             "backend 'cuda' needs CuPy and an NVIDIA GPU: pip install cupy-cuda12x (or 13x)"),
    "numba": ("dyadic.backends.cuda.numba.backend", "NumbaBackend",
              "backend 'numba' needs numba and numba-cuda, and an NVIDIA GPU or "
              "NUMBA_ENABLE_CUDASIM=1: pip install numba numba-cuda"),
}
_LOADED = {}


def names():
    return tuple(_REGISTRY)


class BackendUnavailable(RuntimeError):
    """A backend that cannot load or run here; the message says what to install."""


def get(name):
    """The backend object for ``name``, imported and checked on first use.

    Raises ValueError for an unknown name and ``BackendUnavailable`` (a
    RuntimeError) naming what to install when the backend cannot load or has
    no device to run on.
    """
    if isinstance(name, str) and name in _LOADED:
        return _LOADED[name]
    if not isinstance(name, str) or name not in _REGISTRY:
        raise ValueError(f"backend: unknown backend {name!r}; expected one of {sorted(_REGISTRY)}")
    module, cls, hint = _REGISTRY[name]
    try:
        obj = getattr(importlib.import_module(module), cls)()
        usable = obj.usable()
    except Exception as exc:  # noqa: BLE001 - any load failure (import, driver) is reported
        raise BackendUnavailable(f"backend {name!r} cannot load: {hint} "
                                 f"({type(exc).__name__}: {exc})") from exc
    if not usable:
        raise BackendUnavailable(f"backend {name!r} cannot run here: {hint} (no usable device)")
    _LOADED[name] = obj
    return obj


def available():
    """Names of the backends that load and can run on this machine."""
    out = []
    for name in _REGISTRY:
        try:
            get(name)
        except BackendUnavailable:
            continue
        out.append(name)
    return out
