"""Which backend serves a constraint, and what a refusal says: disable_fallback keeps "auto" on
xgrammar (vLLM's meaning), also for a spec the cache already sent to guidance; advice about
keywords xgrammar does not enforce names guidance only where guidance takes the schema; and
keywords xgrammar ignores are refused inside a structural tag as in a json constraint."""

from __future__ import annotations

import json

import pytest

from folio import LLM
from folio.config.structured_outputs import StructuredOutputsConfig
from folio.sampling_params import SamplingParams, SamplingParamsError, StructuredOutputsParams
from folio.structured_output.manager import StructuredOutputManager
from folio.structured_output.spec import GrammarSpec
from tests.helpers.tokenizers import test_tokenizer

# xgrammar refuses it (strict mode closes the object: 2 > 0 properties); llguidance takes it.
MIN_PROPERTIES = {"type": "object", "minProperties": 2}
# xgrammar ignores an allOf beside other keywords; llguidance enforces it.
LOOSE_ALL_OF = {"type": "integer", "allOf": [{"minimum": 500}]}
# Neither backend enforces these.
UNENFORCED = [{"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
              {"not": {"type": "null"}},
              {"if": {"type": "integer"}, "then": {"minimum": 3}}]


def _manager(backend: str) -> StructuredOutputManager:
    tokenizer = test_tokenizer()
    return StructuredOutputManager(StructuredOutputsConfig(backend=backend), tokenizer, 1000, {tokenizer.eos_token_id})


@pytest.fixture(scope="module")
def auto():
    manager = _manager("auto")
    yield manager
    manager.shutdown()


@pytest.fixture(scope="module")
def xgrammar():
    manager = _manager("xgrammar")
    yield manager
    manager.shutdown()


def _params(**constraint) -> SamplingParams:
    return SamplingParams(structured_outputs=StructuredOutputsParams(**constraint))


def _tag(inner: dict) -> str:
    return json.dumps({"type": "structural_tag", "structures": [{"begin": "<f>", "schema": inner, "end": "</f>"}], "triggers": ["<f>"]})


def _refusal(manager: StructuredOutputManager, **constraint) -> str:
    with pytest.raises(SamplingParamsError) as info:
        manager.check(_params(**constraint))
    assert info.value.param == "structured_outputs"
    return str(info.value)


# ---- disable_fallback ---------------------------------------------------------------------------
@pytest.mark.parametrize("constraint", [dict(json=MIN_PROPERTIES), dict(regex=r"\p{Lu}{3}"), dict(json=LOOSE_ALL_OF)])
def test_disable_fallback_keeps_auto_on_xgrammar(auto, constraint):
    spec = auto.check(_params(**constraint))
    assert auto._backend_for(spec).name == "guidance"  # without the flag: vLLM's fallback
    message = _refusal(auto, **constraint, disable_fallback=True)
    assert "xgrammar backend refused" in message and "disable_fallback" in message, message


def test_disable_fallback_is_part_of_the_cache_key(auto):
    """A compiled fallback grammar cached for the schema is not reused for the flagged request."""
    schema = dict(MIN_PROPERTIES, title="cached")
    spec = auto.check(_params(json=schema))
    auto.park("user-1", [], spec)  # compiles it on guidance and caches it
    assert GrammarSpec.from_params(StructuredOutputsParams(json=schema, disable_fallback=True)) != spec
    assert "disable_fallback" in _refusal(auto, json=schema, disable_fallback=True)
    auto.abort(["user-1"])


def test_disable_fallback_on_the_structural_path(auto):
    """A structural tag xgrammar refuses names the flag too (guidance takes no structural tag)."""
    message = _refusal(auto, structural_tag=_tag(MIN_PROPERTIES), disable_fallback=True)
    assert "disable_fallback" in message and "minProperties" in message, message


def test_disable_fallback_changes_nothing_xgrammar_takes(auto, xgrammar):
    for manager in (auto, xgrammar):
        spec = manager.check(_params(regex="[ab]{2}", disable_fallback=True))
        assert manager._backend_for(spec).name == "xgrammar"


# ---- advice about unenforced keywords -----------------------------------------------------------
@pytest.mark.parametrize("schema", UNENFORCED)
@pytest.mark.parametrize("backend", ["auto", "xgrammar"])
def test_keywords_no_backend_enforces_suggest_no_backend(request, backend, schema):
    message = _refusal(request.getfixturevalue(backend), json=schema)
    assert "No backend enforces" in message and 'backend "guidance"' not in message, message


@pytest.mark.parametrize("disable_fallback", [False, True])
def test_keywords_guidance_enforces_suggest_guidance(auto, xgrammar, disable_fallback):
    message = _refusal(xgrammar, json=LOOSE_ALL_OF, disable_fallback=disable_fallback)
    assert 'backend "guidance"' in message and "allOf" in message, message
    message = _refusal(auto, json=dict(LOOSE_ALL_OF, title="flagged"), disable_fallback=True)
    assert 'backend "guidance"' in message and "disable_fallback is set" in message, message


@pytest.mark.parametrize("backend", ["auto", "xgrammar"])
def test_keywords_xgrammar_ignores_are_refused_inside_a_structural_tag(request, backend):
    message = _refusal(request.getfixturevalue(backend), structural_tag=_tag(UNENFORCED[0]))
    assert "uniqueItems" in message and "No backend enforces" in message, message


# ---- end to end ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_generate_honours_disable_fallback(checkpoint):
    llm = LLM(model=checkpoint, dtype="float32", device="cpu", max_model_len=512, seed=0)
    (ok,) = llm.generate("x", SamplingParams(max_tokens=40, structured_outputs=StructuredOutputsParams(
        json=MIN_PROPERTIES, disable_any_whitespace=True)), use_tqdm=False)  # on guidance
    assert ok.outputs[0].text.startswith("{")
    flagged = StructuredOutputsParams(json=MIN_PROPERTIES, disable_any_whitespace=True, disable_fallback=True)
    with pytest.raises(SamplingParamsError, match="disable_fallback"):
        llm.generate("x", SamplingParams(max_tokens=40, structured_outputs=flagged), use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
