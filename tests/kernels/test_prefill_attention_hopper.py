"""The Gluon prefill kernel for Hopper (prefill_attention_hopper.py) against the torch reference.

Gluon kernels do not run in Triton's interpreter: the numbers are checked on a Hopper GPU only;
on the CPU the tests check what the kernel refuses, the backend's switch and its fallback to the
Triton kernel (tests/kernels/test_compile_sm90.py compiles it for sm_90 on any machine).
"""

from __future__ import annotations

import pytest
import torch

from folio.attention.backends.torch_ref import paged_attention_reference
from folio.kernels import hopper_kv_loader as kv_loader
from folio.kernels import prefill_attention_hopper as hopper
from tests.kernels.paged_batch import assert_close, assert_long_rows_only, make_paged_batch

needs_hopper = pytest.mark.skipif(
    not (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9 and hopper.HAS_GLUON),
    reason="needs a Hopper GPU and Triton's Gluon")


def _run(batch, scale=0.3, min_query_len=0, pingpong=True):
    md = batch.metadata
    out = torch.full_like(batch.query, float("nan"))  # poison: every row it owns must be written
    hopper.hopper_prefill_attention(batch.query, batch.kv_cache, md.query_start_loc, md.seq_lens, md.block_tables,
                                    md.num_seqs, scale, out=out, min_query_len=min_query_len, pingpong=pingpong)
    return out, paged_attention_reference(batch.query, batch.kv_cache, md, scale)


def test_cpu_batches_are_refused_by_name():
    batch = make_paged_batch([300], [300], 16, 8, 128, 16, dtype=torch.bfloat16)
    assert not hopper.supports(batch.query, batch.kv_cache, None)
    md = batch.metadata
    with pytest.raises(ValueError, match="unsupported batch"):
        hopper.hopper_prefill_attention(batch.query, batch.kv_cache, md.query_start_loc, md.seq_lens,
                                        md.block_tables, md.num_seqs, 0.1)


@pytest.mark.skipif(not hopper.HAS_GLUON, reason="needs Triton's Gluon")
def test_kv_descriptors_are_made_once_per_cache_and_do_not_keep_it_alive():
    """The TMA descriptors (host objects) stay on the cache tensor: reused while its storage, shape
    and box are the same, remade otherwise; they address the K and V halves; and they hold no
    reference to the tensor, which is freed as soon as the engine drops it."""
    import weakref

    cache = torch.randn(2, 5, 16, 2, 64, dtype=torch.bfloat16)
    _, kv_smem = hopper._layouts(64, torch.bfloat16)
    first = kv_loader.kv_descriptors(cache, 16, kv_smem)
    assert kv_loader.kv_descriptors(cache, 16, kv_smem) is first
    assert kv_loader.kv_descriptors(cache, 8, kv_smem) is not first, "another box, other descriptors"
    for half, desc in enumerate(kv_loader.kv_descriptors(cache, 16, kv_smem)):
        assert desc.block_shape == [16, 64] and desc.shape == [80, 128]
        assert torch.equal(desc.base.view(5, 16, 2, 64), cache[half])
    layers = torch.randn(3, 2, 5, 16, 2, 64, dtype=torch.bfloat16).unbind(0)  # the engine's layout: offsets
    for half, desc in enumerate(kv_loader.kv_descriptors(layers[2], 16, kv_smem)):
        assert torch.equal(desc.base.view(5, 16, 2, 64), layers[2][half])
    with pytest.raises(ValueError, match="contiguous"):
        kv_loader.kv_descriptors(cache.transpose(3, 4), 16, kv_smem)
    alive = weakref.ref(cache)
    del cache, first
    assert alive() is None


@pytest.mark.skipif(not hopper.HAS_GLUON, reason="needs Triton's Gluon")
@pytest.mark.parametrize(("head_dim", "block_size"), [(96, 16), (128, 8), (128, 48)])
def test_launch_refuses_layouts_it_has_no_boxes_for_before_compiling(head_dim, block_size):
    batch = make_paged_batch([300], [300], 16, 8, head_dim, block_size, dtype=torch.bfloat16)
    md = batch.metadata
    with pytest.raises(ValueError, match="not laid out"):
        hopper._launch(batch.query, batch.kv_cache, md.query_start_loc, md.seq_lens, md.block_tables, md.num_seqs,
                       0.1, torch.empty_like(batch.query), 0)


@pytest.mark.skipif(not hopper.HAS_GLUON, reason="needs Triton's Gluon")
def test_launch_refuses_groups_that_do_not_divide_a_program_before_compiling():
    """48 query heads over 16 KV heads: 3 rows a token would split a token across programs."""
    batch = make_paged_batch([300], [300], 48, 16, 128, 16, dtype=torch.bfloat16)
    md = batch.metadata
    with pytest.raises(ValueError, match="group must divide"):
        hopper._launch(batch.query, batch.kv_cache, md.query_start_loc, md.seq_lens, md.block_tables, md.num_seqs,
                       0.1, torch.empty_like(batch.query), 0)


def _poison_outside_sequences(batch) -> None:
    """NaN (and inf in part of V) in every cache slot no sequence owns: the slots past each
    sequence's end in its last block, the spare blocks, and block 0, which the kernel's boxes read
    past a sequence's end and the tables' padding points at (its owner, if any, is moved to a
    spare block first)."""
    md, cache, size = batch.metadata, batch.kv_cache, batch.kv_cache.shape[2]
    owned = [md.block_tables[i, :-(-n // size)] for i, n in enumerate(md.seq_lens_cpu)]
    used = set(torch.cat(owned).tolist())
    spare = sorted(set(range(cache.shape[1])) - used)
    if 0 in used:
        new = spare.pop(0)
        cache[:, new] = cache[:, 0]
        for row in owned:  # views into block_tables: the padding columns keep pointing at block 0
            row[row == 0] = new
        spare.append(0)
    for i, n in enumerate(md.seq_lens_cpu):
        cache[:, int(md.block_tables[i, (n - 1) // size]), n % size or size:] = float("nan")
    for b in spare:
        cache[:, b] = float("nan")
        cache[1, b, :, :, ::3] = float("inf")


def test_backend_takes_the_gluon_kernel_unless_told_not_to(monkeypatch):
    from folio.attention.backends.triton_backend import TritonAttentionBackend

    monkeypatch.delenv("FOLIO_PREFILL_KERNEL", raising=False)
    assert TritonAttentionBackend().hopper_prefill
    monkeypatch.setenv("FOLIO_PREFILL_KERNEL", "triton")
    assert not TritonAttentionBackend().hopper_prefill
    monkeypatch.setenv("FOLIO_PREFILL_KERNEL", "cuda")
    with pytest.raises(ValueError, match="FOLIO_PREFILL_KERNEL"):
        TritonAttentionBackend()


@pytest.mark.parametrize("after_writing", [False, True])
def test_a_failing_gluon_kernel_falls_back_to_triton_once_and_says_so(monkeypatch, caplog, after_writing):
    """A Triton whose Gluon API differs fails when the kernel compiles; a compilation that races
    on P fails after its launch wrote `out` (sass_checks.check_no_wgmma_race). Either way the batch
    still gets attention (from the Triton kernel, over every row), the log says why, and later
    batches skip Gluon."""
    import logging

    import folio.attention.backends.triton_backend as tb
    from folio.attention.backends.torch_ref import TorchAttentionBackend
    from folio.kernels.paged_attention import TileConfig

    monkeypatch.delenv("FOLIO_PREFILL_KERNEL", raising=False)
    monkeypatch.setattr(tb, "PREFILL_MIN_QUERY_LEN", 16)
    monkeypatch.setattr(hopper, "supports", lambda *a, **k: True)
    calls = []

    def broken(*a, **k):
        calls.append(1)
        if after_writing:
            k["out"].fill_(float("nan"))
            raise RuntimeError("hopper_prefill_attention: ptxas writes the registers of a running wgmma's operand")
        raise TypeError("warpgroup_mma() got an unexpected keyword argument")

    monkeypatch.setattr(hopper, "hopper_prefill_attention", broken)
    real = tb.prefill_attention
    monkeypatch.setattr(tb, "prefill_attention",
                        lambda *a, config, **k: real(*a, **k, config=TileConfig(32, 16, 4, 2)))  # interpreter-sized
    batch = make_paged_batch([20, 1], [50, 9], 4, 2, 16, 8, dtype=torch.bfloat16, seed=2)
    cache = batch.kv_cache.clone()
    TorchAttentionBackend().write_kv(batch.key, batch.value, cache, batch.metadata.slot_mapping)
    backend = tb.TritonAttentionBackend()
    with caplog.at_level(logging.WARNING, logger="folio"):
        out = backend.forward(batch.query, cache, batch.metadata, 0.25)
        again = backend.forward(batch.query, cache, batch.metadata, 0.25)
    expected = TorchAttentionBackend().forward(batch.query, cache, batch.metadata, 0.25)
    assert_close(out, expected, torch.bfloat16)
    assert torch.equal(out, again)
    assert calls == [1], "Gluon is tried once, then left alone"
    assert f"Gluon prefill kernel failed ({'RuntimeError' if after_writing else 'TypeError'}" in caplog.text


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    ("q_lens", "seq_lens", "num_heads", "head_dim", "block_size"),
    [
        ([40, 23, 1, 0, 17], [45, 23, 60, 0, 70], 16, 128, 16),  # chunks on context, a decode, padding
        ([300, 129], [300, 700], 32, 128, 16),  # GQA 4: 32-token q blocks, diagonal tiles mid-block
        ([64, 65, 300], [64, 1000, 333], 16, 128, 16),  # a q block ending mid-tile; 3 chunks
    ],
)
def test_matches_reference(dtype, q_lens, seq_lens, num_heads, head_dim, block_size):
    batch = make_paged_batch(q_lens, seq_lens, num_heads, 8, head_dim, block_size, dtype=dtype, device="cuda",
                             pad_tokens=3, seed=len(q_lens) + head_dim)
    out, expected = _run(batch)
    real, pad = batch.real_rows.cuda(), batch.padding_rows.cuda()
    assert_close(out[real], expected[real], dtype)
    assert out[pad].isnan().all(), "rows owned by no sequence must be left untouched"


@pytest.mark.gpu
@needs_hopper
def test_shapes_left_to_the_triton_kernel():
    # block 4, head_dim 64 (correct, measured slower), 16 query heads a KV head, 256-token blocks
    for heads, head_dim, block_size in ((16, 128, 4), (16, 64, 16), (128, 128, 16), (16, 128, 256)):
        batch = make_paged_batch([300], [300], heads, 8, head_dim, block_size, dtype=torch.bfloat16, device="cuda")
        assert not hopper.supports(batch.query, batch.kv_cache, None)  # the backend keeps the Triton kernel
        with pytest.raises(ValueError, match="unsupported batch"):
            _run(batch)
    batch = make_paged_batch([300], [300], 16, 8, 128, 16, dtype=torch.bfloat16, device="cuda")
    assert hopper.supports(batch.query, batch.kv_cache, None)
    assert not hopper.supports(batch.query, batch.kv_cache, 4096)  # a sliding window


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize(
    ("num_heads", "head_dim", "block_size", "admitted"),
    [(8, 128, 16, True), (64, 128, 16, True), (16, 64, 16, False), (16, 128, 32, True), (16, 128, 64, True),
     (32, 128, 128, True)],
    ids=["group-1", "group-8", "head-dim-64", "block-32", "block-64", "block-128"],
)
def test_other_shapes(num_heads, head_dim, block_size, admitted):
    """The kernel's code beyond the models of the benchmarks (called below `supports`' gate, which
    admits the shapes that passed here and measured faster than the Triton kernel)."""
    batch = make_paged_batch([300, 129, 1], [300, 700, 40], num_heads, 8, head_dim, block_size, dtype=torch.bfloat16,
                             device="cuda", pad_tokens=3, seed=num_heads + block_size)
    assert hopper.supports(batch.query, batch.kv_cache, None) == admitted
    md = batch.metadata
    out = torch.full_like(batch.query, float("nan"))
    hopper._launch(batch.query, batch.kv_cache, md.query_start_loc, md.seq_lens, md.block_tables, md.num_seqs, 0.3,
                   out, 0)
    expected = paged_attention_reference(batch.query, batch.kv_cache, md, 0.3)
    real, pad = batch.real_rows.cuda(), batch.padding_rows.cuda()
    assert_close(out[real], expected[real], torch.bfloat16)
    assert out[pad].isnan().all()


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("pingpong", [True, False])
@pytest.mark.parametrize(("q_lens", "seq_lens"), [([8192], [8192]), ([4096], [20000]), ([8192, 3000], [30000, 3000])])
@pytest.mark.parametrize("num_heads", [16, 32])  # Qwen3-0.6B (GQA 2), Llama-3.1-8B (GQA 4)
def test_full_size(pingpong, q_lens, seq_lens, num_heads):
    batch = make_paged_batch(q_lens, seq_lens, num_heads, 8, 128, 16, dtype=torch.bfloat16, device="cuda",
                             pad_tokens=5)
    out, expected = _run(batch, scale=128**-0.5, pingpong=pingpong)
    real = batch.real_rows.cuda()
    assert_close(out[real], expected[real], torch.bfloat16)


@pytest.mark.gpu
@needs_hopper
def test_stale_non_finite_cache_slots_do_not_leak():
    """Slots past a sequence's end in its last block (a freed block's stale K/V) hold inf and NaN:
    whole-block TMA boxes read them, and the zeroed V rows must keep them out (P = 0 times a NaN V
    is still NaN)."""
    batch = make_paged_batch([300, 200], [300, 711], 16, 8, 128, 16, dtype=torch.bfloat16, device="cuda", seed=9)
    md = batch.metadata
    for i, seq_len in enumerate(md.seq_lens_cpu):
        last = int(md.block_tables[i, (seq_len - 1) // 16])
        batch.kv_cache[:, last, seq_len % 16 or 16:] = float("nan")
        batch.kv_cache[1, last, seq_len % 16 or 16:, :, ::3] = float("inf")
    out, expected = _run(batch)
    assert_close(out, expected, torch.bfloat16)


@pytest.mark.gpu
@needs_hopper
def test_non_finite_slots_outside_the_sequences_do_not_leak():
    """Chunks of several q blocks (the diagonal tiles of inner q blocks read the chunk's own later
    tokens, left as they are; only tiles past a sequence's end are zeroed) with every slot no
    sequence owns non-finite, block 0 included."""
    batch = make_paged_batch([700, 300, 129], [900, 300, 1000], 32, 8, 128, 16, dtype=torch.bfloat16, device="cuda",
                             seed=11, spare_blocks=6)
    _poison_outside_sequences(batch)
    out, expected = _run(batch)
    assert_close(out, expected, torch.bfloat16)


@pytest.mark.gpu
@needs_hopper
def test_long_chunks_on_poisoned_caches_give_the_same_bits_every_run():
    """Both consumers zero the stale V rows of the last tile and share the rings: the first run
    matches the reference, and five more give the same bits."""
    batch = make_paged_batch([8192, 700], [30000, 900], 32, 8, 128, 16, dtype=torch.bfloat16, device="cuda", seed=3)
    _poison_outside_sequences(batch)
    first, expected = _run(batch, scale=128**-0.5)
    real = batch.real_rows.cuda()
    assert_close(first[real], expected[real], torch.bfloat16)
    md = batch.metadata
    for _ in range(5):
        again = torch.full_like(batch.query, float("nan"))
        hopper.hopper_prefill_attention(batch.query, batch.kv_cache, md.query_start_loc, md.seq_lens, md.block_tables,
                                        md.num_seqs, 128**-0.5, out=again)
        assert torch.equal(first[real], again[real])


@pytest.mark.gpu
@needs_hopper
def test_short_sequences_are_left_to_another_kernel():
    batch = make_paged_batch([300, 1, 40, 260], [300, 9, 80, 900], 16, 8, 128, 16, dtype=torch.bfloat16,
                             device="cuda", seed=5)
    out, expected = _run(batch, min_query_len=256)
    assert_long_rows_only(out, expected, batch.metadata, 256)


@pytest.mark.gpu
@needs_hopper
def test_backend_sends_long_chunks_here(monkeypatch):
    from folio.attention.backends.torch_ref import TorchAttentionBackend
    from folio.attention.backends.triton_backend import TritonAttentionBackend

    monkeypatch.delenv("FOLIO_PREFILL_KERNEL", raising=False)
    calls = []
    real = hopper.hopper_prefill_attention
    monkeypatch.setattr(hopper, "hopper_prefill_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    batch = make_paged_batch([600, 1], [900, 40], 16, 8, 128, 16, dtype=torch.bfloat16, device="cuda", seed=2)
    cache = batch.kv_cache.clone()
    TorchAttentionBackend().write_kv(batch.key, batch.value, cache, batch.metadata.slot_mapping)
    out = TritonAttentionBackend().forward(batch.query, cache, batch.metadata, 0.25)
    expected = TorchAttentionBackend().forward(batch.query, cache, batch.metadata, 0.25)
    assert calls == [1]
    assert_close(out, expected, torch.bfloat16)
