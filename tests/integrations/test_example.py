"""examples/speculative_decoding.py runs end to end (on the test suite's model pair,
a short generation) and writes its summary and plot."""

import importlib.util
import json
import pathlib
import sys

import pytest

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "speculative_decoding.py"


def test_example_runs_and_writes_summary(tiny_pair, tmp_path, monkeypatch, capsys):
    spec = importlib.util.spec_from_file_location("speculative_decoding_example", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    monkeypatch.setattr(sys, "argv", ["speculative_decoding.py", "--recipe", "test", "--out",
                                      str(tmp_path), "--max-new-tokens", "12",
                                      "--num-drafts", "3"])
    example.main()
    summary = json.loads((tmp_path / "summary.json").read_text())
    spec_part = summary["speculative"]
    assert len(spec_part["acceptance_by_position"]) == 3
    assert 0 <= spec_part["mean_accepted"] <= 3
    assert len(spec_part["texts"]) == len(example.PROMPTS) == len(spec_part["rounds"])
    assert summary["target_only"]["tokens_per_s"] > 0 and spec_part["tokens_per_s"] > 0
    assert summary["greedy_speculative_equals_target_greedy"] is True
    if summary["plot"] is not None:
        assert (tmp_path / "speculative.png").stat().st_size > 0
    else:
        pytest.importorskip("matplotlib")  # no plot only where matplotlib is missing
    assert "acceptance by draft position" in capsys.readouterr().out
