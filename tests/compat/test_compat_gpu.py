"""The vLLM drop-in pieces on a GPU: embeddings beside CUDA graphs and async scheduling, bad_words
and logits processors in steps that overlap, against the same engine without the overlap."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from folio import LLM, SamplingParams

pytestmark = pytest.mark.gpu

PROMPTS = ["Hello my name is", "The best thing about vLLM is that it supports many different models"]


@pytest.fixture(scope="module")
def llm(tiny_model) -> LLM:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    return LLM(model=tiny_model, dtype="float32", device="cuda", max_model_len=256, gpu_memory_utilization=0.3)


def test_gpu_embeddings_match_transformers_and_leave_graphs_intact(llm, tiny_model):
    import transformers

    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    before = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    outs = llm.embed(PROMPTS, use_tqdm=False)
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).cuda()
    tokenizer = llm.get_tokenizer()
    for text, out in zip(PROMPTS, outs):
        ids = torch.tensor([tokenizer.encode(text)], device="cuda")
        with torch.no_grad():
            hidden = model(ids, output_hidden_states=True).hidden_states[-1][0]
        torch.testing.assert_close(torch.tensor(out.outputs.embedding), F.normalize(hidden[-1], dim=-1).cpu(),
                                   atol=1e-4, rtol=1e-4)
    after = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    assert after == before  # the decode graphs still read the engine's own KV cache


def test_gpu_bad_words_and_logits_processors_with_async_scheduling(llm, tiny_model):
    sync = LLM(model=tiny_model, dtype="float32", device="cuda", max_model_len=256, gpu_memory_utilization=0.3,
               async_scheduling=False)
    banned = []

    def ban_seen(token_ids, logits):  # no token twice: needs every previous token, placeholders excluded
        if token_ids:
            logits[torch.tensor(token_ids, device=logits.device)] = -float("inf")
        banned.append(len(token_ids))
        return logits

    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, logits_processors=[ban_seen],
                            bad_words=["the"])
    (a,) = llm.generate(PROMPTS[0], params, use_tqdm=False)
    (b,) = sync.generate(PROMPTS[0], params, use_tqdm=False)
    assert a.outputs[0].token_ids == b.outputs[0].token_ids
    assert len(set(a.outputs[0].token_ids)) == 20
