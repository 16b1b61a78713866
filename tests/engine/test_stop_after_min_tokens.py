"""Stop strings wait for min_tokens whether a step brings one token or several (speculative
decoding's accepted drafts): the text is the same either way."""

from __future__ import annotations

import pytest

from folio.core.outputs import EngineCoreOutput
from folio.engine.output_processor import OutputProcessor
from folio.sampling_params import SamplingParams
from tests.helpers.tokenizers import test_tokenizer

PROMPT = [5, 6, 7, 8]
TOKENS = [40, 71, 52, 90, 63, 48, 77, 55]


def _text(steps: list[list[int]], stop: str, min_tokens: int) -> str:
    processor = OutputProcessor(test_tokenizer())
    params = SamplingParams(max_tokens=len(TOKENS), min_tokens=min_tokens, stop=[stop])
    processor.add_request("r", None, PROMPT, params, ["r"], [params], 1.0)
    text = None
    for i, ids in enumerate(steps):
        last = i == len(steps) - 1
        outputs, _ = processor.process_outputs([EngineCoreOutput("r", ids, finish_reason="length" if last else None)])
        if outputs:
            text = outputs[-1].outputs[0].text
            if outputs[-1].finished:
                break
    return text


@pytest.mark.parametrize("min_tokens", [0, 2, 3, 5])
def test_a_multi_token_step_stops_where_single_steps_do(min_tokens):
    full = test_tokenizer().decode(TOKENS)
    stops = sorted({c for c in full if not c.isspace()})
    assert stops
    for stop in stops:
        one_by_one = _text([[t] for t in TOKENS], stop, min_tokens)
        for cut in (1, 3, 4):  # a first step of 1, 3 or 4 tokens, then the rest at once
            together = _text([TOKENS[:cut], TOKENS[cut:]], stop, min_tokens)
            assert together == one_by_one, (stop, min_tokens, cut)
