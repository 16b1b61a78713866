"""Rope scaling types against transformers' definitions, and both config formats."""

from __future__ import annotations

import json
import os

import pytest
import torch

from folio.layers.rotary_embedding import compute_inv_freq, get_rope, rope_parameters_from_hf
from tests.helpers.checkpoints import make_tiny_checkpoint
from tests.helpers.paged_batch import PagedKV, blocks_needed, run_schedule
from tests.models.conftest import hf_logits, load_folio

HEAD_DIM = 20
MAX_POS = 512
PROMPT = [(i * 53 + 7) % 1000 for i in range(90)]

ROPE_CASES = {
    "default": dict(rope_type="default", rope_theta=10000.0),
    "linear": dict(rope_type="linear", rope_theta=10000.0, factor=2.5),
    "dynamic": dict(rope_type="dynamic", rope_theta=10000.0, factor=4.0),
    "llama3": dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                   high_freq_factor=4.0, original_max_position_embeddings=64),
    "yarn": dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                 original_max_position_embeddings=128),
    "yarn_mscale": dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                        original_max_position_embeddings=128, mscale=0.8, mscale_all_dim=0.5,
                        beta_fast=16, truncate=False),
}


def _hf_inv_freq(params: dict) -> tuple[torch.Tensor, float]:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = LlamaConfig(hidden_size=6 * HEAD_DIM, num_attention_heads=6, head_dim=HEAD_DIM,
                         max_position_embeddings=MAX_POS, rope_parameters=dict(params))
    if params["rope_type"] == "default":
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        return LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    return ROPE_INIT_FUNCTIONS[params["rope_type"]](config, "cpu")


@pytest.mark.parametrize("case", ROPE_CASES)
def test_inverse_frequencies_match_transformers(case):
    config = {"rope_parameters": ROPE_CASES[case], "max_position_embeddings": MAX_POS}
    params = rope_parameters_from_hf(config)
    inv_freq, scaling = compute_inv_freq(params, HEAD_DIM, MAX_POS)
    hf_inv_freq, hf_scaling = _hf_inv_freq(ROPE_CASES[case])
    torch.testing.assert_close(inv_freq, hf_inv_freq.float(), rtol=1e-6, atol=0)
    assert scaling == pytest.approx(hf_scaling)


def test_unknown_rope_type_is_named():
    with pytest.raises(ValueError, match="longrope"):
        get_rope(HEAD_DIM, MAX_POS, {"rope_type": "longrope", "rope_theta": 1e4})


def test_legacy_rope_scaling_format_reads_like_rope_parameters():
    legacy = {"rope_theta": 2e5, "rope_scaling": {"type": "linear", "factor": 3.0},
              "max_position_embeddings": 64}
    modern = {"rope_parameters": {"rope_type": "linear", "rope_theta": 2e5, "factor": 3.0},
              "max_position_embeddings": 64}
    assert rope_parameters_from_hf(legacy) == rope_parameters_from_hf(modern)
    unscaled = rope_parameters_from_hf({"rope_scaling": None, "rope_theta": 5.0})
    assert unscaled == {"rope_type": "default", "rope_theta": 5.0}


def _prefill_logits(model) -> torch.Tensor:
    layer = model.attention_layers()[0]
    kv = PagedKV(model, layer.num_kv_heads, layer.head_dim, blocks_needed([len(PROMPT)], 4), 4)
    return run_schedule(kv, [[(0, PROMPT)]])[0]


@pytest.mark.parametrize("case", ["linear", "yarn_mscale"])
def test_scaled_rope_models_match_transformers(tmp_path, case):
    path = make_tiny_checkpoint("llama", tmp_path, rope_parameters=dict(ROPE_CASES[case]))
    expected = hf_logits(path, [PROMPT])[0]
    torch.testing.assert_close(_prefill_logits(load_folio(path)), expected, atol=1e-4, rtol=0)


def test_checkpoint_in_legacy_rope_format_gives_the_same_logits(tmp_path):
    path = make_tiny_checkpoint("llama3", tmp_path)
    before = _prefill_logits(load_folio(path))
    config_path = os.path.join(path, "config.json")
    with open(config_path) as f:
        config = json.load(f)
    params = config.pop("rope_parameters")
    config["rope_theta"] = params.pop("rope_theta")
    params["type"] = params.pop("rope_type")  # the older spelling
    config["rope_scaling"] = params
    with open(config_path, "w") as f:
        json.dump(config, f)
    assert torch.equal(_prefill_logits(load_folio(path)), before)
