"""Async scheduling in the scheduler: step N+1 planned around placeholders before step N's update.

The FakeModel takes a placeholder's id from what it sampled in the step before (as the runner
does from the device), so any step planned on a wrong token, a wrong block or a stale table
fails its K/V checks. Pipelined runs must produce exactly the tokens of synchronous runs.
"""

from __future__ import annotations

import random

import pytest

from folio.core.request import RequestStatus
from tests.core.fakes import EOS, FakeModel, make_request, make_scheduler, run_to_completion

BS = 4


def _run(specs, *, pipelined, script=None, **kwargs):
    """specs: (request id, prompt length, max_tokens) triples."""
    sched = make_scheduler(block_size=BS, **kwargs)
    for rid, n, m in specs:
        sched.add_request(make_request(rid, n, max_tokens=m))
    model = FakeModel(BS, script=script or {})
    return sched, model, run_to_completion(sched, model, pipelined=pipelined)


def _specs(seed: int, num: int = 12):
    rng = random.Random(seed)
    return [(f"r{i}", rng.randint(1, 20), rng.choice([None, rng.randint(1, 12)])) for i in range(num)]


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(num_blocks=256),
        dict(num_blocks=24, max_num_batched_tokens=7),  # chunked prefill, preemption by recompute
        dict(num_blocks=24, enable_prefix_caching=True),
        dict(num_blocks=24, num_cpu_blocks=64, preemption_mode="swap"),
        dict(num_blocks=24, num_cpu_blocks=64, preemption_mode="swap", enable_prefix_caching=True),
        dict(num_blocks=24, policy="priority", max_num_seqs=3),
    ],
    ids=["plenty", "chunked-recompute", "prefix-cache", "swap", "swap-cache", "priority"],
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pipelined_runs_give_the_synchronous_tokens(kwargs, seed):
    specs = _specs(seed)
    kwargs = dict(max_model_len=32, **kwargs)
    # Some requests stop early on EOS or a stop token: their next step was already planned.
    script = {f"r{i}": [5 + i] * (i % 5) + [EOS] for i in range(0, 12, 3)}
    _, _, reference = _run(specs, pipelined=False, script=script, **kwargs)
    sched, model, result = _run(specs, pipelined=True, script=script, **kwargs)
    assert result.outputs == reference.outputs
    assert result.finish_reasons == reference.finish_reasons
    kv = sched.kv_cache_manager
    assert kv.num_free_blocks == kv.num_blocks and not kv.block_tables
    assert all(not r.num_output_placeholders for r in sched.requests.values())
    overlapped = [
        s for out, lengths in zip(model.steps, model.lengths) for s in out.scheduled
        if s.end > lengths[s.request_id]  # its last token was a placeholder
    ]
    assert overlapped


def test_pipelined_families_swap_and_share_the_prompt():
    """n > 1 samples: children share the parent's prompt blocks while its step is in flight."""

    def run(pipelined, **kwargs):
        sched = make_scheduler(block_size=BS, max_model_len=24, **kwargs)
        parent = None
        for i in range(3):
            request = make_request(f"{i}", 10, max_tokens=10)
            request.family_id, request.parent = "f", parent
            parent = parent or request
            sched.add_request(request)
        return sched, run_to_completion(sched, FakeModel(BS), pipelined=pipelined)

    _, reference = run(False, num_blocks=256)
    sched, result = run(True, num_blocks=8, num_cpu_blocks=32)
    assert result.outputs == reference.outputs
    assert sched.num_swap_preemptions > 0 and sched.kv_cache_manager.num_copied_blocks > 0


def test_placeholders_live_from_schedule_to_update():
    sched = make_scheduler(block_size=BS)
    a = make_request("a", 5, max_tokens=10)
    sched.add_request(a)
    model = FakeModel(BS)
    first = sched.schedule()
    first_out = model.execute(first)
    assert a.num_output_placeholders == 1 and a.num_computed_tokens == 5
    second = sched.schedule()  # planned before the first step's token is known
    [s] = second.scheduled
    assert (s.num_computed_tokens, s.num_new_tokens, s.samples) == (5, 1, True)
    assert a.num_output_placeholders == 2 and a.num_tokens == 5
    second_out = model.execute(second)
    sched.update_from_output(first, first_out)
    assert a.num_output_placeholders == 1 and a.num_output_tokens == 1
    sched.update_from_output(second, second_out)
    assert a.num_output_placeholders == 0 and a.num_output_tokens == 2


def test_a_request_is_not_scheduled_past_its_length_cap():
    """max_tokens and max_model_len are known ahead: no step is wasted on them."""
    for specs, max_model_len in ([("a", 5, 4)], 64), ([("a", 5, None)], 9):
        _, model, result = _run(specs, pipelined=True, max_model_len=max_model_len)
        assert len(result.outputs["a"]) == 4 and result.finish_reasons["a"] == "length"
        assert sum(1 for out in model.steps for s in out.scheduled) == 4  # prefill + 3 decodes


def test_a_stopped_request_wastes_one_step_whose_result_is_dropped():
    _, model, result = _run([("a", 5, 10)], pipelined=True, script={"a": [7, EOS, 8, 9]})
    assert result.outputs["a"] == [7, EOS] and result.finish_reasons["a"] == "stop"
    steps = [out for out in model.steps if out.scheduled]
    assert len(steps) == 3  # the step after the EOS was planned before the EOS was known


def test_a_request_preempted_in_flight_keeps_its_token_and_waits_for_it():
    sched = make_scheduler(num_blocks=4, block_size=BS, max_model_len=16)
    a, b = make_request("a", 4, max_tokens=8), make_request("b", 4, max_tokens=8)
    sched.add_request(a)
    sched.add_request(b)
    model = FakeModel(BS)
    first = sched.schedule()
    first_out = model.execute(first)
    assert b.num_output_placeholders == 1
    # Both need a second block for their next token; there are only two left: b is preempted.
    sched.kv_cache_manager.block_pool.allocate(2)
    second = sched.schedule()
    assert second.preempted_req_ids == ("b",) and b.status == RequestStatus.PREEMPTED
    assert b.num_output_placeholders == 1 and b.num_computed_tokens == 0
    model.execute(second)
    sched.update_from_output(first, first_out)
    assert b.num_output_placeholders == 0 and b.num_output_tokens == 1  # its token counts


def test_requests_that_need_synchronous_steps_are_counted():
    from folio.sampling_params import SamplingParams

    sched = make_scheduler()
    plain = make_request("plain")
    sched.add_request(plain)
    assert not sched.requires_sync_steps
    penalised = make_request("pen")
    penalised.sampling_params = SamplingParams(presence_penalty=0.5)
    sched.add_request(penalised)
    beam = make_request("beam")
    beam.pause_after_sample = True
    sched.add_request(beam)
    assert sched.requires_sync_steps
    sched.finish_requests(["pen"], RequestStatus.FINISHED_ABORTED)
    assert sched.requires_sync_steps
    sched.finish_requests(["beam"], RequestStatus.FINISHED_ABORTED)
    assert not sched.requires_sync_steps
