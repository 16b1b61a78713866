"""TritonAttentionBackend: the GPU path, built on folio/kernels.

- write_kv: reshape_and_cache (one program per token slot).
- forward: decode-only batches go to the split-KV decode kernel, everything else (prefill
  chunks, mixed batches) to the unified kernel.

forward never synchronises with the device: launch shapes come from host ints in the metadata
(num_seqs, max_query_len, is_decode_only) and tensor shapes. For CUDA graphs of decode steps the
grid depends only on the padded batch: num_seqs (padded sequences have query_len 0 or seq_len 0
and write nothing) and the split count, which choose_num_splits derives from num_seqs alone.

The kernels also run on CPU tensors through Triton's interpreter (TRITON_INTERPRET=1), so tests
can drive this very class on the CPU; get_attention_backend hands it out only for CUDA.
"""

from __future__ import annotations

import functools

import torch

from folio.attention.backends.base import AttentionBackend
from folio.attention.metadata import AttentionMetadata
from folio.kernels.paged_attention import unified_attention
from folio.kernels.paged_decode import choose_num_splits, paged_decode
from folio.kernels.reshape_and_cache import reshape_and_cache

H100_SMS = 132  # stands in for the SM count on the CPU (interpreter), where there is none


class TritonAttentionBackend(AttentionBackend):
    name = "triton"

    def __init__(self, split_kv: bool = True, num_splits: int | None = None) -> None:
        """split_kv=False turns the split-KV decode path off (one program per sequence and KV
        head); num_splits fixes the split count instead of choose_num_splits (tests, tuning)."""
        self.split_kv = split_kv
        self.num_splits = num_splits

    def write_kv(
        self,
        key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
        slot_mapping: torch.Tensor,  # [num_tokens] int64, -1 = skip
        k_scale: float = 1.0,
        v_scale: float = 1.0,
    ) -> None:
        reshape_and_cache(key, value, kv_cache, slot_mapping, k_scale, v_scale)

    def forward(
        self,
        query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
        metadata: AttentionMetadata,
        scale: float,
        sliding_window: int | None = None,
        k_scale: float = 1.0,
        v_scale: float = 1.0,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]; padding rows hold anything
        out = torch.empty_like(query)
        args = (query, kv_cache, metadata.query_start_loc, metadata.seq_lens, metadata.block_tables, metadata.num_seqs)
        if metadata.is_decode_only:
            splits = self.decode_splits(metadata.num_seqs, kv_cache.shape[3], query.device)
            return paged_decode(
                *args, scale, sliding_window, num_splits=splits, out=out, k_scale=k_scale, v_scale=v_scale
            )
        return unified_attention(
            *args, metadata.max_query_len, scale, sliding_window, out=out, k_scale=k_scale, v_scale=v_scale
        )

    def decode_splits(self, num_seqs: int, num_kv_heads: int, device: torch.device) -> int:
        if not self.split_kv:
            return 1
        if self.num_splits is not None:
            return self.num_splits
        return choose_num_splits(num_seqs, num_kv_heads, _num_sms(device))


@functools.lru_cache(maxsize=None)
def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return H100_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count
