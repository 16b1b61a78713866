"""The server with --speculative-config: completions through the official openai client equal
those of a server without speculation, and /metrics carries the spec_decode counters."""

from __future__ import annotations

import urllib.request

import pytest
from openai import OpenAI

from tests.helpers.checkpoints import tiny_model_dir
from tests.server.harness import ServerThread, make_engine

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    return tiny_model_dir(tmp_path_factory, "llama", "spec-server")


def _complete(engine) -> tuple[list[str], str]:  # noqa: ANN001
    with ServerThread(engine) as server, OpenAI(base_url=server.base_url, api_key="x", max_retries=0) as client:
        name = engine.model_config.served_model_name
        texts = [
            client.completions.create(model=name, prompt=p, max_tokens=12, temperature=0).choices[0].text
            for p in ("a b c a b c a b", "Hello, my name is")
        ]
        with urllib.request.urlopen(f"{server.url}/metrics") as response:
            metrics = response.read().decode()
    return texts, metrics


def test_speculative_server_matches_plain_server(checkpoint):
    want, _ = _complete(make_engine(checkpoint))
    spec = '{"model": "%s", "num_speculative_tokens": 3}' % checkpoint  # draft = target
    got, metrics = _complete(make_engine(checkpoint, speculative_config=spec))
    assert got == want
    accepted = [line for line in metrics.splitlines() if line.startswith("folio:spec_decode_num_accepted_tokens_total")]
    assert accepted and float(accepted[0].split()[-1]) > 0
