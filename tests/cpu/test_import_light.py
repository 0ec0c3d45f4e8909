"""`import dyadic` imports no GPU library and creates no CUDA context."""

import subprocess
import sys


def test_import_is_light():
    code = ("import sys, dyadic; "
            "bad = [m for m in ('cupy', 'numba', 'torch', 'numba.cuda') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
