"""SamplingParams validation: every invalid value raises a ValueError that names its field."""

from __future__ import annotations

import math

import pytest

from folio.sampling_params import SamplingParams, SamplingParamsError

INVALID = [
    ("n", 0),
    ("n", 1.5),
    ("best_of", 1, {"n": 2}),
    ("presence_penalty", 2.5),
    ("frequency_penalty", -3.0),
    ("frequency_penalty", math.nan),
    ("repetition_penalty", 0.0),
    ("repetition_penalty", math.inf),
    ("temperature", -0.1),
    ("temperature", math.inf),
    ("temperature", "hot"),
    ("top_p", 0.0),
    ("top_p", 1.1),
    ("top_k", -2),
    ("top_k", 2.0),
    ("min_p", 1.5),
    ("seed", 2**64),
    ("seed", -(2**63) - 1),
    ("seed", "42"),
    ("max_tokens", 0),
    ("min_tokens", -1),
    ("min_tokens", 10, {"max_tokens": 5}),
    ("logprobs", -1),
    ("prompt_logprobs", -1),
    ("stop", ""),
    ("stop", ["ok", 3]),
    ("stop_token_ids", 7),
    ("stop_token_ids", [1, -2]),
    ("allowed_token_ids", []),
    ("allowed_token_ids", 5),
    ("allowed_token_ids", [1, "2"]),
    ("logit_bias", {1: 101.0}),
    ("logit_bias", {"x": 1.0}),
    ("logit_bias", {-1: 1.0}),
    ("logit_bias", [1, 2]),
    # found by a review: coerced or read by truthiness before
    ("logit_bias", {1.7: 1.0}),
    ("logit_bias", {True: 1.0}),
    # read by int() before: "1_0" as token 10, " 5" / "05" / a full-width digit as token 5
    ("logit_bias", {"1_0": 1.0}),
    ("logit_bias", {" 5": 1.0}),
    ("logit_bias", {"05": 1.0}),
    ("logit_bias", {"\uff15": 1.0}),
    ("logit_bias", {"+5": 1.0}),
    ("logit_bias", {5: 1.0, "5": -1.0}),  # one token twice: which bias would win is a guess
    ("ignore_eos", "no"),
    ("skip_special_tokens", 0),
    ("include_stop_str_in_output", None),
    ("extra_args", [1]),
    # found by a review: a ValueError without .param, or True read as DELTA
    ("output_kind", 5),
    ("output_kind", True),
    ("output_kind", "DELTA"),
]


@pytest.mark.parametrize("case", INVALID, ids=lambda c: f"{c[0]}={c[1]!r}")
def test_invalid_value_names_its_field(case):
    field, value, *others = case
    with pytest.raises(SamplingParamsError) as err:
        SamplingParams(**{field: value, **(others[0] if others else {})})
    assert isinstance(err.value, ValueError)
    assert err.value.param == field
    assert field in str(err.value)


def test_valid_edge_values_are_accepted_and_normalised():
    params = SamplingParams(
        top_k=-1,
        seed=2**64 - 1,
        stop="END",
        stop_token_ids=(3, 4),
        allowed_token_ids=(5,),
        logit_bias={"7": 1},
    )
    assert params.top_k == 0
    assert params.stop == ["END"]
    assert params.stop_token_ids == [3, 4] and params.allowed_token_ids == [5]
    assert params.logit_bias == {7: 1.0}
    assert SamplingParams(seed=-(2**63)).seed == -(2**63)


def test_greedy_turns_truncations_off():
    params = SamplingParams(temperature=0.0, top_p=0.5, top_k=3, min_p=0.2)
    assert params.sampling_type_greedy
    assert (params.top_p, params.top_k, params.min_p) == (1.0, 0, 0.0)


def test_eos_joins_the_stop_ids_unless_ignored():
    params = SamplingParams(stop_token_ids=[9])
    params.update_from_model({2})
    assert params.all_stop_token_ids == {2, 9}
    ignoring = SamplingParams(stop_token_ids=[9], ignore_eos=True)
    ignoring.update_from_model({2})
    assert ignoring.all_stop_token_ids == {9}


# ---- fields set after construction (found by a review: never checked again) ------------------
@pytest.mark.parametrize(
    ("field", "value"),
    [("temperature", math.nan), ("max_tokens", "3"), ("n", 0), ("top_p", 2.0), ("stop", [""]),
     ("output_kind", 7), ("ignore_eos", "no"), ("truncate_prompt_tokens", "3")],
)
def test_verify_checks_fields_set_after_construction(field, value):
    params = SamplingParams()
    setattr(params, field, value)
    with pytest.raises(SamplingParamsError) as err:
        params.verify()
    assert err.value.param == field


def test_a_defaulted_best_of_follows_n_set_later():
    params = SamplingParams()
    params.n = 3
    params.verify()
    assert params.best_of == 3
    params.n = 2
    params.verify()
    assert params.best_of == 2
    given = SamplingParams(n=2, best_of=4)
    given.n = 3
    given.verify()
    assert given.best_of == 4  # a best_of the user gave is kept
    given.n = 5
    with pytest.raises(SamplingParamsError) as err:
        given.verify()
    assert err.value.param == "best_of"


def test_verify_of_unchanged_params_is_idempotent():
    params = SamplingParams(n=2, temperature=0.0, top_p=0.5, top_k=-1, stop="END", stop_token_ids=(3,),
                            logit_bias={"7": 1}, seed=5, output_kind=1)
    before = params.to_dict()
    params.verify()
    params.verify()
    assert params.to_dict() == before
    assert params == SamplingParams(n=2, temperature=0.0, top_p=0.5, top_k=-1, stop="END", stop_token_ids=(3,),
                                    logit_bias={"7": 1}, seed=5, output_kind=1)


def test_setting_temperature_to_zero_later_turns_truncations_off():
    params = SamplingParams(top_p=0.5, top_k=3)
    params.temperature = 0.0
    params.verify()
    assert (params.top_p, params.top_k) == (1.0, 0)


# ---- BeamSearchParams -----------------------------------------------------------------------
@pytest.mark.parametrize("field", ["ignore_eos", "include_stop_str_in_output", "skip_special_tokens",
                                   "spaces_between_special_tokens"])
@pytest.mark.parametrize("value", ["no", 0, None])
def test_beam_search_booleans_are_type_checked(field, value):
    # found by a review: ignore_eos="no" read as True; skip_special_tokens="no" failed after the search
    from folio.sampling_params import BeamSearchParams

    with pytest.raises(SamplingParamsError) as err:
        BeamSearchParams(beam_width=2, max_tokens=4, **{field: value})
    assert err.value.param == field


def test_beam_search_temperature_warns_that_it_has_no_effect():
    import logging

    import folio.sampling_params as module
    from folio.sampling_params import BeamSearchParams

    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    module.logger.addHandler(handler)  # folio's loggers do not propagate to caplog's root
    module._warn_beam_temperature.cache_clear()
    try:
        BeamSearchParams(beam_width=2, max_tokens=4)
        assert not records
        BeamSearchParams(beam_width=2, max_tokens=4, temperature=0.7)
        BeamSearchParams(beam_width=2, max_tokens=4, temperature=0.9)
    finally:
        module.logger.removeHandler(handler)
    assert len(records) == 1  # once per process, not once per request
    assert "temperature has no effect" in records[0].getMessage()
