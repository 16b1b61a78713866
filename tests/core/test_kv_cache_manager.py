"""KVCacheManager: tables grow to cover exactly the tokens asked for, all or nothing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from folio.core.kv_cache_manager import KVCacheManager
from tests.core.fakes import make_request


def test_allocates_only_the_missing_blocks():
    kv = KVCacheManager(num_blocks=10, block_size=4)
    req = make_request("a", 5)
    assert kv.allocate_slots(req, 5)
    table = kv.get_block_ids("a")
    assert table == [0, 1]
    req.num_computed_tokens = 5
    assert kv.allocate_slots(req, 3)  # positions 5..7 fit in block 1
    assert table == [0, 1]
    req.num_computed_tokens = 8
    assert kv.allocate_slots(req, 1)
    # The runner holds this same list: it sees the table grow without being handed it again.
    assert kv.get_block_ids("a") is table and table == [0, 1, 2]
    assert kv.num_free_blocks == 7


def test_failed_allocation_changes_nothing():
    kv = KVCacheManager(num_blocks=3, block_size=4)
    a, b = make_request("a", 8), make_request("b", 8)
    assert kv.allocate_slots(a, 8)
    assert not kv.allocate_slots(b, 8)  # needs 2 blocks, 1 is free
    assert kv.get_block_ids("b") == [] and "b" not in kv.block_tables
    assert kv.num_free_blocks == 1
    a.num_computed_tokens = 8
    assert not kv.allocate_slots(a, 5)  # 8 + 5 tokens need 4 blocks, a has 2, 1 is free
    assert kv.get_block_ids("a") == [0, 1]


def test_free_returns_every_block_and_tolerates_unknown_requests():
    kv = KVCacheManager(num_blocks=4, block_size=2)
    req = make_request("a", 7)
    assert kv.allocate_slots(req, 7)
    assert kv.usage == 1.0
    kv.free(req)
    kv.free(req)  # second free: nothing held, nothing to do
    assert kv.num_free_blocks == 4 and kv.usage == 0.0
    # Freed tail first: the table's last block is the first one reused.
    assert kv.block_pool.free_block_ids() == [3, 2, 1, 0]


def test_rejects_bad_block_size():
    with pytest.raises(ValueError, match="block_size"):
        KVCacheManager(4, 0)


@settings(max_examples=100, deadline=None)
@given(
    block_size=st.integers(1, 5),
    num_blocks=st.integers(1, 12),
    ops=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 9), st.booleans()), max_size=40),
)
def test_tables_cover_computed_tokens_and_never_overlap(block_size, num_blocks, ops):
    kv = KVCacheManager(num_blocks, block_size)
    requests = [make_request(str(i), 1) for i in range(4)]
    for index, num_new, free in ops:
        req = requests[index]
        if free:
            kv.free(req)
            req.num_computed_tokens = 0
            continue
        before = list(kv.get_block_ids(req.request_id))
        free_before = kv.num_free_blocks
        if kv.allocate_slots(req, num_new):
            req.num_computed_tokens += num_new
            table = kv.get_block_ids(req.request_id)
            # Exactly enough blocks for the tokens, old blocks kept in place.
            assert len(table) == -(-req.num_computed_tokens // block_size)
            assert table[: len(before)] == before
        else:
            assert kv.get_block_ids(req.request_id) == before
            assert kv.num_free_blocks == free_before
        owned = [b for table in kv.block_tables.values() for b in table]
        assert len(owned) == len(set(owned))
        assert len(owned) + kv.num_free_blocks == num_blocks
