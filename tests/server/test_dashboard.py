"""/v1/engine/state, its SSE stream and /dashboard on a live server with the tiny model: the
documented schema (static/engine_state.schema.json), values that agree with the engine, the
API key, --no-dashboard, bad input, and the engine in a process of its own."""

from __future__ import annotations

import json
import threading
import time

import httpx
import jsonschema
import pytest
import torch

from folio.core.engine_state import expand_runs
from folio.engine.arg_utils import EngineArgs
from folio.engine.async_llm import AsyncLLM
from folio.entrypoints.openai.cli_args import ServerConfig
from folio.entrypoints.openai.dashboard.routes import STATIC_DIR
from tests.server.harness import HANG_LIMIT_S, ServerThread, make_engine, wait_for

SCHEMA = json.loads((STATIC_DIR / "engine_state.schema.json").read_text())
BLOCK_SIZE = 16
PROMPT = "Once upon a time " * 6  # two blocks and more: requests share them when prefix caching is on


STEP_DELAY_S = 0.03  # slows the tiny model so that a request lives through several state reads


def slow_steps(engine, delay_s: float = STEP_DELAY_S):
    """Make the AsyncLLM's engine (on a thread) sleep before each step; returns the engine."""
    step = engine.engine.step

    def slow_step():
        time.sleep(delay_s)
        return step()

    engine.engine.step = slow_step
    return engine


@pytest.fixture(scope="module")
def dash_server(checkpoint):
    with ServerThread(slow_steps(make_engine(checkpoint, max_num_seqs=2, max_waiting_requests=64))) as running:
        yield running


def get_state(server, blocks: bool = False, headers=None) -> dict:
    r = httpx.get(f"{server.url}/v1/engine/state", params={"blocks": int(blocks)}, headers=headers,
                  timeout=HANG_LIMIT_S)
    assert r.status_code == 200, r.text
    state = r.json()
    jsonschema.validate(state, SCHEMA)
    if blocks:
        state["blocks"] = {k: expand_runs(v) for k, v in state["blocks"].items()}
    return state


class Streamer:
    """A streaming completion read on a thread; `close()` drops the connection (an abort)."""

    def __init__(self, server, model: str, max_tokens: int = 200, headers: dict | None = None) -> None:
        self.headers = headers
        self.body = {"model": model, "prompt": PROMPT, "max_tokens": max_tokens,
                     "ignore_eos": True, "stream": True}
        self.url, self.id, self.chunks, self.error = f"{server.base_url}/completions", None, 0, None
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        with httpx.stream("POST", self.url, json=self.body, headers=self.headers, timeout=HANG_LIMIT_S) as r:
            if r.status_code != 200:
                self.error = r.read().decode()
                return
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    self.id = self.id or json.loads(line[6:])["id"]
                    self.chunks += 1
                if self._stop.is_set():
                    return  # leaving the `with` closes the connection: the server aborts

    def close(self) -> None:
        self._stop.set()
        self.thread.join(HANG_LIMIT_S)


def num_started(streams: list[Streamer]) -> int:
    failed = [s.error for s in streams if s.error]
    assert not failed, failed
    return sum(s.id is not None for s in streams)


def _running_ids(state) -> set[str]:
    return {r["id"] for r in state["queues"]["running"]}


def test_an_idle_engine_matches_the_schema(dash_server):
    state = get_state(dash_server)
    assert state["blocks"] is None and state["queues"]["num_running"] == 0
    assert state["config"]["max_num_seqs"] == 2 and state["config"]["block_size"] == BLOCK_SIZE
    assert state["kv"]["num_free_blocks"] == state["kv"]["num_blocks"]
    series = state["series"]
    assert series["length"] == len(series["generation_tokens_per_s"]) == len(series["itl_s"]) == 300
    with_map = get_state(dash_server, blocks=True)
    assert set(with_map["blocks"]["device"]) <= {"f", "c"} and len(with_map["blocks"]["device"]) == state["kv"]["num_blocks"]


def test_requests_show_while_they_run_and_an_aborted_one_leaves(dash_server):
    model = dash_server.engine.model_config.served_model_name
    streams = [Streamer(dash_server, model) for _ in range(3)]
    try:
        wait_for(lambda: num_started(streams) == 2, "two requests to run")
        wait_for(lambda: get_state(dash_server)["queues"]["num_waiting"] == 1, "the third to wait")
        state = get_state(dash_server, blocks=True)
        running = [s for s in streams if s.id is not None]
        assert _running_ids(state) == {s.id for s in running} and state["queues"]["num_running"] == 2
        waiting = state["queues"]["waiting"]
        assert len(waiting) == 1 and waiting[0]["wait_reason"] in ("max_num_seqs", "arrived")
        device = state["blocks"]["device"]
        tables = [r["block_ids"] for r in state["queues"]["running"]]
        holders = {b: sum(b in t for t in tables) for t in tables for b in t}
        for r in state["queues"]["running"]:
            assert r["status"] == "running" and r["wait_reason"] is None and r["prompt_tokens"] > 0
            assert r["num_blocks"] == len(r["block_ids"]) == -(-r["computed_tokens"] // BLOCK_SIZE)
            assert [device[b] for b in r["block_ids"]] == ["s" if holders[b] > 1 else "o" for b in r["block_ids"]]
        assert "s" in device  # the second request shares the first's prompt blocks (prefix cache)
        assert device.count("o") + device.count("s") == len(holders) == state["kv"]["num_used_blocks"]

        victim = running[0]
        victim.close()
        wait_for(lambda: victim.id not in _running_ids(get_state(dash_server)), "the aborted request to leave")
        wait_for(lambda: num_started(streams) == 3, "the third request to start")
        state = get_state(dash_server)
        assert victim.id not in {r["id"] for q in ("running", "waiting") for r in state["queues"][q]}
        assert _running_ids(state) == {s.id for s in streams if s is not victim}
    finally:
        for s in streams:
            s.close()
    wait_for(lambda: get_state(dash_server)["queues"]["num_running"] == 0, "every request to leave")


def test_the_series_count_generated_tokens_and_latencies(dash_server):
    def total(state):
        return sum(state["series"]["generation_tokens_per_s"])

    time.sleep(1.1)  # tokens of earlier tests in the second that was filling are counted by now
    before = total(get_state(dash_server))
    model = dash_server.engine.model_config.served_model_name
    r = httpx.post(f"{dash_server.base_url}/completions", timeout=HANG_LIMIT_S,
                   json={"model": model, "prompt": "Hello", "max_tokens": 20, "ignore_eos": True})
    assert r.json()["usage"]["completion_tokens"] == 20
    wait_for(lambda: total(get_state(dash_server)) >= before + 20, "the 20 tokens to reach the series", 5)
    assert total(get_state(dash_server)) == before + 20
    series = get_state(dash_server)["series"]
    assert any(t is not None and t > 0 for t in series["ttft_s"])
    assert any(t is not None and t > 0 for t in series["itl_s"])
    assert sum(series["computed_tokens_per_s"]) > 20  # the prompts too


def test_the_stream_sends_states_while_someone_listens(dash_server):
    feed = dash_server.app.state.state_feed
    events = []
    with httpx.stream("GET", f"{dash_server.url}/v1/engine/state/stream", params={"blocks": 1},
                      timeout=HANG_LIMIT_S) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
                if len(events) == 8:
                    break
    for state in events:
        jsonschema.validate(state, SCHEMA)
    assert events[0]["time"] < events[2]["time"]
    # The block map comes first, then about every fourth event; the others leave it out.
    assert events[0]["blocks"]["device"] and 2 <= sum("blocks" in e for e in events) <= 3
    # The series come first, then only when they changed (once a second, at ~4 events a second).
    assert "series" in events[0] and len(events[0]["series"]["itl_s"]) == 300
    assert 2 <= sum("series" in e for e in events) <= 5
    wait_for(lambda: feed.num_subscribers == 0, "the feed to notice the client left")
    reads = feed.num_reads
    get_state(dash_server)  # a plain read does not go through the feed
    assert feed.num_reads == reads


def test_bad_input_is_a_clear_error(dash_server):
    r = httpx.get(f"{dash_server.url}/v1/engine/state", params={"blocks": "maybe"})
    assert r.status_code == 400 and "blocks" in r.text
    for name in ("nope.js", "..%2Fauth.py", "routes.py", ".hidden"):
        r = httpx.get(f"{dash_server.url}/dashboard/{name}")
        assert r.status_code == 404 and r.json()["error"]["message"]


def test_the_page_and_its_files_are_served(dash_server):
    page = httpx.get(f"{dash_server.url}/dashboard")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    for name, kind in (("dashboard.js", "text/javascript"), ("dashboard.css", "text/css"),
                       ("engine_state.schema.json", "application/json")):
        assert name in page.text or name.endswith(".json")
        r = httpx.get(f"{dash_server.url}/dashboard/{name}")
        assert r.status_code == 200 and r.headers["content-type"].startswith(kind)


def test_the_page_reaches_its_files_and_the_stream_under_a_root_path(dash_server):
    """Behind a proxy serving the app under --root-path (/folio/dashboard), every URL the page
    asks for must keep that prefix: absolute ones (/dashboard/...) would miss it."""
    import re
    from urllib.parse import urljoin, urlparse

    page = (STATIC_DIR / "index.html").read_text()
    script = (STATIC_DIR / "dashboard.js").read_text()
    urls = re.findall(r'(?:href|src)="([^"]+)"', page) + re.findall(r'STREAM_PATH = "([^"]+)"', script)
    urls = [u for u in urls if not u.startswith("data:")]
    assert len(urls) == 3, urls
    for url in urls:
        assert urlparse(urljoin("http://proxy/folio/dashboard", url)).path.startswith("/folio/"), url
        with httpx.stream("GET", urljoin(f"{dash_server.url}/dashboard", url), timeout=HANG_LIMIT_S) as r:
            assert r.status_code == 200, url  # (the stream's first event is not awaited)


def test_the_state_needs_the_api_key_but_the_page_does_not(checkpoint):
    with ServerThread(make_engine(checkpoint), ServerConfig(api_key="sk-dash")) as server:
        for path in ("/v1/engine/state", "/v1/engine/state/stream"):
            r = httpx.get(f"{server.url}{path}")
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert get_state(server, headers={"Authorization": "Bearer sk-dash"})["version"] == 1
        assert httpx.get(f"{server.url}/dashboard").status_code == 200
        assert httpx.get(f"{server.url}/dashboard/dashboard.js").status_code == 200


def test_no_dashboard_turns_everything_off(checkpoint):
    engine = make_engine(checkpoint)
    with ServerThread(engine, ServerConfig(dashboard=False)) as server:
        for path in ("/dashboard", "/dashboard/dashboard.js", "/v1/engine/state", "/v1/engine/state/stream"):
            assert httpx.get(f"{server.url}{path}").status_code == 404
        assert engine.history is None  # and nothing is recorded per step


@pytest.mark.slow
def test_the_state_crosses_from_an_engine_process(checkpoint):
    with ServerThread(make_engine(checkpoint, engine_process=True)) as server:
        model = server.engine.model_config.served_model_name
        stream = Streamer(server, model)
        try:
            wait_for(lambda: stream.chunks > 2, "the request to run")
            state = get_state(server, blocks=True)
            (r,) = state["queues"]["running"]
            assert r["id"] == stream.id and r["output_tokens"] > 0
            assert all(state["blocks"]["device"][b] == "o" for b in r["block_ids"])
        finally:
            stream.close()
        wait_for(lambda: get_state(server)["queues"]["num_running"] == 0, "the abort to reach the process")


def test_a_dead_engine_ends_the_stream_and_answers_503(checkpoint):
    engine = make_engine(checkpoint)

    def broken_step():
        raise RuntimeError("the device fell over")

    engine.engine.step = broken_step
    with ServerThread(engine) as server:
        lines = []
        with httpx.stream("GET", f"{server.url}/v1/engine/state/stream", timeout=HANG_LIMIT_S) as r:
            for line in r.iter_lines():
                lines.append(line)
                if len(lines) == 2:  # one state arrived: now kill the engine with a request
                    httpx.post(f"{server.base_url}/completions", timeout=HANG_LIMIT_S,
                               json={"model": engine.model_config.served_model_name, "prompt": "Hi", "max_tokens": 2})
        assert "event: end" in lines
        r = httpx.get(f"{server.url}/v1/engine/state")
        assert r.status_code == 503 and "fell over" in r.json()["error"]["message"]


def test_no_dashboard_is_a_serve_flag():
    from folio.entrypoints.openai.api_server import make_parser

    assert ServerConfig.from_cli_args(make_parser().parse_args(["--no-dashboard"])).dashboard is False
    assert ServerConfig.from_cli_args(make_parser().parse_args([])).dashboard is True


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_state_of_a_gpu_engine_in_its_own_process(checkpoint):
    """The GPU path as `folio serve` runs it: engine process, CUDA runner, async scheduling."""
    args = EngineArgs(model=checkpoint, dtype="float32", device="cuda", max_model_len=256, seed=0,
                      num_gpu_blocks_override=256)
    with ServerThread(AsyncLLM.from_engine_args(args, engine_process=True)) as server:
        model = server.engine.model_config.served_model_name
        streams = [Streamer(server, model) for _ in range(3)]
        try:
            wait_for(lambda: num_started(streams) == 3 and min(s.chunks for s in streams) > 2, "the requests to run")
            state = get_state(server, blocks=True)
            device = state["blocks"]["device"]
            tables = [r["block_ids"] for r in state["queues"]["running"]]
            assert {r["id"] for r in state["queues"]["running"]} <= {s.id for s in streams}
            assert device.count("o") + device.count("s") == len({b for t in tables for b in t}) == state["kv"]["num_used_blocks"]
        finally:
            for s in streams:
                s.close()
        wait_for(lambda: get_state(server)["kv"]["num_used_blocks"] == 0, "the blocks to be freed")
