"""The llguidance backend ("guidance"): JSON schema, regex, choice and EBNF (converted to Lark)."""

from __future__ import annotations

import json
import time
from typing import Any

import llguidance
import llguidance.hf
import llguidance.torch
import torch
from llguidance import LLMatcher
from llguidance.gbnf_to_lark import gbnf_to_lark

from folio.structured_output.backend import GrammarTimer
from folio.structured_output.spec import GrammarSpec


class GuidanceState:
    """A GrammarState over llguidance's LLMatcher."""

    def __init__(self, matcher: LLMatcher, timer: GrammarTimer) -> None:
        self.matcher = matcher
        self.timer = timer

    def accept_token(self, token_id: int) -> bool:
        start = time.perf_counter()
        accepted = self.matcher.consume_token(token_id) and not self.matcher.is_error()
        self.timer.add_since(start)
        return accepted

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        start = time.perf_counter()
        llguidance.torch.fill_next_token_bitmask(self.matcher, bitmask, row)
        self.timer.add_since(start)

    def rollback(self, num_tokens: int) -> None:
        self.matcher.rollback(num_tokens)

    def reset(self) -> None:
        self.matcher.reset()

    def is_terminated(self) -> bool:
        return self.matcher.is_stopped()


class GuidanceCompiled:
    def __init__(self, tokenizer: Any, grammar: str, timer: GrammarTimer) -> None:
        self.tokenizer = tokenizer
        self.grammar = grammar
        self.timer = timer

    def new_state(self) -> GuidanceState:
        return GuidanceState(LLMatcher(self.tokenizer, self.grammar), self.timer)


class GuidanceBackend:
    name = "guidance"

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: set[int], timer: GrammarTimer) -> None:
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=sorted(stop_token_ids))
        self.timer = timer

    def check(self, spec: GrammarSpec) -> None:
        checked_grammar(spec, self.tokenizer)

    def compile(self, spec: GrammarSpec) -> GuidanceCompiled:
        return GuidanceCompiled(self.tokenizer, checked_grammar(spec, self.tokenizer), self.timer)


def checked_grammar(spec: GrammarSpec, tokenizer: Any = None) -> str:
    """llguidance's grammar text for a spec, validated; ValueError if llguidance refuses it.
    Without a tokenizer only the checks that need none run (a JSON schema's keywords, a regex's
    syntax): enough to tell whether guidance would take a spec, without building its tables."""
    grammar = grammar_of(spec)
    error = LLMatcher.validate_grammar(grammar, tokenizer)
    if error:
        raise ValueError(f"Invalid {spec.kind} for structured outputs: {error.strip()}")
    return grammar


def grammar_of(spec: GrammarSpec) -> str:
    """llguidance's grammar text for a spec; ValueError for what it cannot express."""
    whitespace = {"whitespace_flexible": spec.any_whitespace}
    if spec.kind == "json":
        return LLMatcher.grammar_from_json_schema(spec.value, defaults=whitespace)
    if spec.kind == "json_object":
        return LLMatcher.grammar_from_json_schema('{"type": "object"}', defaults=whitespace)
    if spec.kind == "regex":
        return LLMatcher.grammar_from_regex(spec.value)
    if spec.kind == "choice":
        return LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in json.loads(spec.value)))
    if spec.kind == "grammar":
        try:
            return LLMatcher.grammar_from_lark(gbnf_to_lark(spec.value))
        except Exception as e:  # the converter raises plain Exceptions for undefined rules
            raise ValueError(f"Invalid grammar for structured outputs: {e}") from None
    raise ValueError(f'structured_outputs.{spec.kind} is not supported by the "guidance" backend; use "xgrammar".')
