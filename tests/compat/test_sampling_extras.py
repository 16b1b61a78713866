"""vLLM's SamplingParams extras: bad_words, logits_processors, truncate_prompt_tokens, allowed_token_ids."""

from __future__ import annotations

import pytest
import torch

from folio import LLM, SamplingParams
from folio.sample.constraints import bad_word_bans
from folio.sampling_params import SamplingParamsError

PROMPT = "Hello, my name is"


@pytest.fixture(scope="module")
def llm(tiny_model) -> LLM:
    return LLM(model=tiny_model, dtype="float32", device="cpu", max_model_len=256)


def _greedy(**kwargs) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, **kwargs)


def _contains(tokens: list[int], seq: list[int]) -> bool:
    return any(tokens[i: i + len(seq)] == seq for i in range(len(tokens) - len(seq) + 1))


def test_bad_word_rule_matches_vllms():
    assert bad_word_bans([[7]], []) == [7]  # one-token words are always banned
    assert bad_word_bans([[1, 2, 3]], [9, 1, 2]) == [3]
    assert bad_word_bans([[1, 2, 3]], [1, 9]) == []
    assert bad_word_bans([[1, 2, 3]], [2]) == []  # shorter than the prefix: no match


def test_bad_words_never_appear(llm):
    tokenizer = llm.get_tokenizer()
    (free,) = llm.generate(PROMPT, _greedy(), use_tqdm=False)
    tokens = free.outputs[0].token_ids
    # a bad word whose vLLM token sequences occur in the free output
    for start in range(len(tokens) - 1):
        word = tokenizer.decode(tokens[start: start + 2]).strip()
        params = _greedy(bad_words=[word])
        params.update_from_tokenizer(tokenizer)
        if word and any(_contains(tokens, seq) for seq in params.bad_words_token_ids):
            break
    else:
        pytest.skip("no two-token word of the output survives re-tokenization")
    (banned,) = llm.generate(PROMPT, _greedy(bad_words=[word]), use_tqdm=False)
    out = banned.outputs[0].token_ids
    assert out != tokens
    assert not any(_contains(out, seq) for seq in params.bad_words_token_ids)


def test_logits_processors_two_and_three_argument_forms(llm):
    (free,) = llm.generate(PROMPT, _greedy(), use_tqdm=False)
    first = free.outputs[0].token_ids[0]
    seen = []

    def ban_first(token_ids, logits):
        seen.append(list(token_ids))
        logits[first] = -float("inf")
        return logits

    def force_after_prompt(prompt_ids, token_ids, logits):
        assert prompt_ids == free.prompt_token_ids
        out = torch.full_like(logits, -float("inf"))
        out[42] = 0.0
        return out

    (a,) = llm.generate(PROMPT, _greedy(logits_processors=[ban_first]), use_tqdm=False)
    assert first not in a.outputs[0].token_ids
    assert seen[0] == [] and seen[3] == a.outputs[0].token_ids[:3]  # the output so far, each step
    (b,) = llm.generate(PROMPT, _greedy(logits_processors=[force_after_prompt]), use_tqdm=False)
    assert b.outputs[0].token_ids == [42] * 12


def test_logits_processor_errors(llm):
    with pytest.raises(SamplingParamsError, match="logits_processors"):
        SamplingParams(logits_processors=[lambda x: x])
    with pytest.raises(SamplingParamsError, match="logits_processors"):
        SamplingParams(logits_processors=["not callable"])
    # A processor that leaves nothing to sample fails its request, not silently emits token 0.
    for poison in (lambda ids, logits: logits * float("nan"), lambda ids, logits: logits.fill_(float("-inf"))):
        with pytest.raises(Exception, match="left no token to sample"):
            llm.generate(PROMPT, _greedy(logits_processors=[poison]), use_tqdm=False)
        assert not llm.llm_engine.has_unfinished_requests()
    assert llm.generate(PROMPT, _greedy(), use_tqdm=False)[0].outputs[0].token_ids


def test_truncate_prompt_tokens_keeps_the_end(llm):
    (full,) = llm.generate(PROMPT, _greedy(), use_tqdm=False)
    (cut,) = llm.generate(PROMPT, _greedy(truncate_prompt_tokens=3), use_tqdm=False)
    assert cut.prompt_token_ids == full.prompt_token_ids[-3:]
    (same,) = llm.generate({"prompt_token_ids": full.prompt_token_ids[-3:]}, _greedy(), use_tqdm=False)
    assert cut.outputs[0].token_ids == same.outputs[0].token_ids
    (whole,) = llm.generate(PROMPT, _greedy(truncate_prompt_tokens=-1), use_tqdm=False)
    assert whole.prompt_token_ids == full.prompt_token_ids
    for bad in (0, -2, 1.5):
        with pytest.raises(SamplingParamsError, match="truncate_prompt_tokens"):
            SamplingParams(truncate_prompt_tokens=bad)


def test_allowed_token_ids(llm):
    (out,) = llm.generate(PROMPT, _greedy(allowed_token_ids=[5, 6]), use_tqdm=False)
    assert set(out.outputs[0].token_ids) <= {5, 6}
    with pytest.raises(ValueError, match="allowed_token_ids"):
        llm.generate(PROMPT, _greedy(allowed_token_ids=[10**6]), use_tqdm=False)


def test_stop_strings_without_text_are_refused(tiny_model):
    """Stop strings are matched on the output text: with detokenize=False, or no tokenizer at
    all, they would never match and the output would silently run to max_tokens."""
    with pytest.raises(SamplingParamsError, match="detokenize"):
        SamplingParams(stop=["books"], detokenize=False)
    SamplingParams(stop_token_ids=[5], detokenize=False)  # token ids need no text
    no_text = LLM(tiny_model, skip_tokenizer_init=True, device="cpu", max_model_len=64)
    with pytest.raises(ValueError, match="stop strings need a tokenizer"):
        no_text.generate({"prompt_token_ids": [3, 4, 5]}, _greedy(stop=["books"]),
                         use_tqdm=False)
