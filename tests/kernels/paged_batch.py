"""Random paged batches for the attention kernel tests: shuffled block tables, padding, poison."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from folio.attention.metadata import AttentionMetadata


@dataclass
class PagedBatch:
    query: torch.Tensor  # [num_tokens + pad_tokens, num_heads, head_dim]
    key: torch.Tensor  # [num_tokens + pad_tokens, num_kv_heads, head_dim], the new tokens' K
    value: torch.Tensor  # [num_tokens + pad_tokens, num_kv_heads, head_dim]
    kv_cache: torch.Tensor  # [2, num_blocks, block_size, num_kv_heads, head_dim], random everywhere
    metadata: AttentionMetadata

    @property
    def real_rows(self) -> torch.Tensor:
        """Rows of query that belong to a sequence with context."""
        md = self.metadata
        rows = [
            r
            for i in range(md.num_seqs)
            if md.seq_lens_cpu[i] > 0
            for r in range(md.query_start_loc_cpu[i], md.query_start_loc_cpu[i + 1])
        ]
        return torch.tensor(rows, dtype=torch.long)

    @property
    def padding_rows(self) -> torch.Tensor:
        real = set(self.real_rows.tolist())
        return torch.tensor([r for r in range(self.query.shape[0]) if r not in real], dtype=torch.long)


def make_paged_batch(
    q_lens: list[int],
    seq_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    pad_tokens: int = 0,
    spare_blocks: int = 3,
    seed: int = 0,
) -> PagedBatch:
    """Sequence i has q_lens[i] new tokens at the end of seq_lens[i] tokens of context.

    Physical blocks are handed out in a random order, so block tables are shuffled and reading a
    wrong block gives wrong numbers; the whole cache (spare blocks too) holds random values.
    (q_len 0, seq_len 0) makes a padding sequence; pad_tokens adds rows owned by no sequence.
    """
    assert len(q_lens) == len(seq_lens) and all(q <= s for q, s in zip(q_lens, seq_lens))
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks_per_seq) + spare_blocks
    order = torch.randperm(num_blocks, generator=gen).tolist()
    tables = torch.zeros(len(q_lens), max(max(blocks_per_seq, default=1), 1), dtype=torch.int32)
    taken = 0
    for i, n in enumerate(blocks_per_seq):
        tables[i, :n] = torch.tensor(order[taken : taken + n], dtype=torch.int32)
        taken += n

    query_start_loc = [0]
    slots: list[int] = []
    for i, (q, s) in enumerate(zip(q_lens, seq_lens)):
        query_start_loc.append(query_start_loc[-1] + q)
        for pos in range(s - q, s):
            slots.append(int(tables[i, pos // block_size]) * block_size + pos % block_size)
    num_tokens = query_start_loc[-1]
    slots += [-1] * pad_tokens
    rows = num_tokens + pad_tokens

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(dtype=dtype, device=device)

    metadata = AttentionMetadata(
        num_actual_tokens=num_tokens,
        num_seqs=len(q_lens),
        max_query_len=max(q_lens, default=0),
        max_seq_len=max(seq_lens, default=0),
        query_start_loc=torch.tensor(query_start_loc, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=tables.to(device),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        query_start_loc_cpu=query_start_loc,
        seq_lens_cpu=list(seq_lens),
        is_decode_only=max(q_lens, default=0) == 1,
    )
    return PagedBatch(
        query=randn(rows, num_heads, head_dim),
        key=randn(rows, num_kv_heads, head_dim),
        value=randn(rows, num_kv_heads, head_dim),
        kv_cache=randn(2, num_blocks, block_size, num_kv_heads, head_dim),
        metadata=metadata,
    )


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    """fp32 kernels are exact dot products; bf16/fp16 round P and the output (and the
    interpreter truncates fp32->bf16 casts), so they get a few bf16 ulps."""
    assert not actual.isnan().any(), "NaN in an output row that should have been written"
    tol = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}[dtype]
    torch.testing.assert_close(actual.float(), expected.float(), atol=tol, rtol=tol)


def assert_long_rows_only(out: torch.Tensor, expected: torch.Tensor, metadata, min_query_len: int) -> None:
    """A kernel run with min_query_len: the rows of sequences with at least that many new tokens
    match (bf16), the others keep the NaN the output was filled with (another kernel owns them)."""
    for i in range(metadata.num_seqs):
        rows = slice(metadata.query_start_loc_cpu[i], metadata.query_start_loc_cpu[i + 1])
        if metadata.query_len(i) >= min_query_len:
            assert_close(out[rows], expected[rows], torch.bfloat16)
        else:
            assert out[rows].isnan().all()
