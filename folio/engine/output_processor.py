"""OutputProcessor: turns per-step core outputs into RequestOutputs.

It owns what the scheduler does not know about: text (incremental detokenization), stop
strings, log-prob objects, metrics, and the grouping of n > 1 samples under their parent id.

With `wire_records` (the engine process sets it) a streamed request's plain step is returned as a
streamed wire record (engine/wire.py) instead of a RequestOutput: the server rebuilds the output.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from folio.core.outputs import EngineCoreOutput, PromptLogprobsChunk, TokenLogprobs
from folio.engine.detokenizer import IncrementalDetokenizer, decode_token
from folio.engine.stop_checker import StopMatch, find_stop, streamable_length
from folio.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from folio.sampling_params import RequestOutputKind, SamplingParams


@dataclass
class SampleState:
    """One generated sequence (one of a request's n samples)."""

    request_id: str  # the core request id (child id when n > 1)
    index: int
    params: SamplingParams
    detokenizer: IncrementalDetokenizer | None
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[dict[int, Logprob]] | None = None
    cumulative_logprob: float | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    sent_tokens: int = 0  # for DELTA outputs: what the caller has already seen
    sent_text: int = 0
    finish_sent: bool = False
    # min_tokens: stop strings are searched only in text after the min_tokens-th token (vLLM's rule)
    stop_check_from: int = 0


@dataclass
class RequestState:
    """A user request: its prompt and its n samples."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    output_kind: RequestOutputKind
    samples: list[SampleState]
    prompt_logprobs: list[dict[int, Logprob] | None] | None
    metrics: RequestMetrics
    num_cached_tokens: int = 0
    n: int = 1  # completions returned: the n best of the samples when best_of > n
    # wire_records: whether this request's steps may go as streamed records (one sample, DELTA,
    # no log-probs), and the cached-token count the server has from its last full record
    # (None until one with the first token went).
    streamed: bool = False
    wire_cached_tokens: int | None = None

    @property
    def finished(self) -> bool:
        for sample in self.samples:  # a loop, not all(): this runs for every request every step
            if sample.finish_reason is None:
                return False
        return True


class OutputProcessor:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.requests: dict[str, RequestState] = {}  # by user request id
        self.samples: dict[str, tuple[RequestState, SampleState]] = {}  # by core request id
        # With isolate_errors (the server sets it), an exception while processing one request's
        # output fails that request alone: it is forgotten and reported by take_errors().
        # Offline callers keep the default and see the exception.
        self.isolate_errors = False
        self.wire_records = False
        self._errors: dict[str, tuple[Exception, list[str]]] = {}

    # ---- registration -----------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        core_request_ids: list[str],
        child_params: list[SamplingParams],
        arrival_time: float,
    ) -> None:
        samples = [
            SampleState(
                request_id=core_id,
                index=i,
                params=p,
                detokenizer=self._detokenizer(prompt_token_ids, p),
                # The caller's wish decides what is returned; a best_of sample tracks its
                # cumulative log-prob (its params ask logprobs=0) even when none are returned.
                logprobs=[] if params.logprobs is not None else None,
                cumulative_logprob=0.0 if p.logprobs is not None else None,
            )
            for i, (core_id, p) in enumerate(zip(core_request_ids, child_params))
        ]
        state = RequestState(
            request_id=request_id,
            prompt=prompt,
            prompt_token_ids=prompt_token_ids,
            output_kind=params.output_kind,
            samples=samples,
            prompt_logprobs=[None] if params.prompt_logprobs is not None else None,
            metrics=RequestMetrics(arrival_time=arrival_time),
            n=params.n,
        )
        state.streamed = (self.wire_records and params.output_kind == RequestOutputKind.DELTA and len(samples) == 1
                          and params.n == 1 and samples[0].logprobs is None
                          and samples[0].cumulative_logprob is None and state.prompt_logprobs is None)
        self.requests[request_id] = state
        for sample in samples:
            self.samples[sample.request_id] = (state, sample)

    def _detokenizer(self, prompt_ids: list[int], params: SamplingParams) -> IncrementalDetokenizer | None:
        if self.tokenizer is None or not params.detokenize:
            return None
        return IncrementalDetokenizer(
            self.tokenizer,
            prompt_ids,
            skip_special_tokens=params.skip_special_tokens,
            spaces_between_special_tokens=params.spaces_between_special_tokens,
        )

    def abort_requests(self, request_ids: list[str]) -> list[str]:
        """Forget user requests; returns the core request ids to abort."""
        core_ids = []
        for request_id in request_ids:
            state = self.requests.pop(request_id, None)
            if state is None:
                continue
            for sample in state.samples:
                self.samples.pop(sample.request_id, None)
                core_ids.append(sample.request_id)
        return core_ids

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # ---- one step ---------------------------------------------------------------------------
    def process_outputs(
        self, core_outputs: list[EngineCoreOutput]
    ) -> tuple[list[RequestOutput], list[str]]:
        """RequestOutputs for the requests that changed, and core ids stopped by a stop string."""
        now = time.monotonic()
        touched: dict[str, RequestState] = {}
        stopped_by_string: list[str] = []
        for out in core_outputs:
            entry = self.samples.get(out.request_id)
            if entry is None:
                continue  # aborted meanwhile
            state, sample = entry
            try:
                self._update_metrics(state, out, now)
                if out.new_prompt_logprobs is not None and state.prompt_logprobs is not None:
                    state.prompt_logprobs.extend(self._prompt_logprobs(out.new_prompt_logprobs))
                if self._update_sample(sample, out):
                    stopped_by_string.append(out.request_id)
            except Exception as e:
                self._fail(state, e)
                continue
            touched[state.request_id] = state
        outputs = []
        errors = self._errors
        for state in touched.values():
            if errors and state.request_id in errors:
                continue
            finished = state.finished  # once per request and step (it walks the samples)
            try:
                output = None
                if state.streamed:
                    output = self._streamed_record(state, now)
                if output is None:
                    output = self._make_output(state, finished)
            except Exception as e:
                self._fail(state, e)
                continue
            if output is not None:
                outputs.append(output)
            if finished:
                state.metrics.finished_time = now
                self._forget(state)
        return outputs, stopped_by_string

    def _update_metrics(self, state: RequestState, out: EngineCoreOutput, now: float) -> None:
        if out.new_token_ids:
            if state.metrics.first_token_time is None:
                state.metrics.first_token_time = now
            state.metrics.last_token_time = now
        if out.num_cached_tokens > state.num_cached_tokens:
            state.num_cached_tokens = out.num_cached_tokens

    def _update_sample(self, sample: SampleState, out: EngineCoreOutput) -> bool:
        """Apply one step to a sample; True if a stop string ended it (core must be told).

        A step that brings several tokens (accepted drafts) to a sample with stop strings is
        applied token by token: the output ends at the token whose text completes the stop, and
        the tokens after it (and their log-probs) are dropped, as without speculation."""
        new_ids, entries = out.new_token_ids, out.new_logprobs
        if sample.detokenizer is None or not sample.params.stop or len(new_ids) <= 1:
            pieces = [(0, len(new_ids))]
        else:
            pieces = [(i, i + 1) for i in range(len(new_ids))]
        ends_on_stop_token = self._ends_on_stop_token(sample, out)
        for start, end in pieces:
            last = end == len(new_ids)
            self._take_tokens(sample, new_ids[start:end], entries[start:end] if entries else None)
            # the stop token (EOS, stop_token_ids) is in token_ids but not in the text (vLLM's rule)
            text_end = end - 1 if last and ends_on_stop_token else end
            stop = self._detokenize(sample, new_ids[start:text_end], last and out.finish_reason is not None)
            if stop is not None:
                stop_str, cut = stop
                sample.text = sample.text[:cut]
                sample.finish_reason, sample.stop_reason = "stop", stop_str
                return out.finish_reason is None
        if out.finish_reason is not None:
            sample.finish_reason, sample.stop_reason = out.finish_reason, out.stop_reason
        return False

    def _take_tokens(self, sample: SampleState, token_ids: list[int], entries: list[TokenLogprobs] | None) -> None:
        sample.token_ids.extend(token_ids)
        for entry in entries or ():
            if sample.logprobs is not None:
                sample.logprobs.append(self._logprob_dict(entry))
            if sample.cumulative_logprob is not None:
                sample.cumulative_logprob += entry.logprobs[0]

    @staticmethod
    def _ends_on_stop_token(sample: SampleState, out: EngineCoreOutput) -> bool:
        """Whether the step's last token is the EOS or stop token that ended the output (not a
        completed grammar's last token), whose text is left out unless include_stop_str_in_output."""
        params = sample.params
        return (out.finish_reason == "stop" and bool(out.new_token_ids) and not params.include_stop_str_in_output
                and out.new_token_ids[-1] in params.all_stop_token_ids)

    @staticmethod
    def _detokenize(sample: SampleState, new_ids: list[int], finished: bool) -> StopMatch | None:
        """The text of tokens just taken, and the stop string it completes, if any (searched
        only in text after the min_tokens-th token: vLLM's rule). With finished, text held back
        (an unfinished character) is released even when no token is given."""
        if sample.detokenizer is None or not (new_ids or finished):
            return None
        new_text = sample.detokenizer.append(new_ids, finished=finished)
        if len(sample.token_ids) <= sample.params.min_tokens:
            sample.stop_check_from = len(sample.detokenizer.output_text)
        sample.text = sample.detokenizer.output_text
        new_len = min(len(new_text), len(sample.text) - sample.stop_check_from)
        return find_stop(sample.text, new_len, sample.params.stop, sample.params.include_stop_str_in_output)

    def _logprob_dict(self, entry: TokenLogprobs) -> dict[int, Logprob]:
        """The chosen token (with its true rank) plus the top-k (ranks 1..k)."""
        result: dict[int, Logprob] = {}
        ranks = [entry.rank] + list(range(1, len(entry.token_ids)))
        for tok, logprob, rank in zip(entry.token_ids, entry.logprobs, ranks):
            if tok not in result:
                result[tok] = Logprob(logprob, rank, self._decode(tok))
        return result

    def _prompt_logprobs(self, chunk: PromptLogprobsChunk) -> list[dict[int, Logprob]]:
        return [self._logprob_dict(entry) for entry in chunk.entries]

    def _decode(self, token_id: int) -> str | None:
        if self.tokenizer is None:
            return None
        return decode_token(self.tokenizer, token_id)

    # ---- building RequestOutputs ------------------------------------------------------------
    def _make_output(self, state: RequestState, finished: bool) -> RequestOutput | None:
        kind = state.output_kind
        samples = state.samples
        if len(samples) > state.n:  # best_of: only the n best, once all are done
            if not finished:
                return None
            kind = RequestOutputKind.FINAL_ONLY
            samples = sorted(samples, key=lambda s: -(s.cumulative_logprob or 0.0))[: state.n]
            for rank, sample in enumerate(samples):
                sample.index = rank
        if kind == RequestOutputKind.DELTA:  # a streamed request's step: the common case
            completions = [c for c in map(self._delta, samples) if c is not None]
        elif kind == RequestOutputKind.FINAL_ONLY and not finished:
            return None
        else:
            completions = [self._completion(s, kind) for s in samples]
        return RequestOutput(state.request_id, state.prompt, state.prompt_token_ids, state.prompt_logprobs,
                             completions, finished, state.metrics, state.num_cached_tokens)

    def _streamed_record(self, state: RequestState, now: float) -> tuple | None:
        """A streamed request's step as a streamed wire record (engine/wire.py), or None where it
        needs a full one: the server has no first-token time yet, the cached-token count moved,
        or the step brought the sample no token."""
        sample = state.samples[0]
        if state.wire_cached_tokens != state.num_cached_tokens or len(sample.token_ids) <= sample.sent_tokens:
            if state.metrics.first_token_time is not None:  # the full record about to go tells the server
                state.wire_cached_tokens = state.num_cached_tokens
            return None
        if state.metrics.last_token_time != now:  # tokens, but not from this step (not seen so far)
            return None
        text, new_tokens, _ = self._take_delta(sample)
        finish = None if sample.finish_reason is None else (sample.finish_reason, sample.stop_reason)
        return (state.request_id, text, new_tokens, finish, now)

    def _completion(self, sample: SampleState, kind: RequestOutputKind) -> CompletionOutput | None:
        if kind != RequestOutputKind.DELTA:
            return CompletionOutput(
                index=sample.index,
                text=sample.text,
                token_ids=list(sample.token_ids),
                cumulative_logprob=sample.cumulative_logprob,
                logprobs=sample.logprobs,
                finish_reason=sample.finish_reason,
                stop_reason=sample.stop_reason,
            )
        return self._delta(sample)

    def _delta(self, sample: SampleState) -> CompletionOutput | None:
        """What is new since the last output; text that may still become a stop string waits."""
        if sample.finish_sent:
            return None
        taken = self._take_delta(sample)
        if taken is None:
            return None
        text, new_tokens, start = taken
        logprobs = None
        if sample.logprobs is not None:
            logprobs = sample.logprobs[start:]
        return CompletionOutput(sample.index, text, new_tokens, sample.cumulative_logprob, logprobs,
                                sample.finish_reason, sample.stop_reason)

    @staticmethod
    def _take_delta(sample: SampleState) -> tuple[str, list[int], int] | None:
        """The text and tokens new since the last output, and where those tokens start; marks them
        sent. None if there is nothing to send (text that may still become a stop string waits)."""
        finished = sample.finish_reason is not None
        text_end = len(sample.text)
        if not finished and sample.params.stop:
            text_end = streamable_length(sample.text, sample.params.stop, sample.sent_text)
        start = sample.sent_tokens
        new_tokens = sample.token_ids[start:]
        if not finished and not new_tokens and text_end <= sample.sent_text:
            return None
        text = sample.text[sample.sent_text : text_end]
        sample.sent_tokens = len(sample.token_ids)
        if text_end > sample.sent_text:
            sample.sent_text = text_end
        sample.finish_sent = finished
        return text, new_tokens, start

    def _fail(self, state: RequestState, error: Exception) -> None:
        if not self.isolate_errors:
            raise error
        self._errors[state.request_id] = (error, [s.request_id for s in state.samples])
        self._forget(state)

    def fail_request(self, request_id: str, error: Exception) -> None:
        """Fail a request from outside its outputs (its grammar did not compile): raises the
        error, or with isolate_errors records it for take_errors()."""
        state = self.requests.get(request_id)
        if state is not None:
            self._fail(state, error)

    def take_errors(self) -> dict[str, tuple[Exception, list[str]]]:
        """Requests failed since the last call: user id -> (the exception, its core ids)."""
        errors, self._errors = self._errors, {}
        return errors

    def _forget(self, state: RequestState) -> None:
        self.requests.pop(state.request_id, None)
        for sample in state.samples:
            self.samples.pop(sample.request_id, None)
