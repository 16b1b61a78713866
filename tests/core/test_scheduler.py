"""Scheduler: token budget, chunked prefill, limits, stop checks, aborts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from folio.config.scheduler import SchedulerConfig
from folio.core.outputs import ModelRunnerOutput, PromptLogprobsChunk, TokenLogprobs
from folio.core.request import RequestStatus
from folio.core.scheduler import Scheduler
from tests.core.fakes import (
    EOS,
    FakeModel,
    RunResult,
    make_request,
    make_scheduler,
    run_to_completion,
    step,
)


def shares(out) -> dict[str, tuple[int, int]]:
    """request id -> (num_computed_tokens before the step, num_new_tokens)."""
    return {s.request_id: (s.num_computed_tokens, s.num_new_tokens) for s in out.scheduled}


def new_result() -> RunResult:
    return RunResult({}, {}, {}, 0)


# ---- budget, chunking, limits -----------------------------------------------------------------
def test_long_prompt_is_chunked_alongside_decodes():
    sched = make_scheduler(max_num_batched_tokens=16, max_model_len=64)
    model, result = FakeModel(4), new_result()
    sched.add_request(make_request("a", 4, max_tokens=20))
    step(sched, model, result)
    sched.add_request(make_request("b", 40, max_tokens=2))
    seen = [shares(step(sched, model, result)) for _ in range(3)]
    # The decode goes first, the prompt takes what is left of the budget.
    assert seen == [
        {"a": (4, 1), "b": (0, 15)},
        {"a": (5, 1), "b": (15, 15)},
        {"a": (6, 1), "b": (30, 10)},
    ]
    # Partial chunks sample nothing and report nothing; the last chunk samples.
    assert len(result.outputs["a"]) == 4
    assert len(result.outputs["b"]) == 1
    assert all(s.total_num_scheduled_tokens <= 16 for s in model.steps)


def test_without_chunked_prefill_a_prompt_waits_until_it_fits_whole():
    sched = make_scheduler(
        max_num_batched_tokens=32, max_model_len=32, enable_chunked_prefill=False
    )
    model, result = FakeModel(4), new_result()
    sched.add_request(make_request("a", 4, max_tokens=3))
    sched.add_request(make_request("b", 32, max_tokens=1))
    seen = [shares(step(sched, model, result)) for _ in range(4)]
    assert seen == [{"a": (0, 4)}, {"a": (4, 1)}, {"a": (5, 1)}, {"b": (0, 32)}]
    assert result.finish_reasons == {"a": "length", "b": "length"}


def test_max_num_seqs_limits_running_requests():
    sched = make_scheduler(max_num_seqs=2)
    model, result = FakeModel(4), new_result()
    for rid, max_tokens in (("a", 2), ("b", 5), ("c", 1)):
        sched.add_request(make_request(rid, 4, max_tokens=max_tokens))
    first = step(sched, model, result)
    assert set(shares(first)) == {"a", "b"} and sched.num_waiting == 1
    step(sched, model, result)  # a finishes here
    assert set(shares(step(sched, model, result))) == {"b", "c"}


def test_max_model_len_caps_generation():
    sched = make_scheduler(max_model_len=12, max_num_batched_tokens=12)
    model = FakeModel(4)
    sched.add_request(make_request("none", 8, max_tokens=None))
    sched.add_request(make_request("big", 10, max_tokens=100))
    result = run_to_completion(sched, model)
    assert len(result.outputs["none"]) == 4 and len(result.outputs["big"]) == 2
    assert result.finish_reasons == {"none": "length", "big": "length"}
    assert max(s.end for out in model.steps for s in out.scheduled) <= 12


def test_prompt_of_exactly_max_model_len_samples_one_token():
    sched = make_scheduler(max_model_len=16, max_num_batched_tokens=16)
    sched.add_request(make_request("a", 16, max_tokens=None))
    result = run_to_completion(sched, FakeModel(4))
    assert len(result.outputs["a"]) == 1 and result.finish_reasons["a"] == "length"


# ---- stop checks --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, script, expected_tokens, reason, stop_reason",
    [
        ({}, [5, EOS, 7], [5, EOS], "stop", None),
        ({"stop_token_ids": [9]}, [5, 9, 7], [5, 9], "stop", 9),
        ({"max_tokens": 3}, [5, 6, 7, 8], [5, 6, 7], "length", None),
        ({"max_tokens": 2}, [5, EOS], [5, EOS], "stop", None),  # stop wins over length
        ({"ignore_eos": True, "max_tokens": 3}, [EOS, EOS, EOS], [EOS, EOS, EOS], "length", None),
        ({"min_tokens": 3, "stop_token_ids": [9]}, [EOS, 9, 6, EOS], [EOS, 9, 6, EOS], "stop", None),
    ],
    ids=["eos", "stop_token", "max_tokens", "stop_beats_length", "ignore_eos", "min_tokens"],
)
def test_stop_checks(kwargs, script, expected_tokens, reason, stop_reason):
    kwargs = {"max_tokens": 10, **kwargs}
    sched = make_scheduler()
    sched.add_request(make_request("a", 3, **kwargs))
    result = run_to_completion(sched, FakeModel(4, script={"a": script}))
    assert result.outputs["a"] == expected_tokens
    assert result.finish_reasons["a"] == reason
    assert result.stop_reasons["a"] == stop_reason
    assert sched.kv_cache_manager.num_free_blocks == 64


def test_tokens_after_a_stop_in_one_step_are_dropped():
    sched = make_scheduler()
    sched.add_request(make_request("a", 3))
    out = sched.schedule()
    lp = [TokenLogprobs([t], [-0.5], 1) for t in (5, EOS, 7)]
    runner_out = ModelRunnerOutput(["a"], [[5, EOS, 7]], logprobs=[lp])
    [core_out] = sched.update_from_output(out, runner_out)
    assert core_out.new_token_ids == [5, EOS] and core_out.finish_reason == "stop"
    assert core_out.new_logprobs == lp[:2]
    assert sched.kv_cache_manager.num_free_blocks == 64 and not sched.has_unfinished_requests()


def test_prompt_logprobs_of_a_partial_chunk_are_passed_through():
    sched = make_scheduler(max_num_batched_tokens=5)
    sched.add_request(make_request("a", 8))
    out = sched.schedule()
    assert not out.scheduled[0].samples
    chunk = PromptLogprobsChunk(1, [TokenLogprobs([4], [-1.0], 3)] * 4)
    runner_out = ModelRunnerOutput(["a"], [[]], prompt_logprobs={"a": chunk})
    [core_out] = sched.update_from_output(out, runner_out)
    assert core_out.new_token_ids == [] and core_out.new_prompt_logprobs is chunk
    assert not core_out.finished


def test_mismatched_runner_output_is_rejected():
    sched = make_scheduler()
    sched.add_request(make_request("a", 3))
    out = sched.schedule()
    with pytest.raises(ValueError, match="does not match"):
        sched.update_from_output(out, ModelRunnerOutput(["b"], [[5]]))


# ---- aborts and finished ids --------------------------------------------------------------
def test_abort_while_waiting_and_while_prefilling_frees_everything():
    sched = make_scheduler(max_num_seqs=1, max_num_batched_tokens=8)
    model, result = FakeModel(4), new_result()
    sched.add_request(make_request("running", 20))
    sched.add_request(make_request("waiting", 4))
    step(sched, model, result)  # "running" is mid-prefill, holding blocks
    assert sched.kv_cache_manager.num_free_blocks < 64
    sched.finish_requests(["running", "waiting", "unknown"], RequestStatus.FINISHED_ABORTED)
    sched.finish_requests("running", RequestStatus.FINISHED_ABORTED)  # again: ignored
    assert sched.kv_cache_manager.num_free_blocks == 64 and sched.kv_usage == 0.0
    assert sched.num_running == sched.num_waiting == 0 and not sched.has_unfinished_requests()
    assert sched.get_request("running") is None
    out = sched.schedule()
    assert out.is_empty and out.finished_req_ids == {"running", "waiting"}
    assert sched.schedule().finished_req_ids == frozenset()  # reported once


def test_abort_between_schedule_and_update_drops_the_results():
    sched = make_scheduler()
    req = make_request("a", 4)
    sched.add_request(req)
    out = sched.schedule()
    sched.finish_requests(["a"], RequestStatus.FINISHED_ABORTED)
    assert sched.update_from_output(out, ModelRunnerOutput(["a"], [[5]])) == []
    assert req.output_token_ids == [] and req.status == RequestStatus.FINISHED_ABORTED


def test_requests_finished_by_the_scheduler_are_reported_to_the_runner():
    sched = make_scheduler()
    model, result = FakeModel(4), new_result()
    sched.add_request(make_request("a", 4, max_tokens=1))
    step(sched, model, result)
    assert sched.schedule().finished_req_ids == {"a"}


def test_finish_requests_needs_a_finished_status():
    sched = make_scheduler()
    with pytest.raises(ValueError):
        sched.finish_requests(["a"], RequestStatus.RUNNING)


# ---- construction -------------------------------------------------------------------------
def test_rejects_what_it_could_never_run():
    with pytest.raises(ValueError, match="cannot hold one request"):
        make_scheduler(num_blocks=3, block_size=4, max_model_len=16)
    with pytest.raises(ValueError, match="swap"):
        Scheduler(SchedulerConfig(preemption_mode="swap"), 1024, 16)
    sched = make_scheduler(max_model_len=8)
    sched.add_request(make_request("a", 4))
    with pytest.raises(ValueError, match="already in use"):
        sched.add_request(make_request("a", 4))
    with pytest.raises(ValueError, match="max_model_len"):
        sched.add_request(make_request("b", 9))


def test_core_imports_no_torch():
    code = (
        "import sys, folio.core.scheduler, folio.core.kv_cache_manager, folio.core.request_queue\n"
        "assert not [m for m in sys.modules if m == 'torch' or m.startswith('torch.')]"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
