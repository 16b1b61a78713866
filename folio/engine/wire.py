"""How a step's outputs cross the pipe from the engine process to the server (EngineProcess).

Outputs travel as plain tuples (pickled ~10x faster than the dataclasses), without what the
server already has: the prompt (resending it every step would cost O(prompt) per token), and
prompt log-probs after the first output with tokens. Two kinds of record:

- a full record, made by WireEncoder from any RequestOutput:
  (request_id, completions, finished, metrics, num_cached_tokens, prompt_logprobs), the
  completions as tuples of CompletionOutput's fields and the metrics as RequestMetrics';
- a streamed record, for the common streamed step (one sample, DELTA, no log-probs, new tokens,
  the request's earlier output sent in full), which the OutputProcessor builds straight from its
  sample (`wire_records`) with no RequestOutput in between:
  (request_id, text, token_ids, finish, now), finish None or (finish_reason, stop_reason), now
  the step's time (the output's last token time, and its finished time when finish is set).

WireDecoder, in the server, keeps per request what a streamed record leaves out (prompt, arrival
and first-token times, cached tokens: fixed once the first token is out) and rebuilds from
either record the RequestOutput the engine would have returned.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Any

from folio.outputs import CompletionOutput, RequestMetrics, RequestOutput

# Fields in this order (every field an __init__ argument, in declaration order, so the far side
# rebuilds them positionally).
_COMPLETION_FIELDS = tuple(f.name for f in dataclasses.fields(CompletionOutput))
_METRICS_FIELDS = tuple(f.name for f in dataclasses.fields(RequestMetrics))
_completion_tuple = operator.attrgetter(*_COMPLETION_FIELDS)
_metrics_tuple = operator.attrgetter(*_METRICS_FIELDS)
STREAMED_RECORD_LEN = 5  # a full record has 6 fields


def finished_request_ids(outputs: list[Any]) -> list[str]:
    """The ids of the finished requests among a step's outputs, before encoding: RequestOutputs
    or streamed records (a full record's fields differ: it is refused, not misread)."""
    ids = []
    for o in outputs:
        if o.__class__ is tuple:
            if len(o) != STREAMED_RECORD_LEN:
                raise TypeError("finished_request_ids reads RequestOutputs and streamed records, not full records.")
            if o[3] is not None:
                ids.append(o[0])
        elif o.finished:
            ids.append(o.request_id)
    return ids


class WireEncoder:
    """The engine process's side: a step's outputs as records."""

    def __init__(self) -> None:
        self._sent_prompt_logprobs: set[str] = set()

    def encode(self, outputs: list[Any]) -> list[tuple]:
        full = self.full_record
        return [o if o.__class__ is tuple else full(o) for o in outputs]

    def full_record(self, output: RequestOutput) -> tuple:
        prompt_logprobs = None
        if output.prompt_logprobs is not None and any(c.token_ids for c in output.outputs):
            if output.request_id not in self._sent_prompt_logprobs:
                self._sent_prompt_logprobs.add(output.request_id)
                prompt_logprobs = output.prompt_logprobs
        if output.finished:
            self._sent_prompt_logprobs.discard(output.request_id)
        completions = [_completion_tuple(c) for c in output.outputs]
        m = output.metrics
        metrics = None if m is None else _metrics_tuple(m)
        return (output.request_id, completions, output.finished, metrics, output.num_cached_tokens, prompt_logprobs)


class WireDecoder:
    """The server's side: records back into RequestOutputs. add() each request as it is sent to
    the engine, accepted() it when the engine's answer comes back, and forget() it when it is
    aborted or failed; a finished output forgets it too.

    A record under an id that is added but not yet accepted belongs to an aborted request of
    the same name (the engine answers an add before any step that runs it): it is decoded
    without touching the new request's state, and AsyncLLM drops it."""

    def __init__(self) -> None:
        # request id -> [prompt, prompt token ids, arrival, first scheduled, first token time,
        # cached tokens], the last four as of the request's latest full record.
        self._requests: dict[str, list] = {}
        self._unaccepted: set[str] = set()

    def __len__(self) -> int:
        return len(self._requests)

    def add(self, request_id: str, prompt: str | None, prompt_token_ids: list[int]) -> None:
        self._requests[request_id] = [prompt, prompt_token_ids, None, None, None, 0]
        self._unaccepted.add(request_id)

    def accepted(self, request_ids: list[str]) -> None:
        self._unaccepted.difference_update(request_ids)

    def forget(self, request_id: str) -> None:
        self._requests.pop(request_id, None)
        self._unaccepted.discard(request_id)

    def failed(self, request_id: str) -> None:
        """The engine dropped the request (an error in its step): forget it, unless the id is an
        added, not yet accepted namesake's (the failure is the aborted one's)."""
        if request_id not in self._unaccepted:
            self._requests.pop(request_id, None)

    def decode(self, record: tuple) -> RequestOutput:
        if record[0] in self._unaccepted:  # an aborted namesake's late record
            return self._stale(record)
        if len(record) == STREAMED_RECORD_LEN:
            return self._streamed(record)
        request_id, completions, finished, metrics, num_cached_tokens, prompt_logprobs = record
        known = (self._requests.pop if finished else self._requests.get)(request_id, None)
        if known is None:  # aborted meanwhile (or never added): its caller is gone
            known = [None, [], None, None, None, 0]
        elif metrics is not None and not finished:
            known[2:] = metrics[0], metrics[1], metrics[2], num_cached_tokens
        return RequestOutput(request_id, known[0], known[1], prompt_logprobs, [CompletionOutput(*c) for c in completions],
                             finished, RequestMetrics(*metrics) if metrics is not None else None, num_cached_tokens)

    def _stale(self, record: tuple) -> RequestOutput:
        """A record decoded as if its request were unknown (AsyncLLM drops it)."""
        if len(record) == STREAMED_RECORD_LEN:
            request_id, text, token_ids, finish, now = record
            completions = [CompletionOutput(0, text, token_ids, None, None, *(finish or ()))]
            return RequestOutput(request_id, None, [], None, completions, finish is not None, None, 0)
        request_id, completions, finished, _, num_cached_tokens, _ = record
        return RequestOutput(request_id, None, [], None, [CompletionOutput(*c) for c in completions], finished, None,
                             num_cached_tokens)

    def _streamed(self, record: tuple) -> RequestOutput:
        request_id, text, token_ids, finish, now = record
        if finish is None:
            known = self._requests.get(request_id)
            completion = CompletionOutput(0, text, token_ids, None, None)
        else:
            known = self._requests.pop(request_id, None)
            completion = CompletionOutput(0, text, token_ids, None, None, finish[0], finish[1])
        if known is None:  # aborted meanwhile: its caller is gone
            known = [None, [], now, None, None, 0]
        metrics = RequestMetrics(known[2], known[3], known[4], now, None if finish is None else now)
        return RequestOutput(request_id, known[0], known[1], None, [completion], finish is not None, metrics, known[5])
