"""Speculative decoding composed with the sampling features that read a request's output:
stop strings, bad_words and logits processors. The draft is the target itself, so nearly every
draft is accepted and several tokens arrive per step; greedy outputs (token ids, text, log-probs)
must be those of the engine without speculation, token for token."""

from __future__ import annotations

import pytest

from folio import LLM, SamplingParams
from tests.helpers.checkpoints import tiny_model_dir

pytestmark = pytest.mark.slow

PROMPTS = ["Hello, my name is", "a b c a b c a b c a b", {"prompt_token_ids": [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]}]
GREEDY = dict(temperature=0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def path(tmp_path_factory) -> str:
    return tiny_model_dir(tmp_path_factory, "llama")


def _llm(path: str, speculate: bool) -> LLM:
    spec = {"model": path, "num_speculative_tokens": 3} if speculate else None
    return LLM(model=path, dtype="float32", device="cpu", seed=0, max_model_len=64, speculative_config=spec)


@pytest.fixture(scope="module")
def engines(path) -> tuple[LLM, LLM]:
    return _llm(path, False), _llm(path, True)


@pytest.fixture(scope="module")
def greedy_tokens(engines) -> list[list[int]]:
    baseline, _ = engines
    return [o.outputs[0].token_ids for o in baseline.generate(PROMPTS, SamplingParams(**GREEDY), use_tqdm=False)]


def _summary(outputs) -> list:
    return [
        [(c.token_ids, c.text, c.finish_reason, c.stop_reason,
          None if c.cumulative_logprob is None else round(c.cumulative_logprob, 3),
          [sorted((t, round(lp.logprob, 4)) for t, lp in d.items()) for d in c.logprobs or []])
         for c in o.outputs]
        for o in outputs
    ]


def _assert_same(engines, params: SamplingParams | list[SamplingParams]) -> list:
    baseline, speculative = engines
    want = baseline.generate(PROMPTS, params, use_tqdm=False)
    before = speculative.llm_engine.scheduler.spec_stats.num_accepted_tokens
    got = speculative.generate(PROMPTS, params, use_tqdm=False)
    assert speculative.llm_engine.scheduler.spec_stats.num_accepted_tokens > before  # drafts were taken
    assert _summary(got) == _summary(want)
    return want


@pytest.mark.parametrize("include", [False, True])
def test_a_stop_string_inside_accepted_drafts_ends_tokens_and_logprobs_there(engines, greedy_tokens, include):
    """The step that completes the stop string brings tokens past it: they (and their
    log-probs) must not reach the output, whose tokens end where they would one by one."""
    tokenizer = engines[0].get_tokenizer()
    for position in (1, 2, 5):
        params = [
            SamplingParams(**GREEDY, logprobs=1, include_stop_str_in_output=include,
                           stop=[tokenizer.decode(tokens[position : position + 1])])
            for tokens in greedy_tokens
        ]
        want = _assert_same(engines, params)
        assert any(len(o.outputs[0].token_ids) < GREEDY["max_tokens"] for o in want)  # a stop hit


def test_bad_words_see_the_drafts_before_each_scored_position(engines, greedy_tokens):
    """A two-token bad word whose first token is a draft: the row after that draft must ban
    the second token, as the sampler does once the first token is in the output."""
    tokenizer = engines[0].get_tokenizer()
    changed = False
    for position in range(5):
        word = tokenizer.decode(greedy_tokens[0][position : position + 2]).strip()
        params = SamplingParams(**GREEDY, bad_words=[word])
        want = _assert_same(engines, params)
        changed |= want[0].outputs[0].token_ids != greedy_tokens[0]
    assert changed  # some bad word did change the greedy output


def test_requests_with_logits_processors_get_no_drafts_and_keep_their_outputs(engines, greedy_tokens, caplog):
    """A processor is user code that may track the output (a hand-made constraint): it must
    only ever see tokens it allowed, as without speculation, so its request gets no drafts
    (it was silently skipped on drafted rows before). One processor bans a token outright, one
    bans a token only after another one, one asserts that its banned token never reached the
    output; the plain requests beside them keep drafting."""
    tokens = greedy_tokens[0]
    banned = tokens[1]

    def ban(output_ids, logits):
        assert banned not in output_ids  # its own invariant: fails if handed a draft it banned
        logits[banned] = float("-inf")
        return logits

    def ban_after(output_ids, logits):
        if output_ids and output_ids[-1] == tokens[2]:
            logits[tokens[3]] = float("-inf")
        return logits

    for processor in (ban, ban_after):
        params = [SamplingParams(**GREEDY, logits_processors=[processor])] + [SamplingParams(**GREEDY)] * 2
        with caplog.at_level("INFO", logger="folio.engine.llm_engine"):
            want = _assert_same(engines, params)
        assert want[0].outputs[0].token_ids != tokens
        assert "no speculative decoding with logits processors" in caplog.text
