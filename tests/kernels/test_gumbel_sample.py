"""The fused Gumbel-max kernel against its torch reference (same uniforms), and its invariants."""

from __future__ import annotations

import pytest
import torch

from folio.kernels.gumbel_sample import choose_splits, gumbel_sample, gumbel_sample_reference


def _inputs(rows, vocab, device, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(rows, vocab, generator=gen) * 3).to(dtype=dtype, device=device)
    uniform = torch.rand(rows, vocab, generator=gen).to(device)
    temperature = (torch.rand(rows, generator=gen) * 1.5 + 0.1).to(device)
    seeds = torch.randint(0, 2**62, (rows,), generator=gen).to(device)
    return logits, uniform, temperature, seeds


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("splits", [1, 2, 3])
def test_matches_reference_with_the_same_uniforms(device, dtype, splits):
    logits, uniform, temperature, seeds = _inputs(6, 5000, device, dtype, seed=splits)
    logits[1, 50:] = float("-inf")  # a row with few allowed tokens
    uniform[2, 17] = 0.0  # E = inf: that token can never win
    uniform[3, 9] = 1.0 - 2**-24  # the smallest E float32 resolves: finite noise
    got = gumbel_sample(logits, seeds, temperature, splits=splits, uniform=uniform)
    assert torch.equal(got, gumbel_sample_reference(logits, uniform, temperature))
    assert got[1] < 50 and got[2] != 17


def test_philox_draw_depends_on_seed_and_row_only(device):
    logits, _, temperature, seeds = _inputs(5, 4000, device, seed=4)
    base = gumbel_sample(logits, seeds, temperature, splits=1)
    assert torch.equal(base, gumbel_sample(logits, seeds, temperature, splits=3))  # any split
    flipped = gumbel_sample(logits.flip(0).contiguous(), seeds.flip(0).contiguous(), temperature.flip(0).contiguous())
    assert torch.equal(flipped.flip(0), base)  # a row's place in the batch does not matter
    assert not torch.equal(gumbel_sample(logits, seeds + 1, temperature), base)
    assert torch.equal(gumbel_sample(logits, seeds, None), gumbel_sample(logits, seeds, torch.ones_like(temperature)))


def test_all_masked_row_returns_a_token_and_no_nan(device):
    logits = torch.full((2, 3000), float("-inf"), device=device)
    logits[1, 2999] = 0.0
    got = gumbel_sample(logits, torch.tensor([1, 2], device=device), splits=2)
    assert 0 <= got[0] < 3000 and got[1] == 2999


def test_rejects_bad_inputs(device):
    logits, _, temperature, seeds = _inputs(2, 100, device)
    with pytest.raises(ValueError, match="seeds"):
        gumbel_sample(logits, seeds.int(), temperature)
    with pytest.raises(ValueError, match="temperature"):
        gumbel_sample(logits, seeds, temperature.double())
    with pytest.raises(ValueError, match="logits"):
        gumbel_sample(logits.t(), seeds, temperature)


def test_splits_fill_the_device():
    assert choose_splits(256, 151936, 132) == 2
    assert choose_splits(1, 151936, 132) == 9  # 75 chunks of 2048: at least 8 chunks per program
    assert choose_splits(4, 1000, 132) == 1


@pytest.mark.gpu
def test_full_vocab_distribution_on_the_gpu():
    """Qwen3's vocabulary, batch 256 rows of one distribution: frequencies follow softmax(l / T)."""
    vocab, rows, temperature = 151936, 4096, 0.6
    gen = torch.Generator().manual_seed(0)
    logits = torch.full((vocab,), -30.0)
    logits[:16] = torch.randn(16, generator=gen)  # 16 likely tokens among 151,936
    logits = logits.cuda().expand(rows, vocab).contiguous()
    seeds = torch.randint(0, 2**62, (rows,), generator=gen).cuda()
    sampled = gumbel_sample(logits, seeds, torch.full((rows,), temperature, device="cuda"))
    counts = torch.bincount(sampled, minlength=vocab).double().cpu()
    expected = torch.softmax(logits[0].double().cpu() / temperature, dim=-1) * rows
    assert counts[16:].sum() <= 2
    chi2 = float(((counts[:16] - expected[:16]) ** 2 / expected[:16]).sum())
    assert chi2 < 50, chi2  # 15 degrees of freedom
