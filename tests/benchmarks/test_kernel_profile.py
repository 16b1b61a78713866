"""The decode profile's critical-path attribution (folio/benchmarks/quantization.py)."""

from types import SimpleNamespace

from torch.autograd import DeviceType

from folio.benchmarks.quantization import exposed_time


def _kernel(start: float, end: float, name: str, device=DeviceType.CUDA) -> SimpleNamespace:
    return SimpleNamespace(device_type=device, time_range=SimpleNamespace(start=start, end=end), name=name)


def test_overlapping_kernels_count_only_what_they_add_to_the_end():
    """Under PDL a kernel's span starts inside the one before it: it counts from that one's end;
    a kernel wholly inside another counts nothing; gaps count for no one; host events are ignored."""
    events = [_kernel(0, 10, "gemv"), _kernel(2, 15, "norm"), _kernel(16, 20, "gemv"), _kernel(17, 19, "rope"),
              _kernel(0, 100, "host", DeviceType.CPU)]
    assert exposed_time(events) == {"gemv": 14.0, "norm": 5.0}


def test_unsorted_input_gives_the_same_attribution():
    events = [_kernel(16, 20, "b"), _kernel(0, 10, "a"), _kernel(5, 12, "b")]
    assert exposed_time(events) == {"a": 10.0, "b": 6.0}
