"""Scheduler under memory pressure: preemption by recompute, victims, FCFS and priority order."""

from __future__ import annotations

import pytest

from folio.core.request import RequestStatus
from tests.core.fakes import FakeModel, RunResult, make_request, make_scheduler, run_to_completion, step


def shares(out) -> dict[str, tuple[int, int]]:
    return {s.request_id: (s.num_computed_tokens, s.num_new_tokens) for s in out.scheduled}


def reference_outputs(specs, **kwargs) -> dict[str, list[int]]:
    """What each request produces when memory is plentiful."""
    sched = make_scheduler(num_blocks=256, **kwargs)
    for rid, prompt_len, max_tokens in specs:
        sched.add_request(make_request(rid, prompt_len, max_tokens=max_tokens))
    return run_to_completion(sched, FakeModel(sched.kv_cache_manager.block_size)).outputs


def test_newest_request_is_preempted_then_resumes_with_identical_output():
    specs = [("a", 8, 12), ("b", 8, 12)]  # together they need 10 blocks, there are 6
    sched = make_scheduler(num_blocks=6, block_size=4, max_model_len=24)
    reqs = {rid: make_request(rid, n, max_tokens=m) for rid, n, m in specs}
    for r in reqs.values():
        sched.add_request(r)
    model = FakeModel(4)
    result = run_to_completion(sched, model)

    assert result.outputs == reference_outputs(specs, block_size=4, max_model_len=24)
    assert result.finish_reasons == {"a": "length", "b": "length"}
    assert sched.num_preemptions == reqs["b"].num_preemptions >= 1 and reqs["a"].num_preemptions == 0
    assert sched.kv_cache_manager.num_free_blocks == 6

    preempt_at = next(i for i, out in enumerate(model.steps) if out.preempted_req_ids)
    assert model.steps[preempt_at].preempted_req_ids == ("b",)
    assert "b" not in shares(model.steps[preempt_at])
    # When b runs again it recomputes its prompt and the tokens it had already generated,
    # in one step, and samples its next token at the end of it.
    resume_at, resume = next(
        (i, s)
        for i, out in enumerate(model.steps)
        if i > preempt_at
        for s in out.scheduled
        if s.request_id == "b"
    )
    length_then = model.lengths[resume_at]["b"]
    assert resume.num_computed_tokens == 0 and resume.num_new_tokens == length_then > 8


@pytest.mark.parametrize("policy", ["fcfs", "priority"])  # equal ranks: priority acts as FCFS
def test_victim_is_the_newest_running_request(policy):
    sched = make_scheduler(num_blocks=6, block_size=4, max_model_len=24, policy=policy)
    model, result = FakeModel(4), RunResult({}, {}, {}, 0)
    sched.add_request(make_request("a", 8))  # its 2 blocks are full
    sched.add_request(make_request("b", 6))
    sched.add_request(make_request("c", 6))
    step(sched, model, result)
    out = step(sched, model, result)
    # a needs a 3rd block and none is free: c, not b, pays for it.
    assert out.preempted_req_ids == ("c",) and shares(out) == {"a": (8, 1), "b": (6, 1)}
    assert [r.request_id for r in sched.running] == ["a", "b"]
    assert [r.request_id for r in sched.waiting] == ["c"]


def test_request_that_is_itself_the_newest_preempts_itself():
    sched = make_scheduler(num_blocks=4, block_size=4, max_model_len=16)
    model, result = FakeModel(4), RunResult({}, {}, {}, 0)
    sched.add_request(make_request("a", 6))  # room for 2 more tokens in its 2nd block
    sched.add_request(make_request("b", 8))  # its 2 blocks are full
    step(sched, model, result)
    out = step(sched, model, result)
    # b needs a 5th block; the only newer-or-equal request is b itself.
    assert out.preempted_req_ids == ("b",) and shares(out) == {"a": (6, 1)}
    assert sched.get_request("b").num_computed_tokens == 0
    assert sched.kv_cache_manager.get_block_ids("b") == []


def test_no_admission_in_a_step_that_preempted():
    sched = make_scheduler(num_blocks=5, block_size=4, max_model_len=16, policy="priority")
    model, result = FakeModel(4), RunResult({}, {}, {}, 0)
    sched.add_request(make_request("a", 8, priority=0, arrival_time=0.0))  # 2 full blocks
    sched.add_request(make_request("b", 10, priority=1, arrival_time=1.0))  # 3 blocks
    step(sched, model, result)
    sched.add_request(make_request("c", 1, priority=0, arrival_time=2.0))
    out = step(sched, model, result)
    # a's 3rd block costs b its place; c would fit in the blocks left over, but memory is
    # short: admitting c now would only preempt someone again next step.
    assert out.preempted_req_ids == ("b",) and shares(out) == {"a": (8, 1)}
    assert sched.kv_cache_manager.num_free_blocks == 2
    assert [r.request_id for r in sched.waiting] == ["c", "b"]


def test_many_requests_on_a_tiny_pool_all_finish_with_reference_outputs():
    specs = [(f"r{i}", 3 + 5 * i % 11, 4 + 7 * i % 9) for i in range(8)]
    kwargs = dict(block_size=2, max_model_len=16, max_num_batched_tokens=10)
    sched = make_scheduler(num_blocks=9, **kwargs)
    for rid, n, m in specs:
        sched.add_request(make_request(rid, n, max_tokens=m))
    result = run_to_completion(sched, FakeModel(2))
    assert sched.num_preemptions > 0
    assert result.outputs == reference_outputs(specs, **kwargs)
    assert sched.kv_cache_manager.num_free_blocks == 9


# ---- priority -----------------------------------------------------------------------------
def admission_order(policy: str) -> list[str]:
    sched = make_scheduler(max_num_seqs=1, policy=policy)
    for rid, priority, arrival in (("late", 0, 2.0), ("low", 1, 1.0), ("early", 0, 1.0)):
        sched.add_request(make_request(rid, 2, max_tokens=1, priority=priority, arrival_time=arrival))
    model = FakeModel(4)
    run_to_completion(sched, model)
    return [out.scheduled[0].request_id for out in model.steps if out.scheduled]


def test_admission_order_by_policy():
    assert admission_order("fcfs") == ["late", "low", "early"]
    assert admission_order("priority") == ["early", "late", "low"]


def test_priority_victim_is_the_worst_ranked_even_if_already_scheduled_this_step():
    sched = make_scheduler(num_blocks=4, block_size=4, max_model_len=16, policy="priority")
    model, result = FakeModel(4), RunResult({}, {}, {}, 0)
    x = make_request("x", 6, priority=5)
    sched.add_request(x)
    step(sched, model, result)  # x admitted first, so it is first in the running order
    sched.add_request(make_request("y", 8, priority=0))
    step(sched, model, result)  # y admitted: no free block left
    out = step(sched, model, result)
    # x (decode, no new block) was scheduled before y asked for a block; x ranks worst, so it
    # is taken out of this step and its token goes back to the budget.
    assert out.preempted_req_ids == ("x",)
    assert shares(out) == {"y": (8, 1)} and out.total_num_scheduled_tokens == 1
    assert x.num_computed_tokens == 0 and sched.kv_cache_manager.get_block_ids("x") == []


def test_budget_of_an_unscheduled_victim_goes_to_the_requests_after_it():
    sched = make_scheduler(
        num_blocks=5, block_size=4, max_model_len=16, max_num_batched_tokens=4, policy="priority"
    )
    model, result = FakeModel(4), RunResult({}, {}, {}, 0)
    sched.add_request(make_request("low", 3, priority=1, arrival_time=0.0))
    step(sched, model, result)
    sched.add_request(make_request("a", 8, priority=0, arrival_time=1.0))
    step(sched, model, result)
    step(sched, model, result)
    sched.add_request(make_request("b", 4, priority=0, arrival_time=2.0))
    assert shares(step(sched, model, result)) == {"low": (5, 1), "a": (6, 2), "b": (0, 1)}
    out = step(sched, model, result)
    # low's decode was scheduled first; a's 3rd block then cost low its place, and low's
    # token of budget went to b's prompt.
    assert out.preempted_req_ids == ("low",)
    assert shares(out) == {"a": (8, 1), "b": (1, 3)}


def test_newcomer_that_preempts_gets_the_budget_its_victim_gave_back():
    sched = make_scheduler(
        num_blocks=12, block_size=1, max_model_len=12, max_num_batched_tokens=10, policy="priority"
    )
    model, result = FakeModel(1), RunResult({}, {}, {}, 0)
    sched.add_request(make_request("gone", 6, priority=0))
    sched.add_request(make_request("low", 7, priority=1))
    step(sched, model, result)  # low gets the 4 tokens of budget gone leaves
    sched.finish_requests(["gone"], RequestStatus.FINISHED_ABORTED)
    sched.add_request(make_request("small", 1, priority=0, arrival_time=1.0))
    sched.add_request(make_request("big", 7, priority=0, arrival_time=2.0))
    out = step(sched, model, result)
    # low (4, 3) and small (0, 1) leave big 6 tokens and 4 blocks; big preempts low, whose 3
    # tokens of budget come back, so big's whole prompt fits in this step.
    assert out.preempted_req_ids == ("low",)
    assert shares(out) == {"small": (0, 1), "big": (0, 7)}


def test_better_ranked_newcomer_preempts_a_running_request():
    sched = make_scheduler(num_blocks=4, block_size=4, max_model_len=16, policy="priority")
    model, result = FakeModel(4), RunResult({}, {}, {}, 0)
    sched.add_request(make_request("low", 14, max_tokens=2, priority=1, arrival_time=0.0))
    step(sched, model, result)  # low holds all 4 blocks
    sched.add_request(make_request("high", 4, max_tokens=3, priority=0, arrival_time=1.0))
    sched.add_request(make_request("high2", 4, max_tokens=3, priority=0, arrival_time=2.0))
    out = step(sched, model, result)
    # high takes low's blocks; high2 would fit in what is left, but admission stops after a
    # preemption.
    assert out.preempted_req_ids == ("low",) and shares(out) == {"high": (0, 4)}
    rest = run_to_completion(sched, model)
    assert rest.finish_reasons == {"low": "length", "high": "length", "high2": "length"}
    assert sched.kv_cache_manager.num_free_blocks == 4


def test_newcomer_ranked_after_or_tied_with_running_requests_does_not_preempt():
    for priority, arrival in ((1, 1.0), (2, 0.0), (1, 0.0)):  # later, worse, exact tie
        sched = make_scheduler(num_blocks=4, block_size=4, max_model_len=16, policy="priority")
        model, result = FakeModel(4), RunResult({}, {}, {}, 0)
        sched.add_request(make_request("first", 14, max_tokens=2, priority=1, arrival_time=0.0))
        step(sched, model, result)
        sched.add_request(
            make_request("second", 4, max_tokens=3, priority=priority, arrival_time=arrival)
        )
        out = step(sched, model, result)
        assert out.preempted_req_ids == () and shares(out) == {"first": (14, 1)}
        assert sched.num_waiting == 1
