"""Drafts in the scheduler's terms (core/speculation.py), torch-free: 1 + k tokens scheduled,
num_computed_tokens advancing by the accepted drafts plus one, blocks past it freed, caps by
max_tokens, max_model_len and the token budget, no cached block holding a draft."""

from __future__ import annotations

from folio.core.outputs import ModelRunnerOutput
from folio.core.schedule_step import ScheduleStep
from folio.core.scheduler_output import SchedulerOutput
from tests.core.fakes import make_request, make_scheduler


def _answer(out: SchedulerOutput, tokens: dict[str, list[int]], drafts: dict[str, list[int]]) -> ModelRunnerOutput:
    ids = [s.request_id for s in out.scheduled]
    return ModelRunnerOutput(ids, [tokens.get(i, []) for i in ids], spec_token_ids=[drafts.get(i, []) for i in ids])


def test_verify_step_schedules_drafts_and_releases_rejected_slots():
    scheduler = make_scheduler(num_blocks=16, block_size=4, enable_prefix_caching=True)
    scheduler.num_lookahead_tokens = 3
    request = make_request("r", 5, max_tokens=20)
    scheduler.add_request(request)
    out = scheduler.schedule()  # prefill: 5 tokens, samples one, lookahead 3 -> 8 slots
    assert out.scheduled[0].num_new_tokens == 5 and out.scheduled[0].spec_token_ids == ()
    assert len(scheduler.kv_cache_manager.get_block_ids("r")) == 2
    scheduler.update_from_output(out, _answer(out, {"r": [60]}, {"r": [61, 62, 63]}))
    assert request.num_computed_tokens == 5 and request.spec_token_ids == [61, 62, 63]

    out = scheduler.schedule()  # verify: last token + 3 drafts, 3 lookahead slots -> 12 slots
    [sched] = out.scheduled
    assert (sched.num_computed_tokens, sched.num_new_tokens, sched.spec_token_ids) == (5, 4, (61, 62, 63))
    assert len(scheduler.kv_cache_manager.get_block_ids("r")) == 3
    assert scheduler.kv_cache_manager.prefix_cache.num_cached_blocks == 1  # [0, 4) only: known tokens
    scheduler.update_from_output(out, _answer(out, {"r": [61, 70]}, {"r": [71]}))  # 1 accepted
    assert request.output_token_ids == [60, 61, 70]
    assert request.num_computed_tokens == 7  # 5 + the last token + 1 accepted draft
    assert len(scheduler.kv_cache_manager.get_block_ids("r")) == 2  # the third block is free again
    stats = scheduler.spec_stats
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (1, 3, 1)
    assert stats.accepted_per_position == [1, 0, 0]

    out = scheduler.schedule()
    assert out.shrunk_req_ids == frozenset({"r"})  # the runner rebuilds the row
    assert out.scheduled[0].spec_token_ids == (71,) and out.scheduled[0].num_new_tokens == 2


def test_drafts_are_capped_by_max_tokens_max_model_len_and_budget():
    scheduler = make_scheduler(max_model_len=16, max_num_batched_tokens=64)
    request = make_request("r", 4, max_tokens=4)
    scheduler.add_request(request)
    out = scheduler.schedule()
    scheduler.update_from_output(out, _answer(out, {"r": [50]}, {"r": [51, 52, 53, 54, 55]}))
    out = scheduler.schedule()  # 1 output: all drafts accepted + bonus must stay within 4 outputs
    assert out.scheduled[0].spec_token_ids == (51, 52)
    scheduler.update_from_output(out, _answer(out, {"r": [51, 52, 57]}, {"r": [58]}))
    assert request.is_finished and request.num_output_tokens == 4  # max_tokens, never more

    tight = make_scheduler(max_model_len=8, max_num_batched_tokens=64)
    long_request = make_request("m", 5, max_tokens=None)
    tight.add_request(long_request)
    out = tight.schedule()
    tight.update_from_output(out, _answer(out, {"m": [50]}, {"m": [51, 52, 53, 54]}))
    out = tight.schedule()  # 6 tokens: one draft + bonus reaches max_model_len 8
    assert out.scheduled[0].spec_token_ids == (51,)

    budget = make_scheduler(max_num_batched_tokens=8)
    a, b = make_request("a", 4, max_tokens=20), make_request("b", 5, max_tokens=20)
    budget.add_request(a)
    out = budget.schedule()
    budget.update_from_output(out, _answer(out, {"a": [50]}, {"a": [51, 52, 53]}))
    budget.add_request(b)
    out = budget.schedule()  # a: 4 tokens, b gets the other 4 of its 5-token prompt
    assert out.scheduled[0].spec_token_ids == (51, 52, 53) and out.scheduled[1].num_new_tokens == 4


def test_preemption_clears_drafts():
    scheduler = make_scheduler(num_blocks=4, block_size=4, max_model_len=16)
    request = make_request("r", 4, max_tokens=20)
    scheduler.add_request(request)
    out = scheduler.schedule()
    scheduler.update_from_output(out, _answer(out, {"r": [50]}, {"r": [51, 52]}))
    scheduler.running.remove(request)  # as _schedule_running does with a victim
    scheduler._preempt(request, ScheduleStep(budget=8))
    assert request.spec_token_ids == [] and request.num_computed_tokens == 0
    out = scheduler.schedule()  # back by recompute: the whole sequence, no drafts
    assert out.scheduled[0].num_new_tokens == 5 and out.scheduled[0].spec_token_ids == ()
