"""A JSON schema nested too deeply is the caller's error (400 naming the field), never a 500.

Found by a fuzzing review: ~110-150 levels of items/properties/anyOf made jsonschema's
check_schema raise RecursionError, on the engine thread (response_format, guided_json,
structured_outputs.json) or on the event loop (tools[].function.parameters)."""

from __future__ import annotations

import json
import sys

import httpx
import pytest

from folio.demo.tokenizer import CHATML_TEMPLATE
from folio.entrypoints.openai.cli_args import ServerConfig
from folio.sampling_params import SamplingParamsError
from folio.structured_output.spec import MAX_SCHEMA_DEPTH, json_depth, parse_json_schema
from tests.helpers.checkpoints import tiny_model_dir
from tests.server.harness import ServerThread, api_error, make_engine

MESSAGES = [{"role": "user", "content": "Hi"}]


def items(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "array", "items": schema}
    return schema


def properties(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def any_of(levels: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(levels):
        schema = {"anyOf": [schema]}
    return schema


def tool(parameters: dict) -> dict:
    return {"type": "function", "function": {"name": "f", "parameters": parameters}}


def response_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


# ---- the check itself -------------------------------------------------------------------------


def test_the_depth_limit_is_exact_and_counts_objects_and_arrays():
    assert json_depth(items(2)) == 3 and json_depth(True) == 0 and json_depth({"a": [1, [2]]}) == 3
    parse_json_schema(items(MAX_SCHEMA_DEPTH - 1))  # MAX_SCHEMA_DEPTH levels: accepted
    with pytest.raises(SamplingParamsError, match="nested too deeply") as info:
        parse_json_schema(items(MAX_SCHEMA_DEPTH))
    assert info.value.param == "structured_outputs"


@pytest.mark.parametrize("schema", [items(150), properties(150), any_of(150), json.dumps(items(500)),
                                    "[" * 100_000 + "]" * 100_000, '{"a":' * 100_000 + "1" + "}" * 100_000])
def test_deep_schemas_are_refused_not_recursion_errors(schema):
    with pytest.raises(SamplingParamsError, match="nested too deeply"):
        parse_json_schema(schema)


def test_a_recursion_error_from_a_deep_caller_is_the_same_error():
    def deep(frames: int):
        return deep(frames - 1) if frames else parse_json_schema(items(MAX_SCHEMA_DEPTH - 1))

    frame, here = sys._getframe(), 0
    while frame is not None:
        frame, here = frame.f_back, here + 1
    with pytest.raises(SamplingParamsError, match="nested too deeply"):  # within the limit, but
        deep(sys.getrecursionlimit() - here - 150)  # ~150 frames left: too few for check_schema


@pytest.mark.parametrize("schema", [items(30), properties(30), any_of(30)])
def test_depth_30_is_fine(schema):
    assert parse_json_schema(schema) == schema


# ---- through the server -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = tiny_model_dir(tmp_path_factory, "llama", "depth-llama")
    with ServerThread(make_engine(path, max_model_len=512), ServerConfig(chat_template=CHATML_TEMPLATE)) as running:
        yield running


def chat(server, **body) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 4, **body},
                      timeout=120)


@pytest.mark.parametrize(
    "body, param",
    [
        (dict(response_format=response_format(items(150))), "structured_outputs"),
        (dict(response_format=response_format(properties(150))), "structured_outputs"),
        (dict(guided_json=any_of(150)), "structured_outputs"),
        (dict(guided_json=json.dumps(items(500))), "structured_outputs"),
        (dict(structured_outputs={"json": items(150)}), "structured_outputs"),
        (dict(tools=[tool(items(150))], tool_choice="required"), "tools"),
        # within the limit alone, past it once "required" wraps it in the list of calls
        (dict(tools=[tool(items(MAX_SCHEMA_DEPTH - 2))], tool_choice="required"), "tools"),
        (dict(tools=[tool(properties(150))], tool_choice={"type": "function", "function": {"name": "f"}}), "tools"),
    ],
)
def test_a_deep_schema_is_a_400_naming_the_field(server, body, param):
    error = api_error(chat(server, **body), 400)
    assert error["param"] == param and "nested too deeply" in error["message"], error
    assert chat(server).status_code == 200  # the server still serves


def test_a_deep_schema_in_completions_is_a_400(server):
    r = httpx.post(f"{server.url}/v1/completions", json={"prompt": "Hi", "max_tokens": 4, "guided_json": items(150)},
                   timeout=120)
    assert api_error(r, 400)["param"] == "structured_outputs"


@pytest.mark.parametrize("body", [dict(response_format=response_format(items(30))),
                                  dict(guided_json=properties(30)),
                                  dict(tools=[tool(items(30))], tool_choice="required"),
                                  dict(tools=[tool(properties(30))], tool_choice={"type": "function", "function": {"name": "f"}})])
def test_a_schema_30_levels_deep_still_works(server, body):
    r = chat(server, **body)
    assert r.status_code == 200, r.text
