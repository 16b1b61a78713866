"""Greedy sampling's argmax over the vocabulary, split so a batch-1 row is not one SM's work.

torch's argmax reduces a row in one thread block: at batch 1 one SM scans the 128k-152k logits,
27.5 us of a 2.5 ms INT4 token of Llama-3.1-8B on an H100 (session 16's decode profile), the
whole time on the critical path. Here:
- Grid (rows, splits): each program scans a contiguous share of its row in BLOCK-wide chunks,
  keeping lane-wise the best value and its first token, and the first NaN; then one
  (value, token) per split.
- A second launch, one program per row, takes the first split holding the best value (or the
  first NaN). With one split the first launch writes the token itself.
- torch.argmax's answers exactly: the first index of the maximum, a NaN counting as the maximum
  (the first NaN wins), a row of -inf giving 0.

`argmax_rows` dispatches: a single CUDA row (batch-1 decode) on the kernels, every other batch
on torch (and always on the CPU; FOLIO_SPLIT_ARGMAX=0 everywhere).
"""

from __future__ import annotations

import os

import torch

from folio.kernels.triton_compat import cdiv, check_same_device, tl, triton, use_triton_for
from folio.kernels.triton_compat import num_sms as device_sms

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
BLOCK = 2048  # tokens per chunk: 4 warps x 32 lanes x 16 (float32: four 16-byte loads a lane)
# Only a single row takes the kernels: at batch 1 the step waits on the device and the split
# saves ~15-20 us a token; W1's small-batch tail waits on the host instead, where two Triton
# launches cost more than torch's one (greedy W1 on the 0.6B, H100: 1.5% slower with every
# batch below 64 rows on the kernels, session 16).
MAX_ROWS = 1
MAX_SPLITS = 64
# FOLIO_SPLIT_ARGMAX=0: every row on torch.argmax (the A/B switch).
if os.environ.get("FOLIO_SPLIT_ARGMAX", "1") not in ("0", "1"):
    raise ValueError(f"FOLIO_SPLIT_ARGMAX={os.environ['FOLIO_SPLIT_ARGMAX']!r}: expected 0 (torch) or 1.")
ENABLED = os.environ.get("FOLIO_SPLIT_ARGMAX", "1") == "1"


# The split count is a runtime argument, not specialised: when every batch below 64 rows took
# the kernels, W1's tail (63 rows down to 1, six split counts) compiled one per count and stalled
# the engine for ~1 s of a 7 s greedy W1 run (session 16, H100).
@triton.jit(do_not_specialize=["splits"])
def _argmax_split_kernel(
    logits_ptr,  # [rows, vocab]
    best_ptr,  # [rows, splits] float32: the split's best value (NaN if it has a NaN)
    token_ptr,  # [rows, splits] int64: its first token; [rows] the answer itself when ONE
    vocab,
    stride_row,
    per_split,  # a multiple of BLOCK
    splits,
    ONE: tl.constexpr,  # one split: the program writes the row's answer
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    split = tl.program_id(1)
    lo = split * per_split
    hi = tl.minimum(lo + per_split, vocab)
    row_ptr = logits_ptr + row.to(tl.int64) * stride_row
    best = tl.full((BLOCK,), float("-inf"), tl.float32)
    best_tok = tl.full((BLOCK,), vocab, tl.int32)  # vocab: this lane has seen no token yet
    first_nan = tl.full((BLOCK,), vocab, tl.int32)
    for start in range(lo, hi, BLOCK):
        tok = start + tl.arange(0, BLOCK)
        valid = tok < hi
        x = tl.load(row_ptr + tok, mask=valid, other=float("-inf")).to(tl.float32)
        first_nan = tl.minimum(first_nan, tl.where(x != x, tok, vocab))
        # Strictly greater keeps the lane's earlier token on ties; a lane's first token is taken
        # whatever it holds, so a row of -inf still answers its first token.
        better = valid & ((x > best) | (best_tok == vocab))
        best = tl.where(better, x, best)
        best_tok = tl.where(better, tok, best_tok)
    top = tl.max(best, axis=0)
    token = tl.min(tl.where((best == top) & (best_tok < vocab), best_tok, vocab), axis=0)
    nan_token = tl.min(first_nan, axis=0)
    has_nan = nan_token < vocab
    token = tl.where(has_nan, nan_token, token)
    if ONE:
        tl.store(token_ptr + row, token.to(tl.int64))
    else:
        tl.store(best_ptr + row * splits + split, tl.where(has_nan, float("nan"), top))
        tl.store(token_ptr + row * splits + split, token.to(tl.int64))


@triton.jit(do_not_specialize=["splits"])
def _argmax_merge_kernel(best_ptr, token_ptr, out_ptr, splits, MAX_SPLITS: tl.constexpr):
    """One row: the first split with a NaN, else the first split holding the best value (its
    token is then the row's first maximum: splits are in vocabulary order)."""
    row = tl.program_id(0)
    s = tl.arange(0, MAX_SPLITS)
    used = s < splits
    best = tl.load(best_ptr + row * splits + s, mask=used, other=float("-inf"))
    nan_split = tl.min(tl.where(best != best, s, MAX_SPLITS), axis=0)
    top = tl.max(tl.where(best != best, float("-inf"), best), axis=0)
    top_split = tl.min(tl.where((best == top) & used, s, MAX_SPLITS), axis=0)
    pick = tl.where(nan_split < MAX_SPLITS, nan_split, top_split)
    tl.store(out_ptr + row, tl.load(token_ptr + row * splits + pick))


def choose_splits(rows: int, vocab: int, num_sms: int) -> int:
    """A power of two, at most MAX_SPLITS: doubled while the grid stays within two programs per SM and
    the row has more BLOCK chunks than splits (a batch-1 row of 128k-152k tokens: 64 splits of
    one or two chunks, so no program scans more than 16 KB of float32)."""
    splits = 1
    while splits < MAX_SPLITS and rows * splits * 2 <= 2 * num_sms and vocab > BLOCK * splits:
        splits *= 2
    return splits


def argmax_split(logits: torch.Tensor, splits: int | None = None, num_sms: int | None = None) -> torch.Tensor:
    """[rows, vocab] float -> [rows] int64, torch.argmax(logits, dim=-1)'s answer, on the kernels."""
    if logits.dim() != 2 or logits.dtype not in _FLOATS or logits.stride(1) != 1:
        raise ValueError(
            "argmax: logits must be [rows, vocab] float, contiguous in vocab, "
            f"got {tuple(logits.shape)} {logits.dtype}."
        )
    rows, vocab = logits.shape
    if vocab == 0:
        raise ValueError("argmax: the vocabulary is empty.")
    if vocab >= 2**31 - BLOCK:
        raise ValueError(f"argmax: a vocabulary of {vocab} does not fit int32 token ids.")
    check_same_device(_argmax_split_kernel, logits=logits)
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    if rows == 0:
        return out
    splits = splits or choose_splits(rows, vocab, num_sms or device_sms(logits.device))
    if splits < 1 or splits > MAX_SPLITS or splits & (splits - 1):
        raise ValueError(f"argmax: splits must be a power of two up to {MAX_SPLITS}, got {splits}.")
    per_split = cdiv(cdiv(vocab, splits), BLOCK) * BLOCK
    if splits == 1:
        _argmax_split_kernel[(rows, 1)](logits, logits, out, vocab, logits.stride(0), per_split, 1,
                                        ONE=True, BLOCK=BLOCK, num_warps=4)
        return out
    best = torch.empty(rows, splits, dtype=torch.float32, device=logits.device)
    tokens = torch.empty(rows, splits, dtype=torch.int64, device=logits.device)
    # Splits past the vocabulary (per_split rounded up) scan nothing and answer -inf at token `vocab`;
    # a real split always beats or ties them first, so they never win.
    _argmax_split_kernel[(rows, splits)](logits, best, tokens, vocab, logits.stride(0), per_split, splits,
                                         ONE=False, BLOCK=BLOCK, num_warps=4)
    _argmax_merge_kernel[(rows,)](best, tokens, out, splits, MAX_SPLITS=MAX_SPLITS, num_warps=1)
    return out


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """logits.argmax(dim=-1): the split kernels for a single CUDA row, torch otherwise."""
    if ENABLED and use_triton_for(logits) and logits.dim() == 2 and 0 < logits.shape[0] <= MAX_ROWS \
            and logits.dtype in _FLOATS and logits.stride(1) == 1 and 0 < logits.shape[1] < 2**31 - BLOCK:
        return argmax_split(logits)
    return logits.argmax(dim=-1)


def warm_up(vocab: int, device: torch.device, dtype: torch.dtype = torch.float32) -> None:
    """Compile (or load from Triton's cache) the kernels a batch-1 greedy step takes, now rather
    than in the first such step: the first process on a fresh GPU machine otherwise paid the
    compile inside a greedy W1 run's tail (~2%, session 16). dtype: the logits' the sampler gets
    (the model's since session 21; each dtype is a kernel of its own). Nothing off CUDA or when off."""
    if vocab > 0:
        argmax_rows(torch.zeros(1, vocab, dtype=dtype, device=device))
