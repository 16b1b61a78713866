"""The physical floor: reproduces DESIGN.md's numbers for W1 on Qwen3-0.6B, counts rules right."""

from __future__ import annotations

import json
import os

import pytest

from folio.benchmarks.floor import _sum_contexts, compute_floor, model_cost, workload_cost
from folio.benchmarks.hardware import DeviceLimits, measure_device
from folio.benchmarks.workloads import BenchRequest, Workload, w1

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "..", "folio", "benchmarks", "configs")
QWEN3 = os.path.join(CONFIGS, "qwen3-0.6b")
LLAMA8B = os.path.join(CONFIGS, "llama-3.1-8b")
H100 = DeviceLimits("H100 as measured in DESIGN.md", copy_bandwidth=3.0e12, matmul_flops=785e12)


@pytest.fixture(scope="module")
def qwen3():
    return model_cost(QWEN3, "bfloat16")


def test_qwen3_kv_is_112_kib_per_token(qwen3):
    assert qwen3.kv_bytes_per_token == 112 * 1024
    assert (qwen3.num_layers, qwen3.num_kv_heads, qwen3.head_dim) == (28, 8, 128)


def test_qwen3_w1_reproduces_design(qwen3):
    work = workload_cost(w1())
    assert work.kv_token_reads == 120_938_031  # "~121 M token-reads"
    assert work.min_steps == 1024
    floor = compute_floor(qwen3, work, H100)
    assert floor.kv_read_bytes == pytest.approx(13.87e12, rel=1e-3)  # "about 14 TB"
    assert floor.bound == "memory"
    assert floor.floor_time_s == pytest.approx(5.04, rel=0.01)  # "under ~5 s"
    assert floor.ceiling_output_tok_s == pytest.approx(26_600, rel=0.01)
    assert floor.fraction(16_000) == pytest.approx(16_000 / floor.ceiling_output_tok_s)


def test_llama8b_w1_is_near_design():
    llama = model_cost(LLAMA8B, "bfloat16")
    assert llama.kv_bytes_per_token == 128 * 1024
    # Input embeddings are gathered, not read whole; lm_head (untied) is read every pass.
    assert llama.step_params == pytest.approx(7.505e9, rel=1e-3)
    floor = compute_floor(llama, workload_cost(w1()), H100)
    assert floor.total_bytes == pytest.approx(31.3e12, rel=0.01)  # DESIGN: ~32 TB incl. embeddings
    assert floor.ceiling_output_tok_s == pytest.approx(12_400, rel=0.05)


def test_tied_lm_head_counts_once_per_pass(qwen3):
    # Qwen3-0.6B: 28 layers of (q, k, v, o, gate, up, down) + the tied 151936 x 1024 table as lm_head.
    per_layer = 1024 * (2048 + 1024 + 1024) + 2048 * 1024 + 3 * 1024 * 3072
    assert qwen3.body_matmul_params == 28 * per_layer
    assert qwen3.lm_head_params == 151_936 * 1024
    norms = 28 * (2 * 1024 + 2 * 128) + 1024  # input/post norms, q/k norms, final norm
    assert qwen3.step_params == qwen3.body_matmul_params + qwen3.lm_head_params + norms


def test_token_reads_and_flops_by_hand():
    w = Workload("two", [BenchRequest([1, 2, 3], 2), BenchRequest([4], 3)])
    work = workload_cost(w)
    # Request 1 samples from contexts 3 and 4; request 2 from 1, 2 and 3.
    assert work.kv_token_reads == 3 + 4 + 1 + 2 + 3
    assert work.tokens_fed == (3 + 2 - 1) + (1 + 3 - 1)
    assert work.attention_pairs == (1 + 2 + 3 + 4) + (1 + 2 + 3)
    assert work.min_steps == 3


def test_sliding_window_caps_the_context():
    for first, last, window in [(1, 10, 4), (5, 9, 4), (3, 3, 8), (1, 40, 40), (2, 50, 7)]:
        assert _sum_contexts(first, last, window) == sum(min(c, window) for c in range(first, last + 1))
    assert _sum_contexts(1, 10, None) == 55 and _sum_contexts(5, 4, None) == 0


def test_sliding_window_model(tmp_path):
    with open(os.path.join(QWEN3, "config.json")) as f:
        config = json.load(f)
    config.update(architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=64,
                  num_hidden_layers=2, vocab_size=1000)
    del config["use_sliding_window"], config["max_window_layers"]  # Qwen's switches, not Mistral's
    (tmp_path / "config.json").write_text(json.dumps(config))
    cost = model_cost(str(tmp_path), "float32")
    assert cost.sliding_window == 64 and cost.itemsize == 4
    work = workload_cost(Workload("long", [BenchRequest([0] * 100, 10)]), cost.sliding_window)
    assert work.kv_token_reads == 64 * 10


def test_quantized_weights_and_cache_count_their_own_bytes():
    """FP8 weights: the decoder's linears at 1 byte (lm_head and norms stay 16-bit) and their
    products at twice the matrix rate; an FP8 cache halves the K/V; 4-bit (RTN, symmetric): half a
    byte plus a float32 scale a group of 128, as the W4A16 kernels read them. Unquantized,
    nothing changes."""
    bf16 = model_cost(LLAMA8B, "bfloat16")
    fp8 = model_cost(LLAMA8B, "bfloat16", "fp8")
    body, rest = bf16.body_matmul_params, bf16.step_params - bf16.body_matmul_params
    assert bf16.weight_bytes_per_step == 2 * bf16.step_params
    assert fp8.weight_bytes_per_step == body + 2 * rest
    assert fp8.kv_bytes_per_token == bf16.kv_bytes_per_token == 128 * 1024
    assert model_cost(LLAMA8B, "bfloat16", "fp8", "fp8").kv_bytes_per_token == 64 * 1024
    int4 = model_cost(LLAMA8B, "bfloat16", "int4-rtn")
    assert int4.weight_bytes_per_step == round(body * (0.5 + 4 / 128) + 2 * rest)
    work = workload_cost(w1())
    f16, f8 = compute_floor(bf16, work, H100), compute_floor(fp8, work, H100)
    assert f8.flops == f16.flops and f8.fp8_flops == 2 * body * work.tokens_fed
    assert f8.compute_time_s == pytest.approx((f16.flops - body * work.tokens_fed) / H100.matmul_flops)
    # The weights were half of W1's bytes on the 8B; the K/V reads stay: ~1.30x the ceiling.
    assert 1.25 < f8.ceiling_output_tok_s / f16.ceiling_output_tok_s < 1.35
    assert compute_floor(int4, work, H100).compute_time_s == f16.compute_time_s


def test_a_quantized_checkpoint_sets_the_format(tmp_path):
    """The checkpoint's quantization_config, as folio would load it: GPTQ 4-bit (a float32 scale a
    group; a uint8 zero point only when asymmetric), AWQ (asymmetric unless zero_point is false),
    compressed-tensors FP8 dynamic (FP8 products) and pack-quantized 4-bit."""
    with open(os.path.join(LLAMA8B, "config.json")) as f:
        config = json.load(f)

    def cost(quantization_config):
        (tmp_path / "config.json").write_text(json.dumps(config | {"quantization_config": quantization_config}))
        return model_cost(str(tmp_path), "bfloat16")

    gptq = cost({"quant_method": "gptq", "bits": 4, "group_size": 64})  # sym: true by default
    assert gptq.body_weight_bytes == pytest.approx(0.5 + 4 / 64) and not gptq.fp8_matmuls
    assert cost({"quant_method": "gptq", "bits": 4, "group_size": 64, "sym": False}).body_weight_bytes == 0.5 + 5 / 64
    assert cost({"quant_method": "awq", "bits": 4, "group_size": 128}).body_weight_bytes == 0.5 + 5 / 128
    symmetric_awq = cost({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": False})
    assert symmetric_awq.body_weight_bytes == 0.5 + 4 / 128
    fp8 = {"quant_method": "compressed-tensors", "config_groups": {"group_0": {"targets": ["Linear"],
        "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
        "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}}}}
    assert (cost(fp8).body_weight_bytes, cost(fp8).fp8_matmuls) == (1.0, True)
    int4 = {"quant_method": "compressed-tensors", "format": "pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"],
        "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32, "symmetric": True}}}}
    assert (cost(int4).body_weight_bytes, cost(int4).fp8_matmuls) == (0.5 + 4 / 32, False)
    with pytest.raises(ValueError, match="does not match the checkpoint"):
        model_cost(str(tmp_path), "bfloat16", "fp8")


def test_no_device_no_floor_time(qwen3):
    floor = compute_floor(qwen3, workload_cost(w1()), None)
    assert floor.total_bytes > 0 and floor.floor_time_s is None and floor.fraction(1.0) is None
    assert measure_device("cpu") is None


@pytest.mark.gpu
def test_device_measurement_on_a_gpu():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    limits = measure_device("cuda")
    assert limits is not None and limits.name
    assert 1e11 < limits.copy_bandwidth < 1e14  # 0.1 .. 100 TB/s: a real measurement, in bytes/s
    assert 1e12 < limits.matmul_flops < 1e16
