"""PendingOutput: one step's results on their way from the device to the host.

ModelRunner.launch queues the step's whole device work and, behind it, non-blocking copies of
everything the host will read (sampled ids, log-probs) into pinned host tensors, then records
an event. Nothing waits. `result()` waits for that event alone, so the host can plan and launch
the next step first (async scheduling) and the GPU never idles while it does.

On the CPU every copy is the tensor itself and there is no event: result() returns at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from folio.core.outputs import ModelRunnerOutput, PromptLogprobsChunk, TokenLogprobs


def to_host(tensor: torch.Tensor) -> torch.Tensor:
    """A host copy of a device tensor, queued without waiting (pinned memory on a GPU)."""
    return tensor.to("cpu", non_blocking=True)


@dataclass
class _Logprobs:
    ids: torch.Tensor  # [rows, k + 1] int64, host
    values: torch.Tensor  # [rows, k + 1] float32, host
    ranks: torch.Tensor  # [rows] int64, host
    wanted: list[tuple[int, int, int]]  # (row, batch index, logprobs asked) of rows that asked


@dataclass
class _PromptLogprobs:
    request_id: str
    start: int
    ids: torch.Tensor  # [n, k + 1] int64, host
    values: torch.Tensor  # [n, k + 1] float32, host
    ranks: torch.Tensor  # [n] int64, host


class PendingOutput:
    def __init__(self, req_ids: list[str]) -> None:
        self.req_ids = req_ids  # batch order
        self._sampled: torch.Tensor | None = None  # [rows] int64, host
        self._sampling_batch_indices: list[int] = []
        self._logprobs: _Logprobs | None = None
        self._prompt: list[_PromptLogprobs] = []
        self._event: torch.cuda.Event | None = None
        # Speculative decoding (already on the host): batch index -> tokens emitted by a verify
        # step, and their log-probs; drafts for every request's next step.
        self._verified: dict[int, tuple[list[int], list[TokenLogprobs] | None]] = {}
        self.spec_token_ids: list[Sequence[int]] | None = None  # PendingDrafts from a draft model
        # Whether the step verified or proposed drafts: the next step's plan depends on its
        # results, so the engine does not launch it ahead (async scheduling).
        self.speculative = False
        self.drafts_stopped: frozenset[str] = frozenset()  # see ModelRunnerOutput

    # ---- filled during launch ---------------------------------------------------------------
    def add_sampled(self, sampled: torch.Tensor, batch_indices: list[int]) -> None:
        """sampled [rows] int64 on the device: row i is scheduled request batch_indices[i]."""
        self._sampled = to_host(sampled)
        self._sampling_batch_indices = batch_indices

    def add_logprobs(
        self, ids: torch.Tensor, values: torch.Tensor, ranks: torch.Tensor, wanted: list[tuple[int, int, int]]
    ) -> None:
        self._logprobs = _Logprobs(to_host(ids), to_host(values), to_host(ranks), wanted)

    def add_prompt_logprobs(
        self, request_id: str, start: int, ids: torch.Tensor, values: torch.Tensor, ranks: torch.Tensor
    ) -> None:
        self._prompt.append(_PromptLogprobs(request_id, start, to_host(ids), to_host(values), to_host(ranks)))

    def add_verified(self, batch_index: int, token_ids: list[int], logprobs: list[TokenLogprobs] | None) -> None:
        self._verified[batch_index] = (token_ids, logprobs)

    def seal(self, device: torch.device) -> None:
        """Mark the end of the step's queued work: result() waits for everything before this."""
        if device.type == "cuda":
            self._event = torch.cuda.Event()
            self._event.record()

    # ---- on the host, later -----------------------------------------------------------------
    def result(self) -> ModelRunnerOutput:
        """Wait for the step's copies (only them) and build the ModelRunnerOutput."""
        if self._event is not None:
            self._event.synchronize()
        n = len(self.req_ids)
        sampled: list[list[int]] = [[] for _ in range(n)]
        if self._sampled is not None:
            for batch_index, token_id in zip(self._sampling_batch_indices, self._sampled.tolist()):
                sampled[batch_index] = [token_id]
        output = ModelRunnerOutput(req_ids=self.req_ids, sampled_token_ids=sampled, spec_token_ids=self.spec_token_ids,
                                   drafts_stopped=self.drafts_stopped)
        if self._logprobs is not None:
            output.logprobs = self._token_logprobs(self._logprobs, n)
        for batch_index, (token_ids, logprobs) in self._verified.items():
            sampled[batch_index] = token_ids
            if logprobs is not None:
                output.logprobs = output.logprobs or [None] * n
                output.logprobs[batch_index] = logprobs
        for chunk in self._prompt:
            ids, values, ranks = chunk.ids.tolist(), chunk.values.tolist(), chunk.ranks.tolist()
            entries = [TokenLogprobs(ids[i], values[i], ranks[i]) for i in range(len(ids))]
            output.prompt_logprobs[chunk.request_id] = PromptLogprobsChunk(chunk.start, entries)
        return output

    @staticmethod
    def _token_logprobs(lp: _Logprobs, n: int) -> list[list[TokenLogprobs] | None]:
        ids, values, ranks = lp.ids.tolist(), lp.values.tolist(), lp.ranks.tolist()
        out: list[list[TokenLogprobs] | None] = [None] * n
        for row, batch_index, num in lp.wanted:
            out[batch_index] = [TokenLogprobs(ids[row][: num + 1], values[row][: num + 1], ranks[row])]
        return out
