"""Preemption by swap: K/V go to the CPU pool and come back; outputs unchanged, nothing leaked,
and the swap-or-recompute rule. FakeModel moves slot contents exactly as the runner would."""

from __future__ import annotations

import pytest

from folio.config.scheduler import SchedulerConfig
from folio.core.scheduler import Scheduler
from tests.core.fakes import FakeModel, make_request, make_scheduler, run_to_completion

BS = 4
SPECS = [("a", 8, 12), ("b", 7, 12), ("c", 5, 10)]  # 3 requests of ~20 tokens, room for ~1.5


def _run(num_blocks=256, family=False, **kwargs):
    sched = make_scheduler(num_blocks=num_blocks, block_size=BS, max_model_len=24, **kwargs)
    for rid, n, m in SPECS:
        r = make_request(rid, n, max_tokens=m)
        if family:
            r.family_id = "f"
        sched.add_request(r)
    model = FakeModel(BS)
    return sched, model, run_to_completion(sched, model)


@pytest.mark.parametrize("caching", [False, True])
def test_swapped_requests_resume_where_they_stopped(caching):
    _, _, reference = _run()
    sched, model, result = _run(
        num_blocks=8, num_cpu_blocks=16, preemption_mode="swap", enable_prefix_caching=caching
    )
    assert result.outputs == reference.outputs
    outs = [p for out in model.steps for p in out.blocks_to_swap_out]
    ins = [p for out in model.steps for p in out.blocks_to_swap_in]
    assert outs and ins
    assert sched.num_swap_preemptions == sched.num_preemptions > 0
    # A swapped request resumes with its computed tokens: it never starts over from 0.
    preempted = {rid for out in model.steps for rid in out.preempted_req_ids}
    for rid in preempted:
        starts = [s.num_computed_tokens for out in model.steps for s in out.scheduled if s.request_id == rid]
        assert starts.count(0) <= 1  # (0 when its prompt start was a prefix-cache hit)
    kv = sched.kv_cache_manager
    assert kv.num_free_blocks == 8
    assert kv.swap_space.num_free_blocks == 16 and not kv.swap_space.tables


def test_recompute_and_swap_give_the_same_outputs():
    _, _, swapped = _run(num_blocks=8, num_cpu_blocks=16, preemption_mode="swap")
    sched, model, recomputed = _run(num_blocks=8, num_cpu_blocks=16, preemption_mode="recompute")
    assert swapped.outputs == recomputed.outputs
    assert sched.num_preemptions > 0 == sched.num_swap_preemptions
    assert not any(out.blocks_to_swap_out for out in model.steps)


def test_the_rule_swaps_families_and_recomputes_lone_requests():
    lone, _, _ = _run(num_blocks=8, num_cpu_blocks=16)
    assert lone.num_preemptions > 0 and lone.num_swap_preemptions == 0
    fam, _, _ = _run(num_blocks=8, num_cpu_blocks=16, family=True)
    assert fam.num_preemptions > 0 and fam.num_swap_preemptions == fam.num_preemptions


def test_a_full_cpu_pool_falls_back_to_recompute():
    _, _, reference = _run()
    sched, _, result = _run(num_blocks=8, num_cpu_blocks=1, preemption_mode="swap")
    assert result.outputs == reference.outputs
    assert sched.num_preemptions > sched.num_swap_preemptions
    assert sched.kv_cache_manager.swap_space.num_free_blocks == 1


def test_swap_in_reshares_blocks_still_in_the_prefix_cache():
    # Two requests with the same 8-token prefix: when one is swapped back in, its first two
    # blocks are still cached (the other holds them), so only its own blocks are copied in.
    sched = make_scheduler(num_blocks=7, block_size=BS, max_model_len=24, enable_prefix_caching=True,
                           num_cpu_blocks=16, preemption_mode="swap")
    prefix = [3 + i for i in range(8)]
    for rid, tail in (("a", [40, 41]), ("b", [50, 51])):
        sched.add_request(make_request(rid, prompt=prefix + tail, max_tokens=12))
    model = FakeModel(BS)
    result = run_to_completion(sched, model)
    reference = make_scheduler(block_size=BS, max_model_len=24)
    for rid, tail in (("a", [40, 41]), ("b", [50, 51])):
        reference.add_request(make_request(rid, prompt=prefix + tail, max_tokens=12))
    assert result.outputs == run_to_completion(reference, FakeModel(BS)).outputs
    swap = sched.kv_cache_manager.swap_space
    assert sched.num_swap_preemptions > 0
    assert swap.num_swapped_in_blocks < swap.num_swapped_out_blocks


def test_swap_mode_needs_swap_space():
    with pytest.raises(ValueError, match="swap"):
        Scheduler(SchedulerConfig(preemption_mode="swap"), 1024, 16)
