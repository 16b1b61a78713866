"""One long prompt chunk through cuDNN's fused attention (torch's
`aten._scaled_dot_product_cudnn_attention`): opt-in (FOLIO_PREFILL_CUDNN=1). Once warm it was faster
than folio's Gluon kernel on such chunks on an H100 (session 23; since the Gluon kernel keeps P in
registers, session 26, the two are about even at 8-16k), but torch builds a cuDNN graph for every new
(chunk length, context length) and keeps it: the first chunk of each new shape costs 60-150 ms,
up to ~1-3 s, more than a whole prompt's prefill (docs/perf-notes.md, session 23). So it pays only
where the same shapes recur (fixed-length benchmarks, fixed-size batch jobs), not in serving
prompts of every length.

- No context (a prompt's first chunk): the chunk attends to itself, causally, from its own K/V
  (the step's fresh tensors): one cuDNN call, nothing read from the cache.
- With context: two calls, the chunk's queries over the context gathered from the paged cache
  (no mask) and over the chunk itself (causal); `merge_by_lse` combines the two by their
  log-sum-exps (a Triton kernel).

`worth_it` says when (host ints only): a step whose one sequence is a long chunk, on a Hopper GPU
(where it was measured), 16-bit query and cache, head_dim 64 or 128, no sliding window.
TritonAttentionBackend asks it first when enabled, and falls back to folio's kernels if cuDNN
fails. Its gathers and outputs (~1 GB for a 16k chunk on a 128k context of an 8B model) are not
in the startup memory profile, which runs folio's kernels. On the CPU (tests) `attend` runs
`attend_reference` and the merge runs in Triton's interpreter.
"""

from __future__ import annotations

import functools

import torch

from folio.attention.backends.torch_ref import gather_context
from folio.attention.metadata import AttentionMetadata
from folio.kernels.triton_compat import check_same_device, next_power_of_2, tl, triton

# Shortest chunks where cuDNN was measured ahead (H100, session 23, one sequence, 16 and 32 query
# heads over 8): alone 0.26-0.41x the Gluon kernel's time at 512-1,536 tokens (its launch costs
# more than the work there), 0.74x at 2k, 0.80-0.94x at 4k-16k; on context (two calls, a gather,
# a merge) 0.96-1.0x for 4k-13.6k chunks on 4k-24k, but 1.01-1.16x for 2k on 8k and (16 heads)
# 8k on 2k. Shorter chunks were not measured and keep folio's kernels.
MIN_CHUNK = 512
MIN_CHUNK_ON_CONTEXT = 4096
_DTYPES = (torch.bfloat16, torch.float16)
_HEAD_DIMS = (64, 128)  # run on the GPU (tests/kernels/test_cudnn_prefill.py)


@functools.lru_cache(maxsize=None)
def _is_hopper(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] == 9


def worth_it(query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata,
             sliding_window: int | None) -> bool:
    """Whether this step's attention goes through cuDNN: a Hopper GPU and `takes`, never inside a
    CUDA graph's capture (the path reads the context length on the host; a replay would not)."""
    if not query.is_cuda or torch.cuda.is_current_stream_capturing():
        return False
    index = query.device.index if query.device.index is not None else torch.cuda.current_device()
    return _is_hopper(index) and takes(metadata, query.shape[0], query.shape[2], query.dtype, kv_cache.dtype,
                                       sliding_window)


def takes(metadata: AttentionMetadata, num_tokens: int, head_dim: int, dtype: torch.dtype,
          cache_dtype: torch.dtype, sliding_window: int | None) -> bool:
    """The step's shape: one sequence whose chunk is long enough (MIN_CHUNK, or
    MIN_CHUNK_ON_CONTEXT after a context), no padding rows, 16-bit query and cache alike,
    head_dim 64 or 128, no sliding window. Host ints only."""
    if metadata.num_seqs != 1 or metadata.is_decode_only or sliding_window:
        return False
    if dtype not in _DTYPES or cache_dtype != dtype or head_dim not in _HEAD_DIMS:
        return False
    new = metadata.query_len(0)
    if num_tokens != new:
        return False
    return new >= (MIN_CHUNK if metadata.context_len(0) == 0 else MIN_CHUNK_ON_CONTEXT)


def cudnn_prefill_attention(
    query: torch.Tensor,  # [L, num_heads, head_dim]: one sequence's new tokens
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim], this step's K/V stored
    block_table: torch.Tensor,  # [>= blocks of the sequence] int32
    context_len: int,  # tokens cached before this chunk
    scale: float,
    key: torch.Tensor | None = None,  # [L, num_kv_heads, head_dim]: the chunk's K as stored; None: read the cache
    value: torch.Tensor | None = None,
) -> torch.Tensor:  # [L, num_heads, head_dim]
    """Causal attention of one chunk over its context and itself."""
    new = query.shape[0]
    if key is None or value is None:
        key, value = gather_tokens(kv_cache, block_table, context_len, context_len + new)
    out_self, lse_self = attend(query, key, value, True, scale)
    if context_len == 0:
        return out_self
    k_ctx, v_ctx = gather_tokens(kv_cache, block_table, 0, context_len)
    out_ctx, lse_ctx = attend(query, k_ctx, v_ctx, False, scale)
    return merge_by_lse(out_ctx, lse_ctx, out_self, lse_self)


def gather_tokens(kv_cache: torch.Tensor, block_table: torch.Tensor, lo: int, hi: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens [lo, hi) of one sequence out of the paged cache: K and V, [hi - lo, kv_heads, head_dim]
    (the reference backend's gather; a 16-bit cache comes back as it is)."""
    key, value = gather_context(kv_cache, block_table, hi)
    return key[lo:], value[lo:]


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T * scale) v per query head (GQA), and each row's log-sum-exp (natural log).
    q [L, H, D], k/v [S, Hkv, D] -> out [L, H, D], lse [H, L] float32. causal: query i sees keys
    0..i (L == S). cuDNN on CUDA, attend_reference elsewhere."""
    if causal and q.shape[0] != k.shape[0]:
        raise ValueError(f"causal attention needs as many keys as queries, got {k.shape[0]} and {q.shape[0]}.")
    if not q.is_cuda:
        return attend_reference(q, k, v, causal, scale)
    r = torch.ops.aten._scaled_dot_product_cudnn_attention(
        q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0),
        None, True, 0.0, causal, False, scale=scale)
    return r[0][0].transpose(0, 1), r[1][0].reshape(q.shape[1], q.shape[0])


def attend_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """attend in float32 torch."""
    group = q.shape[1] // k.shape[1]
    kk = k.float().repeat_interleave(group, 1)
    vv = v.float().repeat_interleave(group, 1)
    s = torch.einsum("lhd,shd->hls", q.float(), kk) * scale
    if causal:
        keep = torch.ones(s.shape[1:], dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, -1)  # [H, L]
    out = torch.einsum("hls,shd->lhd", torch.exp(s - lse[..., None]), vv)
    return out.to(q.dtype), lse


@triton.jit
def _merge_kernel(
    out, o1, o2, l1, l2, num_heads,
    s_out_t, s_out_h, s_o1_t, s_o1_h, s_o2_t, s_o2_h, s_l1_h, s_l1_t, s_l2_h, s_l2_t,
    HEAD_DIM: tl.constexpr, HEADS_PAD: tl.constexpr, DIM_PAD: tl.constexpr,
):
    """One token's rows, all heads: the two partial softmaxes weighted by exp(lse - max)."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, HEADS_PAD)
    d = tl.arange(0, DIM_PAD)
    hm = h < num_heads
    m2 = hm[:, None] & (d < HEAD_DIM)[None, :]
    a = tl.load(l1 + h * s_l1_h + t * s_l1_t, mask=hm, other=0.0)
    b = tl.load(l2 + h * s_l2_h + t * s_l2_t, mask=hm, other=0.0)
    top = tl.maximum(a, b)
    wa = tl.exp(a - top)
    wb = tl.exp(b - top)
    x = tl.load(o1 + t * s_o1_t + h[:, None] * s_o1_h + d[None, :], mask=m2, other=0.0).to(tl.float32)
    y = tl.load(o2 + t * s_o2_t + h[:, None] * s_o2_h + d[None, :], mask=m2, other=0.0).to(tl.float32)
    merged = (x * wa[:, None] + y * wb[:, None]) / (wa + wb)[:, None]
    tl.store(out + t * s_out_t + h[:, None] * s_out_h + d[None, :], merged.to(out.dtype.element_ty), mask=m2)


def merge_by_lse(o1: torch.Tensor, lse1: torch.Tensor, o2: torch.Tensor, lse2: torch.Tensor) -> torch.Tensor:
    """The attention over keys A + B from the attentions over A and over B: o [L, H, D] (head_dim
    contiguous), lse [H, L] float32 natural log -> [L, H, D] in o1's dtype."""
    if o1.shape != o2.shape or lse1.shape != lse2.shape or lse1.shape != (o1.shape[1], o1.shape[0]):
        raise ValueError(f"merge_by_lse: outputs {tuple(o1.shape)} / {tuple(o2.shape)} and log-sum-exps "
                         f"{tuple(lse1.shape)} / {tuple(lse2.shape)} do not match.")
    if o1.stride(2) != 1 or o2.stride(2) != 1:
        raise ValueError("merge_by_lse: outputs must be contiguous in head_dim.")
    check_same_device(_merge_kernel, o1=o1, o2=o2, lse1=lse1, lse2=lse2)
    tokens, heads, dim = o1.shape
    out = torch.empty(tokens, heads, dim, dtype=o1.dtype, device=o1.device)
    if tokens == 0:
        return out
    _merge_kernel[(tokens,)](
        out, o1, o2, lse1, lse2, heads,
        out.stride(0), out.stride(1), o1.stride(0), o1.stride(1), o2.stride(0), o2.stride(1),
        lse1.stride(0), lse1.stride(1), lse2.stride(0), lse2.stride(1),
        HEAD_DIM=dim, HEADS_PAD=next_power_of_2(heads), DIM_PAD=next_power_of_2(dim),
        num_warps=4 if heads * dim <= 4096 else 8,
    )
    return out
