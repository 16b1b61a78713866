"""load_model: checkpoint formats, dtypes, dummy weights and the errors a user can meet."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from folio.models.registry import get_model_class, supported_architectures
from tests.helpers.checkpoints import convert_to_pytorch_bin, make_tiny_checkpoint
from tests.helpers.paged_batch import PagedKV, blocks_needed, run_schedule
from tests.models.conftest import hf_logits, load_folio

PROMPT = [(i * 37 + 11) % 1000 for i in range(70)]


def _logits(model, prompt=PROMPT) -> torch.Tensor:
    layer = model.attention_layers()[0]
    kv = PagedKV(model, layer.num_kv_heads, layer.head_dim, blocks_needed([len(prompt)], 16), 16)
    return run_schedule(kv, [[(0, prompt)]])[0]


def _rewrite_weights(folder: str, edit) -> None:
    path = os.path.join(folder, "model.safetensors")
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def test_sharded_safetensors_load_every_shard(tmp_path):
    path = make_tiny_checkpoint("qwen3", tmp_path, max_shard_size="300KB")
    with open(os.path.join(path, "model.safetensors.index.json")) as f:
        shards = set(json.load(f)["weight_map"].values())
    assert len(shards) >= 3
    # A stray file outside the index (as Mistral repos ship consolidated.safetensors) is ignored.
    save_file({"junk": torch.zeros(1)}, os.path.join(path, "consolidated.safetensors"))
    expected = hf_logits(path, [PROMPT])[0]
    torch.testing.assert_close(_logits(load_folio(path)), expected, atol=1e-4, rtol=0)


def test_bf16_checkpoint_loads_into_float32(tmp_path):
    path = make_tiny_checkpoint("llama", tmp_path, save_dtype=torch.bfloat16)
    model = load_folio(path, dtype="float32")
    embed = load_file(os.path.join(path, "model.safetensors"))["model.embed_tokens.weight"]
    assert embed.dtype == torch.bfloat16
    assert model.model.embed_tokens.weight.dtype == torch.float32
    assert torch.equal(model.model.embed_tokens.weight, embed.float())
    torch.testing.assert_close(_logits(model), hf_logits(path, [PROMPT])[0], atol=1e-4, rtol=0)


@pytest.mark.parametrize("legacy", [False, True])
def test_pytorch_bin_checkpoint_matches_safetensors(tmp_path, legacy):
    st = make_tiny_checkpoint("opt", tmp_path / "st")
    pt = str(tmp_path / "pt")
    shutil.copytree(st, pt)
    convert_to_pytorch_bin(pt, legacy=legacy)
    assert not any(name.endswith(".safetensors") for name in os.listdir(pt))
    assert torch.equal(_logits(load_folio(pt)), _logits(load_folio(st)))
    with pytest.raises(ValueError, match="safetensors"):
        load_folio(pt, load_format="safetensors")
    with pytest.raises(ValueError, match="pytorch_model"):
        load_folio(st, load_format="pt")


def test_dummy_weights_run_without_a_checkpoint_and_follow_the_seed(tmp_path):
    path = make_tiny_checkpoint("qwen2", tmp_path)
    os.remove(os.path.join(path, "model.safetensors"))
    model = load_folio(path, load_format="dummy", dtype="bfloat16", seed=3)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    logits = _logits(model)
    assert logits.dtype == torch.float32 and logits.shape == (len(PROMPT), 1000)
    assert torch.isfinite(logits).all()
    same = load_folio(path, load_format="dummy", dtype="bfloat16", seed=3)
    other = load_folio(path, load_format="dummy", dtype="bfloat16", seed=4)
    weight = "model.layers.0.self_attn.qkv_proj.weight"
    params = [dict(m.named_parameters())[weight] for m in (model, same, other)]
    assert torch.equal(params[0], params[1])
    assert not torch.equal(params[0], params[2])


def test_unknown_architecture_lists_the_supported_ones(tmp_path):
    path = make_tiny_checkpoint("llama", tmp_path)
    config_path = os.path.join(path, "config.json")
    with open(config_path) as f:
        config = json.load(f)
    config["architectures"] = ["GPT2LMHeadModel"]
    with open(config_path, "w") as f:
        json.dump(config, f)
    with pytest.raises(ValueError, match="GPT2LMHeadModel") as err:
        load_folio(path)
    for arch in supported_architectures():
        assert arch in str(err.value)
    assert get_model_class("Qwen3ForCausalLM").__name__ == "Qwen3ForCausalLM"


@pytest.mark.parametrize(
    "dropped, reported",
    [
        ("model.layers.1.mlp.down_proj.weight", "model.layers.1.mlp.down_proj.weight"),
        # One shard of a merged projection missing leaves the merged parameter incomplete.
        ("model.layers.0.self_attn.k_proj.bias", "model.layers.0.self_attn.qkv_proj.bias"),
        ("lm_head.weight", "lm_head.weight"),  # untied: the head is a weight of its own
    ],
)
def test_missing_weights_are_named(tmp_path, dropped, reported):
    path = make_tiny_checkpoint("llama", tmp_path)
    _rewrite_weights(path, lambda tensors: tensors.pop(dropped))
    with pytest.raises(ValueError, match=reported.replace(".", r"\.")):
        load_folio(path)


def test_tied_head_and_unexpected_tensors_in_the_file_are_accepted(tmp_path):
    path = make_tiny_checkpoint("llama3", tmp_path)  # tied: save_pretrained writes no lm_head
    before = _logits(load_folio(path))

    def add_extras(tensors):
        assert "lm_head.weight" not in tensors
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
        tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)

    _rewrite_weights(path, add_extras)
    model = load_folio(path)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert torch.equal(_logits(model), before)


def test_profiling_pass_without_kv_cache_matches_transformers(tmp_path):
    """With no cache bound, a batch of whole prompts attends within each prompt."""
    path = make_tiny_checkpoint("mistral", tmp_path)
    prompts = [PROMPT, PROMPT[:45][::-1]]
    model = load_folio(path)
    layer = model.attention_layers()[0]
    kv = PagedKV(model, layer.num_kv_heads, layer.head_dim, blocks_needed([70, 45], 16), 16)
    input_ids, positions, metadata = kv.step([(0, prompts[0]), (1, prompts[1])])
    model.bind_kv_caches([None] * len(kv.caches))
    with torch.inference_mode():
        logits = model.compute_logits(model(input_ids, positions, metadata))
    expected = torch.cat(hf_logits(path, prompts))
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("arch", ["llama", "opt"])
def test_logits_in_the_model_dtype_are_the_float32_ones_unwidened(tmp_path, arch):
    """compute_logits(widen=False), the sampler's call, skips only the final widening."""
    model = load_folio(make_tiny_checkpoint(arch, tmp_path), dtype="bfloat16")
    hidden = torch.randn(3, model.lm_head.weight.shape[1], dtype=torch.bfloat16, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        low, wide = model.compute_logits(hidden, widen=False), model.compute_logits(hidden)
    assert low.dtype == torch.bfloat16 and wide.dtype == torch.float32
    assert torch.equal(low.float(), wide)
