"""DeviceSampledIds: placeholders get the id the previous step sampled for their own request."""

from __future__ import annotations

import pytest
import torch

from folio.core.request import Request
from folio.core.scheduler_output import ScheduledRequest
from folio.sampling_params import SamplingParams
from folio.worker.sampled_ids import DeviceSampledIds


def _scheduled(names: list[str]) -> list[ScheduledRequest]:
    return [ScheduledRequest(Request(n, [1, 2], SamplingParams()), 1, 1, [0], True) for n in names]


def test_placeholders_take_their_own_requests_ids_in_any_order():
    ids = DeviceSampledIds(torch.device("cpu"))
    scheduled = _scheduled(["a", "b", "c", "d"])
    # The last step sampled for a, c and d (b was a prefill chunk): rows 0, 1, 2.
    ids.record(torch.tensor([10, 30, 40]), scheduled, [0, 2, 3])
    input_ids = torch.zeros(6, dtype=torch.int64)
    ids.fill(input_ids, [1, 2, 5], ["d", "a", "c"])  # reordered, among other tokens
    assert input_ids.tolist() == [0, 40, 10, 0, 0, 30]
    same_order = torch.zeros(3, dtype=torch.int64)
    ids.fill(same_order, [0, 1, 2], ["a", "c", "d"])  # the copy without an index
    assert same_order.tolist() == [10, 30, 40]


def test_a_placeholder_the_last_step_did_not_sample_is_an_error():
    ids = DeviceSampledIds(torch.device("cpu"))
    ids.record(torch.tensor([10]), _scheduled(["a", "b"]), [0])
    with pytest.raises(RuntimeError, match="'b'"):
        ids.fill(torch.zeros(2, dtype=torch.int64), [0], ["b"])
    ids.record(None, [], [])
    with pytest.raises(RuntimeError, match="sampled nothing"):
        ids.fill(torch.zeros(2, dtype=torch.int64), [0], ["a"])
