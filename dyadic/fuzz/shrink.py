"""Shrink a failing case: fewer rows, smaller depth, smaller vocabulary, while it still fails."""

from dataclasses import replace

from .case import Case

_ROW_ARRAYS = {"x", "temperature", "seed", "generation", "round", "position", "q_counts",
               "q_ids", "target", "draft", "greedy", "counter", "num_drafts"}
_PRIMARY = ("x", "q_counts", "target", "counter")


def _batch(case):
    for name in _PRIMARY:
        if name in case.arrays:
            return case.arrays[name].shape[0]
    return 0


def _is_row_array(name, a, b):
    if a.ndim == 0 or a.shape[0] != b:
        return False
    return name in _ROW_ARRAYS or (name in ("bias", "key") and a.ndim == 2)


def take_rows(case, rows):
    b = _batch(case)
    arrays = {n: (a[rows] if _is_row_array(n, a, b) else a) for n, a in case.arrays.items()}
    return replace(case, arrays=arrays)


def take_vocab(case, cols):
    """allocate / propose: keep the vocabulary columns ``cols`` (a slice)."""
    arrays = dict(case.arrays)
    arrays["x"] = arrays["x"][..., cols]
    if "bias" in arrays:
        arrays["bias"] = arrays["bias"][..., cols]
    return replace(case, arrays=arrays)


def take_depth(case, k):
    """verify: keep the first ``k`` draft positions."""
    arrays = dict(case.arrays)
    arrays["target"] = arrays["target"][:, :k + 1]
    arrays["draft"] = arrays["draft"][:, :k]
    for n in ("q_counts", "q_ids"):
        if n in arrays:
            arrays[n] = arrays[n][:, :k]
    return replace(case, arrays=arrays)


def candidates(case):
    """Smaller variants of ``case``, most aggressive first."""
    b = _batch(case)
    if b > 1:
        h = b // 2
        yield take_rows(case, slice(0, h))
        yield take_rows(case, slice(h, b))
        for r in range(b):
            yield take_rows(case, slice(r, r + 1))
    if case.primitive == "verify":
        k = case.arrays["draft"].shape[1]
        for kk in range(1, k):
            yield take_depth(case, kk)
    if case.primitive in ("allocate", "propose"):
        v = case.arrays["x"].shape[-1]
        if v > 1:
            h = v // 2
            yield take_vocab(case, slice(0, h))
            yield take_vocab(case, slice(h, v))
            yield take_vocab(case, slice(0, v - max(1, v // 8)))
            yield take_vocab(case, slice(max(1, v // 8), v))


def shrink(case: Case, still_fails, budget=200):
    """Greedy shrinking; ``still_fails(case) -> bool``.  Returns (smallest case, tries)."""
    tries = 0
    improved = True
    while improved and tries < budget:
        improved = False
        for cand in candidates(case):
            tries += 1
            if cand.size() < case.size() and still_fails(cand):
                case = cand
                improved = True
                break
            if tries >= budget:
                break
    return case, tries
