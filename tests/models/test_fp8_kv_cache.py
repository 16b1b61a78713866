"""FP8 KV cache end to end: checkpoint scales load, logits stay within e4m3's error of
transformers', and the engine fits about itemsize-times more blocks in the same memory."""

from __future__ import annotations

import os

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from folio import LLM, SamplingParams
from tests.helpers.checkpoints import make_tiny_checkpoint
from tests.helpers.paged_batch import PagedKV, blocks_needed, run_schedule
from tests.helpers.tokenizers import save_test_tokenizer
from tests.models.conftest import hf_logits, load_folio

PROMPT = list(range(5, 60))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = make_tiny_checkpoint("llama", tmp_path_factory.mktemp("llama"))
    save_test_tokenizer(path)
    return path


# Checkpoint names of layer 0's KV scales: llm-compressor's newer and older layouts (the older
# as shape (1,) tensors), ModelOpt's, and the deprecated single kv_scale (k_scale only is used).
KV_SCALE_NAMES = {
    "new": ("self_attn.k_scale", "self_attn.v_scale"),
    "output_scale": ("self_attn.k_proj.output_scale", "self_attn.v_proj.output_scale"),
    "modelopt": ("self_attn.k_proj.k_scale", "self_attn.v_proj.v_scale"),
    "kv_scale": ("self_attn.kv_scale", None),
}


def _with_kv_scales(src: str, dst: str, k_scale: float, v_scale: float, names: str = "new") -> str:
    """A copy of src whose layers carry KV cache scales under KV_SCALE_NAMES[names]."""
    k_name, v_name = KV_SCALE_NAMES[names]
    os.makedirs(dst)
    for name in os.listdir(src):
        if name != "model.safetensors":
            with open(os.path.join(src, name), "rb") as f, open(os.path.join(dst, name), "wb") as g:
                g.write(f.read())
    tensors = load_file(os.path.join(src, "model.safetensors"))
    shape = (1,) if names == "output_scale" else ()
    for layer in range(2):
        tensors[f"model.layers.{layer}.{k_name}"] = torch.full(shape, k_scale)
        if v_name is not None:
            tensors[f"model.layers.{layer}.{v_name}"] = torch.full(shape, v_scale)
    save_file(tensors, os.path.join(dst, "model.safetensors"))
    return dst


def _logits(model, kv_dtype: torch.dtype) -> torch.Tensor:
    attn = model.attention_layers()[0]
    kv = PagedKV(model, attn.num_kv_heads, attn.head_dim, blocks_needed([len(PROMPT)], 16), 16, dtype=kv_dtype)
    return run_schedule(kv, [[(0, PROMPT)]])[0]


def _hf_logits_with_fp8_kv(path: str, k_scale: float, v_scale: float) -> torch.Tensor:
    """transformers' logits with every K (after rope) and V rounded as an FP8 cache stores them."""
    import transformers.models.llama.modeling_llama as llama

    def fp8(x: torch.Tensor, scale: float) -> torch.Tensor:
        return (x / scale).clamp(-448, 448).to(torch.float8_e4m3fn).float() * scale

    rope = llama.apply_rotary_pos_emb

    def rope_then_round(q, k, *args, **kwargs):
        q, k = rope(q, k, *args, **kwargs)
        return q, fp8(k, k_scale)

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    for layer in model.model.layers:
        layer.self_attn.v_proj.register_forward_hook(lambda m, args, out: fp8(out, v_scale))
    llama.apply_rotary_pos_emb = rope_then_round
    try:
        with torch.no_grad():
            return model(torch.tensor([PROMPT])).logits[0]
    finally:
        llama.apply_rotary_pos_emb = rope


@pytest.mark.parametrize(("k_scale", "v_scale"), [(1.0, 1.0), (4 / 448, 2 / 448)])
def test_fp8_cache_equals_transformers_with_fp8_rounded_kv(checkpoint, tmp_path, k_scale, v_scale):
    path = _with_kv_scales(checkpoint, str(tmp_path / "scaled"), k_scale, v_scale)
    model = load_folio(path)
    assert model.attention_layers()[1].k_scale_value == pytest.approx(k_scale)
    got = _logits(model, torch.float8_e4m3fn)
    expected = _hf_logits_with_fp8_kv(path, k_scale, v_scale)
    torch.testing.assert_close(got, expected, atol=2e-3, rtol=0)
    unrounded = hf_logits(checkpoint, [PROMPT])[0]
    assert (got - unrounded).abs().max() > 0.05, "the cache really is FP8"


def test_engine_fits_more_blocks_and_generates(checkpoint):
    counts, texts = {}, {}
    for kv_dtype in ("auto", "fp8"):
        llm = LLM(model=checkpoint, dtype="float32", device="cpu", kv_cache_dtype=kv_dtype,
                  cpu_kv_cache_space=0.002, max_model_len=256, enable_prefix_caching=False)
        counts[kv_dtype] = llm.llm_engine.num_blocks
        out = llm.generate([{"prompt_token_ids": PROMPT}], SamplingParams(max_tokens=8, temperature=0), use_tqdm=False)
        texts[kv_dtype] = out[0].outputs[0].token_ids
    assert counts["fp8"] == pytest.approx(4 * counts["auto"], abs=4), "1 byte per element instead of 4"
    assert len(texts["fp8"]) == 8


def test_bad_kv_cache_dtype_is_refused(checkpoint):
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
        LLM(model=checkpoint, device="cpu", kv_cache_dtype="int8")


def test_checkpoint_kv_scales_leave_a_full_precision_cache_alone(checkpoint, tmp_path):
    """A checkpoint with k/v scales run with kv_cache_dtype="auto": the cache holds K and V as
    they are, so the Triton kernels must not rescale what they read (the decode kernel did)."""
    from folio.attention.backends.triton_backend import TritonAttentionBackend

    path = _with_kv_scales(checkpoint, str(tmp_path / "scaled"), 4 / 448, 2 / 448)
    schedule = [[(0, PROMPT[:20])], [(0, [7])], [(0, [8])]]  # a prefill, then two decodes
    reference = _run_schedule(load_folio(checkpoint), schedule)
    model = load_folio(path)
    for layer in model.attention_layers():
        layer.backend = TritonAttentionBackend(prefill_kernel=False)
    torch.testing.assert_close(_run_schedule(model, schedule), reference, atol=1e-4, rtol=0)


def _run_schedule(model, schedule) -> torch.Tensor:
    attn = model.attention_layers()[0]
    kv = PagedKV(model, attn.num_kv_heads, attn.head_dim, blocks_needed([len(PROMPT)], 16), 16)
    return run_schedule(kv, schedule)[0]


@pytest.mark.parametrize("names", ["output_scale", "modelopt", "kv_scale"])
def test_older_kv_scale_names_load_like_the_new_ones(checkpoint, tmp_path, names):
    """Older llm-compressor / vLLM checkpoints name the scales k_proj.output_scale (shape (1,)),
    ModelOpt's k_proj.k_scale, a deprecated one kv_scale (both scales): vLLM maps them all to the
    attention layer, and so must folio, or an FP8 cache silently runs with scales of 1.0."""
    k_scale, v_scale = 4 / 448, 2 / 448
    if names == "kv_scale":
        v_scale = k_scale
    old = _with_kv_scales(checkpoint, str(tmp_path / names), k_scale, v_scale, names)
    new = _with_kv_scales(checkpoint, str(tmp_path / "new"), k_scale, v_scale)
    for layer in load_folio(old).attention_layers():
        assert (layer.k_scale_value, layer.v_scale_value) == (pytest.approx(k_scale), pytest.approx(v_scale))
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=0)
    outputs = {}
    for path in (old, new):
        llm = LLM(model=path, dtype="float32", device="cpu", kv_cache_dtype="fp8", max_model_len=128,
                  enable_prefix_caching=False)
        (out,) = llm.generate([{"prompt_token_ids": PROMPT}], params, use_tqdm=False)
        outputs[path] = (out.outputs[0].token_ids, out.outputs[0].cumulative_logprob)
    assert outputs[old] == outputs[new]
