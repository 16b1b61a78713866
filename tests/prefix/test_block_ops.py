"""Block moves on a real KV tensor (CPU): copies, swap round trips, and the order of a step's
moves when blocks freed by one move are reused by the next."""

from __future__ import annotations

import pytest
import torch

from folio.core.scheduler_output import SchedulerOutput
from folio.worker.block_ops import SwapPool, _runs, apply_block_moves, copy_blocks
from folio.worker.kv_cache import KVCacheSpec

SPEC = KVCacheSpec(num_layers=3, block_size=4, num_kv_heads=2, head_dim=5, dtype=torch.float32)


def _cache(num_blocks: int = 8) -> torch.Tensor:
    # Block b of layer l, K or V, holds the value 1000 * b + 10 * l + kv everywhere.
    shape = (SPEC.num_layers, 2, num_blocks, SPEC.block_size, SPEC.num_kv_heads, SPEC.head_dim)
    cache = torch.zeros(shape)
    for b in range(num_blocks):
        for layer in range(SPEC.num_layers):
            for kv in range(2):
                cache[layer, kv, b] = 1000 * b + 10 * layer + kv
    return cache


def _block(cache: torch.Tensor, b: int) -> torch.Tensor:
    return cache[:, :, b].clone()


def _moves(**kwargs) -> SchedulerOutput:
    return SchedulerOutput(scheduled=[], total_num_scheduled_tokens=0, **kwargs)


def test_copies_read_every_source_before_writing():
    cache = _cache()
    before = cache.clone()
    copy_blocks(cache, [(1, 2), (2, 3)])  # 3 gets 2's old contents, not 1's
    assert torch.equal(cache[:, :, 2], before[:, :, 1])
    assert torch.equal(cache[:, :, 3], before[:, :, 2])
    assert torch.equal(cache[:, :, 1], before[:, :, 1])


def test_swap_round_trip_restores_every_layer():
    cache, pool = _cache(), SwapPool(SPEC, 6, torch.device("cpu"))
    before = cache.clone()
    apply_block_moves(cache, pool, _moves(blocks_to_swap_out=((5, 0), (2, 1), (7, 4))))
    cache.zero_()
    apply_block_moves(cache, pool, _moves(blocks_to_swap_in=((1, 6), (4, 0), (0, 3))))
    assert torch.equal(cache[:, :, 6], before[:, :, 2])
    assert torch.equal(cache[:, :, 0], before[:, :, 7])
    assert torch.equal(cache[:, :, 3], before[:, :, 5])


def test_a_step_swaps_out_then_copies_then_swaps_in():
    # Block 4 is swapped out and, in the same step, reused as a copy destination; block 5 is
    # a copy source that is then overwritten by a swap-in. Each move must see the contents
    # the scheduler assumed: swap-outs first, then copies, then swap-ins.
    cache, pool = _cache(), SwapPool(SPEC, 4, torch.device("cpu"))
    before = cache.clone()
    pool.tensor[2] = 7.0
    apply_block_moves(cache, pool, _moves(
        blocks_to_swap_out=((4, 0),),
        blocks_to_copy=((5, 4),),
        blocks_to_swap_in=((2, 5),),
    ))
    assert torch.equal(pool.tensor[0], before[:, :, 4])
    assert torch.equal(cache[:, :, 4], before[:, :, 5])
    assert bool((cache[:, :, 5] == 7.0).all())


def test_runs_group_consecutive_cpu_blocks():
    assert _runs([3, 4, 5, 9, 10, 2]) == [(0, 3, 3), (3, 9, 2), (5, 2, 1)]


def test_swapping_without_a_pool_is_an_error():
    with pytest.raises(RuntimeError, match="swap pool"):
        apply_block_moves(_cache(), None, _moves(blocks_to_swap_out=((1, 0),)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_swap_round_trip_on_the_gpu_through_pinned_memory():
    cache = _cache(16).cuda()
    pool = SwapPool(SPEC, 8, torch.device("cuda"))
    before = cache.clone()
    apply_block_moves(cache, pool, _moves(blocks_to_swap_out=((3, 5), (4, 6), (9, 0))))
    assert pool.tensor.is_pinned()
    cache.zero_()
    apply_block_moves(cache, pool, _moves(blocks_to_swap_in=((5, 1), (6, 2), (0, 15))))
    torch.cuda.synchronize()
    assert torch.equal(cache[:, :, 1], before[:, :, 3])
    assert torch.equal(cache[:, :, 2], before[:, :, 4])
    assert torch.equal(cache[:, :, 15], before[:, :, 9])


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a GPU"))])
def test_fp8_cache_copies_and_swaps_bit_exactly(device):
    """kv_cache_dtype="fp8": copy-on-write copies and swaps move e4m3 codes untouched (indexing
    of float8 tensors is a per-device kernel torch may lack)."""
    spec = KVCacheSpec(num_layers=3, block_size=4, num_kv_heads=2, head_dim=5, dtype=torch.float8_e4m3fn)
    cache = (_cache(16) / 100).to(torch.float8_e4m3fn).to(device)
    pool = SwapPool(spec, 8, torch.device(device))
    before = cache.clone()
    apply_block_moves(cache, pool, _moves(blocks_to_swap_out=((3, 5), (9, 0)), blocks_to_copy=((1, 12),)))
    apply_block_moves(cache, pool, _moves(blocks_to_swap_in=((5, 2), (0, 15))))
    if device == "cuda":
        torch.cuda.synchronize()
    bits = lambda t: t.view(torch.uint8)  # noqa: E731  compare codes: float8 == is not everywhere
    assert torch.equal(bits(cache[:, :, 12]), bits(before[:, :, 1]))
    assert torch.equal(bits(cache[:, :, 2]), bits(before[:, :, 3]))
    assert torch.equal(bits(cache[:, :, 15]), bits(before[:, :, 9]))
