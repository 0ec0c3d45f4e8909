"""The fuzz command: a bounded run, determinism, and an injected mismatch end to end."""

import numpy as np
import pytest

from dyadic import _backend
from dyadic.fuzz import generate
from dyadic.fuzz.cli import main
from dyadic.fuzz.reproducer import load
from dyadic.reference.backend import ReferenceBackend


class FlipBackend(ReferenceBackend):
    """The reference with one bit flipped in the last row's token (draw only)."""

    name = "flip"

    def draw(self, counts, ids, seed, generation, round, position, tokens):
        super().draw(counts, ids, seed, generation, round, position, tokens)
        tokens[-1] ^= 1


@pytest.fixture
def fake_backends(monkeypatch):
    monkeypatch.setitem(_backend._REGISTRY, "flip", ("dyadic.reference.backend",
                                                     "ReferenceBackend", ""))
    monkeypatch.setitem(_backend._LOADED, "flip", FlipBackend())
    monkeypatch.setitem(_backend._REGISTRY, "ghost", ("dyadic._no_such_module", "Ghost",
                                                      "pip install ghost"))


def _same_case(a, b):
    assert (a.primitive, a.params, a.label) == (b.primitive, b.params, b.label)
    assert sorted(a.arrays) == sorted(b.arrays)
    for k in a.arrays:
        x, y = a.arrays[k], b.arrays[k]
        assert x.dtype == y.dtype and x.shape == y.shape
        assert x.tobytes() == y.tobytes()


def test_bounded_fuzz_on_available_backends(tmp_path, capsys):
    rc = main(["--cases", "30", "--seed", "0", "--out", str(tmp_path), "--quiet"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "OK:" in out and "total" in out
    assert not list(tmp_path.iterdir())


def test_same_seed_same_cases():
    for i in range(25):
        _same_case(generate(11, i), generate(11, i))
    sig = [generate(11, i).describe() for i in range(25)]
    assert sig != [generate(12, i).describe() for i in range(25)]
    # every primitive and some invalid cases show up in a modest stream
    cases = [generate(3, i) for i in range(200)]
    assert {c.primitive for c in cases} == {"allocate", "propose", "draw", "verify", "philox"}
    assert any(c.label.startswith("invalid") for c in cases)


def test_primitive_filter():
    assert {generate(1, i, ("verify",)).primitive for i in range(10)} == {"verify"}
    # verify(logits=True) is opt-in: the default stream never draws it
    assert "verify_logits" not in {generate(3, i).primitive for i in range(200)}
    assert {generate(1, i, ("verify_logits",)).primitive for i in range(10)} == {"verify_logits"}
    assert "propose_filtered" not in {generate(3, i).primitive for i in range(200)}
    assert {generate(1, i, ("propose_filtered",)).primitive
            for i in range(10)} == {"propose_filtered"}


def test_bounded_logits_fuzz_cpu_and_reference(tmp_path, capsys):
    """verify(logits=True): cpu == reference on random and adversarial cases (ties, -inf
    masks, f16 / bf16 logits, per-request temperature 0, top_k, top_p, min_p, ragged
    counts; invalid logits and parameters raise the same error)."""
    rc = main(["--primitives", "verify_logits", "--backends", "cpu,reference", "--cases", "80",
               "--seed", "0", "--out", str(tmp_path), "--quiet"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "verify_logits" in out and "OK:" in out


def test_bounded_filtered_propose_fuzz_cpu_and_reference(tmp_path, capsys):
    """propose / allocate with top_p, min_p, per-row top_k: cpu == reference on random and
    adversarial cases (invalid parameters and logits raise the same error)."""
    rc = main(["--primitives", "propose_filtered", "--backends", "cpu,reference", "--cases",
               "80", "--seed", "0", "--out", str(tmp_path), "--quiet"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "propose_filtered" in out and "OK:" in out


def test_injected_mismatch_is_found_shrunk_and_replayable(fake_backends, tmp_path, capsys):
    rc = main(["--backends", "flip", "--cases", "30", "--seed", "4", "--primitives",
               "draw,philox", "--out", str(tmp_path), "--quiet"])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert "MISMATCH" in out and "FAILED" in out
    files = list(tmp_path.glob("*.npz"))
    assert len(files) == 1
    case, meta = load(files[0])
    assert case.primitive == "draw"
    assert case.arrays["q_counts"].shape[0] == 1  # shrunk to one row
    assert meta["backends"] == ["reference", "flip"]
    assert meta["differences"]["flip"] and "tokens" in meta["differences"]["flip"][0]
    assert meta["command"] == f"python -m dyadic.fuzz --replay {files[0]} --backends reference,flip"
    assert meta["command"] in out

    assert main(["--replay", str(files[0]), "--backends", "flip"]) == 1
    assert "MISMATCH reproduced" in capsys.readouterr().out
    assert main(["--replay", str(files[0]), "--backends", "reference"]) == 0


def test_keep_going_writes_one_reproducer_per_failure(fake_backends, tmp_path, capsys):
    rc = main(["--backends", "flip", "--cases", "6", "--seed", "2", "--primitives", "draw",
               "--out", str(tmp_path), "--quiet", "--keep-going", "--max-shrink", "5"])
    capsys.readouterr()
    assert rc == 1
    assert len(list(tmp_path.glob("*.npz"))) >= 2


def test_missing_backend_exit_2_unless_skipped(fake_backends, tmp_path, capsys):
    assert main(["--backends", "ghost", "--cases", "2", "--out", str(tmp_path)]) == 2
    assert "not available" in capsys.readouterr().err
    assert main(["--backends", "ghost", "--cases", "2", "--skip-missing", "--quiet",
                 "--out", str(tmp_path)]) == 0
    assert main(["--backends", "nonsense", "--cases", "1"]) == 2


def test_reproducer_roundtrip_keeps_bits(tmp_path):
    from dyadic.fuzz.reproducer import save

    case = generate(9, 3)
    save(case, str(tmp_path / "c.npz"), ["reference"])
    back, _ = load(str(tmp_path / "c.npz"))
    _same_case(case, back)
    assert np.all([back.arrays[k].flags.c_contiguous for k in back.arrays])
