"""``backend="numba"``: the dyadic kernels in Numba-CUDA (a second, independent
GPU implementation; also runs under the CUDA simulator, NUMBA_ENABLE_CUDASIM=1).

Inputs and outputs are NumPy arrays (copied to the device and back) or device
arrays (anything with ``__cuda_array_interface__``: used in place).  Key fields
are arrays of length B or 1 (length 1 broadcasts: dyadic/_device.py passes
length-1 device keys as they are), of 4- or 8-byte integers, signed or not;
the kernels read them through core.key_words.  Block size
THREADS_PER_BLOCK (None: 256 on a GPU, 32 under the simulator; tests set a
power of two <= 256).  Rows are on the grid's x dimension:
min(B, MAX_BLOCKS) blocks, each walking rows with a stride of the grid (results
do not depend on the block count), so any batch size that fits in memory runs,
and the kernels' scratch has one row per block.  Correctness, not speed, is this backend's job: see
kernels.py for the kernel structure.

The shapes of the arrays are checked here (ValueError on a mismatch: no data is
read, nothing synchronises); every id in the data (draft ids, sparse q ids) is
checked by the kernels themselves, which fail that row closed with a status.
"""

import numpy as np

if not hasattr(np, "row_stack"):  # before numba.cuda is first imported (numpy 2.5)
    np.row_stack = np.vstack

from numba import cuda  # noqa: E402

from . import core, kernels as K, logits as L  # noqa: E402
from ...._backend import Backend  # noqa: E402


def _simulator():
    """True when numba.cuda is the simulator (decided when numba was first imported)."""
    from numba import config
    return bool(getattr(config, "ENABLE_CUDASIM", 0))


def _as_device(a):
    as_cuda_array = getattr(cuda, "as_cuda_array", None)  # the simulator lacks it
    return a if as_cuda_array is None else as_cuda_array(a)


#: Threads per block: None picks 256 on a GPU and 32 under the simulator (which
#: runs one Python thread per CUDA thread); tests set a smaller power of two.
THREADS_PER_BLOCK = None


def _tpb():
    t = THREADS_PER_BLOCK
    if t is None:
        return 32 if _simulator() else 256
    if not 1 <= t <= core.MAX_TPB or t & (t - 1):
        raise ValueError(f"THREADS_PER_BLOCK: expected a power of two <= {core.MAX_TPB}, got {t!r}")
    return t


MAX_BLOCKS = 1024  # enough blocks of 256 threads to fill an H200


def _blocks(rows):
    """The grid size (x dimension) for ``rows`` rows: the kernels stride over rows."""
    return max(1, min(rows, MAX_BLOCKS))


def _shape(a):
    return tuple(int(n) for n in a.shape)


def _dim(a, i):
    """a.shape[i], or -1 where a has no dimension i (the shape check then fails)."""
    sh = _shape(a)
    return sh[i] if i < len(sh) else -1


def _need(ok, what):
    if not ok:
        raise ValueError(f"numba backend: {what}")


def _check_keys(keys, rows):
    for name, a in zip(("seed", "generation", "round", "position"), keys):
        sh = _shape(a)
        _need(len(sh) == 1 and sh[0] in (1, rows),
              f"key field {name}: shape {sh}, expected ({rows},) or (1,)")


def _check_rows(rows, **arrays):
    for name, (a, tail) in arrays.items():
        if a is None:
            continue
        _need(_shape(a) == (rows,) + tail,
              f"{name}: shape {_shape(a)}, expected {(rows,) + tail}")


def _is_device(a):
    return a is not None and hasattr(a, "__cuda_array_interface__")


def _in(a, dtype=None):
    """A device view of an input (device arrays in place, NumPy copied over)."""
    if _is_device(a):
        d = _as_device(a)
        return d.view(dtype) if dtype is not None and d.dtype != dtype else d
    a = np.ascontiguousarray(a)
    if dtype is not None and a.dtype != dtype:
        a = a.view(dtype)
    return cuda.to_device(a)


class _Outs:
    """Device buffers for outputs; NumPy outputs are copied back by ``finish``."""

    def __init__(self):
        self._back = []

    def __call__(self, a):
        if a is None:
            return None
        if _is_device(a):
            return _as_device(a)
        d = cuda.device_array(a.shape, dtype=a.dtype)
        self._back.append((a, d))
        return d

    def finish(self):
        for host, dev in self._back:
            host[...] = dev.copy_to_host()


def _dummy(dtype, ndim):
    return cuda.to_device(np.zeros((1,) * ndim, dtype=dtype))


class NumbaBackend(Backend):
    name = "numba"
    has_logits_verify = True
    has_logits_filters = True
    #: device arrays take the kernel methods below (the default runners)
    device_logits_verify = True
    device_logits_filters = True
    #: launches go through numba's own stream handling and copies: not capturable
    #: in a CUDA graph (the backend's job is correctness, not speed).
    graph_capturable = False

    def usable(self):
        if _simulator():
            return True
        try:
            return bool(cuda.is_available())
        except Exception:  # noqa: BLE001 - no driver means not usable
            return False

    def philox4x32(self, counters, keys, rounds, out):
        n = counters.shape[0]
        _check_rows(n, counters=(counters, (4,)), keys=(keys, (2,)), out=(out, (4,)))
        outs = _Outs()
        d_out = outs(out)
        tpb = 64
        blocks = min(max(1, (n + tpb - 1) // tpb), 1024)
        K.philox_kernel[blocks, tpb](_in(counters), _in(keys), int(rounds), d_out)
        outs.finish()

    def _keys(self, seed, generation, round, position):
        return _in(seed), _in(generation), _in(round), _in(position)

    def _alloc(self, x, bias, temperature, logits, policy, top_k, do_draw, keys, tokens,
               counts, ids, status):
        _need(len(_shape(x)) == 2, f"x: shape {_shape(x)}, expected [B, V]")
        bsz, v = _shape(x)
        width = v if ids is None else _dim(counts, 1)
        _need(width >= 1, f"counts: shape {_shape(counts)}, expected a width >= 1")
        _check_rows(bsz, temperature=(temperature, ()), tokens=(tokens, ()),
                    counts=(counts, (width,)), ids=(ids, (width,)), status=(status, ()))
        if bias is not None:
            _need(_shape(bias) in ((1, v), (bsz, v)),
                  f"bias: shape {_shape(bias)}, expected (1, {v}) or ({bsz}, {v})")
        if keys is not None:
            _check_keys(keys, bsz)
        if logits:
            xf, xb = _in(x), _dummy(np.uint32, 2)
        else:
            xf, xb = _dummy(np.float32, 2), _in(x, np.uint32)
        d_bias = _in(bias) if bias is not None else _dummy(np.float32, 2)
        outs = _Outs()
        d_tokens = outs(tokens) if tokens is not None else _dummy(np.int32, 1)
        d_counts = outs(counts)
        d_ids = outs(ids) if ids is not None else _dummy(np.int32, 2)
        d_status = outs(status)
        if keys is None:
            z64 = _dummy(np.uint64, 1)
            z32 = _dummy(np.uint32, 1)
            keys = (z64, z32, z32, z32)
        blocks = _blocks(bsz)
        scratch = [cuda.device_array((blocks, v), dtype=np.uint64) for _ in range(3)]
        K.alloc_kernel[blocks, _tpb()](
            xf, xb, d_bias, int(bias is not None), _in(temperature), int(bool(logits)),
            int(policy), int(top_k), int(do_draw), *keys, d_tokens, d_counts, d_ids,
            int(ids is not None), d_status, *scratch)
        outs.finish()

    def allocate(self, x, bias, temperature, logits, policy, top_k, counts, ids, status):
        self._alloc(x, bias, temperature, logits, policy, top_k, 0, None, None,
                    counts, ids, status)

    def propose(self, x, bias, temperature, policy, top_k, seed, generation, round, position,
                tokens, counts, ids, status):
        self._alloc(x, bias, temperature, True, policy, top_k, 1,
                    self._keys(seed, generation, round, position), tokens, counts, ids, status)

    def draw(self, counts, ids, seed, generation, round, position, tokens):
        _need(len(_shape(counts)) == 2, f"counts: shape {_shape(counts)}, expected [B, W]")
        bsz, width = _shape(counts)
        _check_rows(bsz, ids=(ids, (width,)), tokens=(tokens, ()))
        _check_keys((seed, generation, round, position), bsz)
        outs = _Outs()
        d_tokens = outs(tokens)
        d_ids = _in(ids) if ids is not None else _dummy(np.int32, 2)
        K.draw_kernel[_blocks(bsz), _tpb()](_in(counts), d_ids, int(ids is not None),
                                            *self._keys(seed, generation, round, position),
                                            d_tokens)
        outs.finish()

    def verify(self, target, draft, q_counts, q_ids, greedy, seed, generation, round,
               position, accepted, tokens, status, num_drafts=None):
        _need(len(_shape(target)) == 3 and _dim(target, 1) >= 1,
              f"target: shape {_shape(target)}, expected [B, k+1, V]")
        bsz, k1, v = _shape(target)
        width = v if q_counts is None or q_ids is None else _dim(q_counts, 2)
        _need(q_ids is None or q_counts is not None, "q_ids without q_counts")
        _check_rows(bsz, draft=(draft, (k1 - 1,)), q_counts=(q_counts, (k1 - 1, width)),
                    q_ids=(q_ids, (k1 - 1, width)), greedy=(greedy, ()),
                    accepted=(accepted, ()), tokens=(tokens, (k1,)), status=(status, ()),
                    num_drafts=(num_drafts, ()))
        _check_keys((seed, generation, round, position), bsz)
        # ragged drafts: int32 [B] (the kernel bounds-checks every count)
        _need(num_drafts is None or str(num_drafts.dtype).endswith("int32"),
              f"num_drafts: dtype {getattr(num_drafts, 'dtype', None)}, expected int32")
        d_nd = _in(num_drafts) if num_drafts is not None else _dummy(np.int32, 1)
        if q_counts is None:
            qmode, d_qc, d_qi = 0, _dummy(np.uint32, 3), _dummy(np.int32, 3)
        elif q_ids is None:
            qmode, d_qc, d_qi = 1, _in(q_counts), _dummy(np.int32, 3)
        else:
            qmode, d_qc, d_qi = 2, _in(q_counts), _in(q_ids)
        outs = _Outs()
        d_acc, d_tok, d_st = outs(accepted), outs(tokens), outs(status)
        blocks = _blocks(bsz)
        tot = cuda.device_array((blocks, k1), dtype=np.uint64)
        rh = cuda.device_array((blocks, v), dtype=np.uint64)
        rl = cuda.device_array((blocks, v), dtype=np.uint64)
        qd = cuda.device_array((blocks, v if qmode == 2 else 1), dtype=np.uint32)
        K.verify_kernel[blocks, _tpb()](
            _in(target, np.uint32), _in(draft), d_qc, d_qi, qmode, _in(greedy),
            *self._keys(seed, generation, round, position), d_acc, d_tok, d_st, tot, rh, rl, qd,
            d_nd, int(num_drafts is not None))
        outs.finish()

    def verify_logits(self, target, draft, q_counts, q_ids, greedy, temperature, top_k, top_p,
                      min_p, seed, generation, round, position, accepted, tokens, status,
                      num_drafts=None):
        _need(len(_shape(target)) == 3 and _dim(target, 1) >= 1,
              f"target: shape {_shape(target)}, expected [B, k+1, V]")
        bsz, k1, v = _shape(target)
        width = v if q_counts is None or q_ids is None else _dim(q_counts, 2)
        _need(q_ids is None or q_counts is not None, "q_ids without q_counts")
        _check_rows(bsz, draft=(draft, (k1 - 1,)), q_counts=(q_counts, (k1 - 1, width)),
                    q_ids=(q_ids, (k1 - 1, width)), greedy=(greedy, ()),
                    temperature=(temperature, ()), top_k=(top_k, ()), top_p=(top_p, ()),
                    min_p=(min_p, ()), accepted=(accepted, ()), tokens=(tokens, (k1,)),
                    status=(status, ()), num_drafts=(num_drafts, ()))
        _check_keys((seed, generation, round, position), bsz)
        # ragged drafts: int32 [B] (the kernel bounds-checks every count)
        _need(num_drafts is None or str(num_drafts.dtype).endswith("int32"),
              f"num_drafts: dtype {getattr(num_drafts, 'dtype', None)}, expected int32")
        d_nd = _in(num_drafts) if num_drafts is not None else _dummy(np.int32, 1)
        if q_counts is None:
            qmode, d_qc, d_qi = 0, _dummy(np.uint32, 3), _dummy(np.int32, 3)
        elif q_ids is None:
            qmode, d_qc, d_qi = 1, _in(q_counts), _dummy(np.int32, 3)
        else:
            qmode, d_qc, d_qi = 2, _in(q_counts), _in(q_ids)
        outs = _Outs()
        d_acc, d_tok, d_st = outs(accepted), outs(tokens), outs(status)
        slots = max(1, min(bsz, L.MAX_SLOTS))
        scratch = [cuda.device_array((slots, v), dtype=dt)
                   for dt in (np.uint64, np.uint64, np.int32, np.int32)]
        tpb = 32
        L.verify_logits_kernel[(slots + tpb - 1) // tpb, tpb](
            _in(target), _in(draft), d_qc, d_qi, qmode, _in(greedy), _in(temperature),
            _in(top_k), _in(top_p, np.uint32), _in(min_p, np.uint32),
            *self._keys(seed, generation, round, position), d_acc, d_tok, d_st, *scratch,
            d_nd, int(num_drafts is not None))
        outs.finish()

    def _filtered(self, x, bias, temperature, top_k, top_p, min_p, policy, width, keys, tokens,
                  counts, ids, status):
        _need(len(_shape(x)) == 2, f"x: shape {_shape(x)}, expected [B, V]")
        bsz, v = _shape(x)
        width = int(width or 0)
        _need(0 <= width <= v, f"width: {width} must be in [0, {v}] (0: dense)")
        _check_rows(bsz, temperature=(temperature, ()), top_k=(top_k, ()), top_p=(top_p, ()),
                    min_p=(min_p, ()), tokens=(tokens, ()), counts=(counts, (width or v,)),
                    ids=(ids, (width,)) if width else (None, ()), status=(status, ()))
        _need((ids is None) == (width == 0), "ids: required exactly for sparse rows")
        if bias is not None:
            _need(_shape(bias) in ((1, v), (bsz, v)),
                  f"bias: shape {_shape(bias)}, expected (1, {v}) or ({bsz}, {v})")
        if keys is not None:
            _check_keys(keys, bsz)
        d_x = _in(x).reshape(bsz, 1, v)
        d_bias = _in(bias) if bias is not None else _dummy(np.float32, 2)
        outs = _Outs()
        d_tokens = outs(tokens) if tokens is not None else _dummy(np.int32, 1)
        d_counts = outs(counts)
        d_ids = outs(ids) if ids is not None else _dummy(np.int32, 2)
        d_status = outs(status)
        if keys is None:
            z64 = _dummy(np.uint64, 1)
            z32 = _dummy(np.uint32, 1)
            keys = (z64, z32, z32, z32)
        else:
            keys = self._keys(*keys)
        slots = max(1, min(bsz, L.MAX_SLOTS))
        scratch = [cuda.device_array((slots, v), dtype=dt)
                   for dt in (np.uint64, np.uint64, np.int32, np.int32)]
        tpb = 32
        L.alloc_filtered_kernel[(slots + tpb - 1) // tpb, tpb](
            d_x, d_bias, int(bias is not None), _in(temperature), _in(top_k),
            _in(top_p, np.uint32), _in(min_p, np.uint32), int(policy), width,
            int(tokens is not None), *keys, d_tokens, d_counts, d_ids, d_status, *scratch)
        outs.finish()

    def allocate_filtered(self, x, bias, temperature, top_k, top_p, min_p, policy, width,
                          counts, ids, status):
        self._filtered(x, bias, temperature, top_k, top_p, min_p, policy, width, None, None,
                       counts, ids, status)

    def propose_filtered(self, x, bias, temperature, top_k, top_p, min_p, policy, width, seed,
                         generation, round, position, tokens, counts, ids, status):
        self._filtered(x, bias, temperature, top_k, top_p, min_p, policy, width,
                       (seed, generation, round, position), tokens, counts, ids, status)
