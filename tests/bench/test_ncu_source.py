"""tools/ncu_source.py: Nsight Compute's per-source CSV summarised per line, each SASS
instruction counted once."""

import csv
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("ncu_source", ROOT / "tools" / "ncu_source.py")
ncu_source = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ncu_source)

HEADER = ["Line No", "Source", "Address", "Source", "Warp Stall Sampling (All Samples)",
          "Instructions Executed", "stall_barrier", "stall_long_sb",
          "stall_barrier (Not Issued)"]


def _write(path, sections):
    with open(path, "w", newline="") as f:
        w = csv.writer(f, quoting=csv.QUOTE_ALL)
        for name, rows in sections:
            w.writerow(["File Path", "/src/" + name])
            w.writerow(["Function Name", "k"])
            w.writerow(HEADER)
            for r in rows:
                w.writerow(r)


def _line(no, text):
    return [str(no), text, "-", "-", "0", "0", "0", "0", "0"]


def _sass(addr, text, samples, executed, barrier, long_sb):
    return ["", "", hex(addr), text, str(samples), str(executed), str(barrier), str(long_sb),
            "7"]


def test_each_instruction_once_under_its_first_line(tmp_path, capsys):
    p = tmp_path / "src.csv"
    _write(p, [
        ("a.cuh", [_line(10, "x = load();"), _sass(0x100, "LDG R0", 30, 4, 0, 30),
                   _sass(0x110, "SHF R1", 10, 4, 0, 10),
                   _line(11, "bar();"), _sass(0x120, "BAR", 50, 1, 50, 0),
                   _sass(0x110, "SHF R1", 10, 4, 0, 10)]),  # inlined: listed twice
        ("b.cuh", [_line(3, "y();"), _sass(0x130, "IADD", 10, 8, 0, 0)]),
    ])
    ins = ncu_source.read(str(p))
    assert [i[-1] for i in ins] == [0x100, 0x110, 0x120, 0x130]
    assert ins[1][0] == ("a.cuh", "10", "x = load();")
    assert ins[2][4] == {"barrier": 50, "long_sb": 0}  # "Not Issued" columns left out
    assert ncu_source.main([str(p), "--lines", "5", "--instructions", "2"]) == 0
    out = capsys.readouterr().out
    assert "4 instructions, 100 stall samples, 17 warp instructions executed" in out
    rows = [r for r in out.splitlines() if r.startswith("| ") and "cuh:" in r]
    # per line: a.cuh:11 50 samples, a.cuh:10 40, b.cuh:3 10; then the top two instructions
    assert rows[0].startswith("| 50.0% | 5.9% | a.cuh:11 | barrier 100%")
    assert rows[1].startswith("| 40.0% | 47.1% | a.cuh:10 | long_sb 100%")
    assert rows[2].startswith("| 10.0% | 47.1% | b.cuh:3 |")
    assert "`BAR`" in rows[3] and "`LDG R0`" in rows[4] and len(rows) == 5


def test_not_a_source_page(tmp_path):
    p = tmp_path / "x.csv"
    p.write_text('"ID","Kernel Name"\n"0","k"\n')
    with pytest.raises(SystemExit, match="not ncu's --page source"):
        ncu_source.read(str(p))
