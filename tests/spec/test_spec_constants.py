"""dyadic_core.h's #defines equal dyadic/_spec.py and dyadic/_status.py, and the
generated exp tables (Python and C) equal a fresh run of tools/gen_exp_table.py."""

import importlib.util
import pathlib
import re

from dyadic import _exp_table, _spec, _status

ROOT = pathlib.Path(__file__).resolve().parents[2]
HEADER = ROOT / "backends" / "include" / "dyadic_core.h"
TABLE_H = ROOT / "backends" / "include" / "dyadic_exp_table.h"


def _defines(path):
    out = {}
    for name, value in re.findall(r"^#define\s+(DY_\w+)\s+(.+?)\s*$", path.read_text(), re.M):
        expr = re.sub(r"(\d+)(ULL|ull|u|U)\b", r"\1", value)
        try:
            out[name] = eval(expr, {})  # noqa: S307 - constant integer/float expressions only
        except Exception:  # noqa: BLE001 - function-like or symbolic macros are skipped
            pass
    return out


def test_spec_constants_match_header():
    d = _defines(HEADER)
    for name in ("TOTAL", "TOTAL_BITS", "WEIGHT_BITS", "TARGET_BITS", "TARGET_TOL_BITS",
                 "EXP_CUTOFF", "MAX_VOCAB", "DOMAIN_SHIFT", "MAX_DRAW_INDEX",
                 "DOMAIN_PROPOSAL", "DOMAIN_ACCEPTANCE", "DOMAIN_CORRECTION", "PAD_ID"):
        assert d["DY_" + name] == getattr(_spec, name), name
    assert d["DY_POLICY_STANDARD"] == _spec.POLICY_CODES[_spec.POLICY_STANDARD]
    assert d["DY_POLICY_FLOOR_FIRST"] == _spec.POLICY_CODES[_spec.POLICY_FLOOR_FIRST]


def test_status_codes_match_header():
    d = _defines(HEADER)
    names = [n for n in vars(_status) if n.isupper() and isinstance(getattr(_status, n), int)]
    assert names
    for name in names:
        assert d["DY_ST_" + name] == getattr(_status, name), name
    assert {k for k in d if k.startswith("DY_ST_")} == {"DY_ST_" + n for n in names}


def _gen():
    spec = importlib.util.spec_from_file_location("gen_exp_table", ROOT / "tools" / "gen_exp_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_exp_tables_regenerate_identically():
    gen = _gen()
    rows, l2e = gen.table(), gen.log2e_q63()
    assert l2e == _exp_table.LOG2E_Q63
    assert [list(r) for r in _exp_table.EXP2_NEG_Q62] == rows
    assert (ROOT / "dyadic" / "_exp_table.py").read_text() == gen.python_source(rows, l2e)
    assert TABLE_H.read_text() == gen.c_source(rows, l2e)
    assert _defines(TABLE_H)["DY_LOG2E_Q63"] == l2e


def test_compiled_exp_matches_reference():
    import pytest

    k = pytest.importorskip("dyadic.backends.cpu._kernels")
    from dyadic.reference import fixedpoint

    for f in (0, 1, 255, 256, 0x12345678, 0xFFFFFFFF, 0x80000000, 0xDEADBEEF):
        assert k.exp2_neg_q62(f) == fixedpoint.exp2_neg_q62(f)
    for t in (0.0, 1e-300, 5e-324, 0.5, 1.0, 3.14159, 20.0, 31.999999999, 32.0, 1e300,
              float("inf"), 2.0 ** -33, 23.5):
        assert k.weight_from_gap(t) == fixedpoint.weight_from_gap(t), t
