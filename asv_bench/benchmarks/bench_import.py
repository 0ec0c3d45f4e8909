"""``import dyadic`` in a fresh interpreter (must not import torch, cupy or numba)."""

import importlib.util
import os


def _setup():
    # The subprocess must find the same dyadic as this process (installed, or
    # the source tree given through ASV_PYTHONPATH, which asv does not pass on).
    spec = importlib.util.find_spec("dyadic")
    if spec is None or spec.origin is None:
        raise NotImplementedError("dyadic is not importable")
    root = os.path.dirname(os.path.dirname(spec.origin))
    return f"import sys; sys.path.insert(0, {root!r})"


class Import:
    timeout = 60

    def timeraw_import_dyadic(self):
        return "import dyadic", _setup()

    def timeraw_import_and_list_backends(self):
        return "import dyadic; dyadic.available_backends()", _setup()
