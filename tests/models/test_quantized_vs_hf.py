"""Quantized checkpoints: folio's CPU path equals transformers on the same checkpoint.

compressed-tensors checkpoints are written by compressed-tensors and read by transformers'
own compressed-tensors support (which fake-quantizes FP8 activations as folio's CPU path
does). GPTQ and AWQ checkpoints are written from their documented layouts; transformers needs
gptqmodel / autoawq to read them, so it runs on the weights they stand for (dequantized when
written) and folio must reproduce those logits from the packed tensors.
"""

from __future__ import annotations

import logging

import pytest
import torch

from tests.helpers.checkpoints import make_tiny_checkpoint
from tests.helpers.paged_batch import PagedKV, blocks_needed, run_schedule
from tests.helpers.quantized_checkpoints import write_compressed_tensors, write_int4
from tests.models.conftest import hf_logits, load_folio

# Sizes in whole INT4 groups of 32 and multiples of 8; 6 query heads over 2 kv heads.
SHAPES = dict(num_hidden_layers=2, hidden_size=96, intermediate_size=160, num_attention_heads=6, head_dim=16)
PROMPTS = [list(range(5, 45)), [7, 900, 3, 55, 14, 300, 299, 1]]


@pytest.fixture(scope="module")
def float_checkpoint(tmp_path_factory):
    return make_tiny_checkpoint("llama", tmp_path_factory.mktemp("float"), **SHAPES)


def folio_logits(path: str, **config) -> list[torch.Tensor]:
    model = load_folio(path, **config)
    attn = model.attention_layers()[0]
    lengths = [len(p) for p in PROMPTS]
    kv = PagedKV(model, attn.num_kv_heads, attn.head_dim, blocks_needed(lengths, 16), 16, seed=0)
    got = run_schedule(kv, [[(i, p) for i, p in enumerate(PROMPTS)]])
    return [got[i] for i in range(len(PROMPTS))]


def assert_logits_close(got: list[torch.Tensor], expected: list[torch.Tensor], atol: float) -> None:
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, atol=atol, rtol=0)
        assert torch.equal(g.argmax(-1), e.argmax(-1)), "greedy tokens differ"


@pytest.mark.parametrize(
    ("preset", "atol"),
    # Static scales: the same arithmetic. Dynamic: compressed-tensors rounds its per-token
    # scales slightly differently, well under the quantization error itself (~0.5 here).
    [("FP8", 1e-4), ("FP8_DYNAMIC", 3e-2)],
)
def test_compressed_tensors_fp8_matches_transformers(float_checkpoint, tmp_path, preset, atol):
    path = write_compressed_tensors(float_checkpoint, str(tmp_path / preset), preset)
    expected = hf_logits(path, PROMPTS)
    assert_logits_close(folio_logits(path), expected, atol)
    float_logits = hf_logits(float_checkpoint, PROMPTS)
    assert (expected[0] - float_logits[0]).abs().max() > 10 * atol, "the checkpoint is not really quantized"


def test_online_fp8_is_llm_compressors_fp8_dynamic(float_checkpoint, tmp_path, caplog):
    """quantization="fp8" on a float checkpoint = llm-compressor's FP8_DYNAMIC of it."""
    path = write_compressed_tensors(float_checkpoint, str(tmp_path / "ct"), "FP8_DYNAMIC")
    with caplog.at_level(logging.INFO, logger="folio"):
        got = folio_logits(float_checkpoint, quantization="fp8")
    assert "Linear layers by method: fp8-w8a8 x 8" in caplog.text
    assert_logits_close(got, hf_logits(path, PROMPTS), 3e-2)


def test_ignored_layers_stay_unquantized(float_checkpoint, tmp_path, caplog):
    path = write_compressed_tensors(float_checkpoint, str(tmp_path / "ct"), "FP8", ignore=("re:.*down_proj",))
    with caplog.at_level(logging.INFO, logger="folio"):
        got = folio_logits(path)
    assert "Linear layers by method: fp8-w8a8 x 6, unquantized x 2" in caplog.text
    assert_logits_close(got, hf_logits(path, PROMPTS), 1e-4)
    mixed = write_compressed_tensors(float_checkpoint, str(tmp_path / "mixed"), "FP8", ignore=("re:.*q_proj",))
    with pytest.raises(ValueError, match="shards of model.layers.0.self_attn.qkv_proj are quantized differently"):
        load_folio(mixed)


@pytest.mark.parametrize("preset", ["W4A16", "W4A16_ASYM"])
def test_compressed_tensors_int4_matches_its_own_dequantization(float_checkpoint, tmp_path, preset):
    # transformers 5.23 cannot load an asymmetric pack-quantized checkpoint (zero-point shape),
    # so the reference is compressed-tensors' decompression of the saved tensors, run by HF.
    path = write_compressed_tensors(float_checkpoint, str(tmp_path / preset), preset, group_size=32)
    assert_logits_close(folio_logits(path), hf_logits(path + "-dequantized", PROMPTS), 1e-4)


def test_compressed_tensors_int4_weight_actorder_loads(float_checkpoint, tmp_path):
    """actorder "weight" (llm-compressor's GPTQ default; "static" is its alias) changes only
    the calibration order: no g_idx, the same layout, so the same path as without."""
    path = write_compressed_tensors(float_checkpoint, str(tmp_path / "w4"), "W4A16", group_size=32, actorder="weight")
    assert_logits_close(folio_logits(path), hf_logits(path, PROMPTS), 1e-4)


def test_compressed_tensors_symmetric_int4_matches_transformers_reading_it(float_checkpoint, tmp_path):
    path = write_compressed_tensors(float_checkpoint, str(tmp_path / "w4"), "W4A16", group_size=32)
    assert_logits_close(folio_logits(path), hf_logits(path, PROMPTS), 1e-4)


@pytest.mark.parametrize(
    ("fmt", "symmetric", "desc_act", "group"),
    [("gptq", True, False, 32), ("gptq", False, True, 32), ("gptq", False, False, 32),
     ("awq", False, False, 32), ("awq", True, False, 32)],
)
def test_int4_layouts_match_transformers_on_their_weights(float_checkpoint, tmp_path, fmt, symmetric, desc_act, group):
    path = write_int4(float_checkpoint, str(tmp_path / fmt), fmt, group, symmetric, desc_act)
    expected = hf_logits(path + "-dequantized", PROMPTS)
    assert_logits_close(folio_logits(path), expected, 1e-4)


def test_llm_generates_transformers_greedy_tokens_from_a_gptq_checkpoint(float_checkpoint, tmp_path):
    """The public API end to end: LLM on a GPTQ act-order checkpoint, batched with chunked prefill."""
    from folio import LLM, SamplingParams
    from tests.helpers.reference import hf_greedy
    from tests.helpers.tokenizers import save_test_tokenizer

    save_test_tokenizer(float_checkpoint)
    path = write_int4(float_checkpoint, str(tmp_path / "gptq"), "gptq", 32, False, desc_act=True)
    llm = LLM(model=path, dtype="float32", device="cpu", max_num_batched_tokens=16, max_num_seqs=4)
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    expected = hf_greedy(path + "-dequantized", PROMPTS, 10)
    assert [list(o.outputs[0].token_ids) for o in outputs] == expected


def test_unsupported_schemes_are_named(float_checkpoint, tmp_path):
    path = write_compressed_tensors(float_checkpoint, str(tmp_path / "ct"), "W8A16", group_size=32)
    with pytest.raises(ValueError, match=r"Unsupported compressed-tensors scheme: group 'group_0'.*int8"):
        load_folio(path)
    with pytest.raises(ValueError, match="quantization='awq' does not match the checkpoint"):
        load_folio(path, quantization="awq")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("fmt", ["gptq", "awq", "ct-w4a16-asym"])
def test_gpu_kernels_follow_the_cpu_path(float_checkpoint, tmp_path, fmt):
    """Triton W4A16 in float32 on the GPU against the CPU reference path."""
    from folio import LLM, SamplingParams
    from tests.helpers.tokenizers import save_test_tokenizer

    save_test_tokenizer(float_checkpoint)
    kwargs = {}
    if fmt in ("gptq", "awq"):
        path = write_int4(float_checkpoint, str(tmp_path / fmt), fmt, 32, False)
    elif fmt == "online-fp8":
        path, kwargs = float_checkpoint, {"quantization": "fp8"}
    else:
        preset = {"ct-fp8-dynamic": "FP8_DYNAMIC", "ct-w4a16-asym": "W4A16_ASYM"}[fmt]
        path = write_compressed_tensors(float_checkpoint, str(tmp_path / fmt), preset, group_size=32 if "W4" in preset else None)
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=1)
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    runs = {}
    for device in ("cpu", "cuda"):
        llm = LLM(model=path, dtype="float32", device=device, **kwargs)
        runs[device] = llm.generate(prompts, params, use_tqdm=False)
        del llm
    for cpu, gpu in zip(runs["cpu"], runs["cuda"]):
        assert cpu.outputs[0].token_ids == gpu.outputs[0].token_ids
        for a, b in zip(cpu.outputs[0].logprobs, gpu.outputs[0].logprobs):
            token = next(iter(a))
            assert abs(a[token].logprob - b[token].logprob) < 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("fmt", ["ct-fp8-dynamic", "online-fp8"])
def test_gpu_fp8_is_as_close_to_the_float_model_as_the_cpu_path(float_checkpoint, tmp_path, fmt):
    """cuBLASLt FP8 on the GPU against the float32 model, beside the CPU path's FP8.

    Not token equality with the CPU path: Hopper's FP8 tensor cores keep fewer accumulator bits
    than float32, and each next layer re-quantizes activations to e4m3 (3 mantissa bits), which
    turns a last-bit difference at a rounding midpoint into a whole e4m3 step. Emulated on the
    CPU (tests of 2026-11-23, this model), rounding the accumulator to 18 bits moved a chosen
    token's log-prob by 0.075 and to 14 bits by 0.24, where float32 moves it by 1e-6. So both
    paths score the float model's greedy continuation (prompt log-probs, teacher forced) and the
    GPU's distance to the float model must stay within twice the CPU path's, plus 0.05."""
    from folio import LLM, SamplingParams
    from tests.helpers.tokenizers import save_test_tokenizer

    save_test_tokenizer(float_checkpoint)
    if fmt == "online-fp8":
        path, kwargs = float_checkpoint, {"quantization": "fp8"}
    else:
        path, kwargs = write_compressed_tensors(float_checkpoint, str(tmp_path / fmt), "FP8_DYNAMIC"), {}
    greedy = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    float_llm = LLM(model=float_checkpoint, dtype="float32", device="cpu")
    sequences = [p + list(o.outputs[0].token_ids) for p, o in
                 zip(PROMPTS, float_llm.generate([{"prompt_token_ids": p} for p in PROMPTS], greedy, use_tqdm=False))]
    score = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0)

    def token_logprobs(llm) -> torch.Tensor:
        outputs = llm.generate([{"prompt_token_ids": s} for s in sequences], score, use_tqdm=False)
        return torch.tensor([entry[t].logprob for s, o in zip(sequences, outputs)
                             for t, entry in zip(s[1:], o.prompt_logprobs[1:])])

    reference = token_logprobs(float_llm)
    del float_llm
    distance = {}
    for device in ("cpu", "cuda"):
        llm = LLM(model=path, dtype="float32", device=device, **kwargs)
        distance[device] = (token_logprobs(llm) - reference).abs().mean().item()
        del llm
    assert distance["cpu"] > 0  # FP8 is not the float model
    assert distance["cuda"] <= 2 * distance["cpu"] + 0.05, distance


def test_fp8_checkpoint_with_float_weights_is_refused(float_checkpoint, tmp_path):
    """A compressed-tensors FP8 config over float weights (saved 'dense', fake-quantized): cast
    to e4m3 and multiplied by their scales they would be garbage, so loading refuses."""
    import json
    import os

    from safetensors.torch import load_file, save_file

    path = write_compressed_tensors(float_checkpoint, str(tmp_path / "ct"), "FP8_DYNAMIC")
    file = os.path.join(path, "model.safetensors")
    tensors = load_file(file)
    for name in [n for n, t in tensors.items() if t.dtype == torch.float8_e4m3fn]:
        tensors[name] = tensors[name].float() * tensors[name + "_scale"].float()  # [N, K] * [N, 1]
    save_file(tensors, file, metadata={"format": "pt"})
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"]["format"] = "dense"
    for group in config["quantization_config"]["config_groups"].values():
        group["format"] = "dense"
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    with pytest.raises(ValueError, match=r"proj.weight is torch.float32, but its quantization_config says FP8"):
        load_folio(path)


def test_decoder_layers_ask_their_norms_for_fp8_activations_only_for_fp8_layers(float_checkpoint, tmp_path):
    """With per-token FP8 layers each decoder layer asks its norms to quantize for QKV and
    gate/up (on CUDA); unquantized, INT4 and static-scale FP8 layers keep 16-bit inputs, and a
    LoRA-wrapped projection (its adapters read the 16-bit input) turns it off for that norm."""
    from folio.lora.layers import LoRALinear

    def flags(model):
        return {layer.fp8_inputs for layer in model.model.layers}

    assert flags(load_folio(float_checkpoint, quantization="fp8")) == {(True, True)}
    assert flags(load_folio(float_checkpoint)) == {(False, False)}
    assert flags(load_folio(write_int4(float_checkpoint, str(tmp_path / "gptq"), "gptq", 32, True))) == {(False, False)}
    static = write_compressed_tensors(float_checkpoint, str(tmp_path / "static"), "FP8")
    assert flags(load_folio(static)) == {(False, False)}
    model = load_folio(float_checkpoint, quantization="fp8")
    layer = model.model.layers[0]
    layer.self_attn.qkv_proj = LoRALinear.__new__(LoRALinear)  # the wrapper type, unbuilt: only its attributes matter
    assert layer.fp8_inputs == (False, True)
