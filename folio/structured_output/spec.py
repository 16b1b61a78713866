"""GrammarSpec: one request's constraint in a hashable form, the key grammars are cached by.

Also the checks that need no tokenizer and no backend: a JSON schema must parse and pass its
meta-schema (jsonschema), so a bad schema is the caller's error (ValueError, HTTP 400) before
any backend sees it.

A schema nested deeper than MAX_SCHEMA_DEPTH levels is refused the same way: jsonschema's
check_schema (and the code after it) recurses once per level, and a deep enough schema would
otherwise end in a RecursionError (HTTP 500) on the event loop or the engine thread.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from urllib.parse import urldefrag, urljoin
from typing import Any

import jsonschema

from folio.sampling_params import SamplingParamsError, StructuredOutputsParams


# The most levels of JSON objects and arrays a schema may nest (the root object is level 1).
# jsonschema's check_schema spends up to ~8 Python frames per level (measured: `items`, `not`,
# `contains`), so 64 levels use about 520 of Python's default 1000, leaving room for any caller's
# own stack (the server, an application using the offline LLM, pytest). Real schemas nest far
# less: 64 JSON levels are about 32 levels of `properties` (each level is the map and the schema).
MAX_SCHEMA_DEPTH = 64


@dataclass(frozen=True)
class GrammarSpec:
    kind: str  # one of sampling_params.STRUCTURED_OUTPUT_KINDS
    # The constraint as text: a JSON schema (JSON in the schema's own key order: the grammar
    # writes properties in the order the schema declares them, as vLLM does), a regex, an EBNF grammar, a
    # structural tag, or the JSON list of choices; "" for json_object.
    value: str
    any_whitespace: bool = True  # JSON kinds: whether free whitespace may appear between tokens
    # The request's disable_fallback, part of the key: a constraint that "auto" sent to guidance
    # is then never served from the cache to a request that forbids that fallback.
    disable_fallback: bool = False

    @classmethod
    def from_params(cls, params: StructuredOutputsParams, disable_any_whitespace: bool = False) -> GrammarSpec:
        """The spec of a request's StructuredOutputsParams; raises SamplingParamsError when the
        JSON schema is not valid JSON or not a valid schema."""
        any_whitespace = not (params.disable_any_whitespace or disable_any_whitespace)
        return cls(params.kind, _spec_value(params), any_whitespace, params.disable_fallback)


def _spec_value(params: StructuredOutputsParams) -> str:
    """GrammarSpec.value of the params' constraint, after the checks that need no backend."""
    kind = params.kind
    if kind == "json":
        schema = local_refs(parse_json_schema(params.json))
        if params.disable_additional_properties:
            schema = _closed_objects(schema)
        return json.dumps(schema)
    if kind == "json_object":
        return ""
    if kind == "choice":
        return json.dumps(params.choice)
    if kind == "structural_tag":
        for schema in tag_schemas(params.structural_tag):  # the same checks as a json constraint's
            parse_json_schema(schema)
    return getattr(params, kind)


def parse_json_schema(schema: str | dict[str, Any] | None) -> dict[str, Any] | bool:
    """The schema as an object, checked against its meta-schema; SamplingParamsError if not
    (also when it nests more than MAX_SCHEMA_DEPTH levels)."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise SamplingParamsError("structured_outputs", f"The JSON schema is not valid JSON: {e}.") from None
        except RecursionError:  # nested deeper than the JSON decoder goes
            raise _too_deep() from None
    if not isinstance(schema, (dict, bool)):
        raise SamplingParamsError("structured_outputs", "A JSON schema must be an object.")
    if json_depth(schema) > MAX_SCHEMA_DEPTH:
        raise _too_deep()
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as e:
        raise SamplingParamsError("structured_outputs", f"Invalid JSON schema: {e.message}.") from None
    except RecursionError:  # a caller already deep in its own stack; never a 500
        raise _too_deep() from None
    return schema


def tag_schemas(tag: Any) -> list[Any]:
    """The JSON schemas inside a structural tag (its structures' "schema", or a format's
    "json_schema"), found without recursion; [] for a tag that is not JSON (the backend says why).
    A tag nested past MAX_SCHEMA_DEPTH (plus its own few levels) is refused like a deep schema."""
    try:
        tag = json.loads(tag) if isinstance(tag, str) else tag
    except json.JSONDecodeError:
        return []
    except RecursionError:
        raise _too_deep() from None
    if json_depth(tag) > MAX_SCHEMA_DEPTH + 8:
        raise _too_deep()
    found, stack = [], [tag]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            for key, value in node.items():
                if key in ("schema", "json_schema") and isinstance(value, (dict, bool)):
                    found.append(value)
                else:
                    stack.append(value)
    return found


def _too_deep() -> SamplingParamsError:
    return SamplingParamsError("structured_outputs", f"The JSON schema is nested too deeply: at most "
                               f"{MAX_SCHEMA_DEPTH} levels of objects and arrays.")


def json_depth(value: Any) -> int:
    """How many levels of objects and arrays a decoded JSON value nests (0 for a scalar), found
    without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if depth > MAX_SCHEMA_DEPTH:  # deep enough to refuse: no need to walk the rest
            break
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def _closed_objects(schema: Any) -> Any:
    """disable_additional_properties: every object schema that does not say otherwise gets
    additionalProperties false (vLLM's meaning), recursively."""
    if isinstance(schema, list):
        return [_closed_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    closed = {k: _closed_objects(v) for k, v in schema.items()}
    if (closed.get("type") == "object" or "properties" in closed) and "additionalProperties" not in closed:
        closed["additionalProperties"] = False
    return closed


REF_KEYWORDS = ("$ref", "$dynamicRef", "$recursiveRef")


def local_refs(schema: Any) -> Any:
    """The schema with references into its own document written as local ones.

    A reference that resolves against the root's `$id` to that same document ("https://x/s.json#/a",
    or "s.json#/a" under that `$id`) is local, but neither backend resolves it: xgrammar warns and
    leaves that part unconstrained. It becomes "#/a". A schema with an `$id` below its root is left
    as it is (its references resolve against other base URIs; a non-local one stays refused).
    Returns the caller's object itself when nothing changes (it is not mutated)."""
    if not isinstance(schema, dict) or not isinstance(schema.get("$id"), str):
        return schema
    nodes = schema_nodes(schema)
    if any("$id" in node for node in nodes[1:]):
        return schema
    document = urldefrag(schema["$id"]).url
    if not document:
        return schema
    schema = copy.deepcopy(schema)
    for node in schema_nodes(schema):
        for key in REF_KEYWORDS:
            ref = node.get(key)
            if isinstance(ref, str) and ref[:1] not in ("", "#"):
                target, fragment = urldefrag(urljoin(document, ref))
                if target == document:
                    node[key] = "#" + fragment
    return schema


# Keywords whose values are maps from names to schemas (their keys are not keywords).
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def schema_keywords(schema: Any) -> set[str]:
    """Every keyword used anywhere in a JSON schema (property names are not keywords)."""
    return {key for node in schema_nodes(schema) for key in node}


def schema_nodes(schema: Any) -> list[dict[str, Any]]:
    """Every (sub)schema object of a JSON schema, the root first."""
    nodes: list[dict[str, Any]] = []
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            nodes.append(node)
            for key, value in node.items():
                if key in _SCHEMA_MAPS and isinstance(value, dict):
                    stack.extend(value.values())
                elif key not in ("enum", "const", "default", "examples"):
                    stack.append(value)
    return nodes
