"""`folio bench serve` against a stub OpenAI server: payloads, timings, rate and concurrency, failures."""

from __future__ import annotations

import json
import math
import socket

import numpy as np
import pytest

from folio.benchmarks.serve import ServeOptions, arrival_offsets, run_serve_benchmark
from folio.benchmarks.serve_metrics import percentile
from folio.benchmarks.workloads import BenchRequest, Workload, random_workload
from folio.entrypoints.cli.main import main
from tests.benchmarks.stub_server import FAIL_TOKEN, StubServer

WORKLOAD = random_workload(12, 6, 10, range_ratio=0.5, vocab_limit=500, seed=1)


def _options(server: StubServer, **kwargs) -> ServeOptions:
    kwargs.setdefault("warmup_requests", 0)  # the server sees exactly the workload
    return ServeOptions(base_url=server.base_url, model="stub-model", progress=False, **kwargs)


def test_warmup_requests_go_first_untimed_and_short():
    with StubServer() as server:
        run = run_serve_benchmark(WORKLOAD, _options(server, warmup_requests=3))
    assert run.metrics.completed == 10 and len(run.traces) == 10  # only the timed run is measured
    first = server.state.payloads[:3]
    # reversed: no timed prompt's prefix is in the server's cache after them
    want = [(list(r.prompt_token_ids)[::-1], min(r.output_len, 16)) for r in WORKLOAD.requests[:3]]
    assert sorted((p["prompt"], p["max_tokens"]) for p in first) == sorted(want)
    assert len(server.state.payloads) == 13
    with pytest.raises(ValueError, match="warmup_requests"):
        _options(server, warmup_requests=-1)


def test_streams_token_prompts_and_times_every_token():
    with StubServer() as server:
        run = run_serve_benchmark(WORKLOAD, _options(server))
    m = run.metrics
    assert (m.completed, m.failed, m.exact_lengths) == (10, 0, 10)
    assert m.output_tokens == WORKLOAD.output_tokens and m.input_tokens == WORKLOAD.prompt_tokens
    payload = server.state.payloads[0]
    assert payload["model"] == "stub-model" and payload["stream"] is True and payload["ignore_eos"] is True
    sent = sorted((tuple(p["prompt"]), p["max_tokens"]) for p in server.state.payloads)
    assert sent == sorted((tuple(r.prompt_token_ids), r.output_len) for r in WORKLOAD.requests)
    # One TTFT per request, one ITL per later token, TPOT spreads the rest of the latency.
    assert m.ttft.count == 10 and m.itl.count == WORKLOAD.output_tokens - 10
    for t in run.traces:
        assert 0 < t.ttft_s <= t.latency_s
        assert t.tpot_s == pytest.approx((t.latency_s - t.ttft_s) / (t.output_tokens - 1))
    assert m.ttft.median_ms <= m.ttft.p90_ms <= m.ttft.p99_ms
    assert m.output_throughput == pytest.approx(m.output_tokens / m.duration_s)


def test_concurrency_cap_holds():
    with StubServer() as server:
        run_serve_benchmark(WORKLOAD, _options(server, max_concurrency=2))
    assert server.state.max_in_flight <= 2


def test_failures_and_missing_usage_are_reported():
    bad = Workload("mixed", [BenchRequest([FAIL_TOKEN, 1], 3), BenchRequest([1, 2], 4)])
    with StubServer(send_usage=False) as server:
        m = run_serve_benchmark(bad, _options(server)).metrics
    assert (m.completed, m.failed) == (1, 1)
    assert any("HTTP 400" in e for e in m.errors)
    assert m.usage_missing == 1 and m.output_tokens == 4  # counted from the chunks


def test_poisson_arrivals():
    assert arrival_offsets(3, math.inf, 0) == [0.0, 0.0, 0.0]
    offsets = arrival_offsets(2000, 50.0, seed=7)
    assert offsets == sorted(offsets) and offsets[0] == 0.0
    assert offsets[-1] / len(offsets) == pytest.approx(1 / 50.0, rel=0.1)  # mean gap 1/rate
    assert offsets == arrival_offsets(2000, 50.0, seed=7)


def test_percentiles_match_numpy():
    values = sorted([3.0, 1.0, 4.0, 1.5, 9.0, 2.6, 5.0])
    for q in (0, 50, 90, 99, 100):
        assert percentile(values, q) == pytest.approx(np.percentile(values, q))


def test_cli_writes_json(tmp_path, capsys):
    out = tmp_path / "serve.json"
    with StubServer() as server:
        with pytest.raises(SystemExit) as exit_info:
            main(["bench", "serve", "--base-url", server.base_url, "--model", "stub", "--workload", "random",
                  "--input-len", "8", "--output-len", "4", "--num-prompts", "5", "--request-rate", "200",
                  "--max-concurrency", "3", "--no-progress", "--json", str(out)])
    assert exit_info.value.code == 0
    assert "Serving Benchmark Result" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["completed"] == 5 and data["output_tokens"] == 20 and data["max_concurrency"] == 3
    assert {"mean_ttft_ms", "p99_itl_ms", "median_tpot_ms", "p90_e2el_ms"} <= set(data)


def _closed_port() -> int:
    with socket.socket() as s:  # a port nothing listens on once this socket is closed
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_cli_says_when_no_server_answers(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "serve", "--base-url", f"http://127.0.0.1:{_closed_port()}", "--model", "m", "--workload", "random",
              "--input-len", "4", "--output-len", "2", "--num-prompts", "1", "--no-progress",
              "--ready-timeout", "0.6"])  # polls a few times, then gives up
    assert exit_info.value.code == 2
    assert "No server answers" in capsys.readouterr().err


@pytest.mark.slow
def test_against_folios_own_server(tmp_path):
    from tests.helpers.checkpoints import make_tiny_checkpoint
    from tests.helpers.tokenizers import save_test_tokenizer
    from tests.server.harness import ServerThread, make_engine

    model = make_tiny_checkpoint("llama", tmp_path / "llama")
    save_test_tokenizer(model)
    workload = random_workload(16, 8, 6, range_ratio=0.5, vocab_limit=1000, seed=2)
    with ServerThread(make_engine(model)) as server:
        name = server.engine.model_config.served_model_name
        run = run_serve_benchmark(workload, ServeOptions(base_url=server.url, model=name, progress=False,
                                                         max_concurrency=4))
    m = run.metrics
    assert (m.completed, m.failed, m.usage_missing) == (6, 0, 0), m.errors
    assert m.exact_lengths == 6 and m.output_tokens == workload.output_tokens
    assert m.itl.count > 0 and m.ttft.count == 6
