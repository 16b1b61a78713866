"""Drafts that stay on the device: their count is known without reading them, a prefix stays
pending, values are read once (when something indexes them), and the next step's input ids are
filled from them on the device."""

from __future__ import annotations

import torch

from folio.core.pending_drafts import PendingDrafts, draft_prefix
from folio.spec_decode.device_drafts import DeviceDrafts, fill_pending_drafts


class _CountingDrafts(DeviceDrafts):
    reads = 0

    def values(self, column: int) -> list[int]:
        type(self).reads += 1
        return super().values(column)


def test_count_and_prefix_without_reading_values():
    source = _CountingDrafts(torch.tensor([[5, 6], [7, 8], [9, 10]]))  # [steps, requests]
    drafts = PendingDrafts(source, 1, 3)
    head = draft_prefix(drafts, 2)
    assert len(drafts) == 3 and bool(drafts) and len(head) == 2 and isinstance(head, PendingDrafts)
    assert _CountingDrafts.reads == 0
    assert list(head) == [6, 8] and drafts[2] == 10 and drafts == [6, 8, 10] and head[-1] == 8
    assert draft_prefix([1, 2, 3], 2) == (1, 2)
    assert _CountingDrafts.reads == 2  # once per PendingDrafts, then cached


def test_input_ids_filled_from_several_sources_on_the_device():
    a = DeviceDrafts(torch.tensor([[11, 21], [12, 22]]))
    b = DeviceDrafts(torch.tensor([[31], [32], [33]]))
    input_ids = torch.zeros(10, dtype=torch.int64)
    fill_pending_drafts(input_ids, [(1, PendingDrafts(a, 1, 2)), (4, PendingDrafts(b, 0, 3)), (8, PendingDrafts(a, 0, 1))])
    assert input_ids.tolist() == [0, 21, 22, 0, 31, 32, 33, 0, 11, 0]
