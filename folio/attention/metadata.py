"""AttentionMetadata: the per-step description of a flat, mixed batch, handed to forward().

The batch is flat: the new tokens of all scheduled requests are concatenated (a request
contributes a prefill chunk or a single decode token). Sequence i owns query tokens
[query_start_loc[i], query_start_loc[i+1]) and has seq_lens[i] tokens of context in all,
the new ones included, so its new tokens sit at positions seq_lens[i] - query_len_i ... seq_lens[i]-1.

KV cache layout, per layer: kv_cache[2, num_blocks, block_size, num_kv_heads, head_dim]
(index 0 is K, 1 is V). Token t of the batch is written to slot slot_mapping[t], that is block
slot // block_size, offset slot % block_size; slot -1 means "padding, do not write".
Sequence i's j-th logical block is physical block block_tables[i, j].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class AttentionMetadata:
    num_actual_tokens: int  # real tokens; tensors may be padded past this (CUDA graphs)
    num_seqs: int
    max_query_len: int
    max_seq_len: int
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32, on the model's device
    seq_lens: torch.Tensor  # [num_seqs] int32, context length after this step
    block_tables: torch.Tensor  # [num_seqs, max_blocks_per_seq] int32, padded with 0
    slot_mapping: torch.Tensor  # [num_tokens] int64, -1 for padding
    # Host copies of the two small vectors, so the CPU path loops without device syncs.
    query_start_loc_cpu: list[int]
    seq_lens_cpu: list[int]
    # Decode-only batches (every query length 1) let the backends take a faster path.
    is_decode_only: bool = False
    # Decode-only batches: [num_seqs] int32, the sequences by context length, longest first
    # (longest_first); the decode kernel starts their programs in this order. None: batch order.
    decode_order: torch.Tensor | None = None

    def query_len(self, i: int) -> int:
        return self.query_start_loc_cpu[i + 1] - self.query_start_loc_cpu[i]

    def context_len(self, i: int) -> int:
        """Tokens already cached before this step for sequence i."""
        return self.seq_lens_cpu[i] - self.query_len(i)


def longest_first(seq_lens: np.ndarray) -> np.ndarray:
    """The indices of seq_lens from the longest context to the shortest, ties in batch order
    (int32): the decode kernel's program order. Started last, a long sequence's programs would
    run on alone after the rest of the launch is done (session 22: 1.5-2% of a 128-256 sequence
    decode launch on an H100)."""
    return np.argsort(-seq_lens.astype(np.int64), kind="stable").astype(np.int32)
