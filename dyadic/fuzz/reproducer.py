"""Self-contained reproducers: an .npz with every input and the command that replays it."""

import json
import os

import numpy as np

from .case import Case

_META = "__meta__"


def command(path, backends):
    return f"python -m dyadic.fuzz --replay {path} --backends {','.join(backends)}"


def save(case, path, backends, differences=()):
    """Write ``case`` to ``path`` (.npz); returns the replay command."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    cmd = command(path, backends)
    meta = {"primitive": case.primitive, "params": case.params, "label": case.label,
            "seed": case.seed, "index": case.index, "backends": list(backends),
            "differences": {b: list(d) for b, d in dict(differences).items()},
            "command": cmd}
    arrays = {f"a:{k}": np.ascontiguousarray(v) for k, v in case.arrays.items()}
    with open(path, "wb") as f:
        np.savez_compressed(f, **arrays, **{_META: np.array(json.dumps(meta, sort_keys=True))})
    return cmd


def load(path):
    """(case, meta) from a reproducer written by ``save``."""
    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(str(z[_META]))
        arrays = {k[2:]: z[k] for k in z.files if k.startswith("a:")}
    case = Case(meta["primitive"], arrays, meta["params"], meta.get("label", ""),
                meta.get("index", -1), meta.get("seed", 0))
    return case, meta
