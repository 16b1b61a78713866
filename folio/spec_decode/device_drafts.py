"""DeviceDrafts: one proposal's draft tokens [steps, requests] as the draft model left them on
the device, and the next step's input ids filled from them there.

The proposer hands the scheduler PendingDrafts (core/pending_drafts.py) over one DeviceDrafts,
starts the copy to the host, and returns without waiting: the engine updates its requests,
detokenizes and schedules the next step while the GPU is still drafting. `fill_pending_drafts`
writes the drafts into the next step's input ids with one gather per source, before its
forward; the host values are read only by the verifier, after that forward.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from folio.core.pending_drafts import PendingDrafts
from folio.sample.transfer import to_device


class DeviceDrafts:
    def __init__(self, ids: torch.Tensor) -> None:  # [steps, requests] int64
        self.ids = ids
        if ids.is_cuda:
            self.host = torch.empty(ids.shape, dtype=ids.dtype, pin_memory=True)
            self.host.copy_(ids, non_blocking=True)
            self.copied: torch.cuda.Event | None = torch.cuda.Event()
            self.copied.record()
        else:
            self.host, self.copied = ids, None
        self._columns: list[list[int]] | None = None

    def values(self, column: int) -> list[int]:
        """One request's drafts, all steps (waits for the copy the first time)."""
        if self._columns is None:
            if self.copied is not None:
                self.copied.synchronize()
            self._columns = self.host.t().tolist()  # [requests][steps]
        return self._columns[column]


def fill_pending_drafts(input_ids: torch.Tensor, pending: list[tuple[int, PendingDrafts]]) -> None:
    """input_ids[row + j] = drafts[j] for every pending draft, gathered on the device."""
    groups: dict[int, list[tuple[int, PendingDrafts]]] = defaultdict(list)
    for row, drafts in pending:
        groups[id(drafts.source)].append((row, drafts))
    for entries in groups.values():
        source = entries[0][1].source
        rows = [row + j for row, d in entries for j in range(d.count)]
        steps = [j for _, d in entries for j in range(d.count)]
        columns = [d.column for _, d in entries for _ in range(d.count)]
        if not rows:
            continue
        device = input_ids.device
        gathered = source.ids[to_device(steps, torch.int64, device), to_device(columns, torch.int64, device)]
        input_ids[to_device(rows, torch.int64, device)] = gathered
