"""python -m dyadic.bench timeline without a GPU: the instrumented copy of the kernels
(every kernel stamps, the election stamps, the sources untouched), the medians it
prints, the one-call steps of the benchmark's cases, its errors."""

import os
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from dyadic.backends.cuda.cupy import runtime  # noqa: E402
from dyadic.bench import kernel_ab, timeline  # noqa: E402

NEVER = np.iinfo(np.uint64).max


def _read_all(folder):
    return {n: open(os.path.join(folder, n)).read() for n in sorted(os.listdir(folder))}


def test_every_kernel_stamps_and_the_sources_are_untouched(tmp_path):
    before = _read_all(runtime.KERNEL_DIR)
    names = timeline.instrument(runtime.KERNEL_DIR, str(tmp_path / "k"))
    assert _read_all(runtime.KERNEL_DIR) == before
    every = kernel_ab.signatures(runtime.KERNEL_DIR)
    shard_src = open(os.path.join(runtime.KERNEL_DIR, "shard.cu")).read()
    shard = {m.group(1) for m in kernel_ab._KERNEL.finditer(shard_src)}
    assert shard  # shard.cu is a module of its own: its kernels are not timed
    assert sorted(names) == sorted(set(every) - shard)
    assert out_of_module(tmp_path / "k", "shard.cu")
    assert "logits_hist" in names and len(set(names)) == len(names)
    out = _read_all(str(tmp_path / "k"))
    body = "".join(out.values())
    for i, n in enumerate(names):  # once each, in its own kernel's body
        assert body.count(f" DY_TL_BEGIN({i})") == 1
        k = re.search(r"\b%s\s*\(" % n, body).start()
        assert body.index(f" DY_TL_BEGIN({i})") > k
    assert out["kernels.cu"].startswith(f"#define DY_TL_KERNELS {len(names)}\n")
    # the per-block columns the kernels add to are the ones summarise reads
    for name in ("COLS", "BLOCKS", "LIFE", "ARRIVE", "ARRIVED", "TO_MARK", "PASSED"):
        assert f"#define DY_TL_{name} {getattr(timeline, name)}\n" in out["kernels.cu"]
    assert out["kernels.cu"].endswith(before["kernels.cu"])
    common = out["common.cuh"]
    assert "DC_FN bool dc_elect_last_impl(" in common
    assert "DC_FN bool dc_elect_last(" not in common
    assert "#define dc_elect_last(...)" in common
    assert "#ifndef DY_TL_MARK" in common  # the instrumented definition comes first
    assert out["kernels.cu"].index("#define DY_TL_MARK(m)") < \
        out["kernels.cu"].index('#include "common.cuh"')
    assert common.index("#define dc_elect_last(...)") > common.index("dc_elect_last_impl(")


def out_of_module(folder, name):
    """True when ``name`` in ``folder`` was copied but not instrumented."""
    text = (folder / name).read_text()
    return "DY_TL_BEGIN" not in text and 'extern "C"' in text


def _folder(tmp_path, files):
    d = tmp_path / "src"
    d.mkdir()
    for n, t in files.items():
        (d / n).write_text(t)
    return str(d)


KERNEL = ('/* extern "C" __global__ void ghost(int a) { } */\n'
          'extern "C" __global__ void __launch_bounds__(256) one(int a, const int* (b)) {\n'
          '  if (a) return;\n}\n'
          'extern "C" __global__ void two(int a);  /* a declaration */\n')
ELECT = ('template <class C>  /* a comment */\nDC_FN bool dc_elect_last(C* c, C n, int* f) {\n'
         '  return *f;\n}\nDC_FN int after() { return dc_elect_last(0, 0, 0); }\n')


def test_a_small_folder(tmp_path):
    src = _folder(tmp_path, {"kernels.cu": '#include "common.cuh"\n#include "k.cuh"\n',
                             "common.cuh": ELECT, "k.cuh": '#include "k2.cuh"\n' + KERNEL,
                             "k2.cuh": KERNEL.replace("one(", "three("),
                             "other.cu": KERNEL.replace("one(", "four("),
                             "unused.cuh": KERNEL.replace("one(", "five(")})
    assert timeline.module_files(src) == ["common.cuh", "k.cuh", "k2.cuh", "kernels.cu"]
    assert timeline.instrument(src, str(tmp_path / "dst")) == ["one", "three"]
    assert out_of_module(tmp_path / "dst", "other.cu")
    assert out_of_module(tmp_path / "dst", "unused.cuh")
    k = (tmp_path / "dst" / "k.cuh").read_text()
    assert "(int a, const int* (b)) { DY_TL_BEGIN(0)\n  if (a) return;" in k
    assert "ghost(int a) { } */" in k and "two(int a);  /*" in k
    c = (tmp_path / "dst" / "common.cuh").read_text()
    assert c.index("dc_elect_last_impl(C* c") < c.index("#define dc_elect_last(...)") \
        < c.index("DC_FN int after()")


@pytest.mark.parametrize("files, why", [
    ({"common.cuh": ELECT, "k.cuh": KERNEL}, "no kernels.cu"),
    ({"kernels.cu": "", "common.cuh": ELECT}, "no extern"),
    ({"kernels.cu": '#include "common.cuh"\n', "common.cuh": KERNEL},
     "no dc_elect_last definition"),
    ({"kernels.cu": '#include "k.cuh"\n', "common.cuh": "DC_FN bool dc_elect_last(int a) { }",
      "k.cuh": KERNEL}, "does not end"),
    ({"kernels.cu": "", "common.cuh": ELECT, "k.cuh": KERNEL}, "no extern"),
])
def test_folders_it_cannot_instrument(tmp_path, files, why):
    src = _folder(tmp_path, files)
    with pytest.raises(ValueError, match=why):
        timeline.instrument(src, str(tmp_path / "dst"))


def _call(rows, blocks=None):
    """One call's stamps for three kernels, us -> ns; blocks {kernel: {column: value}}
    the per-block sums (times in us, counts as they are)."""
    a = np.zeros((3, timeline.COLS), np.uint64)
    a[:, 0] = NEVER
    for i, r in rows.items():
        a[i, :len(r)] = [int(x * 1000) for x in r]
    for i, cols in (blocks or {}).items():
        for c, v in cols.items():
            a[i, c] = v * 1000 if c in (timeline.LIFE, timeline.ARRIVE) or \
                timeline.TO_MARK <= c < timeline.PASSED else v
    return a


def test_summarise_medians_in_launch_order():
    t = 5_000  # the calls' clocks differ: each is read from its own first start
    calls = [_call({1: (t, t + 10, t + 11, t + 20, 0, t + 15), 0: (t + 25, 0, 0, t + 30)}),
             _call({1: (2 * t, 2 * t + 12, 2 * t + 14, 2 * t + 24, 0, 2 * t + 18),
                    0: (2 * t + 27, 0, 0, 2 * t + 33)}),
             _call({1: (3 * t, 3 * t + 14, 3 * t + 15, 3 * t + 22, 3 * t + 1, 3 * t + 16),
                    0: (3 * t + 26, 0, 0, 3 * t + 36)})]
    rows = timeline.summarise(calls, ["b", "a", "never"])
    assert [r["kernel"] for r in rows] == ["a", "b"]  # "never" ran in no call
    a, b = rows
    assert (a["start"], a["gap"], a["pass"], a["wait"], a["tail"], a["total"]) == \
        (0.0, None, 12.0, 1.0, 9.0, 22.0)
    assert (b["start"], b["gap"], b["pass"], b["wait"], b["tail"], b["total"]) == \
        (26.0, 4.0, None, None, None, 6.0)
    assert a["marks"] == {1: 16.0} and b["marks"] == {}  # mark 0 was missed in two calls
    assert a["block"] == {"life": None, "pass": None, "marks": {}}  # no block sums here
    md = timeline.markdown(rows)
    assert "| `a` | 0.00 | - | 12.00 | 1.00 | 9.00 | 22.00 | 1: 16.00 | - / - |" in md
    assert "| `b` | 26.00 | 4.00 | - | - | - | 6.00 | - | - / - |" in md
    assert timeline.summarise([_call({})], ["x", "y", "z"]) == []


def test_a_blocks_own_times_are_means_over_its_blocks():
    """Each call's sums over blocks become means, then medians over the calls; a mark a
    call's blocks never passed is left out, as is the election of a kernel without."""
    t = 1_000
    L, A, N, M, P = (timeline.LIFE, timeline.ARRIVE, timeline.ARRIVED, timeline.TO_MARK,
                     timeline.PASSED)
    B = timeline.BLOCKS
    calls = [_call({0: (t, t + 9, t + 9, t + 10)},  # 4 blocks living 5 us each on average
                   {0: {B: 4, L: 20, A: 16, N: 4, M: 8, P: 4, M + 2: 3, P + 2: 1}}),
             _call({0: (2 * t, 2 * t + 9, 2 * t + 9, 2 * t + 10)},
                   {0: {B: 2, L: 14, A: 12, N: 2, M: 2, P: 2}}),
             _call({0: (3 * t, 3 * t + 9, 3 * t + 9, 3 * t + 10)},
                   {0: {B: 5, L: 30, A: 20, N: 4, M: 15, P: 5, M + 2: 1, P + 2: 1}})]
    (row,) = timeline.summarise(calls, ["a", "b", "c"])
    # lives 5, 7, 6; elections 4, 6, 5; mark 0: 2, 1, 3; mark 2 missed in call 2
    assert row["block"] == {"life": 6.0, "pass": 5.0, "marks": {0: 2.0}}
    assert "| 6.00 / 5.00, 0: 2.00 |" in timeline.markdown([row])


def test_a_kernel_missing_from_one_call_is_left_out():
    calls = [_call({0: (1, 2, 3, 4), 1: (5, 0, 0, 6)}), _call({0: (1, 2, 3, 4)})]
    assert [r["kernel"] for r in timeline.summarise(calls, ["a", "b", "c"])] == ["a"]


def test_steps_of_the_cases(monkeypatch):
    from dyadic.bench import gpu
    from dyadic.bench.inputs import host_backend
    monkeypatch.setattr(gpu, "L2_BYTES", 1)  # two input sets per cold case
    inp = gpu.Inputs(2, 300, 3, device="cpu", backend=host_backend())
    fn = gpu.verify_cold(inp, "close", False, "lazy", logits=True)()
    steps = timeline.calls_of(fn)
    assert fn.calls == 2 and len(steps) == 2
    alone = [[x.copy() for x in kernel_ab.arrays(s())] for s in steps]  # out= reused
    assert all(alone)
    assert kernel_ab.same_outputs(fn(), steps[1]())  # the invocation ends with set 1
    assert all(np.array_equal(x, y) for x, y in zip(alone[1], kernel_ab.arrays(fn())))
    one = lambda: None  # noqa: E731
    assert timeline.calls_of(one) == [one]
    one.calls = 3  # several calls and no step: not timed
    assert timeline.calls_of(one) is None


def test_without_a_gpu_it_says_why(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    from dyadic.bench.__main__ import main as bench_main
    assert bench_main(["timeline", "--calls", "1"]) == 2
    assert "dyadic.bench timeline: needs a CUDA GPU" in capsys.readouterr().err


def test_cli_arguments():
    with pytest.raises(SystemExit):
        timeline.parse(["--calls", "0"])
    a = timeline.parse(["--batch", "1,8", "--calls", "5", "--cases", "x"])
    assert (a.batch, a.calls, a.cases) == ([1, 8], 5, "x")
    assert timeline.parse([]).cases == "=verify_k5_logits_dense_lazy_close_cold"
