"""TritonAttentionBackend: the GPU path, built on folio/kernels.

- write_kv: reshape_and_cache (one program per token slot).
- forward: decode-only batches go to the split-KV decode kernel. bf16/fp16 batches with some
  query longer than the 16-row tiles (head_dim <= 128) go to the prefill kernel
  (prefill_attention.py): with its default 128-row tiles when long chunks lead (max_query_len >=
  PREFILL_MIN_QUERY_LEN, at most PREFILL_MAX_SEQS sequences), with MIXED_PREFILL_CONFIG's 64-row
  tiles when the batch is one chunk among many decodes (W1's mixed steps). Everything else
  (short queries, float32 models) goes to the unified kernel. FOLIO_PREFILL_ATTENTION=0 (or
  prefill_kernel=False) keeps the unified kernel for all of it. On Hopper the long chunks take the
  Gluon kernel (prefill_attention_hopper.py: a loader warpgroup and two consumers taking turns,
  14-19% faster on 8k chunks, sessions 17-19) where it supports the batch; FOLIO_PREFILL_KERNEL=triton
  keeps the Triton one, and a Gluon failure (a Triton whose Gluon API differs) is logged once, the
  batch is recomputed by the Triton kernel, and it keeps that kernel.
- Opt-in (FOLIO_PREFILL_CUDNN=1): before all that, a step whose one sequence is a long chunk
  goes to cuDNN's fused attention on Hopper (cudnn_prefill.py: 0.26-0.98x the Gluon kernel's time
  once warm, but every new chunk shape first builds a cuDNN graph, 60 ms to ~1 s; session 23).
  A cuDNN failure other than running out of memory is logged once and the step recomputed by
  folio's kernels.

forward never synchronises with the device: launch shapes come from host ints in the metadata
(num_seqs, max_query_len, is_decode_only) and tensor shapes. For CUDA graphs of decode steps the
grid depends only on the padded batch: num_seqs (padded sequences have query_len 0 or seq_len 0
and write nothing) and the split count, which choose_num_splits derives from num_seqs alone.

The kernels also run on CPU tensors through Triton's interpreter (TRITON_INTERPRET=1), so tests
can drive this very class on the CPU; get_attention_backend hands it out only for CUDA.
"""

from __future__ import annotations

import os

import torch

from folio.attention.backends.base import AttentionBackend
from folio.attention.metadata import AttentionMetadata
from folio.kernels import cudnn_prefill, prefill_attention_hopper
from folio.kernels.paged_attention import unified_attention
from folio.kernels.paged_attention import TileConfig
from folio.kernels.paged_decode import choose_num_splits, paged_decode
from folio.kernels.prefill_attention import default_prefill_config, prefill_attention
from folio.kernels.triton_compat import next_power_of_2, num_sms
from folio.kernels.reshape_and_cache import reshape_and_cache
from folio.logger import init_logger

logger = init_logger(__name__)

# Which tiles the prefill kernel takes (docs/perf-notes.md, "Prefill attention kernel", measured
# on an H100): 128-row tiles run long chunks at 1.4-1.5x the unified kernel; in a mixed step
# (one chunk + ~200 decodes, whose rows fill 2 of a tile's rows) 64-row tiles, 3 stages, run
# 15% faster than the unified kernel, and 128-row tiles 8% slower.
PREFILL_MIN_QUERY_LEN = 256
PREFILL_MAX_SEQS = 8
MIXED_PREFILL_CONFIG = TileConfig(block_m=64, tile_n=64, num_warps=4, num_stages=3)
_PREFILL_DTYPES = (torch.bfloat16, torch.float16)
# Decode programs start with the longest sequences (metadata.decode_order): 1.5-2% faster
# launches at 128-256 sequences on an H100 (session 22). FOLIO_DECODE_LONGEST_FIRST=0: batch order.
LONGEST_FIRST = os.environ.get("FOLIO_DECODE_LONGEST_FIRST", "1") != "0"


class TritonAttentionBackend(AttentionBackend):
    name = "triton"

    def __init__(
        self, split_kv: bool = True, num_splits: int | None = None, prefill_kernel: bool | None = None
    ) -> None:
        """split_kv=False turns the split-KV decode path off (one program per sequence and KV
        head); num_splits fixes the split count instead of choose_num_splits (tests, tuning);
        prefill_kernel=False sends prefill batches to the unified kernel (None: the
        FOLIO_PREFILL_ATTENTION environment variable, on unless it is "0")."""
        self.split_kv = split_kv
        self.num_splits = num_splits
        if prefill_kernel is None:
            prefill_kernel = os.environ.get("FOLIO_PREFILL_ATTENTION", "1") != "0"
        self.prefill_kernel = prefill_kernel
        kernel = os.environ.get("FOLIO_PREFILL_KERNEL", "gluon")
        if kernel not in ("triton", "gluon"):
            raise ValueError(f"FOLIO_PREFILL_KERNEL={kernel!r}: expected gluon (the default) or triton.")
        self.hopper_prefill = kernel == "gluon"  # long chunks on Hopper: prefill_attention_hopper.py
        cudnn = os.environ.get("FOLIO_PREFILL_CUDNN", "0")
        if cudnn not in ("0", "1"):
            raise ValueError(f"FOLIO_PREFILL_CUDNN={cudnn!r}: expected 0 (the default) or 1.")
        self.cudnn_prefill = prefill_kernel and cudnn == "1"  # one long chunk on Hopper: cudnn_prefill.py

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
        key: torch.Tensor | None = None,
        value: torch.Tensor | None = None,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]; padding rows hold anything
        if self.cudnn_prefill and cudnn_prefill.worth_it(
                query, kv_cache, metadata, sliding_window):
            try:
                return cudnn_prefill.cudnn_prefill_attention(query, kv_cache, metadata.block_tables[0],
                                                             metadata.context_len(0), scale, key, value)
            except torch.OutOfMemoryError:
                raise  # the engine's own handling; not a reason to give up cuDNN
            except Exception as e:  # noqa: BLE001 - a torch or cuDNN without this op: keep serving
                self.cudnn_prefill = False
                logger.warning("cuDNN attention failed on a long prompt chunk (%s: %s); such chunks use folio's "
                               "prefill kernels from now on.", type(e).__name__, e)
        out = torch.empty_like(query)
        args = (query, kv_cache, metadata.query_start_loc, metadata.seq_lens, metadata.block_tables, metadata.num_seqs)
        if metadata.is_decode_only:
            splits = self.decode_splits(metadata.num_seqs, kv_cache.shape[3], query.device)
            order = metadata.decode_order if LONGEST_FIRST else None
            return paged_decode(*args, scale, sliding_window, num_splits=splits, out=out, k_scale=k_scale,
                                v_scale=v_scale, order=order)
        group = query.shape[1] // kv_cache.shape[3]
        # The prefill kernel reads a bf16/fp16 cache only; an fp8 cache goes through the unified kernel.
        fp8_cache = kv_cache.element_size() == 1
        config = None if fp8_cache else self.prefill_config(query.dtype, query.shape[2], group, metadata)
        if config is not None:
            if self.hopper_prefill and self.long_chunks(metadata) and prefill_attention_hopper.supports(
                    query, kv_cache, sliding_window):
                try:
                    return prefill_attention_hopper.hopper_prefill_attention(*args, scale, out=out)
                except Exception as e:  # noqa: BLE001 - a Triton whose Gluon differs: keep serving
                    self.hopper_prefill = False
                    logger.warning("The Gluon prefill kernel failed (%s: %s); long prompt chunks use the Triton "
                                   "kernel from now on.", type(e).__name__, e)
            return prefill_attention(*args, scale, sliding_window, out=out, config=config)
        return unified_attention(
            *args, metadata.max_query_len, scale, sliding_window, out=out, k_scale=k_scale, v_scale=v_scale
        )

    def prefill_config(
        self, dtype: torch.dtype, head_dim: int, group: int, metadata: AttentionMetadata
    ) -> TileConfig | None:
        """The prefill kernel's tiles for this batch, or None for the unified kernel. Host ints
        only: the same batch shape always takes the same kernel."""
        if not self.prefill_kernel or dtype not in _PREFILL_DTYPES or head_dim > 128:
            return None
        if metadata.max_query_len * group <= 16:  # short queries: the unified kernel's 16-row tiles
            return None
        if self.long_chunks(metadata):
            return default_prefill_config(group, max(16, next_power_of_2(head_dim)))
        return TileConfig(max(MIXED_PREFILL_CONFIG.block_m, next_power_of_2(group)), MIXED_PREFILL_CONFIG.tile_n,
                          MIXED_PREFILL_CONFIG.num_warps, MIXED_PREFILL_CONFIG.num_stages)

    @staticmethod
    def long_chunks(metadata: AttentionMetadata) -> bool:
        """Long prompt chunks lead the batch (the prefill kernel's 128-row tiles)."""
        return metadata.max_query_len >= PREFILL_MIN_QUERY_LEN and metadata.num_seqs <= PREFILL_MAX_SEQS

    def decode_splits(self, num_seqs: int, num_kv_heads: int, device: torch.device) -> int:
        if not self.split_kv:
            return 1
        if self.num_splits is not None:
            return self.num_splits
        return choose_num_splits(num_seqs, num_kv_heads, num_sms(device))
