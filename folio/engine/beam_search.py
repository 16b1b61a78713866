"""Beam search: vLLM's BeamSearchParams and output objects, and the search the engine drives.

Each beam is a core request with `pause_after_sample`: it computes one token's logits, reports
the top K log-probs and waits. Once every running beam of a search has reported, the search
picks the next beams and hands the scheduler one `fork_request` per old beam: a continued beam
becomes one child per chosen token, sharing all its blocks by reference count (the block the
children write next is copied on first write); an old beam not continued just ends. The
sampler's own token is never used: a child's last token is the one the search chose, and it
has no K/V yet, so replacing it costs nothing.

The algorithm is transformers' (generate(num_beams=W, do_sample=False, length_penalty=lp) with
its default early_stopping=False), so that outputs equal it:
- candidates: every running beam extended by each of its top tokens, scored by cumulative
  log-prob; the best K = max(2, 1 + #eos) * W are kept;
- a candidate "stops" if its token is EOS (unless ignore_eos) or it reaches max_tokens (or
  max_model_len); the stopped ones among the best W candidates are finished hypotheses, scored
  cum_logprob / generated_len ** length_penalty (generated_len counts the EOS token); the best W
  hypotheses are kept;
- the next running beams are the best W candidates that did not stop;
- the search ends at max_tokens, or as soon as W hypotheses are finished and the best running
  beam, scored at its current length, cannot beat the worst of them (transformers' heuristic
  for early_stopping=False; early_stopping=True/"never" are not offered, as in vLLM).
The W finished hypotheses are returned best first. Where vLLM's own LLM.beam_search differs
(it keeps every EOS candidate, never stops early, and counts the prompt in the length penalty),
folio follows transformers, the reference the tests compare with.

Log-probs are the model's raw ones (vLLM v1's default), so `temperature` changes nothing; it is
accepted for vLLM compatibility.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from folio.core.outputs import EngineCoreOutput, TokenLogprobs
from folio.core.request import Request, RequestStatus
from folio.core.scheduler import Scheduler
from folio.engine.detokenizer import decode_token, plain_decoder
from folio.engine.input_processor import ProcessedPrompt
from folio.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from folio.sampling_params import BeamSearchParams, SamplingParams


@dataclass
class BeamSearchSequence:
    """One returned beam, as vLLM shapes it: tokens include the prompt."""

    tokens: list[int]
    logprobs: list[dict[int, Logprob]]
    cum_logprob: float = 0.0
    text: str | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class BeamSearchOutput:
    sequences: list[BeamSearchSequence]


@dataclass
class _Beam:
    request_id: str  # its core request while it runs
    token_ids: list[int]  # generated so far
    cum_logprob: float
    steps: list[TokenLogprobs] = field(default_factory=list)  # the candidates at each token


@dataclass
class _Candidate:
    score: float  # cumulative log-prob with the token
    parent: int  # index of the running beam it extends
    token_id: int


class BeamSearch:
    """One prompt's search; `BeamSearchManager` feeds it its beams' core outputs."""

    def __init__(
        self,
        request_id: str,
        prompt: ProcessedPrompt,
        params: BeamSearchParams,
        eos_token_ids: set[int],
        max_model_len: int,
        arrival_time: float,
        priority: int,
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.params = params
        self.eos = set() if params.ignore_eos else set(eos_token_ids)
        self.num_candidates = max(2, 1 + len(self.eos)) * params.beam_width
        self.max_new = min(params.max_tokens, max_model_len - len(prompt.token_ids))
        if self.max_new < 1:
            raise ValueError(
                f"The prompt is {len(prompt.token_ids)} tokens long: no room to generate within "
                f"max_model_len={max_model_len}."
            )
        self.arrival_time = arrival_time
        self.priority = priority
        self.core_params = SamplingParams(
            temperature=params.temperature, max_tokens=None, ignore_eos=True,
            logprobs=self.num_candidates, detokenize=False,
        )
        self.running: list[_Beam] = []
        self.reports: dict[str, TokenLogprobs] = {}
        self.finished: list[tuple[float, _Beam, str]] = []  # (score, beam, finish reason), best first
        self.improvable = True  # transformers' early-stop heuristic, still unsatisfied
        self.num_generated = 0
        self.num_cached_tokens = 0
        self._next_id = 0

    # ---- beams as core requests -------------------------------------------------------------
    def start(self) -> Request:
        root = self._request(self.prompt.token_ids, [])
        self.running = [_Beam(root.request_id, [], 0.0)]
        return root

    def _request(self, prompt_ids: list[int], output_ids: list[int]) -> Request:
        request = Request(
            f"beam{self._next_id}_{self.request_id}", list(prompt_ids), self.core_params,
            output_token_ids=list(output_ids), arrival_time=self.arrival_time, priority=self.priority,
        )
        request.pause_after_sample, request.family_id = True, self.request_id
        request.cache_salt = self.prompt.cache_salt
        request.lora_request = self.prompt.lora_request
        self._next_id += 1
        return request

    def core_request_ids(self) -> list[str]:
        return [beam.request_id for beam in self.running]

    def on_output(self, out: EngineCoreOutput) -> None:
        if out.new_logprobs:
            self.reports[out.request_id] = out.new_logprobs[-1]
            self.num_cached_tokens = max(self.num_cached_tokens, out.num_cached_tokens)

    @property
    def ready(self) -> bool:
        """Every running beam has reported its next-token log-probs."""
        return bool(self.running) and all(b.request_id in self.reports for b in self.running)

    # ---- one step of the search -------------------------------------------------------------
    def advance(self, scheduler: Scheduler) -> bool:
        """Pick the next beams and fork them in the scheduler; True when the search is over."""
        top = self._top_candidates()
        length = self.num_generated + 1
        at_max = length >= self.max_new
        stops = [at_max or c.token_id in self.eos for c in top]
        width = self.params.beam_width
        if self.improvable:
            for c, stop in zip(top[:width], stops[:width]):
                if stop:
                    self._add_finished(c, length, "length" if c.token_id not in self.eos else "stop")
        nxt = [c for c, stop in zip(top, stops) if not stop][:width]
        self.num_generated = length
        if nxt and len(self.finished) == width:
            best = nxt[0].score / length**self.params.length_penalty
            self.improvable = best > self.finished[-1][0]
        done = at_max or not nxt or not self.improvable
        old = self.running
        self.running = [] if done else [self._child(old[c.parent], c) for c in nxt]
        self.reports = {}
        if done:
            scheduler.finish_requests([b.request_id for b in old], RequestStatus.FINISHED_ABORTED)
            return True
        self._fork(scheduler, old, [c.parent for c in nxt])
        return False

    def _top_candidates(self) -> list[_Candidate]:
        cands = []
        for index, beam in enumerate(self.running):
            entry = self.reports[beam.request_id]
            for token_id, logprob in zip(entry.token_ids[1:], entry.logprobs[1:]):
                cands.append(_Candidate(beam.cum_logprob + logprob, index, token_id))
        cands.sort(key=lambda c: (-c.score, c.parent, c.token_id))
        return cands[: self.num_candidates]

    def _child(self, parent: _Beam, c: _Candidate) -> _Beam:
        """The beam `parent` extended by the candidate's token (reports still hold its step)."""
        step = self.reports[parent.request_id]
        return _Beam("", parent.token_ids + [c.token_id], c.score, parent.steps + [step])

    def _add_finished(self, c: _Candidate, length: int, reason: str) -> None:
        beam = self._child(self.running[c.parent], c)
        score = c.score / length**self.params.length_penalty
        self.finished.append((score, beam, reason))
        self.finished.sort(key=lambda f: -f[0])
        del self.finished[self.params.beam_width :]

    def _fork(self, scheduler: Scheduler, old: list[_Beam], parents: list[int]) -> None:
        """Old beams not continued end first, so their seats go to the others' children."""
        children: dict[int, list[Request]] = {}
        for beam, parent_index in zip(self.running, parents):
            request = self._request(self.prompt.token_ids, beam.token_ids)
            beam.request_id = request.request_id
            children.setdefault(parent_index, []).append(request)
        for index, parent in enumerate(old):
            if index not in children:
                scheduler.fork_request(parent.request_id, [])
        for index, kids in children.items():
            scheduler.fork_request(old[index].request_id, kids)

    # ---- result -----------------------------------------------------------------------------
    def result(self, tokenizer: Any) -> RequestOutput:
        completions = []
        for index, (_, beam, reason) in enumerate(self.finished):
            completions.append(CompletionOutput(
                index=index,
                text=self._text(tokenizer, beam, reason),
                token_ids=list(beam.token_ids),
                cumulative_logprob=beam.cum_logprob,
                logprobs=[_logprob_dict(tokenizer, step) for step in beam.steps],
                finish_reason=reason,
                stop_reason=None,
            ))
        now = time.monotonic()
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt.text,
            prompt_token_ids=list(self.prompt.token_ids),
            prompt_logprobs=None,
            outputs=completions,
            finished=True,
            metrics=RequestMetrics(arrival_time=self.arrival_time, finished_time=now),
            num_cached_tokens=self.num_cached_tokens,
        )

    def _text(self, tokenizer: Any, beam: _Beam, reason: str) -> str:
        if tokenizer is None:
            return ""  # as for sampled requests without a tokenizer
        tokens = beam.token_ids
        if reason == "stop" and not self.params.include_stop_str_in_output:
            tokens = tokens[:-1]  # the EOS token
        # As a sampled request's text: special tokens skipped unless the request keeps them
        return plain_decoder(tokenizer, self.params.skip_special_tokens,
                              self.params.spaces_between_special_tokens)(list(tokens))


def _logprob_dict(tokenizer: Any, step: TokenLogprobs) -> dict[int, Logprob]:
    out: dict[int, Logprob] = {}
    for rank, (token_id, logprob) in enumerate(zip(step.token_ids[1:], step.logprobs[1:]), 1):
        text = decode_token(tokenizer, token_id) if tokenizer is not None else None
        out.setdefault(token_id, Logprob(logprob, rank, text))
    return out


def to_beam_search_output(output: RequestOutput) -> BeamSearchOutput:
    """LLM.beam_search's shape: each sequence's tokens include the prompt."""
    return BeamSearchOutput([
        BeamSearchSequence(
            tokens=list(output.prompt_token_ids) + list(c.token_ids),
            logprobs=list(c.logprobs or []),
            cum_logprob=c.cumulative_logprob or 0.0,
            text=c.text,
            finish_reason=c.finish_reason,
            stop_reason=c.stop_reason,
        )
        for c in output.outputs
    ])


class BeamSearchManager:
    """The engine's beam searches: routes their beams' core outputs and advances them."""

    def __init__(self, scheduler: Scheduler, tokenizer: Any, eos_token_ids: set[int], max_model_len: int) -> None:
        self.scheduler = scheduler
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.searches: dict[str, BeamSearch] = {}  # by user request id
        self._by_core_id: dict[str, BeamSearch] = {}

    def add(self, request_id: str, prompt: ProcessedPrompt, params: BeamSearchParams,
            arrival_time: float | None, priority: int) -> None:
        if request_id in self.searches:
            raise ValueError(f"Request id {request_id!r} is already in use.")
        arrival = time.monotonic() if arrival_time is None else arrival_time
        search = BeamSearch(request_id, prompt, params, self.eos_token_ids, self.max_model_len, arrival, priority)
        root = search.start()
        self.scheduler.add_request(root)
        self.searches[request_id] = search
        self._by_core_id[root.request_id] = search

    def has_unfinished(self) -> bool:
        return bool(self.searches)

    def process(self, core_outputs: list[EngineCoreOutput]) -> tuple[list[RequestOutput], list[EngineCoreOutput]]:
        """Take the beams' core outputs, advance every search whose beams all reported; returns
        the finished searches' outputs and the core outputs that are not beams'."""
        rest, touched = [], {}
        for out in core_outputs:
            search = self._by_core_id.get(out.request_id)
            if search is None:
                rest.append(out)
                continue
            search.on_output(out)
            touched[search.request_id] = search
        finished = []
        for search in touched.values():
            if not search.ready:
                continue
            for rid in search.core_request_ids():
                del self._by_core_id[rid]
            if search.advance(self.scheduler):
                del self.searches[search.request_id]
                finished.append(search.result(self.tokenizer))
            else:
                self._by_core_id.update((rid, search) for rid in search.core_request_ids())
        return finished, rest

    def abort(self, request_ids: Iterable[str]) -> None:
        for request_id in request_ids:
            search = self.searches.pop(request_id, None)
            if search is None:
                continue
            core_ids = search.core_request_ids()
            for rid in core_ids:
                self._by_core_id.pop(rid, None)
            self.scheduler.finish_requests(core_ids, RequestStatus.FINISHED_ABORTED)
