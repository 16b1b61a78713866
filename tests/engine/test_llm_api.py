"""The offline API end to end on one tiny checkpoint: vLLM-shaped outputs, sampling, stops, errors."""

from __future__ import annotations

import pytest
import torch

from folio import LLM, RequestOutput, SamplingParams
from folio.sampling_params import SamplingParamsError
from tests.helpers.checkpoints import tiny_model_dir

pytestmark = pytest.mark.slow

PROMPTS = ["Hello, my name is", "The capital of France is", "Once upon a time", "In 1905"]


@pytest.fixture(scope="module")
def llm(tmp_path_factory) -> LLM:
    path = tiny_model_dir(tmp_path_factory, "llama")
    return LLM(model=path, dtype="float32", device="cpu", max_model_len=256, seed=0)


def _texts(outputs: list[RequestOutput]) -> list[list[str]]:
    return [[c.text for c in o.outputs] for o in outputs]


def test_outputs_have_vllm_shape_and_input_order(llm):
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    assert [o.prompt for o in outs] == PROMPTS
    tok = llm.get_tokenizer()
    for o in outs:
        assert o.finished
        assert o.prompt_token_ids == tok.encode(o.prompt)
        (c,) = o.outputs
        assert c.index == 0 and len(c.token_ids) == 8
        assert c.finish_reason == "length" and c.stop_reason is None
        assert c.text == tok.decode(c.token_ids, skip_special_tokens=True)
        assert c.cumulative_logprob is None and c.logprobs is None


def test_single_string_and_token_prompts(llm):
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    (a,) = llm.generate(PROMPTS[0], params, use_tqdm=False)
    (b,) = llm.generate({"prompt_token_ids": a.prompt_token_ids}, params, use_tqdm=False)
    assert a.outputs[0].token_ids == b.outputs[0].token_ids
    assert b.prompt is None


def test_seeded_sampling_repeats_whatever_the_batch(llm):
    seeded = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=12, ignore_eos=True)
    other = SamplingParams(temperature=1.0, max_tokens=30, ignore_eos=True)
    (alone,) = llm.generate(PROMPTS[0], seeded, use_tqdm=False)
    mixed = llm.generate(PROMPTS[::-1] + [PROMPTS[0]], [other] * 4 + [seeded], use_tqdm=False)
    again = llm.generate([PROMPTS[0], PROMPTS[2]], [seeded, other], use_tqdm=False)
    assert mixed[-1].outputs[0].token_ids == alone.outputs[0].token_ids
    assert again[0].outputs[0].token_ids == alone.outputs[0].token_ids


def test_n_samples_differ_and_repeat_with_a_seed(llm):
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=10, ignore_eos=True)
    (first,) = llm.generate(PROMPTS[1], params, use_tqdm=False)
    (second,) = llm.generate(PROMPTS[1], params, use_tqdm=False)
    assert [c.index for c in first.outputs] == [0, 1, 2]
    assert [c.token_ids for c in first.outputs] == [c.token_ids for c in second.outputs]
    assert len({tuple(c.token_ids) for c in first.outputs}) > 1


def test_stop_string_cuts_text(llm):
    greedy = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    (full,) = llm.generate(PROMPTS[2], greedy, use_tqdm=False)
    text = full.outputs[0].text
    assert len(text) > 6
    stop = text[3:6]
    (cut,) = llm.generate(PROMPTS[2], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, stop=[stop]), use_tqdm=False)
    c = cut.outputs[0]
    assert c.finish_reason == "stop" and c.stop_reason == stop
    assert c.text == text[: text.index(stop)]
    (kept,) = llm.generate(
        PROMPTS[2],
        SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, stop=[stop], include_stop_str_in_output=True),
        use_tqdm=False,
    )
    assert kept.outputs[0].text == text[: text.index(stop) + len(stop)]


def test_stop_strings_wait_for_min_tokens(llm):
    # A stop string in the text of the first min_tokens tokens does not end the output (vLLM's
    # rule, as for stop token ids); one completed after them does.
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    (full,) = llm.generate(PROMPTS[3], greedy, use_tqdm=False)
    c = full.outputs[0]
    prefix_len = len(llm.get_tokenizer().decode(c.token_ids[:2]))
    stop = c.text[prefix_len - 1 : prefix_len]  # the last character of the first two tokens' text
    assert stop.strip(), c.text
    first = c.text.index(stop)
    (early,) = llm.generate(PROMPTS[3], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop=[stop]), use_tqdm=False)
    assert early.outputs[0].text == c.text[:first] and early.outputs[0].finish_reason == "stop"
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop=[stop], min_tokens=2)
    (late,) = llm.generate(PROMPTS[3], params, use_tqdm=False)
    later = c.text.find(stop, prefix_len)  # the first occurrence past the two tokens' text, if any
    want = c.text if later < 0 else c.text[:later]
    assert late.outputs[0].text == want and len(late.outputs[0].token_ids) >= 2


def test_stop_token_ids_and_min_tokens(llm):
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    (full,) = llm.generate(PROMPTS[3], greedy, use_tqdm=False)
    ids = full.outputs[0].token_ids
    stop_tok = ids[2]
    first = ids.index(stop_tok)
    (stopped,) = llm.generate(
        PROMPTS[3], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop_token_ids=[stop_tok]),
        use_tqdm=False,
    )
    c = stopped.outputs[0]
    assert c.token_ids == ids[: first + 1]
    assert c.finish_reason == "stop" and c.stop_reason == stop_tok
    (late,) = llm.generate(
        PROMPTS[3],
        SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop_token_ids=[stop_tok], min_tokens=first + 2),
        use_tqdm=False,
    )
    assert len(late.outputs[0].token_ids) >= first + 2
    assert stop_tok not in late.outputs[0].token_ids[: first + 2]


def test_eos_stops_unless_ignored(llm):
    eos = llm.get_tokenizer().eos_token_id
    (full,) = llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logit_bias={eos: 100.0}), use_tqdm=False)
    assert full.outputs[0].token_ids == [eos] * 6
    (stopped,) = llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=6, logit_bias={eos: 100.0}), use_tqdm=False)
    c = stopped.outputs[0]
    assert c.token_ids == [eos] and c.finish_reason == "stop" and c.stop_reason is None
    assert c.text == ""


def test_prompt_logprobs(llm):
    (out,) = llm.generate(PROMPTS[1], SamplingParams(max_tokens=1, prompt_logprobs=2), use_tqdm=False)
    plp = out.prompt_logprobs
    assert len(plp) == len(out.prompt_token_ids) and plp[0] is None
    for tok, entry in zip(out.prompt_token_ids[1:], plp[1:]):
        assert tok in entry and entry[tok].logprob <= 0.0
        assert len(entry) in (2, 3)


def test_invalid_inputs_raise_and_queue_nothing(llm):
    engine = llm.llm_engine
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.generate([PROMPTS[0], {"prompt_token_ids": [1, 10**6]}], use_tqdm=False)
    with pytest.raises(ValueError, match="maximum model length"):
        llm.generate({"prompt_token_ids": [5] * 300}, use_tqdm=False)
    with pytest.raises(ValueError, match="empty"):
        llm.generate({"prompt_token_ids": []}, use_tqdm=False)
    with pytest.raises(SamplingParamsError) as err:
        SamplingParams(top_p=1.5)
    assert err.value.param == "top_p"
    with pytest.raises(ValueError, match="max_logprobs"):
        llm.generate(PROMPTS[0], SamplingParams(logprobs=50), use_tqdm=False)
    with pytest.raises(ValueError, match="2 sampling_params for 4 prompts"):
        llm.generate(PROMPTS, [SamplingParams(), SamplingParams()], use_tqdm=False)
    # Found by a review: these were dropped or misread without a word.
    with pytest.raises(ValueError, match="sampling_params must be SamplingParams or a list of them, got dict"):
        llm.generate(PROMPTS[:2], {"temperature": 0}, use_tqdm=False)
    with pytest.raises(ValueError, match="multi_modal_data are not supported .folio serves text-only"):
        llm.generate({"prompt": "Describe:", "multi_modal_data": {"image": "x.png"}}, use_tqdm=False)
    with pytest.raises(ValueError, match="Prompt keys foo are not supported"):
        llm.generate([PROMPTS[0], {"prompt": "Hi", "foo": 1}], use_tqdm=False)
    with pytest.raises(ValueError, match="Conversation 1 of 2 is empty"):
        llm.chat([[{"role": "user", "content": "hi"}], []], use_tqdm=False)
    with pytest.raises(ValueError, match="chat_template_kwargs may not set bos_token"):
        llm.chat([{"role": "user", "content": "hi"}], chat_template_kwargs={"bos_token": 1}, use_tqdm=False)
    assert not engine.has_unfinished_requests()
    stats = engine.stats()
    assert stats.num_running == stats.num_waiting == 0
    assert stats.num_free_blocks == stats.num_blocks
    # The engine still works afterwards.
    assert llm.generate(PROMPTS[0], SamplingParams(max_tokens=2), use_tqdm=False)[0].finished


def test_unknown_llm_argument_is_a_clear_error(tmp_path):
    with pytest.raises(TypeError, match="Unknown engine argument"):
        LLM(model=str(tmp_path), no_such_option=1)


def test_bad_seed_and_a_missing_gpu_are_clear_errors(tmp_path_factory):
    # Found by a review: a RuntimeError from torch.manual_seed, and an AssertionError from torch.
    path = tiny_model_dir(tmp_path_factory, "llama", "args")
    with pytest.raises(ValueError, match="seed must be an int, got str"):
        LLM(model=path, seed="x")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device='cuda' was asked for, but torch .* sees no GPU"):
            LLM(model=path, device="cuda")


def test_abort_frees_blocks(llm):
    engine = llm.llm_engine
    engine.add_request("abort-me", PROMPTS[0], SamplingParams(max_tokens=50, ignore_eos=True))
    engine.step()
    engine.step()
    assert engine.stats().num_free_blocks < engine.stats().num_blocks
    engine.abort_request("abort-me")
    engine.step()
    assert not engine.has_unfinished_requests()
    assert engine.stats().num_free_blocks == engine.stats().num_blocks


def test_priority_policy_runs_urgent_first(tmp_path_factory):
    path = tiny_model_dir(tmp_path_factory, "llama", "prio")
    llm = LLM(model=path, dtype="float32", device="cpu", max_model_len=64, max_num_seqs=1, scheduling_policy="priority")
    engine = llm.llm_engine
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    engine.add_request("late", PROMPTS[0], params, priority=5)
    engine.add_request("urgent", PROMPTS[1], params, priority=-1)
    order = []
    while engine.has_unfinished_requests():
        order += [o.request_id for o in engine.step() if o.finished]
    assert order == ["urgent", "late"]
    # A priority that is not an int is refused before anything is queued, so later requests run.
    greedy = llm.generate(PROMPTS[:2], params, use_tqdm=False)
    for bad in ([0, "a"], [None, 1], [0, True]):
        with pytest.raises(ValueError, match="priority must be an int"):
            llm.generate(PROMPTS[:2], params, priority=bad, use_tqdm=False)
        assert not engine.has_unfinished_requests()
    again = llm.generate(PROMPTS[:2], params, priority=[3, 4], use_tqdm=False)
    assert [o.outputs[0].token_ids for o in again] == [o.outputs[0].token_ids for o in greedy]


def test_priority_without_the_priority_policy_is_refused(tmp_path_factory):
    path = tiny_model_dir(tmp_path_factory, "llama", "prio")
    llm = LLM(model=path, dtype="float32", device="cpu", max_model_len=64)
    with pytest.raises(ValueError, match="priority scheduling is not enabled"):
        llm.generate(PROMPTS[:2], SamplingParams(max_tokens=2), priority=[0, 5], use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
    assert len(llm.generate(PROMPTS[:2], SamplingParams(max_tokens=2), priority=[0, 0], use_tqdm=False)) == 2
