"""LLM.encode and LLM.score against transformers' own hidden states of the same tiny checkpoint,
score against the server's /v1/score, and the inputs they refuse."""

from __future__ import annotations

import httpx
import pytest
import torch
import torch.nn.functional as F

from folio import LLM, PoolingParams
from folio import PoolingRequestOutput, ScoringRequestOutput
from folio.lora.request import LoRARequest
from tests.helpers.checkpoints import tiny_model_dir
from tests.server.harness import ServerThread, make_engine

pytestmark = pytest.mark.slow

QUERY = "What is the capital of France?"
DOCS = ["The capital of France is Paris.", "Bananas are yellow.", "Paris is in France."]


@pytest.fixture(scope="module")
def path(tmp_path_factory) -> str:
    return tiny_model_dir(tmp_path_factory, "llama", "pooling-llama")


@pytest.fixture(scope="module")
def llm(path) -> LLM:
    return LLM(model=path, dtype="float32", device="cpu", max_model_len=64, seed=0)


@pytest.fixture(scope="module")
def hf_hidden(path):
    """transformers' final hidden states (after the last norm) of a text or token ids: [tokens, hidden]."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)

    def hidden(prompt: str | list[int]) -> torch.Tensor:
        ids = torch.tensor([tokenizer.encode(prompt) if isinstance(prompt, str) else prompt])
        with torch.no_grad():
            return model(ids, output_hidden_states=True).hidden_states[-1][0]

    return hidden


def _hf_cosine(hf_hidden, a, b, mean: bool = False) -> float:
    pool = (lambda h: h.mean(0)) if mean else (lambda h: h[-1])
    return F.cosine_similarity(pool(hf_hidden(a)), pool(hf_hidden(b)), dim=0).item()


def _scores(outputs: list[ScoringRequestOutput]) -> list[float]:
    return [o.outputs.score for o in outputs]


# ---- encode -----------------------------------------------------------------------------------
def test_encode_is_the_pooled_hidden_state_as_a_tensor(llm, hf_hidden):
    texts = [QUERY, *DOCS]
    outs = llm.encode(texts, use_tqdm=False)
    assert len(outs) == len(texts) and all(isinstance(o, PoolingRequestOutput) for o in outs)
    tokenizer = llm.get_tokenizer()
    for text, out in zip(texts, outs):
        data = out.outputs.data
        assert isinstance(data, torch.Tensor) and data.dtype == torch.float32 and data.dim() == 1
        torch.testing.assert_close(data, F.normalize(hf_hidden(text)[-1], dim=-1), atol=1e-5, rtol=1e-5)
        assert out.prompt == text and out.prompt_token_ids == tokenizer.encode(text) and out.finished
    assert len({o.request_id for o in outs}) == len(outs)
    # the same numbers as embed, which is encode's "embed" task
    embedded = torch.tensor([e.outputs.embedding for e in llm.embed(texts, use_tqdm=False)])
    torch.testing.assert_close(torch.stack([o.outputs.data for o in outs]), embedded, atol=1e-6, rtol=0)


def test_encode_pooling_params_per_prompt(llm, hf_hidden):
    raw, mean = llm.encode([DOCS[0], {"prompt_token_ids": [5, 9, 200, 17]}],
                           [PoolingParams(normalize=False), PoolingParams(pooling_type="MEAN")],
                           use_tqdm=False, pooling_task="embed")
    torch.testing.assert_close(raw.outputs.data, hf_hidden(DOCS[0])[-1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(mean.outputs.data, F.normalize(hf_hidden([5, 9, 200, 17]).mean(0), dim=-1),
                               atol=1e-5, rtol=1e-5)
    assert mean.prompt is None and mean.prompt_token_ids == [5, 9, 200, 17]


def test_duplicate_prompts_are_pooled_once_and_do_not_share_a_list(llm):
    seen: list[int] = []
    engine = llm.llm_engine
    embed = engine.embed
    engine.embed = lambda prompts, config: seen.append(len(prompts)) or embed(prompts, config)
    try:
        a, b = llm.embed([DOCS[1], DOCS[1]], use_tqdm=False)
        scores = llm.score(QUERY, DOCS, use_tqdm=False)
    finally:
        del engine.embed
    assert seen == [1, 4]  # the query of a 1-to-N score is embedded once
    assert len(scores) == 3
    assert a.outputs.embedding == b.outputs.embedding and a.outputs.embedding is not b.outputs.embedding


# ---- score ------------------------------------------------------------------------------------
def test_score_pairs_one_to_n_one_to_one_and_n_to_n(llm, hf_hidden):
    want = [_hf_cosine(hf_hidden, QUERY, d) for d in DOCS]
    assert len(set(round(w, 4) for w in want)) == 3  # distinct: order mistakes would show
    one_to_n = llm.score(QUERY, DOCS, use_tqdm=False)
    assert all(isinstance(o, ScoringRequestOutput) for o in one_to_n)
    assert _scores(one_to_n) == pytest.approx(want, abs=1e-5)
    assert _scores(llm.score([QUERY], DOCS, use_tqdm=False)) == pytest.approx(want, abs=1e-5)
    (single,) = llm.score(QUERY, DOCS[2], use_tqdm=False)
    assert single.outputs.score == pytest.approx(want[2], abs=1e-5)
    firsts = [DOCS[2], QUERY, DOCS[0]]
    n_to_n = llm.score(firsts, DOCS, use_tqdm=False)
    assert _scores(n_to_n) == pytest.approx([_hf_cosine(hf_hidden, a, b) for a, b in zip(firsts, DOCS)], abs=1e-5)
    assert n_to_n[0].outputs.score == pytest.approx(_hf_cosine(hf_hidden, DOCS[2], DOCS[0]), abs=1e-5)


def test_score_token_ids_are_vllms_join(llm):
    tokenizer = llm.get_tokenizer()
    pad = [tokenizer.pad_token_id] if tokenizer.pad_token_id is not None else []
    (out,) = llm.score(QUERY, DOCS[0], use_tqdm=False)
    assert out.prompt_token_ids == tokenizer.encode(QUERY) + pad + tokenizer.encode(DOCS[0])
    assert out.finished


def test_score_token_prompts_truncation_and_mean_pooling(llm, hf_hidden):
    tokenizer = llm.get_tokenizer()
    (text,) = llm.score(QUERY, DOCS[0], use_tqdm=False)
    (ids,) = llm.score({"prompt_token_ids": tokenizer.encode(QUERY)}, {"prompt": DOCS[0]}, use_tqdm=False)
    assert ids.outputs.score == pytest.approx(text.outputs.score, abs=1e-6)
    (cut,) = llm.score(QUERY, DOCS[0], truncate_prompt_tokens=3, use_tqdm=False)
    last3 = [tokenizer.encode(QUERY)[-3:], tokenizer.encode(DOCS[0])[-3:]]
    assert cut.outputs.score == pytest.approx(_hf_cosine(hf_hidden, *last3), abs=1e-5)
    assert cut.prompt_token_ids[:3] == last3[0] and cut.prompt_token_ids[-3:] == last3[1]
    mean = llm.score(QUERY, DOCS, pooling_params=PoolingParams(pooling_type="MEAN"), use_tqdm=False)
    want = [_hf_cosine(hf_hidden, QUERY, d, mean=True) for d in DOCS]
    assert _scores(mean) == pytest.approx(want, abs=1e-5)
    assert want != pytest.approx([_hf_cosine(hf_hidden, QUERY, d) for d in DOCS], abs=1e-3)
    # normalize does not change a cosine
    unnormalized = llm.score(QUERY, DOCS, pooling_params=PoolingParams(normalize=False), use_tqdm=False)
    assert _scores(unnormalized) == pytest.approx(_scores(llm.score(QUERY, DOCS, use_tqdm=False)), abs=1e-6)


def test_score_equals_the_servers(path, llm):
    pairs = [(QUERY, DOCS), ([QUERY, DOCS[0], DOCS[1]], DOCS)]
    with ServerThread(make_engine(path, max_model_len=64)) as server:
        for text_1, text_2 in pairs:
            r = httpx.post(f"{server.base_url}/score", json={"text_1": text_1, "text_2": text_2})
            assert r.status_code == 200, r.text
            served = [d["score"] for d in sorted(r.json()["data"], key=lambda d: d["index"])]
            assert _scores(llm.score(text_1, text_2, use_tqdm=False)) == pytest.approx(served, abs=1e-6)


# ---- refusals ---------------------------------------------------------------------------------
@pytest.mark.parametrize("data_1, data_2, message", [
    (["a", "b"], ["c", "d", "e"], "data_1 has 2 prompts and data_2 has 3"),
    (["a", "b", "c"], "d", "data_1 has 3 prompts and data_2 has 1"),
    ([], ["c"], "data_1 is empty"),
    ("a", [], "data_2 is empty"),
    ([], [], "data_1 is empty"),
    ("", "x", r"data_1\[0\] is empty"),
    ("x", ["y", {"prompt": ""}], r"data_2\[1\] is empty"),
    ([5, 6], "x", "not a bare list of ints"),
])
def test_score_refuses_bad_pairs(llm, data_1, data_2, message):
    with pytest.raises(ValueError, match=message):
        llm.score(data_1, data_2, use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()


def test_what_folio_cannot_pool_is_refused(llm, tmp_path):
    adapter = LoRARequest("adapter", 1, str(tmp_path))
    calls = [
        (lambda: llm.score(QUERY, DOCS, lora_request=adapter), "does not take a lora_request"),
        (lambda: llm.encode(DOCS, lora_request=[None, adapter, None]), "does not take a lora_request"),
        (lambda: llm.encode(DOCS, pooling_task="classify"), "pooling_task='classify' is not supported"),
        (lambda: llm.encode(DOCS, pooling_task="encode"), "no per-token outputs"),
        (lambda: llm.encode(DOCS, pooling_task="reward"), "must be one of"),
        (lambda: llm.score(QUERY, DOCS, pooling_params=[PoolingParams()] * 3), "pooling_params must be"),
        (lambda: llm.encode(DOCS, [PoolingParams()] * 2), "2 pooling_params for 3 prompts"),
        (lambda: llm.score(QUERY, "word " * 100), "more than the maximum model length of 64"),
        (lambda: llm.score(QUERY, DOCS, truncate_prompt_tokens=0), "truncate_prompt_tokens"),
        (lambda: llm.score({"prompt_token_ids": [5, 5000]}, DOCS), "outside the vocabulary"),
    ]
    for call, message in calls:
        with pytest.raises(ValueError, match=message):
            call()
    assert not llm.llm_engine.has_unfinished_requests()
    # a long text is scored once truncated to the context
    (out,) = llm.score(QUERY, "word " * 100, truncate_prompt_tokens=-1, use_tqdm=False)
    assert len(out.prompt_token_ids) > 64


def test_no_cross_encoder_or_classifier_is_offered(path):
    # vLLM scores with a cross-encoder under convert/task "classify"/"score"; folio has no such head
    # and says so when the LLM is built, rather than answering with cosine similarities.
    for kwargs in ({"convert": "classify"}, {"task": "score"}, {"task": "classify"}):
        with pytest.raises(ValueError):
            LLM(model=path, dtype="float32", device="cpu", max_model_len=64, **kwargs)
    assert not hasattr(LLM, "classify") and not hasattr(LLM, "reward")
