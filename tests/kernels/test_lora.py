"""LoRA shrink / expand kernels against the token-by-token reference (x A^T B^T * scale).

Adapters are stacked into slots as the manager stacks them (rank zero-padded to r_max, merged
shards' A blocks side by side, scaling folded into B), tokens get slots at random with -1 mixed
in, and the kernels' result is compared with folio.lora.delta.lora_delta_reference, which knows
nothing of slots, padding or grouping.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from folio.kernels.lora_expand import lora_expand_reference, lora_expand_triton
from folio.kernels.lora_shrink import (
    LoRABlocks, block_m, lora_shrink_reference, lora_shrink_triton, num_blocks, plan_blocks, sum_splits,
)
from folio.lora.delta import lora_delta_reference
from folio.lora.mapping import group_tokens_by_slot

# bf16: y reaches ~10, where one bf16 step is 0.0625; the kernel rounds y once, the spec never.
TOL = {torch.float32: (2e-4, 2e-4), torch.bfloat16: (0.13, 2e-2)}


def _stack(adapters, shard_sizes, k, r_max, dtype, device):
    """adapters: per slot, per shard (A [r, K], B [size, r], scale) -> stacked A, B."""
    slots, shards = len(adapters), len(shard_sizes)
    a = torch.zeros(slots, shards * r_max, k)
    b = torch.zeros(slots, sum(shard_sizes), r_max)
    for s, per_shard in enumerate(adapters):
        col = 0
        for j, ((sa, sb, scale), size) in enumerate(zip(per_shard, shard_sizes)):
            r = sa.shape[0]
            a[s, j * r_max : j * r_max + r] = sa
            b[s, col : col + size, :r] = sb * scale
            col += size
    return a.to(device, dtype), b.to(device, dtype)


def _case(tokens, k, shard_sizes, ranks, r_max, seed, none_fraction=0.3):
    gen = torch.Generator().manual_seed(seed)
    adapters = [
        [(torch.randn(r, k, generator=gen) * 0.2, torch.randn(size, r, generator=gen) * 0.2, 0.5 + s)
         for size in shard_sizes]
        for s, r in enumerate(ranks)
    ]
    slots = torch.randint(0, len(ranks), (tokens,), generator=gen)
    slots[torch.rand(tokens, generator=gen) < none_fraction] = -1
    x = torch.randn(tokens, k, generator=gen)
    return adapters, slots, x


def _expected(x, adapters, slots, shard_sizes, base):
    parts = []
    for j in range(len(shard_sizes)):
        per_shard = [per[j] for per in adapters]
        parts.append(lora_delta_reference(x, per_shard, slots.tolist()))
    return base.float() + torch.cat(parts, dim=1)


def _mapping(slots, num_slots, device):
    sorted_tokens, _, counts = group_tokens_by_slot(slots.numpy(), num_slots)
    to = lambda v: torch.from_numpy(np.asarray(v, dtype=np.int32)).to(device)  # noqa: E731
    padded = np.zeros(len(slots), dtype=np.int32)
    padded[: len(sorted_tokens)] = sorted_tokens
    return to(padded), LoRABlocks(*(to(v) for v in plan_blocks(counts, len(slots))))


def _run_kernels(x, a, b, slots, shard_sizes, base, device, split_k=None):
    sorted_tokens, blocks = _mapping(slots, a.shape[0], device)
    shrunk = lora_shrink_triton(x, a, sorted_tokens, blocks, split_k=split_k)
    offsets = torch.tensor([0, *np.cumsum(shard_sizes)], dtype=torch.int32, device=device)
    y = base.clone()
    return lora_expand_triton(y, shrunk, b, offsets, sorted_tokens, blocks, list(shard_sizes))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "tokens,k,shard_sizes,ranks,r_max",
    [
        (13, 40, [24], [4, 8], 8),  # o_proj-like, ranks below r_max (zero padding)
        (21, 48, [40, 20, 20], [8, 3, 16], 16),  # qkv-like: three shards, three As
        (9, 36, [30, 30], [2], 8),  # gate/up-like, one adapter
        (70, 40, [24, 8], [4, 8], 8),  # ~25 tokens per slot: several blocks of 16 per slot
    ],
)
def test_kernels_match_token_by_token_reference(device, dtype, tokens, k, shard_sizes, ranks, r_max):
    adapters, slots, x = _case(tokens, k, shard_sizes, ranks, r_max, seed=tokens)
    a, b = _stack(adapters, shard_sizes, k, r_max, dtype, device)
    base = (torch.randn(tokens, sum(shard_sizes), generator=torch.Generator().manual_seed(1)) * 3).to(device, dtype)
    xd = x.to(device, dtype)
    expected = _expected(xd.float().cpu(), adapters, slots, shard_sizes, base.cpu())
    got = _run_kernels(xd, a, b, slots, shard_sizes, base, device)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(got.float().cpu(), expected, atol=atol, rtol=rtol)
    untouched = slots == -1
    assert torch.equal(got.cpu()[untouched], base.cpu()[untouched]), "tokens without an adapter keep y"
    # the torch references (the CPU path) agree with the same specification
    ref = lora_expand_reference(base.clone(), lora_shrink_reference(xd, a, slots.to(device)), b, slots.to(device), shard_sizes)
    torch.testing.assert_close(ref.float().cpu(), expected, atol=atol, rtol=rtol)


def test_split_k_partials_add_up(device):
    adapters, slots, x = _case(10, 200, [16], [4, 4], 4, seed=3, none_fraction=0.0)
    a, b = _stack(adapters, [16], 200, 4, torch.float32, device)
    base = torch.zeros(10, 16, device=device)
    one = _run_kernels(x.to(device), a, b, slots, [16], base, device, split_k=1)
    three = _run_kernels(x.to(device), a, b, slots, [16], base, device, split_k=3)
    torch.testing.assert_close(one, three, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_expand_sums_kept_partials_as_it_loads_them(device, dtype):
    """keep_splits: the expand reads the shrink's split-K partials and adds them in split order
    as it loads them: bit for bit the expand of their sum (sum_splits), one launch fewer; the
    torch reference takes the partials too."""
    adapters, slots, x = _case(12, 200, [16, 8], [4, 4], 4, seed=4, none_fraction=0.25)
    a, b = _stack(adapters, [16, 8], 200, 4, dtype, device)
    base = torch.randn(12, 24, generator=torch.Generator().manual_seed(2)).to(device, dtype)
    sorted_tokens, blocks = _mapping(slots, a.shape[0], device)
    xd = x.to(device, dtype)
    partials = lora_shrink_triton(xd, a, sorted_tokens, blocks, split_k=3, keep_splits=True)
    assert partials.shape == (3, 12, 8)
    offsets = torch.tensor([0, 16, 24], dtype=torch.int32, device=device)
    kept = lora_expand_triton(base.clone(), partials, b, offsets, sorted_tokens, blocks, [16, 8])
    summed = lora_expand_triton(base.clone(), sum_splits(partials), b, offsets, sorted_tokens, blocks, [16, 8])
    assert torch.equal(kept, summed)
    ref = lora_expand_reference(base.clone(), partials, b, slots.to(device), [16, 8])
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(kept.float(), ref.float(), atol=atol, rtol=rtol)
    assert not torch.equal(kept, base)


def test_no_adapter_tokens_is_a_no_op(device):
    adapters, slots, x = _case(7, 32, [16], [4], 4, seed=5, none_fraction=1.0)
    a, b = _stack(adapters, [16], 32, 4, torch.float32, device)
    base = torch.randn(7, 16).to(device)
    assert torch.equal(_run_kernels(x.to(device), a, b, slots, [16], base, device), base)


def test_grouping():
    sorted_tokens, starts, counts = group_tokens_by_slot(np.array([2, -1, 0, 2, 0, -1, 1]), 4)
    assert sorted_tokens.tolist() == [2, 4, 6, 0, 3]
    assert starts.tolist() == [0, 2, 3, 5] and counts.tolist() == [2, 1, 2, 0]


@pytest.mark.parametrize("tokens", [7, 100, 1024, 1500])
def test_blocks_cover_each_group_once(tokens):
    rng = np.random.default_rng(tokens)
    counts = rng.multinomial(tokens - 3, [0.5, 0.0, 0.3, 0.2])  # an empty slot, 3 tokens without one
    slots, starts, ends = plan_blocks(counts, tokens)
    assert len(slots) == num_blocks(tokens, 4)
    covered = np.zeros(tokens, dtype=int)
    group_start = np.concatenate(([0], np.cumsum(counts)[:-1]))
    for slot, start, end in zip(slots, starts, ends):
        if slot < 0:
            continue
        assert group_start[slot] <= start < end == group_start[slot] + counts[slot]
        covered[start : min(start + block_m(tokens), end)] += 1
    assert covered[: counts.sum()].tolist() == [1] * counts.sum() and not covered[counts.sum():].any()


def test_rejects_bad_shapes(device):
    x = torch.randn(4, 32, device=device)
    a = torch.zeros(2, 8, 30, device=device)
    i32 = torch.zeros(4, dtype=torch.int32, device=device)
    blocks = LoRABlocks(*(torch.zeros(8, dtype=torch.int32, device=device) for _ in range(3)))
    with pytest.raises(ValueError, match="lora_a"):
        lora_shrink_triton(x, a, i32, blocks)
    with pytest.raises(ValueError, match="block slots"):
        lora_shrink_triton(x, torch.zeros(2, 8, 32, device=device), i32, LoRABlocks(i32[:1], i32[:1], i32[:1]))
    with pytest.raises(ValueError, match="shard sizes"):
        lora_expand_triton(torch.zeros(4, 16, device=device), torch.zeros(4, 8, device=device),
                           torch.zeros(2, 16, 8, device=device), torch.zeros(2, dtype=torch.int32, device=device),
                           i32, blocks, [10])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tokens", [1, 7, 256, 2048])
@pytest.mark.parametrize("shape", [(4096, [4096, 1024, 1024]), (4096, [14336, 14336]), (14336, [4096])])
def test_full_size_on_gpu(dtype, tokens, shape):
    k, shard_sizes = shape
    adapters, slots, x = _case(tokens, k, shard_sizes, [16] * 8, 16, seed=tokens)
    a, b = _stack(adapters, shard_sizes, k, 16, dtype, "cuda")
    base = torch.randn(tokens, sum(shard_sizes)).to("cuda", dtype)
    xd = x.to("cuda", dtype)
    got = _run_kernels(xd, a, b, slots, shard_sizes, base, "cuda")
    s = slots.cuda()
    ref = lora_expand_reference(base.clone(), lora_shrink_reference(xd, a, s), b, s, shard_sizes)
    # Summation order differs (tensor-core dots, split K): a shrink value may round to the next
    # bf16 step, which B multiplies; bound the error by the outputs' scale, not element-wise.
    scale = ref.float().abs().max().item()
    torch.testing.assert_close(got.float(), ref.float(), atol=2e-2 * scale, rtol=0)
    untouched = (slots == -1).cuda()
    assert torch.equal(got[untouched], base[untouched])
