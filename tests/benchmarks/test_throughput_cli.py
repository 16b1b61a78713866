"""`folio bench throughput` end to end on tiny checkpoints, with the transformers peers."""

from __future__ import annotations

import json
import os

import pytest

from folio.entrypoints.cli.main import main
from tests.helpers.checkpoints import make_tiny_checkpoint
from tests.helpers.tokenizers import save_test_tokenizer

pytestmark = pytest.mark.slow

WORKLOAD_ARGS = ["--workload", "random", "--input-len", "24", "--output-len", "10", "--num-prompts", "5",
                 "--range-ratio", "0.5", "--max-model-len", "128", "--device", "cpu", "--no-progress"]


def _bench(args: list[str]) -> int:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "throughput", *args])
    return exit_info.value.code


def test_folio_and_both_transformers_peers(tmp_path, capsys):
    model = make_tiny_checkpoint("llama", tmp_path / "llama")
    save_test_tokenizer(model)
    out = tmp_path / "result.json"
    code = _bench(["--model", model, *WORKLOAD_ARGS, "--peer", "transformers", "--peer-num-requests", "3",
                   "--peer-batch-size", "2", "--json", str(out)])
    assert code == 0
    data = json.loads(out.read_text())
    folio, folio_subset, cb, static = data["results"]
    assert [r["system"] for r in data["results"]] == [
        "folio", "folio (peer subset)", "transformers continuous batching", "transformers generate"]
    assert folio["num_requests"] == 5 and folio["output_tokens"] == data["workload"]["output_tokens"]
    assert data["peer_workload"]["num_requests"] == 3
    for r in (folio, folio_subset, cb, static):
        assert r["error"] is None and r["all_lengths_exact"], r
        assert r["output_tok_s"] == pytest.approx(r["output_tokens"] / r["elapsed_s"])
    subset_tokens = data["peer_workload"]["output_tokens"]
    assert folio_subset["output_tokens"] == cb["output_tokens"] == static["output_tokens"] == subset_tokens
    ratios = data["folio_over_peer"]  # like for like: folio on the peers' subset
    assert ratios["transformers generate"] == pytest.approx(folio_subset["output_tok_s"] / static["output_tok_s"])
    assert data["floor"]["floor_time_s"] is None and data["floor"]["total_bytes"] > 0  # CPU: no device limits
    assert "num_preemptions" in data["engine_stats"]
    text = capsys.readouterr().out
    assert "peers ran the first 3 requests only" in text
    assert "every request produced exactly its requested tokens" in text


def test_config_only_folder_with_dummy_weights(tmp_path, capsys):
    """What the GPU runs do with folio/benchmarks/configs: no weights, no tokenizer."""
    make_tiny_checkpoint("qwen3", tmp_path / "full")
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text((tmp_path / "full" / "config.json").read_text())
    code = _bench(["--model", str(bare), "--load-format", "dummy", *WORKLOAD_ARGS,
                   "--peer", "transformers", "--peer-modes", "generate", "--peer-num-requests", "2"])
    assert code == 0
    text = capsys.readouterr().out
    assert "transformers generate" in text and "failed" not in text
    assert os.listdir(bare) == ["config.json"]


def test_the_floor_counts_the_run_s_quantization(tmp_path):
    """An FP8 run (weights quantized on load, an FP8 KV cache) is measured against a floor of
    1-byte linear weights and K/V, not the checkpoint's 16-bit ones."""
    model = make_tiny_checkpoint("llama", tmp_path / "llama")
    floors = {}
    for name, extra in (("bf16", []), ("fp8", ["--quantization", "fp8", "--kv-cache-dtype", "fp8"])):
        out = tmp_path / f"{name}.json"
        assert _bench(["--model", model, "--dtype", "bfloat16", *WORKLOAD_ARGS, *extra, "--json", str(out)]) == 0
        floors[name] = json.loads(out.read_text())["floor"]
    assert floors["fp8"]["kv_read_bytes"] * 2 == floors["bf16"]["kv_read_bytes"]
    assert floors["fp8"]["weight_bytes"] < floors["bf16"]["weight_bytes"]
    assert floors["fp8"]["fp8_flops"] > 0 == floors["bf16"]["fp8_flops"]


def test_workload_must_fit_the_model(tmp_path, capsys):
    model = make_tiny_checkpoint("llama", tmp_path / "llama")
    save_test_tokenizer(model)
    assert _bench(["--model", model, "--workload", "w1", "--device", "cpu", "--no-floor"]) == 2
    assert "token id" in capsys.readouterr().err  # W1 draws ids up to 10000; this vocabulary has 1000


def test_the_warm_up_ends_with_a_lone_long_prompt_cut_to_the_context():
    """Short requests, then one long prompt in a call of its own (the long-chunk prefill kernel
    runs only with few sequences in a step); none longer than the context allows."""
    from folio.benchmarks.throughput import warmup_workloads

    short, lone = warmup_workloads(vocab_size=500, max_model_len=4096)
    assert short.num_requests == 8 and max(r.prompt_len for r in short.requests) < 256
    assert lone.num_requests == 1 and lone.requests[0].prompt_len == 2048
    assert max(t for r in short.requests + lone.requests for t in r.prompt_token_ids) < 500
    cut = warmup_workloads(500, 300)[1]
    assert cut.requests[0].prompt_len + cut.requests[0].output_len == 300
    assert len(warmup_workloads(500, 8)) == 1  # no room for a long prompt
