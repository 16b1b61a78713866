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
