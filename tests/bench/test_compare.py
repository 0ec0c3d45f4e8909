"""python -m dyadic.bench compare on synthetic result files: ratios, SLOWER marks, medians
across runs, the pairs of runs that agree, missing and error cells."""

import json

import pytest

from dyadic.bench import compare
from dyadic.bench.__main__ import main as bench_main


def _write(tmp_path, name, cells, label):
    rows = [{"label": label, "B": b, "case": c, "graph_dev_us": g, "eager_host_us": h,
             "floor_us": 1.0} for (b, c), (g, h) in cells.items()]
    path = tmp_path / name
    path.write_text(json.dumps(rows))
    return str(path)


def _by_cell(result, metric):
    return {(r["B"], r["case"]): r for r in result if r["metric"] == metric}


def test_ratios_flags_and_medians(tmp_path, capsys):
    old = [_write(tmp_path, f"old{i}.json", {(1, "a"): (g, 20.0), (4, "a"): (50.0, 20.0)}, "old")
           for i, g in enumerate((10.0, 11.0, 30.0))]  # median 11
    new = [_write(tmp_path, f"new{i}.json", {(1, "a"): (g, 20.5), (4, "a"): (40.0, 25.0)}, "new")
           for i, g in enumerate((12.0, 12.1, 1.0))]  # median 12
    files = [f for pair in zip(old, new) for f in pair]
    assert bench_main(["compare", *files, "--tolerance", "0.05"]) == 0
    out = capsys.readouterr().out
    result = compare.compare([compare.load(f) for f in old], [compare.load(f) for f in new], 0.05)
    g, h = _by_cell(result, "graph_dev_us"), _by_cell(result, "eager_host_us")
    assert g[(1, "a")]["ratio"] == pytest.approx(12.0 / 11.0)
    assert g[(1, "a")]["slower"] and not g[(4, "a")]["slower"]
    assert g[(4, "a")]["ratio"] == pytest.approx(0.8)
    assert not h[(1, "a")]["slower"] and h[(4, "a")]["slower"]  # 1.025 within, 1.25 not
    assert {r["metric"] for r in result} == {"graph_dev_us", "eager_host_us"}  # no floor_us
    assert g[(1, "a")]["pairs"] == (2, 3)  # the third pair (30 vs 1.0) is not slower
    assert h[(4, "a")]["pairs"] == (3, 3) and h[(1, "a")]["pairs"] == (0, 3)
    assert "2 cells slower than tolerance (new/old > 1.05; 1 slower in every pair of runs)" in out
    assert out.count("SLOWER |") == 2
    assert "| 1 | a | 11.0 | 12.0 | 1.091 | 2/3 | SLOWER |" in out
    assert "### graph_dev_us" in out and "### eager_host_us" in out


def test_missing_and_error_cells(tmp_path):
    a1 = _write(tmp_path, "a1.json", {(1, "x"): ("error: RuntimeError: boom", 5.0),
                                      (1, "y"): (3.0, 4.0)}, "old")
    b1 = _write(tmp_path, "b1.json", {(1, "x"): (9.0, 5.0), (1, "z"): (1.0, 1.0),
                                      (1, "y"): ("7.0 (not held)", 4.0)}, "new")
    a2 = _write(tmp_path, "a2.json", {(1, "x"): ("error: RuntimeError: boom", 5.0),
                                      (1, "y"): (3.0, 4.0)}, "old")
    b2 = _write(tmp_path, "b2.json", {(1, "x"): (9.0, 5.0), (1, "y"): (100.0, 4.0)}, "new")
    result = compare.compare([compare.load(a1), compare.load(a2)],
                             [compare.load(b1), compare.load(b2)], 0.05)
    g = _by_cell(result, "graph_dev_us")
    assert g[(1, "x")]["ratio"] is None and not g[(1, "x")]["slower"]
    assert g[(1, "x")]["old"].startswith("error: RuntimeError")
    assert g[(1, "z")]["old"] == "missing" and g[(1, "z")]["new"] == "1.0 (1/2)"
    assert g[(1, "y")]["new"] == "100.0 (1/2)"  # the "not held" text does not count
    assert g[(1, "y")]["slower"]
    assert g[(1, "y")]["pairs"] == (1, 1)  # only the second pair has both numbers
    assert g[(1, "x")]["pairs"] == (0, 0) and g[(1, "z")]["pairs"] == (0, 0)


def test_odd_file_count_is_refused(tmp_path):
    a = _write(tmp_path, "a.json", {(1, "x"): (1.0, 1.0)}, "old")
    with pytest.raises(SystemExit):
        compare.parse([a])


def test_kernel_times_are_compared_and_launch_counts_are_not(tmp_path):
    def write(name, us, launches):
        rows = [{"label": name, "B": 1, "case": "a", "graph_dev_us": 10.0,
                 "kernel_us hist": us, "launches hist": launches}]
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(rows))
        return compare.load(str(path))
    result = compare.compare([write("old", 20.0, 1.0)], [write("new", 30.0, 2.0)], 0.05)
    assert {r["metric"] for r in result} == {"graph_dev_us", "kernel_us hist"}
    k = _by_cell(result, "kernel_us hist")[(1, "a")]
    assert k["ratio"] == pytest.approx(1.5) and k["slower"]
