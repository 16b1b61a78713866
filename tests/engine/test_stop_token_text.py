"""A stop token's text (EOS or stop_token_ids) is not part of the output text unless
include_stop_str_in_output, as vLLM's detokenizer leaves it out; its id stays in token_ids.
Before, folio wrote it: stop_token_ids=[<a word>] ended the text with that word, and with
skip_special_tokens=False every reply ended in "<|im_end|>"-style EOS text."""

from __future__ import annotations

import pytest

from folio import SamplingParams
from tests.helpers.checkpoints import tiny_model_dir
from tests.prefix.helpers import make_llm

pytestmark = pytest.mark.slow
PROMPT = "hello there"


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    return make_llm(tiny_model_dir(tmp_path_factory, "llama", "stop-text-llama"), max_model_len=128)


def _run(llm, **kw):
    (out,) = llm.generate(PROMPT, SamplingParams(max_tokens=8, temperature=0, **kw), use_tqdm=False)
    return out.outputs[0]


@pytest.mark.parametrize("position", [0, 3])
def test_a_stop_token_is_in_the_ids_not_the_text(llm, position):
    tok = llm.get_tokenizer()
    free = _run(llm, ignore_eos=True)
    stop_id = free.token_ids[position]
    assert stop_id not in free.token_ids[:position], "pick a first occurrence"
    cut = _run(llm, ignore_eos=True, stop_token_ids=[stop_id])
    assert cut.token_ids == free.token_ids[: position + 1]
    assert (cut.finish_reason, cut.stop_reason) == ("stop", stop_id)
    assert cut.text == tok.decode(free.token_ids[:position])
    kept = _run(llm, ignore_eos=True, stop_token_ids=[stop_id], include_stop_str_in_output=True)
    assert kept.token_ids == cut.token_ids and kept.text == tok.decode(free.token_ids[: position + 1])


def test_eos_text_is_left_out_with_special_tokens_kept(llm):
    tok = llm.get_tokenizer()
    free = _run(llm, ignore_eos=True)
    eos = tok.eos_token_id
    # make the model end on EOS at step 3: a logit bias pushes it there (and only there)
    forced = _run(llm, allowed_token_ids=[*free.token_ids[:3], eos], min_tokens=3, skip_special_tokens=False,
                  logit_bias={eos: 100.0})
    assert forced.token_ids[-1] == eos and forced.finish_reason == "stop" and forced.stop_reason is None
    body = tok.decode(forced.token_ids[:-1], skip_special_tokens=False)
    assert forced.text == body and tok.eos_token not in forced.text
    with_eos = _run(llm, allowed_token_ids=[*free.token_ids[:3], eos], min_tokens=3, skip_special_tokens=False,
                    logit_bias={eos: 100.0}, include_stop_str_in_output=True)
    assert with_eos.text == body + tok.eos_token


def test_a_streamed_delta_never_holds_the_stop_token(llm):
    from folio.sampling_params import RequestOutputKind

    free = _run(llm, ignore_eos=True)
    stop_id = free.token_ids[3]
    engine = llm.llm_engine
    engine.add_request("d", PROMPT, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, stop_token_ids=[stop_id],
                                                   output_kind=RequestOutputKind.DELTA))
    text = ""
    while engine.has_unfinished_requests():
        for out in engine.step():
            text += out.outputs[0].text
    assert text == llm.get_tokenizer().decode(free.token_ids[:3])
