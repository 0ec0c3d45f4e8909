"""GPU: CUDA-graph replay device time of backend="cuda" propose top-32 bf16 (also with
top_p 0.9 per row, and a dense support with top_p 0.9) and verify k=5
dense (check="lazy" and check=False), and lazy verify with cold inputs (rotated past the L2
cache: "close" p and q, dense and top-32 q, ragged draft counts), V = 129280; the same cold
verify from target logits (bf16, logits=True, device temperature 0.8 and top_p 0.9), with
check="lazy" and check=False.

The cases are dyadic/bench/gpu.py's (its inputs, calls and preallocated outputs).  The
time is the median over 50 replays with the launch queue held while the host enqueues
each one (``dyadic.bench.timing.held_event_times``): the device alone, per dyadic call (a
cold case's replay makes several calls on its rotated input sets).  Skipped where
torch.cuda or the "cuda" backend is unavailable (or "cuda" is not in DYADIC_ASV_BACKENDS).
"""

import statistics

from .common import BACKENDS, QUICK, require_backend

CASES = ["propose_top32_bf16", "propose_top32_bf16_top_p", "propose_dense_bf16_top_p",
         "verify_k5_dense_lazy", "verify_k5_dense",
         "verify_k5_dense_lazy_close_cold", "verify_k5_top32_lazy_close_cold",
         "verify_k5_dense_lazy_close_cold_ragged", "verify_k5_logits_dense_close_cold",
         "verify_k5_logits_dense_lazy_close_cold", "verify_k5_logits_top32_lazy_close_cold",
         "verify_k5_logits_dense_lazy_close_cold_ragged"]
BATCHES = [1] if QUICK else [1, 4, 16, 64]


class GraphReplay:
    params = [CASES, BATCHES]
    param_names = ["case", "batch"]
    timeout = 300

    def setup(self, case, batch):
        if "cuda" not in BACKENDS:
            raise NotImplementedError("backend 'cuda' is not selected (DYADIC_ASV_BACKENDS)")
        require_backend("cuda")  # NotImplementedError without torch.cuda or the backend
        from dyadic.bench import gpu
        from dyadic.bench.timing import capture_graph, held_event_times

        made = {c.name: c for c in gpu.cases(gpu.Inputs(batch))}[case].make()
        self.calls = getattr(made, "calls", 1)
        self.replay = capture_graph(made)
        self.held = held_event_times

    def track_graph_device_seconds(self, case, batch):
        h = self.held(self.replay, 50)
        if not h["held"]:
            raise RuntimeError("the hold ended before the host enqueued the replay")
        return statistics.median(h["times"]) / self.calls

    track_graph_device_seconds.unit = "seconds"
