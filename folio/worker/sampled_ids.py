"""DeviceSampledIds: the last launched step's sampled ids, kept on the device for the next step.

With async scheduling a step is planned before the previous step's tokens reach the host: a
request's new token is then a placeholder (core/scheduler_output.py), and its id is here, in
the previous step's sampled-id tensor. `fill` gathers those ids into the next step's input ids
on the device, queued on the same stream after the step that samples them, so nobody waits.

Invariant: a placeholder always names a token sampled by the step launched just before (the
scheduler plans at most one step ahead), so only that step's tensor is kept.
"""

from __future__ import annotations

import torch

from folio.core.scheduler_output import ScheduledRequest
from folio.sample.transfer import to_device


class DeviceSampledIds:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._ids: torch.Tensor | None = None  # [rows] int64 on the device
        self._scheduled: list[ScheduledRequest] = []  # of the step that sampled them
        self._batch_indices: list[int] = []  # row i sampled for _scheduled[_batch_indices[i]]

    def record(self, ids: torch.Tensor | None, scheduled: list[ScheduledRequest], batch_indices: list[int]) -> None:
        """Keep this step's sampled ids (None: it sampled nothing) for the next step."""
        self._ids, self._scheduled, self._batch_indices = ids, scheduled, batch_indices

    def fill(self, input_ids: torch.Tensor, token_rows: list[int], request_ids: list[str]) -> None:
        """input_ids[token_rows[i]] = the id last sampled for request_ids[i], on the device."""
        if self._ids is None:
            raise RuntimeError("A step has placeholders but the step before it sampled nothing.")
        row_of = {self._scheduled[b].request_id: row for row, b in enumerate(self._batch_indices)}
        try:
            src = [row_of[request_id] for request_id in request_ids]
        except KeyError as e:
            raise RuntimeError(f"Placeholder of request {e.args[0]!r}: the last step did not sample it.") from None
        n = len(src)
        if src == token_rows and token_rows[0] == 0 and token_rows[-1] == n - 1:
            input_ids[:n].copy_(self._ids[:n])  # same requests in the same order: no index
            return
        index = to_device(token_rows + src, torch.int64, self.device).view(2, n)  # [2, n]
        input_ids[index[0]] = self._ids[index[1]]
