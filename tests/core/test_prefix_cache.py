"""Prefix caching in core: chained block hashes, hits, the last-token rule, LRU eviction, and
outputs unchanged by any of it (FakeModel checks every K/V read against its true prefix)."""

from __future__ import annotations

from folio.core.block_hash import hash_block, lazy_block_hashes, request_block_hashes
from folio.core.kv_cache_manager import KVCacheManager
from folio.core.prefix_cache import PrefixCache
from tests.core.fakes import FakeModel, RunResult, make_request, make_scheduler, run_to_completion, step

BS = 4


def _prompt(n: int, offset: int = 0) -> list[int]:
    return [3 + (i + offset) % 60 for i in range(n)]


# ---- hashes ---------------------------------------------------------------------------------
def test_block_hash_depends_on_the_whole_prefix_and_the_salt():
    a = hash_block(None, [5, 6, 7, 8])
    assert a == hash_block(None, [5, 6, 7, 8])
    assert hash_block(a, [1, 2, 3, 4]) != hash_block(hash_block(None, [5, 6, 7, 9]), [1, 2, 3, 4])
    assert hash_block(None, [5, 6, 7, 8], b"tenant-a") != a
    # Token ids are not confused by their byte layout: [1, 256] is not [256, 1] nor [257].
    assert len({hash_block(None, t) for t in ([1, 256], [256, 1], [257])}) == 3


def test_request_block_hashes_cover_full_blocks_only_and_are_kept():
    req = make_request("a", prompt=_prompt(10))
    hashes = request_block_hashes(req, BS, 2)
    assert len(hashes) == 2 and req.block_hashes == hashes
    other = make_request("b", prompt=_prompt(8) + [99, 99])
    assert request_block_hashes(other, BS, 2) == hashes  # same first 8 tokens
    salted = make_request("c", prompt=_prompt(10))
    salted.cache_salt = "x"
    assert request_block_hashes(salted, BS, 1) != hashes[:1]


def test_request_block_hashes_equal_the_chain_of_hash_block_when_extended_in_parts():
    """The packed path (one array for the new blocks) hashes exactly what hash_block does, block
    by block, salt in the first block only, across calls that each add some blocks."""
    from folio.core.block_hash import first_block_extra

    req = make_request("a", prompt=[70000 + 3 * i for i in range(23)])  # ids past 16 bits
    req.cache_salt = "tenant"
    expected, parent = [], None
    for i in range(5):
        parent = hash_block(parent, req.all_token_ids[i * BS : (i + 1) * BS], first_block_extra(req) if i == 0 else b"")
        expected.append(parent)
    assert request_block_hashes(req, BS, 2) == expected[:2]
    assert request_block_hashes(req, BS, 2) == expected[:2]  # nothing new: nothing rehashed
    assert request_block_hashes(req, BS, 5) == expected and req.block_hashes == expected


def test_lazy_block_hashes_are_the_same_chain_computed_only_as_far_as_read():
    req = make_request("a", prompt=[70000 + 3 * i for i in range(41)])  # 10 full blocks
    lazy = lazy_block_hashes(req, BS, 10, batch=3)
    first = [next(lazy), next(lazy)]
    assert len(req.block_hashes) == 3  # one batch
    expected = request_block_hashes(make_request("b", prompt=[70000 + 3 * i for i in range(41)]), BS, 10)
    assert first + list(lazy) == expected and req.block_hashes == expected
    assert list(lazy_block_hashes(req, BS, 7, batch=3)) == expected[:7]  # kept: nothing past 7
    assert list(lazy_block_hashes(req, BS, 0)) == []


def test_a_long_prompt_hashes_no_further_than_its_first_miss():
    kv = KVCacheManager(512, BS, enable_prefix_caching=True)
    a = make_request("a", prompt=_prompt(400))  # 100 blocks, all cached once computed
    _computed(kv, a, 400)
    b = make_request("b", prompt=_prompt(300) + _prompt(500, offset=7))  # 75 blocks in common
    assert kv.find_cached_prefix(b).num_tokens == 300
    assert len(b.block_hashes) < 75 + 32  # stopped within the batch of its first miss
    fresh = make_request("c", prompt=_prompt(800, offset=1))
    assert kv.find_cached_prefix(fresh).num_tokens == 0 and len(fresh.block_hashes) == 32
    assert kv.allocate_slots(fresh, 400) and len(fresh.block_hashes) == 100  # its chunk's blocks


def test_prefix_cache_index_stays_one_to_one():
    cache = PrefixCache()
    assert cache.insert(3, b"h1") and not cache.insert(4, b"h1") and not cache.insert(3, b"h2")
    assert cache.lookup([b"h1", b"h2"]) == [3]
    cache.evict(3)
    assert cache.lookup([b"h1"]) == [] and cache.num_evicted_blocks == 1
    cache.evict(3)  # not cached: nothing to count
    assert cache.num_evicted_blocks == 1


# ---- the manager --------------------------------------------------------------------------
def _computed(kv: KVCacheManager, req, num_tokens: int) -> None:
    assert kv.allocate_slots(req, num_tokens)
    req.num_computed_tokens = num_tokens


def test_hit_shares_full_blocks_and_leaves_the_last_token_to_compute():
    kv = KVCacheManager(16, BS, enable_prefix_caching=True)
    a = make_request("a", prompt=_prompt(12))
    _computed(kv, a, 12)
    # Same 12 tokens: all three blocks are cached, but the last token must be computed for its
    # logits, so only 2 blocks are shared and the third is recomputed into a fresh block.
    b = make_request("b", prompt=_prompt(12))
    prefix = kv.find_cached_prefix(b)
    assert prefix.block_ids == kv.get_block_ids("a")[:2] and prefix.num_tokens == 8
    c = make_request("c", prompt=_prompt(9) + [70, 71, 72])  # 2 blocks in common
    assert kv.find_cached_prefix(c).num_tokens == 8
    d = make_request("d", prompt=_prompt(3))  # shorter than a block
    assert kv.find_cached_prefix(d).num_tokens == 0
    e = make_request("e", prompt=_prompt(12, offset=1))  # shares nothing
    assert kv.find_cached_prefix(e).num_tokens == 0
    assert kv.allocate_slots(b, 4, prefix)
    assert kv.get_block_ids("b")[:2] == kv.get_block_ids("a")[:2]
    assert [kv.block_pool.ref_count(x) for x in kv.get_block_ids("b")] == [2, 2, 1]


def test_freed_blocks_stay_cached_until_evicted_least_recently_used_first():
    kv = KVCacheManager(6, BS, enable_prefix_caching=True)
    a, b = make_request("a", prompt=_prompt(8)), make_request("b", prompt=_prompt(8, 30))
    _computed(kv, a, 8)
    _computed(kv, b, 8)
    kv.free(a)  # freed first: evicted first
    kv.free(b)
    assert kv.num_free_blocks == 6 and kv.prefix_cache.num_cached_blocks == 4
    again = make_request("a2", prompt=_prompt(8) + [1])
    assert kv.find_cached_prefix(again).num_tokens == 8  # a is still there
    filler = make_request("f", prompt=_prompt(16, 40))
    # The 2 never-used blocks go first, then a's last block (a table is freed tail first:
    # its last blocks are the least likely to be shared).
    assert kv.allocate_slots(filler, 12)
    assert kv.find_cached_prefix(again).num_tokens == 4
    filler.num_computed_tokens = 12
    assert kv.allocate_slots(filler, 4)  # a's first block goes too
    assert kv.find_cached_prefix(again).num_tokens == 0
    assert kv.find_cached_prefix(make_request("b2", prompt=_prompt(8, 30) + [1])).num_tokens == 8
    assert kv.prefix_cache.num_evicted_blocks == 2


def test_hit_on_free_blocks_counts_them_as_allocations():
    kv = KVCacheManager(3, BS, enable_prefix_caching=True)
    a = make_request("a", prompt=_prompt(8))
    _computed(kv, a, 8)
    kv.free(a)
    b = make_request("b", prompt=_prompt(8) + [7, 7, 7, 7, 7])
    prefix = kv.find_cached_prefix(b)
    assert prefix.num_tokens == 8
    # 2 revived + 2 new blocks > 3 free: refused, and nothing moved.
    assert not kv.allocate_slots(b, 5, prefix)
    assert kv.num_free_blocks == 3 and kv.find_cached_prefix(b).num_tokens == 8
    assert kv.allocate_slots(b, 4, prefix)  # 2 revived + 1 new
    assert kv.num_free_blocks == 0


# ---- the scheduler --------------------------------------------------------------------------
def _run(specs, **kwargs):
    sched = make_scheduler(block_size=BS, **kwargs)
    for rid, prompt, max_tokens in specs:
        sched.add_request(make_request(rid, prompt=prompt, max_tokens=max_tokens))
    model = FakeModel(BS)
    return sched, model, run_to_completion(sched, model)


def test_shared_prefixes_compute_once_and_outputs_do_not_change():
    system = _prompt(16)
    specs = [
        ("all", list(system), 5),
        ("none", _prompt(10, 20), 5),  # shares 0 blocks with it
        ("one", system[:4] + _prompt(9, 33), 5),  # 1 block
        ("many", system + _prompt(3, 7), 5),  # 4 blocks
        ("all2", list(system), 5),  # all 4 blocks, but the last is recomputed for its logits
    ]
    _, _, plain = _run(specs)
    sched, model, cached = _run(specs, enable_prefix_caching=True, max_num_seqs=1)
    assert cached.outputs == plain.outputs
    first_share = {}
    for out in model.steps:
        for s in out.scheduled:
            first_share.setdefault(s.request_id, s.num_computed_tokens)
    assert first_share == {"all": 0, "none": 0, "one": 4, "many": 16, "all2": 12}
    kv = sched.kv_cache_manager
    assert kv.prefix_cache_hits == 4 + 16 + 12
    assert kv.prefix_cache_queries == 16 + 10 + 13 + 19 + 16


def test_requests_arriving_together_share_blocks_computed_in_the_same_step():
    system = _prompt(12)
    specs = [(f"r{i}", system + [50 + i], 3) for i in range(4)]
    sched, model, result = _run(specs, enable_prefix_caching=True)
    first = model.steps[0]
    assert [(s.num_computed_tokens, s.num_new_tokens) for s in first.scheduled] == [
        (0, 13), (12, 1), (12, 1), (12, 1)]
    _, _, plain = _run(specs)
    assert result.outputs == plain.outputs
    assert sched.kv_cache_manager.num_free_blocks == 64


def test_num_cached_tokens_is_reported_once_the_request_starts():
    sched = make_scheduler(block_size=BS, enable_prefix_caching=True, max_num_seqs=1)
    model, result = FakeModel(BS), RunResult({}, {}, {}, 0)
    sched.add_request(make_request("a", prompt=_prompt(9), max_tokens=1))
    sched.add_request(make_request("b", prompt=_prompt(9), max_tokens=1))
    outs = []
    while sched.has_unfinished_requests():
        out = sched.schedule()
        outs += sched.update_from_output(out, model.execute(out))
    assert {o.request_id: o.num_cached_tokens for o in outs} == {"a": 0, "b": 8}
    del result


def test_preempted_request_resumes_from_its_cached_blocks():
    # a and b do not fit together; b is preempted, and its full blocks stay cached (nothing
    # else needs them), so its recompute is mostly cache hits.
    specs = [("a", _prompt(8), 12), ("b", _prompt(8, 30), 12)]
    sched, model, result = _run(specs, num_blocks=7, max_model_len=24, enable_prefix_caching=True)
    _, _, plain = _run(specs, max_model_len=24)
    assert result.outputs == plain.outputs
    assert sched.num_preemptions >= 1
    resumed = [s for out in model.steps for s in out.scheduled
               if s.request_id == "b" and s.num_computed_tokens > 0 and s.num_new_tokens > 1]
    assert resumed, "b recomputed everything"
    assert sched.kv_cache_manager.num_free_blocks == 7


def test_prompt_logprobs_requests_do_not_read_the_cache():
    sched = make_scheduler(block_size=BS, enable_prefix_caching=True, max_num_seqs=1)
    model, result = FakeModel(BS), RunResult({}, {}, {}, 0)
    sched.add_request(make_request("a", prompt=_prompt(9), max_tokens=1))
    run_to_completion(sched, model)
    b = make_request("b", prompt=_prompt(9), max_tokens=1)
    b.sampling_params.prompt_logprobs = 1
    sched.add_request(b)
    out = step(sched, model, result)
    assert out.scheduled[0].num_computed_tokens == 0
