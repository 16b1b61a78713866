"""Plain-torch paged attention: the CPU path and the reference the Triton kernels are checked against.

It loops over sequences in Python and computes in float32, trading speed for obviousness.
"""

from __future__ import annotations

import torch

from folio.attention.backends.base import AttentionBackend
from folio.attention.metadata import AttentionMetadata
from folio.kernels.reshape_and_cache import dequantize_kv_reference, quantize_kv_reference


def write_kv_reference(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int64, -1 = skip
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    num_tokens = slot_mapping.shape[0]
    slots = slot_mapping[:num_tokens]
    keep = slots >= 0
    if not bool(keep.all()):
        slots, key, value = slots[keep], key[:num_tokens][keep], value[:num_tokens][keep]
    else:
        key, value = key[:num_tokens], value[:num_tokens]
    heads, dim = kv_cache.shape[-2], kv_cache.shape[-1]
    kv_cache[0].view(-1, heads, dim)[slots] = quantize_kv_reference(key, k_scale, kv_cache.dtype)
    kv_cache[1].view(-1, heads, dim)[slots] = quantize_kv_reference(value, v_scale, kv_cache.dtype)


def gather_context(
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_len: int,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of one sequence's first seq_len tokens, read through its block table (an FP8
    cache dequantized to float32)."""
    block_size = kv_cache.shape[2]
    num_blocks = (seq_len + block_size - 1) // block_size
    blocks = block_table[:num_blocks].long()
    heads, dim = kv_cache.shape[-2], kv_cache.shape[-1]
    key = kv_cache[0, blocks].reshape(-1, heads, dim)[:seq_len]  # [seq_len, kv_heads, dim]
    value = kv_cache[1, blocks].reshape(-1, heads, dim)[:seq_len]
    return dequantize_kv_reference(key, k_scale), dequantize_kv_reference(value, v_scale)


def attend(
    query: torch.Tensor,  # [q_len, num_heads, dim], positions seq_len - q_len ... seq_len - 1
    key: torch.Tensor,  # [seq_len, num_kv_heads, dim]
    value: torch.Tensor,  # [seq_len, num_kv_heads, dim]
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:  # [q_len, num_heads, dim] in query's dtype
    q_len, num_heads, _ = query.shape
    seq_len, num_kv_heads, _ = key.shape
    group = num_heads // num_kv_heads
    key = key.float().repeat_interleave(group, dim=1)  # [seq_len, num_heads, dim]
    value = value.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", query.float(), key) * scale  # [heads, q_len, seq_len]
    q_pos = torch.arange(seq_len - q_len, seq_len, device=query.device)[:, None]
    k_pos = torch.arange(seq_len, device=query.device)[None, :]
    masked = k_pos > q_pos  # causal
    if sliding_window is not None:
        masked |= k_pos <= q_pos - sliding_window
    scores.masked_fill_(masked, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, value).to(query.dtype)


def paged_attention_reference(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
    metadata: AttentionMetadata,
    scale: float,
    sliding_window: int | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    out = torch.zeros_like(query)
    starts = metadata.query_start_loc_cpu
    for i in range(metadata.num_seqs):
        start, end = starts[i], starts[i + 1]
        if end == start:
            continue
        seq_len = metadata.seq_lens_cpu[i]
        key, value = gather_context(kv_cache, metadata.block_tables[i], seq_len, k_scale, v_scale)
        out[start:end] = attend(query[start:end], key, value, scale, sliding_window)
    return out


def prefill_attention_no_cache(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    query_start_loc_cpu: list[int],
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Causal attention within each sequence of a batch of whole prompts, with no KV cache.

    Used by the memory-profiling forward pass, which runs before the cache exists.
    """
    out = torch.zeros_like(query)
    for start, end in zip(query_start_loc_cpu[:-1], query_start_loc_cpu[1:]):
        if end > start:
            out[start:end] = attend(
                query[start:end], key[start:end], value[start:end], scale, sliding_window
            )
    return out


class TorchAttentionBackend(AttentionBackend):
    name = "torch"

    def write_kv(self, key, value, kv_cache, slot_mapping, k_scale=1.0, v_scale=1.0) -> None:
        write_kv_reference(key, value, kv_cache, slot_mapping, k_scale, v_scale)

    def forward(
        self, query, kv_cache, metadata, scale, sliding_window=None, k_scale=1.0, v_scale=1.0, key=None, value=None
    ) -> torch.Tensor:  # key / value unused: the cache holds them
        return paged_attention_reference(
            query, kv_cache, metadata, scale, sliding_window, k_scale, v_scale
        )
