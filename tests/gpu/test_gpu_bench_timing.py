"""dyadic.bench.timing.held_event_times on a GPU: the held interval excludes host time."""
import statistics

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)", allow_module_level=True)

from dyadic.bench import timing  # noqa: E402


def test_held_times_measure_the_device_only():
    x = torch.zeros(1, device="cuda")
    replay = timing.capture_graph(lambda: x.add_(1))
    idle = statistics.median(timing.cuda_event_times(replay, 50))
    h = timing.held_event_times(replay, 50)
    assert h["held"], h
    held = statistics.median(h["times"])
    # a one-kernel replay: the held interval cannot include the host's submission
    assert held < idle, (held, idle)
    # and the sleep is not counted: a trivial kernel takes far less than the hold
    assert held * 1e6 < h["hold_us"] / 2, (held, h["hold_us"])
