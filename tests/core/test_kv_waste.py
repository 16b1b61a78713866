"""KVWasteMeter: empty slots of the paged cache against contiguous preallocation, exactly."""

from __future__ import annotations

from folio.core.kv_waste import KVWasteMeter
from tests.core.fakes import FakeModel, RunResult, make_request, make_scheduler, step


def test_waste_counts_only_partial_last_blocks_and_shared_ones_once():
    meter = KVWasteMeter(block_size=4, max_model_len=32)
    a, b, c = (make_request(r, 5, max_tokens=3) for r in "abc")
    a.num_computed_tokens, b.num_computed_tokens, c.num_computed_tokens = 5, 7, 6
    # a: [0, 1] (1 token in block 1), b: [2, 3] (3 in block 3), c shares b's blocks (a fork:
    # 2 tokens of block 3 are its own view of the same block, counted at b's fill).
    tables = {"a": [0, 1], "b": [2, 3], "c": [2, 3]}
    meter.sample([a, b, c], tables, num_used_blocks=4)
    assert meter.paged_slots == 16 and meter.paged_empty_slots == (4 - 1) + (4 - 3)
    assert meter.waste_fraction == 4 / 16
    assert meter.tokens == 5 + 7 + 6
    assert meter.prealloc_max_model_len_waste_fraction == 1 - 18 / (3 * 32)
    assert meter.prealloc_max_tokens_waste_fraction == 1 - 18 / (3 * (5 + 3))


def test_the_scheduler_samples_every_step_when_asked():
    sched = make_scheduler(block_size=4, max_model_len=64)
    sched.waste.every = 1
    sched.add_request(make_request("a", 6, max_tokens=2))
    model, result = FakeModel(4), RunResult({}, {}, {}, 0)
    step(sched, model, result)  # 6 tokens in 2 blocks
    step(sched, model, result)  # 7 tokens in 2 blocks
    w = sched.waste
    assert (w.paged_slots, w.paged_empty_slots, w.tokens) == (16, 2 + 1, 13)
    assert w.reserved_max_model_len == 128 and w.reserved_max_tokens == 16


def test_the_meter_takes_one_step_in_every():
    meter = KVWasteMeter(block_size=4, max_model_len=32, every=3)
    a = make_request("a", 5, max_tokens=3)
    a.num_computed_tokens = 5
    for _ in range(7):  # steps 1, 4 and 7 are taken
        meter.sample([a], {"a": [0, 1]}, num_used_blocks=2)
    assert meter.offered == 7 and meter.tokens == 3 * 5 and meter.paged_slots == 3 * 8
