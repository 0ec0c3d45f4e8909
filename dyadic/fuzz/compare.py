"""Run a case on several backends and compare every output bit for bit."""

import time

import numpy as np

from .case import _NeedsTorch, build


class Outcome:
    """What one backend did with a case: outputs, or the exception it raised."""

    __slots__ = ("outputs", "error", "seconds")

    def __init__(self, outputs=None, error=None, seconds=0.0):
        self.outputs, self.error, self.seconds = outputs, error, seconds

    def __repr__(self):
        if self.error:
            return f"raised {self.error[0]}: {self.error[1]}"
        return "ok"


class Skip(Exception):
    """The case cannot run here (e.g. bfloat16 without torch)."""


def run_one(case, backend):
    t0 = time.perf_counter()
    try:
        out = build(case, backend)()
    except _NeedsTorch as exc:
        raise Skip(str(exc)) from exc
    except Exception as exc:  # noqa: BLE001 - the exception is the outcome
        return Outcome(error=(type(exc).__name__, str(exc)), seconds=time.perf_counter() - t0)
    return Outcome(outputs=out, seconds=time.perf_counter() - t0)


def _diff(name, a, b):
    if a is None or b is None:
        if a is None and b is None:
            return None
        return f"{name}: one is None ({'missing' if a is None else 'present'} vs " \
               f"{'missing' if b is None else 'present'})"
    if a.dtype != b.dtype or a.shape != b.shape:
        return f"{name}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
    ab, bb = np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8)
    if np.array_equal(ab, bb):
        return None
    flat_a, flat_b = a.reshape(-1), b.reshape(-1)
    width = a.dtype.itemsize
    neq = (ab.reshape(-1, width) != bb.reshape(-1, width)).any(axis=1)
    bad = np.flatnonzero(neq)
    i = int(bad[0])
    where = tuple(int(j) for j in np.unravel_index(i, a.shape))
    return f"{name}{list(where)}: {flat_a[i]!r} vs {flat_b[i]!r} ({bad.size} elements differ)"


def differences(ref, other):
    """Human-readable differences between two outcomes ([] when bit-identical)."""
    if ref.error or other.error:
        if ref.error == other.error:
            return []
        return [f"exception: {ref!r} vs {other!r}"]
    out = []
    for name in sorted(set(ref.outputs) | set(other.outputs)):
        d = _diff(name, ref.outputs.get(name), other.outputs.get(name))
        if d:
            out.append(d)
    return out


def check(case, backends):
    """Run ``case`` on every backend; returns (outcomes, {backend: [differences]}).

    The first backend is the oracle (``reference`` when it is in the list).
    """
    outcomes = {b: run_one(case, b) for b in backends}
    oracle = outcomes[backends[0]]
    diffs = {}
    for b in backends[1:]:
        d = differences(oracle, outcomes[b])
        if d:
            diffs[b] = d
    return outcomes, diffs
