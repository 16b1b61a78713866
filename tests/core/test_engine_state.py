"""The engine state snapshot (core/engine_state.py): why requests wait, and the block map
against the KV manager's own tables and ref counts, through preemption, swap, forks and caching."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from folio.core.engine_state import build_engine_state, expand_runs, run_length
from folio.core.request import RequestStatus
from tests.core.fakes import FakeModel, make_request, make_scheduler

BS = 4
SCHEMA = json.loads((Path(__file__).parents[2] / "folio/entrypoints/openai/dashboard/static/engine_state.schema.json").read_text())


def _step(sched, model):
    out = sched.schedule()
    sched.update_from_output(out, model.execute(out))
    return out


def _state(sched, with_blocks=True):
    """The state, checked against the schema, with its block map expanded to a letter per block."""
    state = build_engine_state(sched, with_blocks=with_blocks)
    jsonschema.validate({**json.loads(json.dumps(state)), "series": None}, SCHEMA)
    if with_blocks:
        state["blocks"] = {k: expand_runs(v) for k, v in state["blocks"].items()}
    return state


def test_run_length_round_trips():
    for states in ("", "f", "ffffoosf", "o" * 1000 + "c" * 3 + "f" * 400_000):
        encoded = run_length(states.encode())
        assert expand_runs(encoded) == states
    assert run_length(b"oooffs") == "o3f2s1"


def _reasons(state):
    return {r["id"]: r["wait_reason"] for r in state["queues"]["waiting"] + state["queues"]["swapped"]}


def test_a_full_batch_keeps_the_head_waiting_for_a_seat_and_the_rest_queued():
    sched, model = make_scheduler(max_num_seqs=1, block_size=BS), FakeModel(BS)
    for rid in "abc":
        sched.add_request(make_request(rid, 5, max_tokens=4))
    assert _reasons(_state(sched)) == {"a": "arrived", "b": "queued", "c": "queued"}
    _step(sched, model)
    state = _state(sched)
    assert [r["id"] for r in state["queues"]["running"]] == ["a"]
    assert _reasons(state) == {"b": "max_num_seqs", "c": "queued"}
    assert state["queues"]["num_running"] == 1 and state["queues"]["num_waiting"] == 2


def test_the_head_waits_for_blocks_or_for_the_token_budget():
    sched, model = make_scheduler(num_blocks=4, block_size=BS, max_model_len=16), FakeModel(BS)
    sched.add_request(make_request("a", 12, max_tokens=4))
    sched.add_request(make_request("b", 8, max_tokens=4))
    _step(sched, model)  # a holds 3 of 4 blocks, b needs 2
    assert _reasons(_state(sched)) == {"b": "no_blocks"}

    sched, model = make_scheduler(block_size=BS, max_num_batched_tokens=8), FakeModel(BS)
    sched.add_request(make_request("a", 8, max_tokens=4))
    sched.add_request(make_request("b", 4, max_tokens=4))
    _step(sched, model)  # a's prompt takes the whole budget
    assert _reasons(_state(sched)) == {"b": "token_budget"}


def test_a_better_priority_newcomer_has_not_been_considered_yet():
    sched, model = make_scheduler(max_num_seqs=1, block_size=BS, policy="priority"), FakeModel(BS)
    sched.add_request(make_request("a", 5, max_tokens=4, priority=1))
    sched.add_request(make_request("b", 5, max_tokens=4, priority=1, arrival_time=1.0))
    _step(sched, model)
    sched.add_request(make_request("c", 5, max_tokens=4, priority=0, arrival_time=2.0))
    state = _state(sched)
    assert [(r["id"], r["priority"], r["wait_reason"]) for r in state["queues"]["waiting"]] == [
        ("c", 0, "arrived"), ("b", 1, "queued")]


def _check_block_map(sched, state):
    """Every block's state follows from the KV manager's tables, ref counts and cache."""
    kv = sched.kv_cache_manager
    device = state["blocks"]["device"]
    assert len(device) == kv.num_blocks
    listed = state["queues"]["running"]
    assert {b for r in listed for b in r["block_ids"]} == {i for i, c in enumerate(device) if c in "os"}
    for r in listed:
        assert r["block_ids"] == list(kv.get_block_ids(r["id"])) and r["num_blocks"] == len(r["block_ids"])
        for b in r["block_ids"]:
            assert device[b] == ("s" if kv.block_pool.ref_count(b) > 1 else "o")
    assert device.count("o") + device.count("s") == state["kv"]["num_used_blocks"] == kv.block_pool.num_used_blocks
    cached = {b for _, b in kv.prefix_cache.items()} if kv.prefix_cache else set()
    assert {i for i, c in enumerate(device) if c == "c"} == {b for b in cached if kv.block_pool.is_free(b)}


def test_the_block_map_shows_shared_prefixes_then_cached_blocks_after_they_finish():
    sched, model = make_scheduler(block_size=BS, enable_prefix_caching=True), FakeModel(BS)
    prompt = list(range(3, 3 + 13))
    sched.add_request(make_request("a", prompt=prompt, max_tokens=6))
    _step(sched, model)
    sched.add_request(make_request("b", prompt=prompt, max_tokens=6))  # a prefix-cache hit
    _step(sched, model)
    state = _state(sched)
    _check_block_map(sched, state)
    assert state["blocks"]["device"].count("s") == 3  # a's three full prompt blocks
    by_id = {r["id"]: r for r in state["queues"]["running"]}
    assert by_id["b"]["cached_tokens"] == 12 and by_id["b"]["block_ids"][:3] == by_id["a"]["block_ids"][:3]
    assert state["counters"]["prefix_cache_hits"] == 12
    while sched.has_unfinished_requests():
        _step(sched, model)
        _check_block_map(sched, _state(sched))
    state = _state(sched)
    assert "o" not in state["blocks"]["device"] and "s" not in state["blocks"]["device"]
    assert state["blocks"]["device"].count("c") == state["kv"]["num_cached_blocks"] > 0


def test_swapped_requests_show_their_cpu_blocks_and_preemptions():
    sched = make_scheduler(num_blocks=8, block_size=BS, max_model_len=24, num_cpu_blocks=16, preemption_mode="swap")
    model = FakeModel(BS)
    for rid, n in (("a", 8), ("b", 7), ("c", 5)):
        sched.add_request(make_request(rid, n, max_tokens=12))
    seen_swapped = False
    while sched.has_unfinished_requests():
        _step(sched, model)
        state = _state(sched)
        _check_block_map(sched, state)
        cpu = state["blocks"]["cpu"]
        for r in state["queues"]["swapped"]:
            seen_swapped = True
            assert r["status"] == "swapped" and r["preemptions"] >= 1 and r["num_blocks"] == 0
            assert r["cpu_block_ids"] and all(cpu[b] == "w" for b in r["cpu_block_ids"])
            assert r["num_cpu_blocks"] == len(r["cpu_block_ids"])
        assert cpu.count("w") == sum(len(r["cpu_block_ids"]) for r in state["queues"]["swapped"])
    assert seen_swapped and state["counters"]["num_swap_preemptions"] > 0


def test_without_the_block_map_nothing_walks_the_blocks():
    sched, model = make_scheduler(block_size=BS), FakeModel(BS)
    sched.add_request(make_request("a", 5, max_tokens=4))
    _step(sched, model)
    state = _state(sched, with_blocks=False)
    assert state["blocks"] is None and "block_ids" not in state["queues"]["running"][0]
    assert state["queues"]["running"][0]["num_blocks"] == 2


def test_lists_are_capped_but_counts_are_not():
    sched = make_scheduler(block_size=BS)
    for i in range(5):
        sched.add_request(make_request(f"r{i}", 4))
    state = build_engine_state(sched, max_listed=2)
    assert len(state["queues"]["waiting"]) == 2 and state["queues"]["num_waiting"] == 5
    with pytest.raises(ValueError, match="max_listed"):
        build_engine_state(sched, max_listed=-1)


def test_finished_requests_leave_the_state():
    sched, model = make_scheduler(block_size=BS), FakeModel(BS)
    sched.add_request(make_request("a", 5, max_tokens=50))
    _step(sched, model)
    sched.finish_requests("a", RequestStatus.FINISHED_ABORTED)
    state = _state(sched)
    assert state["queues"]["running"] == [] and state["kv"]["num_used_blocks"] == 0


def test_a_request_whose_adapter_has_no_slot_waits_for_one():
    from folio.config.scheduler import SchedulerConfig
    from folio.core.scheduler import Scheduler
    from folio.lora.request import LoRARequest

    config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=64)
    sched = Scheduler(config, 64, BS, max_loras=1)
    for i, lora_id in enumerate([1, 2, 2]):
        request = make_request(f"r{i}", 5)
        request.lora_request = LoRARequest(f"adapter{lora_id}", lora_id, f"/adapters/{lora_id}")
        sched.add_request(request)
    _step(sched, FakeModel(BS))
    state = _state(sched)
    assert _reasons(state) == {"r1": "lora_slot", "r2": "queued"}
    assert [r["lora"] for r in state["queues"]["running"]] == ["adapter1"]
