"""Fused temperature + Gumbel-max draw: one pass over the logits picks one token per row.

argmax_i(logit_i / T - log E_i) with E_i ~ Exponential(1) i.i.d. is the exponential race of
folio/sample/sampler.py (argmax p_i / E_i) taken in log space: p_i = softmax(logit / T)_i, and the
softmax's normaliser is the same for every token of a row, so no softmax, no [rows, vocab]
temporaries and no second pass are needed. E_i = -log U_i with U_i uniform from Philox keyed by the
row's seed and counted by the token id (four uniforms per Philox call; logs through log2, one
special-function instruction each), so a row's draw depends on its seed and its own logits only:
never on the batch, nor on how the vocabulary is split between programs.

- Grid (rows, splits): each program scans a contiguous share of the vocabulary in BLOCK-wide
  chunks and keeps its best (score, token), first index on ties; a torch argmax over the splits
  (first split on ties) finishes the row. Splits are chosen so that rows x splits fills the device
  (a batch of 1 would otherwise scan 150k tokens on one SM).
- Masked tokens (logit -inf, after allowed_token_ids, top-k, top-p ...) score -inf and are never
  drawn while any token is finite. E is clamped below at MIN_EXP, so the noise is never +inf and
  never NaN (U = 0 gives E = inf, a score of -inf).
- The logits may be float32, bf16 or fp16; scores are float32.

The torch reference `gumbel_sample_reference` takes explicit uniforms; the kernel takes them too
(UNIFORM_FROM_TENSOR) so tests can compare the two exactly.
"""

from __future__ import annotations


import torch

from folio.kernels.triton_compat import HAS_TRITON, cdiv, check_same_device, is_interpreted, tl, triton
from folio.kernels.triton_compat import num_sms as device_sms

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
_BLOCK = 2048
# The smallest Exponential(1) draw float32 uniforms resolve (-log(1 - 2**-24)); also what a log
# that rounds to 0 (or above) near u = 1 is clamped to, so no draw is +inf and none NaN.
MIN_EXP = 5.960464477539063e-08
LN2 = tl.constexpr(0.6931471805599453) if HAS_TRITON else 0.6931471805599453


@triton.jit
def _log2(x, FAST: tl.constexpr):
    """log2 by the special-function unit (lg2.approx, ~2^-22 relative error) when FAST, else
    libdevice's (a ~20-instruction polynomial; the interpreter has no inline PTX)."""
    if FAST:
        return tl.inline_asm_elementwise("lg2.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)
    return tl.log2(x)


@triton.jit
def _race_part(best, best_tok, row_logits_ptr, uniform_row_ptr, tok, hi, u, inv_t,
               UNIFORM_FROM_TENSOR: tl.constexpr, MIN_EXP: tl.constexpr, FAST: tl.constexpr):
    """Fold the tokens `tok` ([QUARTER]) into the lane-wise bests; u are their uniforms."""
    valid = tok < hi
    logit = tl.load(row_logits_ptr + tok, mask=valid, other=float("-inf"))
    if UNIFORM_FROM_TENSOR:
        u = tl.load(uniform_row_ptr + tok, mask=valid, other=0.5)
    # Natural logs through log2 (one MUFU.LG2 each): E = -ln u, noise = -ln E.
    exp_noise = tl.maximum(-_log2(u, FAST) * LN2, MIN_EXP)  # Exponential(1); u = 0 gives +inf
    noise = -_log2(exp_noise, FAST) * LN2  # Gumbel(0, 1): finite but for u = 0 (-inf)
    score = logit.to(tl.float32) * inv_t + noise
    score = tl.where(valid, score, float("-inf"))
    better = score > best  # strictly: the earlier chunk keeps ties
    return tl.where(better, score, best), tl.where(better, tok, best_tok)


@triton.jit
def _gumbel_sample_kernel(
    best_score_ptr,  # [rows, splits] float32
    best_token_ptr,  # [rows, splits] int64
    logits_ptr,  # [rows, vocab]
    inv_temperature_ptr,  # [rows] float32 (1 / T), unused when HAS_TEMPERATURE is false
    seeds_ptr,  # [rows] int64
    uniform_ptr,  # [rows, vocab] float32, only with UNIFORM_FROM_TENSOR
    vocab,
    logits_stride,
    per_split,  # tokens per split, a multiple of BLOCK
    HAS_TEMPERATURE: tl.constexpr,
    UNIFORM_FROM_TENSOR: tl.constexpr,
    BLOCK: tl.constexpr,
    MIN_EXP: tl.constexpr,
    FAST_LOG: tl.constexpr,
):
    row = tl.program_id(0)
    split = tl.program_id(1)
    splits = tl.num_programs(1)
    row64 = row.to(tl.int64)
    row_logits_ptr = logits_ptr + row64 * logits_stride
    uniform_row_ptr = uniform_ptr + row64 * vocab
    inv_t = 1.0
    if HAS_TEMPERATURE:
        inv_t = tl.load(inv_temperature_ptr + row)
    seed = tl.load(seeds_ptr + row)
    QUARTER: tl.constexpr = BLOCK // 4
    lanes = tl.arange(0, QUARTER)
    best = tl.full([QUARTER], float("-inf"), dtype=tl.float32)
    best_tok = tl.zeros([QUARTER], dtype=tl.int32)
    lo = split * per_split
    hi = tl.minimum(lo + per_split, vocab)
    for start in range(lo, hi, BLOCK):
        # One Philox call gives 4 uniforms: token start + j * QUARTER + lane takes output j of
        # counter start / 4 + lane (a function of the token id alone, BLOCK being fixed).
        u0, u1, u2, u3 = tl.rand4x(seed, start // 4 + lanes)
        best, best_tok = _race_part(best, best_tok, row_logits_ptr, uniform_row_ptr, start + lanes, hi, u0,
                                    inv_t, UNIFORM_FROM_TENSOR, MIN_EXP, FAST_LOG)
        best, best_tok = _race_part(best, best_tok, row_logits_ptr, uniform_row_ptr, start + QUARTER + lanes, hi,
                                    u1, inv_t, UNIFORM_FROM_TENSOR, MIN_EXP, FAST_LOG)
        best, best_tok = _race_part(best, best_tok, row_logits_ptr, uniform_row_ptr, start + 2 * QUARTER + lanes,
                                    hi, u2, inv_t, UNIFORM_FROM_TENSOR, MIN_EXP, FAST_LOG)
        best, best_tok = _race_part(best, best_tok, row_logits_ptr, uniform_row_ptr, start + 3 * QUARTER + lanes,
                                    hi, u3, inv_t, UNIFORM_FROM_TENSOR, MIN_EXP, FAST_LOG)
    # Lane-wise bests to one (score, token): the smallest token among the lanes at the maximum.
    top = tl.max(best, 0)
    sentinel = 2147483647
    candidates = tl.where(best == top, best_tok, sentinel)
    token = tl.min(candidates, 0)
    token = tl.where(token == sentinel, lo, token)  # every score -inf: any token of the split
    tl.store(best_score_ptr + row * splits + split, top)
    tl.store(best_token_ptr + row * splits + split, token.to(tl.int64))


def choose_splits(rows: int, vocab: int, num_sms: int) -> int:
    """Enough programs to cover ~2 per SM, at least 8 BLOCK chunks per program, at most 64."""
    chunks = cdiv(vocab, _BLOCK)
    return max(1, min(64, cdiv(2 * num_sms, max(rows, 1)), chunks // 8 or 1))


def gumbel_sample(
    logits: torch.Tensor,  # [rows, vocab]
    seeds: torch.Tensor,  # [rows] int64, the Philox key of each row's noise
    temperature: torch.Tensor | None = None,  # [rows] float32 > 0; None: all 1
    splits: int | None = None,
    uniform: torch.Tensor | None = None,  # [rows, vocab] float32 in [0, 1): tests only
    num_sms: int | None = None,  # default: the device's (132 on the CPU interpreter)
) -> torch.Tensor:  # [rows] int64
    """One token per row drawn from softmax(logits / temperature), without a host round trip."""
    if logits.dim() != 2 or logits.dtype not in _FLOATS or logits.stride(1) != 1:
        raise ValueError(f"logits must be [rows, vocab] float, contiguous in vocab, got {tuple(logits.shape)} {logits.dtype}.")
    rows, vocab = logits.shape
    if seeds.shape != (rows,) or seeds.dtype != torch.int64:
        raise ValueError(f"seeds must be [{rows}] int64, got {tuple(seeds.shape)} {seeds.dtype}.")
    if temperature is not None and (temperature.shape != (rows,) or temperature.dtype != torch.float32):
        raise ValueError(f"temperature must be [{rows}] float32, got {tuple(temperature.shape)} {temperature.dtype}.")
    if uniform is not None and (uniform.shape != (rows, vocab) or uniform.dtype != torch.float32 or not uniform.is_contiguous()):
        raise ValueError(f"uniform must be a contiguous [{rows}, {vocab}] float32 tensor.")
    tensors = {"logits": logits, "seeds": seeds}
    if temperature is not None:
        tensors["temperature"] = temperature
    if uniform is not None:
        tensors["uniform"] = uniform
    check_same_device(_gumbel_sample_kernel, **tensors)
    if rows == 0:
        return torch.empty(0, dtype=torch.int64, device=logits.device)
    splits = splits or choose_splits(rows, vocab, num_sms or device_sms(logits.device))
    per_split = cdiv(cdiv(vocab, splits), _BLOCK) * _BLOCK
    splits = cdiv(vocab, per_split)  # no empty split
    best_score = torch.empty(rows, splits, dtype=torch.float32, device=logits.device)
    best_token = torch.empty(rows, splits, dtype=torch.int64, device=logits.device)
    inv_t = temperature.reciprocal() if temperature is not None else seeds  # placeholder when unused
    _gumbel_sample_kernel[(rows, splits)](
        best_score,
        best_token,
        logits,
        inv_t,
        seeds,
        uniform if uniform is not None else logits,
        vocab,
        logits.stride(0),
        per_split,
        HAS_TEMPERATURE=temperature is not None,
        UNIFORM_FROM_TENSOR=uniform is not None,
        BLOCK=_BLOCK,
        MIN_EXP=MIN_EXP,
        FAST_LOG=not is_interpreted(_gumbel_sample_kernel),
        num_warps=4,  # 512-token quarters: 4 float32 per thread, 16-byte loads
    )
    if splits == 1:
        return best_token[:, 0]
    winner = best_score.argmax(dim=1, keepdim=True)  # [rows, 1], first split on ties
    return best_token.gather(1, winner).squeeze(1)


def gumbel_sample_reference(
    logits: torch.Tensor,  # [rows, vocab]
    uniform: torch.Tensor,  # [rows, vocab] float32 in [0, 1)
    temperature: torch.Tensor | None = None,  # [rows]
) -> torch.Tensor:  # [rows] int64
    scores = logits.float()
    if temperature is not None:
        scores = scores * temperature.reciprocal().unsqueeze(1)
    ln2 = 0.6931471805599453
    exp_noise = (-torch.log2(uniform) * ln2).clamp_min(MIN_EXP)  # the kernel's arithmetic, in float32
    return (scores - torch.log2(exp_noise) * ln2).argmax(dim=1)


__all__ = ["gumbel_sample", "gumbel_sample_reference", "choose_splits"]
