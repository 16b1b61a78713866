"""InputProcessor's prompt checks: every bad token id is refused by name, good prompts pass whole."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from folio.engine.input_processor import InputProcessor
from folio.sampling_params import SamplingParamsError


@pytest.fixture
def processor() -> InputProcessor:
    return InputProcessor(SimpleNamespace(vocab_size=100), None, set(), 5)


def test_a_long_valid_prompt_passes_whole(processor):
    ids = list(range(100)) * 300
    assert processor.process_prompt({"prompt_token_ids": ids}).token_ids == ids
    assert processor.process_prompt({"prompt_token_ids": (0, 99)}).token_ids == [0, 99]


@pytest.mark.parametrize(
    ("bad", "message"),
    [(100, "token id 100 is outside the vocabulary"), (-1, "token id -1 is outside"),
     (True, "must hold integers, got True"), (3.0, "must hold integers, got 3.0"), ("7", "got '7'")],
)
def test_every_kind_of_bad_id_is_refused_by_name(processor, bad, message):
    ids = [1] * 5000 + [bad] + [2] * 10
    with pytest.raises(SamplingParamsError, match=message) as err:
        processor.process_prompt({"prompt_token_ids": ids})
    assert err.value.param == "prompt_token_ids"


def test_a_prompt_that_is_not_a_list_is_refused(processor):
    with pytest.raises(ValueError, match="must be a list of integers"):
        processor.process_prompt({"prompt_token_ids": "1 2 3"})
