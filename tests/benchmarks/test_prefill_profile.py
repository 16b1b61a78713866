"""scripts/prefill_profile.py's timeline: a profiled call's wall time split into lead, busy, gaps
and tail from its device intervals (the real profile runs on the GPU machine)."""

import importlib.util
import pathlib

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "prefill_profile.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("prefill_profile", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def timeline(script):
    return script.timeline


def test_overlapping_kernels_count_once_and_gaps_between_them_are_idle(timeline):
    ms = 1_000_000
    parts = timeline([(0, 1 * ms), (3 * ms, 5 * ms), (4 * ms, 7 * ms), (9 * ms, 10 * ms), (12 * ms, 13 * ms)])
    assert parts == {"lead": 2.0, "busy": 5.0, "gaps": 2.0, "tail": 2.0}
    assert sum(parts.values()) == 11.0  # from the first marker's end to the last's start


def test_unsorted_intervals_and_a_kernel_inside_another(timeline):
    ms = 1_000_000
    parts = timeline([(20 * ms, 21 * ms), (2 * ms, 10 * ms), (0, 1 * ms), (3 * ms, 4 * ms)])
    assert parts == {"lead": 1.0, "busy": 8.0, "gaps": 0.0, "tail": 10.0}


def test_a_call_that_ran_no_kernel_is_all_lead(timeline):
    assert timeline([(0, 1_000_000), (5_000_000, 6_000_000)]) == {"lead": 4.0, "busy": 0.0, "gaps": 0.0, "tail": 0.0}


def test_largest_gaps_name_the_kernels_around_them(script):
    ms = 1_000_000
    kernels = [(0, ms, "marker"), (4 * ms, 5 * ms, "gemm"), (2 * ms, 6 * ms, "attention"), (9 * ms, 10 * ms, "norm"),
               (10 * ms, 11 * ms, "marker")]
    assert script.largest_gaps(kernels, 2) == [(3.0, "attention", "norm"), (1.0, "marker", "attention")]
