"""The xgrammar backend (vLLM's default): JSON schema, regex, choice, EBNF, structural tags."""

from __future__ import annotations

import functools
import json
import re
import time
from typing import Any

import torch
import xgrammar as xgr

from folio.structured_output.backend import GrammarTimer, UnenforcedKeywordsError
from folio.structured_output.spec import GrammarSpec, schema_keywords, schema_nodes, tag_schemas

# Keywords xgrammar 0.2.8 accepts but does not enforce (its grammar is the same without them):
# refused rather than silently ignored ("auto" then tries llguidance, which enforces allOf and
# refuses not). `not` found by a review that validated outputs with jsonschema (session 22).
XGRAMMAR_IGNORED_KEYWORDS = frozenset({
    "uniqueItems", "contains", "propertyNames", "dependentRequired", "dependentSchemas",
    "if", "then", "else", "unevaluatedProperties", "unevaluatedItems", "not",
})
# allOf is enforced in its one-element form with only annotations beside it (Pydantic's
# {"allOf": [{"$ref": ...}], "description": ...}); with several elements, or beside other keywords
# (`{"type": "integer", "allOf": [...]}` admitted null), xgrammar ignores it (session 22).
ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment", "deprecated", "readOnly", "writeOnly"})


class XGrammarState:
    """A GrammarState over xgrammar's GrammarMatcher."""

    def __init__(self, matcher: xgr.GrammarMatcher, timer: GrammarTimer) -> None:
        self.matcher = matcher
        self.timer = timer

    def accept_token(self, token_id: int) -> bool:
        start = time.perf_counter()
        accepted = self.matcher.accept_token(token_id)
        self.timer.add_since(start)
        return accepted

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        start = time.perf_counter()
        self.matcher.fill_next_token_bitmask(bitmask, row)
        self.timer.add_since(start)

    @staticmethod
    def fill_many(states: list[XGrammarState], bitmask: torch.Tensor, rows: list[int]) -> None:
        """Fill many rows at once on xgrammar's own threads (it releases the GIL)."""
        if not states:
            return
        start = time.perf_counter()
        _batch_matcher().batch_fill_next_token_bitmask([s.matcher for s in states], bitmask, rows)
        states[0].timer.add_since(start)

    def rollback(self, num_tokens: int) -> None:
        self.matcher.rollback(num_tokens)

    def reset(self) -> None:
        self.matcher.reset()

    def is_terminated(self) -> bool:
        return self.matcher.is_terminated()


@functools.cache
def _batch_matcher() -> xgr.BatchGrammarMatcher:
    return xgr.BatchGrammarMatcher(max_threads="auto")


class XGrammarCompiled:
    def __init__(self, compiled: xgr.CompiledGrammar, timer: GrammarTimer) -> None:
        self.compiled = compiled
        self.timer = timer

    def new_state(self) -> XGrammarState:
        # xgrammar keeps unlimited rollback history: speculative tokens can always be taken back.
        return XGrammarState(xgr.GrammarMatcher(self.compiled), self.timer)


class XGrammarBackend:
    name = "xgrammar"

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: set[int], timer: GrammarTimer, max_threads: int = 2) -> None:
        # vocab_size is the model's (logit rows may be padded past the tokenizer's ids: those
        # are never allowed); the stop tokens are the ones that end the request (EOS ids).
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=sorted(stop_token_ids))
        self.compiler = xgr.GrammarCompiler(info, max_threads=max_threads)
        self.timer = timer

    def check(self, spec: GrammarSpec) -> None:
        ignored = sorted(set().union(*map(_unenforced, _json_schemas(spec))))
        if ignored:
            # The manager adds which backend, if any, would enforce them (it knows the config).
            raise UnenforcedKeywordsError(f"The xgrammar backend cannot enforce JSON schema keyword(s) {', '.join(ignored)}.")
        grammar_of(spec)

    def compile(self, spec: GrammarSpec) -> XGrammarCompiled:
        return XGrammarCompiled(self.compiler.compile_grammar(grammar_of(spec)), self.timer)


def _json_schemas(spec: GrammarSpec) -> list[Any]:
    """The JSON schemas a spec holds: a json constraint's, or those inside a structural tag
    (xgrammar converts them with the same code, so they ignore the same keywords)."""
    if spec.kind == "json":
        return [json.loads(spec.value)]
    return tag_schemas(spec.value) if spec.kind == "structural_tag" else []


def _unenforced(schema: Any) -> set[str]:
    """The keywords of schema that xgrammar would accept but not enforce."""
    return (schema_keywords(schema) & XGRAMMAR_IGNORED_KEYWORDS) | _loose_all_of(schema)


def _loose_all_of(schema: Any) -> set[str]:
    """{"allOf"} where the schema uses allOf in a form xgrammar does not enforce, else empty."""
    for node in schema_nodes(schema):
        parts = node.get("allOf")
        if parts is not None and (not isinstance(parts, list) or len(parts) != 1 or set(node) - {"allOf"} - ANNOTATIONS):
            return {"allOf"}
    return set()


# "[09:14:32] /project/cpp/grammar_parser.cc:820: " before xgrammar's messages: not the user's concern.
_XGRAMMAR_LOCATION = re.compile(r"\[[\d:]+\] \S+:\d+: ")


def grammar_of(spec: GrammarSpec) -> xgr.Grammar:
    """The xgrammar Grammar of a spec (no tokenizer needed); ValueError if it does not parse."""
    try:
        return _build(spec)
    except ValueError:
        raise
    except Exception as e:  # xgrammar reports parse errors as RuntimeError and its own types
        message = _XGRAMMAR_LOCATION.sub("", str(e)).strip()
        raise ValueError(f"Invalid {spec.kind} for structured outputs: {message}") from None


def _build(spec: GrammarSpec) -> xgr.Grammar:
    if spec.kind == "json":
        return xgr.Grammar.from_json_schema(spec.value, any_whitespace=spec.any_whitespace, strict_mode=True)
    if spec.kind == "json_object":
        return xgr.Grammar.from_json_schema('{"type": "object"}', any_whitespace=spec.any_whitespace)
    if spec.kind == "regex":
        return xgr.Grammar.from_regex(spec.value)
    if spec.kind == "grammar":
        return xgr.Grammar.from_ebnf(spec.value)
    if spec.kind == "choice":
        return xgr.Grammar.from_ebnf(choice_ebnf(json.loads(spec.value)))
    if spec.kind == "structural_tag":
        return xgr.Grammar.from_structural_tag(json.dumps(current_structural_tag(json.loads(spec.value))))
    raise ValueError(f"Unknown structured output kind {spec.kind!r}.")


def choice_ebnf(choices: list[str]) -> str:
    """An EBNF grammar whose language is exactly the given strings."""
    # JSON string escapes (\" \\ \n \uXXXX) are the escapes EBNF string literals accept.
    return "root ::= " + " | ".join(json.dumps(c) for c in choices)


def current_structural_tag(tag: Any) -> Any:
    """vLLM's legacy structural tag ({"structures": [{"begin", "schema", "end"}], "triggers"})
    in the format xgrammar 0.2 reads ({"format": {"type": "triggered_tags", ...}}); a tag in
    the current format is returned unchanged."""
    if not isinstance(tag, dict) or "format" in tag or "structures" not in tag:
        return tag
    tags = [
        {"begin": s.get("begin"), "content": {"type": "json_schema", "json_schema": s.get("schema", {})}, "end": s.get("end")}
        for s in tag.get("structures") or []
    ]
    return {"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": tag.get("triggers", []), "tags": tags}}
