"""StateHistory: per-second token rates and TTFT/ITL means from RequestOutputs, on a fake clock."""

from __future__ import annotations

import pytest

from folio.engine.state_history import StateHistory
from folio.outputs import CompletionOutput, RequestMetrics, RequestOutput


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def output(request_id, tokens, arrival, first, last, finished=False, n=1):
    completions = [CompletionOutput(i, "", list(range(tokens)), None, None) for i in range(n)]
    return RequestOutput(request_id, None, [1], None, completions, finished,
                         RequestMetrics(arrival, first_token_time=first, last_token_time=last))


def test_streamed_tokens_give_one_ttft_then_gaps():
    clock = Clock(1000.2)
    history = StateHistory(num_computed_tokens=50, window_s=4, clock=clock)
    history.record_step([output("a", 1, arrival=1000.0, first=1000.2, last=1000.2)], num_computed_tokens=60)
    clock.now = 1000.5
    history.record_step([output("a", 1, 1000.0, 1000.2, 1000.5)], 61)
    clock.now = 1001.1
    history.record_step([output("a", 2, 1000.0, 1000.2, 1001.1, finished=True)], 63)  # two tokens at once
    clock.now = 1002.0
    s = history.series()
    assert s["length"] == 4 and s["interval_s"] == 1
    assert s["generation_tokens_per_s"] == [0, 0, 2, 2]  # seconds 998..1001
    assert s["computed_tokens_per_s"] == [0, 0, 11, 2]  # counted from the starting counter (50)
    assert s["ttft_s"][2] == pytest.approx(0.2) and s["ttft_s"][3] is None
    assert s["itl_s"][2] == pytest.approx(0.3)  # 1000.2 -> 1000.5, one token
    assert s["itl_s"][3] == pytest.approx(0.3)  # 1000.5 -> 1001.1 over two tokens
    assert s["ttft_s"][:2] == [None, None]


def test_a_whole_output_at_once_gives_its_ttft_and_mean_gap():
    clock = Clock(1000.5)
    history = StateHistory(clock=clock, window_s=2)
    history.record_step([output("b", 5, arrival=999.0, first=1000.0, last=1000.4, finished=True)], 0)
    clock.now = 1001.0
    s = history.series()
    assert s["ttft_s"][-1] == pytest.approx(1.0)
    assert s["itl_s"][-1] == pytest.approx(0.1)  # 4 gaps over 0.4 s
    assert s["generation_tokens_per_s"][-1] == 5


def test_samples_of_n_count_every_token_and_the_longest_for_gaps():
    clock = Clock(1000.0)
    history = StateHistory(clock=clock, window_s=2)
    history.record_step([output("c", 3, 999.9, 1000.0, 1000.2, n=2)], 0)
    clock.now = 1001.0
    s = history.series()
    assert s["generation_tokens_per_s"][-1] == 6
    assert s["itl_s"][-1] == pytest.approx(0.1)


def test_old_seconds_leave_the_window_and_aborted_requests_are_forgotten():
    clock = Clock(1000.0)
    history = StateHistory(clock=clock, window_s=3)
    history.record_step([output("d", 1, 999.0, 1000.0, 1000.0)], 0)
    history.forget("d")
    clock.now = 1010.0
    history.record_step([output("d2", 1, 1009.0, 1010.0, 1010.0)], 0)
    assert history.series()["generation_tokens_per_s"] == [0, 0, 0]
    assert len(history._buckets) == 1 and set(history._last_token_time) == {"d2"}
    with pytest.raises(ValueError, match="window_s"):
        StateHistory(window_s=0)
