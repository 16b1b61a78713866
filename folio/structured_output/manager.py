"""StructuredOutputManager: requests wait here while their grammar compiles off the step loop.

The configured backend (xgrammar's tables over the whole vocabulary: about a second for a
150k-token tokenizer) is built on a worker thread when the engine starts, so neither the
engine's start nor the step loop waits for it; a request that arrives before it is ready waits
in `check` for the rest of that build.

A request with structured outputs is checked when it is added (`check`: a bad schema, regex or
grammar is a ValueError before anything is queued), then parked here while a worker thread
compiles its grammar; compiled grammars are cached by GrammarSpec, so the second request with
the same schema waits for nothing. Each step the engine takes the requests whose grammar is
ready, gives each sample its own GrammarState and hands them to the scheduler: a request never
blocks the step loop or the requests already running.
"""

from __future__ import annotations

import concurrent.futures as cf
import copy
import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from folio.config.structured_outputs import StructuredOutputsConfig
from folio.core.request import Request
from folio.logger import init_logger
from folio.sampling_params import SamplingParams, SamplingParamsError
from folio.structured_output.backend import CompiledGrammar, GrammarBackend, GrammarTimer, UnenforcedKeywordsError
from folio.structured_output.reasoning import AfterReasoning, reasoning_end_token, reasoning_ended
from folio.structured_output.spec import REF_KEYWORDS, GrammarSpec, schema_nodes, tag_schemas

logger = init_logger(__name__)

# Compiled grammars kept for reuse; a few MB at most for typical tool schemas.
MAX_CACHED_GRAMMARS = 512


@dataclass
class _Parked:
    request_id: str  # the user's request id
    requests: list[Request]  # its samples, in scheduling order (n > 1: parent first)
    compiled: cf.Future[CompiledGrammar]
    spec: GrammarSpec


@dataclass
class ReadyGrammars:
    requests: list[Request]  # grammar attached: hand them to the scheduler
    failed: list[tuple[str, list[str], Exception]]  # user id, core ids, why the compile failed


class StructuredOutputManager:
    def __init__(self, config: StructuredOutputsConfig, tokenizer: Any, vocab_size: int, stop_token_ids: set[int]) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = stop_token_ids
        self.timer = GrammarTimer()
        self._backends: dict[str, cf.Future[GrammarBackend]] = {}
        self._backends_lock = threading.Lock()
        self.backend_build_seconds: dict[str, float] = {}  # each backend's build, as it finished
        self._auto_choice: dict[GrammarSpec, str] = {}  # "auto": the backend that took each spec
        self._pool = cf.ThreadPoolExecutor(config.max_compile_threads, thread_name_prefix="folio-grammar")
        self._cache: OrderedDict[GrammarSpec, cf.Future[CompiledGrammar]] = OrderedDict()
        self._parked: list[_Parked] = []
        # (end, start) marker ids when grammars wait for the reasoning to end (reasoning.py)
        self._reasoning = None
        if config.reasoning_parser is not None and not config.enable_in_reasoning and tokenizer is not None:
            self._reasoning = reasoning_end_token(config.reasoning_parser, tokenizer)
        if tokenizer is not None:
            self._start_backend(self.default_backend_name)

    @property
    def default_backend_name(self) -> str:
        return "xgrammar" if self.config.backend == "auto" else self.config.backend

    @property
    def backend(self) -> GrammarBackend:
        """The configured backend ("auto": xgrammar, with guidance for what xgrammar refuses)."""
        return self._backend_named(self.default_backend_name)

    def _backend_named(self, name: str) -> GrammarBackend:
        """The backend, waiting for its build if it is under way (the default one starts with the
        engine; guidance, under "auto", on the first spec xgrammar refuses)."""
        if self.tokenizer is None:
            raise SamplingParamsError("structured_outputs", "Structured outputs need a tokenizer; this engine has none.")
        future = self._start_backend(name)
        error = future.exception()  # waits for the build
        if error is not None:
            # A copy per caller: raising the stored exception (future.result()) would add each
            # caller's frames to its traceback, keeping every failed request's frames alive.
            fresh = _fresh(error)
            if fresh is error:
                raise error
            raise fresh from error
        return future.result()

    def _start_backend(self, name: str) -> cf.Future[GrammarBackend]:
        with self._backends_lock:
            if name not in self._backends:
                self._backends[name] = future = self._pool.submit(self._build_backend, name)
                future.add_done_callback(_warn_if_failed)
            return self._backends[name]

    def _build_backend(self, name: str) -> GrammarBackend:
        start = time.perf_counter()
        backend = make_backend(name, self.tokenizer, self.vocab_size, self.stop_token_ids, self.timer)
        self.backend_build_seconds[name] = seconds = time.perf_counter() - start
        logger.info("Grammar backend %s ready in %.2f s (%d-token vocabulary)", name, seconds, self.vocab_size)
        return backend

    def _backend_for(self, spec: GrammarSpec) -> GrammarBackend:
        return self._backend_named(self._auto_choice[spec]) if spec in self._auto_choice else self.backend

    def _check_with_backends(self, spec: GrammarSpec) -> None:
        """The backend's check; under "auto", a spec xgrammar refuses goes to guidance if
        guidance takes it (vLLM's fallback), unless the request set disable_fallback: then, as
        in vLLM, xgrammar's refusal is the request's error."""
        try:
            self.backend.check(spec)
            return
        except ValueError as e:
            refusal = e
        guidance_refusal = None
        if self.config.backend == "auto" and not spec.disable_fallback:
            guidance_refusal = self._guidance_refusal(spec)
            if guidance_refusal is None:
                self._auto_choice[spec] = "guidance"
                return
        raise self._explained(refusal, spec, guidance_refusal)

    def _guidance_refusal(self, spec: GrammarSpec) -> str | None:
        """Why the guidance backend refuses spec, or None if it takes it."""
        try:
            self._backend_named("guidance").check(spec)
        except ValueError as e:
            return str(e)
        return None

    def _explained(self, refusal: ValueError, spec: GrammarSpec, guidance_refusal: str | None) -> ValueError:
        """The request's error for the configured backend's refusal: keywords xgrammar ignores get
        advice that is true of guidance, and under "auto" disable_fallback is named as the reason
        guidance was not tried. guidance_refusal: why guidance refused, if it was tried."""
        message = str(refusal)
        if isinstance(refusal, UnenforcedKeywordsError):
            if guidance_refusal is None:  # not tried: ask it without building its tables
                guidance_refusal = _guidance_would_refuse(spec)
            message += _keyword_advice(spec, guidance_refusal)
        if self.config.backend == "auto" and spec.disable_fallback:
            message = ("The xgrammar backend refused this constraint and disable_fallback is set, so it "
                       f"does not fall back to guidance: {message}")
        return refusal if message == str(refusal) else SamplingParamsError("structured_outputs", message)

    def check(self, params: SamplingParams) -> GrammarSpec | None:
        """The request's GrammarSpec (None without structured outputs); raises
        SamplingParamsError (a ValueError, param "structured_outputs") if it is invalid."""
        if params.structured_outputs is None:
            return None
        spec = GrammarSpec.from_params(params.structured_outputs, self.config.disable_any_whitespace)
        if spec in self._cache:
            return spec
        if spec.kind == "json":
            _refuse_external_refs(json.loads(spec.value))
        elif spec.kind == "structural_tag":
            for schema in tag_schemas(spec.value):
                _refuse_external_refs(schema)
        try:
            self._check_with_backends(spec)
        except SamplingParamsError:
            raise
        except ValueError as e:
            raise SamplingParamsError("structured_outputs", str(e)) from None
        return spec

    def park(self, request_id: str, requests: list[Request], spec: GrammarSpec) -> None:
        """Hold the samples of one request until their grammar is compiled."""
        self._parked.append(_Parked(request_id, requests, self._compile(spec), spec))

    def _compile(self, spec: GrammarSpec) -> cf.Future[CompiledGrammar]:
        future = self._cache.get(spec)
        if future is not None:
            self._cache.move_to_end(spec)
            return future
        future = self._pool.submit(self._backend_for(spec).compile, spec)
        self._cache[spec] = future
        if len(self._cache) > MAX_CACHED_GRAMMARS:
            self._cache.popitem(last=False)
        return future

    def take_ready(self) -> ReadyGrammars:
        """Requests whose compile finished, each sample with a fresh GrammarState."""
        ready = ReadyGrammars([], [])
        still: list[_Parked] = []
        for parked in self._parked:
            if not parked.compiled.done():
                still.append(parked)
                continue
            error = parked.compiled.exception()
            if error is not None:
                # Not cached: a failure may be transient (memory, a cancelled future); the next
                # request with this spec compiles it again rather than failing at once.
                if self._cache.get(parked.spec) is parked.compiled:
                    del self._cache[parked.spec]
                ready.failed.append((parked.request_id, [r.request_id for r in parked.requests], error))
                continue
            compiled = parked.compiled.result()
            for request in parked.requests:
                request.grammar = compiled.new_state()
            dead = no_first_token(parked.requests[0], self.vocab_size)
            if dead is not None:  # an empty "complete" output would be a lie: fail the request
                failed = UnsatisfiableConstraintError(dead)
                ready.failed.append((parked.request_id, [r.request_id for r in parked.requests], failed))
                continue
            self._after_reasoning(parked.requests)
            ready.requests.extend(parked.requests)
        self._parked = still
        return ready

    def _after_reasoning(self, requests: list[Request]) -> None:
        """With a reasoning parser, each sample's grammar waits for the end of its reasoning,
        unless the prompt already closed it (reasoning.py)."""
        if self._reasoning is None or reasoning_ended(requests[0].prompt_token_ids, *self._reasoning):
            return
        for request in requests:
            assert request.grammar is not None
            request.grammar = AfterReasoning(request.grammar, self._reasoning[0])

    def abort(self, request_ids: list[str]) -> None:
        """Forget parked requests (by user id) that were aborted before their grammar was ready."""
        gone = set(request_ids)
        self._parked = [p for p in self._parked if p.request_id not in gone]

    @property
    def has_parked(self) -> bool:
        return bool(self._parked)

    def wait(self, timeout: float) -> None:
        """Block until some parked grammar is compiled, at most timeout seconds (an engine
        with nothing else to run waits here instead of spinning)."""
        if self._parked:
            cf.wait([p.compiled for p in self._parked], timeout=timeout, return_when=cf.FIRST_COMPLETED)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _fresh(error: BaseException) -> BaseException:
    """A copy of error with no traceback yet; where it does not copy (an __init__ of other
    arguments), error itself with its traceback cleared: it then holds one caller's frames."""
    try:
        fresh = copy.copy(error)
    except Exception:  # noqa: BLE001 - any failure to copy: the fallback below
        fresh = None
    if type(fresh) is not type(error) or fresh is error or fresh.args != error.args:
        return error.with_traceback(None)
    return fresh.with_traceback(None)


def _warn_if_failed(future: cf.Future[GrammarBackend]) -> None:
    if not future.cancelled() and future.exception() is not None:
        logger.warning("The grammar backend could not be built (%s); structured-output requests will fail.", future.exception())


def make_backend(name: str, tokenizer: Any, vocab_size: int, stop_token_ids: set[int], timer: GrammarTimer) -> GrammarBackend:
    """The backend a config names; "auto" is xgrammar, as in vLLM."""
    if name == "guidance":
        from folio.structured_output.guidance_backend import GuidanceBackend

        return GuidanceBackend(tokenizer, vocab_size, stop_token_ids, timer)
    from folio.structured_output.xgrammar_backend import XGrammarBackend

    return XGrammarBackend(tokenizer, vocab_size, stop_token_ids, timer)


def _guidance_would_refuse(spec: GrammarSpec) -> str | None:
    """Why llguidance refuses spec (its checks that need no tokenizer), or None if it takes it."""
    from folio.structured_output.guidance_backend import checked_grammar

    try:
        checked_grammar(spec)
    except ValueError as e:
        return str(e)
    return None


def _keyword_advice(spec: GrammarSpec, guidance_refusal: str | None) -> str:
    """What to do about keywords xgrammar does not enforce: use guidance only where it takes the
    schema (it refuses `not`, `if`, `uniqueItems` and the like as well)."""
    if guidance_refusal is None:
        return (' The "guidance" backend enforces them: use structured_outputs_config backend "guidance" '
                '(or "auto" without disable_fallback), or drop them.')
    if spec.kind == "structural_tag":
        return " No backend enforces them in a structural tag (guidance takes no structural tags); drop them."
    return f" No backend enforces this schema (guidance refuses it too: {guidance_refusal}); drop them."


class UnsatisfiableConstraintError(ValueError):
    """The request's constraint compiled, but no output can satisfy it."""


def no_first_token(request: Request, vocab_size: int) -> str | None:
    """Why no output can begin under the request's compiled constraint (a grammar that admits no
    string, e.g. `root ::= root` or an empty character class, or one whose first tokens
    allowed_token_ids all excludes), or None. Checked once, when the grammar is attached."""
    import torch

    from folio.sample.grammar_mask import bitmask_words, unpack_bitmask

    assert request.grammar is not None
    mask = torch.zeros(1, bitmask_words(vocab_size), dtype=torch.int32)
    request.grammar.fill_bitmask(mask, 0)
    allowed = unpack_bitmask(mask, vocab_size)[0]  # [vocab] bool
    if not bool(allowed.any()):
        return "The structured output constraint admits no output: no token can begin it."
    ids = [i for i in request.sampling_params.allowed_token_ids or () if 0 <= i < vocab_size]
    if request.sampling_params.allowed_token_ids and not bool(allowed[ids].any()):
        return "No token in allowed_token_ids can begin the structured output."
    return None


def _refuse_external_refs(schema: Any) -> None:
    """Neither backend fetches a reference outside the schema (another file, a URL): it would leave
    that part of the output unconstrained, so it is a 400 (local "#/..." references are resolved)."""
    outside = sorted({(key, node[key]) for node in schema_nodes(schema) for key in REF_KEYWORDS
                      if isinstance(node.get(key), str) and node[key][:1] not in ("", "#")})
    if outside:
        key, ref = outside[0]
        raise SamplingParamsError("structured_outputs", f"JSON schema {key} {ref!r} points outside the "
                                  "schema; only local references (\"#/...\") are resolved.")
