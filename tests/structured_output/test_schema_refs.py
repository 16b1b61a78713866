"""A JSON schema's $ref outside the schema (a URL, another file) is refused: no backend fetches it,
so that part of the output would go unconstrained while the client believes it is enforced."""

from __future__ import annotations

import json

import pytest

from folio.config.structured_outputs import StructuredOutputsConfig
from folio.sampling_params import SamplingParams, SamplingParamsError, StructuredOutputsParams
from folio.structured_output import manager as manager_module
from folio.structured_output.spec import local_refs


class _AcceptsAll:
    def check(self, spec) -> None:
        pass


@pytest.fixture
def manager(monkeypatch):
    monkeypatch.setattr(manager_module, "make_backend", lambda *args: _AcceptsAll())
    manager = manager_module.StructuredOutputManager(StructuredOutputsConfig(backend="xgrammar"), object(), 8, {0})
    yield manager
    manager.shutdown()


@pytest.mark.parametrize("schema", [
    {"$ref": "http://example.com/x.json"},
    {"$ref": "other.json"},
    {"type": "object", "properties": {"a": {"anyOf": [{"type": "null"}, {"$ref": "https://x.example/y#/a"}]}}},
    {"type": "array", "items": {"$ref": "defs.json#/$defs/item"}, "$defs": {"item": {"type": "string"}}},
    {"type": "object", "properties": {"a": {"$dynamicRef": "https://x.example/meta#items"}}},
    {"type": "object", "properties": {"a": {"$recursiveRef": "other.json"}}},
])
def test_a_reference_outside_the_schema_is_a_400_naming_structured_outputs(manager, schema):
    params = SamplingParams(structured_outputs=StructuredOutputsParams(json=schema))
    with pytest.raises(SamplingParamsError, match="outside the schema") as error:
        manager.check(params)
    assert error.value.param == "structured_outputs"


@pytest.mark.parametrize("schema", [
    {"$defs": {"a": {"type": "string"}}, "type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}},
    {"type": "object", "properties": {"next": {"$ref": "#"}}},
    {"type": "object", "properties": {"name": {"type": "string", "description": "see http://example.com/$ref"}}},
])
def test_local_references_pass(manager, schema):
    assert manager.check(SamplingParams(structured_outputs=StructuredOutputsParams(json=schema))) is not None


def _tag(schema) -> str:
    import json

    return json.dumps({"structures": [{"begin": "<a>", "schema": schema, "end": "</a>"}], "triggers": ["<a>"]})


def test_a_structural_tag_gets_the_same_checks_for_its_schemas(manager):
    """A review of the fixes: schemas inside a structural tag skipped both the external-$ref refusal
    and the depth cap (xgrammar then built a 400-level schema for 2.4 s on the engine thread)."""
    deep: object = {"type": "string"}
    for _ in range(200):
        deep = {"type": "array", "items": deep}
    for schema, match in (({"$ref": "http://example.com/x.json"}, "outside the schema"), (deep, "nested too deeply"),
                          ({"type": 5}, "Invalid JSON schema")):
        with pytest.raises(SamplingParamsError, match=match) as error:
            manager.check(SamplingParams(structured_outputs=StructuredOutputsParams(structural_tag=_tag(schema))))
        assert error.value.param == "structured_outputs"
    ok = {"type": "object", "properties": {"a": {"$ref": "#/$defs/b"}}, "$defs": {"b": {"type": "string"}}}
    assert manager.check(SamplingParams(structured_outputs=StructuredOutputsParams(structural_tag=_tag(ok))))


_BY_ID = {
    "$id": "https://example.com/person.json", "type": "object", "required": ["age", "pet"],
    "properties": {"age": {"$ref": "https://example.com/person.json#/$defs/age"},
                   "pet": {"$ref": "person.json#/$defs/pet"}},
    "$defs": {"age": {"type": "integer"}, "pet": {"enum": ["cat", "dog"]}},
}


def test_a_reference_through_the_roots_id_is_local(manager):
    """A second review: an absolute $ref equal to the schema's own $id was refused as external. It
    is local; the backends do not resolve it (xgrammar warns and leaves it unconstrained), so the
    spec carries it as "#/..."."""
    spec = manager.check(SamplingParams(structured_outputs=StructuredOutputsParams(json=_BY_ID)))
    props = json.loads(spec.value)["properties"]
    assert props == {"age": {"$ref": "#/$defs/age"}, "pet": {"$ref": "#/$defs/pet"}}
    assert _BY_ID["properties"]["age"]["$ref"].startswith("https://")  # the caller's dict is not touched


@pytest.mark.parametrize("schema", [
    {**_BY_ID, "properties": {"age": {"$ref": "https://example.com/other.json#/$defs/age"}}},  # another document
    {**_BY_ID, "properties": {"age": {"$id": "https://elsewhere.example/", "$ref": "person.json#/$defs/age"}}},
])
def test_references_to_other_documents_stay_refused(manager, schema):
    with pytest.raises(SamplingParamsError, match="outside the schema"):
        manager.check(SamplingParams(structured_outputs=StructuredOutputsParams(json=schema)))


def test_local_refs_rewrites_every_reference_keyword_and_leaves_the_rest():
    schema = {"$id": "urn:example:s", "$defs": {"a": {"type": "string"}},
              "properties": {"x": {"$ref": "urn:example:s#/$defs/a"}, "y": {"$dynamicRef": "urn:example:s"},
                             "z": {"$ref": "#/$defs/a"}, "w": {"const": {"$ref": "urn:example:s"}}}}
    props = local_refs(schema)["properties"]
    assert props["x"] == {"$ref": "#/$defs/a"} and props["y"] == {"$dynamicRef": "#"}
    assert props["z"] == {"$ref": "#/$defs/a"} and props["w"] == {"const": {"$ref": "urn:example:s"}}  # data, not a schema
    unchanged = {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}}
    assert local_refs(unchanged) is unchanged
