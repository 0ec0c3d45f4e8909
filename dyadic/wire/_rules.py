"""Field rules of wire v2: the one set of checks behind every message constructor.

``decode`` parses a frame into raw field values, checks the frame-level rules
(sizes, negotiated limits, row order) and then builds the message through its
public constructor, so a decoded message and a constructed one pass exactly
the same rules and raise the same ``WireError`` subclass for the same value.

Scalars: ``uint``, ``token_id``, ``enum``, ``flag``, ``text``, ``fixed_bytes``,
``fp32_nonneg``; sequences: ``items``, ``slot_ids``.  Arrays: ``int_array``,
``float_array``.
REPLY payload: ``reply_rows`` (representation, entry counts), ``reply_sizes``
(payload lengths, dense widths) and ``reply_q`` (ids, values, masses, sampled
tokens, checksums) in the order of the table in docs/wire.md.
"""

import math
import threading

import numpy as np

from . import _errors as E

U8 = (1 << 8) - 1
U16 = (1 << 16) - 1
U32 = (1 << 32) - 1
U64 = (1 << 64) - 1
I32 = (-(1 << 31), (1 << 31) - 1)
TOTAL = 1 << 24
MAX_VOCAB = 1 << 24
TEXT_BYTES = 32

REPR_NONE, REPR_DENSE, REPR_SPARSE = 0, 1, 2

_FP32_MAX = float(np.finfo(np.float32).max)


# ----------------------------------------------------------------------------- scalars

def uint(name, value, lo, hi):
    """An int (Python or NumPy integer, never bool) in [lo, hi]; returns a Python int.

    Wrong type: ``NonCanonicalEncoding``; out of range: ``LimitExceeded``."""
    if type(value) is int and lo <= value <= hi:
        return value
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise E.NonCanonicalEncoding(name, f"expected an int, got {type(value).__name__}")
    v = int(value)
    if not lo <= v <= hi:
        raise E.LimitExceeded(name, f"value {v} out of range [{lo}, {hi}]")
    return v


def token_id(name, value):
    """A token id: an int in [0, 2**31 - 1] (``OutOfRangeId`` otherwise; the
    vocabulary bound is a negotiated limit)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise E.NonCanonicalEncoding(name, f"expected an int, got {type(value).__name__}")
    v = int(value)
    if not 0 <= v <= I32[1]:
        raise E.OutOfRangeId(name, f"{v} not in [0, {I32[1]}]")
    return v


def enum(name, value, allowed):
    """An int that is one of ``allowed`` (``NonCanonicalEncoding`` otherwise)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
            or int(value) not in allowed:
        raise E.NonCanonicalEncoding(name, f"value {value!r} is not one of {sorted(allowed)}")
    return int(value)


def flag(name, value):
    """A bool (Python or NumPy); ``NonCanonicalEncoding`` otherwise."""
    if not isinstance(value, (bool, np.bool_)):
        raise E.NonCanonicalEncoding(name, f"expected a bool, got {type(value).__name__}")
    return bool(value)


def text(name, value):
    """A text field: 1..32 printable ASCII characters."""
    if not isinstance(value, str):
        raise E.NonCanonicalEncoding(name, f"expected str, got {type(value).__name__}")
    if not 1 <= len(value) <= TEXT_BYTES or not all(0x20 <= ord(c) <= 0x7E for c in value):
        raise E.NonCanonicalEncoding(name, f"text must be 1..{TEXT_BYTES} printable ASCII "
                                           f"characters, got {value!r}")
    return value


def fixed_bytes(name, value, size):
    """Exactly ``size`` bytes (type ``bytes``); ``UnexpectedSize`` otherwise."""
    if not isinstance(value, bytes):
        raise E.UnexpectedSize(name, f"expected {size} bytes, got {type(value).__name__}")
    if len(value) != size:
        raise E.UnexpectedSize(name, f"expected {size} bytes, got {len(value)}")
    return value


def fp32_nonneg(name, value):
    """A finite FP32 value >= 0 with its sign bit clear; returns it as a Python float.

    Accepts int, float and NumPy float16/32/64 or integer scalars whose value
    is *exactly* an FP32 number: 0.1 is refused (its FP32 neighbours differ
    from it), never rounded.  The comparison is in binary64 Python floats, so
    NumPy 2's weak-scalar rules (NEP 50) cannot turn it into an FP32 one.
    Every violation is ``NonCanonicalEncoding`` naming the rule."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(
            value, (int, float, np.integer, np.float16, np.float32, np.float64)):
        raise E.NonCanonicalEncoding(name, f"expected a float, got {type(value).__name__}")
    if isinstance(value, (int, np.integer)):
        v = int(value)
        if abs(v) > _FP32_MAX or float(v) != v:
            raise E.NonCanonicalEncoding(name, f"{v} is not exactly representable in FP32")
        t = float(v)
    else:
        t = float(value)
    if not math.isfinite(t) or math.copysign(1.0, t) < 0:
        raise E.NonCanonicalEncoding(name, f"{t!r} must be finite and >= 0 with its sign "
                                           f"bit clear")
    if t > _FP32_MAX:
        raise E.NonCanonicalEncoding(name, f"{t!r} is above the largest FP32 value")
    near = float(np.float32(t))
    if near != t:
        raise E.NonCanonicalEncoding(name, f"{t!r} is not exactly representable in FP32 "
                                           f"(nearest FP32 value {near!r})")
    return t


def items(name, value, cls, key):
    """A tuple of 1..65535 ``cls`` instances with distinct ``key(item)``.

    Not a sequence of ``cls``: ``NonCanonicalEncoding``; count: ``UnexpectedSize``;
    a repeated key: ``NonCanonicalEncoding``."""
    if not isinstance(value, (tuple, list)):
        raise E.NonCanonicalEncoding(name, f"expected a tuple of {cls.__name__}, got "
                                           f"{type(value).__name__}")
    out = tuple(value)
    if not 1 <= len(out) <= U16:
        raise E.UnexpectedSize(name, f"count {len(out)} not in [1, {U16}]")
    seen = set()
    for i, item in enumerate(out):
        if not isinstance(item, cls):
            raise E.NonCanonicalEncoding(f"{name}[{i}]", f"expected {cls.__name__}, got "
                                                         f"{type(item).__name__}")
        k = key(item)
        if k in seen:
            raise E.NonCanonicalEncoding(f"{name}[{i}]", f"slot {k} listed twice")
        seen.add(k)
    return out


def slot_ids(name, value):
    """A tuple of 1..65535 distinct slot ids (u16 ints) from a tuple, list,
    range or 1-D integer array."""
    if type(value) is tuple and value and all(type(s) is int for s in value) \
            and 0 <= min(value) and max(value) <= U16 and len(set(value)) == len(value):
        return value
    if not isinstance(value, (tuple, list, range, np.ndarray)) or \
            (isinstance(value, np.ndarray) and value.ndim != 1):
        raise E.NonCanonicalEncoding(name, f"expected a sequence of ints, got "
                                           f"{type(value).__name__}")
    out = tuple(uint(f"{name}[{i}]", s, 0, U16) for i, s in enumerate(value))
    if not 1 <= len(out) <= U16:
        raise E.UnexpectedSize(name, f"count {len(out)} not in [1, {U16}]")
    if len(set(out)) != len(out):
        i = next(i for i, s in enumerate(out) if s in out[:i])
        raise E.NonCanonicalEncoding(f"{name}[{i}]", f"slot {out[i]} appears twice")
    return out


# ----------------------------------------------------------------------------- arrays

def _asarray(name, value):
    try:
        return np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise E.NonCanonicalEncoding(name, f"not an array: {exc}") from None


def _readonly(a):
    a.flags.writeable = False
    return a


def int_array(name, value, dtype, exc):
    """A private read-only copy of an integer array as ``dtype`` (exact).

    Any integer dtype (or Python ints) is accepted when every value fits
    ``dtype``; the first value that does not raises ``exc`` naming its index.
    bool, float, complex and other dtypes raise ``NonCanonicalEncoding``.
    An empty array of any numeric dtype becomes an empty ``dtype`` array."""
    a = value if isinstance(value, np.ndarray) else _asarray(name, value)
    if a.dtype == dtype:
        return _readonly(a.copy())
    dtype = np.dtype(dtype)
    if a.size == 0 and a.dtype.kind in "biuf":
        return _readonly(np.zeros(a.shape, dtype=dtype))
    if a.dtype == object:
        return _readonly(_fit_objects(name, a, dtype, exc))
    if a.dtype.kind not in "iu":
        raise E.NonCanonicalEncoding(name, f"dtype {a.dtype}; expected an integer array "
                                           f"({dtype.name})")
    if not np.can_cast(a.dtype, dtype, casting="safe"):
        _check_fits(name, a, dtype, exc)
    return _readonly(np.array(a, dtype=dtype))


def _check_fits(name, a, dtype, exc):
    info = np.iinfo(dtype)
    wide = a.astype(np.int64 if a.dtype.kind == "i" else np.uint64)
    bad = wide > info.max
    if a.dtype.kind == "i":
        bad |= wide < info.min
    if bad.any():
        idx = tuple(int(i) for i in np.unravel_index(int(np.flatnonzero(bad)[0]), a.shape))
        raise exc(name, f"index {idx}: value {int(a[idx])} does not fit {dtype.name}")


def _fit_objects(name, a, dtype, exc):
    """An object array of Python ints (too large for int64, say) as ``dtype``."""
    info = np.iinfo(dtype)
    for idx, v in zip(np.ndindex(a.shape), a.flat):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise E.NonCanonicalEncoding(name, f"index {idx}: expected an int, got "
                                               f"{type(v).__name__}")
        if not info.min <= int(v) <= info.max:
            raise exc(name, f"index {idx}: value {int(v)} does not fit {dtype.name}")
    return np.array(a.tolist(), dtype=dtype).reshape(a.shape)


def float_array(name, value):
    """A private read-only copy of a float16/32/64 array (other dtypes:
    ``NonCanonicalEncoding``).  Values are checked by ``reply_q``."""
    a = _asarray(name, value)
    if a.size == 0 and a.dtype.kind in "biuf":
        return _readonly(np.zeros(a.shape, dtype=np.float32))
    if a.dtype.kind != "f" or a.dtype.itemsize not in (2, 4, 8):
        raise E.NonCanonicalEncoding(name, f"dtype {a.dtype}; expected float32 values "
                                           f"(float16 / float64 holding FP32 values accepted)")
    return _readonly(np.array(a, dtype=a.dtype.newbyteorder("=")))


# ----------------------------------------------------------------------------- REPLY rows

def _only(rep, codes):
    """True when every uint8 representation code is in ``codes`` (bytes)."""
    return not rep.tobytes().translate(None, codes)


def reply_rows(rep, n, name="reply.rows"):
    """Row rules first in decode order: representation 1/2 (0: ``MissingQ``,
    other: ``NonCanonicalEncoding``), then n_entries > 0 (``MissingQ``).
    ``rep`` uint8, ``n`` uint32: 1-D arrays over the rows (slot-major)."""
    if not _only(rep, b"\x01\x02"):
        r = _first((rep != REPR_SPARSE) & (rep != REPR_DENSE))
        if rep[r] == REPR_NONE:
            raise E.MissingQ(f"{name}[{r}].representation", "no q for this position")
        raise E.NonCanonicalEncoding(f"{name}[{r}].representation",
                                     f"unknown representation {int(rep[r])}")
    if not n.all():
        r = _first(n == 0)
        raise E.MissingQ(f"{name}[{r}].n_entries", "zero entries: no q for this position")


def reply_sizes(rep, n, vocab, n_values, n_ids, name="reply.rows"):
    """Dense rows: width >= vocab, the same for every dense row (``UnexpectedSize``);
    payload lengths: ``n_values == sum(n)``, ``n_ids == sum of sparse n``
    (``UnexpectedSize``).  Returns the dense width (0 without dense rows).
    ``rep`` uint8, ``n`` uint32: 1-D arrays over the rows."""
    want_vals = int(n.sum(dtype=np.uint64))
    want_ids, dw = want_vals, 0
    if not _only(rep, b"\x02"):
        dense = rep == REPR_DENSE
        first = _first(dense)
        dw = int(n[first])
        if dw < vocab:
            raise E.UnexpectedSize(f"{name}[{first}].n_entries",
                                   f"dense row has {dw} entries < vocab_size {vocab}")
        bad = dense & (n != dw)
        if bad.any():
            r = _first(bad)
            raise E.UnexpectedSize(f"{name}[{r}].n_entries",
                                   f"dense row has {int(n[r])} entries != {dw} of row {first}")
        want_ids = int(n[~dense].sum(dtype=np.uint64))
    if n_values != want_vals or n_ids != want_ids:
        raise E.UnexpectedSize("reply.total_entries", f"payload has {n_values} values / "
                                                      f"{n_ids} ids; rows say {want_vals} / "
                                                      f"{want_ids}")
    return dw


# ----------------------------------------------------------------------------- REPLY q

class _Layouts:
    """Small per-row-size descriptors of valid replies, bounded in entries and bytes.

    An entry (row starts, row bases ``r << 32``, the expected row-sum bytes,
    the total entry count) is O(rows), never O(entries), holds no buffer or view of any frame, and is
    stored only by ``keep`` after a reply passed every rule: a refused frame
    leaves nothing behind.  Replies of more than MAX_ROWS rows are not cached;
    the oldest entries go first when a bound would be passed."""

    MAX_ENTRIES = 64
    MAX_BYTES = 1 << 20
    MAX_ROWS = 4096

    def __init__(self):
        self._d = {}
        self._bytes = 0
        self._lock = threading.Lock()

    @staticmethod
    def build(n):
        """The descriptor of row sizes n (uint32 [rows], every n >= 1)."""
        starts = np.zeros(n.size, dtype=np.intp)
        np.cumsum(n[:-1], out=starts[1:])
        base = np.arange(n.size, dtype=np.int64) << 32
        total = int(starts[-1]) + int(n[-1])
        return starts, base, np.full(n.size, TOTAL, dtype=np.uint64).tobytes(), total

    def get(self, key):
        return self._d.get(key)

    def keep(self, key, lay):
        """Store ``lay`` (from ``build``) for the row sizes ``key`` (their uint32 bytes)."""
        if len(key) > 4 * self.MAX_ROWS:
            return
        size = len(key) + sum(a.nbytes if isinstance(a, np.ndarray) else len(a)
                              for a in lay[:3])
        with self._lock:
            if key in self._d:
                return
            while self._d and (len(self._d) >= self.MAX_ENTRIES
                               or self._bytes + size > self.MAX_BYTES):
                self._bytes -= self._d.pop(next(iter(self._d)))[1]
            self._d[key] = (lay, size)
            self._bytes += size

    def nbytes(self):
        return self._bytes

    def __len__(self):
        return len(self._d)


LAYOUTS = _Layouts()

_LO, _SPAN = 0x33800000, 0x3F800000 - 0x33800000   # FP32 bits of 2**-24 and of 1.0
_F24 = np.float32(TOTAL)


def sparse_reply_valid(vocab, rep, n, sampled, checksums, values, ids):
    """True when every row is sparse and the whole reply is valid, proved with
    few vectorised operations: every rule of ``reply_rows``, ``reply_sizes``
    and ``reply_q`` holds.  False means "not proven here" (dense rows, float16 /
    float64 values, or a broken rule): the ordered checks then decide.
    Arguments as for ``reply_q`` (1-D over rows / entries, contiguous)."""
    if values.dtype != np.float32 or not _only(rep, b"\x02"):
        return False
    key = n.tobytes()
    hit = LAYOUTS.get(key)
    if hit:
        lay = hit[0]
    elif n.all():
        lay = _Layouts.build(n)
    else:
        return False
    starts, base, sums_ok, total = lay
    if values.size != total or ids.size != total:
        return False
    bits = values.view(np.uint32)
    if int((bits - np.uint32(_LO)).max()) > _SPAN:     # every value in [2**-24, 1]
        return False
    scaled = values * _F24                             # exact (power-of-two scale)
    counts = scaled.astype(np.uint32)
    if counts.astype(np.float32).tobytes() != scaled.tobytes():   # c / 2**24, c integer
        return False
    if np.add.reduceat(counts, starts, dtype=np.uint64).tobytes() != sums_ok:
        return False
    uids = ids.view(np.uint32)
    if int(uids.max()) >= vocab:                       # 0 <= id < vocab
        return False
    # Keys (row << 32) + id: with every id in [0, vocab), they increase strictly
    # over the whole reply exactly when the ids do within each row.
    keyed = np.repeat(base, n) + ids
    if ids.size > 1 and not (keyed[1:] > keyed[:-1]).all():
        return False
    # q(sampled) > 0: (row << 32) + sampled among the keys.  An int32 sampled id can
    # only equal a key of its own row, so a match also proves 0 <= sampled < vocab.
    want = base + sampled
    at = np.searchsorted(keyed, want)
    np.minimum(at, ids.size - 1, out=at)
    if keyed[at].tobytes() != want.tobytes():
        return False
    chk = np.add.reduceat(counts * (uids + uids + np.uint32(1)), starts, dtype=np.uint32)
    if chk.tobytes() != checksums.tobytes():
        return False
    if not hit:
        LAYOUTS.keep(key, lay)
    return True


def _first(mask):
    return int(np.flatnonzero(mask)[0])


def reply_q(where, vocab, rep, n, sampled, checksums, values, ids, dense_width):
    """The q rules of a REPLY, in decode order, after ``reply_rows`` and
    ``reply_sizes``; returns the values as float32.

    where(r) : the text locating row r ("row r (slot s, position i)").
    rep uint8, n uint32, sampled int32, checksums uint32 : 1-D over the rows.
    values float16/32/64 [sum n] ; ids int32 [sum of sparse n].
    Raises the ``WireError`` subclass of the first broken rule (docs/wire.md)."""
    n_rows = n.size
    n64 = n.astype(np.int64)
    sparse = rep == REPR_SPARSE
    starts = np.zeros(n_rows, dtype=np.int64)
    np.cumsum(n64[:-1], out=starts[1:])
    at = lambda j: where(int(np.searchsorted(starts, j, side="right") - 1))  # noqa: E731
    _check_ids(ids, vocab)
    id_flat = _entry_ids(sparse, n64, ids, dense_width)
    _check_order(id_flat, starts, at)
    counts = _counts(values, at)
    zero = counts == 0
    zbad = zero & np.repeat(sparse, n64)
    if zbad.any():
        j = _first(zbad)
        raise E.NonCanonicalSupport("reply.values", f"{at(j)}: sparse entry {j} is zero")
    if dense_width > vocab:
        padbad = (id_flat >= vocab) & ~zero
        if padbad.any():
            j = _first(padbad)
            raise E.PaddedId("reply.values", f"{at(j)}: dense padding beyond vocabulary "
                                             f"{vocab} must be zero")
    sums = np.add.reduceat(counts, starts)
    if (sums != TOTAL).any():
        r = _first(sums != TOTAL)
        raise E.WrongTotalMass(f"reply.rows[{r}].values", f"counts sum to {int(sums[r])} != "
                                                          f"2**24")
    _check_sampled(sampled, vocab, n64, id_flat, zero)
    chk = np.add.reduceat(counts * (2 * id_flat.astype(np.uint64) + 1), starts) & U32
    if (chk != checksums).any():
        r = _first(chk != checksums)
        raise E.ProbabilityChecksumMismatch(f"reply.rows[{r}].checksum",
                                            "probability checksum does not match q")
    return values.astype(np.float32)


def _check_ids(ids, vocab):
    bad = (ids < 0) | (ids >= vocab)
    if bad.any():
        j = _first(bad)
        if ids[j] == -1:
            raise E.PaddedId("reply.ids", f"sparse id {j} is padding (-1): rows list only "
                                          f"their nonzero entries")
        raise E.OutOfRangeId("reply.ids", f"sparse id {j} = {int(ids[j])} not in [0, {vocab})")


def _entry_ids(sparse, n64, ids, dense_width):
    """The id of every entry: sparse rows' ids, dense rows' 0..dense_width-1 (int32)."""
    if sparse.all():
        return ids
    if not sparse.any():
        return np.tile(np.arange(dense_width, dtype=np.int32), n64.size)
    parts, k = [], 0
    for r in range(n64.size):
        if sparse[r]:
            parts.append(ids[k:k + n64[r]])
            k += int(n64[r])
        else:
            parts.append(np.arange(dense_width, dtype=np.int32))
    return np.concatenate(parts)


def _check_order(id_flat, starts, at):
    if id_flat.size <= starts.size:
        return
    d = np.diff(id_flat.astype(np.int64))
    same_row = np.ones(id_flat.size - 1, dtype=bool)
    same_row[starts[1:] - 1] = False
    dup = same_row & (d == 0)
    if dup.any():
        j = _first(dup) + 1
        raise E.DuplicateSparseId("reply.ids", f"{at(j)}: id {int(id_flat[j])} repeated")
    uns = same_row & (d < 0)
    if uns.any():
        j = _first(uns) + 1
        raise E.UnsortedSupport("reply.ids", f"{at(j)}: ids must be strictly ascending")


def _counts(values, at):
    """uint64 counts c of values c / 2**24: finite, sign bit clear, 0 <= c <= 2**24."""
    v = values.astype(np.float64)                      # exact from float16/32/64
    nonfinite = ~np.isfinite(v)
    if nonfinite.any():
        j = _first(nonfinite)
        raise E.NonFiniteValue("reply.values", f"{at(j)}: entry {j} is not finite")
    neg = np.signbit(v)
    if neg.any():
        j = _first(neg)
        raise E.NegativeValue("reply.values", f"{at(j)}: entry {j} has its sign bit set")
    # Range check before scaling and casting: a huge finite value would overflow uint64.
    over = ~(v <= 1.0)
    scaled = np.where(over, 0.0, v) * TOTAL            # exact (power-of-two scale)
    counts = scaled.astype(np.uint64)
    bad = (counts != scaled) | over
    if bad.any():
        j = _first(bad)
        raise E.NonDyadicValue("reply.values", f"{at(j)}: entry {j} {float(v[j])!r} is not "
                                               f"c / 2**24")
    return counts


def _check_sampled(sampled, vocab, n64, id_flat, zero):
    bad = (sampled < 0) | (sampled >= vocab)
    if bad.any():
        r = _first(bad)
        raise E.OutOfRangeId(f"reply.rows[{r}].sampled", f"{int(sampled[r])} not in "
                                                         f"[0, {vocab})")
    n_rows = n64.size
    row_of = np.repeat(np.arange(n_rows, dtype=np.int64), n64)
    key = (row_of << 32) | id_flat.astype(np.int64)
    want = (np.arange(n_rows, dtype=np.int64) << 32) | sampled.astype(np.int64)
    at = np.minimum(np.searchsorted(key, want), id_flat.size - 1)
    miss = (key[at] != want) | zero[at]
    if miss.any():
        r = _first(miss)
        raise E.ZeroQAtProposedToken(f"reply.rows[{r}].sampled",
                                     f"token {int(sampled[r])} has q = 0")
