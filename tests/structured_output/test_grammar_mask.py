"""GrammarMask: the packed bitmask unpacks to exactly the tokens xgrammar allows, only
constrained rows change, and (on a GPU) the device path equals the CPU one."""

from __future__ import annotations

import pytest
import torch
import xgrammar as xgr

from folio.kernels.grammar_mask import apply_token_bitmask_reference, apply_token_bitmask_triton
from folio.sample.grammar_mask import GrammarMask, bitmask_words, unpack_bitmask


def test_unpack_matches_bit_arithmetic():
    gen = torch.Generator().manual_seed(0)
    vocab = 1000
    words = torch.randint(-(2**31), 2**31 - 1, (3, bitmask_words(vocab)), dtype=torch.int32, generator=gen)
    allowed = unpack_bitmask(words, vocab)  # [3, vocab]
    for row in range(3):
        for token in (0, 1, 31, 32, 63, 500, 999):
            bit = (int(words[row, token // 32]) >> (token % 32)) & 1
            assert bool(allowed[row, token]) == bool(bit)


def test_apply_matches_xgrammar_and_leaves_other_rows(device=torch.device("cpu")):
    gen = torch.Generator().manual_seed(1)
    vocab = 1000
    logits = torch.randn(4, vocab, generator=gen).to(device)  # [4, vocab]
    words = torch.randint(-(2**31), 2**31 - 1, (2, bitmask_words(vocab)), dtype=torch.int32, generator=gen)
    expected = logits.clone().cpu()
    reference = expected[[1, 3]].clone()
    xgr.apply_token_bitmask_inplace(reference, words)  # xgrammar's own application
    expected[[1, 3]] = reference
    mask = GrammarMask(torch.tensor([1, 3], device=device), words.to(device))
    mask.apply(logits)
    assert torch.equal(logits.cpu(), expected)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_apply_on_cuda_equals_cpu():
    test_apply_matches_xgrammar_and_leaves_other_rows(torch.device("cuda"))


@pytest.mark.parametrize("vocab", [1000, 1024, 2100])
def test_triton_kernel_equals_reference(vocab):
    """Through Triton's interpreter on the CPU (on a GPU by the test above at full speed)."""
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(5, vocab, generator=gen)  # [5, vocab]
    words = torch.randint(-(2**31), 2**31 - 1, (3, bitmask_words(vocab)), dtype=torch.int32, generator=gen)
    rows = torch.tensor([4, 0, 2])
    expected, got = logits.clone(), logits.clone()
    apply_token_bitmask_reference(expected, words, rows)
    apply_token_bitmask_triton(got, words, rows)
    assert torch.equal(got, expected)
