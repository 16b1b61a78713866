"""A constraint that compiles but admits no output fails its request with a message for the user:
offline, the request id is folio's internal counter, which means nothing to the caller."""

from __future__ import annotations

import pytest

from folio import LLM
from folio.sampling_params import SamplingParams, SamplingParamsError, StructuredOutputsParams

pytestmark = pytest.mark.slow


def test_unsatisfiable_constraint_message_names_no_internal_request_id(checkpoint):
    llm = LLM(model=checkpoint, dtype="float32", device="cpu", max_model_len=512, seed=0)
    params = SamplingParams(max_tokens=5, structured_outputs=StructuredOutputsParams(grammar="root ::= root"))
    with pytest.raises(SamplingParamsError, match="admits no output") as info:
        llm.generate("x", params, use_tqdm=False)
    assert "Request '" not in str(info.value) and "request '" not in str(info.value), str(info.value)
