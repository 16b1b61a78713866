"""BlockPool: free-list order, all-or-nothing allocation, reference counts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from folio.core.block_pool import BlockPool, NoFreeBlocksError


def test_allocates_from_head_and_frees_to_tail():
    pool = BlockPool(6)
    assert pool.allocate(3) == [0, 1, 2]
    pool.free([2, 0])
    # 2 and 0 were freed last, in that order: they are reused only after 3, 4, 5.
    assert pool.free_block_ids() == [3, 4, 5, 2, 0]
    assert pool.allocate(4) == [3, 4, 5, 2]


def test_allocation_is_all_or_nothing():
    pool = BlockPool(4)
    pool.allocate(3)
    assert not pool.can_allocate(2)
    with pytest.raises(NoFreeBlocksError):
        pool.allocate(2)
    assert pool.num_free_blocks == 1
    assert pool.allocate(1) == [3]


def test_shared_block_is_freed_by_its_last_reference():
    pool = BlockPool(2)
    [block] = pool.allocate(1)
    pool.incref([block])
    assert pool.ref_count(block) == 2
    pool.free([block])
    assert not pool.is_free(block) and pool.num_free_blocks == 1
    pool.free([block])
    assert pool.is_free(block) and pool.num_free_blocks == 2


def test_double_free_is_an_error():
    pool = BlockPool(2)
    [block] = pool.allocate(1)
    pool.free([block])
    with pytest.raises(ValueError, match="already free"):
        pool.free([block])


def test_incref_of_a_free_block_takes_it_off_the_free_list():
    # How a prefix-cache hit will revive a freed block that still holds its K/V.
    pool = BlockPool(3)
    pool.incref([1])
    assert pool.free_block_ids() == [0, 2]
    assert pool.allocate(2) == [0, 2]


def test_usage_counts_blocks_in_use():
    pool = BlockPool(4)
    assert pool.usage == 0.0
    pool.allocate(1)
    assert pool.usage == 0.25
    with pytest.raises(ValueError):
        BlockPool(0)


_ops = st.lists(
    st.tuples(st.sampled_from(["allocate", "free", "incref"]), st.integers(0, 5)), max_size=60
)


@settings(max_examples=150, deadline=None)
@given(num_blocks=st.integers(1, 8), ops=_ops)
def test_ref_counts_match_a_model(num_blocks, ops):
    """Against a plain model of held references: counts, free list and totals always agree."""
    pool = BlockPool(num_blocks)
    held: list[int] = []  # one entry per reference the "callers" hold
    for op, n in ops:
        if op == "allocate":
            if pool.can_allocate(n):
                new = pool.allocate(n)
                assert len(new) == n and not set(new) & set(held)
                held += new
            else:
                before = pool.free_block_ids()
                with pytest.raises(NoFreeBlocksError):
                    pool.allocate(n)
                assert pool.free_block_ids() == before
        elif op == "free" and held:
            pool.free([held.pop(n % len(held))])
        elif op == "incref" and held:
            block = held[n % len(held)]
            pool.incref([block])
            held.append(block)
        free = pool.free_block_ids()
        assert len(free) == len(set(free)) == pool.num_free_blocks
        assert pool.num_free_blocks + len(set(held)) == num_blocks
        for block in range(num_blocks):
            assert pool.ref_count(block) == held.count(block)
            assert pool.is_free(block) == (block not in held)
