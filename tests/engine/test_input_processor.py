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


def test_min_tokens_with_only_ending_tokens_allowed_is_refused():
    # Found by a review: min_tokens=8 with allowed_token_ids=[EOS] generated 8 EOS tokens.
    from folio.sampling_params import SamplingParams

    processor = InputProcessor(SimpleNamespace(vocab_size=100), None, {0, 2}, 5)
    with pytest.raises(SamplingParamsError, match="nothing can be generated") as err:
        processor.check_params(SamplingParams(min_tokens=8, allowed_token_ids=[0, 2]), 3)
    assert err.value.param == "allowed_token_ids"
    with pytest.raises(SamplingParamsError, match="nothing can be generated"):
        processor.check_params(SamplingParams(min_tokens=1, allowed_token_ids=[7], stop_token_ids=[7]), 3)
    processor.check_params(SamplingParams(min_tokens=8, allowed_token_ids=[0, 2], ignore_eos=True), 3)  # EOS is not an end
    processor.check_params(SamplingParams(min_tokens=8, allowed_token_ids=[0, 5]), 3)
    processor.check_params(SamplingParams(allowed_token_ids=[0]), 3)  # no min_tokens: EOS may end it at once


def test_min_tokens_with_every_token_a_stop_token_is_refused():
    # Found by a review (session 27): stop_token_ids covering the vocabulary with min_tokens=2
    # gave two EOS tokens and a 200.
    from folio.sampling_params import SamplingParams

    processor = InputProcessor(SimpleNamespace(vocab_size=10), None, {0}, 5)
    with pytest.raises(SamplingParamsError, match="nothing can be generated") as err:
        processor.check_params(SamplingParams(min_tokens=2, stop_token_ids=list(range(1, 10))), 3)
    assert err.value.param == "stop_token_ids"
    processor.check_params(SamplingParams(min_tokens=2, stop_token_ids=list(range(2, 10))), 3)  # 1 is left
    processor.check_params(SamplingParams(min_tokens=2, stop_token_ids=list(range(1, 10)), ignore_eos=True), 3)


def test_bad_words_that_ban_every_allowed_token_are_refused():
    # Found by a review (session 27): allowed_token_ids=[x] with bad_words=["x"] generated EOS,
    # a token outside allowed_token_ids, and answered 200.
    from folio.sampling_params import SamplingParams
    from tests.helpers.tokenizers import test_tokenizer

    tok = test_tokenizer()
    (word,) = tok.encode("x", add_special_tokens=False)
    (other,) = tok.encode("y", add_special_tokens=False)
    processor = InputProcessor(SimpleNamespace(vocab_size=len(tok)), tok, {tok.eos_token_id}, 5)
    with pytest.raises(SamplingParamsError, match="bans every token in allowed_token_ids") as err:
        processor.check_params(SamplingParams(allowed_token_ids=[word], bad_words=["x"]), 3)
    assert err.value.param == "bad_words"
    processor.check_params(SamplingParams(allowed_token_ids=[word, other], bad_words=["x"]), 3)
    processor.check_params(SamplingParams(bad_words=["x"]), 3)
    # the two causes together: bad_words bans x, min_tokens bans EOS (a review of the fix)
    eos = tok.eos_token_id
    with pytest.raises(SamplingParamsError, match="that min_tokens leaves"):
        processor.check_params(SamplingParams(allowed_token_ids=[word, eos], bad_words=["x"], min_tokens=3), 3)
    processor.check_params(SamplingParams(allowed_token_ids=[word, eos], bad_words=["x"]), 3)  # EOS may end it


# ---- found by a review (session of the input checks) ------------------------------------------
def _text_processor(vocab_size: int) -> InputProcessor:
    from tests.helpers.tokenizers import test_tokenizer

    return InputProcessor(SimpleNamespace(vocab_size=vocab_size, max_model_len=256), test_tokenizer(), set(), 5)


def test_a_text_prompt_is_checked_against_the_models_vocabulary():
    # A tokenizer larger than the model: the high id failed mid-step in torch.embedding.
    from tests.helpers.tokenizers import test_tokenizer

    text = "The capital of France is Paris, said the zebra."
    high = max(test_tokenizer().encode(text))
    processor = _text_processor(high)
    for prompt in (text, {"prompt": text}):
        with pytest.raises(SamplingParamsError, match=f"token id {high}, outside the model's vocabulary") as err:
            processor.process_prompt(prompt)
        assert err.value.param == "prompt"
    assert _text_processor(high + 1).process_prompt(text).token_ids == test_tokenizer().encode(text)


def _records_of(logger_name: str) -> tuple[list, object]:
    import logging

    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logging.getLogger(logger_name).addHandler(handler)  # folio's loggers do not propagate to caplog
    return records, handler


def test_a_tokenizer_larger_than_the_model_is_warned_about_at_start():
    import logging

    records, handler = _records_of("folio.engine.input_processor")
    try:
        _text_processor(1000)  # the test tokenizer's size: nothing to say
        _text_processor(5000)  # a model padded beyond its tokenizer: the usual case
        assert not records
        _text_processor(300)
    finally:
        logging.getLogger("folio.engine.input_processor").removeHandler(handler)
    assert len(records) == 1 and "vocab_size is 300" in records[0].getMessage()


@pytest.mark.parametrize("seed", [2**64 - 1, 2**64 - 2, -1, 7])
def test_sample_seeds_wrap_into_torchs_range(seed):
    # seed + i beyond 2**64 - 1 made torch.Generator.manual_seed fail mid-step, for the whole batch.
    import torch

    from folio.sampling_params import SamplingParams

    processor = _text_processor(1000)
    prompt = processor.process_prompt({"prompt_token_ids": [1, 2, 3]})
    requests = processor.make_requests("r", prompt, SamplingParams(n=3, seed=seed), arrival_time=0.0)
    seeds = [r.sampling_params.seed for r in requests]
    assert seeds == [(seed + i) % 2**64 for i in range(3)]
    for child in seeds:  # each one a seed torch takes, and the one seed + i means to torch
        torch.Generator().manual_seed(child)
    assert seeds[0] == torch.Generator().manual_seed(seed).initial_seed()


def test_params_changed_after_construction_are_checked_when_added():
    # sp.n = 3 returned one completion; temperature=nan ran; max_tokens="3" failed mid-step.
    from folio.sampling_params import SamplingParams

    processor = _text_processor(1000)
    params = SamplingParams()
    params.n = 3
    assert processor.check_params(params).best_of == 3
    prompt = processor.process_prompt({"prompt_token_ids": [1, 2, 3]})
    assert len(processor.make_requests("r", prompt, params, arrival_time=0.0)) == 3
    for field, value in [("temperature", float("nan")), ("max_tokens", "3")]:
        bad = SamplingParams()
        setattr(bad, field, value)
        with pytest.raises(SamplingParamsError) as err:
            processor.process_request({"prompt_token_ids": [1, 2]}, bad)
        assert err.value.param == field
