"""Cross-backend fuzzing: ``python -m dyadic.fuzz --backends cpu,numba,cuda --cases N --seed S``.

Random and adversarial cases for every primitive (``generators``), run on
every chosen backend and ``dyadic.reference`` and compared bit for bit
(``compare``); a mismatch is shrunk (``shrink``) and written as a
self-contained ``.npz`` reproducer with its replay command (``reproducer``).
See docs/development.md ("Fuzzing") for the options and exit codes.
"""

from .case import PRIMITIVES, Case
from .cli import main
from .compare import check
from .generators import generate

__all__ = ["PRIMITIVES", "Case", "check", "generate", "main"]
