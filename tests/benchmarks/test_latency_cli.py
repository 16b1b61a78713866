"""`folio bench latency` and the vLLM peer protocol, on a tiny checkpoint with a stand-in vllm package.

The stand-in (written to a temporary folder named by FOLIO_VLLM_SITE) records what the child
process hands to vLLM and produces exactly max_tokens tokens, so the tests check the job folio
sends (token-id prompts, skip_tokenizer_init, dummy weights, temperature) and the report's
arithmetic; the real vLLM runs only on the GPU machine (scripts/gpu_session.sh).
"""

from __future__ import annotations

import json
import math

import pytest

from folio.benchmarks.latency import LatencySpec, format_rows, summarise
from folio.benchmarks.vllm_peer import CallResult
from folio.entrypoints.cli.main import main
from tests.helpers.checkpoints import make_tiny_checkpoint

pytestmark = pytest.mark.slow

FAKE_VLLM = '''
import json, os
__version__ = "0.0.fake"
LOG = os.path.join(os.path.dirname(__file__), "calls.jsonl")
class SamplingParams:
    def __init__(self, temperature, max_tokens, ignore_eos, detokenize):
        assert ignore_eos and not detokenize
        self.temperature, self.max_tokens = temperature, max_tokens
class _Completion:
    def __init__(self, n): self.token_ids = [7] * n
class _Output:
    def __init__(self, n): self.outputs = [_Completion(n)]
class LLM:
    def __init__(self, **kwargs):
        with open(LOG, "a") as f: f.write(json.dumps({"init": kwargs}) + "\\n")
    def generate(self, prompts, params, use_tqdm=False):
        with open(LOG, "a") as f:
            f.write(json.dumps({"lens": [len(p["prompt_token_ids"]) for p in prompts],
                                "temperature": params[0].temperature}) + "\\n")
        return [_Output(p.max_tokens) for p in params]
'''


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch):
    site = tmp_path / "site"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text(FAKE_VLLM)
    monkeypatch.setenv("FOLIO_VLLM_SITE", str(site))
    return site / "vllm" / "calls.jsonl"


def _bare_qwen3(tmp_path) -> str:
    model = make_tiny_checkpoint("qwen3", tmp_path / "full")
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text((tmp_path / "full" / "config.json").read_text())
    return str(bare)


def _cli(args: list[str]) -> int:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    return exit_info.value.code


def test_latency_with_vllm_peer(tmp_path, fake_vllm, capsys):
    model = _bare_qwen3(tmp_path)
    out = tmp_path / "latency.json"
    code = _cli(["bench", "latency", "--model", model, "--load-format", "dummy", "--device", "cpu",
                 "--prompt-lens", "40", "--batch-sizes", "2", "--decode-prompt-len", "8", "--decode-steps", "4",
                 "--repeat", "2", "--peer", "vllm", "--json", str(out)])
    assert code == 0
    data = json.loads(out.read_text())
    assert list(data["systems"]) == ["folio", "vllm 0.0.fake"]
    assert [r["name"] for r in data["systems"]["folio"]] == ["ttft 40", "decode batch 2", "decode batch 2"]
    assert all(r["exact"] for rows in data["systems"].values() for r in rows)
    calls = [json.loads(line) for line in fake_vllm.read_text().splitlines()]
    init = calls[0]["init"]
    assert init["skip_tokenizer_init"] and init["load_format"] == "dummy" and init["max_model_len"] >= 41
    # Three calls (ttft, batch max_tokens 1, batch max_tokens 5), each warmed up once and run twice.
    assert [c["lens"] for c in calls[1:]] == [[40]] * 3 + [[8, 8]] * 6
    assert "folio vs vllm 0.0.fake" in capsys.readouterr().out


def test_throughput_vllm_peer_gets_the_same_requests(tmp_path, fake_vllm, capsys):
    model = _bare_qwen3(tmp_path)
    out = tmp_path / "tp.json"
    code = _cli(["bench", "throughput", "--model", model, "--load-format", "dummy", "--device", "cpu",
                 "--workload", "random", "--input-len", "20", "--output-len", "6", "--num-prompts", "4",
                 "--range-ratio", "0.5", "--max-model-len", "64", "--no-progress", "--no-floor",
                 "--temperature", "0.6", "--peer", "vllm", "--json", str(out)])
    assert code == 0
    data = json.loads(out.read_text())
    folio, vllm = data["results"]
    assert vllm["system"] == "vllm 0.0.fake" and vllm["all_lengths_exact"]
    assert vllm["output_tokens"] == folio["output_tokens"] == data["workload"]["output_tokens"]
    assert data["folio_over_peer"]["vllm 0.0.fake"] == pytest.approx(folio["output_tok_s"] / vllm["output_tok_s"])
    calls = [json.loads(line) for line in fake_vllm.read_text().splitlines()][1:]
    # folio's warm-ups' twins (8 short prompts, a lone long one cut to the context), then the workload
    assert [len(c["lens"]) for c in calls] == [8, 1, 4] and calls[1]["lens"] == [64 - 8]
    assert {c["temperature"] for c in calls} == {0.6}


def test_missing_vllm_is_a_failed_peer_not_a_crash(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FOLIO_VLLM_SITE", str(tmp_path / "nothing-here"))
    model = _bare_qwen3(tmp_path)
    code = _cli(["bench", "throughput", "--model", model, "--load-format", "dummy", "--device", "cpu",
                 "--workload", "random", "--input-len", "8", "--output-len", "3", "--num-prompts", "2",
                 "--max-model-len", "64", "--no-progress", "--no-floor", "--peer", "vllm"])
    assert code == 0  # folio's numbers stand
    assert "vllm does not import" in capsys.readouterr().out


def test_temperature_is_not_for_the_transformers_peer(tmp_path, capsys):
    code = _cli(["bench", "throughput", "--model", _bare_qwen3(tmp_path), "--load-format", "dummy",
                 "--device", "cpu", "--temperature", "0.6", "--peer", "transformers", "--workload", "random",
                 "--input-len", "8", "--output-len", "3", "--num-prompts", "2"])
    assert code == 2
    assert "greedy only" in capsys.readouterr().err


def test_latency_summary_arithmetic():
    spec = LatencySpec(prompt_lens=(100,), batch_sizes=(4,), decode_prompt_len=8, decode_steps=10, repeat=3)
    results = [
        CallResult("ttft 100", [0.030, 0.010, 0.020], [1]),
        CallResult("batch 4 max_tokens 1", [0.005, 0.005, 0.005], [1] * 4),
        CallResult("batch 4 max_tokens 11", [0.025, 0.025, 0.025], [11, 11, 11, 10]),
    ]
    ttft, per_token, rate = summarise(spec, results)
    assert ttft.value == pytest.approx(20.0) and ttft.exact
    assert per_token.value == pytest.approx(2.0) and not per_token.exact  # one request fell short
    assert rate.value == pytest.approx(4 * 10 / 0.020)
    noisy = [results[0], results[1], CallResult("batch 4 max_tokens 11", [0.004] * 3, [11] * 4)]
    assert math.isnan(summarise(spec, noisy)[1].value)
    text = format_rows({"folio": [ttft, per_token, rate], "peer": [ttft, per_token, rate]})
    assert "1.00x" in text and "!" in text
    with pytest.raises(ValueError):
        LatencySpec(batch_sizes=(0,))


def test_no_timed_call_can_hit_the_prefix_cache():
    """Both engines cache prefixes: every call of a job (warm-ups too) starts with its own token."""
    spec = LatencySpec(prompt_lens=(30, 40), batch_sizes=(1, 3), decode_prompt_len=5, repeat=3, vocab_limit=50)
    firsts = [
        tuple(p["prompt_token_ids"][0] for p in call.prompts_for(rep))
        for call in spec.calls() for rep in range(call.repeat + 1)
    ]
    batch_firsts = [f for f in firsts if len(f) == 3]
    assert len(set(firsts)) == len(firsts)
    assert len({f for group in batch_firsts for f in group}) > len(batch_firsts)  # rows differ too
    assert all(0 <= t < 50 for group in firsts for t in group)
    assert all(call.prompts_for(1)[0]["prompt_token_ids"][1:] == call.prompts[0][1:] for call in spec.calls())


def test_vllm_peer_gets_the_engine_arguments_the_user_set(tmp_path, fake_vllm, capsys):
    """Engine arguments vLLM names alike reach the peer; the others are named, not dropped silently."""
    model = _bare_qwen3(tmp_path)
    code = _cli(["bench", "latency", "--model", model, "--load-format", "dummy", "--device", "cpu",
                 "--prompt-lens", "20", "--batch-sizes", "1", "--decode-prompt-len", "8", "--decode-steps", "2",
                 "--repeat", "1", "--peer", "vllm", "--max-num-seqs", "32", "--no-enable-prefix-caching",
                 "--cpu-kv-cache-space", "2"])
    assert code == 0
    init = json.loads(fake_vllm.read_text().splitlines()[0])["init"]
    assert init["max_num_seqs"] == 32 and init["enable_prefix_caching"] is False
    assert "gpu_memory_utilization" not in init  # left at vLLM's default: the user set none
    assert "cpu_kv_cache_space" in capsys.readouterr().err and "cpu_kv_cache_space" not in init
