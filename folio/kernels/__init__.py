"""Triton kernels, each file holding the kernel, a checking launcher and a plain-torch reference.

Public entry points (import from the submodule; importing this package loads nothing):
- reshape_and_cache.reshape_and_cache(key, value, kv_cache, slot_mapping)
- paged_attention.unified_attention(query, kv_cache, query_start_loc, seq_lens, block_tables,
  num_seqs, max_query_len, scale, sliding_window=None, out=None)
- paged_decode.paged_decode(..., num_splits=1, ...) and paged_decode.choose_num_splits(...)
- rms_norm.rms_norm(x, weight, eps, residual=None)
- rotary.apply_rotary(q, k, positions, cos_sin_cache, head_dim)   (in place)
- activation.silu_and_mul(x)
The last three dispatch: Triton on CUDA tensors, the torch reference otherwise.
"""
