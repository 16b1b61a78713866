"""Tensor parallelism on quantized checkpoints (CPU, gloo, 2 ranks): each rank's slice of packed
INT4 weights, group scales and zeros comes out of the layer weight_loader right, so tp=2 gives
the greedy tokens of tp=1; what cannot be split is a clear error at load.
"""

from __future__ import annotations

import os

import pytest

from folio import LLM, SamplingParams
from tests.helpers.checkpoints import make_tiny_checkpoint
from tests.helpers.quantized_checkpoints import write_compressed_tensors, write_int4

# Row-parallel inputs per rank (o_proj 64, down_proj 128) in whole groups of 32.
SHAPES = dict(num_hidden_layers=2, hidden_size=128, intermediate_size=256, num_attention_heads=4,
              num_key_value_heads=2, head_dim=32)
PROMPTS = [{"prompt_token_ids": [1, 5, 9, 200, 17]}, {"prompt_token_ids": list(range(3, 40))}]


@pytest.fixture(scope="module")
def float_checkpoint(tmp_path_factory):
    return make_tiny_checkpoint("llama", tmp_path_factory.mktemp("float"), **SHAPES)


def _tokens(path: str, tp: int) -> list[list[int]]:
    llm = LLM(model=path, dtype="float32", device="cpu", tensor_parallel_size=tp, max_model_len=128,
              max_num_seqs=2, num_gpu_blocks_override=16, seed=0)
    try:
        outputs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=6), use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outputs]
    finally:
        llm.llm_engine.shutdown()


@pytest.mark.parametrize("fmt", ["gptq", "awq"])
def test_channelwise_int4_tp2_equals_tp1(float_checkpoint, tmp_path, fmt):
    """group_size -1: one scale row over all of K, which every row-parallel rank keeps whole
    (slicing it by rank read past its single row)."""
    path = write_int4(float_checkpoint, str(tmp_path / fmt), fmt, group_size=-1, symmetric=False)
    assert _tokens(path, 2) == _tokens(path, 1)


@pytest.mark.parametrize("fmt", ["gptq", "gptq-without-g_idx", "compressed-tensors"])
def test_grouped_asymmetric_int4_tp2_equals_tp1(float_checkpoint, tmp_path, fmt):
    """Groups of 32: each rank's groups of scales and zeros, zeros packed along N (GPTQ qzeros
    [K/G, N/8]; compressed-tensors weight_zero_point [N/8, K/G]). A GPTQ checkpoint may leave
    g_idx out: a row-parallel rank's default groups continue where the previous rank's end."""
    if fmt.startswith("gptq"):
        path = write_int4(float_checkpoint, str(tmp_path / "gptq"), "gptq", group_size=32, symmetric=False)
        if fmt == "gptq-without-g_idx":
            _drop_g_idx(path)
    else:
        path = write_compressed_tensors(float_checkpoint, str(tmp_path / "ct"), "W4A16_ASYM", group_size=32)
    assert _tokens(path, 2) == _tokens(path, 1)


def test_act_order_row_parallel_is_a_clear_error(float_checkpoint, tmp_path):
    """An act-order rank's input rows fall in arbitrary groups: refused, not run wrong."""
    path = write_int4(float_checkpoint, str(tmp_path / "gptq"), "gptq", group_size=32, symmetric=True, desc_act=True)
    with pytest.raises(Exception, match="act-order"):
        _tokens(path, 2)


def _drop_g_idx(path: str) -> None:
    from safetensors.torch import load_file, save_file

    file = os.path.join(path, "model.safetensors")
    tensors = {k: v for k, v in load_file(file).items() if not k.endswith(".g_idx")}
    save_file(tensors, file, metadata={"format": "pt"})
