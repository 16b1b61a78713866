"""cudnn_prefill: one long chunk through cuDNN's attention, the context merged by log-sum-exp.

On the CPU `attend` is the float32 reference and the merge runs in Triton's interpreter, so the
gather, the split into context and chunk and the merge are checked against the paged reference
here; the GPU tests check cuDNN itself against folio's own kernels at full size.
"""

from __future__ import annotations

import logging

import pytest
import torch

import folio.attention.backends.triton_backend as tb
from folio.attention.backends.torch_ref import TorchAttentionBackend
from folio.kernels import cudnn_prefill
from folio.kernels.cudnn_prefill import attend, cudnn_prefill_attention, gather_tokens, merge_by_lse, takes
from tests.kernels.paged_batch import assert_close, make_paged_batch

needs_hopper = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9, reason="needs a Hopper GPU")


def _stored(batch):
    cache = batch.kv_cache.clone()
    TorchAttentionBackend().write_kv(batch.key, batch.value, cache, batch.metadata.slot_mapping)
    return cache


@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(4, 2, 16), (6, 3, 40), (8, 8, 32)])
def test_merge_equals_attention_over_both_key_sets(heads, kv_heads, dim):
    g = torch.Generator().manual_seed(heads + dim)
    q = torch.randn(9, heads, dim, generator=g)
    k1, v1 = torch.randn(13, kv_heads, dim, generator=g) * 2, torch.randn(13, kv_heads, dim, generator=g)
    k2, v2 = torch.randn(9, kv_heads, dim, generator=g), torch.randn(9, kv_heads, dim, generator=g)
    o1, l1 = attend(q, k1, v1, False, 0.3)
    o2, l2 = attend(q, k2, v2, False, 0.3)
    want, _ = attend(q, torch.cat([k1, k2]), torch.cat([v1, v2]), False, 0.3)
    torch.testing.assert_close(merge_by_lse(o1, l1, o2, l2), want, atol=1e-5, rtol=1e-5)


def test_merge_takes_strided_outputs():
    """Outputs and log-sum-exps in any layout with head_dim contiguous (a transposed [H, L, D]
    tensor here): the merge reads them by strides."""
    g = torch.Generator().manual_seed(1)
    o1 = torch.randn(4, 7, 16, generator=g).transpose(0, 1)  # [7, 4, 16], token stride 16
    o2 = torch.randn(7, 4, 16, generator=g)
    l1 = torch.randn(7, 4, generator=g).t()  # [4, 7], head stride 1
    l2 = torch.randn(4, 7, generator=g)
    w1, w2 = torch.exp(l1), torch.exp(l2)
    want = (o1 * w1.t()[..., None] + o2 * w2.t()[..., None]) / (w1 + w2).t()[..., None]
    torch.testing.assert_close(merge_by_lse(o1, l1, o2, l2), want, atol=1e-5, rtol=1e-5)


def test_merge_rejects_mismatched_shapes():
    o = torch.zeros(3, 2, 8)
    with pytest.raises(ValueError, match="do not match"):
        merge_by_lse(o, torch.zeros(2, 3), o, torch.zeros(3, 2))


def test_gather_tokens_reads_a_sequence_through_its_block_table():
    batch = make_paged_batch([5], [37], 4, 2, 8, 4, seed=3)
    cache = _stored(batch)
    table = batch.metadata.block_tables[0]
    k, v = gather_tokens(cache, table, 9, 37)
    slots = [int(table[p // 4]) * 4 + p % 4 for p in range(9, 37)]
    flat = cache.reshape(2, -1, 2, 8)
    assert torch.equal(k, flat[0, slots]) and torch.equal(v, flat[1, slots])
    assert torch.equal(k[-5:], batch.key[:5]), "the chunk's own K is what write_kv stored"


@pytest.mark.parametrize(("q_len", "seq_len"), [(23, 23), (23, 61), (16, 48), (7, 70)])
@pytest.mark.parametrize("fresh", [True, False])
def test_matches_paged_reference(q_len, seq_len, fresh):
    """Context mid-block or none; the chunk's K/V from the step's tensors or from the cache."""
    batch = make_paged_batch([q_len], [seq_len], 6, 2, 32, 16, dtype=torch.bfloat16, seed=q_len + seq_len)
    cache = _stored(batch)
    kv = dict(key=batch.key, value=batch.value) if fresh else {}
    out = cudnn_prefill_attention(batch.query, cache, batch.metadata.block_tables[0], seq_len - q_len, 0.25, **kv)
    want = TorchAttentionBackend().forward(batch.query, cache, batch.metadata, 0.25)
    assert_close(out, want, torch.bfloat16)


def test_causal_attend_needs_a_square():
    q = torch.zeros(4, 2, 8)
    with pytest.raises(ValueError, match="as many keys as queries"):
        attend(q, torch.zeros(5, 2, 8), torch.zeros(5, 2, 8), True, 1.0)


def _md(q_lens, seq_lens):
    return make_paged_batch(q_lens, seq_lens, 4, 2, 8, 16).metadata


@pytest.mark.parametrize(
    ("q_lens", "seq_lens", "tokens", "dim", "dtype", "cache", "window", "expected"),
    [
        ([512], [512], 512, 128, torch.bfloat16, torch.bfloat16, None, True),  # first chunk
        ([512], [512], 512, 64, torch.float16, torch.float16, None, True),  # head_dim 64
        ([511], [511], 511, 128, torch.bfloat16, torch.bfloat16, None, False),  # too short
        ([4096], [20000], 4096, 128, torch.float16, torch.float16, None, True),  # long chunk on context
        ([4095], [16384], 4095, 128, torch.bfloat16, torch.bfloat16, None, False),  # context: too short
        ([4096, 1], [4096, 9], 4097, 128, torch.bfloat16, torch.bfloat16, None, False),  # two sequences
        ([4096], [4096], 4104, 128, torch.bfloat16, torch.bfloat16, None, False),  # padding rows
        ([4096], [4096], 4096, 256, torch.bfloat16, torch.bfloat16, None, False),  # head_dim > 128
        ([4096], [4096], 4096, 96, torch.bfloat16, torch.bfloat16, None, False),  # head_dim not run on a GPU
        ([4096], [4096], 4096, 128, torch.float32, torch.float32, None, False),  # float32
        ([4096], [4096], 4096, 128, torch.bfloat16, torch.float8_e4m3fn, None, False),  # FP8 cache
        ([4096], [4096], 4096, 128, torch.bfloat16, torch.bfloat16, 1024, False),  # sliding window
    ],
)
def test_takes(q_lens, seq_lens, tokens, dim, dtype, cache, window, expected):
    assert takes(_md(q_lens, seq_lens), tokens, dim, dtype, cache, window) is expected


def test_worth_it_is_false_off_the_gpu():
    batch = make_paged_batch([8], [8], 4, 2, 8, 16, dtype=torch.bfloat16)
    assert not cudnn_prefill.worth_it(batch.query, batch.kv_cache, batch.metadata, None)


def _backend_step(monkeypatch, backend, batch, cache):
    monkeypatch.setattr(cudnn_prefill, "worth_it", lambda q, c, md, w: md.num_seqs == 1)
    return backend.forward(batch.query, cache, batch.metadata, 0.25, key=batch.key, value=batch.value)


def test_backend_sends_one_long_chunk_to_cudnn(monkeypatch):
    monkeypatch.setenv("FOLIO_PREFILL_CUDNN", "1")
    batch = make_paged_batch([20], [50], 4, 2, 16, 8, dtype=torch.bfloat16, seed=5)
    cache = _stored(batch)
    calls = []
    real = cudnn_prefill.cudnn_prefill_attention
    monkeypatch.setattr(cudnn_prefill, "cudnn_prefill_attention", lambda *a: calls.append(a[3]) or real(*a))
    out = _backend_step(monkeypatch, tb.TritonAttentionBackend(), batch, cache)
    assert calls == [30], "the context length goes along"
    assert_close(out, TorchAttentionBackend().forward(batch.query, cache, batch.metadata, 0.25), torch.bfloat16)


def test_backend_switch_and_fallback(monkeypatch, caplog):
    """cuDNN is opt-in (FOLIO_PREFILL_CUDNN=1); a cuDNN failure is logged once, the step is
    recomputed by folio's kernels, and later steps skip cuDNN."""
    monkeypatch.delenv("FOLIO_PREFILL_CUDNN", raising=False)
    assert not tb.TritonAttentionBackend().cudnn_prefill, "off by default"
    monkeypatch.setenv("FOLIO_PREFILL_CUDNN", "yes")
    with pytest.raises(ValueError, match="FOLIO_PREFILL_CUDNN"):
        tb.TritonAttentionBackend()
    monkeypatch.setenv("FOLIO_PREFILL_CUDNN", "1")
    assert not tb.TritonAttentionBackend(prefill_kernel=False).cudnn_prefill
    calls = []

    def broken(*a):
        calls.append(1)
        raise RuntimeError("cuDNN Frontend error: no valid engine configs")

    monkeypatch.setattr(cudnn_prefill, "cudnn_prefill_attention", broken)
    batch = make_paged_batch([6], [11], 4, 2, 16, 8, dtype=torch.bfloat16, seed=6)
    cache = _stored(batch)
    backend = tb.TritonAttentionBackend()
    with caplog.at_level(logging.WARNING, logger="folio"):
        out = _backend_step(monkeypatch, backend, batch, cache)
        again = _backend_step(monkeypatch, backend, batch, cache)
    assert calls == [1]
    assert "cuDNN attention failed on a long prompt chunk (RuntimeError" in caplog.text
    assert_close(out, TorchAttentionBackend().forward(batch.query, cache, batch.metadata, 0.25), torch.bfloat16)
    assert torch.equal(out, again)


def test_backend_lets_out_of_memory_through(monkeypatch):
    """Running out of memory is the engine's to handle: raised, and cuDNN stays on."""
    monkeypatch.setenv("FOLIO_PREFILL_CUDNN", "1")

    def oom(*a):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(cudnn_prefill, "cudnn_prefill_attention", oom)
    batch = make_paged_batch([6], [11], 4, 2, 16, 8, dtype=torch.bfloat16, seed=8)
    backend = tb.TritonAttentionBackend()
    with pytest.raises(torch.OutOfMemoryError):
        _backend_step(monkeypatch, backend, batch, _stored(batch))
    assert backend.cudnn_prefill


def test_attention_layer_hands_fresh_kv_to_the_backend_unless_fp8():
    from folio.layers.attention import Attention

    seen = []

    class Recording(TorchAttentionBackend):
        def forward(self, query, kv_cache, metadata, scale, sliding_window=None, k_scale=1.0, v_scale=1.0,
                    key=None, value=None):
            seen.append((key, value))
            return super().forward(query, kv_cache, metadata, scale, sliding_window, k_scale, v_scale)

    batch = make_paged_batch([5], [9], 4, 2, 8, 4, dtype=torch.bfloat16, seed=7)
    layer = Attention(4, 8, 0.3, 2, Recording())
    for dtype in (torch.bfloat16, torch.float8_e4m3fn):
        layer.kv_cache = torch.zeros_like(batch.kv_cache, dtype=dtype)
        layer(batch.query.reshape(5, -1), batch.key.reshape(5, -1), batch.value.reshape(5, -1), batch.metadata)
    (k16, v16), (k8, v8) = seen
    assert torch.equal(k16, batch.key) and torch.equal(v16, batch.value)
    assert k8 is None and v8 is None, "an FP8 cache holds scaled K/V: the backend reads the cache"


# ---- GPU: cuDNN itself ----------------------------------------------------------------------


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("q_len", "seq_len", "heads", "dim"),
                         [(300, 300, 16, 128), (300, 1000, 32, 128), (129, 700, 8, 128), (257, 900, 14, 64)])
def test_cudnn_matches_reference(dtype, q_len, seq_len, heads, dim):
    """q, k and v as the model hands them: column slices of one QKV row (strided tokens)."""
    kv_heads = 8 if heads % 8 == 0 else 2
    batch = make_paged_batch([q_len], [seq_len], heads, kv_heads, dim, 16, dtype=dtype, device="cuda", seed=q_len)
    cache = _stored(batch)
    qkv = torch.cat([batch.query.reshape(q_len, -1), batch.key.reshape(q_len, -1), batch.value.reshape(q_len, -1)], 1)
    q, k, v = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], 1)
    out = cudnn_prefill_attention(q.view(q_len, heads, dim), cache, batch.metadata.block_tables[0], seq_len - q_len,
                                  0.25, k.view(q_len, kv_heads, dim), v.view(q_len, kv_heads, dim))
    assert_close(out, TorchAttentionBackend().forward(batch.query, cache, batch.metadata, 0.25), dtype)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize(("q_len", "seq_len", "heads"), [(4096, 4096, 16), (13616, 30000, 32), (8192, 16384, 16)])
def test_backend_full_size_agrees_with_gluon(q_len, seq_len, heads, monkeypatch):
    """The shapes of the time-to-first-token rows: cuDNN's output against the Gluon kernel's."""
    from folio.kernels.prefill_attention_hopper import hopper_prefill_attention

    monkeypatch.setenv("FOLIO_PREFILL_CUDNN", "1")  # opt-in since session 23
    batch = make_paged_batch([q_len], [seq_len], heads, 8, 128, 16, dtype=torch.bfloat16, device="cuda", seed=9)
    cache = _stored(batch)
    backend = tb.TritonAttentionBackend()
    assert cudnn_prefill.worth_it(batch.query, cache, batch.metadata, None)
    out = backend.forward(batch.query, cache, batch.metadata, 0.25, key=batch.key, value=batch.value)
    assert backend.cudnn_prefill, "cuDNN ran without falling back"
    md = batch.metadata
    gluon = hopper_prefill_attention(batch.query, cache, md.query_start_loc, md.seq_lens, md.block_tables, 1, 0.25)
    assert (out.float() - gluon.float()).abs().max() < 2e-2


@pytest.mark.gpu
@needs_hopper
def test_engine_long_prompt_first_token_agrees_with_gluon(tmp_path, monkeypatch):
    """The engine end to end (bf16, head_dim 128): an 18,000-token prompt in two chunks of 9,000,
    the second on context, goes through cuDNN both times; its first token's log-probs match the
    Gluon kernel's run within bf16 noise."""
    import random

    from folio import LLM, SamplingParams
    from tests.helpers.checkpoints import make_tiny_checkpoint

    path = make_tiny_checkpoint("qwen3", tmp_path / "m", head_dim=128, max_position_embeddings=20000)
    rng = random.Random(0)
    prompt = [rng.randrange(3, 1000) for _ in range(18000)]
    calls = []
    real = cudnn_prefill.cudnn_prefill_attention
    monkeypatch.setattr(cudnn_prefill, "cudnn_prefill_attention", lambda *a: calls.append(a[3]) or real(*a))

    def first_logprobs(switch: str) -> dict[int, float]:
        monkeypatch.setenv("FOLIO_PREFILL_CUDNN", switch)
        llm = LLM(model=path, device="cuda", dtype="bfloat16", max_model_len=18008, max_num_batched_tokens=9000,
                  gpu_memory_utilization=0.3, enforce_eager=True, enable_prefix_caching=False)
        out = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(max_tokens=1, logprobs=8, temperature=0.0),
                           use_tqdm=False)[0].outputs[0]
        del llm
        torch.cuda.empty_cache()
        return {t: lp.logprob for t, lp in out.logprobs[0].items()}

    cudnn_run = first_logprobs("1")
    layers = 2
    assert calls == [0] * layers + [9000] * layers, calls
    gluon_run = first_logprobs("0")
    assert len(calls) == 2 * layers, "FOLIO_PREFILL_CUDNN=0 keeps cuDNN out"
    common = set(cudnn_run) & set(gluon_run)
    assert len(common) >= 6
    assert max(abs(cudnn_run[t] - gluon_run[t]) for t in common) < 0.05
