"""Embeddings (LLM.embed, /v1/embeddings) against transformers' final hidden states."""

from __future__ import annotations

import base64
import struct

import httpx
import pytest
import torch
import torch.nn.functional as F
from openai import OpenAI

from folio import LLM, PoolingParams
from tests.server.harness import ServerThread, make_engine

PROMPTS = ["Hello my name is", "The best thing about vLLM is that it supports many different models"]


@pytest.fixture(scope="module")
def llm(tiny_model) -> LLM:
    return LLM(model=tiny_model, dtype="float32", device="cpu", max_model_len=256, runner="pooling")


@pytest.fixture(scope="module")
def hf_hidden(tiny_model):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model)

    def hidden(text: str) -> torch.Tensor:  # [tokens, hidden], after the final norm
        ids = torch.tensor([tokenizer.encode(text)])
        with torch.no_grad():
            return model(ids, output_hidden_states=True).hidden_states[-1][0]

    return hidden


def test_last_token_pooling_matches_transformers(llm, hf_hidden):
    outs = llm.embed(PROMPTS, use_tqdm=False)
    for text, out in zip(PROMPTS, outs):
        want = F.normalize(hf_hidden(text)[-1], dim=-1)
        got = torch.tensor(out.outputs.embedding)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        assert out.prompt_token_ids == llm.get_tokenizer().encode(text)


def test_mean_pooling_and_no_normalize(llm, hf_hidden):
    (mean,) = llm.embed(PROMPTS[1], PoolingParams(pooling_type="MEAN"), use_tqdm=False)
    torch.testing.assert_close(torch.tensor(mean.outputs.embedding),
                               F.normalize(hf_hidden(PROMPTS[1]).mean(0), dim=-1), atol=1e-5, rtol=1e-5)
    (raw,) = llm.embed(PROMPTS[0], PoolingParams(normalize=False), use_tqdm=False)
    torch.testing.assert_close(torch.tensor(raw.outputs.embedding), hf_hidden(PROMPTS[0])[-1], atol=1e-4, rtol=1e-4)


def test_embedding_does_not_disturb_generation(llm):
    from folio import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    before = llm.generate(PROMPTS[0], params, use_tqdm=False)[0].outputs[0].token_ids
    llm.embed(PROMPTS, use_tqdm=False)
    assert llm.generate(PROMPTS[0], params, use_tqdm=False)[0].outputs[0].token_ids == before


def test_bad_pooling_inputs_raise(llm):
    with pytest.raises(ValueError, match="dimensions"):
        PoolingParams(dimensions=8)
    with pytest.raises(ValueError, match="pooling_type"):
        llm.embed(PROMPTS[0], PoolingParams(pooling_type="CLS"), use_tqdm=False)
    with pytest.raises(ValueError, match="pooler_config"):
        LLM(model=llm.llm_engine.config.model.model, device="cpu", pooler_config={"pooling_type": "CLS"})


@pytest.fixture(scope="module")
def server(tiny_model):
    with ServerThread(make_engine(tiny_model)) as running:
        yield running


def test_openai_client_embeddings_float_and_base64(server, llm):
    """vLLM's examples/online_serving/openai_embedding_client.py, against folio."""
    client = OpenAI(api_key="EMPTY", base_url=server.base_url)
    model = client.models.list().data[0].id
    responses = client.embeddings.create(input=PROMPTS, model=model)  # the client asks for base64
    want = [o.outputs.embedding for o in llm.embed(PROMPTS, use_tqdm=False)]
    for data, vector in zip(responses.data, want):
        torch.testing.assert_close(torch.tensor(data.embedding), torch.tensor(vector), atol=1e-5, rtol=1e-5)
    assert responses.usage.prompt_tokens == sum(len(llm.get_tokenizer().encode(p)) for p in PROMPTS)
    r = httpx.post(f"{server.base_url}/embeddings", json={"input": [[1, 2, 3]], "encoding_format": "float",
                                                          "pooling_type": "mean", "normalize": False})
    assert r.status_code == 200
    (mean,) = llm.embed({"prompt_token_ids": [1, 2, 3]}, PoolingParams(pooling_type="MEAN", normalize=False),
                        use_tqdm=False)
    torch.testing.assert_close(torch.tensor(r.json()["data"][0]["embedding"]), torch.tensor(mean.outputs.embedding),
                               atol=1e-5, rtol=1e-5)
    b64 = httpx.post(f"{server.base_url}/embeddings", json={"input": "Hi", "encoding_format": "base64"}).json()
    raw = base64.b64decode(b64["data"][0]["embedding"])
    assert len(struct.unpack(f"<{len(raw) // 4}f", raw)) == llm.llm_engine.config.model.hidden_size


@pytest.mark.parametrize("body, param", [
    ({"input": "Hi", "dimensions": 8}, "dimensions"),
    ({"input": [[5000]]}, "input"),
    ({"input": ""}, "input"),
    ({"input": "Hi", "model": "other"}, "model"),
])
def test_embedding_errors_are_400s_naming_the_field(server, body, param):
    r = httpx.post(f"{server.base_url}/embeddings", json=body)
    assert r.status_code in (400, 404), r.text
    assert r.json()["error"]["param"] == param


def test_embeddings_through_an_engine_process(tiny_model, llm):
    """On a GPU the server's engine runs in a process of its own: the embed command and its
    answer cross the pipe."""
    with ServerThread(make_engine(tiny_model, engine_process=True)) as running:
        r = httpx.post(f"{running.base_url}/embeddings", json={"input": PROMPTS[0]})
        assert r.status_code == 200, r.text
        bad = httpx.post(f"{running.base_url}/embeddings", json={"input": [[10**6]]})
        assert bad.status_code == 400
    (want,) = llm.embed(PROMPTS[0], use_tqdm=False)
    torch.testing.assert_close(torch.tensor(r.json()["data"][0]["embedding"]), torch.tensor(want.outputs.embedding),
                               atol=1e-5, rtol=1e-5)
