"""One tiny checkpoint and one running server shared by the server tests (module scope each)."""

from __future__ import annotations

import pytest
from openai import OpenAI

from tests.helpers.checkpoints import tiny_model_dir
from tests.helpers.logs import log_records
from tests.server.harness import ServerThread, make_engine

API_KEY = "unused"  # the shared server has no key; the openai client insists on one


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory) -> str:
    return tiny_model_dir(tmp_path_factory, "llama", "server-llama")


@pytest.fixture(scope="session")
def server(checkpoint):
    with ServerThread(make_engine(checkpoint, max_waiting_requests=1024)) as running:
        yield running


@pytest.fixture(scope="session")
def model_name(server) -> str:
    return server.engine.model_config.served_model_name


@pytest.fixture
def client(server) -> OpenAI:
    with OpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0) as c:
        yield c



@pytest.fixture
def captured():
    """Log records of folio and uvicorn (neither propagates to the root, where caplog listens)."""
    with log_records(names=("folio", "uvicorn.error")) as records:
        yield records
