"""End-to-end: a drafter process and a verifier (this process) on 127.0.0.1.

Transport: each wire frame travels in a 4-byte little-endian length envelope
over TCP.  Models are deterministic toy functions of the prefix (V = 111).

Which streams must be equal (docs/wire.md, "Failure semantics"):
* faults resolved by a retry that reproduces the identical reply (corrupted or
  truncated reply on attempt 0, duplicate/stale frames that are dropped as
  stale) give exactly the fault-free token stream;
* faults that discard the proposal (no retry) make that round target-only
  under a new generation: the stream equals an in-process oracle that makes
  the same rounds target-only, and every fault is counted.
"""

import multiprocessing as mp
import socket
import struct
import time

import numpy as np
import pytest

import dyadic
from dyadic import wire as w

BACKEND = "cpu" if "cpu" in dyadic.available_backends() else "reference"
V, B, DEPTH, TOP_K, ROUNDS = 111, 2, 4, 16, 24
SEEDS = np.array([1234, 98765], dtype=np.uint64)
TIMEOUT = 1.5          # verifier's reply deadline (s)
SLOW = 2.5             # the "slow" fault sleeps past it
_ENV = struct.Struct("<I")


def _logits(prefix, draft=False):
    last, n = (prefix[-1] if prefix else 0), len(prefix)
    v = np.arange(V, dtype=np.float64)
    z = 2.0 * np.sin(0.37 * v * (last + 1) + 0.11 * n) + 0.5 * np.cos(0.05 * v * n)
    if draft:
        z = z + 0.7 * np.cos(0.23 * v + last)
    return z


def target_probs(prefix):
    z = _logits(prefix)
    e = np.exp(z - z.max())
    return (e / e.sum()).astype(np.float32)


def draft_logits(prefix):
    return _logits(prefix, draft=True).astype(np.float32)


def hello(role):
    return w.Hello(role=role, vocab_size=V, dense_width=0, max_slots=4, max_depth=8,
                   max_support=32, max_frame_bytes=1 << 16, q_semantic_id="dyadic24-standard-v1",
                   verifier_id="leviathan-standard-v2", rng_abi="philox4x32-10-dyadic-v1",
                   id_map_hash=b"\x42" * 32, draft_identity="toy-draft", target_identity="toy-tgt")


def propose_chain(prefixes, seeds, generation, rnd, depth, top_k):
    """Per position i: propose from the draft logits given prefix + sampled tokens."""
    chains = [list(p) for p in prefixes]
    anchors = np.array([len(p) for p in prefixes])
    toks, counts, ids = [], [], []
    for i in range(depth):
        lg = np.stack([draft_logits(c) for c in chains])
        keys = dyadic.Keys(seed=seeds, generation=generation, round=rnd, position=anchors + i)
        t, q = dyadic.propose(lg, keys, top_k=top_k, backend=BACKEND)
        for c, tok in zip(chains, t):
            c.append(int(tok))
        toks.append(t)
        counts.append(q.counts)
        ids.append(q.ids)
    return (np.stack(toks, 1), dyadic.Dyadic(np.stack(counts, 1), np.stack(ids, 1),
                                             vocab_size=V))


def verify_round(prefixes, seeds, generation, rnd, draft, q):
    """Returns (accepted, tokens) per slot; draft None = target-only fallback."""
    anchors = np.array([len(p) for p in prefixes])
    keys = dyadic.Keys(seed=seeds, generation=generation, round=rnd, position=anchors)
    if draft is None:
        tgt = np.stack([target_probs(p) for p in prefixes])[:, None, :]
        v = dyadic.verify(tgt, np.zeros((len(prefixes), 0), np.int32), None, keys,
                          backend=BACKEND)
        return [0] * len(prefixes), [[int(v.tokens[b, 0])] for b in range(len(prefixes))]
    k = draft.shape[1]
    tgt = np.stack([np.stack([target_probs(list(p) + list(draft[b, :i])) for i in range(k + 1)])
                    for b, p in enumerate(prefixes)])
    v = dyadic.verify(tgt, draft, q, keys, backend=BACKEND)
    acc = [int(a) for a in v.accepted]
    return acc, [[int(x) for x in v.tokens[b, :acc[b] + 1]] for b in range(len(prefixes))]


def oracle(fallback_rounds, rounds=ROUNDS):
    prefixes = [[], []]
    gen = 0
    for r in range(rounds):
        if r in fallback_rounds:
            gen += 1
            acc, toks = verify_round(prefixes, SEEDS, gen, r, None, None)
        else:
            d, q = propose_chain(prefixes, SEEDS, gen, r, DEPTH, TOP_K)
            acc, toks = verify_round(prefixes, SEEDS, gen, r, d, q)
        for p, t in zip(prefixes, toks):
            p.extend(t)
    return prefixes


# ----------------------------------------------------------------------------- transport

def send(sock, frame):
    sock.sendall(_ENV.pack(len(frame)) + frame)


def _recv_exact(sock, n, deadline):
    buf = bytearray()
    while len(buf) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout("deadline")
        sock.settimeout(left)
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return bytes(buf)


def recv(sock, deadline, max_frame):
    (n,) = _ENV.unpack(_recv_exact(sock, 4, deadline))
    if n > max_frame:
        raise ConnectionError(f"envelope length {n} above the negotiated frame bound")
    return _recv_exact(sock, n, deadline)


# ----------------------------------------------------------------------------- drafter process

def drafter_main(conn_pipe, faults):
    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(30)
    conn_pipe.send(srv.getsockname()[1])
    prefixes = {0: [], 1: []}
    drafts = {}
    sent = {}            # round -> reply frame (for the "stale" fault)

    def propose(step):
        for s in step.slots:
            if w.prefix_digest(prefixes[s.slot]) != s.prefix_digest:
                raise w.IdentityMismatch("step.prefix_digest", f"slot {s.slot} out of sync")
        pre = [prefixes[s.slot] for s in step.slots]
        seeds = np.array([s.seed for s in step.slots], np.uint64)
        toks, q = propose_chain(pre, seeds, step.generation, step.round, step.depth,
                                step.top_k or None)
        drafts[step.round] = toks
        return toks, q

    def on_commit(c):
        for s in c.slots:
            if s.fallback:
                prefixes[s.slot].append(s.token)
            else:
                prefixes[s.slot].extend(int(x) for x in drafts[c.round][s.slot, :s.accepted])
                prefixes[s.slot].append(s.token)

    ds = w.DrafterSession(hello(w.ROLE_DRAFTER), propose, on_commit)
    done = False
    while not done:
        try:
            sock, _ = srv.accept()
        except socket.timeout:
            break
        with sock:
            while True:
                try:
                    frame = recv(sock, time.monotonic() + 30, 1 << 20)
                except (ConnectionError, socket.timeout, OSError):
                    break
                if frame == b"BYE":
                    done = True
                    break
                msg = None
                try:
                    msg = w.decode(frame, limits=ds.limits)
                except w.WireError:
                    pass
                fault = None
                if isinstance(msg, w.Step):
                    fault = faults.get((msg.round, msg.attempt))
                if fault == "disconnect":
                    faults.pop((msg.round, msg.attempt))
                    break
                out = ds.on_frame(frame)
                if len(out) == 2 and fault:
                    rf, cf = out
                    if fault == "corrupt":
                        rf = rf[:80] + bytes([rf[80] ^ 0x5A]) + rf[81:]
                        out = [rf, cf]
                    elif fault == "corrupt_completion":
                        out = [rf, cf[:40] + bytes([cf[40] ^ 1]) + cf[41:]]
                    elif fault == "truncate":
                        out = [rf[:len(rf) // 2], cf]
                    elif fault == "dup_before":
                        out = [rf, rf, cf]
                    elif fault == "dup_after":
                        out = [rf, cf, rf, cf]
                    elif fault == "stale":
                        out = [sent[msg.round - 1], rf, cf]
                    elif fault == "slow":
                        time.sleep(SLOW)
                if len(out) >= 2 and isinstance(msg, w.Step):
                    sent.setdefault(msg.round, out[0] if fault != "stale" else out[1])
                for f in out:
                    send(sock, f)
    conn_pipe.send(({k: list(v) for k, v in prefixes.items()}, dict(ds.counters)))
    srv.close()


# ----------------------------------------------------------------------------- verifier

RETRYABLE = {"checksum-mismatch", "truncated-frame"}


def run_verifier(port, retries):
    vs = w.VerifierSession(hello(w.ROLE_VERIFIER), session=77)
    prefixes = [[], []]
    fallback_rounds = []
    max_frame = 1 << 16

    def connect():
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        send(s, w.encode(vs.local))
        vs.on_hello(w.decode(recv(s, time.monotonic() + 10, max_frame)))
        return s

    sock = connect()
    for r in range(ROUNDS):
        slots = [w.StepSlot(b, len(prefixes[b]), int(SEEDS[b]), w.prefix_digest(prefixes[b]))
                 for b in range(B)]
        send(sock, w.encode(vs.begin_round(slots, depth=DEPTH, top_k=TOP_K)))
        deadline = time.monotonic() + TIMEOUT
        tries = 0
        result = None
        reconnect = False
        while result is None:
            try:
                frame = recv(sock, deadline, max_frame)
            except socket.timeout:
                result = vs.on_timeout()
                break
            except (ConnectionError, OSError) as exc:
                result = vs.on_connection_lost(str(exc))
                reconnect = True
                break
            out = vs.on_frame(frame)
            if isinstance(out, w.Discarded) and out.error.rule in RETRYABLE and tries < retries:
                tries += 1
                send(sock, w.encode(vs.retry()))
                deadline = time.monotonic() + TIMEOUT
                continue
            result = out
        if isinstance(result, w.Proposal):
            assert result.q is not None and result.draft.shape == (B, DEPTH)
            acc, toks = verify_round(prefixes, SEEDS, vs.generation, vs.round, result.draft,
                                     result.q)
            commit = [w.CommitSlot(b, acc[b], toks[b][-1], len(prefixes[b]) + len(toks[b]))
                      for b in range(B)]
        else:
            assert isinstance(result, w.Discarded)
            if reconnect:
                sock.close()
                sock = connect()
            reason = {"reply-timeout": w.RESET_TIMEOUT,
                      "connection-lost": w.RESET_RECONNECT}.get(result.error.rule,
                                                                w.RESET_CORRUPT)
            send(sock, w.encode(vs.reset(reason)))   # synchronized invalidation first
            fallback_rounds.append(r)
            acc, toks = verify_round(prefixes, SEEDS, vs.generation, vs.round, None, None)
            commit = [w.CommitSlot(b, 0, toks[b][0], len(prefixes[b]) + 1, fallback=True)
                      for b in range(B)]
        send(sock, w.encode(vs.commit(commit)))
        for p, t in zip(prefixes, toks):
            p.extend(t)
    # drain late frames (counted as stale) briefly, then stop the drafter
    end = time.monotonic() + 0.2
    while True:
        try:
            vs.on_frame(recv(sock, end, max_frame))
        except (socket.timeout, ConnectionError, OSError):
            break
    send(sock, b"BYE")
    sock.close()
    return prefixes, fallback_rounds, vs.counters


def run(faults, retries):
    ctx = mp.get_context("fork")
    a, b = ctx.Pipe()
    proc = ctx.Process(target=drafter_main, args=(b, faults), daemon=True)
    proc.start()
    try:
        assert a.poll(20), "drafter did not start"
        port = a.recv()
        prefixes, fallback, counters = run_verifier(port, retries)
        assert a.poll(20), "drafter did not finish"
        d_prefixes, d_counters = a.recv()
        proc.join(10)
    finally:
        if proc.is_alive():
            proc.kill()
    # the drafter's committed state never diverges from the verifier's
    assert d_prefixes == {0: prefixes[0], 1: prefixes[1]}
    return prefixes, fallback, counters, d_counters


@pytest.fixture(scope="module")
def clean():
    prefixes, fallback, counters, _ = run({}, retries=1)
    assert fallback == [] and counters["proposal"] == ROUNDS and counters["discarded"] == 0
    assert prefixes == oracle(set())
    return prefixes


def test_retried_faults_give_identical_stream(clean):
    faults = {(3, 0): "corrupt", (6, 0): "truncate", (9, 0): "stale", (12, 0): "dup_after",
              (15, 0): "corrupt_completion"}
    prefixes, fallback, c, dc = run(faults, retries=1)
    assert fallback == []
    assert prefixes == clean
    assert c["checksum-mismatch"] == 2 and c["truncated-frame"] == 1
    assert c["retry"] == 3 and c["discarded"] == 3
    assert c["stale-round"] >= 2 + 3      # stale + dup_after + old-attempt completions
    assert dc["retry-served"] == 3


def test_discarded_faults_fall_back_target_only(clean):
    faults = {(3, 0): "corrupt", (6, 0): "truncate", (9, 0): "dup_before", (12, 0): "slow",
              (15, 0): "disconnect", (18, 0): "corrupt_completion"}
    prefixes, fallback, c, dc = run(faults, retries=0)
    assert fallback == [3, 6, 9, 12, 15, 18]
    assert c["checksum-mismatch"] == 2 and c["truncated-frame"] == 1
    assert c["duplicate-round"] == 1 and c["reply-timeout"] == 1 and c["connection-lost"] == 1
    assert c["discarded"] == 6 and c["reset"] == 6 and c["proposal"] == ROUNDS - 6
    assert c["stale-generation"] >= 1     # the slow round's late reply was dropped
    assert dc["reset"] == 6
    assert prefixes == oracle(set(fallback))
