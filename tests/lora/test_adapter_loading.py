"""Reading PEFT adapter folders: scaling, formats, and a clear error for everything folio refuses."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from folio.lora.adapter import load_adapter
from folio.lora.request import LoRARequest
from folio.lora.targets import lora_targets

HIDDEN, KV, INTER, LAYERS = 12, 4, 20, 2


def _targets():
    """The targets of a 2-layer Llama-shaped model, from stand-in layers (names + sizes)."""
    layers = []
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        layers += [
            (f"{p}.self_attn.qkv_proj", SimpleNamespace(input_size=HIDDEN, output_sizes=[HIDDEN, KV, KV])),
            (f"{p}.self_attn.o_proj", SimpleNamespace(input_size=HIDDEN, output_sizes=[HIDDEN])),
            (f"{p}.mlp.gate_up_proj", SimpleNamespace(input_size=HIDDEN, output_sizes=[INTER, INTER])),
            (f"{p}.mlp.down_proj", SimpleNamespace(input_size=INTER, output_sizes=[HIDDEN])),
            (f"{p}.input_layernorm", SimpleNamespace()),
        ]
    return lora_targets(layers)


SIZES = {"q_proj": (HIDDEN, HIDDEN), "k_proj": (HIDDEN, KV), "v_proj": (HIDDEN, KV), "o_proj": (HIDDEN, HIDDEN),
         "gate_proj": (HIDDEN, INTER), "up_proj": (HIDDEN, INTER), "down_proj": (INTER, HIDDEN)}


def _write(path, r=4, modules=("q_proj", "v_proj"), layers=range(LAYERS), fmt="safetensors", tensors=None, **config):
    path.mkdir(parents=True, exist_ok=True)
    cfg = {"peft_type": "LORA", "r": r, "lora_alpha": 8, "target_modules": list(modules), "bias": "none"} | config
    (path / "adapter_config.json").write_text(json.dumps(cfg))
    if tensors is None:
        gen = torch.Generator().manual_seed(0)
        tensors = {}
        for i in layers:
            for m in modules:
                kind = "self_attn" if m in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
                in_size, out_size = SIZES[m]
                key = f"base_model.model.model.layers.{i}.{kind}.{m}"
                tensors[f"{key}.lora_A.weight"] = torch.randn(r, in_size, generator=gen)
                tensors[f"{key}.lora_B.weight"] = torch.randn(out_size, r, generator=gen)
    if fmt == "safetensors":
        save_file(tensors, str(path / "adapter_model.safetensors"))
    else:
        torch.save(tensors, str(path / "adapter_model.bin"))
    return tensors


def _load(path, max_rank=16):
    return load_adapter(LoRARequest("a", 1, str(path)), _targets(), max_rank, torch.float32)


def test_targets_map_peft_names_to_merged_shards():
    targets = _targets()
    assert targets["model.layers.1.self_attn.k_proj"].layer_name == "model.layers.1.self_attn.qkv_proj"
    assert targets["model.layers.1.self_attn.k_proj"].shard == 1
    assert targets["model.layers.0.mlp.up_proj"].output_size == INTER
    assert len(targets) == 7 * LAYERS


@pytest.mark.parametrize("rslora", [False, True])
def test_scaling_is_folded_into_b(tmp_path, rslora):
    tensors = _write(tmp_path, r=4, lora_alpha=6, use_rslora=rslora)
    adapter = _load(tmp_path)
    scale = 6 / math.sqrt(4) if rslora else 6 / 4
    assert adapter.scaling == pytest.approx(scale)
    w = adapter.modules["model.layers.1.self_attn.v_proj"]
    torch.testing.assert_close(w.lora_b, tensors["base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"] * scale)
    torch.testing.assert_close(w.lora_a, tensors["base_model.model.model.layers.1.self_attn.v_proj.lora_A.weight"])


def test_bin_format_and_a_layer_subset(tmp_path):
    _write(tmp_path, modules=("down_proj",), layers=[1], fmt="bin")
    assert sorted(_load(tmp_path).modules) == ["model.layers.1.mlp.down_proj"]


def test_fan_in_fan_out_is_accepted(tmp_path):
    _write(tmp_path, fan_in_fan_out=True)
    assert len(_load(tmp_path).modules) == 2 * LAYERS


@pytest.mark.parametrize(
    "setup,match",
    [
        (lambda p: None, "does not exist"),
        (lambda p: p.mkdir(), "no adapter_config.json"),
        (lambda p: (p.mkdir(), (p / "adapter_config.json").write_text('{"r": 4}')), "no adapter_model.safetensors or adapter_model.bin"),
        (lambda p: _write(p, r=32), "rank 32, more than max_lora_rank=16"),
        (lambda p: _write(p, use_dora=True), "use_dora"),
        (lambda p: _write(p, modules_to_save=["lm_head"]), "modules_to_save"),
        (lambda p: _write(p, bias="all"), "bias"),
        (lambda p: _write(p, peft_type="IA3"), "IA3"),
        (lambda p: _write(p, modules=("q_proj", "lm_head"), tensors={}), "targets 'lm_head'"),
        (lambda p: _write(p, layers=[0, 5]), "model.layers.5.self_attn.q_proj, which this model does not have"),
        (lambda p: _write(p, tensors={"base_model.model.model.embed_tokens.lora_embedding_A": torch.zeros(4, 3)}), "not a LoRA A/B weight"),
        (lambda p: _write(p, tensors={"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(4, HIDDEN)}), "without its other half"),
        (lambda p: _write(p, tensors={"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(4, HIDDEN + 1),
                                      "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": torch.zeros(HIDDEN, 4)}), "another base model"),
    ],
)
def test_refused_with_a_clear_error(tmp_path, setup, match):
    path = tmp_path / "adapter"
    setup(path)
    with pytest.raises(ValueError, match=match):
        _load(path)


def test_lora_request_checks_its_fields():
    with pytest.raises(ValueError, match="lora_int_id"):
        LoRARequest("a", 0, "/x")
    with pytest.raises(ValueError, match="lora_name"):
        LoRARequest("", 1, "/x")
    assert LoRARequest("a", 1, "/x").cache_key() != LoRARequest("a", 2, "/x").cache_key()
