"""/v1/score and /v1/rerank: cosine similarities of the model's embeddings, as vLLM scores with
an embedding model."""

from __future__ import annotations

import httpx
import pytest
import torch
import torch.nn.functional as F

from folio import LLM
from tests.server.harness import ServerThread, make_engine

QUERY = "What is the capital of France?"
DOCS = ["The capital of France is Paris.", "Bananas are yellow.", "Paris is in France."]


@pytest.fixture(scope="module")
def server(tiny_model):
    with ServerThread(make_engine(tiny_model)) as running:
        yield running


@pytest.fixture(scope="module")
def cosines(tiny_model) -> list[float]:
    llm = LLM(model=tiny_model, dtype="float32", device="cpu", max_model_len=256)
    query, *docs = [torch.tensor(o.outputs.embedding) for o in llm.embed([QUERY, *DOCS], use_tqdm=False)]
    return [F.cosine_similarity(query, d, dim=0).item() for d in docs]


def test_score_one_to_many_and_pairs(server, cosines):
    r = httpx.post(f"{server.base_url}/score", json={"text_1": QUERY, "text_2": DOCS})
    assert r.status_code == 200, r.text
    assert [d["score"] for d in r.json()["data"]] == pytest.approx(cosines, abs=1e-5)
    pairs = httpx.post(f"{server.url}/score", json={"text_1": [QUERY, QUERY], "text_2": DOCS[:2]}).json()
    assert [d["score"] for d in pairs["data"]] == pytest.approx(cosines[:2], abs=1e-5)


def test_rerank_orders_by_score(server, cosines):
    r = httpx.post(f"{server.base_url}/rerank", json={"query": QUERY, "documents": DOCS, "top_n": 2})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    want = sorted(range(3), key=lambda i: -cosines[i])[:2]
    assert [x["index"] for x in results] == want
    assert [x["document"]["text"] for x in results] == [DOCS[i] for i in want]
    assert [x["relevance_score"] for x in results] == pytest.approx([cosines[i] for i in want], abs=1e-5)


@pytest.mark.parametrize("path, body, param", [
    ("/score", {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, "text_1"),
    ("/score", {"text_1": "", "text_2": "x"}, "text_1"),
    ("/rerank", {"query": "q", "documents": []}, "documents"),
])
def test_score_errors(server, path, body, param):
    r = httpx.post(f"{server.base_url}{path}", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param
