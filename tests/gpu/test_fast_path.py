"""The repeat-call fast path of the GPU API (dyadic/_fast.py), without a GPU.

Runs in subprocesses under tools/host_overhead_local.py's fakes (a fake CuPy and
driver: launches are recorded, not run; CPU torch tensors pass as CUDA tensors):

- every traced call (valid and invalid propose / verify / allocate / draw, 166
  cases) made twice gives the same result or error and the same launches both
  times: the second call of a cached configuration takes the fast path;
- with the full path's argument handling replaced by functions that fail, a
  repeated propose / verify (with and without greedy flags) / allocate (top-k and dense) /
  draw still succeeds with the same launches (it never reached them), while a call the
  fast path does not serve (host keys, a non-contiguous input, a new temperature, top_k
  or policy, check=True, greedy flags that are not a bool tensor of shape (B,), a cleared
  backend plan) reaches them;
- entries are made while the call's device context is entered (the backend's
  plans are per device).
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "tools", "host_overhead_local.py")

pytest.importorskip("torch")


def _run(args, **kw):
    return subprocess.run([sys.executable] + args, cwd=ROOT, capture_output=True, text=True,
                          timeout=600, **kw)


def test_second_call_same_launches_and_results():
    r = _run([TOOL, "--child", "--root", ROOT, "--trace"])
    assert r.returncode == 0, r.stderr[-3000:]
    t = json.loads(r.stdout)
    names = sorted({k.rsplit(" #", 1)[0] for k in t})
    assert len(names) > 100
    differ = [n for n in names if t[n + " #0"] != t[n + " #1"]]
    assert not differ, differ


_SCRIPT = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, "tools")
    import host_overhead_local as h
    trace = []
    import os
    dyadic, torch = h.install(os.getcwd(), trace)
    from dyadic import _fast, _gpu_arrays
    from dyadic.backends.cuda import cupy_backend as cb
    made = []
    torch.empty = h.recording_empty(torch, made)
    d = h.make_inputs(torch, dyadic, 4)
    kd = d["keys"]
    greedy = torch.tensor([True, False, True, False])

    def calls():
        return {
            "propose": lambda x=d["logits"], keys=kd: dyadic.propose(
                x, keys, top_k=32, temperature=0.7, backend="cuda", check=False),
            "propose_out": lambda: dyadic.propose(
                d["logits"], kd, top_k=32, temperature=0.7, backend="cuda", check=False,
                out=d["pout"]),
            "verify": lambda: dyadic.verify(d["p"], d["draft"], d["qdy"], kd, backend="cuda",
                                            check=False, out=d["vout"]),
            "verify_sparse": lambda: dyadic.verify(d["p"], d["draft"], d["qsp"], kd,
                                                   backend="cuda", check=False),
            "verify_noq": lambda: dyadic.verify(d["p"], d["draft"], None, kd, backend="cuda",
                                                check=False),
            "lazy": lambda: dyadic.verify(d["p"], d["draft"], d["qdy"], kd, backend="cuda",
                                          check="lazy", out=d["vout"]),
            "verify_greedy": lambda: dyadic.verify(d["p"], d["draft"], d["qdy"], kd,
                                                   greedy=greedy, backend="cuda",
                                                   check=False, out=d["vout"]),
            "lazy_greedy": lambda: dyadic.verify(d["p"], d["draft"], d["qsp"], kd,
                                                 greedy=greedy, backend="cuda", check="lazy"),
            "allocate": lambda: dyadic.allocate(d["probs"], top_k=32, backend="cuda",
                                                check=False, out=d["aout"]),
            "allocate_logits": lambda: dyadic.allocate(d["logits"], logits=True, top_k=32,
                                                       temperature=0.7, backend="cuda",
                                                       check=False),
            "allocate_dense": lambda: dyadic.allocate(d["probs"], backend="cuda", check=False),
            "draw": lambda: dyadic.draw(d["q1"], kd, backend="cuda", check=False,
                                        out=d["dout"]),
            "draw_noout": lambda: dyadic.draw(d["q1"], kd, backend="cuda", check=False),
        }

    def launches(fn):
        del trace[:]
        del made[:]
        fn()
        new = {p: "new%d" % j for j, p in enumerate(made)}  # outputs of this call
        return [dict(l, words=[new.get(w, w) for w in l["words"]]) for l in trace]

    out = {}
    first = {name: launches(fn) for name, fn in calls().items()}
    out["entries"] = [len(_fast._PROPOSE), len(_fast._VERIFY), len(_fast._ALLOCATE),
                      len(_fast._DRAW)]

    def boom(*a, **k):
        raise AssertionError("full path")

    _gpu_arrays._x_bias = _gpu_arrays._keys = _gpu_arrays._temperature = boom
    for name, fn in calls().items():
        again = launches(fn)
        out[name] = again == first[name] or [first[name], again]
    # calls the fast path does not serve reach the (now failing) full path
    served = {}
    for label, fn in (
            ("host_keys", lambda: dyadic.propose(d["logits"], dyadic.Keys(seed=1), top_k=32,
                                                 temperature=0.7, backend="cuda", check=False)),
            ("noncontig", lambda: dyadic.propose(
                d["logits"].t().contiguous().t(), kd, top_k=32, temperature=0.7,
                backend="cuda", check=False)),
            ("new_temp", lambda: dyadic.propose(d["logits"], kd, top_k=32, temperature=0.5,
                                                backend="cuda", check=False)),
            ("checked", lambda: dyadic.verify(d["p"], d["draft"], d["qdy"], kd,
                                              backend="cuda", check=True)),
            ("greedy_u8", lambda: dyadic.verify(d["p"], d["draft"], d["qdy"], kd,
                                                greedy=greedy.to(torch.uint8), backend="cuda",
                                                check=False, out=d["vout"])),
            ("greedy_shape", lambda: dyadic.verify(d["p"], d["draft"], d["qdy"], kd,
                                                   greedy=greedy[:3], backend="cuda",
                                                   check=False, out=d["vout"])),
            ("greedy_list", lambda: dyadic.verify(d["p"], d["draft"], d["qdy"], kd,
                                                  greedy=[True] * 4, backend="cuda",
                                                  check=False, out=d["vout"])),
            ("alloc_new_policy", lambda: dyadic.allocate(d["probs"], policy="floor-first",
                                                         backend="cuda", check=False)),
            ("alloc_new_k", lambda: dyadic.allocate(d["probs"], top_k=16, backend="cuda",
                                                    check=False)),
            ("draw_checked", lambda: dyadic.draw(d["q1"], kd, backend="cuda", check=True)),
            ("draw_host_keys", lambda: dyadic.draw(d["q1"], dyadic.Keys(seed=1),
                                                   backend="cuda", check=False)),
            ("plans_cleared", lambda: (cb._PLANS.clear(), calls()["propose"]())),
            ("draw_plans_cleared", lambda: (cb._PLANS.clear(), calls()["draw"]()))):
        try:
            fn()
            served[label] = "fast"
        except AssertionError:
            served[label] = "full"
        except (TypeError, ValueError) as e:  # the full path's own error, before the fakes
            served[label] = type(e).__name__
    out["fallback"] = served
    print(json.dumps(out))
""")


def test_fast_path_taken_and_falls_back():
    r = _run(["-c", _SCRIPT])
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["entries"] == [1, 6, 3, 1]
    for name in ("propose", "propose_out", "verify", "verify_sparse", "verify_noq", "lazy",
                 "verify_greedy", "lazy_greedy", "allocate", "allocate_logits",
                 "allocate_dense", "draw", "draw_noout"):
        assert out[name] is True, (name, out[name])
    assert out["fallback"] == {
        "host_keys": "full", "noncontig": "full", "new_temp": "full", "checked": "full",
        "greedy_u8": "TypeError", "greedy_shape": "ValueError", "greedy_list": "full",
        "alloc_new_policy": "full", "alloc_new_k": "full", "draw_checked": "full",
        "draw_host_keys": "full", "plans_cleared": "full", "draw_plans_cleared": "full"}


_CONTEXT_SCRIPT = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, "tools")
    import host_overhead_local as h
    dyadic, torch = h.install(os.getcwd())
    from dyadic import _gpu_arrays
    from dyadic.backends.cuda import cupy_backend as cb
    d = h.make_inputs(torch, dyadic, 4)
    depth, seen = [0], []
    enter, leave = _gpu_arrays._enter, _gpu_arrays._leave

    def counted_enter(backend, device):  # always hands back a token: _leave then runs
        depth[0] += 1
        return ("token", enter(backend, device))

    def counted_leave(token):
        depth[0] -= 1
        if token[1] is not None:
            leave(token[1])

    _gpu_arrays._enter, _gpu_arrays._leave = counted_enter, counted_leave
    for name in ("propose_launcher", "verify_launcher", "allocate_launcher", "draw_launcher"):
        made = getattr(cb.CupyBackend, name)
        def spy(self, *a, _made=made, _name=name):
            seen.append([_name, depth[0]])
            return _made(self, *a)
        setattr(cb.CupyBackend, name, spy)
    dyadic.propose(d["logits"], d["keys"], top_k=32, temperature=0.7, backend="cuda",
                   check=False)
    dyadic.verify(d["p"], d["draft"], d["qdy"], d["keys"], backend="cuda", check=False)
    dyadic.verify(d["p"], d["draft"], d["qdy"], d["keys"], backend="cuda", check="lazy")
    dyadic.allocate(d["probs"], top_k=32, backend="cuda", check=False)
    dyadic.draw(d["q1"], d["keys"], backend="cuda", check=False)
    print(json.dumps(seen))
""")


def test_entries_made_in_the_device_context():
    """The backend's launchers (per-device plans) are looked up while the call's device
    context is entered, as the full path's launches are."""
    r = _run(["-c", _CONTEXT_SCRIPT])
    assert r.returncode == 0, r.stderr[-3000:]
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert seen == [["propose_launcher", 1], ["verify_launcher", 1], ["verify_launcher", 1],
                    ["allocate_launcher", 1], ["draw_launcher", 1]]


_GREEDY_SCRIPT = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, "tools")
    import host_overhead_local as h
    trace = []
    dyadic, torch = h.install(os.getcwd(), trace)
    d = h.make_inputs(torch, dyadic, 4)
    greedy = torch.tensor([True, False, False, True])
    words = []
    for check in (False, False, "lazy", "lazy"):  # full path, then the fast path
        del trace[:]
        dyadic.verify(d["p"], d["draft"], d["qdy"], d["keys"], greedy=greedy,
                      backend="cuda", check=check, out=d["vout"])
        words.append([[t["kernel"], t["words"][5] if t["kernel"] == "dc_v1" else None]
                      for t in trace])
    print(json.dumps({"words": words, "g": greedy.data_ptr()}))
""")


def test_greedy_flags_reach_the_kernel_as_they_are():
    """A bool greedy tensor's own bytes are dc_v1's greedy argument (no uint8 copy, no
    conversion launch), on the full path and the fast path, with check=False and "lazy"
    (which takes the two launches when greedy flags are given)."""
    r = _run(["-c", _GREEDY_SCRIPT])
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    for launches in out["words"]:
        assert launches == [["dc_v1", out["g"]], ["dc_v2", None]], launches
