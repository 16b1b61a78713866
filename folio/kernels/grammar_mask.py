"""Grammar bitmask: -inf on the logits of tokens a packed int32 bitmask forbids, in place.

Design: programs over (constrained row, column block of 1024); each loads its bitmask words
(one word covers 32 tokens), tests each token's bit and stores -inf where it is clear: no
unpacked [rows, vocab] mask is ever materialized, and allowed logits are not written. The
torch reference unpacks the bits and masks through a gathered copy of the rows (the CPU path).
"""

import torch

from folio.kernels.triton_compat import check_dtype, check_same_device, tl, triton, use_triton_for

BLOCK = 1024


@triton.jit
def _apply_bitmask_kernel(
    logits_ptr,  # [rows, vocab] float32, contiguous in vocab
    logits_stride,
    bitmask_ptr,  # [g, words] int32, contiguous
    bitmask_stride,
    rows_ptr,  # [g] int64: which logits row each bitmask row constrains
    vocab,
    BLOCK: tl.constexpr,
):
    g = tl.program_id(0).to(tl.int64)
    row = tl.load(rows_ptr + g)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_vocab = cols < vocab
    words = tl.load(bitmask_ptr + g * bitmask_stride + cols // 32, mask=in_vocab, other=0)
    allowed = (words >> (cols % 32)) & 1  # arithmetic shift: & 1 keeps the one bit
    tl.store(logits_ptr + row * logits_stride + cols, float("-inf"), mask=in_vocab & (allowed == 0))


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> None:
    """logits [rows, vocab] float32 in place: -inf where bitmask[i] forbids, on rows[i]."""
    if use_triton_for(logits):
        apply_token_bitmask_triton(logits, bitmask, rows)
    else:
        apply_token_bitmask_reference(logits, bitmask, rows)


def apply_token_bitmask_triton(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> None:
    check_dtype("logits", logits, (torch.float32,))
    check_dtype("bitmask", bitmask, (torch.int32,))
    check_dtype("rows", rows, (torch.int64,))
    if logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(f"logits must be [rows, vocab], contiguous in vocab, got {tuple(logits.shape)}.")
    vocab = logits.shape[1]
    if bitmask.dim() != 2 or bitmask.shape[0] != rows.shape[0] or bitmask.shape[1] * 32 < vocab or not bitmask.is_contiguous():
        raise ValueError(f"bitmask must be contiguous [{rows.shape[0]}, >= {(vocab + 31) // 32}] words, got {tuple(bitmask.shape)}.")
    check_same_device(_apply_bitmask_kernel, logits=logits, bitmask=bitmask, rows=rows)
    if rows.numel() == 0 or vocab == 0:
        return
    grid = (rows.shape[0], -(-vocab // BLOCK))
    _apply_bitmask_kernel[grid](logits, logits.stride(0), bitmask, bitmask.stride(0), rows, vocab, BLOCK=BLOCK, num_warps=4)


def apply_token_bitmask_reference(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> None:
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)  # [32]
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1  # [g, words, 32]
    allowed = bits.view(bitmask.shape[0], -1)[:, : logits.shape[1]].bool()  # [g, vocab]
    logits[rows] = logits[rows].masked_fill(~allowed, float("-inf"))
