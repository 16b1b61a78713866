"""The LoRA admission rule and the adapter in the prefix-cache key, on fake requests (no torch)."""

from __future__ import annotations

from folio.config.scheduler import SchedulerConfig
from folio.core.block_hash import request_block_hashes
from folio.core.scheduler import Scheduler
from folio.lora.request import LoRARequest
from tests.core.fakes import FakeModel, RunResult, make_request, step


def _with_adapter(request_id: str, lora_id: int, **kwargs):
    request = make_request(request_id, **kwargs)
    if lora_id:
        request.lora_request = LoRARequest(f"adapter{lora_id}", lora_id, f"/adapters/{lora_id}")
    return request


def _scheduler(max_loras: int | None, *, prefix_caching: bool = False) -> Scheduler:
    config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=64)
    return Scheduler(config, 64, 4, enable_prefix_caching=prefix_caching, max_loras=max_loras)


def test_a_step_never_mixes_more_adapters_than_slots_and_all_finish():
    scheduler = _scheduler(2)
    model = FakeModel(4)
    ids = [1, 2, 3, 0, 1, 3, 2, 0, 3]  # 0: base model
    for i, lora_id in enumerate(ids):
        scheduler.add_request(_with_adapter(f"r{i}", lora_id, max_tokens=4))
    result = RunResult({}, {}, {}, 0)
    seen_per_step = []
    while scheduler.has_unfinished_requests():
        assert result.num_steps < 200
        out = step(scheduler, model, result)
        adapters = {s.request.lora_int_id for s in out.scheduled} - {0}
        assert len(adapters) <= 2, adapters
        seen_per_step.append(adapters)
    assert set(result.finish_reasons) == {f"r{i}" for i in range(len(ids))}
    # The first step admits adapters 1 and 2 and the base requests behind adapter 3's (held).
    assert {s.request_id for s in model.steps[0].scheduled} == {"r0", "r1", "r3", "r4", "r6", "r7"}
    assert any(3 in s for s in seen_per_step), "adapter 3 runs once a slot frees"


def test_without_lora_every_request_is_admitted():
    scheduler = _scheduler(None)
    for i in range(5):
        scheduler.add_request(_with_adapter(f"r{i}", i + 1))
    assert len(scheduler.schedule().scheduled) == 5


def test_held_requests_keep_their_place_in_the_queue():
    scheduler = _scheduler(1)
    for i, lora_id in enumerate([1, 2, 2, 1]):
        scheduler.add_request(_with_adapter(f"r{i}", lora_id))
    assert [s.request_id for s in scheduler.schedule().scheduled] == ["r0", "r3"]
    assert [r.request_id for r in scheduler.waiting] == ["r1", "r2"]


def test_block_hash_depends_on_the_adapter():
    prompt = list(range(3, 15))
    base = make_request("a", prompt=prompt)
    one = _with_adapter("b", 1, prompt=prompt)
    one_again = _with_adapter("c", 1, prompt=prompt)
    two = _with_adapter("d", 2, prompt=prompt)
    hashes = [request_block_hashes(r, 4, 3) for r in (base, one, one_again, two)]
    assert hashes[1] == hashes[2]
    assert len({tuple(h) for h in hashes}) == 3
    assert all(len(set(h[i] for h in (hashes[0], hashes[1], hashes[3]))) == 3 for i in range(3))
    salted = _with_adapter("e", 1, prompt=prompt)
    salted.cache_salt = "x"
    assert request_block_hashes(salted, 4, 1) != hashes[1][:1]


def test_prefix_cache_never_crosses_adapters():
    scheduler = _scheduler(4, prefix_caching=True)
    model = FakeModel(4)
    prompt = list(range(3, 20))
    result = RunResult({}, {}, {}, 0)
    for request_id, lora_id in (("first", 1), ("other", 2), ("same", 1), ("base", 0)):
        scheduler.add_request(_with_adapter(request_id, lora_id, prompt=prompt, max_tokens=2))
        while scheduler.has_unfinished_requests():
            step(scheduler, model, result)
    assert scheduler.kv_cache_manager.prefix_cache_hits == 16, "only 'same' hits: adapter 1's 4 full blocks"


def test_no_salt_spells_an_adapter():
    """A base-model request whose cache_salt is an adapter's key bytes (a user picks the salt,
    and /v1/models shows the adapter's path) must not hash like that adapter's requests."""
    prompt = list(range(3, 15))
    adapter = _with_adapter("a", 1, prompt=prompt)
    forged = make_request("b", prompt=prompt)
    forged.cache_salt = (b"\0\0\0\0" + adapter.lora_request.cache_key()).decode()
    assert request_block_hashes(forged, 4, 1) != request_block_hashes(adapter, 4, 1)
    salted = _with_adapter("c", 1, prompt=prompt)
    salted.cache_salt = "s"
    forged.cache_salt = (b"\1\0\0\0s" + adapter.lora_request.cache_key()).decode()
    forged.block_hashes.clear()
    assert request_block_hashes(forged, 4, 1) != request_block_hashes(salted, 4, 1)
